/* Work queue (see kube_workqueue.h). */
#include "kube_workqueue.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"

#define KEY_MAX 512

struct item {
	char *key;
	uint32_t hash;
	struct item *next_hash;
	struct item *next_ready;
	bool queued;     /* in the ready FIFO */
	bool processing; /* handed out, not done */
	bool dirty;      /* added while processing: queue again on done */
	uint64_t due;    /* delayed until (0: not delayed) */
	unsigned failures;
	unsigned heap_refs; /* heap entries (current or superseded) pointing here */
};

struct heap_ent {
	uint64_t due;
	struct item *it;
};

struct kube_workqueue {
	struct kube_workqueue_opts o;
	struct item **buckets;
	size_t nbuckets, nitems;
	struct item *ready_head, *ready_tail;
	size_t nready, nflight, ndelayed;
	struct heap_ent *heap; /* min-heap on due; stale entries skipped lazily */
	size_t heap_len, heap_cap;
};

int kube_workqueue_new(const struct kube_workqueue_opts *o, struct kube_workqueue **out)
{
	struct kube_workqueue *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	if (o)
		q->o = *o;
	if (!q->o.max_in_flight)
		q->o.max_in_flight = 4;
	if (!q->o.base_delay_ms)
		q->o.base_delay_ms = 100;
	if (!q->o.max_delay_ms)
		q->o.max_delay_ms = 300000;
	q->nbuckets = 64;
	q->buckets = calloc(q->nbuckets, sizeof(*q->buckets));
	if (!q->buckets) {
		free(q);
		return -ENOMEM;
	}
	*out = q;
	return 0;
}

void kube_workqueue_free(struct kube_workqueue *q)
{
	if (!q)
		return;
	for (size_t i = 0; i < q->nbuckets; i++) {
		struct item *it = q->buckets[i];
		while (it) {
			struct item *n = it->next_hash;
			free(it->key);
			free(it);
			it = n;
		}
	}
	free(q->buckets);
	free(q->heap);
	free(q);
}

static struct item *find(struct kube_workqueue *q, const char *key, uint32_t h)
{
	for (struct item *it = q->buckets[h & (q->nbuckets - 1)]; it; it = it->next_hash)
		if (it->hash == h && !strcmp(it->key, key))
			return it;
	return NULL;
}

static void grow(struct kube_workqueue *q)
{
	size_t n = q->nbuckets * 2;
	struct item **b = calloc(n, sizeof(*b));
	if (!b)
		return; /* keep the longer chains */
	for (size_t i = 0; i < q->nbuckets; i++) {
		struct item *it = q->buckets[i];
		while (it) {
			struct item *next = it->next_hash;
			it->next_hash = b[it->hash & (n - 1)];
			b[it->hash & (n - 1)] = it;
			it = next;
		}
	}
	free(q->buckets);
	q->buckets = b;
	q->nbuckets = n;
}

static struct item *get_or_create(struct kube_workqueue *q, const char *key)
{
	size_t len = strlen(key);
	if (len == 0 || len > KEY_MAX) {
		errno = EINVAL;
		return NULL;
	}
	uint32_t h = strmap_hash(key);
	struct item *it = find(q, key, h);
	if (it)
		return it;
	it = calloc(1, sizeof(*it));
	if (!it || !(it->key = strdup(key))) {
		free(it);
		errno = ENOMEM;
		return NULL;
	}
	it->hash = h;
	if (q->nitems + 1 > q->nbuckets)
		grow(q);
	it->next_hash = q->buckets[h & (q->nbuckets - 1)];
	q->buckets[h & (q->nbuckets - 1)] = it;
	q->nitems++;
	return it;
}

/* Drop an item nobody needs any more (not queued, out, delayed or failing). */
static void maybe_release(struct kube_workqueue *q, struct item *it)
{
	if (it->queued || it->processing || it->due || it->failures || it->heap_refs)
		return;
	struct item **pp = &q->buckets[it->hash & (q->nbuckets - 1)];
	while (*pp && *pp != it)
		pp = &(*pp)->next_hash;
	if (*pp)
		*pp = it->next_hash;
	q->nitems--;
	free(it->key);
	free(it);
}

static void enqueue(struct kube_workqueue *q, struct item *it)
{
	if (it->processing) {
		it->dirty = true;
		return;
	}
	if (it->queued)
		return;
	it->queued = true;
	it->next_ready = NULL;
	if (q->ready_tail)
		q->ready_tail->next_ready = it;
	else
		q->ready_head = it;
	q->ready_tail = it;
	q->nready++;
}

int kube_workqueue_add(struct kube_workqueue *q, const char *key)
{
	struct item *it = get_or_create(q, key);
	if (!it)
		return -errno;
	enqueue(q, it);
	return 0;
}

static void heap_swap(struct heap_ent *a, struct heap_ent *b)
{
	struct heap_ent t = *a;
	*a = *b;
	*b = t;
}

static int heap_push(struct kube_workqueue *q, uint64_t due, struct item *it)
{
	if (q->heap_len == q->heap_cap) {
		size_t n = q->heap_cap ? q->heap_cap * 2 : 64;
		struct heap_ent *h = realloc(q->heap, n * sizeof(*h));
		if (!h)
			return -ENOMEM;
		q->heap = h;
		q->heap_cap = n;
	}
	size_t i = q->heap_len++;
	q->heap[i] = (struct heap_ent){due, it};
	it->heap_refs++;
	while (i > 0 && q->heap[(i - 1) / 2].due > q->heap[i].due) {
		heap_swap(&q->heap[(i - 1) / 2], &q->heap[i]);
		i = (i - 1) / 2;
	}
	return 0;
}

/* Remove the top entry; the caller still may use top.it (released later). */
static void heap_pop(struct kube_workqueue *q)
{
	q->heap[0].it->heap_refs--;
	q->heap[0] = q->heap[--q->heap_len];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < q->heap_len && q->heap[l].due < q->heap[m].due)
			m = l;
		if (r < q->heap_len && q->heap[r].due < q->heap[m].due)
			m = r;
		if (m == i)
			break;
		heap_swap(&q->heap[m], &q->heap[i]);
		i = m;
	}
}

int kube_workqueue_add_after(struct kube_workqueue *q, const char *key, uint64_t delay_ms,
                             uint64_t now_ms)
{
	if (delay_ms == 0)
		return kube_workqueue_add(q, key);
	struct item *it = get_or_create(q, key);
	if (!it)
		return -errno;
	uint64_t due = now_ms + delay_ms;
	if (it->due && it->due <= due)
		return 0; /* an earlier deadline is already set */
	if (heap_push(q, due, it) < 0) {
		maybe_release(q, it);
		return -ENOMEM;
	}
	if (!it->due)
		q->ndelayed++;
	it->due = due;
	return 0;
}

static uint64_t backoff(const struct kube_workqueue *q, unsigned failures)
{
	uint64_t d = q->o.base_delay_ms;
	for (unsigned i = 1; i < failures && d < q->o.max_delay_ms; i++)
		d *= 2;
	return d > q->o.max_delay_ms ? q->o.max_delay_ms : d;
}

int kube_workqueue_add_rate_limited_min(struct kube_workqueue *q, const char *key,
                                        uint64_t min_delay_ms, uint64_t now_ms)
{
	struct item *it = get_or_create(q, key);
	if (!it)
		return -errno;
	if (it->failures < 64)
		it->failures++;
	uint64_t d = backoff(q, it->failures);
	if (d < min_delay_ms)
		d = min_delay_ms;
	return kube_workqueue_add_after(q, key, d, now_ms);
}

int kube_workqueue_add_rate_limited(struct kube_workqueue *q, const char *key, uint64_t now_ms)
{
	return kube_workqueue_add_rate_limited_min(q, key, 0, now_ms);
}

void kube_workqueue_forget(struct kube_workqueue *q, const char *key)
{
	struct item *it = find(q, key, strmap_hash(key));
	if (!it)
		return;
	it->failures = 0;
	maybe_release(q, it);
}

unsigned kube_workqueue_failures(struct kube_workqueue *q, const char *key)
{
	struct item *it = find(q, key, strmap_hash(key));
	return it ? it->failures : 0;
}

static void promote_due(struct kube_workqueue *q, uint64_t now_ms)
{
	while (q->heap_len && q->heap[0].due <= now_ms) {
		struct heap_ent e = q->heap[0];
		heap_pop(q);
		if (e.it->due != e.due) {
			maybe_release(q, e.it); /* superseded by an earlier deadline */
			continue;
		}
		e.it->due = 0;
		q->ndelayed--;
		enqueue(q, e.it);
	}
}

const char *kube_workqueue_get(struct kube_workqueue *q, uint64_t now_ms)
{
	promote_due(q, now_ms);
	if (q->nflight >= q->o.max_in_flight || !q->ready_head)
		return NULL;
	struct item *it = q->ready_head;
	q->ready_head = it->next_ready;
	if (!q->ready_head)
		q->ready_tail = NULL;
	q->nready--;
	it->queued = false;
	it->processing = true;
	q->nflight++;
	return it->key;
}

void kube_workqueue_done(struct kube_workqueue *q, const char *key)
{
	struct item *it = find(q, key, strmap_hash(key));
	if (!it || !it->processing)
		return;
	it->processing = false;
	q->nflight--;
	if (it->dirty) {
		it->dirty = false;
		enqueue(q, it);
	}
	maybe_release(q, it);
}

uint64_t kube_workqueue_next_due(struct kube_workqueue *q)
{
	/* drop superseded entries so the answer is a real deadline */
	while (q->heap_len && q->heap[0].it->due != q->heap[0].due) {
		struct item *it = q->heap[0].it;
		heap_pop(q);
		maybe_release(q, it);
	}
	return q->heap_len ? q->heap[0].due : UINT64_MAX;
}

size_t kube_workqueue_ready(const struct kube_workqueue *q)
{
	return q->nready;
}

size_t kube_workqueue_delayed(const struct kube_workqueue *q)
{
	return q->ndelayed;
}

size_t kube_workqueue_in_flight(const struct kube_workqueue *q)
{
	return q->nflight;
}
