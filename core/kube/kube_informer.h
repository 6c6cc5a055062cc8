/* Informer: a cache of the objects of one watch (kube_watch.h), keyed by
 * "namespace/name" ("name" for cluster-scoped kinds), kept current by a
 * list+watch thread and read on the owner's thread without locks.
 *
 * The watch thread only queues deltas; the owner applies them with
 * kube_informer_drain(), which updates the cache and reports each change.
 * With a loop (opts.loop) the informer posts its own drains to the loop
 * thread, so the cache and on_change live entirely on the loop thread.
 * Without one, opts.notify says when deltas are pending (tests, tools).
 *
 * After a relist (first list, 410 Gone) the cache is replaced: objects that
 * vanished are reported DELETED, changed ones MODIFIED (by resourceVersion),
 * new ones ADDED; unchanged objects are not reported again. Lists are
 * applied page by page as they arrive (a big list is never held whole);
 * the objects gone are reported once the list is complete.
 *
 * Objects are kept as compact JSON text (about a sixth of the memory of a
 * parsed tree), serialised on the watch thread; readers parse what they
 * read. metadata.managedFields is dropped unless keep_managed_fields is set:
 * controllers do not need it and it is often a third of an object. */
#ifndef GKM_KUBE_INFORMER_H
#define GKM_KUBE_INFORMER_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "kube_watch.h"
#include "loop.h"

struct kube_informer;

/* obj: the object as it is now (for DELETED, the last state known), borrowed
 * for the duration of the call. */
typedef void (*kube_informer_change_fn)(struct kube_informer *inf, enum kube_event_type type,
                                        const cJSON *obj, void *ud);

struct kube_informer_opts {
	struct kube_watch_opts watch;
	bool keep_managed_fields;
	/* For a consumer that keeps its own state of what on_change reports:
	 * the cache holds keys and resourceVersions only (get, get_text and
	 * foreach see no objects), and a DELETED found by a relist carries only
	 * apiVersion, kind and metadata.name/namespace. */
	bool no_cache;
	struct loop *loop; /* drains posted to this loop, or NULL */
	void (*notify)(struct kube_informer *inf, void *ud); /* without a loop: watch thread */
	kube_informer_change_fn on_change;                   /* may be NULL */
	/* Once, on the owner thread, after the first complete list was applied
	 * (also when it was empty). May be NULL. */
	void (*on_synced)(struct kube_informer *inf, void *ud);
	void *ud;
};

/* Start listing and watching. Caller stops it with kube_informer_stop(). */
__attribute__((warn_unused_result)) int kube_informer_start(struct kube_client *c,
                                                            const struct kube_informer_opts *o,
                                                            struct kube_informer **out);
/* Stop the watch thread and release the cache. Owner thread. NULL: no-op. */
void kube_informer_stop(struct kube_informer *inf);

/* Apply the pending deltas (owner thread). Returns how many were applied. */
size_t kube_informer_drain(struct kube_informer *inf);

/* Owner thread. A parsed copy of the cached object (caller frees with
 * cJSON_Delete), or NULL when absent. ns is ignored for cluster-scoped kinds. */
cJSON *kube_informer_get(const struct kube_informer *inf, const char *ns, const char *name);
/* The cached JSON text (borrowed until the next drain), or NULL. */
const char *kube_informer_get_text(const struct kube_informer *inf, const char *ns,
                                   const char *name, size_t *len);
size_t kube_informer_len(const struct kube_informer *inf);
/* Every cached object as JSON text, in no particular order (json NULL and
 * len 0 with no_cache). */
void kube_informer_foreach(const struct kube_informer *inf,
                           void (*fn)(const char *key, const char *json, size_t len, void *ud),
                           void *ud);
/* True once a complete list has been drained into the cache. */
bool kube_informer_synced(const struct kube_informer *inf);
/* The watch's options (its own copies of the strings); NULL once stopped. */
const struct kube_watch_opts *kube_informer_watch_opts(const struct kube_informer *inf);
const struct kube_watch_stats *kube_informer_stats(const struct kube_informer *inf);

/* The cache key of an object: "ns/name" or "name". 0 or -EINVAL (no name),
 * -ENAMETOOLONG. */
__attribute__((warn_unused_result)) int kube_informer_key(const cJSON *obj, char *buf, size_t len);

#endif
