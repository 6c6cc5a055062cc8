/* Keeping a daemon's policies current: a directory polled from the loop
 * (a mounted ConfigMap, or `gkm up --policy-dir`), or ConfigMap data handed
 * over by a watch. Either way the bundle goes through engine_slot_load():
 * a valid change is swapped in whole, a broken one is refused, logged,
 * counted, recorded, and the last good engine keeps answering. */
#ifndef GKM_POLICY_WATCH_H
#define GKM_POLICY_WATCH_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "engine.h"
#include "loop.h"

struct policy_watch;

/* Called on the loop thread after every load attempt that changed
 * something: applied (new generation) or refused (error says why). */
typedef void (*policy_watch_fn)(void *ud, bool applied, const char *error);

/* Poll dir every poll_ms (NULL dir: the built-in policies, loaded once).
 * The first load happens here: a broken bundle at start-up is an error
 * (-EINVAL, message in err), as the design asks. status_file (may be NULL)
 * gets {generation, digest, lastError, updated} after every change. */
__attribute__((warn_unused_result)) int
policy_watch_start(struct loop *l, struct engine_slot *slot, const char *dir, unsigned poll_ms,
                   const char *status_file, policy_watch_fn fn, void *ud, struct policy_watch **out,
                   char *err, size_t errlen);
/* Load ConfigMap data (name -> source) now, the same way. */
void policy_watch_load_map(struct policy_watch *w, const cJSON *data);
void policy_watch_stop(struct policy_watch *w);

#endif
