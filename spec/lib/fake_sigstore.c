/* The end-to-end tests' sigstore (spec/unit/fake_sigstore.h) as a command:
 *
 *   fake-sigstore init DIR
 *       a Fulcio-like root and intermediate CA, a Rekor-like log, a CT-like
 *       log and a stranger's CA, as PEM files, and trusted_root.json (root,
 *       intermediate, Rekor log), trusted_root_ct.json (the CT log too),
 *       fulcio.pem (both CA certificates) and rekor.pub.
 *   fake-sigstore sign DIR OUT --digest D [--ref R] [--issuer I]
 *       [--subject URI | --email E] [--form simple|bundle-0.1|bundle-0.2|
 *       bundle-0.3] [--case valid|untrusted-ca|expired|tampered-time|
 *       other-payload|other-digest|no-entry|proof|proof-no-set|no-proof] [--sct]
 *       a keyless signature of D as cosign writes it: simple writes
 *       payload.json, signature.b64, cert.pem, chain.pem and (unless
 *       no-entry) rekor-bundle.json into OUT; bundles write bundle.json
 *       (from v0.2 on with an inclusion proof, unless no-proof).
 *
 *   fake-sigstore cert DIR OUT [--issuer I] [--subject URI | --email E]
 *       a leaf key and certificate (OUT/leaf.key, OUT/leaf.pem) for a signer
 *       of the test's own (spec/sigstore-js/sign_keyless.js).
 *
 * Each case is one thing wrong (or right) with an otherwise valid
 * signature by identity I / subject, issued by the intermediate CA. */
#include <errno.h>
#include <sys/stat.h>

#include "../unit/fake_sigstore.h"

#define OTHER_DIGEST "sha256:0000000000000000000000000000000000000000000000000000000000000bad"

static char *path_of(const char *dir, const char *name)
{
	return fs_printf("%s/%s", dir, name);
}

static FILE *open_in(const char *dir, const char *name, const char *mode, char **path)
{
	*path = path_of(dir, name);
	FILE *f = fopen(*path, mode);
	if (!f)
		fs_die(*path);
	return f;
}

static void put(const char *dir, const char *name, const char *text)
{
	char *p;
	FILE *f = open_in(dir, name, "w", &p);
	if (fputs(text, f) < 0 || fclose(f) != 0)
		fs_die(p);
	free(p);
}

static void put_key(const char *dir, const char *name, EVP_PKEY *k)
{
	char *p;
	FILE *f = open_in(dir, name, "w", &p);
	if (!PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL) || fclose(f) != 0)
		fs_die(p);
	free(p);
}

/* A PEM private key (cert false) or certificate from dir/name. */
static void *get_pem(const char *dir, const char *name, bool cert)
{
	char *p;
	FILE *f = open_in(dir, name, "r", &p);
	void *v = cert ? (void *)PEM_read_X509(f, NULL, NULL, NULL)
	               : (void *)PEM_read_PrivateKey(f, NULL, NULL, NULL);
	if (!v)
		fs_die(p);
	fclose(f);
	free(p);
	return v;
}

static void put_ca(const char *dir, const char *name, const struct fs_ca *ca)
{
	char *k = fs_printf("%s.key", name), *c = fs_printf("%s.pem", name);
	char *pem = fs_pem_cert(ca->cert);
	put_key(dir, k, ca->key);
	put(dir, c, pem);
	free(k);
	free(c);
	free(pem);
}

static struct fs_ca get_ca(const char *dir, const char *name)
{
	char *k = fs_printf("%s.key", name), *c = fs_printf("%s.pem", name);
	struct fs_ca ca = {.key = get_pem(dir, k, false), .cert = get_pem(dir, c, true)};
	free(k);
	free(c);
	return ca;
}

static struct fs_log get_log(const char *dir, const char *name, const char *origin)
{
	return fs_log_of(get_pem(dir, name, false), origin);
}

static int init(const char *dir)
{
	int64_t now = (int64_t)time(NULL);
	mkdir(dir, 0755);
	struct fs_ca root = fs_ca_new("fake fulcio root", NULL, -86400, 86400 * 3650);
	struct fs_ca mid = fs_ca_new("fake fulcio intermediate", &root, -86400, 86400 * 3650);
	struct fs_ca stranger = fs_ca_new("a stranger's CA", NULL, -86400, 86400 * 3650);
	struct fs_log rekor = fs_log_new("rekor.test"), ct = fs_log_new("ctlog.test");
	put_ca(dir, "root", &root);
	put_ca(dir, "mid", &mid);
	put_ca(dir, "stranger", &stranger);
	put_key(dir, "rekor.key", rekor.key);
	put_key(dir, "ctlog.key", ct.key);
	char *rpub = fs_pem_pubkey(rekor.key), *cpub = fs_pem_pubkey(ct.key);
	char *rpem = fs_pem_cert(root.cert), *mpem = fs_pem_cert(mid.cert);
	char *both = fs_printf("%s%s", mpem, rpem);
	char *tr = fs_trusted_root(&root, &mid, &rekor, NULL, now - 86400);
	char *tc = fs_trusted_root(&root, &mid, &rekor, &ct, now - 86400);
	put(dir, "rekor.pub", rpub);
	put(dir, "ctlog.pub", cpub);
	put(dir, "fulcio.pem", both);
	put(dir, "trusted_root.json", tr);
	put(dir, "trusted_root_ct.json", tc);
	free(rpub);
	free(cpub);
	free(rpem);
	free(mpem);
	free(both);
	free(tr);
	free(tc);
	fs_ca_free(&root);
	fs_ca_free(&mid);
	fs_ca_free(&stranger);
	fs_log_free(&rekor);
	fs_log_free(&ct);
	return 0;
}

struct sign_args {
	const char *digest, *ref, *issuer, *subject, *email, *form, *cas;
	bool sct;
};

static bool is(const struct sign_args *a, const char *c)
{
	return strcmp(a->cas, c) == 0;
}

static void sign_simple(const char *out, const struct sign_args *a, EVP_PKEY *key, X509 *leaf,
                        const struct fs_ca *root, const struct fs_ca *mid,
                        const struct fs_log *rekor)
{
	int64_t now = (int64_t)time(NULL);
	char *payload = fs_simple_payload(a->ref, is(a, "other-digest") ? OTHER_DIGEST : a->digest);
	char *sig = fs_sign_b64(key, payload, strlen(payload));
	char *cert = fs_pem_cert(leaf), *m = fs_pem_cert(mid->cert), *r = fs_pem_cert(root->cert);
	char *chain = fs_printf("%s%s", m, r);
	put(out, "payload.json", payload);
	put(out, "signature.b64", sig);
	put(out, "cert.pem", cert);
	put(out, "chain.pem", chain);
	if (!is(a, "no-entry")) {
		char *logged = is(a, "other-payload") ? fs_simple_payload(a->ref, OTHER_DIGEST)
		                                      : strdup(payload);
		struct fs_entry e =
		    fs_entry_new(rekor, fs_hashedrekord(logged, strlen(logged), sig, leaf),
		                 is(a, "expired") ? now + 3600 : now, 31337);
		if (is(a, "tampered-time"))
			e.integrated_time -= 30;
		char *ann = fs_rekor_annotation(&e);
		put(out, "rekor-bundle.json", ann);
		free(ann);
		free(logged);
		fs_entry_free(&e);
	}
	free(payload);
	free(sig);
	free(cert);
	free(m);
	free(r);
	free(chain);
}

static void sign_bundle(const char *out, const struct sign_args *a, EVP_PKEY *key, X509 *leaf,
                        const struct fs_ca *mid, const struct fs_log *rekor)
{
	int64_t now = (int64_t)time(NULL);
	char *st = fs_statement(a->ref, is(a, "other-digest") ? OTHER_DIGEST : a->digest);
	char *sig = fs_dsse_sign(key, st);
	char *logged = is(a, "other-payload") ? fs_statement(a->ref, OTHER_DIGEST) : strdup(st);
	struct fs_entry e = fs_entry_new(rekor, fs_dsse_body(logged, strlen(logged), sig, leaf),
	                                 is(a, "expired") ? now + 3600 : now, 31337);
	if (is(a, "tampered-time"))
		e.integrated_time -= 30;
	struct fs_bundle_opts o = {.version = a->form + 7,
	                           .no_set = is(a, "proof-no-set"),
	                           .no_entry = is(a, "no-entry"),
	                           .intermediate = mid->cert};
	/* from v0.2 on, bundles carry inclusion proofs */
	if (is(a, "proof") || is(a, "proof-no-set") ||
	    (strcmp(o.version, "0.1") != 0 && !is(a, "no-proof")))
		o.proof = fs_inclusion_proof(&e, 31337 % 1000, 1000);
	char *b = fs_bundle(st, sig, leaf, &e, &o);
	put(out, "bundle.json", b);
	free(b);
	free(o.proof);
	free(st);
	free(sig);
	free(logged);
	fs_entry_free(&e);
}

static int sign(const char *dir, const char *out, const struct sign_args *a)
{
	struct fs_ca root = get_ca(dir, "root"), mid = get_ca(dir, "mid");
	struct fs_ca stranger = get_ca(dir, "stranger");
	struct fs_log rekor = get_log(dir, "rekor.key", "rekor.test");
	struct fs_log ct = get_log(dir, "ctlog.key", "ctlog.test");
	EVP_PKEY *key = fs_p256();
	struct fs_leaf_opts o = {.issuer = a->issuer,
	                         .uri = a->email ? NULL : a->subject,
	                         .email = a->email,
	                         .not_before = -60,
	                         .ctlog = a->sct ? &ct : NULL};
	X509 *leaf = fs_leaf(is(a, "untrusted-ca") ? &stranger : &mid, key, &o);
	mkdir(out, 0755);
	if (strcmp(a->form, "simple") == 0)
		sign_simple(out, a, key, leaf, is(a, "untrusted-ca") ? &stranger : &root, &mid,
		            &rekor);
	else
		sign_bundle(out, a, key, leaf, &mid, &rekor);
	X509_free(leaf);
	EVP_PKEY_free(key);
	fs_ca_free(&root);
	fs_ca_free(&mid);
	fs_ca_free(&stranger);
	fs_log_free(&rekor);
	fs_log_free(&ct);
	return 0;
}

/* A leaf key and certificate alone, for another signer (sigstore-js). */
static int cert(const char *dir, const char *out, const struct sign_args *a)
{
	struct fs_ca mid = get_ca(dir, "mid");
	EVP_PKEY *key = fs_p256();
	struct fs_leaf_opts o = {.issuer = a->issuer,
	                         .uri = a->email ? NULL : a->subject,
	                         .email = a->email,
	                         .not_before = -60};
	X509 *leaf = fs_leaf(&mid, key, &o);
	char *pem = fs_pem_cert(leaf);
	mkdir(out, 0755);
	put_key(out, "leaf.key", key);
	put(out, "leaf.pem", pem);
	free(pem);
	X509_free(leaf);
	EVP_PKEY_free(key);
	fs_ca_free(&mid);
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: fake-sigstore init DIR | sign DIR OUT --digest D [--ref R] "
	                "[--issuer I] [--subject URI|--email E] [--form F] [--case C] [--sct]\n");
	return 2;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "init") == 0)
		return init(argv[2]);
	if (argc < 4 || (strcmp(argv[1], "sign") != 0 && strcmp(argv[1], "cert") != 0))
		return usage();
	struct sign_args a = {.ref = "registry.test/cache",
	                      .issuer = FS_GITHUB,
	                      .subject = "https://github.com/org/repo/.github/workflows/"
	                                 "release.yml@refs/heads/main",
	                      .form = "simple",
	                      .cas = "valid"};
	for (int i = 4; i < argc; i++) {
		const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(k, "--sct") == 0) {
			a.sct = true;
			continue;
		}
		if (!v)
			return usage();
		i++;
		if (!strcmp(k, "--digest"))
			a.digest = v;
		else if (!strcmp(k, "--ref"))
			a.ref = v;
		else if (!strcmp(k, "--issuer"))
			a.issuer = v;
		else if (!strcmp(k, "--subject"))
			a.subject = v;
		else if (!strcmp(k, "--email"))
			a.email = v;
		else if (!strcmp(k, "--form"))
			a.form = v;
		else if (!strcmp(k, "--case"))
			a.cas = v;
		else
			return usage();
	}
	if (strcmp(argv[1], "cert") == 0)
		return cert(argv[2], argv[3], &a);
	if (!a.digest || (strcmp(a.form, "simple") && strncmp(a.form, "bundle-0.", 9)))
		return usage();
	return sign(argv[2], argv[3], &a);
}
