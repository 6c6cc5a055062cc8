/* Kernel caches in KServe's local model storage (agent side): whether a
 * ClusterGKMCache made for a LocalModelCache (spec.localModel, see kserve.h)
 * is for this node, and a copy of its extracted tree in the node group's
 * storage, <path>/kernel-caches/<LocalModelCache name>/, next to KServe's
 * models, so the InferenceService's existing claim shows it.
 *
 * The copy is made beside the target and renamed into place (a reader sees
 * the old tree or the new one), read-only (0444 files, 0555 directories),
 * and only below a real directory: a storage path that is, or passes
 * through, a symlink is refused, and so is a kernel-caches that is one. */
#ifndef GKM_LOCAL_MODEL_H
#define GKM_LOCAL_MODEL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

/* For a cache object with spec.localModel: the storage path of the first
 * node group whose node affinity (nodeSelectorTerms: matchExpressions on
 * the Node's labels, matchFields on metadata.name; none: every node)
 * selects this node, copied into path (size >= 4096), and true; false when
 * no group does. labels NULL (the Node not read yet): false. */
bool local_model_here(const cJSON *cache, const char *node, const cJSON *labels, char *path,
                      size_t size);
/* The LocalModelCache name of a cache object ("" without spec.localModel). */
const char *local_model_name(const cJSON *cache);

/* Copy the tree of directory fd src to <path>/kernel-caches/<name>,
 * replacing what is there. 0, or -errno with err. */
int local_model_place(const char *path, const char *name, int src, char *err, size_t errlen);
/* Remove <path>/kernel-caches/<name>; 0 also when it is not there. */
int local_model_remove(const char *path, const char *name, char *err, size_t errlen);

#endif
