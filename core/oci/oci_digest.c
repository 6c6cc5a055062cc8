#include "oci_digest.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "textfmt.h"

static size_t hex_len_for(const char *algo, size_t algo_len)
{
	if (algo_len == 6 && memcmp(algo, "sha256", 6) == 0)
		return 64;
	if (algo_len == 6 && memcmp(algo, "sha512", 6) == 0)
		return 128;
	return 0;
}

bool oci_digest_valid(const char *d)
{
	if (!d)
		return false;
	const char *colon = strchr(d, ':');
	if (!colon)
		return false;
	size_t want = hex_len_for(d, (size_t)(colon - d));
	if (!want || strlen(colon + 1) != want)
		return false;
	for (const char *p = colon + 1; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

const char *oci_digest_hex(const char *d)
{
	const char *colon = d ? strchr(d, ':') : NULL;
	return colon ? colon + 1 : "";
}

int oci_hasher_init(struct oci_hasher *h, const char *like)
{
	memset(h, 0, sizeof(*h));
	const char *algo = "sha256";
	if (like && strncmp(like, "sha512:", 7) == 0)
		algo = "sha512";
	const EVP_MD *md = strcmp(algo, "sha512") == 0 ? EVP_sha512() : EVP_sha256();
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx)
		return -ENOMEM;
	if (EVP_DigestInit_ex(ctx, md, NULL) != 1) {
		EVP_MD_CTX_free(ctx);
		return -EIO;
	}
	h->ctx = ctx;
	snprintf(h->algo, sizeof(h->algo), "%s", algo);
	return 0;
}

void oci_hasher_update(struct oci_hasher *h, const void *buf, size_t len)
{
	if (h->ctx && len) {
		EVP_DigestUpdate(h->ctx, buf, len);
		h->bytes += len;
	}
}

int oci_hasher_final(struct oci_hasher *h, char out[OCI_DIGEST_MAX])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	if (!h->ctx || EVP_DigestFinal_ex(h->ctx, md, &n) != 1)
		return -EIO;
	EVP_MD_CTX_free(h->ctx);
	h->ctx = NULL;
	size_t off = (size_t)snprintf(out, OCI_DIGEST_MAX, "%s:", h->algo);
	if (off + 2 * (size_t)n >= OCI_DIGEST_MAX)
		return -ENAMETOOLONG;
	hex_encode(md, n, out + off);
	return 0;
}

void oci_hasher_free(struct oci_hasher *h)
{
	if (h->ctx)
		EVP_MD_CTX_free(h->ctx);
	h->ctx = NULL;
}

int oci_digest_buf(const void *buf, size_t len, char out[OCI_DIGEST_MAX])
{
	struct oci_hasher h;
	int rc = oci_hasher_init(&h, NULL);
	if (rc)
		return rc;
	oci_hasher_update(&h, buf, len);
	rc = oci_hasher_final(&h, out);
	oci_hasher_free(&h);
	return rc;
}
