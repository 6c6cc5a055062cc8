/* Events about pod placements and refusals, recorded on the cache the pod
 * asked for: at admission a pod has no uid yet (and often no name), so an
 * Event cannot point at it; its cache can, and `kubectl describe gkmc`
 * shows them. Notes are gathered on the loop thread and written once per
 * interval, one Event per cache, reason and placement mode, naming the pods
 * (the first few) and how many there were; the writes run on a thread of
 * their own so a slow API server never delays an admission. */
#ifndef GKM_PLACEMENT_EVENTS_H
#define GKM_PLACEMENT_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "loop.h"
#include "metrics.h"
#include "objstore.h"

struct catalog_cache;
struct placement_events;

/* Events are written through store (not owned). Caller frees with
 * placement_events_free(). 0 or -errno. */
__attribute__((warn_unused_result)) int placement_events_new(struct loop *l, struct objstore *store,
                                                             uint64_t interval_ms,
                                                             struct placement_events **out);
/* After the loop stopped: notes not written yet are dropped (and logged);
 * writes under way finish. */
void placement_events_free(struct placement_events *pe);

/* The counter of Events (registered on first use; the webhook registers it
 * at start-up so that it is scraped with placement off too). */
struct metric *placement_events_metric(void);

/* Loop thread: pod (as "ns/name") was admitted or refused about cache c.
 * reason is the Event's reason, mode what is added ("required", ... or
 * "refused"), what the rest of the message ("with required node affinity
 * K=ready: ready on 2 of 3 nodes"). */
void placement_events_note(struct placement_events *pe, const struct catalog_cache *c, bool warning,
                           const char *reason, const char *mode, const char *pod, const char *what);

#endif
