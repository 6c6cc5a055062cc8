/* Content digests ("sha256:<64 hex>", "sha512:<128 hex>") computed with
 * OpenSSL EVP while bytes stream past, so nothing needs buffering. */
#ifndef GKM_OCI_DIGEST_H
#define GKM_OCI_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest digest string we produce or accept, with its NUL. */
#define OCI_DIGEST_MAX (7 + 128 + 1)

/* A well-formed digest of an algorithm we can verify (sha256 or sha512),
 * lower-case hex of the right length. */
bool oci_digest_valid(const char *d);
/* The hex part of a valid digest (borrowed from d). */
const char *oci_digest_hex(const char *d);

struct oci_hasher {
	void *ctx; /* EVP_MD_CTX, owned */
	char algo[8];
	uint64_t bytes;
};

/* Start a hash of the algorithm that digest `like` uses ("sha256" when NULL).
 * Release with oci_hasher_free() (also safe after final). */
__attribute__((warn_unused_result)) int oci_hasher_init(struct oci_hasher *h, const char *like);
void oci_hasher_update(struct oci_hasher *h, const void *buf, size_t len);
/* Writes "algo:hex" into out; the hasher can not be updated afterwards. */
__attribute__((warn_unused_result)) int oci_hasher_final(struct oci_hasher *h,
                                                         char out[OCI_DIGEST_MAX]);
void oci_hasher_free(struct oci_hasher *h);

/* sha256 of a buffer as "sha256:<hex>". */
__attribute__((warn_unused_result)) int oci_digest_buf(const void *buf, size_t len,
                                                       char out[OCI_DIGEST_MAX]);
#endif
