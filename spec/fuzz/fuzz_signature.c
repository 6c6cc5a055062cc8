/* Fuzz target: signature payload and bundle parsers. The first byte picks
 * the parser; the rest is the document. A key set with one fresh key makes
 * the bundle path run to the signature check. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "signature.h"

#define DIGEST "sha256:4f6b1c3e0c5a9d2b7e8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"

static struct sig_keyset *keys(void)
{
	static struct sig_keyset *ks;
	if (ks == NULL) {
		char *priv, *pub, why[128];
		if (sig_keygen_p256(NULL, &priv, &pub) < 0 || sig_keyset_new(&ks) < 0 ||
		    sig_keyset_add_pem(ks, pub, strlen(pub), why, sizeof(why)) < 0)
			abort();
		free(priv);
		free(pub);
	}
	return ks;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *doc = (const char *)data + 1;
	size_t len = size - 1;
	char why[256], fp[SIGNATURE_FP_MAX];
	switch (data[0] % 4) {
	case 0:
		(void)sig_check_simple_payload(doc, len, DIGEST, why, sizeof(why));
		break;
	case 1:
		(void)sig_verify_bundle(keys(), DIGEST, doc, len, fp, why, sizeof(why));
		break;
	case 2: {
		unsigned char *out;
		size_t n, bad;
		for (int d = BASE64_STD; d <= BASE64_PROTOJSON; d++)
			if (base64_decode(doc, len, (enum base64_dialect)d, &out, &n, &bad) == 0)
				free(out);
		break;
	}
	default: {
		struct sig_key *k;
		if (sig_key_load_public(doc, len, &k, why, sizeof(why)) == 0)
			sig_key_free(k);
		break;
	}
	}
	return 0;
}
