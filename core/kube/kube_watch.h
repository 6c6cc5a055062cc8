/* Watches: list, then watch from the list's resourceVersion, on a thread of
 * its own, for as long as the watch lives.
 *
 * - The stream is parsed as it arrives (one JSON event per line), each line
 *   bounded (max_event_bytes): an oversized event is logged, counted and
 *   skipped, the stream goes on.
 * - A line that is not JSON, a stream cut in the middle of a line, or one
 *   that stalls in the middle of a line, is logged and the watch reconnects
 *   from the last resourceVersion it processed, so nothing is lost and
 *   nothing is applied twice out of order.
 * - Bookmarks (allowWatchBookmarks) advance the resourceVersion.
 * - 410 Gone, as an HTTP status or as an ERROR event carrying a 410 Status,
 *   means the resourceVersion was compacted away: list again.
 * - Failures back off exponentially with jitter (no busy loop when the server
 *   is down); a healthy stream resets the backoff. A watch never stops by
 *   itself: only kube_watch_stop() ends it.
 * - Events that parse but make no sense (no type, an object without a name,
 *   an unknown type) are logged, counted and skipped. */
#ifndef GKM_KUBE_WATCH_H
#define GKM_KUBE_WATCH_H

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kube_client.h"

enum kube_event_type {
	KUBE_ADDED,
	KUBE_MODIFIED,
	KUBE_DELETED,
	KUBE_BOOKMARK,
	KUBE_ERROR,
};
const char *kube_event_type_name(enum kube_event_type t);

/* ---- The stream parser (no I/O; used by the watch, testable alone). ---- */

struct kube_watch_parser {
	char *buf; /* the current incomplete line */
	size_t len, cap;
	size_t max_line;
	bool skipping;      /* inside an oversized line: drop until its newline */
	uint64_t oversized; /* lines dropped for size */
	uint64_t skipped;   /* JSON lines that were not usable events */
};

/* on_event gets the event's type and object (ownership passes to it) and
 * returns false to stop feeding. */
typedef bool (*kube_watch_event_fn)(enum kube_event_type type, cJSON *object, void *ud);

void kube_watch_parser_init(struct kube_watch_parser *p, size_t max_line);
void kube_watch_parser_reset(struct kube_watch_parser *p);
void kube_watch_parser_free(struct kube_watch_parser *p);
/* Feed bytes. 0: all consumed; 1: on_event asked to stop; -EBADMSG: a line
 * that is not a JSON event object (err says which and why). Events that are
 * JSON but wrong (no object, unknown type) are logged and skipped. */
__attribute__((warn_unused_result)) int kube_watch_parser_feed(struct kube_watch_parser *p,
                                                               const char *data, size_t len,
                                                               kube_watch_event_fn on_event,
                                                               void *ud, char *err, size_t errlen);

/* ---- The watch ---- */

struct kube_watch_handler {
	/* Every (re)list is streamed: each page's items (an array, owned by the
	 * callee) as they arrive, first set on the first page of every list
	 * attempt (start over: an attempt can fail half-way); then listed() with
	 * the resourceVersion once the list is complete. */
	void (*page)(cJSON *items, bool first, void *ud);
	void (*listed)(const char *rv, void *ud);
	/* ADDED / MODIFIED / DELETED with the object (owned by the callee). */
	void (*event)(enum kube_event_type type, cJSON *object, void *ud);
	void *ud;
};

struct kube_watch_opts {
	struct kube_resource resource;
	const char *ns;              /* NULL: all namespaces (or cluster-scoped) */
	const char *label_selector;  /* copied */
	const char *field_selector;  /* copied */
	unsigned timeout_s;          /* server-side watch timeout; default 300, jittered */
	size_t max_event_bytes;      /* default 4 MiB */
	unsigned backoff_initial_ms; /* default 500 */
	unsigned backoff_max_ms;     /* default 30000 */
	unsigned list_limit;         /* page size of the list; default 500 */
	unsigned stall_timeout_ms; /* part of an event and then silence: reconnect; default 30000 */
	const char *name;          /* for logs; default the resource plural */
};

/* Counters, readable at any time (relaxed). */
struct kube_watch_stats {
	_Atomic uint64_t lists;        /* complete lists (listed calls) */
	_Atomic uint64_t relists_gone; /* lists caused by 410 Gone */
	_Atomic uint64_t connects;     /* watch requests made */
	_Atomic uint64_t failures;     /* list or watch attempts that failed */
	_Atomic uint64_t events;       /* ADDED/MODIFIED/DELETED delivered */
	_Atomic uint64_t bookmarks;
	_Atomic uint64_t malformed; /* lines that were not JSON events */
	_Atomic uint64_t skipped;   /* events that parsed but were unusable */
	_Atomic uint64_t oversized; /* events over max_event_bytes */
};

struct kube_watch;

/* Start the list+watch thread. The handler runs on that thread. The client
 * must outlive the watch. Caller stops and frees it with kube_watch_stop(). */
__attribute__((warn_unused_result)) int kube_watch_start(struct kube_client *c,
                                                         const struct kube_watch_opts *o,
                                                         const struct kube_watch_handler *h,
                                                         struct kube_watch **out);
/* Stop (within about a second), join the thread, free. NULL is a no-op. */
void kube_watch_stop(struct kube_watch *w);
const struct kube_watch_stats *kube_watch_stats(const struct kube_watch *w);
/* The options the watch runs with (its own copies of the strings). */
const struct kube_watch_opts *kube_watch_options(const struct kube_watch *w);
/* True once the first list has been delivered. */
bool kube_watch_synced(const struct kube_watch *w);

#endif
