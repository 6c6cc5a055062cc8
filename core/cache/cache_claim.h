/* A claim per cache: a GKMCache or ClusterGKMCache with spec.claim gets a
 * PersistentVolume of the gkm CSI driver (static provisioning) and a
 * PersistentVolumeClaim bound to it, so that a pod that only names the claim
 * mounts the cache, with the same checks as an inline volume.
 *
 *   PersistentVolume gkm-<cache uid>: ReadOnlyMany, storageClassName "",
 *     Retain, csi {driver csi.gkm.io, volumeHandle = its name,
 *     volumeAttributes cacheName, cacheNamespace (GKMCache), readOnly,
 *     onMiss}, claimRef to the claim; label gkm.io/claim, annotations naming
 *     the cache (gkm.io/cache-namespace, -name, -uid); with
 *     spec.claim.placement, node affinity on the cache's Node label
 *     (cache_label.h): the scheduler and the kubelet use it only where the
 *     cache is Ready.
 *   PersistentVolumeClaim spec.claim.name (default: the cache's name) in the
 *     cache's namespace (ClusterGKMCache: spec.claim.namespace), volumeName
 *     the PV, owned by the cache (ownerReferences).
 *
 * Both are server-side applied by the operator's field manager; a claim of
 * that name that the cache does not own is left untouched (-EEXIST). The PV
 * is cluster-scoped and cannot be owned by a namespaced cache: the operator
 * removes it with the claim (Kubernetes' pvc- and pv-protection keep both
 * while a pod uses them). */
#ifndef GKM_CACHE_CLAIM_H
#define GKM_CACHE_CLAIM_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "objstore.h"

#define CACHE_CLAIM_LABEL "gkm.io/claim"

struct cache_claim {
	char pvc_ns[64], pvc_name[254], pv_name[80], uid[64];
	cJSON *pvc, *pv; /* what to apply (owned) */
};

/* What cache asks for: 0 with the objects set; -ENOENT when it has no
 * spec.claim; -EINVAL with err when spec.claim cannot be used. */
int cache_claim_plan(const cJSON *cache, struct cache_claim *out, char *err, size_t errlen);
void cache_claim_clear(struct cache_claim *c);

/* Worker threads. Apply the claim, then the volume bound to it (with the
 * claim's uid). -EEXIST: a claim of that name not owned by the cache is
 * there (left as it is); other errors from the API server, in err. */
int cache_claim_apply(struct objstore *os, const char *manager, struct cache_claim *c, char *err,
                      size_t errlen);
/* Delete the claim when the cache (uid) owns it, and the volume (pv_name
 * "": none). 0 also when they are gone already. */
int cache_claim_remove(struct objstore *os, const char *pvc_ns, const char *pvc_name,
                       const char *pv_name, const char *uid, char *err, size_t errlen);

/* Does the stored volume live say all that want says (what the API server
 * or the binder adds aside)? False after a hand edit of what gkm set. */
bool cache_claim_pv_matches(const cJSON *want, const cJSON *live);

#endif
