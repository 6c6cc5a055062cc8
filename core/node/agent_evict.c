/* The store's budget. Like the kubelet's image garbage collection, the
 * agent keeps its store's file system under a high threshold of usage
 * (bringing it down to a low one), keeps the store's caches under a cap,
 * and makes room for a pull that the room check refused, by evicting
 * extracted images that no pod on this node mounts. Which ones, in which
 * order, is the decision of gkm.store_budget (lua/gkm/store_budget.lua);
 * this file gathers the facts for it, checks its answer, takes the caches
 * that name an evicted image out of service, removes the image, and
 * reports each eviction: an Event on the cache, gkm_store_evictions_total,
 * and the cache's node status entry (Evicted, with the bytes freed).
 *
 * An evicted cache is pulled again when a pod on this node asks for it (the
 * CSI plugin refuses the mount and leaves a "wanted" file, cache_view.h;
 * the kubelet retries the mount), when the cache is edited (its spec, an
 * annotation), or when its digest changes; not merely because space is
 * free again, which would only evict it again.
 *
 * A pass: gather the facts (worker) -> plan (loop, Lua) -> take the caches
 * out of service (loop: their node record says Evicted, so the CSI plugin
 * mounts them no more, and their view's link goes) -> after EVICT_GRACE_MS,
 * which lets a mount that read the record just before finish and record
 * its use, remove each image unless a pod now uses it (worker) -> report
 * (loop). One pass at a time. */

#include "agent_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include "log.h"
#include "store.h"
#include "textfmt.h"

#define EVICT_GRACE_MS 5000
/* how often the asks for evicted caches are looked for */
#define WANT_POLL_MS 1000
/* an image in use is marked used (store_touch) at most this often */
#define TOUCH_EVERY_S 60
#define MIB(b) (((unsigned long long)(b) + (1ull << 20) - 1) >> 20)

static struct {
	struct metric *evictions, *evicted_bytes, *store_bytes, *used_percent;
} bm;

struct budget {
	bool running, again;
	/* the largest room a refused pull asked for since the last pass */
	uint64_t need_bytes, need_room;
	char need_cache[340];
	uint64_t want_timer, grace_timer;
	struct pass *waiting; /* out of service, waiting out the grace */
};

/* A cache as a pass sees it (a snapshot: the pass runs on workers). */
struct named {
	char key[320], ns[64], name[256];
	char digests[3][80]; /* its digest, store digest and view digest */
};

struct victim {
	char digest[80];
	uint64_t bytes;
	int rc;
	cJSON *regarding; /* the objects of the caches that name it, for Events */
};

struct pass {
	struct agent *a;
	struct named *caches;
	size_t ncaches;
	uint64_t need_bytes, need_room;
	char need_cache[340];
	int64_t now;
	cJSON *input; /* the policy's input */
	int rc;
	struct victim *victims;
	size_t nvictims;
	char reason[32], message[512];
};

/* "GKMCache ns/name" or "ClusterGKMCache name". */
static void describe(const char *ns, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s %s%s%s", *ns ? "GKMCache" : "ClusterGKMCache", ns, *ns ? "/" : "",
	         name);
}

static bool names(const struct named *c, const char *digest)
{
	for (size_t i = 0; i < 3; i++)
		if (!strcmp(c->digests[i], digest))
			return true;
	return false;
}

/* c's image: the digest it names, or the manifest digest the store holds
 * for it. */
static bool cache_names(const struct cache *c, const char *digest)
{
	return !strcmp(c->digest, digest) || !strcmp(c->store_digest, digest);
}

static void pass_free(struct pass *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nvictims; i++)
		cJSON_Delete(p->victims[i].regarding);
	free(p->victims);
	free(p->caches);
	cJSON_Delete(p->input);
	free(p);
}

/* ---- gathering the facts (worker) ---- */

struct gather {
	struct pass *p;
	cJSON *entries;
	uint64_t total;
	char (*used)[80]; /* digests pods mount */
	size_t nused;
};

static int used_digests(const char *run_dir, struct gather *g)
{
	struct cache_view_usage *list = NULL;
	size_t n = 0, pods = 0;
	int rc = cache_view_usage_list(run_dir, &list, &n);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		pods += list[i].npods;
	g->used = calloc(pods ? pods : 1, sizeof(*g->used));
	for (size_t i = 0; g->used && i < n; i++)
		for (size_t j = 0; j < list[i].npods; j++)
			if (!list[i].pods[j].fallback && list[i].pods[j].digest)
				snprintf(g->used[g->nused++], sizeof(g->used[0]), "%s",
				         list[i].pods[j].digest);
	cache_view_usage_list_free(list, n);
	return g->used ? 0 : -ENOMEM;
}

/* When a pod last started or stopped using c here: its usage file's time. */
static int64_t usage_time(const struct agent *a, const struct named *c)
{
	struct cache_view_usage_stamp st;
	if (cache_view_usage_stamp(a->run_dir, c->ns, c->name, &st) != 0)
		return 0;
	return (int64_t)(st.mtime_ns / 1000000000u);
}

static int entry_fact(void *ctx, const struct store_entry_info *e)
{
	struct gather *g = ctx;
	struct pass *p = g->p;
	cJSON *o = cJSON_CreateObject(), *caches = cJSON_CreateArray();
	if (!o || !caches || !cJSON_AddItemToArray(g->entries, o)) {
		cJSON_Delete(o);
		cJSON_Delete(caches);
		return -ENOMEM;
	}
	cJSON_AddItemToObject(o, "caches", caches);
	int64_t last = e->last_used;
	bool used = false;
	for (size_t i = 0; i < g->nused && !used; i++)
		used = !strcmp(g->used[i], e->digest);
	for (size_t i = 0; i < p->ncaches; i++) {
		char who[340];
		if (!names(&p->caches[i], e->digest))
			continue;
		describe(p->caches[i].ns, p->caches[i].name, who, sizeof(who));
		cJSON_AddItemToArray(caches, cJSON_CreateString(who));
		int64_t u = usage_time(p->a, &p->caches[i]);
		last = u > last ? u : last;
	}
	if (used) {
		/* kept in the store, so that it outlives the usage files (/run) */
		if (e->last_used + TOUCH_EVERY_S < p->now && store_touch(p->a->store, e->digest))
			log_warn("cannot mark a store entry used", "digest", e->digest);
		last = p->now;
	}
	cJSON_AddStringToObject(o, "digest", e->digest);
	cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
	cJSON_AddNumberToObject(o, "lastUsed", (double)last);
	cJSON_AddBoolToObject(o, "named", cJSON_GetArraySize(caches) > 0);
	cJSON_AddBoolToObject(o, "inUse", used);
	g->total += e->bytes;
	return 0;
}

static void gather_work(void *ud)
{
	struct pass *p = ud;
	struct agent *a = p->a;
	struct statvfs sv;
	struct gather g = {.p = p};
	cJSON *in = p->input = cJSON_CreateObject();
	if (!in || !(g.entries = cJSON_AddArrayToObject(in, "entries"))) {
		p->rc = -ENOMEM;
		return;
	}
	if (statvfs(store_root(a->store), &sv) != 0) {
		p->rc = -errno;
		return;
	}
	if ((p->rc = used_digests(a->run_dir, &g)) == 0)
		p->rc = store_each(a->store, entry_fact, &g);
	free(g.used);
	cJSON_AddNumberToObject(in, "now", (double)p->now);
	cJSON_AddNumberToObject(in, "highPercent", a->o.store_high_percent);
	cJSON_AddNumberToObject(in, "lowPercent", a->o.store_low_percent);
	cJSON_AddNumberToObject(in, "maxBytes", (double)a->o.store_max_bytes);
	cJSON_AddNumberToObject(in, "minAgeSeconds", a->o.store_min_age_s);
	cJSON *fs = cJSON_AddObjectToObject(in, "fs");
	cJSON_AddNumberToObject(fs, "sizeBytes", (double)sv.f_blocks * (double)sv.f_frsize);
	cJSON_AddNumberToObject(fs, "availableBytes", (double)sv.f_bavail * (double)sv.f_frsize);
	cJSON_AddNumberToObject(in, "storeBytes", (double)g.total);
	if (p->need_room || p->need_bytes) {
		cJSON *need = cJSON_AddObjectToObject(in, "need");
		cJSON_AddStringToObject(need, "cache", p->need_cache);
		cJSON_AddNumberToObject(need, "bytes", (double)p->need_bytes);
		cJSON_AddNumberToObject(need, "roomBytes", (double)p->need_room);
	}
}

/* ---- the plan (loop) ---- */

static int validate_plan(const cJSON *r, char *err, size_t errlen)
{
	const cJSON *evict = cJSON_GetObjectItemCaseSensitive(r, "evict"), *d;
	static const char *const strings[] = {"reason", "message"};
	if (!cJSON_IsObject(r) ||
	    !(cJSON_IsArray(evict) || (cJSON_IsObject(evict) && !evict->child))) {
		snprintf(err, errlen, "want {evict = {digest, ...}}");
		return -1;
	}
	cJSON_ArrayForEach(d, evict)
	{
		if (!cJSON_IsString(d) || !store_digest_valid(d->valuestring)) {
			snprintf(err, errlen, "evict: want digests");
			return -1;
		}
	}
	for (size_t i = 0; i < 2; i++) {
		const cJSON *s = cJSON_GetObjectItemCaseSensitive(r, strings[i]);
		if (s && !cJSON_IsString(s)) {
			snprintf(err, errlen, "%s must be a string", strings[i]);
			return -1;
		}
	}
	return 0;
}

static const cJSON *input_entry(const struct pass *p, const char *digest)
{
	const cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p->input, "entries"))
	{
		if (!strcmp(obj_str(e, "digest"), digest))
			return e;
	}
	return NULL;
}

/* A pull of the image runs or waits: it would link what is removed. */
static bool pulling(const struct agent *a, const char *digest)
{
	for (const struct cache *c = a->caches; c; c = c->next)
		if (cache_names(c, digest) && (c->pull.job.queued || c->pull.job.running))
			return true;
	return false;
}

/* The policy's victims, checked: each an entry of the input that no pod
 * uses, once. Anything else refuses the whole plan (-EINVAL, err says
 * why). An image a pull is about to link is left for the next pass. */
static int choose_victims(struct agent *a, struct pass *p, const cJSON *out, char *err,
                          size_t errlen)
{
	const cJSON *evict = cJSON_GetObjectItemCaseSensitive(out, "evict"), *d;
	size_t n = (size_t)cJSON_GetArraySize(evict);
	p->victims = calloc(n ? n : 1, sizeof(*p->victims));
	if (!p->victims)
		return -ENOMEM;
	cJSON_ArrayForEach(d, evict)
	{
		const cJSON *e = input_entry(p, d->valuestring);
		bool twice = false;
		for (size_t i = 0; i < p->nvictims && !twice; i++)
			twice = !strcmp(p->victims[i].digest, d->valuestring);
		if (!e || twice || !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(e, "inUse"))) {
			snprintf(err, errlen, "%s: %s", d->valuestring,
			         !e      ? "no such entry"
			         : twice ? "named twice"
			                 : "in use by a pod");
			return -EINVAL;
		}
		if (pulling(a, d->valuestring))
			continue;
		struct victim *v = &p->victims[p->nvictims++];
		snprintf(v->digest, sizeof(v->digest), "%s", d->valuestring);
		v->bytes =
		    (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "bytes"));
		v->regarding = cJSON_CreateArray();
	}
	snprintf(p->reason, sizeof(p->reason), "%s", obj_str(out, "reason"));
	snprintf(p->message, sizeof(p->message), "%s", obj_str(out, "message"));
	return 0;
}

/* What the node status and the Event say about an eviction. */
static void evicted_message(const struct agent *a, const char *image, uint64_t bytes,
                            const char *why, char *buf, size_t len)
{
	snprintf(buf, len,
	         "evicted from the store of node %s (%.19s, %llu MiB freed): %s; no pod here "
	         "used it; pulled again when a pod on this node mounts it, or when the cache is "
	         "edited",
	         a->node, image, MIB(bytes), why);
}

/* The node's record says Evicted: the CSI plugin mounts c no more and
 * tells a pod why (and asks for it, cache_view_want()). */
static void write_record(struct agent *a, struct cache *c)
{
	struct cache_view_ready r;
	memset(&r, 0, sizeof(r));
	snprintf(r.digest, sizeof(r.digest), "%.71s", c->digest);
	snprintf(r.state, sizeof(r.state), "Evicted");
	r.compatible = true;
	r.reason = c->evicted.reason;
	r.message = c->evicted.message;
	obj_now(r.updated, sizeof(r.updated));
	if (cache_view_record(a->root, c->ns, c->name, &r) == 0) {
		c->record = REC_OTHER;
	} else {
		agent_count_error("view");
		log_error("cannot write the cache's node record", "cache", c->key);
	}
}

/* Out of service: no new mount of the caches whose image v is. */
static void take_out(struct agent *a, struct pass *p, struct victim *v)
{
	for (struct cache *c = a->caches; c; c = c->next) {
		struct cache_eviction *ev = &c->evicted;
		if (!c->obj || !cache_names(c, v->digest))
			continue;
		memset(ev, 0, sizeof(*ev));
		ev->state = EV_REMOVING;
		ev->at = p->now;
		snprintf(ev->digest, sizeof(ev->digest), "%s", c->digest);
		snprintf(ev->image, sizeof(ev->image), "%s", v->digest);
		snprintf(ev->reason, sizeof(ev->reason), "%s", p->reason);
		snprintf(ev->message, sizeof(ev->message),
		         "being evicted from this node's store: %s", p->message);
		write_record(a, c);
		if (!strcmp(c->view_digest, v->digest)) {
			if (cache_view_unpublish(a->root, c->ns, c->name) == 0)
				c->view_digest[0] = '\0';
			write_record(a, c); /* unpublishing removed it */
		}
		cJSON_AddItemToArray(v->regarding, cJSON_Duplicate(c->obj, 1));
		agent_enqueue(a, c->key, 0);
	}
}

static void pass_end(struct agent *a, struct pass *p);
static void grace_over(struct loop *l, void *ud);

static void gather_done(struct loop *l, void *ud)
{
	struct pass *p = ud;
	struct agent *a = p->a;
	struct engine_error ee;
	cJSON *out = NULL;
	char err[512] = "";
	a->jobs--;
	if (a->stopping || p->rc || !a->policies->current) {
		if (p->rc && !a->stopping)
			log_warn("cannot measure the store", "error", strerror(-p->rc));
		pass_end(a, p);
		return;
	}
	metrics_set(bm.store_bytes, NULL,
	            cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p->input, "storeBytes")));
	if (engine_call_fn(a->policies->current, "gkm.store_budget", "plan", p->input,
	                   validate_plan, &out, &ee) != ENGINE_OK) {
		agent_count_error("policy");
		log_error("store budget policy failed", "error", ee.message);
		pass_end(a, p);
		return;
	}
	const cJSON *pct = cJSON_GetObjectItemCaseSensitive(out, "usagePercent");
	if (cJSON_IsNumber(pct))
		metrics_set(bm.used_percent, NULL, pct->valuedouble);
	int rc = choose_victims(a, p, out, err, sizeof(err));
	cJSON_Delete(out);
	if (rc || !p->nvictims) {
		if (rc) {
			agent_count_error("policy");
			log_error("store budget policy refused: it named what may not go", "error",
			          err);
		} else if (*p->reason) {
			log_warn("the store is over its budget; nothing is evicted", "reason",
			         p->reason, "why", p->message);
		}
		pass_end(a, p);
		return;
	}
	log_info("evicting unused images from the store", "reason", p->reason, "why", p->message);
	for (size_t i = 0; i < p->nvictims; i++)
		take_out(a, p, &p->victims[i]);
	a->budget->waiting = p;
	a->budget->grace_timer = loop_add_timer(l, EVICT_GRACE_MS, grace_over, a);
	if (!a->budget->grace_timer)
		grace_over(l, a);
}

/* ---- removal (worker) and report (loop) ---- */

static void remove_work(void *ud)
{
	struct pass *p = ud;
	struct agent *a = p->a;
	char msg[1024];
	for (size_t i = 0; i < p->nvictims; i++) {
		struct victim *v = &p->victims[i];
		struct store_entry_info e;
		bool used = true;
		if (cache_view_digest_in_use(a->run_dir, v->digest, &used) != 0 || used) {
			v->rc = -EBUSY; /* a pod mounted it meanwhile */
			continue;
		}
		if (store_lookup(a->store, v->digest, &e) == 0)
			v->bytes = e.bytes;
		if ((v->rc = store_remove(a->store, v->digest)) != 0)
			continue;
		const cJSON *obj;
		evicted_message(a, v->digest, v->bytes, p->message, msg, sizeof(msg));
		cJSON_ArrayForEach(obj, v->regarding)
		{
			/* best effort, like every Event: a failure is logged by the store */
			(void)a->os->ops->event(a->os, obj, "Normal", "Evicted", msg, NULL);
		}
	}
}

/* Pulls refused for room try again at once. */
static void retry_room_waiters(struct agent *a)
{
	for (struct cache *c = a->caches; c; c = c->next) {
		if (!c->pull.failures || strcmp(c->pull.reason, "InsufficientStorage") ||
		    c->pull.job.queued || c->pull.job.running)
			continue;
		agent_attempt_reset(a, &c->pull);
		agent_enqueue(a, c->key, 0);
	}
}

static void remove_done(struct loop *l, void *ud)
{
	struct pass *p = ud;
	struct agent *a = p->a;
	uint64_t freed = 0;
	(void)l;
	a->jobs--;
	for (size_t i = 0; i < p->nvictims && !a->stopping; i++) {
		struct victim *v = &p->victims[i];
		char mib[24];
		snprintf(mib, sizeof(mib), "%llu", MIB(v->bytes));
		if (v->rc == 0) {
			metrics_add(bm.evictions, METRICS_L(p->reason), 1);
			metrics_add(bm.evicted_bytes, METRICS_L(p->reason), (double)v->bytes);
			freed += v->bytes;
			log_info("evicted an image from the store", "digest", v->digest, "mib", mib,
			         "reason", p->reason);
		} else {
			log_warn("not evicted", "digest", v->digest, "error", strerror(-v->rc));
		}
		for (struct cache *c = a->caches; c; c = c->next) {
			struct cache_eviction *ev = &c->evicted;
			if (ev->state != EV_REMOVING || strcmp(ev->image, v->digest) != 0)
				continue;
			/* not removed: back in service (relinked) */
			ev->state = v->rc == 0 || v->rc == -ENOENT ? EV_DONE : EV_NONE;
			evicted_message(a, v->digest, v->bytes, p->message, ev->message,
			                sizeof(ev->message));
			agent_enqueue(a, c->key, 0);
		}
	}
	if (freed)
		retry_room_waiters(a);
	pass_end(a, p);
}

static void grace_over(struct loop *l, void *ud)
{
	struct agent *a = ud;
	struct pass *p = a->budget->waiting;
	(void)l;
	a->budget->grace_timer = 0;
	a->budget->waiting = NULL;
	a->jobs++;
	if (workers_submit(a->workers, remove_work, remove_done, p) != 0) {
		for (size_t i = 0; i < p->nvictims; i++)
			p->victims[i].rc = -ENOMEM;
		remove_done(l, p);
	}
}

static void pass_end(struct agent *a, struct pass *p)
{
	pass_free(p);
	if (!a->budget)
		return;
	a->budget->running = false;
	if (a->budget->again && !a->stopping) {
		a->budget->again = false;
		agent_budget_check(a);
	}
}

/* ---- starting a pass ---- */

static struct pass *pass_new(struct agent *a)
{
	struct budget *b = a->budget;
	struct pass *p = calloc(1, sizeof(*p));
	size_t n = 0;
	for (struct cache *c = a->caches; c; c = c->next)
		n++;
	if (!p || !(p->caches = calloc(n ? n : 1, sizeof(*p->caches)))) {
		free(p);
		return NULL;
	}
	p->a = a;
	p->now = (int64_t)time(NULL);
	for (struct cache *c = a->caches; c; c = c->next) {
		struct named *k = &p->caches[p->ncaches++];
		snprintf(k->key, sizeof(k->key), "%s", c->key);
		snprintf(k->ns, sizeof(k->ns), "%s", c->ns);
		snprintf(k->name, sizeof(k->name), "%s", c->name);
		snprintf(k->digests[0], sizeof(k->digests[0]), "%s", c->digest);
		snprintf(k->digests[1], sizeof(k->digests[1]), "%s", c->store_digest);
		snprintf(k->digests[2], sizeof(k->digests[2]), "%s", c->view_digest);
	}
	p->need_bytes = b->need_bytes;
	p->need_room = b->need_room;
	snprintf(p->need_cache, sizeof(p->need_cache), "%s", b->need_cache);
	b->need_bytes = b->need_room = 0;
	b->need_cache[0] = '\0';
	return p;
}

void agent_budget_check(struct agent *a)
{
	struct budget *b = a->budget;
	if (!b || a->stopping || !a->synced_caches || !a->synced_cluster)
		return;
	if (b->running) {
		b->again = true;
		return;
	}
	struct pass *p = pass_new(a);
	if (!p)
		return;
	b->running = true;
	a->jobs++;
	if (workers_submit(a->workers, gather_work, gather_done, p) != 0) {
		a->jobs--;
		b->running = false;
		pass_free(p);
	}
}

void agent_budget_need(struct agent *a, const char *key, uint64_t bytes, uint64_t room)
{
	struct budget *b = a->budget;
	const struct cache *c = agent_find_cache(a, key);
	if (!b || !c)
		return;
	if (room > b->need_room || bytes > b->need_bytes) {
		b->need_bytes = bytes;
		b->need_room = room;
		describe(c->ns, c->name, b->need_cache, sizeof(b->need_cache));
	}
	agent_budget_check(a);
}

static int add_bytes(void *ctx, const struct store_entry_info *e)
{
	*(uint64_t *)ctx += e->bytes;
	return 0;
}

int agent_budget_room(struct agent *a, uint64_t bytes, uint64_t *room, struct oci_err *err)
{
	/* an eighth more and 16 MiB for the file system's own blocks */
	uint64_t need = bytes + bytes / 8 + (16ull << 20), stored = 0;
	struct statvfs sv;
	*room = need;
	if (statvfs(store_root(a->store), &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < need) {
		oci_errf(err,
		         "the image's files take %llu MiB (label cache-size-bytes) and need about "
		         "%llu MiB in the store, which has %llu MiB free (%s); nothing was "
		         "downloaded; it is pulled once unused caches are evicted to make room, or "
		         "else tried again after a while",
		         (unsigned long long)bytes >> 20, (unsigned long long)need >> 20,
		         (unsigned long long)sv.f_bavail * sv.f_frsize >> 20, store_root(a->store));
		return -ENOSPC;
	}
	uint64_t cap = a->o.store_max_bytes;
	if (!cap || store_each(a->store, add_bytes, &stored) != 0 || stored + bytes <= cap)
		return 0;
	oci_errf(err,
	         "the image's files take %llu MiB (label cache-size-bytes); the store's caches "
	         "may take %llu MiB (--store-max-bytes) and take %llu MiB; nothing was "
	         "downloaded; it is pulled once unused caches are evicted to make room, or else "
	         "tried again after a while",
	         (unsigned long long)bytes >> 20, (unsigned long long)cap >> 20,
	         (unsigned long long)stored >> 20);
	return -ENOSPC;
}

/* ---- what the policy of each cache is told ---- */

/* After a restart: the node's record says whether c was evicted. */
static void restore(struct agent *a, struct cache *c)
{
	struct cache_eviction *ev = &c->evicted;
	struct cache_view_ready r;
	ev->state = EV_NONE;
	if (cache_view_ready_read(a->root, c->ns, c->name, &r, NULL, 0) != 0)
		return;
	if (!strcmp(r.state, "Evicted") && !strcmp(r.digest, c->digest) &&
	    store_lookup(a->store, c->digest, NULL) != 0) {
		ev->state = EV_DONE;
		snprintf(ev->digest, sizeof(ev->digest), "%s", c->digest);
		snprintf(ev->image, sizeof(ev->image), "%s", c->digest);
		snprintf(ev->reason, sizeof(ev->reason), "%s", r.reason);
		snprintf(ev->message, sizeof(ev->message), "%s", r.message);
		if (rfc3339_parse(r.updated, &ev->at) != 0)
			ev->at = (int64_t)time(NULL);
	}
	cache_view_ready_free(&r);
}

void agent_evict_input(struct agent *a, struct cache *c, cJSON *store, bool *present)
{
	struct cache_eviction *ev = &c->evicted;
	if (ev->state == EV_UNREAD && *c->digest)
		restore(a, c);
	if (ev->state != EV_REMOVING && ev->state != EV_DONE)
		return;
	if (strcmp(ev->digest, c->digest) != 0 || (ev->state == EV_DONE && *present)) {
		ev->state = EV_NONE; /* another digest, or pulled again */
		return;
	}
	*present = false;
	cJSON *o = cJSON_AddObjectToObject(store, "evicted");
	cJSON_AddStringToObject(o, "reason", ev->reason);
	cJSON_AddStringToObject(o, "message", ev->message);
	cJSON_AddBoolToObject(o, "wanted", ev->state == EV_DONE && ev->wanted);
}

void agent_evict_edited(struct cache *c)
{
	if (c->evicted.state == EV_DONE)
		c->evicted.wanted = true;
}

/* The CSI plugin's asks for evicted caches (cache_view_want()). */
static void want_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	for (struct cache *c = a->caches; c; c = c->next) {
		struct cache_eviction *ev = &c->evicted;
		int64_t at;
		if (ev->state != EV_DONE || ev->wanted ||
		    cache_view_wanted_at(a->run_dir, c->ns, c->name, &at) != 0 || at < ev->at)
			continue;
		ev->wanted = true;
		log_info("a pod asks for an evicted cache: pulling it again", "cache", c->key);
		agent_enqueue(a, c->key, 0);
	}
	a->budget->want_timer = loop_add_timer(l, WANT_POLL_MS, want_tick, a);
}

int agent_budget_start(struct agent *a)
{
	bm.evictions = metrics_counter(
	    "gkm_store_evictions_total",
	    "Images evicted from the node's store to keep it within its budget (no pod used them), "
	    "by what asked for the space",
	    "reason");
	bm.evicted_bytes =
	    metrics_counter("gkm_store_evicted_bytes_total",
	                    "Bytes of the files of the evicted images, by reason", "reason");
	bm.store_bytes = metrics_gauge(
	    "gkm_store_bytes", "Bytes of the files of every image in the node's store", NULL);
	bm.used_percent = metrics_gauge("gkm_store_filesystem_used_percent",
	                                "How full the store's file system is, in percent, as "
	                                "compared with --store-high-percent",
	                                NULL);
	if (!(a->budget = calloc(1, sizeof(*a->budget))))
		return -ENOMEM;
	a->budget->want_timer = loop_add_timer(a->loop, WANT_POLL_MS, want_tick, a);
	return 0;
}

void agent_budget_stop(struct agent *a)
{
	struct budget *b = a->budget;
	if (!b)
		return;
	if (b->want_timer)
		loop_cancel_timer(a->loop, b->want_timer);
	if (b->grace_timer)
		loop_cancel_timer(a->loop, b->grace_timer);
	pass_free(b->waiting);
	free(b);
	a->budget = NULL;
}
