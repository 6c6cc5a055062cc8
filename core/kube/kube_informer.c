/* Informer cache fed by a watch thread, applied on the owner thread (see kube_informer.h). */
#include "kube_informer.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "strmap.h"

#define KEY_MAX 512
/* list pages queued for the owner before the watch thread waits for room */
#define MAX_QUEUED_PAGES 4

/* D_PAGE: items of a list (first: of a new list attempt); D_LISTED: the
 * list is complete. */
enum delta_kind { D_EVENT, D_PAGE, D_LISTED };

/* An object prepared on the watch thread: key, text (not with no_cache) and
 * resourceVersion, and the parsed tree only when someone wants to see
 * changes. */
struct item {
	char *key;
	char *text;
	size_t len;
	char rv[24]; /* "" when longer (then it never compares equal) */
	cJSON *obj;  /* NULL unless on_change is set */
};

struct delta {
	enum delta_kind kind;
	enum kube_event_type type; /* D_EVENT */
	bool first;                /* D_PAGE: of a new list attempt */
	bool complete;             /* D_LISTED: every page was kept */
	struct item *items;        /* D_EVENT: one; D_PAGE: n */
	size_t n;
	struct delta *next;
};

struct entry {
	uint32_t hash;
	char rv[24];
	char *text; /* NULL with no_cache */
	size_t len;
	uint64_t gen;
	struct entry *next;
	char key[]; /* immutable */
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
	bool pending;   /* a notify/post is outstanding */
	bool page_lost; /* watch thread: a page of this list could not be queued */
	unsigned pages; /* list pages queued: the watch thread waits for room */
	pthread_cond_t room;
	/* the cache: owner thread only */
	struct entry **buckets;
	size_t nbuckets, len;
	uint64_t gen;
	bool synced;
};

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

static void item_clear(struct item *it)
{
	free(it->key);
	free(it->text);
	cJSON_Delete(it->obj);
	memset(it, 0, sizeof(*it));
}

static void report(struct kube_informer *inf, enum kube_event_type t, const cJSON *obj)
{
	if (inf->o.on_change && obj)
		inf->o.on_change(inf, t, obj, inf->o.ud);
}

/* What is known of a deleted object without its text: its identity. */
static cJSON *stub_of(const struct kube_informer *inf, const char *key)
{
	cJSON *o = cJSON_CreateObject();
	char av[256];
	if (*inf->res.group)
		snprintf(av, sizeof(av), "%s/%s", inf->res.group, inf->res.version);
	else
		snprintf(av, sizeof(av), "%s", inf->res.version);
	cJSON_AddStringToObject(o, "apiVersion", av);
	cJSON_AddStringToObject(o, "kind", inf->res.kind);
	cJSON *meta = cJSON_AddObjectToObject(o, "metadata");
	const char *slash = inf->res.namespaced ? strchr(key, '/') : NULL;
	if (slash) {
		char ns[KEY_MAX];
		snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key), key);
		cJSON_AddStringToObject(meta, "namespace", ns);
	}
	cJSON_AddStringToObject(meta, "name", slash ? slash + 1 : key);
	return o;
}

/* A deleted entry: report it with its last known state, then free it. */
static void drop_entry(struct kube_informer *inf, struct entry *e, const cJSON *final)
{
	unlink_entry(inf, e);
	if (inf->o.on_change) {
		cJSON *last = final     ? NULL
		              : e->text ? cJSON_ParseWithLength(e->text, e->len)
		                        : stub_of(inf, e->key);
		report(inf, KUBE_DELETED, final ? final : last);
		cJSON_Delete(last);
	}
	free(e->text);
	free(e);
}

/* Insert or update one object (the item's strings pass to the cache). */
static void upsert(struct kube_informer *inf, struct item *it, bool from_list)
{
	uint32_t h = strmap_hash(it->key);
	struct entry *e = find(inf, it->key, h);
	if (e) {
		e->gen = inf->gen;
		if (from_list && it->rv[0] && !strcmp(e->rv, it->rv))
			return; /* unchanged since we last saw it */
		free(e->text);
		e->text = it->text;
		e->len = it->len;
		it->text = NULL;
		memcpy(e->rv, it->rv, sizeof(e->rv));
		report(inf, KUBE_MODIFIED, it->obj);
		return;
	}
	size_t kl = strlen(it->key);
	e = malloc(sizeof(*e) + kl + 1);
	if (!e) {
		log_error("kube: out of memory caching an object", "key", it->key);
		return;
	}
	memcpy(e->key, it->key, kl + 1);
	memcpy(e->rv, it->rv, sizeof(e->rv));
	e->hash = h;
	e->text = it->text;
	e->len = it->len;
	it->text = NULL;
	e->gen = inf->gen;
	if (inf->len + 1 > inf->nbuckets)
		grow(inf);
	e->next = inf->buckets[h & (inf->nbuckets - 1)];
	inf->buckets[h & (inf->nbuckets - 1)] = e;
	inf->len++;
	report(inf, KUBE_ADDED, it->obj);
}

static void remove_item(struct kube_informer *inf, struct item *it)
{
	struct entry *e = find(inf, it->key, strmap_hash(it->key));
	if (e)
		drop_entry(inf, e, it->obj);
}

/* A page of a list: a new list attempt starts a new generation; what no
 * page of the complete list had is dropped by list_done(). */
static void apply_page(struct kube_informer *inf, struct item *items, size_t n, bool first)
{
	if (first)
		inf->gen++;
	for (size_t i = 0; i < n; i++)
		upsert(inf, &items[i], true);
}

static void list_done(struct kube_informer *inf, bool complete)
{
	/* what the list no longer has was deleted while we were not watching
	 * (unless a page of it could not be kept: then the next list tells) */
	for (size_t i = 0; complete && i < inf->nbuckets; i++) {
		struct entry *e = inf->buckets[i];
		while (e) {
			struct entry *next = e->next;
			if (e->gen != inf->gen)
				drop_entry(inf, e, NULL);
			e = next;
		}
	}
	/* the pages were parsed and freed: give what they took back */
	if (inf->o.loop)
		loop_trim_soon(inf->o.loop);
	if (!inf->synced) {
		inf->synced = true;
		if (inf->o.on_synced)
			inf->o.on_synced(inf, inf->o.ud);
	}
}

static void delta_free(struct delta *d)
{
	for (size_t i = 0; i < d->n; i++)
		item_clear(&d->items[i]);
	free(d->items);
	free(d);
}

size_t kube_informer_drain(struct kube_informer *inf)
{
	pthread_mutex_lock(&inf->mu);
	struct delta *d = inf->head;
	inf->head = inf->tail = NULL;
	inf->pending = false;
	inf->pages = 0;
	pthread_cond_broadcast(&inf->room);
	pthread_mutex_unlock(&inf->mu);
	size_t n = 0;
	while (d) {
		struct delta *next = d->next;
		if (d->kind == D_PAGE)
			apply_page(inf, d->items, d->n, d->first);
		else if (d->kind == D_LISTED)
			list_done(inf, d->complete);
		else if (d->type == KUBE_DELETED)
			remove_item(inf, &d->items[0]);
		else
			upsert(inf, &d->items[0], false);
		delta_free(d);
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
static void push(struct kube_informer *inf, struct delta *d)
{
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

/* Watch thread: key, text and resourceVersion of obj (taken over). */
static int prepare(struct kube_informer *inf, cJSON *obj, struct item *it)
{
	char key[KEY_MAX];
	memset(it, 0, sizeof(*it));
	if (kube_informer_key(obj, key, sizeof(key)) < 0) {
		log_error("kube: an object without a usable name, not cached", "watch", inf->name);
		cJSON_Delete(obj);
		return -EINVAL;
	}
	if (!inf->o.keep_managed_fields)
		cJSON_DeleteItemFromObjectCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "managedFields");
	const char *rv = kube_obj_rv(obj);
	if (rv && strlen(rv) < sizeof(it->rv))
		memcpy(it->rv, rv, strlen(rv) + 1);
	it->key = strdup(key);
	it->text = inf->o.no_cache ? NULL : cJSON_PrintUnformatted(obj);
	if (!it->key || (!it->text && !inf->o.no_cache)) {
		log_error("kube: out of memory queueing an object", "watch", inf->name);
		cJSON_Delete(obj);
		item_clear(it);
		return -ENOMEM;
	}
	it->len = it->text ? strlen(it->text) : 0;
	if (inf->o.on_change)
		it->obj = obj;
	else
		cJSON_Delete(obj);
	return 0;
}

static void on_page(cJSON *items, bool first, void *ud)
{
	struct kube_informer *inf = ud;
	/* an owner that falls behind holds the list back, instead of the
	 * pages of a big list piling up between the threads */
	pthread_mutex_lock(&inf->mu);
	while (inf->pages >= MAX_QUEUED_PAGES && !atomic_load(&inf->stopped))
		pthread_cond_wait(&inf->room, &inf->mu);
	inf->pages++;
	pthread_mutex_unlock(&inf->mu);
	if (first)
		inf->page_lost = false;
	size_t n = (size_t)cJSON_GetArraySize(items);
	struct delta *d = calloc(1, sizeof(*d));
	struct item *arr = calloc(n ? n : 1, sizeof(*arr));
	if (!d || !arr) {
		/* nothing is dropped for this list's sake: keep what we have */
		inf->page_lost = true;
		log_error("kube: out of memory applying a list", "watch", inf->name);
		free(d);
		free(arr);
		cJSON_Delete(items);
		return;
	}
	size_t k = 0;
	cJSON *it;
	while ((it = cJSON_DetachItemFromArray(items, 0)))
		if (prepare(inf, it, &arr[k]) == 0)
			k++;
	cJSON_Delete(items);
	d->kind = D_PAGE;
	d->first = first;
	d->items = arr;
	d->n = k;
	push(inf, d);
}

static void on_listed(const char *rv, void *ud)
{
	(void)rv;
	struct kube_informer *inf = ud;
	struct delta *d = calloc(1, sizeof(*d));
	if (!d) {
		/* the next relist completes it */
		log_error("kube: out of memory completing a list", "watch", inf->name);
		return;
	}
	d->kind = D_LISTED;
	d->complete = !inf->page_lost;
	push(inf, d);
}

static void on_event(enum kube_event_type type, cJSON *obj, void *ud)
{
	struct kube_informer *inf = ud;
	struct delta *d = calloc(1, sizeof(*d));
	struct item *one = calloc(1, sizeof(*one));
	if (!d || !one || prepare(inf, obj, one) < 0) {
		if (!d || !one) {
			log_error("kube: out of memory queueing a watch event", "watch", inf->name);
			cJSON_Delete(obj);
		}
		free(d);
		free(one);
		return;
	}
	d->kind = D_EVENT;
	d->type = type;
	d->items = one;
	d->n = 1;
	push(inf, d);
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
	snprintf(inf->name, sizeof(inf->name), "%s",
	         o->watch.name ? o->watch.name : o->watch.resource.plural);
	atomic_init(&inf->refs, 1);
	pthread_mutex_init(&inf->mu, NULL);
	pthread_cond_init(&inf->room, NULL);
	inf->nbuckets = 64;
	inf->buckets = calloc(inf->nbuckets, sizeof(*inf->buckets));
	if (!inf->buckets) {
		pthread_cond_destroy(&inf->room);
		pthread_mutex_destroy(&inf->mu);
		free(inf);
		return -ENOMEM;
	}
	struct kube_watch_handler h = {
	    .event = on_event, .ud = inf, .page = on_page, .listed = on_listed};
	int rc = kube_watch_start(c, &o->watch, &h, &inf->watch);
	if (rc < 0) {
		free(inf->buckets);
		pthread_cond_destroy(&inf->room);
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
		delta_free(d);
		d = next;
	}
	for (size_t i = 0; i < inf->nbuckets; i++) {
		struct entry *e = inf->buckets[i];
		while (e) {
			struct entry *next = e->next;
			free(e->text);
			free(e);
			e = next;
		}
	}
	free(inf->buckets);
	pthread_cond_destroy(&inf->room);
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
	pthread_mutex_lock(&inf->mu);
	atomic_store(&inf->stopped, true);
	pthread_cond_broadcast(&inf->room); /* a watch thread waiting for room */
	pthread_mutex_unlock(&inf->mu);
	kube_watch_stop(inf->watch); /* no push after this returns */
	inf->watch = NULL;
	unref(inf); /* drains still posted to the loop hold the rest */
}

static const struct entry *lookup(const struct kube_informer *inf, const char *ns, const char *name)
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
	return find(inf, key, strmap_hash(key));
}

cJSON *kube_informer_get(const struct kube_informer *inf, const char *ns, const char *name)
{
	const struct entry *e = lookup(inf, ns, name);
	return e ? cJSON_ParseWithLength(e->text, e->len) : NULL;
}

const char *kube_informer_get_text(const struct kube_informer *inf, const char *ns,
                                   const char *name, size_t *len)
{
	const struct entry *e = lookup(inf, ns, name);
	if (!e)
		return NULL;
	if (len)
		*len = e->len;
	return e->text;
}

size_t kube_informer_len(const struct kube_informer *inf)
{
	return inf->len;
}

void kube_informer_foreach(const struct kube_informer *inf,
                           void (*fn)(const char *key, const char *json, size_t len, void *ud),
                           void *ud)
{
	for (size_t i = 0; i < inf->nbuckets; i++)
		for (struct entry *e = inf->buckets[i]; e; e = e->next)
			fn(e->key, e->text, e->len, ud);
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
