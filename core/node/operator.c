#include "operator.h"
#include "operator_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "cache_env.h"
#include "cache_label.h"
#include "cache_view.h"
#include "claims.h"
#include "kserve.h"
#include "kube_affinity.h"
#include "log.h"
#include "metrics.h"
#include "node_labels.h"
#include "node_reports.h"
#include "oci_pull.h"
#include "oci_repo.h"
#include "pull_secret.h"
#include "secret_grants.h"
#include "soon_timer.h"
#include "strmap.h"

static struct metric *m_reconciles, *m_writes, *m_errors;

/* kind: policy, status_write, resolve, verify, cleanup, node_report */
void operator_count_error(const char *kind)
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
	    "Operator failures, by kind (policy, status_write, resolve, verify, cleanup, "
	    "node_report)",
	    "kind");
}

struct ocache *operator_find_cache(struct operator_ *op, const char *key, bool create)
{
	struct ocache *c = strmap_get(&op->cache_index, key);
	if (c || !create)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	snprintf(c->key, sizeof(c->key), "%s", key);
	if (strmap_put(&op->cache_index, c->key, c) != 0) {
		free(c);
		return NULL;
	}
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

/* Parse spec.image once, when it changes: every job of the cache takes a
 * copy of the parsed reference. */
static void parse_image(struct ocache *c)
{
	const char *image = obj_str(c->obj, "spec.image");
	if (c->parsed && !strcmp(image, c->image))
		return;
	struct oci_err e = {{0}};
	c->parsed = true;
	oci_ref_clear(&c->ref);
	snprintf(c->image, sizeof(c->image), "%s", image);
	c->ref_rc = oci_ref_parse(image, &c->ref, &e);
	snprintf(c->ref_err, sizeof(c->ref_err), "%s", c->ref_rc ? oci_err_str(&e, c->ref_rc) : "");
}

static void free_cache(struct operator_ *op, struct ocache *c)
{
	for (struct ocache **p = &op->caches; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	strmap_del(&op->cache_index, c->key);
	cJSON_Delete(c->obj);
	cJSON_Delete(c->applied);
	oci_ref_clear(&c->ref);
	free(c);
}

/* A cache deleted while a write, a resolution or a check was in flight stays listed
 * (without its object) until that job is done; then it goes. */
void operator_forget_if_gone(struct operator_ *op, struct ocache *c)
{
	if (!c->obj && !c->writing && !c->resolving && !c->verifying)
		free_cache(op, c);
}

/* Flush in delay_ms, or sooner if a flush is already due sooner. */
static void arm_flush(struct operator_ *op, uint64_t delay_ms)
{
	if (!op->stopping)
		soon_timer_arm(&op->flush_timer, delay_ms);
}

void operator_mark(struct operator_ *op, const char *key)
{
	struct ocache *c = operator_find_cache(op, key, false);
	if (!c)
		return;
	c->dirty = true;
	arm_flush(op, op->o.debounce_ms);
}

static void mark_key(const char *key, void *ud)
{
	operator_mark(ud, key);
}

static void mark_all(struct operator_ *op)
{
	for (struct ocache *c = op->caches; c; c = c->next)
		operator_mark(op, c->key);
}

static void scope_key(const char *ns, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", *ns ? ns : CLUSTER_SCOPE, name);
}

/* ---- watches ---- */

static bool same_item(const cJSON *a, const cJSON *b, const char *name)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, name),
	            *y = cJSON_GetObjectItemCaseSensitive(b, name);
	return (!x && !y) || (x && y && cJSON_Compare(x, y, 1));
}

/* Is obj the cache as before but for the status this operator last wrote?
 * Then aggregating again would give that same status: the echo of our own
 * write needs no work. */
static bool own_write(const struct ocache *c, const cJSON *obj)
{
	if (!c->obj || !c->applied)
		return false;
	const cJSON *m0 = cJSON_GetObjectItemCaseSensitive(c->obj, "metadata"),
	            *m1 = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
	if (!same_item(c->obj, obj, "spec") || !same_item(c->obj, obj, "kind") ||
	    !same_item(m0, m1, "generation") || !same_item(m0, m1, "annotations") ||
	    !same_item(m0, m1, "uid"))
		return false;
	cJSON *st = obj_without(cJSON_GetObjectItemCaseSensitive(obj, "status"), "lastUpdated");
	bool same = st && cJSON_Compare(st, c->applied, 1);
	cJSON_Delete(st);
	return same;
}

static void on_cache(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct operator_ *op = ud;
	char key[320];
	scope_key(obj_str(obj, "metadata.namespace"), obj_str(obj, "metadata.name"), key,
	          sizeof(key));
	struct ocache *c = operator_find_cache(op, key, t != OBJSTORE_DELETED);
	if (!c)
		return;
	if (t == OBJSTORE_DELETED) {
		char label[CACHE_LABEL_KEY_MAX];
		if (op->labels && cache_label_key(c->ns, c->name, label, sizeof(label)) == 0)
			node_labels_drop(op->labels, label);
		if (op->claims)
			claims_cache_deleted(op->claims, key);
		if (op->grants)
			secret_grants_cache(op->grants, key, NULL);
		cJSON_Delete(c->obj);
		c->obj = NULL;
		operator_forget_if_gone(op, c);
		return;
	}
	bool echo = own_write(c, obj);
	if (op->grants)
		secret_grants_cache(op->grants, key, obj);
	cJSON_Delete(c->obj);
	c->obj = cJSON_Duplicate(obj, 1);
	parse_image(c);
	if (!echo)
		operator_mark(op, key);
}

static void mark_changed(const char *ns, const char *cache, void *ud)
{
	char key[320];
	scope_key(ns, cache, key, sizeof(key));
	operator_mark(ud, key);
}

static void on_nodeobj(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct operator_ *op = ud;
	const char *ns = obj_str(obj, "metadata.namespace"), *node = obj_str(obj, "metadata.name");
	if (t == OBJSTORE_DELETED) {
		/* a node leaving changes every total */
		if (node_reports_remove(op->reports, ns, node, mark_changed, op) && !*ns)
			mark_all(op);
		return;
	}
	const cJSON *caches = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "status"), "caches");
	bool added = false;
	int rc = node_reports_set(op->reports, ns, node, caches, mark_changed, op, &added);
	if (rc) {
		operator_count_error("node_report");
		log_error("cannot keep a node report", "namespace", ns, "node", node, "error",
		          strerror(-rc));
		return;
	}
	/* a node joining changes every total */
	if (added && !*ns)
		mark_all(op);
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
		operator_count_error("cleanup");
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

static void orphan(const char *ns, const char *node, void *ud)
{
	struct operator_ *op = ud;
	if (strmap_get(&op->nodes, node))
		return;
	struct delete_job *d = calloc(1, sizeof(*d));
	if (!d)
		return;
	d->op = op;
	snprintf(d->kind, sizeof(d->kind), "%s", *ns ? "GKMCacheNode" : "ClusterGKMCacheNode");
	snprintf(d->ns, sizeof(d->ns), "%s", ns);
	snprintf(d->name, sizeof(d->name), "%s", node);
	if (workers_submit(op->workers, delete_work, delete_done, d) != 0)
		free(d);
}

static void remove_orphans(struct operator_ *op)
{
	if (!op->o.watch_nodes || op->synced < op->want_synced)
		return;
	node_reports_foreach(op->reports, NULL, orphan, op);
}

static void on_node(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct operator_ *op = ud;
	const char *name = obj_str(obj, "metadata.name");
	if (t == OBJSTORE_DELETED) {
		node_labels_node_deleted(op->labels, name);
		free(strmap_del(&op->nodes, name));
		remove_orphans(op);
		return;
	}
	node_labels_node(op->labels, obj);
	if (strmap_get(&op->nodes, name))
		return;
	char *copy = strdup(name);
	if (!copy || strmap_put(&op->nodes, copy, copy) != 0) {
		free(copy); /* not known: its node objects are kept, never wrongly deleted */
		log_error("out of memory keeping a Node name", "node", name);
	}
}

static void on_synced(void *ud)
{
	struct operator_ *op = ud;
	if (++op->synced != op->want_synced)
		return;
	struct node_reports_stats st;
	node_reports_stats(op->reports, &st);
	char objs[24], entries[24], strings[24], kib[24];
	snprintf(objs, sizeof(objs), "%zu", st.objects);
	snprintf(entries, sizeof(entries), "%zu", st.entries);
	snprintf(strings, sizeof(strings), "%zu", st.strings);
	snprintf(kib, sizeof(kib), "%zu", st.string_bytes / 1024);
	log_info("node reports listed", "node_objects", objs, "entries", entries,
	         "distinct_strings", strings, "string_kib", kib);
	/* stale entries of nodes that vanished while the operator was down */
	remove_orphans(op);
	/* a first flush even with no cache: it starts the Node labels */
	arm_flush(op, 0);
}

/* ---- aggregation and status writes ---- */

struct write_job {
	struct operator_ *op;
	char key[320];
	cJSON *obj;
	cJSON *events; /* [{type, reason, message}] */
	cJSON *owner;  /* a LocalModelCache the Events go to as well, or NULL */
	bool refusal;  /* obj is refusal_status(): it says why the status is missing */
	int rc;
	char err[512];
};

static void write_done(struct loop *l, void *ud);

/* Errors of a write the API server refused (Invalid, BadRequest, Forbidden,
 * Unauthorized, too large): sending the same status again cannot help. */
static bool refused(int rc)
{
	return rc == -EINVAL || rc == -EACCES || rc == -EMSGSIZE;
}

static cJSON *refusal_condition(const char *type, const char *status, const char *message,
                                const char *now, double generation)
{
	cJSON *c = cJSON_CreateObject();
	cJSON_AddStringToObject(c, "type", type);
	cJSON_AddStringToObject(c, "status", status);
	cJSON_AddStringToObject(c, "reason", "StatusRefused");
	cJSON_AddStringToObject(c, "message", message);
	cJSON_AddStringToObject(c, "lastTransitionTime", now);
	cJSON_AddNumberToObject(c, "observedGeneration", generation);
	return c;
}

/* What the operator applies in place of a status the API server refused:
 * the refusal itself, in the Ready and Error conditions, so that `kubectl
 * get` shows it rather than a status frozen at its last accepted value (the
 * counts and node lists of that value go with this apply). The digest stays
 * where it is valid: nodes may be pulling by it. */
static cJSON *refusal_status(const cJSON *obj, const char *message, double generation)
{
	char now[32];
	obj_now(now, sizeof(now));
	cJSON *out = obj_without(obj, "status");
	cJSON *st = cJSON_AddObjectToObject(out, "status");
	const char *digest = obj_str(obj, "status.resolvedDigest");
	if (cache_view_valid_digest(digest)) {
		cJSON_AddStringToObject(st, "resolvedDigest", digest);
		cJSON_AddStringToObject(st, "resolvedImage", obj_str(obj, "status.resolvedImage"));
	}
	cJSON *conds = cJSON_AddArrayToObject(st, "conditions");
	cJSON_AddItemToArray(conds,
	                     refusal_condition("Ready", "Unknown", message, now, generation));
	cJSON_AddItemToArray(conds, refusal_condition("Error", "True", message, now, generation));
	cJSON_AddStringToObject(st, "lastUpdated", now);
	return out;
}

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
		if (j->owner)
			os->ops->event(os, j->owner, obj_str(ev, "type"), obj_str(ev, "reason"),
			               obj_str(ev, "message"), MANAGER);
	}
}

/* The aggregated status of c was refused: apply refusal_status() in its
 * place (c stays writing until that is done). */
static bool write_refusal(struct operator_ *op, struct ocache *c, const struct write_job *failed,
                          unsigned retry_ms)
{
	struct write_job *j = calloc(1, sizeof(*j));
	if (!j)
		return false;
	char msg[768];
	snprintf(msg, sizeof(msg),
	         "the API server refused this cache's status: %s; the next try is in %us "
	         "(or when the status changes)",
	         failed->err, (retry_ms + 999) / 1000);
	const cJSON *gen = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(c->obj, "metadata"), "generation");
	j->op = op;
	j->refusal = true;
	snprintf(j->key, sizeof(j->key), "%s", c->key);
	j->obj = refusal_status(failed->obj, msg, cJSON_IsNumber(gen) ? gen->valuedouble : 0);
	j->events = cJSON_CreateArray();
	if (c->failures == 1) { /* the first of a run of refusals */
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "type", "Warning");
		cJSON_AddStringToObject(e, "reason", "StatusRefused");
		cJSON_AddStringToObject(e, "message", msg);
		cJSON_AddItemToArray(j->events, e);
	}
	if (workers_submit(op->workers, write_work, write_done, j) != 0) {
		cJSON_Delete(j->obj);
		cJSON_Delete(j->events);
		free(j);
		return false;
	}
	return true;
}

static void write_done(struct loop *l, void *ud)
{
	struct write_job *j = ud;
	struct operator_ *op = j->op;
	(void)l;
	struct ocache *c = operator_find_cache(op, j->key, false);
	metrics_add(m_writes, METRICS_L(j->rc ? "failed" : "written"), 1);
	if (c) {
		c->writing = false;
		if (!j->rc && !j->refusal) {
			c->failures = 0;
			c->write_not_before = 0;
		}
		if (j->rc) {
			cJSON_Delete(c->applied);
			c->applied = NULL;
		}
		if (j->rc && j->rc != -ENOENT && !op->stopping) {
			bool no = refused(j->rc);
			unsigned delay = backoff_ms(
			    c->failures++, op->o.debounce_ms,
			    no ? REFUSED_BACKOFF_MAX_MS : WRITE_BACKOFF_MAX_MS, &op->seed);
			char in[24];
			snprintf(in, sizeof(in), "%.1fs", delay / 1000.0);
			operator_count_error("status_write");
			log_warn(j->refusal ? "cannot record that the cache status was refused"
			         : no       ? "the API server refused the cache status; will retry"
			                    : "cache status write failed; will retry",
			         "cache", j->key, "in", in, "error", j->err);
			c->write_not_before = loop_now_ms() + delay;
			c->dirty = true;
			arm_flush(op, delay);
			if (no && !j->refusal)
				c->writing = write_refusal(op, c, j, delay);
		}
		if (!c->writing)
			operator_forget_if_gone(op, c);
	}
	cJSON_Delete(j->obj);
	cJSON_Delete(j->events);
	cJSON_Delete(j->owner);
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

struct input_nodes {
	struct operator_ *op;
	const struct ocache *c;
	cJSON *nodes;
	bool reporting_only; /* only nodes whose report has the cache */
	bool waiting;        /* a node waits for a pull slot (lua/gkm/rollout.lua) */
};

static void add_input_node(const char *ns, const char *node, void *ud)
{
	(void)ns;
	struct input_nodes *x = ud;
	cJSON *e = node_reports_entry(x->op->reports, x->c->ns, node, x->c->name);
	if (!e && x->reporting_only)
		return;
	cJSON *n = cJSON_CreateObject();
	cJSON_AddStringToObject(n, "name", node);
	x->waiting = x->waiting || !strcmp(obj_str(e, "state"), "Waiting");
	if (e)
		cJSON_AddItemToObject(n, "entry", e);
	cJSON_AddItemToArray(x->nodes, n);
}

/* The aggregation's input; *rollout: whether the cache's pull slots need a
 * plan (spec.rollout or status.rollout is set, or a node waits for a slot). */
static cJSON *aggregate_input(struct operator_ *op, struct ocache *c, const char *digest,
                              bool *rollout_plan)
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
	cJSON *mine = operator_verification_of(op, c, digest);
	if (mine)
		cJSON_AddItemToObject(v, "operator", mine);
	cJSON_AddStringToObject(in, "now", now);
	/* every node that runs an agent has a ClusterGKMCacheNode; the kernel
	 * cache of a LocalModelCache is only for the nodes of its node groups,
	 * which are those that report it */
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(c->obj, "spec");
	const cJSON *rollout = cJSON_GetObjectItemCaseSensitive(spec, "rollout");
	if (rollout)
		cJSON_AddItemToObject(cache, "rollout", cJSON_Duplicate(rollout, 1));
	/* a cache whose spec.nodeSelector or node affinity names its nodes is
	 * for those that report it, too */
	struct input_nodes ctx = {op, c, cJSON_AddArrayToObject(in, "nodes"),
	                          *obj_str(c->obj, "spec.localModel.cacheName") != '\0' ||
	                              kube_affinity_set(spec),
	                          false};
	node_reports_foreach(op->reports, "", add_input_node, &ctx);
	*rollout_plan = rollout || cJSON_GetObjectItemCaseSensitive(st, "rollout") || ctx.waiting;
	return in;
}

/* The Nodes that carry c's label: the aggregate policy's labeledNodes
 * (validated: a list of strings). */
static void set_node_labels(struct operator_ *op, const struct ocache *c, const char *label,
                            const cJSON *labeled)
{
	if (!op->labels)
		return;
	int n = cJSON_GetArraySize(labeled), i = 0;
	const char **names = calloc((size_t)n + 1, sizeof(*names));
	const cJSON *it;
	if (names) {
		cJSON_ArrayForEach(it, labeled) names[i++] = it->valuestring;
	}
	if (!names || node_labels_set(op->labels, label, names, (size_t)n) != 0)
		log_error("out of memory setting the Node labels of a cache", "cache", c->key);
	free(names);
}

/* status.rollout: which nodes may pull the digest now (lua/gkm/rollout.lua). */
static enum engine_status plan_rollout(struct operator_ *op, const cJSON *in, cJSON *status,
                                       struct engine_error *err)
{
	cJSON *out = NULL;
	enum engine_status st =
	    engine_call_fn(op->policies->current, "gkm.rollout", "plan", in, NULL, &out, err);
	if (st != ENGINE_OK)
		return st;
	cJSON *r = cJSON_DetachItemFromObjectCaseSensitive(out, "rollout");
	cJSON_Delete(out);
	if (!cJSON_IsObject(r)) {
		cJSON_Delete(r);
		return ENGINE_OK;
	}
	static const char *const lists[] = {"pulling", "waiting"};
	obj_empty_lists(r, lists, 2);
	obj_set(status, "rollout", r);
	return ENGINE_OK;
}

static void reconcile(struct operator_ *op, struct ocache *c)
{
	if (!c->obj || !op->policies->current)
		return;
	const char *digest = operator_digest_for(op, c);
	bool rollout_plan;
	cJSON *in = aggregate_input(op, c, digest, &rollout_plan), *status = NULL;
	struct engine_error err;
	enum engine_status st = engine_call(op->policies->current, "aggregate", in, &status, &err);
	if (st == ENGINE_OK && rollout_plan)
		st = plan_rollout(op, in, status, &err);
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		metrics_add(m_reconciles, METRICS_L("policy_error"), 1);
		operator_count_error("policy");
		log_error("aggregate policy failed", "cache", c->key, "error", err.message);
		cJSON_Delete(status);
		return;
	}
	metrics_add(m_reconciles, METRICS_L("ok"), 1);
	cJSON *labeled = cJSON_DetachItemFromObjectCaseSensitive(status, "labeledNodes");
	char label[CACHE_LABEL_KEY_MAX];
	if (cache_label_key(c->ns, c->name, label, sizeof(label)) == 0) {
		obj_set(status, "nodeLabel", cJSON_CreateString(label));
		set_node_labels(op, c, label, labeled);
	}
	cJSON_Delete(labeled);
	if (op->claims)
		claims_sync(op->claims, c->key, c->obj,
		            cJSON_GetObjectItemCaseSensitive(c->obj, "status"), status);
	obj_drop_empty_maps(status); /* an applied {} can freeze the status: see objstore.h */
	/* what compiled the cache, as the webhook read it from the image's
	 * labels: shown by kubectl describe beside where it is Ready */
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->obj, "metadata"),
	                                     "annotations"),
	    CACHE_ENV_IDENTITY_ANNOTATION);
	cJSON *id = cJSON_IsString(ann) ? cJSON_Parse(ann->valuestring) : NULL;
	if (cJSON_IsObject(id) && id->child)
		obj_set(status, "identity", id);
	else
		cJSON_Delete(id);
	/* the image the digest belongs to: a restarted operator keeps the
	 * digest only while spec.image stays the same (recorded_digest) */
	if (*obj_str(status, "resolvedDigest"))
		obj_set(status, "resolvedImage", cJSON_CreateString(obj_str(c->obj, "spec.image")));
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
	cJSON *cmp = obj_without(status, "lastUpdated");
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
	j->owner = kserve_owner(c->obj);
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
		cJSON_Delete(j->owner);
		free(j);
	}
}

static void flush(struct loop *l, void *ud)
{
	struct operator_ *op = ud;
	(void)l;
	if (op->synced < op->want_synced) { /* aggregate complete pictures only */
		arm_flush(op, op->o.debounce_ms);
		return;
	}
	unsigned n = 0;
	uint64_t now = loop_now_ms();
	for (struct ocache *c = op->caches; c; c = c->next) {
		if (!c->dirty)
			continue;
		if (c->writing) { /* one write at a time per cache; the next window takes it */
			arm_flush(op, op->o.debounce_ms);
			continue;
		}
		if (c->write_not_before > now) { /* a failed write backs off */
			arm_flush(op, c->write_not_before - now);
			continue;
		}
		c->dirty = false;
		reconcile(op, c);
		n++;
	}
	/* every cache has been seen: Roles no cache needs can go */
	if (op->grants && !op->grants_known && operator_ready(op)) {
		op->grants_known = true;
		secret_grants_caches_known(op->grants);
	}
	/* every cache has been aggregated once: where each is Ready is known */
	if (op->labels && !op->labels_started) {
		op->labels_started = true;
		node_labels_start(op->labels);
		if (op->claims)
			claims_caches_known(op->claims);
	}
	/* the inputs of a thousand nodes each were garbage once aggregated:
	 * give the memory back now rather than holding the peak at rest */
	if (n && op->policies->current)
		engine_collect(op->policies->current);
	if (n)
		loop_trim_soon(op->loop);
}

static void resync_tick(struct loop *l, void *ud)
{
	struct operator_ *op = ud;
	mark_all(op);
	remove_orphans(op);
	if (op->claims)
		claims_resync(op->claims);
	if (op->grants)
		secret_grants_resync(op->grants);
	if (op->kserve)
		kserve_resync(op->kserve);
	if (op->labels_started)
		node_labels_resync(op->labels);
	op->resync_timer = loop_add_timer(l, (uint64_t)op->o.resync_s * 1000, resync_tick, op);
}

void operator_policies_changed(struct operator_ *op)
{
	mark_all(op);
}

void operator_set_trust(struct operator_ *op, struct trust *t)
{
	struct trust *old = op->o.trust;
	op->o.trust = t ? trust_ref(t) : NULL;
	trust_unref(old);
	for (struct ocache *c = op->caches; c; c = c->next) {
		c->verified_image[0] = '\0'; /* a verdict under other keys is no verdict */
		c->verdict = VERDICT_NONE;
	}
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
	if (op->o.trust)
		trust_ref(op->o.trust);
	soon_timer_init(&op->flush_timer, l, flush, op);
	if (!op->o.debounce_ms)
		op->o.debounce_ms = 250;
	if (!op->o.resync_s)
		op->o.resync_s = 60;
	int rc = node_reports_new(&op->reports);
	if (!rc && o->watch_nodes)
		rc = node_labels_new(l, w, os, op->o.debounce_ms, &op->labels);
	if (!rc && o->watch_nodes)
		rc = claims_new(w, os, MANAGER, mark_key, op, &op->claims);
	if (!rc && o->kserve)
		rc = kserve_new(w, os, MANAGER, &op->kserve);
	if (!rc && o->agent_service_account)
		rc = secret_grants_new(w, os, MANAGER, o->agent_service_account, NULL, &op->grants);
	if (rc) {
		secret_grants_free(op->grants);
		claims_free(op->claims);
		node_labels_free(op->labels);
		node_reports_free(op->reports);
		trust_unref(op->o.trust);
		free(op);
		return rc;
	}
	/* the operator keeps what it needs of each object itself: the store
	 * keeps no second copy (no_cache) */
	struct objstore_watch watches[] = {
	    {GKM_API_VERSION, "ClusterGKMCacheNode", NULL, NULL, NULL, on_nodeobj, on_synced, op,
	     true, GKM_NODEOBJ_LIST_PAGE, false},
	    {GKM_API_VERSION, "GKMCacheNode", NULL, NULL, NULL, on_nodeobj, on_synced, op, true,
	     GKM_NODEOBJ_LIST_PAGE, false},
	    {GKM_API_VERSION, "GKMCache", NULL, NULL, NULL, on_cache, on_synced, op, true, 0,
	     false},
	    {GKM_API_VERSION, "ClusterGKMCache", NULL, NULL, NULL, on_cache, on_synced, op, true, 0,
	     false},
	    /* managedFields: which labels node_labels owns on each Node */
	    {"v1", "Node", NULL, NULL, NULL, on_node, on_synced, op, true, 0, true},
	};
	size_t n = sizeof(watches) / sizeof(watches[0]) - (o->watch_nodes ? 0 : 1);
	op->want_synced = (unsigned)n;
	for (size_t i = 0; i < n; i++) {
		rc = os->ops->watch(os, &watches[i]);
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
	node_labels_quiesce(op->labels);
}

void operator_stop(struct operator_ *op)
{
	if (!op)
		return;
	op->stopping = true;
	soon_timer_cancel(&op->flush_timer);
	if (op->resync_timer)
		loop_cancel_timer(op->loop, op->resync_timer);
	while (op->caches)
		free_cache(op, op->caches);
	strmap_clear(&op->cache_index);
	node_reports_free(op->reports);
	node_labels_free(op->labels);
	claims_free(op->claims);
	kserve_free(op->kserve);
	secret_grants_free(op->grants);
	size_t pos = 0;
	void *name;
	while (strmap_next(&op->nodes, &pos, NULL, &name))
		free(name);
	strmap_clear(&op->nodes);
	trust_unref(op->o.trust);
	free(op);
}
