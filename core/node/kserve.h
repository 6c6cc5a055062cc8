/* Kernel caches of KServe's local model storage (operator side, opt-in with
 * --kserve). A LocalModelCache (serving.kserve.io/v1alpha1, cluster-scoped)
 * that asks for a kernel cache, with the annotation gkm.io/kernel-cache-image
 * or spec.kernelCache.image, gets a ClusterGKMCache kserve-<name>: the image,
 * and spec.localModel naming the LocalModelCache and, for each of its
 * nodeGroups, the node group's local storage path (its PersistentVolume
 * spec's local.path or hostPath.path) and node affinity. gkm then verifies
 * and checks it like any ClusterGKMCache; the agents of the node groups'
 * nodes only pull it and place the extracted tree in
 * <path>/kernel-caches/<LocalModelCache name>/.
 *
 * The ClusterGKMCache is owned by the LocalModelCache (ownerReferences) and
 * removed with it or with its kernel cache image. KServe's objects are read,
 * never written: what goes wrong (a node group that does not exist, one
 * without a local path, a ClusterGKMCache of that name that gkm did not make
 * for it) is said in Warning Events on the LocalModelCache, and so are the
 * changes of the ClusterGKMCache's conditions (kserve_owner()).
 * Loop thread; API calls run as worker jobs. */
#ifndef GKM_KSERVE_H
#define GKM_KSERVE_H

#include <cjson/cJSON.h>

#include "objstore.h"
#include "workers.h"

#define KSERVE_API_VERSION "serving.kserve.io/v1alpha1"
#define KSERVE_IMAGE_ANNOTATION "gkm.io/kernel-cache-image"
#define KSERVE_CACHE_LABEL "gkm.io/local-model-cache"

struct kserve;

/* Starts the watch of LocalModelCaches. */
int kserve_new(struct workers *w, struct objstore *os, const char *manager, struct kserve **out);
void kserve_free(struct kserve *k);
/* Read every LocalModelCache's node groups again and apply what changed. */
void kserve_resync(struct kserve *k);

/* The LocalModelCache a ClusterGKMCache was made for, as an object to record
 * Events on (apiVersion, kind, metadata.name, metadata.uid), or NULL.
 * Caller frees. */
cJSON *kserve_owner(const cJSON *cache);

#endif
