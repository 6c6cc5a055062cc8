#include "ttl_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct entry {
	struct entry *hnext;       /* bucket chain */
	struct entry *prev, *next; /* recency list, most recent first */
	uint64_t hash, expires;
	size_t len;
	char *key;
	unsigned char val[];
};

struct ttl_cache {
	struct entry **buckets;
	size_t nbuckets, count, max;
	struct entry *head, *tail;
};

static uint64_t hash_key(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

int ttl_cache_new(size_t max_entries, struct ttl_cache **out)
{
	if (max_entries == 0 || max_entries > (1u << 24))
		return -EINVAL;
	struct ttl_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->nbuckets = 16;
	while (c->nbuckets < max_entries)
		c->nbuckets *= 2;
	c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
	if (!c->buckets) {
		free(c);
		return -ENOMEM;
	}
	c->max = max_entries;
	*out = c;
	return 0;
}

static void list_unlink(struct ttl_cache *c, struct entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void list_push_front(struct ttl_cache *c, struct entry *e)
{
	e->prev = NULL;
	e->next = c->head;
	if (c->head)
		c->head->prev = e;
	c->head = e;
	if (!c->tail)
		c->tail = e;
}

static struct entry **find(struct ttl_cache *c, const char *key, uint64_t h)
{
	struct entry **p = &c->buckets[h & (c->nbuckets - 1)];
	while (*p && ((*p)->hash != h || strcmp((*p)->key, key) != 0))
		p = &(*p)->hnext;
	return p;
}

static void drop(struct ttl_cache *c, struct entry **slot)
{
	struct entry *e = *slot;
	*slot = e->hnext;
	list_unlink(c, e);
	c->count--;
	free(e->key);
	free(e);
}

long ttl_cache_get(struct ttl_cache *c, const char *key, uint64_t now_ms, void *val, size_t cap)
{
	uint64_t h = hash_key(key);
	struct entry **slot = find(c, key, h);
	struct entry *e = *slot;
	if (!e)
		return -ENOENT;
	if (e->expires <= now_ms) {
		drop(c, slot);
		return -ENOENT;
	}
	list_unlink(c, e);
	list_push_front(c, e);
	memcpy(val, e->val, e->len < cap ? e->len : cap);
	return (long)e->len;
}

int ttl_cache_put(struct ttl_cache *c, const char *key, const void *val, size_t len,
                  uint64_t expires_ms)
{
	uint64_t h = hash_key(key);
	struct entry *e = malloc(sizeof(*e) + len);
	char *k = strdup(key);
	if (!e || !k) {
		free(e);
		free(k);
		return -ENOMEM;
	}
	*e = (struct entry){.hash = h, .expires = expires_ms, .len = len, .key = k};
	memcpy(e->val, val, len);
	struct entry **slot = find(c, key, h);
	if (*slot)
		drop(c, slot);
	else if (c->count >= c->max)
		drop(c, find(c, c->tail->key, c->tail->hash));
	slot = &c->buckets[h & (c->nbuckets - 1)];
	e->hnext = *slot;
	*slot = e;
	list_push_front(c, e);
	c->count++;
	return 0;
}

void ttl_cache_remove(struct ttl_cache *c, const char *key)
{
	struct entry **slot = find(c, key, hash_key(key));
	if (*slot)
		drop(c, slot);
}

void ttl_cache_clear(struct ttl_cache *c)
{
	while (c->tail)
		drop(c, find(c, c->tail->key, c->tail->hash));
}

size_t ttl_cache_count(const struct ttl_cache *c)
{
	return c->count;
}

void ttl_cache_free(struct ttl_cache *c)
{
	if (!c)
		return;
	ttl_cache_clear(c);
	free(c->buckets);
	free(c);
}
