/* The environment a container needs to read a cache it mounts: one
 * variable per tree the image holds, pointing at that tree under the
 * container's mountPath (TRITON_CACHE_DIR=<mountPath>/io.triton.cache).
 * Pure functions, no I/O.
 *
 * Variables: Triton reads TRITON_CACHE_DIR, vLLM VLLM_CACHE_ROOT, torch
 * inductor TORCHINDUCTOR_CACHE_DIR. A container that already sets one to
 * another value keeps it; the conflict is reported, never overwritten. */
#ifndef GKM_POD_ENV_H
#define GKM_POD_ENV_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* MCV's image labels: "VAR=/path/in/its/image" and the tree's path in the
 * image (relative, what a volume mount of the image should select). */
#define POD_ENV_LABEL_ROOT_ENV "io.kserve.km/cache-root-env"
#define POD_ENV_LABEL_SUBPATH "io.kserve.km/cache-mount-subpath"
#define POD_ENV_TREES_MAX 4

struct pod_env_tree {
	char variable[64]; /* TRITON_CACHE_DIR */
	char subpath[256]; /* under the mount: "io.triton.cache", "" for its root */
};

/* A cache volume of the pod and the trees its image holds. */
struct pod_env_volume {
	const char *volume; /* spec.volumes[].name */
	const struct pod_env_tree *trees;
	size_t n;
};

/* The trees an image holds, from its config labels (NULL: none) and gkm's
 * format name ("triton", "vllm"; NULL or "" when unknown): MCV's labels
 * first, then the format's own tree. Count written to out (<= cap). */
size_t pod_env_trees(const cJSON *labels, const char *format, struct pod_env_tree *out, size_t cap);

/* Append to ops (a JSON array) the operations that give every container
 * and init container of pod (a Pod object) mounting one of vols the
 * variables of its trees. Conflicts (a variable the container already sets
 * to another value) are written, "; "-separated, to warn (may be empty).
 * 0, or -ENOMEM. */
__attribute__((warn_unused_result)) int pod_env_patch(const cJSON *pod,
                                                      const struct pod_env_volume *vols, size_t n,
                                                      cJSON *ops, char *warn, size_t warnlen);

#endif
