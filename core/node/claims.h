/* The operator's claims (cache_claim.h): for each cache with spec.claim,
 * the PersistentVolume and PersistentVolumeClaim applied when the claim
 * changes, again when the volume was edited or deleted by hand (a watch of
 * the volumes labelled gkm.io/claim) and at every resync, removed with the
 * cache or its spec.claim; volumes whose cache is gone are removed once
 * every cache was seen. The outcome is the cache's Claim condition.
 * Loop thread; the API calls run as worker jobs. */
#ifndef GKM_CLAIMS_H
#define GKM_CLAIMS_H

#include <cjson/cJSON.h>

#include "loop.h"
#include "objstore.h"
#include "workers.h"

struct claims;

/* changed(key) asks for the cache's status to be aggregated again (its
 * Claim condition changed). Starts the watch of the volumes. */
int claims_new(struct workers *w, struct objstore *os, const char *manager,
               void (*changed)(const char *key, void *ud), void *ud, struct claims **out);
void claims_free(struct claims *cl);

/* The cache (key as the operator keys it) as it is now: apply or remove its
 * claim as needed, and add its Claim condition to status.conditions (none
 * without spec.claim); old is the stored status. */
void claims_sync(struct claims *cl, const char *key, const cJSON *cache, const cJSON *old,
                 cJSON *status);
void claims_cache_deleted(struct claims *cl, const char *key);
/* Apply every claim again at the next sync (hand edits of the claim). */
void claims_resync(struct claims *cl);
/* Every cache has been synced once: volumes of caches not seen are orphans. */
void claims_caches_known(struct claims *cl);

#endif
