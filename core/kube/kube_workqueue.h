/* The controller work queue: keys ("namespace/name") waiting to be
 * reconciled.
 *
 * - De-duplicating: a key queued twice is reconciled once; a key added while
 *   it is being processed is queued again when processing ends (never
 *   processed twice at the same time).
 * - Delayed adds (requeue_after, debounce): the earliest deadline of a key
 *   wins.
 * - Rate-limited requeue: each failure of a key doubles its delay (base to
 *   max); forget() resets it after a success.
 * - Bounded concurrency: get() hands out at most max_in_flight keys that are
 *   not done yet.
 *
 * Single-threaded (the loop thread) and driven by the caller's clock (now_ms
 * arguments), so it needs no locks and tests need no sleeps. */
#ifndef GKM_KUBE_WORKQUEUE_H
#define GKM_KUBE_WORKQUEUE_H

#include <stddef.h>
#include <stdint.h>

struct kube_workqueue_opts {
	unsigned max_in_flight; /* default 4 */
	unsigned base_delay_ms; /* first retry delay; default 100 */
	unsigned max_delay_ms;  /* cap; default 300000 (5 min) */
};

struct kube_workqueue;

__attribute__((warn_unused_result)) int kube_workqueue_new(const struct kube_workqueue_opts *o,
                                                           struct kube_workqueue **out);
void kube_workqueue_free(struct kube_workqueue *q);

/* 0 or -ENOMEM; -EINVAL for an empty or over-long (> 512) key. */
int kube_workqueue_add(struct kube_workqueue *q, const char *key);
int kube_workqueue_add_after(struct kube_workqueue *q, const char *key, uint64_t delay_ms,
                             uint64_t now_ms);
/* Requeue after the key's backoff (base * 2^failures, capped); counts a failure. */
int kube_workqueue_add_rate_limited(struct kube_workqueue *q, const char *key, uint64_t now_ms);
/* Like add_rate_limited but waits at least min_delay_ms (a server's Retry-After). */
int kube_workqueue_add_rate_limited_min(struct kube_workqueue *q, const char *key,
                                        uint64_t min_delay_ms, uint64_t now_ms);
/* Stop tracking the key's failures (after a success). */
void kube_workqueue_forget(struct kube_workqueue *q, const char *key);
unsigned kube_workqueue_failures(struct kube_workqueue *q, const char *key);

/* Move due delayed keys to the ready queue, then hand out the next ready key
 * (borrowed: valid until kube_workqueue_done() for it), or NULL when none is
 * ready or max_in_flight keys are out. */
const char *kube_workqueue_get(struct kube_workqueue *q, uint64_t now_ms);
/* Processing of key (as returned by get) ended. */
void kube_workqueue_done(struct kube_workqueue *q, const char *key);

/* Earliest deadline of a delayed key (UINT64_MAX when none): when to call
 * get() again. */
uint64_t kube_workqueue_next_due(struct kube_workqueue *q);
size_t kube_workqueue_ready(const struct kube_workqueue *q);
size_t kube_workqueue_delayed(const struct kube_workqueue *q);
size_t kube_workqueue_in_flight(const struct kube_workqueue *q);

#endif
