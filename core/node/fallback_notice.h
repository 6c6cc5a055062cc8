/* Events for fallback volumes. The CSI plugin publishes a volume that asks
 * for onMiss "empty" as an empty directory when its cache is not usable on
 * the node, and records that, with why, in the cache's usage file
 * (cache_view.h). The plugin never calls the Kubernetes API; the agent,
 * which reads the usage files anyway, tells the pod: a Warning Event with
 * reason CacheFallback on the Pod named in the usage entry, once per volume
 * and run of the agent.
 *
 * Loop thread only; the Events are recorded from worker threads. */
#ifndef GKM_FALLBACK_NOTICE_H
#define GKM_FALLBACK_NOTICE_H

#include <cjson/cJSON.h>

#include "cache_view.h"
#include "objstore.h"
#include "workers.h"

#define FALLBACK_NOTICE_REASON "CacheFallback"

struct fallback_notice;

/* w and os are borrowed and must outlive the notice's jobs (workers_free
 * waits for them). Caller frees with fallback_notice_free(). */
__attribute__((warn_unused_result)) int fallback_notice_new(struct workers *w, struct objstore *os,
                                                            struct fallback_notice **out);
void fallback_notice_free(struct fallback_notice *fn);

/* The usage of cache cache_key ("<scope>/<name>") was read: an Event for each
 * fallback volume in u not told yet; volumes no longer in u (NULL: none) are
 * forgotten. */
void fallback_notice_usage(struct fallback_notice *fn, const char *cache_key,
                           const struct cache_view_usage *u);

/* Every usage file under run_dir, also of caches the agent does not know
 * (a pod may ask for one that does not exist): fallback_notice_usage() for
 * each, and the caches without a file are forgotten. */
void fallback_notice_scan(struct fallback_notice *fn, const char *run_dir);

/* A Warning Event with reason and msg on the Pod ns/name (uid), from a
 * worker thread; best effort (nothing when the pod is not named). */
void fallback_notice_pod_event(struct fallback_notice *fn, const char *name, const char *ns,
                               const char *uid, const char *reason, const char *msg);

/* The Event of one fallback entry: the Pod it is about (apiVersion, kind,
 * metadata name, namespace, uid) into *regarding, and the message into msg.
 * Caller frees *regarding. -EINVAL for an entry that is no fallback or
 * names no pod, -ENOMEM. */
__attribute__((warn_unused_result)) int
fallback_notice_event(const struct cache_view_pod *p, cJSON **regarding, char *msg, size_t msglen);

#endif
