/* What a kernel cache was built for: the "targets" list the compat policy
 * reads (see core/lua/hook_compat.h).
 *
 * Sources, in the order the agent should try them:
 *   1. image config labels cache.triton.image/summary or cache.vllm.image/summary
 *      ({"targets": [{"backend", "arch", "warp_size", "ptx_version"?, "cuda_version"?}]})
 *   2. in an extracted cache: the MCV manifest (io.triton.manifest/manifest.json,
 *      io.vllm.manifest/manifest.json), else the Triton kernel JSON files
 *      (<hash>/<kernel>.json with "target" and "ptx_version", at any depth,
 *      so vLLM's triton_cache dirs count too) and vLLM binary caches'
 *      cache_key_factors.json (backend and CUDA version, no arch).
 * Targets are passed on as found (types are the policy's to judge), minus
 * duplicates. A cache whose metadata has no arch still yields its target:
 * the policy answers UnknownTarget for it rather than guessing. */
#ifndef GKM_COMPAT_TARGETS_H
#define GKM_COMPAT_TARGETS_H

#include <cjson/cJSON.h>
#include <stddef.h>

#define COMPAT_TARGETS_MAX 4096           /* distinct targets of one cache */
#define COMPAT_TARGETS_MAX_JSON (1 << 20) /* bytes of one label or JSON file */
#define COMPAT_TARGETS_MAX_FILES 200000   /* directory entries visited */
#define COMPAT_TARGETS_MAX_DEPTH 16

/* From the image config's labels (an object of string values). On success
 * *out is a JSON array (caller frees with cJSON_Delete). -ENOENT: no summary
 * label; -EINVAL: the label is not a JSON object with a "targets" array
 * (err says which label and why); -E2BIG: more than COMPAT_TARGETS_MAX. */
__attribute__((warn_unused_result)) int compat_targets_from_labels(const cJSON *labels, cJSON **out,
                                                                   char *err, size_t errlen);

/* From an extracted cache directory. Symbolic links are not followed.
 * -ENOENT: no target metadata anywhere; -E2BIG: over one of the bounds
 * above; other -errno: the directory could not be read. */
__attribute__((warn_unused_result)) int compat_targets_from_dir(const char *dir, cJSON **out,
                                                                char *err, size_t errlen);

#endif
