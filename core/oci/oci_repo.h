/* One repository, wherever it lives: a registry repository reached through
 * oci_registry, or an OCI layout directory. Every gkm command that reads or
 * writes images goes through this, so each works with "oci:DIR:TAG" as
 * well as with "host/repo:tag".
 *
 * Also the image-level operations built on it: fetch an image (manifest
 * with platform selection through an index, config with its labels) and
 * copy an image between repositories. */
#ifndef GKM_OCI_REPO_H
#define GKM_OCI_REPO_H

#include <stdbool.h>

#include "oci_blob.h"
#include "oci_err.h"
#include "oci_image.h"
#include "oci_ref.h"
#include "oci_registry.h"

#define OCI_MAX_CONFIG_BYTES (8u << 20)

struct oci_repo;

/* Open the repository ref names (its tag/digest are not used here). For a
 * layout, create makes the directory when missing. opts may be NULL (for
 * registries: defaults). Caller frees with oci_repo_free(). */
__attribute__((warn_unused_result)) int oci_repo_open(const struct oci_ref *ref,
                                                      const struct oci_registry_opts *opts,
                                                      bool create, struct oci_repo **out,
                                                      struct oci_err *err);
/* A registry repository on a client the caller keeps (its connections,
 * scheme and tokens serve many repositories of its host): client must be for
 * ref's API host and outlive the repo; oci_repo_free() leaves it alone.
 * -EINVAL for a layout reference. */
__attribute__((warn_unused_result)) int oci_repo_open_on(const struct oci_ref *ref,
                                                         struct oci_registry *client,
                                                         struct oci_repo **out,
                                                         struct oci_err *err);
void oci_repo_free(struct oci_repo *r);
/* The reference the repo was opened with (borrowed). */
const struct oci_ref *oci_repo_ref(const struct oci_repo *r);
/* "quay.io/org/repo" or "oci:DIR" (borrowed). */
const char *oci_repo_name(const struct oci_repo *r);

__attribute__((warn_unused_result)) int oci_repo_resolve(struct oci_repo *r, const char *reference,
                                                         struct oci_desc *out, struct oci_err *err);
__attribute__((warn_unused_result)) int oci_repo_get_manifest(struct oci_repo *r,
                                                              const char *reference,
                                                              struct oci_fetched *out,
                                                              struct oci_err *err);
__attribute__((warn_unused_result)) int
oci_repo_blob_open(struct oci_repo *r, const struct oci_desc *d, const char *what,
                   struct oci_blob_reader **out, struct oci_err *err);
/* The source serves blob d to these credentials (a registry: a HEAD; a
 * layout: the file is there): 0, -ENOENT or the refusal. */
__attribute__((warn_unused_result)) int
oci_repo_blob_readable(struct oci_repo *r, const struct oci_desc *d, struct oci_err *err);
/* A whole blob in memory, verified, at most max bytes. Caller frees *out. */
__attribute__((warn_unused_result)) int oci_repo_get_blob(struct oci_repo *r,
                                                          const struct oci_desc *d, size_t max,
                                                          const char *what, char **out, size_t *len,
                                                          struct oci_err *err);
/* Store a blob given as a file (digest and size in d) or as memory. */
__attribute__((warn_unused_result)) int oci_repo_put_blob_file(struct oci_repo *r, const char *path,
                                                               const struct oci_desc *d,
                                                               struct oci_err *err);
__attribute__((warn_unused_result)) int oci_repo_put_blob_mem(struct oci_repo *r, const void *buf,
                                                              size_t len, struct oci_err *err);
/* Store a manifest under tag (NULL: by its digest only). artifact_type is
 * recorded in a layout's index. subject_ack as in oci_registry_put_manifest
 * (always false for layouts). */
__attribute__((warn_unused_result)) int
oci_repo_put_manifest(struct oci_repo *r, const char *tag, const char *media_type, const char *data,
                      size_t len, const char *artifact_type, char digest_out[OCI_DIGEST_MAX],
                      bool *subject_ack, struct oci_err *err);
/* Referrers API; -EOPNOTSUPP for layouts and registries without it. */
__attribute__((warn_unused_result)) int oci_repo_referrers(struct oci_repo *r, const char *digest,
                                                           const char *artifact_type,
                                                           struct oci_index *out,
                                                           struct oci_err *err);

/* An image as pulled: what the reference resolved to, the manifest chosen
 * (through an index when there is one), and its config. */
struct oci_image {
	char top_digest[OCI_DIGEST_MAX]; /* what the reference names (index or manifest) */
	char *top_media_type;
	struct oci_desc desc;   /* the image manifest's descriptor */
	struct oci_fetched raw; /* its bytes */
	struct oci_manifest manifest;
	char *config_raw;
	size_t config_len;
	struct oci_config config;
};
void oci_image_clear(struct oci_image *img);

/* Fetch the image reference (tag or digest) names; platform "os/arch[/variant]"
 * picks from an index (NULL: linux and this machine's architecture). */
__attribute__((warn_unused_result)) int
oci_repo_fetch_image(struct oci_repo *r, const char *reference, const char *platform,
                     struct oci_image *out, struct oci_err *err);

/* Copy one blob from src to dst unless dst has it already (what names it in
 * errors: "layer 0"). */
__attribute__((warn_unused_result)) int oci_repo_copy_blob(struct oci_repo *src,
                                                           struct oci_repo *dst,
                                                           const struct oci_desc *d,
                                                           const char *what, struct oci_err *err);

/* Copy the image (manifest or index with its manifests, configs and layers)
 * that src_reference names in src to dst under dst_tag (NULL: by digest).
 * Blobs dst already has are not sent again. digest_out gets the top digest. */
__attribute__((warn_unused_result)) int
oci_repo_copy_image(struct oci_repo *src, const char *src_reference, struct oci_repo *dst,
                    const char *dst_tag, char digest_out[OCI_DIGEST_MAX], struct oci_err *err);

#endif
