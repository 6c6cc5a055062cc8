/* What the webhook learns about an image from its registry: the digest its
 * tag names, and each of its signatures checked against the trusted keys.
 * The registry side (client, signature discovery) is core/oci/oci_repo.h and
 * core/oci/oci_sig.h, the cryptography core/oci/signature.h; this is the one call
 * the webhook's workers make. Blocking: runs on a worker thread and touches
 * no loop state. */
#ifndef GKM_IMAGE_CHECK_H
#define GKM_IMAGE_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "cache_env.h"
#include "oci_digest.h"
#include "oci_ref.h"
#include "oci_registry.h"
#include "signature.h"

/* Signatures reported to the policy (more are checked, only these kept). */
#define IMAGE_CHECK_MAX_SIGS 8

/* One signature found for the image, as the admission policy sees it. */
struct image_sig {
	enum sig_kind kind;
	bool verified;
	char key[SIGNATURE_FP_MAX]; /* verified: the key's fingerprint (keyless: the rule's id) */
	char identity[256], issuer[256], rule[96]; /* verified keyless: who signed, which rule */
	char reason[600];                          /* not verified: why */
};

/* The outcome of checking the signatures of one digest with one key set,
 * and what the image's config says a runtime needs to read it. */
struct image_verdict {
	size_t n;     /* entries in sig */
	size_t found; /* signatures found (n may be smaller) */
	struct image_sig sig[IMAGE_CHECK_MAX_SIGS];
	bool trees_known; /* the config was read: trees and identity are what it declares */
	size_t ntrees;
	struct cache_env_tree trees[CACHE_ENV_TREES_MAX];
	char identity[CACHE_ENV_IDENTITY_MAX]; /* its identity label ("" for none, or too long) */
};

/* 'simple' or 'bundle'. */
const char *image_sig_kind_name(enum sig_kind k);
/* Is any signature verified? */
bool image_verdict_accepted(const struct image_verdict *v);

/* Registry failures are classified for the user's message. */
enum image_check_error {
	IMAGE_CHECK_OK = 0,
	IMAGE_CHECK_NOT_FOUND,   /* the tag or manifest does not exist */
	IMAGE_CHECK_UNAVAILABLE, /* the registry could not be reached or failed */
};

struct image_check_result {
	char digest[OCI_DIGEST_MAX]; /* what the reference names now */
	bool resolved;               /* the digest came from the registry (tag lookup) */
	bool verified;               /* verdict below is filled */
	struct image_verdict verdict;
	enum image_check_error error;
	char message[512]; /* error: what went wrong, for the user */
};

/* Check ref (a registry reference; layouts are refused): resolve its tag
 * unless digest is given (or the reference has one), read the image's
 * config for the trees it declares (a config that cannot be read leaves
 * trees_known false; the check goes on), then, when ks is not NULL, find
 * the signatures of the digest and verify each with ks. Always
 * fills *out; returns 0, or -errno with out->error and out->message set. */
__attribute__((warn_unused_result)) int
image_check_run(const struct oci_ref *ref, const char *digest, const struct sig_keyset *ks,
                const struct oci_registry_opts *opts, struct image_check_result *out);

#endif
