/* Keyless signatures (keyless.h) against a sigstore of the test's own
 * (fake_sigstore.h: a Fulcio-like CA issuing 10-minute certificates with
 * the OIDC extensions, a Rekor-like log signing entry timestamps and
 * checkpoints, a CT-like log signing SCTs): one fixture per case, each
 * refusal checked for the cause it names. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_sigstore.h"
#include "keyless.h"
#include "keyless_impl.h"
#include "signature.h"
#include "trust.h"

#define DIG "sha256:4f6b1c3e0c5a9d2b7e8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"
#define OTHER "sha256:0000000000000000000000000000000000000000000000000000000000000bad"
#define REF "registry.test/team/cache"
#define WORKFLOW "https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main"
#define GITLAB "https://gitlab.example"

static struct fs_ca root, mid, stranger;
static struct fs_log rekor, ctlog;
static int64_t now;
static char *root_json;

static const char *rules_yaml =
    "- name: release\n"
    "  issuer: " FS_GITHUB "\n"
    "  subject: " WORKFLOW "\n"
    "- name: gitlab-tags\n"
    "  issuerRegExp: ^https://gitlab\\.example$\n"
    "  subjectRegExp: "
    "^https://gitlab\\.example/team/[a-z-]+//\\.gitlab-ci\\.yml@refs/tags/v\\d+$\n";

static int group_setup(void **state)
{
	(void)state;
	now = (int64_t)time(NULL);
	root = fs_ca_new("fake fulcio root", NULL, -86400, 86400 * 365);
	mid = fs_ca_new("fake fulcio intermediate", &root, -86400, 86400 * 365);
	stranger = fs_ca_new("somebody else's CA", NULL, -86400, 86400 * 365);
	rekor = fs_log_new("rekor.test");
	ctlog = fs_log_new("ctlog.test");
	root_json = fs_trusted_root(&root, &mid, &rekor, NULL, now - 86400);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	fs_ca_free(&root);
	fs_ca_free(&mid);
	fs_ca_free(&stranger);
	fs_log_free(&rekor);
	fs_log_free(&ctlog);
	free(root_json);
	return 0;
}

static struct sig_keyless *trust(const char *json, bool with_ctlog)
{
	struct sig_keyless *kl = NULL;
	char why[512] = "";
	assert_int_equal(sig_keyless_new(&kl), 0);
	if (sig_keyless_add_trusted_root(kl, json, strlen(json), why, sizeof(why)) ||
	    sig_keyless_add_rules_text(kl, rules_yaml, strlen(rules_yaml), why, sizeof(why)))
		fail_msg("trust: %s", why);
	if (with_ctlog) {
		char *pem = fs_pem_pubkey(ctlog.key);
		assert_int_equal(
		    sig_keyless_add_log_pem(kl, pem, strlen(pem), true, why, sizeof(why)), 0);
		free(pem);
	}
	assert_int_equal(sig_keyless_complete(kl, why, sizeof(why)), 0);
	return kl;
}

/* How one simple-signing fixture is made. */
struct spec {
	const char *issuer, *issuer_v1, *subject, *email;
	const struct fs_ca *ca;     /* default: the trusted intermediate */
	int64_t integrated_offset;  /* integrated at now + this */
	int64_t cert_offset;        /* certificate from now - 60 + this */
	const char *payload_digest; /* default DIG */
	bool entry_for_other;       /* the log entry is over another payload */
	bool tamper_time;           /* the entry's time changed after the SET */
	bool no_entry;              /* no bundle annotation */
	bool sct, no_code_signing;
	const struct fs_log *sct_by; /* default: the trusted CT log */
};

struct simple {
	char *payload, *sig, *cert, *chain, *entry;
	EVP_PKEY *key;
	X509 *leaf;
};

static X509 *leaf_of(const struct spec *s, EVP_PKEY *key)
{
	struct fs_leaf_opts o = {
	    .issuer = s->issuer_v1 ? NULL
	              : s->issuer  ? s->issuer
	                           : FS_GITHUB,
	    .issuer_v1 = s->issuer_v1,
	    .uri = s->email     ? NULL
	           : s->subject ? s->subject
	                        : WORKFLOW,
	    .email = s->email,
	    .not_before = -60 + s->cert_offset,
	    .no_code_signing = s->no_code_signing,
	    .ctlog = s->sct_by ? s->sct_by
	             : s->sct  ? &ctlog
	                       : NULL,
	};
	return fs_leaf(s->ca ? s->ca : &mid, key, &o);
}

static struct simple make_simple(const struct spec *s)
{
	struct simple f = {.key = fs_p256()};
	f.leaf = leaf_of(s, f.key);
	f.payload = fs_simple_payload(REF, s->payload_digest ? s->payload_digest : DIG);
	f.sig = fs_sign_b64(f.key, f.payload, strlen(f.payload));
	f.cert = fs_pem_cert(f.leaf);
	char *a = s->ca == &stranger ? strdup("") : fs_pem_cert(mid.cert);
	char *b = fs_pem_cert(s->ca == &stranger ? stranger.cert : root.cert);
	f.chain = fs_printf("%s%s", a, b);
	free(a);
	free(b);
	if (s->no_entry)
		return f;
	char *logged = s->entry_for_other ? fs_simple_payload(REF, OTHER) : strdup(f.payload);
	char *body = fs_hashedrekord(logged, strlen(logged), f.sig, f.leaf);
	struct fs_entry e = fs_entry_new(&rekor, body, now + s->integrated_offset, 4242);
	if (s->tamper_time)
		e.integrated_time -= 30;
	f.entry = fs_rekor_annotation(&e);
	fs_entry_free(&e);
	free(logged);
	return f;
}

static void simple_free(struct simple *f)
{
	free(f->payload);
	free(f->sig);
	free(f->cert);
	free(f->chain);
	free(f->entry);
	EVP_PKEY_free(f->key);
	X509_free(f->leaf);
}

/* Verify the fixture of s; the cause it was refused for (or KEYLESS_OK),
 * the message in why. */
static enum keyless_cause check(const struct spec *s, struct keyless_result *r, char *why,
                                size_t whylen)
{
	struct sig_keyless *kl = trust(root_json, s->sct);
	struct simple f = make_simple(s);
	int rc = sig_keyless_verify_simple(kl, DIG, f.payload, strlen(f.payload), f.sig, f.cert,
	                                   f.chain, f.entry, r, why, whylen);
	assert_true((rc == 0) == (r->cause == KEYLESS_OK));
	simple_free(&f);
	sig_keyless_free(kl);
	return r->cause;
}

static void refused(const struct spec *s, enum keyless_cause want, const char *words)
{
	struct keyless_result r;
	char why[512] = "";
	enum keyless_cause got = check(s, &r, why, sizeof(why));
	if (got != want || !strstr(why, words))
		fail_msg("want %s ('%s'), got %s: %s", keyless_cause_name(want), words,
		         keyless_cause_name(got), why);
}

static void test_valid(void **state)
{
	(void)state;
	struct keyless_result r;
	char why[512] = "";
	if (check(&(struct spec){0}, &r, why, sizeof(why)) != KEYLESS_OK)
		fail_msg("refused: %s", why);
	assert_string_equal(r.identity, WORKFLOW);
	assert_string_equal(r.issuer, FS_GITHUB);
	assert_string_equal(r.rule, "release");
	assert_int_equal(r.integrated_time, now);
	assert_int_equal(r.log_index, 4242);
}

static void test_issuer_v1_extension(void **state)
{
	(void)state;
	struct keyless_result r;
	char why[512] = "";
	if (check(&(struct spec){.issuer_v1 = FS_GITHUB}, &r, why, sizeof(why)) != KEYLESS_OK)
		fail_msg("refused: %s", why);
	assert_string_equal(r.issuer, FS_GITHUB);
}

static void test_wrong_issuer(void **state)
{
	(void)state;
	refused(&(struct spec){.issuer = "https://accounts.evil.example"}, KEYLESS_ISSUER,
	        "issuer: the certificate's OIDC issuer 'https://accounts.evil.example'");
}

static void test_wrong_subject(void **state)
{
	(void)state;
	refused(&(struct spec){.subject = "https://github.com/org/fork/.github/workflows/"
	                                  "release.yml@refs/heads/main"},
	        KEYLESS_SUBJECT,
	        "subject: the certificate's identity 'https://github.com/org/fork");
	refused(&(struct spec){.email = "someone@example.com"}, KEYLESS_SUBJECT, "someone@example");
}

static void test_regexp_rule(void **state)
{
	(void)state;
	struct keyless_result r;
	char why[512] = "";
	struct spec ok = {.issuer = GITLAB,
	                  .subject = GITLAB "/team/kernel-cache//.gitlab-ci.yml@refs/tags/v12"};
	if (check(&ok, &r, why, sizeof(why)) != KEYLESS_OK)
		fail_msg("refused: %s", why);
	assert_string_equal(r.rule, "gitlab-tags");
	/* anchored: a branch, or another host with the name inside, does not match */
	refused(
	    &(struct spec){.issuer = GITLAB,
	                   .subject = GITLAB "/team/kernel-cache//.gitlab-ci.yml@refs/heads/v1"},
	    KEYLESS_SUBJECT, "subject:");
	refused(&(struct spec){.issuer = "https://gitlab.example.evil"}, KEYLESS_ISSUER, "issuer:");
}

static void test_untrusted_ca(void **state)
{
	(void)state;
	refused(&(struct spec){.ca = &stranger}, KEYLESS_UNTRUSTED_ROOT,
	        "untrusted root: the certificate does not chain to a trusted Fulcio CA");
}

static void test_expired_at_integration(void **state)
{
	(void)state;
	/* issued an hour ago, for 10 minutes: valid then, expired when logged */
	refused(&(struct spec){.cert_offset = -3600}, KEYLESS_EXPIRED, "expired at integration");
	/* logged before the certificate existed */
	refused(&(struct spec){.integrated_offset = -3600}, KEYLESS_EXPIRED,
	        "expired at integration");
}

static void test_tampered_timestamp(void **state)
{
	(void)state;
	refused(&(struct spec){.tamper_time = true}, KEYLESS_LOG_UNTRUSTED,
	        "signed entry timestamp of log entry 4242 does not verify");
}

static void test_entry_for_another_payload(void **state)
{
	(void)state;
	refused(&(struct spec){.entry_for_other = true}, KEYLESS_LOG_MISMATCH,
	        "the log entry is for another payload");
}

static void test_payload_for_another_digest(void **state)
{
	(void)state;
	refused(&(struct spec){.payload_digest = OTHER}, KEYLESS_WRONG_IMAGE,
	        "payload: payload is for image " OTHER);
}

static void test_no_log_entry(void **state)
{
	(void)state;
	refused(&(struct spec){.no_entry = true}, KEYLESS_NO_LOG_ENTRY, "no log entry");
}

static void test_not_code_signing(void **state)
{
	(void)state;
	refused(&(struct spec){.no_code_signing = true}, KEYLESS_UNTRUSTED_ROOT, "code signing");
}

static void test_sct(void **state)
{
	(void)state;
	struct keyless_result r;
	char why[512] = "";
	if (check(&(struct spec){.sct = true}, &r, why, sizeof(why)) != KEYLESS_OK)
		fail_msg("refused: %s", why);
	/* an SCT by a log that is not trusted */
	struct fs_log other = fs_log_new("ctlog.other");
	assert_int_equal(check(&(struct spec){.sct = true, .sct_by = &other}, &r, why, sizeof(why)),
	                 KEYLESS_NO_SCT);
	assert_non_null(strstr(why, "no SCT of the certificate verifies"));
	fs_log_free(&other);
	/* CT log keys trusted, the certificate has no SCT */
	struct sig_keyless *kl = trust(root_json, true);
	struct simple f = make_simple(&(struct spec){0});
	assert_int_equal(sig_keyless_verify_simple(kl, DIG, f.payload, strlen(f.payload), f.sig,
	                                           f.cert, f.chain, f.entry, &r, why, sizeof(why)),
	                 -EKEYREJECTED);
	assert_int_equal(r.cause, KEYLESS_NO_SCT);
	simple_free(&f);
	sig_keyless_free(kl);
}

/* A DSSE bundle of the image, signed keyless; e_out gets its entry. */
static char *make_bundle(const char *version, const char *digest, bool set, bool proof,
                         bool tamper_proof, X509 **leaf_out)
{
	EVP_PKEY *key = fs_p256();
	X509 *leaf = leaf_of(&(struct spec){0}, key);
	char *st = fs_statement(REF, digest), *sig = fs_dsse_sign(key, st);
	char *body = fs_dsse_body(st, strlen(st), sig, leaf);
	struct fs_entry e = fs_entry_new(&rekor, body, now, 77);
	struct fs_bundle_opts o = {.version = version, .no_set = !set};
	if (proof)
		o.proof = fs_inclusion_proof(&e, 77, 100);
	if (tamper_proof) { /* another hash on the path: its first character */
		char *h = strstr(o.proof, "hashes\":[\"") + 10;
		*h = *h == 'A' ? 'B' : 'A';
	}
	if (strcmp(version, "0.3") != 0)
		o.intermediate = mid.cert;
	char *b = fs_bundle(st, sig, leaf, &e, &o);
	free(o.proof);
	free(st);
	free(sig);
	fs_entry_free(&e);
	EVP_PKEY_free(key);
	if (leaf_out)
		*leaf_out = leaf;
	else
		X509_free(leaf);
	return b;
}

static enum keyless_cause check_bundle(const char *b, struct keyless_result *r, char *why,
                                       size_t whylen)
{
	struct sig_keyless *kl = trust(root_json, false);
	int rc = sig_keyless_verify_bundle(kl, DIG, b, strlen(b), r, why, whylen);
	assert_true((rc == 0) == (r->cause == KEYLESS_OK));
	sig_keyless_free(kl);
	return r->cause;
}

static void test_bundles(void **state)
{
	(void)state;
	static const char *const versions[] = {"0.1", "0.2", "0.3"};
	struct keyless_result r;
	char why[512] = "";
	for (size_t i = 0; i < 3; i++) {
		bool proof = i > 0; /* from v0.2 on, required */
		char *b = make_bundle(versions[i], DIG, true, proof, false, NULL);
		if (check_bundle(b, &r, why, sizeof(why)) != KEYLESS_OK)
			fail_msg("bundle v%s refused: %s", versions[i], why);
		assert_string_equal(r.rule, "release");
		assert_true(r.inclusion_proof == proof);
		free(b);
	}
	char *b = make_bundle("0.3", DIG, true, false, false, NULL);
	assert_int_equal(check_bundle(b, &r, why, sizeof(why)), KEYLESS_NO_LOG_ENTRY);
	assert_non_null(strstr(why, "inclusion proof"));
	free(b);
	b = make_bundle("0.3", OTHER, true, true, false, NULL);
	assert_int_equal(check_bundle(b, &r, why, sizeof(why)), KEYLESS_WRONG_IMAGE);
	assert_non_null(strstr(why, "statement is for " OTHER));
	free(b);
}

static void test_bundle_inclusion_proof(void **state)
{
	(void)state;
	struct keyless_result r;
	char why[512] = "";
	char *b = make_bundle("0.3", DIG, true, true, false, NULL);
	if (check_bundle(b, &r, why, sizeof(why)) != KEYLESS_OK)
		fail_msg("refused: %s", why);
	assert_true(r.inclusion_proof);
	free(b);
	b = make_bundle("0.2", DIG, true, true, true, NULL);
	assert_int_equal(check_bundle(b, &r, why, sizeof(why)), KEYLESS_LOG_UNTRUSTED);
	assert_non_null(strstr(why, "log entry 77: "));
	free(b);
	/* a proof without a signed entry timestamp: logged, but not when */
	b = make_bundle("0.3", DIG, false, true, false, NULL);
	assert_int_equal(check_bundle(b, &r, why, sizeof(why)), KEYLESS_NO_LOG_ENTRY);
	assert_non_null(strstr(why, "no signed entry timestamp"));
	free(b);
	b = make_bundle("0.1", DIG, false, false, false, NULL);
	assert_int_equal(check_bundle(b, &r, why, sizeof(why)), KEYLESS_NO_LOG_ENTRY);
	free(b);
}

static void test_pem_trust(void **state)
{
	(void)state;
	struct sig_keyless *kl = NULL;
	char why[512] = "", *ca = fs_pem_cert(root.cert), *log = fs_pem_pubkey(rekor.key);
	struct keyless_result r;
	assert_int_equal(sig_keyless_new(&kl), 0);
	assert_int_equal(sig_keyless_complete(kl, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "no Fulcio CA"));
	assert_int_equal(sig_keyless_add_ca_pem(kl, ca, strlen(ca), why, sizeof(why)), 0);
	assert_int_equal(sig_keyless_add_log_pem(kl, log, strlen(log), false, why, sizeof(why)), 0);
	struct keyless_rule_spec rule = {.issuer = FS_GITHUB, .subject = WORKFLOW};
	assert_int_equal(sig_keyless_add_rule(kl, &rule, why, sizeof(why)), 0);
	assert_int_equal(sig_keyless_complete(kl, why, sizeof(why)), 0);
	assert_string_equal(sig_keyless_rule_name(kl, 0), "rule 1");
	/* the chain from the bundle (v0.1) reaches the root through the intermediate */
	char *b = make_bundle("0.1", DIG, true, false, false, NULL);
	if (sig_keyless_verify_bundle(kl, DIG, b, strlen(b), &r, why, sizeof(why)))
		fail_msg("refused: %s", why);
	free(b);
	/* the v0.3 bundle carries the leaf alone: no way to the root */
	b = make_bundle("0.3", DIG, true, true, false, NULL);
	assert_int_equal(sig_keyless_verify_bundle(kl, DIG, b, strlen(b), &r, why, sizeof(why)),
	                 -EKEYREJECTED);
	assert_int_equal(r.cause, KEYLESS_UNTRUSTED_ROOT);
	free(b);
	assert_int_equal(sig_keyless_add_ca_pem(kl, log, strlen(log), why, sizeof(why)), -EINVAL);
	assert_int_equal(sig_keyless_add_log_pem(kl, ca, strlen(ca), false, why, sizeof(why)),
	                 -EINVAL);
	free(ca);
	free(log);
	sig_keyless_free(kl);
}

struct bad_input {
	const char *text, *err;
};

/* Each input refused by add (a sig_keyless_add_* reading text), saying err. */
static void refuses(const struct bad_input *bad, size_t n,
                    int (*add)(struct sig_keyless *, const char *, size_t, char *, size_t))
{
	char why[512];
	for (size_t i = 0; i < n; i++) {
		struct sig_keyless *kl = NULL;
		assert_int_equal(sig_keyless_new(&kl), 0);
		why[0] = '\0';
		assert_int_equal(add(kl, bad[i].text, strlen(bad[i].text), why, sizeof(why)),
		                 -EINVAL);
		if (!strstr(why, bad[i].err))
			fail_msg("'%s': want '%s', got '%s'", bad[i].text, bad[i].err, why);
		sig_keyless_free(kl);
	}
}

static void test_rules_text(void **state)
{
	(void)state;
	static const struct bad_input bad[] = {
	    {"- issuer: a\n", "exactly one of subject"},
	    {"- issuer: a\n  issuerRegExp: b\n  subject: c\n", "exactly one of issuer"},
	    {"- issuer: a\n  subjectRegExp: '(['\n", "subjectRegExp '(['"},
	    {"- issuer: a\n  subject: c\n  audience: d\n", "unknown key 'audience'"},
	    {"identities: []\n", "want a list"},
	    {"just text\n", "want a list"},
	};
	refuses(bad, sizeof(bad) / sizeof(bad[0]), sig_keyless_add_rules_text);
	char why[512];
	struct sig_keyless *kl = NULL;
	const char *ok = "identities:\n  - {issuer: a, subjectRegExp: '^x[\\d]\\w+$'}\n";
	assert_int_equal(sig_keyless_new(&kl), 0);
	assert_int_equal(sig_keyless_add_rules_text(kl, ok, strlen(ok), why, sizeof(why)), 0);
	struct keyless_result r = {0};
	char *sans[] = {"x1ab_c", "y"};
	assert_int_equal(kl_rules_match(kl, "a", sans, 2, &r, why, sizeof(why)), 0);
	assert_string_equal(r.identity, "x1ab_c");
	char *other[] = {"xa-b"};
	assert_int_equal(kl_rules_match(kl, "a", other, 1, &r, why, sizeof(why)), -EKEYREJECTED);
	sig_keyless_free(kl);
}

static void test_root_refusals(void **state)
{
	(void)state;
	static const struct bad_input bad[] = {
	    {"[]", "not a JSON object"},
	    {"{\"mediaType\":\"application/json\"}", "mediaType is 'application/json'"},
	    {"{\"mediaType\":\"application/vnd.dev.sigstore.trustedroot+json;version=0.1\","
	     "\"tlogs\":[{\"publicKey\":{\"rawBytes\":\"AAAA\"}}]}",
	     "tlogs[0]: publicKey.rawBytes: not a DER public key"},
	    {"{\"mediaType\":\"application/vnd.dev.sigstore.trustedroot+json;version=0.1\","
	     "\"certificateAuthorities\":[{\"certChain\":{\"certificates\":[{\"rawBytes\":"
	     "\"AAAA\"}]}}]}",
	     "certificateAuthorities[0]: certificate 1: not a DER certificate"},
	    {"{\"mediaType\":\"application/vnd.dev.sigstore.trustedroot+json;version=0.1\","
	     "\"ctlogs\":[{\"publicKey\":{\"validFor\":{\"start\":\"yesterday\"}}}]}",
	     "ctlogs[0]: validFor: not an RFC 3339 time"},
	};
	refuses(bad, sizeof(bad) / sizeof(bad[0]), sig_keyless_add_trusted_root);
}

/* The keyset carries keyless trust: sig_verify accepts a keyless signature,
 * names the identity and the rule, and the verdict's "key" is the rule's
 * id, which the set knows. */
static void test_keyset(void **state)
{
	(void)state;
	struct sig_keyset *ks = NULL;
	struct sig_verdict v;
	assert_int_equal(sig_keyset_new(&ks), 0);
	char before[SIGNATURE_FP_MAX];
	snprintf(before, sizeof(before), "%s", sig_keyset_fingerprint(ks));
	struct simple f = make_simple(&(struct spec){0});
	struct sig_candidate c = {.kind = SIG_KIND_SIMPLE,
	                          .data = f.payload,
	                          .len = strlen(f.payload),
	                          .signature_b64 = f.sig,
	                          .source = "sha256-x.sig layer 0",
	                          .certificate_pem = f.cert,
	                          .chain_pem = f.chain,
	                          .rekor_bundle = f.entry};
	assert_int_equal(sig_verify(ks, DIG, &c, 1, &v), -ENOKEY);
	assert_int_equal(sig_keyset_count(ks), 0);
	sig_keyset_set_keyless(ks, trust(root_json, false));
	assert_int_equal(sig_keyset_count(ks), 2);
	assert_int_equal(sig_keyset_nkeys(ks), 0);
	assert_string_not_equal(sig_keyset_fingerprint(ks), before);
	if (sig_verify(ks, DIG, &c, 1, &v) != 0)
		fail_msg("refused: %s", v.reason);
	assert_true(v.accepted);
	assert_string_equal(v.rule, "release");
	assert_string_equal(v.identity, WORKFLOW);
	assert_non_null(strstr(v.reason, "verified keyless: identity " WORKFLOW
	                                 ", issuer " FS_GITHUB ", rule 'release'"));
	assert_true(sig_keyset_has(ks, v.key_fingerprint));
	/* a refusal names its cause */
	c.rekor_bundle = NULL;
	assert_int_equal(sig_verify(ks, DIG, &c, 1, &v), -EKEYREJECTED);
	assert_non_null(
	    strstr(v.reason, "signature 1 sha256-x.sig layer 0: keyless: no log entry"));
	simple_free(&f);
	sig_keyset_free(ks);
}

static void put_file(const char *dir, const char *name, const char *text)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* A daemon's trust directory: keys and keyless trust side by side; a part
 * missing refuses the whole, naming what is missing. */
static void test_trust_dir(void **state)
{
	(void)state;
	char dir[] = "/tmp/gkm-keyless-XXXXXX", err[512] = "";
	assert_non_null(mkdtemp(dir));
	struct trust_source src = {.trust_dir = dir, .defaults = {.verify_enabled = true}};
	struct trust *t = NULL;
	EVP_PKEY *k = fs_p256();
	char *pub = fs_pem_pubkey(k);
	put_file(dir, "team.pem", pub);
	put_file(dir, "identities.yaml", rules_yaml);
	assert_int_equal(trust_load(&src, &t, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "keyless trust is incomplete: no Fulcio CA certificate"));
	put_file(dir, "trusted_root.json", root_json);
	if (trust_load(&src, &t, err, sizeof(err)))
		fail_msg("trust_load: %s", err);
	assert_int_equal(t->nkeys, 3); /* a key and two rules */
	assert_int_equal(sig_keyset_nkeys(t->keys), 1);
	assert_non_null(sig_keyset_keyless(t->keys));
	char fp[SIGNATURE_FP_MAX];
	snprintf(fp, sizeof(fp), "%s", t->keys_fp);
	trust_unref(t);
	put_file(dir, "identities.yaml", "- issuer: x\n  subject: y\n  extra: z\n");
	assert_int_equal(trust_load(&src, &t, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "/identities.yaml: identity 1: unknown key 'extra'"));
	put_file(dir, "identities.yaml", "- issuer: x\n  subject: y\n");
	assert_int_equal(trust_load(&src, &t, err, sizeof(err)), 0);
	assert_string_not_equal(t->keys_fp, fp); /* other rules, another trust */
	trust_unref(t);
	free(pub);
	EVP_PKEY_free(k);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_valid),
	    cmocka_unit_test(test_issuer_v1_extension),
	    cmocka_unit_test(test_wrong_issuer),
	    cmocka_unit_test(test_wrong_subject),
	    cmocka_unit_test(test_regexp_rule),
	    cmocka_unit_test(test_untrusted_ca),
	    cmocka_unit_test(test_expired_at_integration),
	    cmocka_unit_test(test_tampered_timestamp),
	    cmocka_unit_test(test_entry_for_another_payload),
	    cmocka_unit_test(test_payload_for_another_digest),
	    cmocka_unit_test(test_no_log_entry),
	    cmocka_unit_test(test_not_code_signing),
	    cmocka_unit_test(test_sct),
	    cmocka_unit_test(test_bundles),
	    cmocka_unit_test(test_bundle_inclusion_proof),
	    cmocka_unit_test(test_pem_trust),
	    cmocka_unit_test(test_rules_text),
	    cmocka_unit_test(test_root_refusals),
	    cmocka_unit_test(test_keyset),
	    cmocka_unit_test(test_trust_dir),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
