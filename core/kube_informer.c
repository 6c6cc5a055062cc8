/* Informer cache fed by a watch thread, applied on the owner thread (see kube_informer.h). */
#include "kube_informer.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define KEY_MAX 512

enum delta_kind { D_EVENT, D_REPLACE };

struct delta {
	enum delta_kind kind;
	enum kube_event_type type; /* D_EVENT */
	cJSON *obj;                /* D_EVENT: the object; D_REPLACE: the items array */
	struct delta *next;
};

struct entry {
	char *key;
	uint32_t hash;
	cJSON *obj;
	uint64_t gen;
	struct entry *next;
};

struct kube_informer {
	struct kube_informer_opts o; /* o.watch's strings are the caller's: not used after start */
	struct kube_resource res;
	char name[128];
	struct kube_watch *watch;
	atomic_int refs; /* the owner, plus one per drain posted to the loop */
	atomic_bool stopped;
	/* deltas from the watch thread */
	pthread_mutex_t mu;
	struct delta *head, *tail;
	bool pending; /* a notify/post is outstanding */
	/* the cache: owner thread only */
	struct entry **buckets;
	size_t nbuckets, len;
	uint64_t gen;
	bool synced;
};

static uint32_t hash_str(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

int kube_informer_key(const cJSON *obj, char *buf, size_t len)
{
	const char *name = kube_obj_name(obj), *ns = kube_obj_namespace(obj);
	if (!name || !*name)
		return -EINVAL;
	int n = ns && *ns ? snprintf(buf, len, "%s/%s", ns, name) : snprintf(buf, len, "%s", name);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

static struct entry *find(const struct kube_informer *inf, const char *key, uint32_t h)
{
	for (struct entry *e = inf->buckets[h & (inf->nbuckets - 1)]; e; e = e->next)
		if (e->hash == h && !strcmp(e->key, key))
			return e;
	return NULL;
}

static void grow(struct kube_informer *inf)
{
	size_t n = inf->nbuckets * 2;
	struct entry **b = calloc(n, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i < inf->nbuckets; i++) {
		struct entry *e = inf->buckets[i];
		while (e) {
			struct entry *next = e->next;
			e->next = b[e->hash & (n - 1)];
			b[e->hash & (n - 1)] = e;
			e = next;
		}
	}
	free(inf->buckets);
	inf->buckets = b;
	inf->nbuckets = n;
}

static void unlink_entry(struct kube_informer *inf, struct entry *e)
{
	struct entry **pp = &inf->buckets[e->hash & (inf->nbuckets - 1)];
	while (*pp && *pp != e)
		pp = &(*pp)->next;
	if (*pp)
		*pp = e->next;
	inf->len--;
}

static void report(struct kube_informer *inf, enum kube_event_type t, const cJSON *old,
                   const cJSON *obj)
{
	if (inf->o.on_change)
		inf->o.on_change(inf, t, old, obj, inf->o.ud);
}

/* Insert or update one object (ownership of obj passes). */
static void upsert(struct kube_informer *inf, cJSON *obj, bool from_list)
{
	char key[KEY_MAX];
	if (kube_informer_key(obj, key, sizeof(key)) < 0) {
		log_error("kube: an object without a usable name, not cached", "watch",
		          inf->name);
		cJSON_Delete(obj);
		return;
	}
	uint32_t h = hash_str(key);
	struct entry *e = find(inf, key, h);
	if (e) {
		e->gen = inf->gen;
		const char *orv = kube_obj_rv(e->obj), *nrv = kube_obj_rv(obj);
		if (from_list && orv && nrv && !strcmp(orv, nrv)) {
			cJSON_Delete(obj); /* unchanged since we last saw it */
			return;
		}
		cJSON *old = e->obj;
		e->obj = obj;
		report(inf, KUBE_MODIFIED, old, obj);
		cJSON_Delete(old);
		return;
	}
	e = calloc(1, sizeof(*e));
	if (!e || !(e->key = strdup(key))) {
		free(e);
		log_error("kube: out of memory caching an object", "key", key);
		cJSON_Delete(obj);
		return;
	}
	e->hash = h;
	e->obj = obj;
	e->gen = inf->gen;
	if (inf->len + 1 > inf->nbuckets)
		grow(inf);
	e->next = inf->buckets[h & (inf->nbuckets - 1)];
	inf->buckets[h & (inf->nbuckets - 1)] = e;
	inf->len++;
	report(inf, KUBE_ADDED, NULL, obj);
}

static void remove_obj(struct kube_informer *inf, cJSON *obj)
{
	char key[KEY_MAX];
	if (kube_informer_key(obj, key, sizeof(key)) == 0) {
		struct entry *e = find(inf, key, hash_str(key));
		if (e) {
			unlink_entry(inf, e);
			report(inf, KUBE_DELETED, e->obj, obj);
			cJSON_Delete(e->obj);
			free(e->key);
			free(e);
		}
	}
	cJSON_Delete(obj);
}

static void replace_all(struct kube_informer *inf, cJSON *items)
{
	inf->gen++;
	cJSON *it;
	while ((it = cJSON_DetachItemFromArray(items, 0)))
		upsert(inf, it, true);
	cJSON_Delete(items);
	/* what the list no longer has was deleted while we were not watching */
	for (size_t i = 0; i < inf->nbuckets; i++) {
		struct entry *e = inf->buckets[i];
		while (e) {
			struct entry *next = e->next;
			if (e->gen != inf->gen) {
				unlink_entry(inf, e);
				report(inf, KUBE_DELETED, e->obj, e->obj);
				cJSON_Delete(e->obj);
				free(e->key);
				free(e);
			}
			e = next;
		}
	}
	if (!inf->synced) {
		inf->synced = true;
		if (inf->o.on_synced)
			inf->o.on_synced(inf, inf->o.ud);
	}
}

size_t kube_informer_drain(struct kube_informer *inf)
{
	pthread_mutex_lock(&inf->mu);
	struct delta *d = inf->head;
	inf->head = inf->tail = NULL;
	inf->pending = false;
	pthread_mutex_unlock(&inf->mu);
	size_t n = 0;
	while (d) {
		struct delta *next = d->next;
		if (d->kind == D_REPLACE)
			replace_all(inf, d->obj);
		else if (d->type == KUBE_DELETED)
			remove_obj(inf, d->obj);
		else
			upsert(inf, d->obj, false);
		free(d);
		d = next;
		n++;
	}
	return n;
}

static void unref(struct kube_informer *inf);

static void drain_on_loop(struct loop *l, void *ud)
{
	(void)l;
	struct kube_informer *inf = ud;
	if (!atomic_load(&inf->stopped))
		kube_informer_drain(inf);
	unref(inf);
}

/* Watch thread: queue a delta and wake the owner once per batch. */
static void push(struct kube_informer *inf, enum delta_kind kind, enum kube_event_type type,
                 cJSON *obj)
{
	struct delta *d = calloc(1, sizeof(*d));
	if (!d) {
		log_error("kube: out of memory queueing a watch event", "watch", inf->name);
		cJSON_Delete(obj);
		return;
	}
	d->kind = kind;
	d->type = type;
	d->obj = obj;
	pthread_mutex_lock(&inf->mu);
	if (inf->tail)
		inf->tail->next = d;
	else
		inf->head = d;
	inf->tail = d;
	bool wake = !inf->pending;
	inf->pending = true;
	pthread_mutex_unlock(&inf->mu);
	if (!wake)
		return;
	if (inf->o.loop) {
		atomic_fetch_add(&inf->refs, 1);
		if (loop_post(inf->o.loop, drain_on_loop, inf) < 0) {
			atomic_fetch_sub(&inf->refs, 1);
			pthread_mutex_lock(&inf->mu);
			inf->pending = false; /* try again with the next event */
			pthread_mutex_unlock(&inf->mu);
		}
	} else if (inf->o.notify) {
		inf->o.notify(inf, inf->o.ud);
	}
}

static void strip(const struct kube_informer *inf, cJSON *obj)
{
	if (inf->o.keep_managed_fields)
		return;
	cJSON *meta = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
	cJSON_DeleteItemFromObjectCaseSensitive(meta, "managedFields");
}

static void on_replace(cJSON *items, const char *rv, void *ud)
{
	(void)rv;
	struct kube_informer *inf = ud;
	cJSON *it;
	cJSON_ArrayForEach(it, items)
	strip(inf, it);
	push(inf, D_REPLACE, KUBE_ADDED, items);
}

static void on_event(enum kube_event_type type, cJSON *obj, void *ud)
{
	struct kube_informer *inf = ud;
	strip(inf, obj);
	push(inf, D_EVENT, type, obj);
}

int kube_informer_start(struct kube_client *c, const struct kube_informer_opts *o,
                        struct kube_informer **out)
{
	if (!o->loop && !o->notify)
		return -EINVAL;
	struct kube_informer *inf = calloc(1, sizeof(*inf));
	if (!inf)
		return -ENOMEM;
	inf->o = *o;
	inf->res = o->watch.resource;
	snprintf(inf->name, sizeof(inf->name), "%s", o->watch.name ? o->watch.name : o->watch.resource.plural);
	atomic_init(&inf->refs, 1);
	pthread_mutex_init(&inf->mu, NULL);
	inf->nbuckets = 64;
	inf->buckets = calloc(inf->nbuckets, sizeof(*inf->buckets));
	if (!inf->buckets) {
		pthread_mutex_destroy(&inf->mu);
		free(inf);
		return -ENOMEM;
	}
	struct kube_watch_handler h = {on_replace, on_event, inf};
	int rc = kube_watch_start(c, &o->watch, &h, &inf->watch);
	if (rc < 0) {
		free(inf->buckets);
		pthread_mutex_destroy(&inf->mu);
		free(inf);
		return rc;
	}
	*out = inf;
	return 0;
}

static void release(struct kube_informer *inf)
{
	struct delta *d = inf->head;
	while (d) {
		struct delta *next = d->next;
		cJSON_Delete(d->obj);
		free(d);
		d = next;
	}
	for (size_t i = 0; i < inf->nbuckets; i++) {
		struct entry *e = inf->buckets[i];
		while (e) {
			struct entry *next = e->next;
			cJSON_Delete(e->obj);
			free(e->key);
			free(e);
			e = next;
		}
	}
	free(inf->buckets);
	pthread_mutex_destroy(&inf->mu);
	free(inf);
}

static void unref(struct kube_informer *inf)
{
	if (atomic_fetch_sub(&inf->refs, 1) == 1)
		release(inf);
}

void kube_informer_stop(struct kube_informer *inf)
{
	if (!inf)
		return;
	atomic_store(&inf->stopped, true);
	kube_watch_stop(inf->watch); /* no push after this returns */
	inf->watch = NULL;
	unref(inf); /* drains still posted to the loop hold the rest */
}

const cJSON *kube_informer_get(const struct kube_informer *inf, const char *ns, const char *name)
{
	char key[KEY_MAX];
	int n;
	if (!name)
		return NULL;
	if (inf->res.namespaced && ns && *ns)
		n = snprintf(key, sizeof(key), "%s/%s", ns, name);
	else
		n = snprintf(key, sizeof(key), "%s", name);
	if (n < 0 || (size_t)n >= sizeof(key))
		return NULL;
	struct entry *e = find(inf, key, hash_str(key));
	return e ? e->obj : NULL;
}

size_t kube_informer_len(const struct kube_informer *inf)
{
	return inf->len;
}

void kube_informer_foreach(const struct kube_informer *inf,
                           void (*fn)(const char *key, const cJSON *obj, void *ud), void *ud)
{
	for (size_t i = 0; i < inf->nbuckets; i++)
		for (struct entry *e = inf->buckets[i]; e; e = e->next)
			fn(e->key, e->obj, ud);
}

bool kube_informer_synced(const struct kube_informer *inf)
{
	return inf->synced;
}

const struct kube_watch_opts *kube_informer_watch_opts(const struct kube_informer *inf)
{
	return inf->watch ? kube_watch_options(inf->watch) : NULL;
}

const struct kube_watch_stats *kube_informer_stats(const struct kube_informer *inf)
{
	return inf->watch ? kube_watch_stats(inf->watch) : NULL;
}
