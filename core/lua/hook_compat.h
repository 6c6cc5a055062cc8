/* The compat policy hook (policies/compat.lua): which GPUs of a node can run
 * a cache.
 *
 * Contract (the full text is at the top of policies/compat.lua):
 *   input  {"cache": {"name": "ns/name", "targets": [{"backend": "cuda"|"hip",
 *             "arch": 75|"sm_90a"|"gfx90a:xnack-", "warp_size": 32,
 *             "ptx_version"?: 84, "cuda_version"?: "12.9"}, ...]},
 *           "gpus": <the "gpus" array of the GPU inventory, core/gpu/gpu_probe.h>}
 *   output {"gpus": [{"index": 0, "compatible": true|false,
 *             "reason": "Compatible"|"ArchitectureMismatch"|..., "message": "..."}]}
 * The validator registered with the hook checks the whole output: an array of
 * at most COMPAT_MAX_VERDICTS verdicts, integer indices without duplicates, a
 * boolean compatible, and for every refusal a CamelCase reason and a message
 * of at most 1024 bytes. Anything else is a policy error (ENGINE_BAD_RETURN).
 * gkm.agent (lua/gkm/agent.lua) groups the verdicts into node status id sets. */
#ifndef GKM_HOOK_COMPAT_H
#define GKM_HOOK_COMPAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#define COMPAT_MAX_VERDICTS 1024

/* The hook's validator (also reachable as engine_hook_find("compat")->validate). */
int compat_hook_validate(const cJSON *result, char *err, size_t errlen);

#endif
