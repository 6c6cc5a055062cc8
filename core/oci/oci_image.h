/* OCI and Docker image JSON: manifests, indexes, configs and descriptors,
 * parsed strictly (every digest, size and media type checked, with bounded
 * counts) and built with stable key order so that the same input always
 * gives the same bytes and so the same digest. */
#ifndef GKM_OCI_IMAGE_H
#define GKM_OCI_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "oci_digest.h"
#include "oci_err.h"

#define OCI_MT_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define OCI_MT_INDEX "application/vnd.oci.image.index.v1+json"
#define OCI_MT_CONFIG "application/vnd.oci.image.config.v1+json"
#define OCI_MT_LAYER_TAR "application/vnd.oci.image.layer.v1.tar"
#define OCI_MT_LAYER_GZIP "application/vnd.oci.image.layer.v1.tar+gzip"
#define OCI_MT_LAYER_ZSTD "application/vnd.oci.image.layer.v1.tar+zstd"
#define OCI_MT_EMPTY "application/vnd.oci.empty.v1+json"
#define DOCKER_MT_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define DOCKER_MT_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define DOCKER_MT_CONFIG "application/vnd.docker.container.image.v1+json"
#define DOCKER_MT_LAYER_GZIP "application/vnd.docker.image.rootfs.diff.tar.gzip"
#define DOCKER_MT_LAYER_TAR "application/vnd.docker.image.rootfs.diff.tar"
#define COSIGN_MT_SIMPLESIGNING "application/vnd.dev.cosign.simplesigning.v1+json"
#define SIGSTORE_MT_BUNDLE "application/vnd.dev.sigstore.bundle.v0.3+json"
#define COSIGN_ANN_SIGNATURE "dev.cosignproject.cosign/signature"
#define OCI_ANN_REF_NAME "org.opencontainers.image.ref.name"
#define OCI_ANN_CREATED "org.opencontainers.image.created"

/* What registries are asked for, most preferred first. */
#define OCI_MANIFEST_ACCEPT                                                                        \
	OCI_MT_MANIFEST ", " OCI_MT_INDEX ", " DOCKER_MT_MANIFEST ", " DOCKER_MT_LIST

/* The empty config/blob "{}" of OCI 1.1 artifacts. */
#define OCI_EMPTY_JSON "{}"
#define OCI_EMPTY_DIGEST "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

#define OCI_MAX_LAYERS 1024
#define OCI_MAX_INDEX_ENTRIES 4096

enum oci_kind { OCI_KIND_UNKNOWN = 0, OCI_KIND_MANIFEST, OCI_KIND_INDEX };
enum oci_compression { OCI_COMP_UNKNOWN = 0, OCI_COMP_NONE, OCI_COMP_GZIP, OCI_COMP_ZSTD };

struct oci_platform {
	char *os, *architecture, *variant; /* NULL when absent */
};

struct oci_desc {
	char *media_type;
	char digest[OCI_DIGEST_MAX];
	int64_t size;
	char *artifact_type;          /* NULL when absent */
	cJSON *annotations;           /* owned object or NULL */
	struct oci_platform platform; /* index entries only */
	bool has_platform;
};

struct oci_manifest {
	char *media_type; /* from the JSON, else from the Content-Type it came with */
	char *artifact_type;
	struct oci_desc config;
	struct oci_desc *layers;
	size_t n_layers;
	struct oci_desc *subject; /* NULL when absent */
	cJSON *annotations;
};

struct oci_index {
	char *media_type;
	char *artifact_type;
	struct oci_desc *manifests;
	size_t n_manifests;
	struct oci_desc *subject;
	cJSON *annotations;
};

/* An image config: the parsed JSON is kept whole. */
struct oci_config {
	cJSON *root;
};

/* Manifest or index? From the JSON's own mediaType, else the Content-Type,
 * else the shape. Media types we do not know give OCI_KIND_UNKNOWN. */
enum oci_kind oci_kind_of(const char *media_type);
enum oci_kind oci_detect_kind(const char *buf, size_t len, const char *content_type);

enum oci_compression oci_layer_compression(const char *media_type);

/* Parse a manifest. Unknown layer media types are kept (the extractor
 * refuses them with a clear message). -EINVAL + err for malformed JSON, bad
 * digests, negative sizes, too many layers, or a document that is not an
 * image manifest. Release with oci_manifest_clear(). */
__attribute__((warn_unused_result)) int oci_manifest_parse(const char *buf, size_t len,
                                                           const char *content_type,
                                                           struct oci_manifest *out,
                                                           struct oci_err *err);
void oci_manifest_clear(struct oci_manifest *m);

__attribute__((warn_unused_result)) int oci_index_parse(const char *buf, size_t len,
                                                        const char *content_type,
                                                        struct oci_index *out, struct oci_err *err);
void oci_index_clear(struct oci_index *ix);

__attribute__((warn_unused_result)) int
oci_config_parse(const char *buf, size_t len, struct oci_config *out, struct oci_err *err);
void oci_config_clear(struct oci_config *c);
/* config.Labels[key] (OCI and Docker spell the object "config"), borrowed
 * from c; NULL when absent. */
const char *oci_config_label(const struct oci_config *c, const char *key);
/* The Labels object itself (borrowed), or NULL. */
const cJSON *oci_config_labels(const struct oci_config *c);

/* The entry of ix for os/arch[/variant] ("linux", "amd64", NULL). When the
 * index has exactly one image manifest with no platform, that one. Entries
 * whose platform is "unknown/unknown" (attestations) never match.
 * -ENOENT + err listing the platforms present otherwise. */
__attribute__((warn_unused_result)) int oci_index_select(const struct oci_index *ix, const char *os,
                                                         const char *arch, const char *variant,
                                                         size_t *which, struct oci_err *err);
/* The GOARCH-style name of the machine we run on ("amd64", "arm64"...). */
const char *oci_host_arch(void);

/* Descriptors. */
void oci_desc_clear(struct oci_desc *d);
__attribute__((warn_unused_result)) int oci_desc_copy(const struct oci_desc *src,
                                                      struct oci_desc *dst);
/* Parse one descriptor object; what names which document it is in. */
__attribute__((warn_unused_result)) int
oci_desc_from_json(const cJSON *j, const char *what, struct oci_desc *out, struct oci_err *err);
/* A new JSON object for d (mediaType, artifactType, digest, size,
 * annotations, platform), NULL on ENOMEM. */
cJSON *oci_desc_to_json(const struct oci_desc *d);
/* Fill d for a blob given its bytes; annotations NULL. */
__attribute__((warn_unused_result)) int oci_desc_for_bytes(const char *media_type, const void *buf,
                                                           size_t len, struct oci_desc *d);
/* Annotation value of d, borrowed; NULL when absent. */
const char *oci_desc_annotation(const struct oci_desc *d, const char *key);

/* Serialise (compact JSON, keys in spec order). *out is malloc'd, caller
 * frees; 0 or -ENOMEM. */
__attribute__((warn_unused_result)) int oci_manifest_build(const struct oci_manifest *m, char **out,
                                                           size_t *len);
__attribute__((warn_unused_result)) int oci_index_build(const struct oci_index *ix, char **out,
                                                        size_t *len);

/* Bounded JSON parse helper: NULL + err when buf is not one JSON value. */
cJSON *oci_json_parse(const char *buf, size_t len, const char *what, struct oci_err *err);

#endif
