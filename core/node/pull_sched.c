#include "pull_sched.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"

#define HOST_BACKOFF_MS 1000
#define HOST_BACKOFF_MAX_MS 300000

struct pull_sched_host {
	struct pull_sched_host *next;
	struct pull_sched_job *head[PULL_SCHED_LANES], **tail[PULL_SCHED_LANES]; /* FIFO */
	unsigned running[PULL_SCHED_LANES];
	uint64_t served[PULL_SCHED_LANES]; /* turn of its last start, per lane */
	unsigned failures;                 /* unreachable in a row */
	uint64_t retry_at;                 /* backing off until then (0: not) */
	bool answered;                     /* some job reached it */
	char name[];
};

struct pull_sched {
	struct pull_sched_host *hosts; /* kept until pull_sched_free: a node reads few registries */
	unsigned slots[PULL_SCHED_LANES], running[PULL_SCHED_LANES];
	uint64_t turn; /* starts so far, for the hosts' turns */
	uint64_t seed; /* backoff jitter */
};

int pull_sched_new(const unsigned slots[PULL_SCHED_LANES], struct pull_sched **out)
{
	struct pull_sched *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (int l = 0; l < PULL_SCHED_LANES; l++)
		s->slots[l] = slots[l] ? slots[l] : 1;
	*out = s;
	return 0;
}

void pull_sched_free(struct pull_sched *s)
{
	if (!s)
		return;
	while (s->hosts) {
		struct pull_sched_host *h = s->hosts;
		s->hosts = h->next;
		free(h);
	}
	free(s);
}

static struct pull_sched_host *host_get(struct pull_sched *s, const char *name)
{
	for (struct pull_sched_host *h = s->hosts; h; h = h->next)
		if (!strcmp(h->name, name))
			return h;
	size_t n = strlen(name);
	struct pull_sched_host *h = calloc(1, sizeof(*h) + n + 1);
	if (!h)
		return NULL;
	memcpy(h->name, name, n + 1);
	for (int l = 0; l < PULL_SCHED_LANES; l++)
		h->tail[l] = &h->head[l];
	h->next = s->hosts;
	s->hosts = h;
	return h;
}

int pull_sched_queue(struct pull_sched *s, struct pull_sched_job *j, const char *host,
                     enum pull_sched_lane lane)
{
	struct pull_sched_host *h = host_get(s, host);
	if (!h)
		return -ENOMEM;
	j->host = h;
	j->lane = lane;
	j->next = NULL;
	j->queued = true;
	*h->tail[lane] = j;
	h->tail[lane] = &j->next;
	return 0;
}

static void unlink_job(struct pull_sched_host *h, struct pull_sched_job *j)
{
	enum pull_sched_lane l = j->lane;
	for (struct pull_sched_job **p = &h->head[l]; *p; p = &(*p)->next) {
		if (*p == j) {
			*p = j->next;
			if (h->tail[l] == &j->next)
				h->tail[l] = p;
			break;
		}
	}
	j->next = NULL;
	j->queued = false;
}

void pull_sched_cancel(struct pull_sched *s, struct pull_sched_job *j)
{
	(void)s;
	if (j->queued)
		unlink_job(j->host, j);
}

/* Slots of a lane a host may hold now. */
static unsigned host_cap(const struct pull_sched *s, const struct pull_sched_host *h,
                         enum pull_sched_lane l)
{
	if (h->failures)
		return 1;
	if (h->answered || s->slots[l] == 1)
		return s->slots[l];
	return s->slots[l] - 1;
}

struct pull_sched_job *pull_sched_next(struct pull_sched *s, enum pull_sched_lane l, uint64_t now,
                                       bool (*may_start)(struct pull_sched_job *, void *), void *ud)
{
	if (s->running[l] >= s->slots[l])
		return NULL;
	struct pull_sched_host *best = NULL;
	struct pull_sched_job *pick = NULL;
	for (struct pull_sched_host *h = s->hosts; h; h = h->next) {
		if (!h->head[l] || h->retry_at > now || h->running[l] >= host_cap(s, h, l))
			continue;
		if (best &&
		    (h->running[l] > best->running[l] ||
		     (h->running[l] == best->running[l] && h->served[l] >= best->served[l])))
			continue;
		struct pull_sched_job *j = h->head[l];
		while (j && may_start && !may_start(j, ud))
			j = j->next;
		if (j) {
			best = h;
			pick = j;
		}
	}
	if (!pick)
		return NULL;
	unlink_job(best, pick);
	pick->running = true;
	best->running[l]++;
	best->served[l] = ++s->turn;
	s->running[l]++;
	return pick;
}

void pull_sched_done(struct pull_sched *s, struct pull_sched_job *j,
                     enum pull_sched_outcome outcome, uint64_t now)
{
	struct pull_sched_host *h = j->host;
	if (!j->running)
		return;
	j->running = false;
	h->running[j->lane]--;
	s->running[j->lane]--;
	if (outcome == PULL_SCHED_OK) {
		h->answered = true;
		h->failures = 0;
		h->retry_at = 0;
		return;
	}
	uint64_t at =
	    now + backoff_ms(h->failures++, HOST_BACKOFF_MS, HOST_BACKOFF_MAX_MS, &s->seed);
	if (at > h->retry_at)
		h->retry_at = at;
}

uint64_t pull_sched_host_retry_at(const struct pull_sched_host *h)
{
	return h && h->failures ? h->retry_at : 0;
}

uint64_t pull_sched_next_due(const struct pull_sched *s)
{
	uint64_t due = UINT64_MAX;
	for (const struct pull_sched_host *h = s->hosts; h; h = h->next) {
		bool queued = false;
		for (int l = 0; l < PULL_SCHED_LANES; l++)
			queued |= h->head[l] != NULL;
		if (queued && h->failures && h->retry_at < due)
			due = h->retry_at;
	}
	return due;
}
