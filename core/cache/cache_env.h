/* The environment a runtime needs to read a cache image it mounts: one
 * variable per tree the image holds, naming that tree's path under the
 * mount. Triton reads TRITON_CACHE_DIR (gkm's io.triton.cache/), vLLM
 * VLLM_CACHE_ROOT (io.vllm.cache/; vLLM points Triton and inductor inside
 * it itself), and an image made by KServe's MCV says its own with the
 * io.kserve.km/cache-root-env and io.kserve.km/cache-mount-subpath labels.
 * Pure functions, no I/O. */
#ifndef GKM_CACHE_ENV_H
#define GKM_CACHE_ENV_H

#include <cJSON.h>
#include <stddef.h>

#include "cache_image.h"

#define CACHE_ENV_LABEL_ROOT_ENV "io.kserve.km/cache-root-env" /* "VAR=/path/in/image" */
#define CACHE_ENV_LABEL_SUBPATH "io.kserve.km/cache-mount-subpath"
/* On a cache: the trees of its image, as the admission webhook read them
 * from the image's labels ("TRITON_CACHE_DIR=io.triton.cache", several
 * comma-separated; "" for an image that declares none). */
#define CACHE_ENV_ANNOTATION "gkm.io/runtime-env"
/* On a cache: the identity label of its image (cache_identity_json(), "" when
 * the image has none), so that pods can be told a cache will not hit them. */
#define CACHE_ENV_IDENTITY_ANNOTATION "gkm.io/runtime-identity"
/* On a pod: the runtime it runs, "triton=3.2.0" (several comma-separated),
 * compared with the identity of the caches it mounts. */
#define CACHE_ENV_RUNTIME_ANNOTATION "gkm.io/runtime"
#define CACHE_ENV_IDENTITY_MAX 512
#define CACHE_ENV_TREES_MAX 4
#define CACHE_ENV_TEXT_MAX (CACHE_ENV_TREES_MAX * (64 + 256 + 2))

struct cache_env_tree {
	char variable[64]; /* TRITON_CACHE_DIR */
	char subpath[256]; /* under the mount: "io.triton.cache"; "" for its root */
};

/* The format gkm's labels (cache.<fmt>.image/...) say; CACHE_AUTO when none. */
enum cache_format cache_format_of_labels(const cJSON *labels);

/* gkm's label cache.<fmt>.image/<key> (the triton one for CACHE_AUTO), NULL
 * when absent. */
const char *cache_env_label(const cJSON *labels, enum cache_format f, const char *key);

/* The bytes the image's files take once extracted, as its
 * cache.<fmt>.image/cache-size-bytes label says; 0 when it does not. */
unsigned long long cache_env_size_bytes(const cJSON *labels);

/* The identity label of gkm's format (cache.<fmt>.image/identity), NULL
 * when the labels have none. */
const char *cache_env_identity(const cJSON *labels);

/* The trees an image's config labels (may be NULL) declare: MCV's label
 * first, then the tree of gkm's format. Count written to out (<= cap). */
size_t cache_env_trees(const cJSON *labels, struct cache_env_tree *out, size_t cap);

/* "VAR=subpath,VAR=subpath" (the annotation's value) into buf; "" for n 0. */
void cache_env_format(const struct cache_env_tree *t, size_t n, char *buf, size_t len);

/* Read that form back (or one entry {name, subPath} of spec.runtimeEnv).
 * Entries with a name that is no variable name, or a subpath with "..",
 * are skipped. Count written to out (<= cap). */
size_t cache_env_parse(const char *text, struct cache_env_tree *out, size_t cap);
/* One tree from a variable name and a subpath; 0 when either is unusable. */
int cache_env_tree_set(struct cache_env_tree *t, const char *var, size_t varlen, const char *sub,
                       size_t sublen);

#endif
