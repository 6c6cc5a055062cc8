/* Finding and storing cosign signatures in a repository (the registry
 * side; the cryptography is in signature.h):
 *
 *  - simple signing: the manifest tagged "sha256-<hex>.sig", one layer
 *    per signature (payload blob + base64 signature annotation);
 *  - sigstore bundles (cosign v3): OCI 1.1 referrers of the image with
 *    artifactType application/vnd.dev.sigstore.bundle.v0.3+json, found
 *    through the referrers API, or, where the registry (or a layout) has
 *    none, through the fallback index tagged "sha256-<hex>".
 *
 * Everything fetched is verified against its digest and size-capped. A
 * registry failure is an error, never "unsigned". */
#ifndef GKM_OCI_SIG_H
#define GKM_OCI_SIG_H

#include <stdbool.h>

#include "oci_err.h"
#include "oci_repo.h"
#include "signature.h"

#define OCI_SIG_MAX_CANDIDATES 64

struct oci_sig_found {
	struct sig_candidate c[OCI_SIG_MAX_CANDIDATES]; /* data/signature/source owned here */
	size_t n;
	size_t n_simple, n_bundle;
	bool referrers_api; /* the registry answered the referrers API */
};
void oci_sig_found_clear(struct oci_sig_found *f);

/* "sha256-<hex>" plus suffix (".sig" or "") into out. */
void oci_sig_tag(const char *digest, const char *suffix, char *out, size_t cap);

/* Collect every signature of image_digest in r. 0 (possibly none found)
 * or -errno + err when the repository could not be read. */
__attribute__((warn_unused_result)) int oci_sig_collect(struct oci_repo *r,
                                                        const char *image_digest,
                                                        struct oci_sig_found *out,
                                                        struct oci_err *err);

/* Add a simple-signing signature (payload + base64 signature) to the
 * "sha256-<hex>.sig" manifest, keeping the signatures already there. */
__attribute__((warn_unused_result)) int
oci_sig_push_simple(struct oci_repo *r, const char *image_digest, const char *payload, size_t len,
                    const char *signature_b64, struct oci_err *err);

/* Store a bundle as a referrer of image (its manifest descriptor). Where
 * the registry does not index the subject itself (no OCI-Subject answer,
 * or a layout), the fallback index "sha256-<hex>" is updated too.
 * *indexed (may be NULL) tells whether the registry indexed it. */
__attribute__((warn_unused_result)) int oci_sig_push_bundle(struct oci_repo *r,
                                                            const struct oci_desc *image,
                                                            const char *bundle, size_t len,
                                                            bool *indexed, struct oci_err *err);

#endif
