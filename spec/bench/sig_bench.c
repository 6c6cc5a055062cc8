/* Signature verification cost per image, in process (no registry): what
 * sig_verify spends on one image's signature, by key (simple signing and a
 * DSSE bundle) and keyless (cosign's simple signing with certificate, chain
 * and Rekor bundle annotations; a v0.3 bundle with an inclusion proof in a
 * tree of 4,096 entries; the same with an SCT checked against a trusted CT
 * log), with the trusted root of spec/unit/fake_sigstore.h. Medians of 7
 * batches; figures only, never asserted.
 *
 *   sig_bench [iterations per batch, default 300] */
#include <errno.h>
#include <time.h>

#include "../unit/fake_sigstore.h"
#include "keyless.h"
#include "signature.h"

#define DIG "sha256:4f6b1c3e0c5a9d2b7e8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"
#define WORKFLOW "https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main"
#define BATCHES 7

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median microseconds per sig_verify of c with ks. */
static double time_one(const struct sig_keyset *ks, const struct sig_candidate *c, int n)
{
	double per[BATCHES];
	struct sig_verdict v;
	for (int b = 0; b < BATCHES; b++) {
		double t0 = now_us();
		for (int i = 0; i < n; i++)
			if (sig_verify(ks, DIG, c, 1, &v) != 0)
				fs_die(v.reason);
		per[b] = (now_us() - t0) / n;
	}
	qsort(per, BATCHES, sizeof(per[0]), cmp);
	return per[BATCHES / 2];
}

static struct sig_keyset *keyless_set(const char *root, const struct fs_log *ctlog)
{
	struct sig_keyset *ks = NULL;
	struct sig_keyless *kl = NULL;
	char why[256];
	const char *rule = "- {name: release, issuer: " FS_GITHUB ", subject: " WORKFLOW "}\n";
	if (sig_keyset_new(&ks) || sig_keyless_new(&kl) ||
	    sig_keyless_add_trusted_root(kl, root, strlen(root), why, sizeof(why)) ||
	    sig_keyless_add_rules_text(kl, rule, strlen(rule), why, sizeof(why)))
		fs_die("keyless trust");
	if (ctlog) {
		char *pem = fs_pem_pubkey(ctlog->key);
		if (sig_keyless_add_log_pem(kl, pem, strlen(pem), true, why, sizeof(why)))
			fs_die(why);
		free(pem);
	}
	sig_keyset_set_keyless(ks, kl);
	return ks;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 300;
	int64_t now = (int64_t)time(NULL);
	struct fs_ca root = fs_ca_new("root", NULL, -86400, 86400);
	struct fs_ca mid = fs_ca_new("intermediate", &root, -86400, 86400);
	struct fs_log rekor = fs_log_new("rekor.test"), ct = fs_log_new("ctlog.test");
	char *trusted = fs_trusted_root(&root, &mid, &rekor, NULL, now - 86400);

	/* by key */
	struct sig_key *priv = NULL;
	char *priv_pem = NULL, *pub_pem = NULL, why[256];
	struct sig_keyset *keys = NULL;
	if (sig_keygen_p256(NULL, &priv_pem, &pub_pem) ||
	    sig_key_load_private(priv_pem, strlen(priv_pem), NULL, &priv, why, sizeof(why)) ||
	    sig_keyset_new(&keys) || sig_keyset_add_pem(keys, pub_pem, strlen(pub_pem), why, 256))
		fs_die("keys");
	char *kpayload = NULL, *ksig = NULL, *kbundle = NULL;
	size_t kplen = 0, kblen = 0;
	if (sig_sign_simple(priv, "registry.test/cache", DIG, &kpayload, &kplen, &ksig) ||
	    sig_sign_bundle(priv, "registry.test/cache", DIG, &kbundle, &kblen))
		fs_die("sign by key");

	/* keyless: the simple-signing form with its annotations */
	EVP_PKEY *lk = fs_p256();
	struct fs_leaf_opts lo = {.issuer = FS_GITHUB, .uri = WORKFLOW, .not_before = -60};
	X509 *leaf = fs_leaf(&mid, lk, &lo);
	lo.ctlog = &ct;
	X509 *leaf_sct = fs_leaf(&mid, lk, &lo);
	char *payload = fs_simple_payload("registry.test/cache", DIG);
	char *sig = fs_sign_b64(lk, payload, strlen(payload));
	char *cert = fs_pem_cert(leaf), *m = fs_pem_cert(mid.cert), *r = fs_pem_cert(root.cert);
	char *chain = fs_printf("%s%s", m, r);
	struct fs_entry e =
	    fs_entry_new(&rekor, fs_hashedrekord(payload, strlen(payload), sig, leaf), now, 123456);
	char *ann = fs_rekor_annotation(&e);

	/* keyless: a v0.3 bundle with an inclusion proof (and one with an SCT) */
	char *st = fs_statement("registry.test/cache", DIG), *dsig = fs_dsse_sign(lk, st);
	struct fs_entry be =
	    fs_entry_new(&rekor, fs_dsse_body(st, strlen(st), dsig, leaf), now, 77);
	struct fs_entry se =
	    fs_entry_new(&rekor, fs_dsse_body(st, strlen(st), dsig, leaf_sct), now, 78);
	struct fs_bundle_opts bo = {.version = "0.3", .proof = fs_inclusion_proof(&be, 77, 4096)};
	char *bundle = fs_bundle(st, dsig, leaf, &be, &bo);
	free(bo.proof);
	bo.proof = fs_inclusion_proof(&se, 78, 4096);
	char *bundle_sct = fs_bundle(st, dsig, leaf_sct, &se, &bo);

	struct sig_keyset *kl = keyless_set(trusted, NULL), *kl_ct = keyless_set(trusted, &ct);
	struct {
		const char *name;
		struct sig_keyset *ks;
		struct sig_candidate c;
	} cases[] = {
	    {"key, simple signing", keys, {SIG_KIND_SIMPLE, kpayload, kplen, ksig, "", 0, 0, 0}},
	    {"key, DSSE bundle", keys, {SIG_KIND_BUNDLE, kbundle, kblen, NULL, "", 0, 0, 0}},
	    {"keyless, simple signing (cert, chain, SET)",
	     kl,
	     {SIG_KIND_SIMPLE, payload, strlen(payload), sig, "", cert, chain, ann}},
	    {"keyless, bundle v0.3 (SET, inclusion proof, checkpoint)",
	     kl,
	     {SIG_KIND_BUNDLE, bundle, strlen(bundle), NULL, "", 0, 0, 0}},
	    {"keyless, bundle v0.3, SCT checked too",
	     kl_ct,
	     {SIG_KIND_BUNDLE, bundle_sct, strlen(bundle_sct), NULL, "", 0, 0, 0}},
	};
	printf("%-58s %12s %12s\n", "signature (one per image)", "us/image", "images/s");
	double key_us = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		double us = time_one(cases[i].ks, &cases[i].c, n);
		if (i == 0)
			key_us = us;
		printf("%-58s %12.1f %12.0f   (x%.1f the key's)\n", cases[i].name, us, 1e6 / us,
		       us / key_us);
	}
	/* loading the trust: what a reload of the trust directory costs */
	double t0 = now_us();
	for (int i = 0; i < n; i++)
		sig_keyset_free(keyless_set(trusted, NULL));
	printf("%-58s %12.1f\n", "loading the trusted root and one rule (per reload)",
	       (now_us() - t0) / n);
	printf("(%d verifications per batch, median of %d batches; no registry, no cache of "
	       "verdicts)\n",
	       n, BATCHES);
	sig_keyset_free(keys);
	sig_keyset_free(kl);
	sig_keyset_free(kl_ct);
	sig_key_free(priv);
	fs_entry_free(&e);
	fs_entry_free(&be);
	fs_entry_free(&se);
	fs_log_free(&rekor);
	fs_log_free(&ct);
	fs_ca_free(&root);
	fs_ca_free(&mid);
	return 0;
}
