/* Which of the node agent's registry jobs runs next.
 *
 * A job (an image configuration fetch, a pull) waits here without holding a
 * slot or a thread; it starts when its lane has a free slot, and the slots
 * are shared fairly between registry hosts, so that a registry that is dead
 * or slow delays only the caches that use it:
 * - hosts take turns: of the hosts with a job that may start, the one that
 *   has fewest jobs running in the lane goes first, then the one served
 *   least recently;
 * - a host that has not answered yet may hold all slots of a lane but one
 *   (so a host that hangs leaves a slot to the others), one that answered
 *   may hold them all;
 * - a host that could not be reached holds at most one slot, and none before
 *   its backoff ends; the first job that reaches it ends the backoff.
 * Waiting for a host's backoff holds nothing: a retry never sleeps in a slot.
 *
 * Loop thread only; the caller's clock (now_ms arguments), no locks. */
#ifndef GKM_PULL_SCHED_H
#define GKM_PULL_SCHED_H

#include <stdbool.h>
#include <stdint.h>

enum pull_sched_lane { PULL_SCHED_FETCH = 0, PULL_SCHED_PULL, PULL_SCHED_LANES };

struct pull_sched;
struct pull_sched_host;

/* One job, embedded in the caller's object: zero it before first use. The
 * scheduler owns next and host while the job is queued or running. */
struct pull_sched_job {
	struct pull_sched_job *next;
	struct pull_sched_host *host;
	enum pull_sched_lane lane;
	bool queued, running;
};

/* How a running job ended, for its host. */
enum pull_sched_outcome {
	PULL_SCHED_OK,          /* the host answered (whatever the job's result) */
	PULL_SCHED_UNREACHABLE, /* could not connect, no answer, or overloaded (429) */
};

/* slots[lane]: jobs that may run at once in each lane (0 is taken as 1).
 * Caller frees with pull_sched_free() (after every job left). */
__attribute__((warn_unused_result)) int pull_sched_new(const unsigned slots[PULL_SCHED_LANES],
                                                       struct pull_sched **out);
void pull_sched_free(struct pull_sched *s);

/* Queue j (not queued or running) in lane for the registry host host
 * ("quay.io", "127.0.0.1:5000"). 0, or -ENOMEM. */
__attribute__((warn_unused_result)) int pull_sched_queue(struct pull_sched *s,
                                                         struct pull_sched_job *j, const char *host,
                                                         enum pull_sched_lane lane);
/* Take j out of its queue (no-op when not queued). A running job cannot be
 * cancelled: end it with pull_sched_done(). */
void pull_sched_cancel(struct pull_sched *s, struct pull_sched_job *j);

/* The next job of lane that may start now, marked running (NULL: none). A
 * job for which may_start(j, ud) says false is skipped and stays queued. */
struct pull_sched_job *pull_sched_next(struct pull_sched *s, enum pull_sched_lane lane,
                                       uint64_t now_ms,
                                       bool (*may_start)(struct pull_sched_job *j, void *ud),
                                       void *ud);
/* A running job ended. UNREACHABLE starts or extends its host's backoff
 * (1 s doubling to 5 min, jittered); OK ends it. */
void pull_sched_done(struct pull_sched *s, struct pull_sched_job *j,
                     enum pull_sched_outcome outcome, uint64_t now_ms);

/* When host h (a job's host: queued, running, or last run) may be tried
 * again: 0 when it is not backing off. For reporting and for arming timers. */
uint64_t pull_sched_host_retry_at(const struct pull_sched_host *h);
/* The earliest end of a backoff of a host with queued jobs (UINT64_MAX: none). */
uint64_t pull_sched_next_due(const struct pull_sched *s);

#endif
