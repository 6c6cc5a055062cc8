/* An OCI image-layout directory (oci-layout, index.json, blobs/<alg>/<hex>)
 * as a source and a destination, so images can be built, signed, inspected
 * and extracted with no registry, and exchanged with skopeo and umoci.
 *
 * Tags are index.json entries annotated org.opencontainers.image.ref.name.
 * Blobs are written to a temporary file in blobs/, checked, fsync'd and
 * renamed into place; index.json is replaced atomically under a lock. */
#ifndef GKM_OCI_LAYOUT_H
#define GKM_OCI_LAYOUT_H

#include <stdbool.h>

#include "oci_blob.h"
#include "oci_err.h"
#include "oci_image.h"
#include "oci_registry.h"

struct oci_layout;

/* Open dir; with create, make it (and its oci-layout and index.json) when
 * missing. -ENOENT / -EINVAL + err when it is not a layout. Caller frees
 * with oci_layout_free(). */
__attribute__((warn_unused_result)) int
oci_layout_open(const char *dir, bool create, struct oci_layout **out, struct oci_err *err);
void oci_layout_free(struct oci_layout *l);

/* The manifest a tag or digest names. -ENOENT when there is none. */
__attribute__((warn_unused_result)) int oci_layout_resolve(struct oci_layout *l,
                                                           const char *reference,
                                                           struct oci_desc *out,
                                                           struct oci_err *err);
__attribute__((warn_unused_result)) int oci_layout_get_manifest(struct oci_layout *l,
                                                                const char *reference, size_t max,
                                                                struct oci_fetched *out,
                                                                struct oci_err *err);

bool oci_layout_has_blob(struct oci_layout *l, const char *digest);
__attribute__((warn_unused_result)) int
oci_layout_blob_open(struct oci_layout *l, const struct oci_desc *d, const char *what,
                     struct oci_blob_reader **out, struct oci_err *err);
/* Path of a blob's file ("DIR/blobs/sha256/<hex>"); caller frees. */
char *oci_layout_blob_path(const struct oci_layout *l, const char *digest);

/* Store a blob from a reader (verified while copying; the reader is
 * consumed but not closed) or from memory. Nothing is written when the
 * blob is already there. */
__attribute__((warn_unused_result)) int oci_layout_put_blob_reader(struct oci_layout *l,
                                                                   struct oci_blob_reader *r,
                                                                   const char *digest,
                                                                   struct oci_err *err);
__attribute__((warn_unused_result)) int oci_layout_put_blob_mem(struct oci_layout *l,
                                                                const void *buf, size_t len,
                                                                char digest_out[OCI_DIGEST_MAX],
                                                                struct oci_err *err);
/* Create a temporary file in the blob directory (same file system, so
 * oci_layout_commit_blob() can rename it). *path is malloc'd. */
__attribute__((warn_unused_result)) int oci_layout_tmpfile(struct oci_layout *l, int *fd,
                                                           char **path);
/* fsync and rename tmp_path to the blob named digest (which the caller
 * computed while writing it). */
__attribute__((warn_unused_result)) int oci_layout_commit_blob(struct oci_layout *l,
                                                               const char *tmp_path,
                                                               const char *digest,
                                                               struct oci_err *err);

/* Write a manifest blob and list it in index.json: under tag (replacing
 * what the tag named before) or, with tag NULL, as an untagged entry. */
__attribute__((warn_unused_result)) int
oci_layout_put_manifest(struct oci_layout *l, const char *tag, const char *media_type,
                        const char *data, size_t len, const char *artifact_type,
                        char digest_out[OCI_DIGEST_MAX], struct oci_err *err);

#endif
