/* Leader election on a coordination.k8s.io/v1 Lease, the way Kubernetes
 * controllers do it:
 *
 * - Acquire: create the Lease, or take it over when its holder has not
 *   renewed it for leaseDurationSeconds, judged by our own monotonic clock
 *   from the moment we last saw the record change (no trust in clock sync
 *   between machines). Every write carries the resourceVersion it read, so
 *   two contenders never both win (the loser gets 409).
 * - Renew every retry period while leading.
 * - Step down when no renewal succeeded for renew_deadline (shorter than the
 *   lease duration, so we stop before anyone else may start), or as soon as
 *   another holder is seen.
 * - Release on stop: holderIdentity cleared, so a successor need not wait
 *   for the lease to expire.
 *
 * Runs on a thread of its own; the callbacks run on that thread (post to
 * the loop from them). */
#ifndef GKM_KUBE_LEASE_H
#define GKM_KUBE_LEASE_H

#include <stdbool.h>
#include <stddef.h>

#include "kube_client.h"

struct kube_lease_opts {
	const char *ns;               /* Lease namespace (required) */
	const char *name;             /* Lease name (required) */
	const char *identity;         /* this process (required; usually the pod name) */
	unsigned lease_duration_ms;   /* default 15000 */
	unsigned renew_deadline_ms;   /* default 10000; must be < lease_duration_ms */
	unsigned retry_period_ms;     /* default 2000; must be < renew_deadline_ms */
	bool keep_on_stop;            /* do not release on stop (default: release) */
	void (*on_started)(void *ud); /* became the leader */
	void (*on_stopped)(void *ud); /* no longer the leader */
	void (*on_new_leader)(const char *identity, void *ud); /* observed holder changed */
	void *ud;
};

struct kube_lease;

/* 0, -EINVAL (missing or inconsistent options), -ENOMEM. Strings are copied.
 * Caller stops it with kube_lease_stop(). */
__attribute__((warn_unused_result)) int
kube_lease_start(struct kube_client *c, const struct kube_lease_opts *o, struct kube_lease **out);
/* Stop campaigning; release the Lease if we hold it (unless keep_on_stop);
 * on_stopped runs first if we were leading. Joins the thread, frees. */
void kube_lease_stop(struct kube_lease *l);
bool kube_lease_is_leader(const struct kube_lease *l);

/* "2026-11-21T10:00:05.000000Z" (metav1.MicroTime) for now. buf >= 32. */
void kube_lease_microtime(char *buf, size_t len);

#endif
