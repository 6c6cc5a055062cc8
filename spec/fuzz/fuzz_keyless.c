/* Fuzz target: the keyless parsers (keyless.h). The first byte picks one:
 * a trusted_root.json, identity rules, a sigstore bundle verified keyless,
 * cosign's Rekor bundle annotation of an otherwise valid simple signature,
 * PEM CA certificates or log keys. The trust is the test sigstore's
 * (spec/unit/fake_sigstore.h), made once, so documents that get far enough
 * meet a real chain, log key and rule. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/fake_sigstore.h"
#include "keyless.h"

#define DIGEST "sha256:4f6b1c3e0c5a9d2b7e8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"

static struct sig_keyless *kl;
static char *payload, *sig, *cert, *chain;

static void setup(void)
{
	struct fs_ca root = fs_ca_new("root", NULL, -86400, 86400 * 365);
	struct fs_ca mid = fs_ca_new("intermediate", &root, -86400, 86400 * 365);
	struct fs_log rekor = fs_log_new("rekor.test");
	char *trusted = fs_trusted_root(&root, &mid, &rekor, NULL, 0), why[256];
	const char *rule = "- {issuer: " FS_GITHUB ", subjectRegExp: '^https://github\\.com/'}\n";
	if (sig_keyless_new(&kl) ||
	    sig_keyless_add_trusted_root(kl, trusted, strlen(trusted), why, sizeof(why)) ||
	    sig_keyless_add_rules_text(kl, rule, strlen(rule), why, sizeof(why)))
		abort();
	EVP_PKEY *k = fs_p256();
	struct fs_leaf_opts o = {
	    .issuer = FS_GITHUB, .uri = "https://github.com/o/r", .not_before = -60};
	X509 *leaf = fs_leaf(&mid, k, &o);
	payload = fs_simple_payload("registry.test/cache", DIGEST);
	sig = fs_sign_b64(k, payload, strlen(payload));
	cert = fs_pem_cert(leaf);
	chain = fs_pem_cert(mid.cert);
	free(trusted);
	X509_free(leaf);
	EVP_PKEY_free(k);
	fs_ca_free(&root);
	fs_ca_free(&mid);
	fs_log_free(&rekor);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (!kl)
		setup();
	char *doc = strndup((const char *)data + 1, size - 1), why[512];
	size_t len = strlen(doc);
	struct sig_keyless *fresh = NULL;
	struct keyless_result r;
	switch (data[0] % 6) {
	case 0:
		if (sig_keyless_new(&fresh) == 0)
			(void)sig_keyless_add_trusted_root(fresh, doc, len, why, sizeof(why));
		break;
	case 1:
		if (sig_keyless_new(&fresh) == 0)
			(void)sig_keyless_add_rules_text(fresh, doc, len, why, sizeof(why));
		break;
	case 2:
		(void)sig_keyless_verify_bundle(kl, DIGEST, doc, len, &r, why, sizeof(why));
		break;
	case 3:
		(void)sig_keyless_verify_simple(kl, DIGEST, payload, strlen(payload), sig, cert,
		                                chain, doc, &r, why, sizeof(why));
		break;
	case 4:
		(void)sig_keyless_verify_simple(kl, DIGEST, payload, strlen(payload), sig, doc, doc,
		                                NULL, &r, why, sizeof(why));
		break;
	default:
		if (sig_keyless_new(&fresh) == 0) {
			(void)sig_keyless_add_ca_pem(fresh, doc, len, why, sizeof(why));
			(void)sig_keyless_add_log_pem(fresh, doc, len, false, why, sizeof(why));
		}
		break;
	}
	sig_keyless_free(fresh);
	free(doc);
	return 0;
}
