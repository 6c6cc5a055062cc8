/* From an image reference to a verified, extracted store entry: the node
 * side of gkm (the agent, `gkm up`, `gkm cache extract`). Blocking: call from
 * worker threads. */
#ifndef GKM_OCI_PULL_H
#define GKM_OCI_PULL_H

#include <stdbool.h>

#include "extract.h"
#include "oci_err.h"
#include "oci_repo.h"
#include "signature.h"
#include "store.h"

struct oci_pull_opts {
	const struct oci_registry_opts *registry; /* NULL: defaults */
	/* non-NULL: a client for the reference's host to use (borrowed,
	 * oci_repo_open_on); registry is then not used */
	struct oci_registry *client;
	const struct sig_keyset *keys; /* non-empty: a signature by one of them is required */
	/* a signature is required even when keys is empty (or NULL): then
	 * nothing can verify, and the pull fails with -ENOKEY (fail closed) */
	bool require_signature;
	struct sig_verdict *verdict; /* may be NULL: the accepting signature, when verified */
	const char *platform;        /* index selection; NULL: linux and this machine's arch */
	const struct extract_limits *limits; /* NULL: extract_limits_default() */
	/* called with the image (verified) before any layer is downloaded, not
	 * when the store has its digest already; non-zero stops the pull with
	 * that error (the agent checks the store's free space) */
	int (*before_layers)(const struct oci_image *img, void *ud, struct oci_err *err);
	void *before_layers_ud;
};

/* Check the signatures of image_digest in repo against keys. 0 when one
 * verifies; -ENODATA unsigned, -EKEYREJECTED none verifies (err says why for
 * each), other -errno when the registry could not be read. */
__attribute__((warn_unused_result)) int
oci_pull_verify(struct oci_repo *repo, const char *image_digest, const struct sig_keyset *keys,
                struct sig_verdict *verdict, struct oci_err *err);

/* Stream every layer of img from repo through x (digests checked while
 * reading; the extractor's safety rules apply). The calling thread
 * downloads and hashes while the extractor's threads inflate (one) and
 * parse the tar and write files (another); a layer is complete only once
 * its digest verified, and a layer that breaks the extractor is read to its
 * end so that a tampered blob is reported as the digest mismatch it is. */
__attribute__((warn_unused_result)) int oci_pull_extract(struct oci_repo *repo,
                                                         const struct oci_image *img,
                                                         struct extract *x, struct oci_err *err);

/* Extract img (fetched from repo) into a new store entry: *present and 0
 * when another pull made the entry meanwhile. A layer a mirror sent wrong
 * (-ESTALE, see oci_registry_blob_open) is pulled again from the next
 * source. info gets the entry. */
__attribute__((warn_unused_result)) int oci_pull_into_store(struct store *st, struct oci_repo *repo,
                                                            const struct oci_image *img,
                                                            const struct extract_limits *limits,
                                                            struct store_entry_info *info,
                                                            bool *present, struct oci_err *err);

/* Fetch ref (parsed once by the caller: a tag or, for the agent, a digest), verify it
 * when o->keys is non-empty, and extract it into st unless the store already
 * holds its manifest digest (then nothing is downloaded but, when verifying,
 * the signatures). On success img (may be NULL) holds the image, digest_out
 * (OCI_DIGEST_MAX, may be NULL) the store digest, info the entry. */
__attribute__((warn_unused_result)) int
oci_pull_to_store(struct store *st, const struct oci_ref *ref, const struct oci_pull_opts *o,
                  struct oci_image *img, char *digest_out, struct store_entry_info *info,
                  bool *already_present, struct oci_err *err);

#endif
