/* Captures: the kernels a command (a warm-up script) or a pod compiled,
 * turned into a cache image. Everything a capture reads was written by
 * code gkm does not trust, so it is walked with untrusted rules (see
 * struct cache_walk_rules), capped, and checked against the GPUs it was
 * compiled on before anything is pushed. A captured image is a candidate:
 * nothing mounts it until a trusted key signs it (gkm cache promote).
 *
 * The workspace gives the command a cache directory:
 *   - alone: an empty directory; everything in it is new;
 *   - on a base cache (an extracted image): an overlay mount of the base
 *     with a private upper layer (as root), where the upper layer is exactly
 *     what the command added, or else a copy of the base, where the added
 *     files are those that differ from the base;
 *   - for files added elsewhere (the upper layers of pods' writable
 *     volumes): no command runs, the workspace is a view of them over the
 *     base. */
#ifndef GKM_CACHE_CAPTURE_H
#define GKM_CACHE_CAPTURE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

#include "cache_image.h"
#include "oci_err.h"

#define CACHE_CAPTURE_MAX_FILES 200000ull    /* files and directories */
#define CACHE_CAPTURE_MAX_BYTES (8ull << 30) /* file bytes */
#define CACHE_CAPTURE_LISTED 32              /* added files listed with their digests */

/* Untrusted rules with the default caps. */
void cache_capture_rules_default(struct cache_walk_rules *r);

struct cache_capture_ws {
	char root[PATH_MAX];  /* the workspace, removed by close */
	char cache[PATH_MAX]; /* the directory the command writes */
	char added[PATH_MAX]; /* where what it added is: the upper layer, or cache */
	char lower[PATH_MAX]; /* the base's cache directory, "" without a base */
	bool mounted;         /* cache is an overlay mount */
};

/* Make the workspace under root (a directory that exists), on the base
 * cache directory lower (NULL: none). overlay false: copy even as root.
 * top (NULL: none) is what was added already, written elsewhere (a pod's
 * overlay upper layer, already checked with untrusted rules): then cache is
 * a read-only view of top over lower (a read-only overlay of the two as
 * root, else both copied, a file of top that differs from lower's being a
 * conflict), and added is top. */
__attribute__((warn_unused_result)) int cache_capture_ws_open(const char *root, const char *lower,
                                                              const char *top, bool overlay,
                                                              struct cache_capture_ws *ws,
                                                              struct oci_err *err);
/* Unmount and remove the workspace. 0 or -errno (the path is then logged). */
int cache_capture_ws_close(struct cache_capture_ws *ws);

/* Check that each captured target runs on at least one of gpus (the
 * "gpus" array of a GPU inventory, core/gpu/gpu_probe.h) by the compat policy
 * of policy_dir (NULL: the built-in policies), so a capture never carries
 * kernels for a GPU that did not compile them. 0; -EPERM with err naming the
 * target and the policy's reasons; -EINVAL when the policy cannot run. */
__attribute__((warn_unused_result)) int cache_capture_check_targets(const cJSON *targets,
                                                                    const cJSON *gpus,
                                                                    const char *policy_dir,
                                                                    struct oci_err *err);

#endif
