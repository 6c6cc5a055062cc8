#include "operator.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "oci_repo.h"

#define MANAGER "gkm-operator"
#define CLUSTER_SCOPE "_cluster"

struct ocache {
	struct ocache *next;
	char key[320]; /* "<ns or _cluster>/<name>" */
	char ns[64], name[256];
	cJSON *obj;
	cJSON *applied; /* the status last written (without lastUpdated) */
	bool dirty, writing, resolving;
	char resolved[144]; /* digest the operator resolved for resolved_for */
	char resolved_for[600];
	char resolve_error[512];
};

struct onode {
	struct onode *next;
	char key[320]; /* "<ns or _cluster>/<node>" */
	char ns[64], node[256];
	cJSON *caches; /* status.caches */
};

struct operator_ {
	struct loop *loop;
	struct workers *workers;
	struct objstore *os;
	struct engine_slot *policies;
	struct operator_opts o;
	struct ocache *caches;
	struct onode *nodeobjs;
	cJSON *nodes; /* Kubernetes Node names (object of name -> true), when watched */
	uint64_t flush_timer, resync_timer;
	unsigned synced, want_synced;
	bool stopping;
	unsigned long writes, skipped;
};

static struct metric *m_reconciles, *m_writes, *m_errors;

/* kind: policy, status_write, resolve, cleanup */
static void count_error(const char *kind)
{
	metrics_add(m_errors, METRICS_L(kind), 1);
}

static void init_metrics(void)
{
	m_reconciles = metrics_counter("gkm_operator_reconciles_total",
	                               "Operator aggregations of a cache, by result", "result");
	m_writes = metrics_counter("gkm_operator_status_writes_total",
	                           "Cache status writes, by result (written, unchanged, failed)",
	                           "result");
	m_errors = metrics_counter(
	    "gkm_operator_errors_total",
	    "Operator failures, by kind (policy, status_write, resolve, cleanup)", "kind");
}

static struct ocache *find_cache(struct operator_ *op, const char *key, bool create)
{
	for (struct ocache *c = op->caches; c; c = c->next)
		if (!strcmp(c->key, key))
			return c;
	if (!create)
		return NULL;
	struct ocache *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	snprintf(c->key, sizeof(c->key), "%s", key);
	char *slash = strchr(c->key, '/');
	snprintf(c->ns, sizeof(c->ns), "%.*s", (int)(slash - c->key), c->key);
	if (!strcmp(c->ns, CLUSTER_SCOPE))
		c->ns[0] = '\0';
	snprintf(c->name, sizeof(c->name), "%s", slash + 1);
	c->next = op->caches;
	op->caches = c;
	return c;
}

static void flush(struct loop *l, void *ud);

/* A cache deleted while a write or a resolution was in flight stays listed
 * (without its object) until that job is done; then it goes. */
static void forget_if_gone(struct operator_ *op, struct ocache *c)
{
	if (c->obj || c->writing || c->resolving)
		return;
	for (struct ocache **p = &op->caches; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			cJSON_Delete(c->applied);
			free(c);
			return;
		}
	}
}

static void mark(struct operator_ *op, const char *key)
{
	struct ocache *c = find_cache(op, key, false);
	if (!c)
		return;
	c->dirty = true;
	if (!op->flush_timer && !op->stopping)
		op->flush_timer = loop_add_timer(op->loop, op->o.debounce_ms, flush, op);
}

static void mark_all(struct operator_ *op)
{
	for (struct ocache *c = op->caches; c; c = c->next)
		mark(op, c->key);
}

static void scope_key(const char *ns, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", *ns ? ns : CLUSTER_SCOPE, name);
}

/* ---- watches ---- */

static void on_cache(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct operator_ *op = ud;
	char key[320];
	scope_key(obj_str(obj, "metadata.namespace"), obj_str(obj, "metadata.name"), key,
	          sizeof(key));
	struct ocache *c = find_cache(op, key, t != OBJSTORE_DELETED);
	if (!c)
		return;
	if (t == OBJSTORE_DELETED) {
		for (struct ocache **p = &op->caches; *p; p = &(*p)->next) {
			if (*p == c && !c->writing && !c->resolving) {
				*p = c->next;
				cJSON_Delete(c->obj);
				cJSON_Delete(c->applied);
				free(c);
				return;
			}
		}
		cJSON_Delete(c->obj);
		c->obj = NULL;
		return;
	}
	cJSON_Delete(c->obj);
	c->obj = cJSON_Duplicate(obj, 1);
	mark(op, key);
}

static struct onode *find_node(struct operator_ *op, const char *key)
{
	for (struct onode *n = op->nodeobjs; n; n = n->next)
		if (!strcmp(n->key, key))
			return n;
	return NULL;
}

/* Mark every cache named in a node object's status. */
static void mark_named(struct operator_ *op, const char *ns, const cJSON *caches)
{
	const cJSON *e;
	char key[320];
	cJSON_ArrayForEach(e, caches)
	{
		scope_key(ns, e->string, key, sizeof(key));
		mark(op, key);
	}
}

static void on_nodeobj(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct operator_ *op = ud;
	const char *ns = obj_str(obj, "metadata.namespace"), *node = obj_str(obj, "metadata.name");
	char key[320];
	scope_key(ns, node, key, sizeof(key));
	struct onode *n = find_node(op, key);
	const cJSON *caches = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "status"), "caches");
	if (n)
		mark_named(op, ns, n->caches);
	mark_named(op, ns, caches);
	/* a node joining or leaving changes every total */
	if (!*ns && (t == OBJSTORE_DELETED || !n))
		mark_all(op);
	if (t == OBJSTORE_DELETED) {
		for (struct onode **p = &op->nodeobjs; *p; p = &(*p)->next) {
			if (*p == n) {
				*p = n->next;
				cJSON_Delete(n->caches);
				free(n);
				break;
			}
		}
		return;
	}
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (!n)
			return;
		snprintf(n->key, sizeof(n->key), "%s", key);
		snprintf(n->ns, sizeof(n->ns), "%s", ns);
		snprintf(n->node, sizeof(n->node), "%s", node);
		n->next = op->nodeobjs;
		op->nodeobjs = n;
	}
	cJSON_Delete(n->caches);
	n->caches = caches ? cJSON_Duplicate(caches, 1) : cJSON_CreateObject();
}

/* ---- node clean-up (Kubernetes) ---- */

struct delete_job {
	struct operator_ *op;
	char kind[32], ns[64], name[256];
};

static void delete_work(void *ud)
{
	struct delete_job *d = ud;
	char err[256];
	int rc = d->op->os->ops->remove(d->op->os, GKM_API_VERSION, d->kind, d->ns, d->name, err,
	                                sizeof(err));
	if (rc && rc != -ENOENT) {
		count_error("cleanup");
		log_warn("cannot delete a node object of a deleted node", "name", d->name, "error",
		         err);
	} else {
		log_info("deleted the node object of a node that is gone", "kind", d->kind,
		         "namespace", d->ns, "node", d->name);
	}
}

static void delete_done(struct loop *l, void *ud)
{
	(void)l;
	free(ud);
}

static void remove_orphans(struct operator_ *op)
{
	if (!op->o.watch_nodes || !op->nodes || op->synced < op->want_synced)
		return;
	for (struct onode *n = op->nodeobjs; n; n = n->next) {
		if (cJSON_GetObjectItemCaseSensitive(op->nodes, n->node))
			continue;
		struct delete_job *d = calloc(1, sizeof(*d));
		if (!d)
			continue;
		d->op = op;
		snprintf(d->kind, sizeof(d->kind), "%s",
		         *n->ns ? "GKMCacheNode" : "ClusterGKMCacheNode");
		snprintf(d->ns, sizeof(d->ns), "%s", n->ns);
		snprintf(d->name, sizeof(d->name), "%s", n->node);
		if (workers_submit(op->workers, delete_work, delete_done, d) != 0)
			free(d);
	}
}

static void on_node(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct operator_ *op = ud;
	const char *name = obj_str(obj, "metadata.name");
	if (t == OBJSTORE_DELETED)
		cJSON_DeleteItemFromObjectCaseSensitive(op->nodes, name);
	else if (!cJSON_GetObjectItemCaseSensitive(op->nodes, name))
		cJSON_AddTrueToObject(op->nodes, name);
	if (t == OBJSTORE_DELETED)
		remove_orphans(op);
}

static void on_synced(void *ud)
{
	struct operator_ *op = ud;
	/* stale entries of nodes that vanished while the operator was down */
	if (++op->synced == op->want_synced)
		remove_orphans(op);
}

/* ---- digests ---- */

struct resolve_job {
	struct operator_ *op;
	char key[320], image[600], digest[144], err[512];
	int rc;
};

static void resolve_work(void *ud)
{
	struct resolve_job *j = ud;
	struct oci_ref ref;
	struct oci_repo *repo = NULL;
	struct oci_desc d;
	struct oci_err e;
	memset(&ref, 0, sizeof(ref));
	memset(&d, 0, sizeof(d));
	memset(&e, 0, sizeof(e));
	j->rc = oci_ref_parse(j->image, &ref, &e);
	if (!j->rc && ref.digest) {
		snprintf(j->digest, sizeof(j->digest), "%s", ref.digest);
		goto out;
	}
	if (!j->rc)
		j->rc = oci_repo_open(&ref, j->op->o.registry, false, &repo, &e);
	if (!j->rc)
		j->rc = oci_repo_resolve(repo, oci_ref_reference(&ref), &d, &e);
	if (j->rc)
		snprintf(j->err, sizeof(j->err), "%s", oci_err_str(&e, j->rc));
	else
		snprintf(j->digest, sizeof(j->digest), "%s", d.digest);
out:
	oci_desc_clear(&d);
	oci_repo_free(repo);
	oci_ref_clear(&ref);
}

static void resolve_done(struct loop *l, void *ud)
{
	struct resolve_job *j = ud;
	(void)l;
	struct ocache *c = find_cache(j->op, j->key, false);
	if (c && !j->op->stopping) {
		c->resolving = false;
		snprintf(c->resolved_for, sizeof(c->resolved_for), "%s", j->image);
		snprintf(c->resolved, sizeof(c->resolved), "%s", j->rc ? "" : j->digest);
		snprintf(c->resolve_error, sizeof(c->resolve_error), "%s", j->rc ? j->err : "");
		if (j->rc) {
			count_error("resolve");
			log_warn("cannot resolve the image digest", "cache", j->key, "image",
			         j->image, "error", j->err);
		}
		mark(j->op, j->key);
		forget_if_gone(j->op, c);
	}
	free(j);
}

/* The digest for c: the webhook's annotation, else the operator's own
 * resolution (started here when needed; "" until it is done). */
static const char *digest_for(struct operator_ *op, struct ocache *c)
{
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(c->obj, "metadata"), "annotations");
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/resolvedDigest");
	if (cJSON_IsString(d))
		return d->valuestring;
	if (!op->o.resolve_digests)
		return "";
	const char *image = obj_str(c->obj, "spec.image");
	if (!strcmp(c->resolved_for, image))
		return c->resolved;
	if (!c->resolving) {
		struct resolve_job *j = calloc(1, sizeof(*j));
		if (j) {
			j->op = op;
			snprintf(j->key, sizeof(j->key), "%s", c->key);
			snprintf(j->image, sizeof(j->image), "%s", image);
			c->resolving = true;
			if (workers_submit(op->workers, resolve_work, resolve_done, j) != 0) {
				c->resolving = false;
				free(j);
			}
		}
	}
	/* keep reporting the previous digest while a new one is being resolved */
	return obj_str(c->obj, "status.resolvedDigest");
}

/* ---- aggregation and status writes ---- */

struct write_job {
	struct operator_ *op;
	char key[320];
	cJSON *obj;
	cJSON *events; /* [{type, reason, message}] */
	int rc;
	char err[512];
};

static void write_work(void *ud)
{
	struct write_job *j = ud;
	struct objstore *os = j->op->os;
	j->rc = os->ops->apply(os, j->obj, MANAGER, true, NULL, j->err, sizeof(j->err));
	if (j->rc) /* a refused status is retried; its Events would repeat with it */
		return;
	const cJSON *ev;
	cJSON_ArrayForEach(ev, j->events)
	{
		os->ops->event(os, j->obj, obj_str(ev, "type"), obj_str(ev, "reason"),
		               obj_str(ev, "message"), MANAGER);
	}
}

static void write_done(struct loop *l, void *ud)
{
	struct write_job *j = ud;
	(void)l;
	struct ocache *c = find_cache(j->op, j->key, false);
	metrics_add(m_writes, METRICS_L(j->rc ? "failed" : "written"), 1);
	if (c) {
		c->writing = false;
		if (j->rc) {
			cJSON_Delete(c->applied);
			c->applied = NULL;
			if (j->rc != -ENOENT) {
				count_error("status_write");
				log_warn("cache status write failed; will retry", "cache", j->key,
				         "error", j->err);
				mark(j->op, j->key);
			}
		}
		forget_if_gone(j->op, c);
	}
	cJSON_Delete(j->obj);
	cJSON_Delete(j->events);
	free(j);
}

static const cJSON *condition(const cJSON *status, const char *type)
{
	const cJSON *c;
	cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(status, "conditions"))
	{
		if (!strcmp(obj_str(c, "type"), type))
			return c;
	}
	return NULL;
}

/* Events for condition changes a user must see. */
static cJSON *transitions(const cJSON *old, const cJSON *now)
{
	static const struct {
		const char *type, *status, *event_type, *reason;
	} rules[] = {
	    {"Ready", "True", "Normal", "CacheReady"},
	    {"Error", "True", "Warning", "NodesFailed"},
	    {"Verified", "True", "Normal", "Verified"},
	    /* NULL: the condition's own reason (VerificationDisabled, Unsigned, ...) */
	    {"Verified", "False", "Warning", NULL},
	};
	cJSON *events = cJSON_CreateArray();
	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
		const cJSON *n = condition(now, rules[i].type), *o = condition(old, rules[i].type);
		if (!n || strcmp(obj_str(n, "status"), rules[i].status) != 0)
			continue;
		if (o && !strcmp(obj_str(o, "status"), obj_str(n, "status")) &&
		    !strcmp(obj_str(o, "message"), obj_str(n, "message")))
			continue;
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "type", rules[i].event_type);
		cJSON_AddStringToObject(e, "reason",
		                        rules[i].reason ? rules[i].reason : obj_str(n, "reason"));
		cJSON_AddStringToObject(e, "message", obj_str(n, "message"));
		cJSON_AddItemToArray(events, e);
	}
	return events;
}

static cJSON *aggregate_input(struct operator_ *op, struct ocache *c, const char *digest)
{
	char now[32];
	obj_now(now, sizeof(now));
	cJSON *in = cJSON_CreateObject();
	cJSON *cache = cJSON_AddObjectToObject(in, "cache");
	cJSON_AddStringToObject(cache, "kind", obj_str(c->obj, "kind"));
	cJSON_AddStringToObject(cache, "namespace", c->ns);
	cJSON_AddStringToObject(cache, "name", c->name);
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(c->obj, "metadata");
	const cJSON *gen = cJSON_GetObjectItemCaseSensitive(meta, "generation");
	cJSON_AddNumberToObject(cache, "generation", cJSON_IsNumber(gen) ? gen->valuedouble : 0);
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(meta, "annotations");
	cJSON_AddItemToObject(cache, "annotations",
	                      ann ? cJSON_Duplicate(ann, 1) : cJSON_CreateObject());
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(c->obj, "status");
	cJSON_AddItemToObject(cache, "status", st ? cJSON_Duplicate(st, 1) : cJSON_CreateObject());
	cJSON_AddStringToObject(in, "digest", digest);
	cJSON *v = cJSON_AddObjectToObject(in, "verification");
	cJSON_AddBoolToObject(v, "enabled", op->o.verification_enabled);
	cJSON_AddStringToObject(v, "resolvedBy", op->o.resolve_digests ? "operator" : "webhook");
	cJSON_AddStringToObject(in, "now", now);
	cJSON *nodes = cJSON_AddArrayToObject(in, "nodes");
	/* every node that runs an agent has a ClusterGKMCacheNode */
	for (struct onode *agent = op->nodeobjs; agent; agent = agent->next) {
		if (*agent->ns)
			continue;
		cJSON *n = cJSON_CreateObject();
		cJSON_AddStringToObject(n, "name", agent->node);
		char key[320];
		scope_key(c->ns, agent->node, key, sizeof(key));
		struct onode *scoped = find_node(op, key);
		const cJSON *e =
		    scoped ? cJSON_GetObjectItemCaseSensitive(scoped->caches, c->name) : NULL;
		if (e)
			cJSON_AddItemToObject(n, "entry", cJSON_Duplicate(e, 1));
		cJSON_AddItemToArray(nodes, n);
	}
	return in;
}

static void reconcile(struct operator_ *op, struct ocache *c)
{
	if (!c->obj || !op->policies->current)
		return;
	const char *digest = digest_for(op, c);
	cJSON *in = aggregate_input(op, c, digest), *status = NULL;
	struct engine_error err;
	enum engine_status st = engine_call(op->policies->current, "aggregate", in, &status, &err);
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		metrics_add(m_reconciles, METRICS_L("policy_error"), 1);
		count_error("policy");
		log_error("aggregate policy failed", "cache", c->key, "error", err.message);
		return;
	}
	metrics_add(m_reconciles, METRICS_L("ok"), 1);
	if (c->resolve_error[0] && !*digest) {
		/* say why in the status rather than leaving the user guessing */
		const cJSON *cond;
		cJSON_ArrayForEach(cond, cJSON_GetObjectItemCaseSensitive(status, "conditions"))
		{
			if (!strcmp(obj_str(cond, "type"), "Ready")) {
				obj_set((cJSON *)cond, "reason",
				        cJSON_CreateString("DigestResolutionFailed"));
				obj_set((cJSON *)cond, "message",
				        cJSON_CreateString(c->resolve_error));
			}
		}
	}
	/* compare without the timestamp: an unchanged status is not written */
	cJSON *cmp = cJSON_Duplicate(status, 1);
	cJSON_DeleteItemFromObjectCaseSensitive(cmp, "lastUpdated");
	if (c->applied && cJSON_Compare(c->applied, cmp, 1)) {
		op->skipped++;
		metrics_add(m_writes, METRICS_L("unchanged"), 1);
		cJSON_Delete(cmp);
		cJSON_Delete(status);
		return;
	}
	struct write_job *j = calloc(1, sizeof(*j));
	if (!j) {
		cJSON_Delete(cmp);
		cJSON_Delete(status);
		return;
	}
	j->op = op;
	snprintf(j->key, sizeof(j->key), "%s", c->key);
	j->events = transitions(
	    c->applied ? c->applied : cJSON_GetObjectItemCaseSensitive(c->obj, "status"), status);
	j->obj = cJSON_CreateObject();
	cJSON_AddStringToObject(j->obj, "apiVersion", GKM_API_VERSION);
	cJSON_AddStringToObject(j->obj, "kind", obj_str(c->obj, "kind"));
	cJSON *meta = cJSON_AddObjectToObject(j->obj, "metadata");
	cJSON_AddStringToObject(meta, "name", c->name);
	if (*c->ns)
		cJSON_AddStringToObject(meta, "namespace", c->ns);
	cJSON_AddStringToObject(meta, "uid", obj_str(c->obj, "metadata.uid"));
	/* unresolved: leave the digest out (the CRD's pattern refuses "") */
	const cJSON *rd = cJSON_GetObjectItemCaseSensitive(status, "resolvedDigest");
	if (cJSON_IsString(rd) && !*rd->valuestring)
		cJSON_DeleteItemFromObjectCaseSensitive(status, "resolvedDigest");
	cJSON_AddItemToObject(j->obj, "status", status);
	cJSON_Delete(c->applied);
	c->applied = cmp;
	c->writing = true;
	op->writes++;
	if (workers_submit(op->workers, write_work, write_done, j) != 0) {
		c->writing = false;
		cJSON_Delete(j->obj);
		cJSON_Delete(j->events);
		free(j);
	}
}

static void flush(struct loop *l, void *ud)
{
	struct operator_ *op = ud;
	(void)l;
	op->flush_timer = 0;
	if (op->synced < op->want_synced) { /* aggregate complete pictures only */
		op->flush_timer = loop_add_timer(op->loop, op->o.debounce_ms, flush, op);
		return;
	}
	for (struct ocache *c = op->caches; c; c = c->next) {
		if (!c->dirty)
			continue;
		if (c->writing) { /* one write at a time per cache; the next window takes it */
			if (!op->flush_timer)
				op->flush_timer =
				    loop_add_timer(op->loop, op->o.debounce_ms, flush, op);
			continue;
		}
		c->dirty = false;
		reconcile(op, c);
	}
}

static void resync_tick(struct loop *l, void *ud)
{
	struct operator_ *op = ud;
	mark_all(op);
	remove_orphans(op);
	op->resync_timer = loop_add_timer(l, (uint64_t)op->o.resync_s * 1000, resync_tick, op);
}

void operator_policies_changed(struct operator_ *op)
{
	mark_all(op);
}

bool operator_ready(const struct operator_ *op)
{
	return op->synced >= op->want_synced;
}

void operator_counts(const struct operator_ *op, unsigned long *writes, unsigned long *skipped)
{
	*writes = op->writes;
	*skipped = op->skipped;
}

int operator_start(struct loop *l, struct workers *w, struct objstore *os,
                   struct engine_slot *policies, const struct operator_opts *o,
                   struct operator_ **out)
{
	struct operator_ *op = calloc(1, sizeof(*op));
	if (!op)
		return -ENOMEM;
	init_metrics();
	op->loop = l;
	op->workers = w;
	op->os = os;
	op->policies = policies;
	op->o = *o;
	if (!op->o.debounce_ms)
		op->o.debounce_ms = 250;
	if (!op->o.resync_s)
		op->o.resync_s = 60;
	struct objstore_watch watches[] = {
	    {GKM_API_VERSION, "ClusterGKMCacheNode", NULL, NULL, NULL, on_nodeobj, on_synced, op},
	    {GKM_API_VERSION, "GKMCacheNode", NULL, NULL, NULL, on_nodeobj, on_synced, op},
	    {GKM_API_VERSION, "GKMCache", NULL, NULL, NULL, on_cache, on_synced, op},
	    {GKM_API_VERSION, "ClusterGKMCache", NULL, NULL, NULL, on_cache, on_synced, op},
	    {"v1", "Node", NULL, NULL, NULL, on_node, on_synced, op},
	};
	size_t n = sizeof(watches) / sizeof(watches[0]) - (o->watch_nodes ? 0 : 1);
	op->want_synced = (unsigned)n;
	if (o->watch_nodes)
		op->nodes = cJSON_CreateObject();
	for (size_t i = 0; i < n; i++) {
		int rc = os->ops->watch(os, &watches[i]);
		if (rc) {
			operator_stop(op);
			return rc;
		}
	}
	op->resync_timer = loop_add_timer(l, (uint64_t)op->o.resync_s * 1000, resync_tick, op);
	*out = op;
	return 0;
}

void operator_quiesce(struct operator_ *op)
{
	op->stopping = true;
}

void operator_stop(struct operator_ *op)
{
	if (!op)
		return;
	op->stopping = true;
	if (op->flush_timer)
		loop_cancel_timer(op->loop, op->flush_timer);
	if (op->resync_timer)
		loop_cancel_timer(op->loop, op->resync_timer);
	while (op->caches) {
		struct ocache *c = op->caches;
		op->caches = c->next;
		cJSON_Delete(c->obj);
		cJSON_Delete(c->applied);
		free(c);
	}
	while (op->nodeobjs) {
		struct onode *n = op->nodeobjs;
		op->nodeobjs = n->next;
		cJSON_Delete(n->caches);
		free(n);
	}
	cJSON_Delete(op->nodes);
	free(op);
}
