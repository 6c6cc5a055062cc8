/* Lua-reconciled controllers: informers -> work queue -> reconcile -> actions (see
 * kube_controller.h). */
#include "kube_controller.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "kube_selector.h"
#include "log.h"
#include "metrics.h"

#define KICK_BATCH 32
#define MAP_MAX_KEYS 1024
#define KEY_MAX 512

enum enqueue { EQ_SELF, EQ_OWNER, EQ_MAP, EQ_NONE };

struct cwatch {
	struct kube_controller *c;
	int index; /* 1-based, as Lua numbers watches */
	char api_version[160];
	struct kube_resource res;
	char *ns, *label_selector, *field_selector;
	enum enqueue enqueue;
	unsigned debounce_ms, resync_s;
	uint64_t resync_timer;
	struct kube_informer *inf;
	bool synced;
};

struct kube_controller {
	struct kube_controller_opts o;
	char *module, *field_manager, *component, *host;
	cJSON *config;
	struct cwatch watches[KUBE_CONTROLLER_MAX_WATCHES];
	size_t nwatches;
	struct kube_workqueue *q;
	atomic_int refs; /* the owner, each posted kick, timer and job */
	bool stopped, synced, kick_posted;
	uint64_t timer_id, timer_due;
	struct kube_controller_stats st;
};

struct kube_reconcile {
	struct kube_controller *c;
	cJSON *actions;
};

/* Set for the duration of one reconcile call (loop thread). */
static __thread struct kube_reconcile *current;

struct job {
	struct kube_controller *c;
	char *key;
	cJSON *actions;
	double requeue_after;
	bool requeue;
	bool failed;
	unsigned retry_after_s;
};

static struct metric *m_reconciles(void)
{
	return metrics_counter("gkm_reconciles_total", "Reconciles by controller and result",
	                       "controller,result");
}

static struct metric *m_actions(void)
{
	return metrics_counter(
	    "gkm_kube_actions_total",
	    "Kubernetes writes queued by reconciles, by controller, operation and result",
	    "controller,op,result");
}

/* ---- validation of what Lua returns ---- */

static bool only_keys(const cJSON *o, const char *const *allowed, char *err, size_t errlen,
                      const char *where)
{
	const cJSON *it;
	cJSON_ArrayForEach(it, o)
	{
		bool ok = false;
		for (const char *const *a = allowed; *a; a++)
			if (!strcmp(it->string, *a))
				ok = true;
		if (!ok) {
			errbuf_set(err, errlen, "%s: unknown field '%s'", where, it->string);
			return false;
		}
	}
	return true;
}

static bool num_in(const cJSON *v, double lo, double hi)
{
	return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi;
}

static int validate_watches(const cJSON *r, char *err, size_t errlen)
{
	static const char *const keys[] = {"apiVersion",    "kind",          "namespace",
	                                   "labelSelector", "fieldSelector", "enqueue",
	                                   "debounce_ms",   "resync_s",      NULL};
	int n = cJSON_GetArraySize(r);
	if (!cJSON_IsArray(r) || n < 1 || n > KUBE_CONTROLLER_MAX_WATCHES) {
		errbuf_set(err, errlen, "watches() must return a list of 1 to %d watches",
		           KUBE_CONTROLLER_MAX_WATCHES);
		return -1;
	}
	int i = 0;
	const cJSON *w;
	cJSON_ArrayForEach(w, r)
	{
		char where[32];
		snprintf(where, sizeof(where), "watch %d", ++i);
		if (!cJSON_IsObject(w)) {
			errbuf_set(err, errlen, "%s: not a table", where);
			return -1;
		}
		if (!only_keys(w, keys, err, errlen, where))
			return -1;
		const cJSON *av = cJSON_GetObjectItemCaseSensitive(w, "apiVersion");
		const cJSON *k = cJSON_GetObjectItemCaseSensitive(w, "kind");
		if (!cJSON_IsString(av) || !cJSON_IsString(k) || !*k->valuestring) {
			errbuf_set(err, errlen, "%s: apiVersion and kind must be strings", where);
			return -1;
		}
		const cJSON *ns = cJSON_GetObjectItemCaseSensitive(w, "namespace");
		const cJSON *ls = cJSON_GetObjectItemCaseSensitive(w, "labelSelector");
		const cJSON *fs = cJSON_GetObjectItemCaseSensitive(w, "fieldSelector");
		const cJSON *eq = cJSON_GetObjectItemCaseSensitive(w, "enqueue");
		const cJSON *db = cJSON_GetObjectItemCaseSensitive(w, "debounce_ms");
		const cJSON *rs = cJSON_GetObjectItemCaseSensitive(w, "resync_s");
		if ((ns && !cJSON_IsString(ns)) || (fs && !cJSON_IsString(fs)) ||
		    (ls && !cJSON_IsString(ls) && !cJSON_IsObject(ls))) {
			errbuf_set(err, errlen,
			           "%s: namespace and fieldSelector must be strings, "
			           "labelSelector a string or a map",
			           where);
			return -1;
		}
		if (eq && (!cJSON_IsString(eq) ||
		           (strcmp(eq->valuestring, "self") && strcmp(eq->valuestring, "owner") &&
		            strcmp(eq->valuestring, "map") && strcmp(eq->valuestring, "none")))) {
			errbuf_set(err, errlen,
			           "%s: enqueue must be \"self\", \"owner\", \"map\" or \"none\"",
			           where);
			return -1;
		}
		if ((db && !num_in(db, 0, 3600000)) || (rs && !num_in(rs, 0, 86400))) {
			errbuf_set(err, errlen,
			           "%s: debounce_ms must be 0..3600000 and resync_s 0..86400",
			           where);
			return -1;
		}
	}
	return 0;
}

static int validate_result(const cJSON *r, char *err, size_t errlen)
{
	static const char *const keys[] = {"requeue_after", "requeue", NULL};
	if (!r || cJSON_IsNull(r))
		return 0;
	if (!cJSON_IsObject(r)) {
		errbuf_set(err, errlen, "reconcile must return nil or a table");
		return -1;
	}
	if (!only_keys(r, keys, err, errlen, "reconcile result"))
		return -1;
	const cJSON *ra = cJSON_GetObjectItemCaseSensitive(r, "requeue_after");
	const cJSON *rq = cJSON_GetObjectItemCaseSensitive(r, "requeue");
	if (ra && !num_in(ra, 0, 86400)) {
		errbuf_set(err, errlen,
		           "requeue_after must be a number of seconds from 0 to 86400");
		return -1;
	}
	if (rq && !cJSON_IsBool(rq)) {
		errbuf_set(err, errlen, "requeue must be a boolean");
		return -1;
	}
	return 0;
}

static bool key_ok(const char *k)
{
	size_t n = strlen(k);
	const char *slash = strchr(k, '/');
	return n > 0 && n <= KEY_MAX &&
	       (!slash || (slash != k && slash[1] && !strchr(slash + 1, '/')));
}

static int validate_keys(const cJSON *r, char *err, size_t errlen)
{
	if (cJSON_IsNull(r) || (cJSON_IsObject(r) && !r->child))
		return 0; /* nil or {}: nothing to enqueue */
	if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) > MAP_MAX_KEYS) {
		errbuf_set(err, errlen, "map must return a list of at most %d keys", MAP_MAX_KEYS);
		return -1;
	}
	const cJSON *k;
	cJSON_ArrayForEach(k, r)
	{
		if (!cJSON_IsString(k) || !key_ok(k->valuestring)) {
			errbuf_set(err, errlen,
			           "map returned a key that is not \"namespace/name\" or \"name\"");
			return -1;
		}
	}
	return 0;
}

/* ---- references ---- */

static void release(struct kube_controller *c)
{
	for (size_t i = 0; i < c->nwatches; i++) {
		free(c->watches[i].ns);
		free(c->watches[i].label_selector);
		free(c->watches[i].field_selector);
	}
	kube_workqueue_free(c->q);
	cJSON_Delete(c->config);
	free(c->module);
	free(c->field_manager);
	free(c->component);
	free(c->host);
	free(c);
}

static void unref(struct kube_controller *c)
{
	if (atomic_fetch_sub(&c->refs, 1) == 1)
		release(c);
}

/* ---- scheduling ---- */

static void kick(struct loop *l, void *ud);

static void schedule(struct kube_controller *c)
{
	if (c->kick_posted || c->stopped)
		return;
	atomic_fetch_add(&c->refs, 1);
	if (loop_post(c->o.loop, kick, c) < 0) {
		unref(c);
		return;
	}
	c->kick_posted = true;
}

static void on_timer(struct loop *l, void *ud)
{
	(void)l;
	struct kube_controller *c = ud;
	c->timer_id = 0;
	schedule(c);
	unref(c);
}

static void arm_timer(struct kube_controller *c)
{
	uint64_t due = kube_workqueue_next_due(c->q);
	if (due == UINT64_MAX || c->stopped)
		return;
	if (c->timer_id && c->timer_due <= due)
		return;
	if (c->timer_id) {
		loop_cancel_timer(c->o.loop, c->timer_id);
		c->timer_id = 0;
		unref(c);
	}
	uint64_t now = loop_now_ms();
	atomic_fetch_add(&c->refs, 1);
	c->timer_id = loop_add_timer(c->o.loop, due > now ? due - now : 0, on_timer, c);
	if (!c->timer_id) {
		unref(c);
		return;
	}
	c->timer_due = due;
}

static void enqueue_key(struct cwatch *w, const char *key)
{
	struct kube_controller *c = w->c;
	if (!key_ok(key))
		return;
	if (w->debounce_ms)
		kube_workqueue_add_after(c->q, key, w->debounce_ms, loop_now_ms());
	else
		kube_workqueue_add(c->q, key);
}

static const char *primary_group(const struct kube_controller *c)
{
	return c->watches[0].res.group;
}

/* The group of an ownerReference's apiVersion equals the primary's. */
static bool same_group(const struct kube_controller *c, const char *av)
{
	const char *slash = av ? strchr(av, '/') : NULL;
	const char *g = primary_group(c);
	if (!slash)
		return !*g;
	return strlen(g) == (size_t)(slash - av) && !strncmp(av, g, (size_t)(slash - av));
}

static void enqueue_mapped(struct cwatch *w, enum kube_event_type t, const cJSON *obj)
{
	struct kube_controller *c = w->c;
	struct engine *e = c->o.engine->current;
	if (!e)
		return;
	cJSON *in = cJSON_CreateObject();
	if (!in)
		return;
	cJSON_AddNumberToObject(in, "watch", w->index);
	cJSON_AddStringToObject(in, "type", kube_event_type_name(t));
	cJSON_AddItemReferenceToObject(in, "object", (cJSON *)obj);
	cJSON *out = NULL;
	struct engine_error err;
	engine_ref(e);
	enum engine_status st = engine_call_fn(e, c->module, "map", in, validate_keys, &out, &err);
	engine_unref(e);
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		log_warn("kube: controller map failed; event not enqueued", "controller", c->module,
		         "error", err.message);
		return;
	}
	const cJSON *k;
	cJSON_ArrayForEach(k, out) enqueue_key(w, k->valuestring);
	cJSON_Delete(out);
}

static void enqueue_for(struct cwatch *w, enum kube_event_type t, const cJSON *obj)
{
	struct kube_controller *c = w->c;
	char key[KEY_MAX + 2];
	switch (w->enqueue) {
	case EQ_SELF:
		if (kube_informer_key(obj, key, sizeof(key)) == 0)
			enqueue_key(w, key);
		break;
	case EQ_OWNER: {
		const cJSON *refs = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "ownerReferences");
		const char *ns = kube_obj_namespace(obj);
		const cJSON *ref;
		cJSON_ArrayForEach(ref, refs)
		{
			const char *kind = kube_obj_str(ref, NULL, "kind");
			const char *name = kube_obj_str(ref, NULL, "name");
			if (!kind || !name || strcmp(kind, c->watches[0].res.kind) ||
			    !same_group(c, kube_obj_str(ref, NULL, "apiVersion")))
				continue;
			if (c->watches[0].res.namespaced && ns)
				snprintf(key, sizeof(key), "%s/%s", ns, name);
			else
				snprintf(key, sizeof(key), "%s", name);
			enqueue_key(w, key);
		}
		break;
	}
	case EQ_MAP:
		enqueue_mapped(w, t, obj);
		break;
	default:
		break;
	}
}

static void on_change(struct kube_informer *inf, enum kube_event_type t, const cJSON *obj, void *ud)
{
	(void)inf;
	struct cwatch *w = ud;
	if (w->c->stopped)
		return;
	enqueue_for(w, t, obj);
	if (w->c->synced)
		schedule(w->c);
}

static void on_synced(struct kube_informer *inf, void *ud)
{
	(void)inf;
	struct cwatch *w = ud;
	struct kube_controller *c = w->c;
	w->synced = true;
	for (size_t i = 0; i < c->nwatches; i++)
		if (!c->watches[i].synced)
			return;
	c->synced = true;
	log_info("kube: controller caches synced, reconciling", "controller", c->module);
	schedule(c);
}

static void resync_one(const char *key, const char *json, size_t len, void *ud)
{
	struct cwatch *w = ud;
	if (w->enqueue == EQ_SELF) {
		enqueue_key(w, key);
		return;
	}
	cJSON *obj = cJSON_ParseWithLength(json, len);
	if (obj)
		enqueue_for(w, KUBE_MODIFIED, obj);
	cJSON_Delete(obj);
}

static void on_resync(struct loop *l, void *ud)
{
	struct cwatch *w = ud;
	struct kube_controller *c = w->c;
	w->resync_timer = 0;
	if (!c->stopped) {
		kube_informer_foreach(w->inf, resync_one, w);
		schedule(c);
		atomic_fetch_add(&c->refs, 1);
		w->resync_timer = loop_add_timer(l, (uint64_t)w->resync_s * 1000, on_resync, w);
		if (!w->resync_timer)
			unref(c);
	}
	unref(c);
}

/* ---- actions (worker threads) ---- */

static int run_action(struct kube_controller *c, const cJSON *a, unsigned *retry_after)
{
	struct kube_error e;
	memset(&e, 0, sizeof(e));
	const char *op = kube_obj_str(a, NULL, "op");
	int rc = -EINVAL;
	if (!strcmp(op, "event")) {
		struct kube_event ev = {
		    .regarding = cJSON_GetObjectItemCaseSensitive(a, "regarding"),
		    .type = kube_obj_str(a, NULL, "type"),
		    .reason = kube_obj_str(a, NULL, "reason"),
		    .message = kube_obj_str(a, NULL, "message"),
		    .component = c->component,
		    .host = c->host,
		};
		rc = kube_client_event(c->o.client, &ev, &e);
		if (rc < 0) /* an Event that cannot be written is no reason to retry */
			log_warn("kube: cannot record an Event", "controller", c->module, "reason",
			         ev.reason ? ev.reason : "", "error", e.message);
		return 0;
	}
	const cJSON *obj = cJSON_GetObjectItemCaseSensitive(a, "object");
	const char *av = !strcmp(op, "delete") ? kube_obj_str(a, NULL, "apiVersion")
	                                       : kube_obj_str(obj, NULL, "apiVersion");
	const char *kind =
	    !strcmp(op, "delete") ? kube_obj_str(a, NULL, "kind") : kube_obj_str(obj, NULL, "kind");
	struct kube_resource r;
	rc = kube_client_resource(c->o.client, av, kind, &r, &e);
	if (rc == 0 && !strcmp(op, "apply")) {
		struct kube_apply_opts ao = {
		    .field_manager = c->field_manager,
		    .force = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(a, "force")),
		    .status = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "status")),
		};
		rc = kube_client_apply(c->o.client, &r, NULL, NULL, obj, &ao, NULL, &e);
	} else if (rc == 0 && !strcmp(op, "delete")) {
		struct kube_delete_opts d = {
		    .uid = kube_obj_str(a, NULL, "uid"),
		    .resource_version = kube_obj_str(a, NULL, "resourceVersion"),
		    .propagation = kube_obj_str(a, NULL, "propagation"),
		};
		rc = kube_client_delete(c->o.client, &r, kube_obj_str(a, NULL, "namespace"),
		                        kube_obj_str(a, NULL, "name"), &d, &e);
		if (rc == -ENOENT)
			rc = 0; /* already gone: what was wanted */
	}
	if (rc < 0) {
		*retry_after = e.retry_after_s;
		log_warn("kube: controller action failed", "controller", c->module, "op", op,
		         "kind", kind ? kind : "", "error", e.message);
	}
	return rc;
}

static void job_work(void *ud)
{
	struct job *j = ud;
	const cJSON *a;
	cJSON_ArrayForEach(a, j->actions)
	{
		unsigned ra = 0;
		bool ok = run_action(j->c, a, &ra) == 0;
		metrics_add(
		    m_actions(),
		    METRICS_L(j->c->module, kube_obj_str(a, NULL, "op"), ok ? "ok" : "error"), 1);
		if (!ok) {
			/* later actions may depend on this one: the whole reconcile is retried */
			j->failed = true;
			j->retry_after_s = ra;
			break;
		}
	}
}

static void finish(struct kube_controller *c, const char *key, bool failed, unsigned retry_after_s,
                   double requeue_after, bool requeue)
{
	uint64_t now = loop_now_ms();
	if (failed) {
		c->st.requeues++;
		kube_workqueue_add_rate_limited_min(c->q, key, (uint64_t)retry_after_s * 1000, now);
	} else {
		kube_workqueue_forget(c->q, key);
		if (requeue_after > 0)
			kube_workqueue_add_after(c->q, key, (uint64_t)(requeue_after * 1000.0),
			                         now);
		else if (requeue)
			kube_workqueue_add_rate_limited(c->q, key, now);
	}
	kube_workqueue_done(c->q, key);
	schedule(c);
}

static void job_done(struct loop *l, void *ud)
{
	(void)l;
	struct job *j = ud;
	struct kube_controller *c = j->c;
	if (!c->stopped) {
		if (j->failed)
			c->st.action_errors++;
		finish(c, j->key, j->failed, j->retry_after_s, j->requeue_after, j->requeue);
	}
	cJSON_Delete(j->actions);
	free(j->key);
	free(j);
	unref(c);
}

/* ---- reconcile (loop thread) ---- */

static cJSON *request_for(struct kube_controller *c, const char *key)
{
	cJSON *in = cJSON_CreateObject();
	if (!in)
		return NULL;
	const char *slash = strchr(key, '/');
	char ns[KEY_MAX + 1] = "";
	const char *name = key;
	if (slash) {
		snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key), key);
		name = slash + 1;
	}
	cJSON_AddStringToObject(in, "key", key);
	if (*ns)
		cJSON_AddStringToObject(in, "namespace", ns);
	cJSON_AddStringToObject(in, "name", name);
	cJSON *obj = kube_informer_get(c->watches[0].inf, *ns ? ns : NULL, name);
	if (obj)
		cJSON_AddItemToObject(in, "object", obj);
	if (c->config)
		cJSON_AddItemReferenceToObject(in, "config", c->config);
	return in;
}

static void reconcile(struct kube_controller *c, const char *key)
{
	c->st.reconciles++;
	struct kube_reconcile r = {.c = c, .actions = cJSON_CreateArray()};
	cJSON *in = request_for(c, key);
	cJSON *out = NULL;
	struct engine_error err = {.status = ENGINE_ERROR, .message = "out of memory"};
	enum engine_status st = ENGINE_ERROR;
	struct engine *e = c->o.engine->current;
	if (!e)
		snprintf(err.message, sizeof(err.message), "no policy engine loaded");
	if (e && in && r.actions) {
		engine_ref(e);
		current = &r;
		st = engine_call_fn(e, c->module, "reconcile", in, validate_result, &out, &err);
		current = NULL;
		engine_unref(e);
	}
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		c->st.reconcile_errors++;
		metrics_add(m_reconciles(), METRICS_L(c->module, engine_status_name(st)), 1);
		log_warn("kube: reconcile failed, retrying with backoff", "controller", c->module,
		         "key", key, "status", engine_status_name(st), "error", err.message);
		cJSON_Delete(r.actions);
		finish(c, key, true, 0, 0, false);
		return;
	}
	metrics_add(m_reconciles(), METRICS_L(c->module, "ok"), 1);
	const cJSON *ra = cJSON_GetObjectItemCaseSensitive(out, "requeue_after");
	double requeue_after = cJSON_IsNumber(ra) ? ra->valuedouble : 0;
	bool requeue = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(out, "requeue"));
	cJSON_Delete(out);
	if (cJSON_GetArraySize(r.actions) == 0) {
		cJSON_Delete(r.actions);
		finish(c, key, false, 0, requeue_after, requeue);
		return;
	}
	c->st.actions += (uint64_t)cJSON_GetArraySize(r.actions);
	struct job *j = calloc(1, sizeof(*j));
	if (j)
		j->key = strdup(key);
	if (!j || !j->key) {
		free(j);
		cJSON_Delete(r.actions);
		finish(c, key, true, 0, 0, false);
		return;
	}
	j->c = c;
	j->actions = r.actions;
	j->requeue_after = requeue_after;
	j->requeue = requeue;
	atomic_fetch_add(&c->refs, 1);
	if (workers_submit(c->o.workers, job_work, job_done, j) < 0) {
		cJSON_Delete(j->actions);
		free(j->key);
		free(j);
		unref(c);
		finish(c, key, true, 0, 0, false);
	}
	/* the key stays in flight until job_done */
}

static void kick(struct loop *l, void *ud)
{
	(void)l;
	struct kube_controller *c = ud;
	c->kick_posted = false;
	if (!c->stopped && c->synced) {
		uint64_t now = loop_now_ms();
		for (int i = 0; i < KICK_BATCH; i++) {
			const char *key = kube_workqueue_get(c->q, now);
			if (!key)
				break;
			/* the queue owns key until done: reconcile copies what it keeps */
			char k[KEY_MAX + 1];
			snprintf(k, sizeof(k), "%s", key);
			reconcile(c, k);
		}
		if (kube_workqueue_ready(c->q) &&
		    kube_workqueue_in_flight(c->q) <
		        (c->o.queue.max_in_flight ? c->o.queue.max_in_flight : 4))
			schedule(c); /* more, after other work on the loop had a turn */
		arm_timer(c);
	}
	unref(c);
}

/* ---- for gkm.kube ---- */

struct kube_reconcile *kube_reconcile_current(void)
{
	return current;
}

size_t kube_reconcile_informers(struct kube_reconcile *r, const char *api_version, const char *kind,
                                struct kube_informer **out, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < r->c->nwatches && n < max; i++) {
		const struct cwatch *w = &r->c->watches[i];
		if (strcmp(w->res.kind, kind) ||
		    (api_version && strcmp(w->api_version, api_version)))
			continue;
		out[n++] = w->inf;
	}
	return n;
}

int kube_reconcile_add_action(struct kube_reconcile *r, cJSON *action)
{
	if (cJSON_GetArraySize(r->actions) >= KUBE_CONTROLLER_MAX_ACTIONS) {
		cJSON_Delete(action);
		return -E2BIG;
	}
	cJSON_AddItemToArray(r->actions, action);
	return 0;
}

/* ---- start / stop ---- */

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static int setup_watch(struct kube_controller *c, int index, const cJSON *w, char *err,
                       size_t errlen)
{
	struct cwatch *cw = &c->watches[c->nwatches];
	memset(cw, 0, sizeof(*cw));
	cw->c = c;
	cw->index = index;
	const char *av = kube_obj_str(w, NULL, "apiVersion"), *kind = kube_obj_str(w, NULL, "kind");
	snprintf(cw->api_version, sizeof(cw->api_version), "%s", av);
	struct kube_error ke;
	int rc = kube_client_resource(c->o.client, av, kind, &cw->res, &ke);
	if (rc < 0) {
		errbuf_set(err, errlen, "watch %d (%s %s): %s", index, av, kind, ke.message);
		return rc;
	}
	const cJSON *ls = cJSON_GetObjectItemCaseSensitive(w, "labelSelector");
	char serr[256];
	if (cJSON_IsObject(ls)) {
		rc = kube_selector_from_map(ls, &cw->label_selector, serr, sizeof(serr));
	} else if (cJSON_IsString(ls)) {
		struct kube_selector *sel = NULL;
		rc = kube_selector_parse(ls->valuestring, &sel, serr, sizeof(serr));
		kube_selector_free(sel);
		if (rc == 0 && !(cw->label_selector = strdup(ls->valuestring)))
			rc = -ENOMEM;
	}
	if (rc < 0) {
		errbuf_set(err, errlen, "watch %d: %s", index, serr);
		return rc;
	}
	cw->ns = dup_or_null(kube_obj_str(w, NULL, "namespace"));
	cw->field_selector = dup_or_null(kube_obj_str(w, NULL, "fieldSelector"));
	const char *eq = kube_obj_str(w, NULL, "enqueue");
	cw->enqueue = !eq                    ? (index == 1 ? EQ_SELF : EQ_NONE)
	              : !strcmp(eq, "self")  ? EQ_SELF
	              : !strcmp(eq, "owner") ? EQ_OWNER
	              : !strcmp(eq, "map")   ? EQ_MAP
	                                     : EQ_NONE;
	const cJSON *db = cJSON_GetObjectItemCaseSensitive(w, "debounce_ms");
	const cJSON *rs = cJSON_GetObjectItemCaseSensitive(w, "resync_s");
	cw->debounce_ms = cJSON_IsNumber(db) ? (unsigned)db->valuedouble : 0;
	cw->resync_s = cJSON_IsNumber(rs) ? (unsigned)rs->valuedouble : 0;
	c->nwatches++;
	return 0;
}

int kube_controller_start(const struct kube_controller_opts *o, struct kube_controller **out,
                          char *err, size_t errlen)
{
	if (!o->loop || !o->workers || !o->client || !o->engine || !o->module ||
	    !o->field_manager) {
		errbuf_set(
		    err, errlen,
		    "controller: loop, workers, client, engine, module and field manager are "
		    "required");
		return -EINVAL;
	}
	if (!o->engine->current) {
		errbuf_set(err, errlen, "controller %s: no policy engine loaded", o->module);
		return -EINVAL;
	}
	struct kube_controller *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	atomic_init(&c->refs, 1);
	c->o = *o;
	int rc = -ENOMEM;
	c->module = strdup(o->module);
	c->field_manager = strdup(o->field_manager);
	c->component = strdup(o->component ? o->component : o->field_manager);
	c->host = dup_or_null(o->host);
	c->config = o->config ? cJSON_Duplicate(o->config, true) : cJSON_CreateObject();
	if (!c->module || !c->field_manager || !c->component || (o->host && !c->host) || !c->config)
		goto fail;
	c->o.module = c->module;
	c->o.field_manager = c->field_manager;
	c->o.component = c->component;
	c->o.host = c->host;
	c->o.config = c->config;
	if ((rc = kube_workqueue_new(&o->queue, &c->q)) < 0)
		goto fail;

	cJSON *watches = NULL;
	struct engine_error ee;
	struct engine *e = engine_ref(o->engine->current);
	enum engine_status st =
	    engine_call_fn(e, c->module, "watches", c->config, validate_watches, &watches, &ee);
	engine_unref(e);
	if (st != ENGINE_OK) {
		errbuf_set(err, errlen, "controller %s: %s", c->module, ee.message);
		rc = -EINVAL;
		goto fail;
	}
	int index = 0;
	const cJSON *w;
	cJSON_ArrayForEach(w, watches)
	{
		if ((rc = setup_watch(c, ++index, w, err, errlen)) < 0) {
			cJSON_Delete(watches);
			goto fail;
		}
	}
	cJSON_Delete(watches);
	for (size_t i = 0; i < c->nwatches; i++) {
		struct cwatch *cw = &c->watches[i];
		struct kube_informer_opts io = {
		    .watch = {.resource = cw->res,
		              .ns = cw->ns,
		              .label_selector = cw->label_selector,
		              .field_selector = cw->field_selector},
		    .loop = c->o.loop,
		    .on_change = on_change,
		    .on_synced = on_synced,
		    .ud = cw,
		};
		if ((rc = kube_informer_start(c->o.client, &io, &cw->inf)) < 0) {
			errbuf_set(err, errlen, "controller %s: cannot start watch %zu: %s",
			           c->module, i + 1, strerror(-rc));
			goto fail;
		}
		if (cw->resync_s) {
			atomic_fetch_add(&c->refs, 1);
			cw->resync_timer =
			    loop_add_timer(c->o.loop, (uint64_t)cw->resync_s * 1000, on_resync, cw);
			if (!cw->resync_timer)
				unref(c);
		}
	}
	log_info("kube: controller started", "controller", c->module, "field_manager",
	         c->field_manager);
	*out = c;
	return 0;
fail:
	kube_controller_stop(c);
	return rc;
}

void kube_controller_stop(struct kube_controller *c)
{
	if (!c)
		return;
	c->stopped = true;
	for (size_t i = 0; i < c->nwatches; i++) {
		struct cwatch *w = &c->watches[i];
		kube_informer_stop(w->inf);
		w->inf = NULL;
		if (w->resync_timer) {
			loop_cancel_timer(c->o.loop, w->resync_timer);
			w->resync_timer = 0;
			unref(c);
		}
	}
	if (c->timer_id) {
		loop_cancel_timer(c->o.loop, c->timer_id);
		c->timer_id = 0;
		unref(c);
	}
	unref(c); /* posted kicks and running jobs hold the rest */
}

struct kube_controller_stats kube_controller_stats(const struct kube_controller *c)
{
	return c->st;
}

bool kube_controller_synced(const struct kube_controller *c)
{
	return c->synced;
}
