/* The agent's report: the status of this node's node objects, and the
 * lookup of this node's Node that owns them. */

#include "agent_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "log.h"

static struct nodeobj *find_nodeobj(struct agent *a, const char *ns)
{
	for (struct nodeobj *n = a->nodeobjs; n; n = n->next)
		if (!strcmp(n->ns, ns))
			return n;
	return NULL;
}

static struct nodeobj *nodeobj_for(struct agent *a, const char *ns)
{
	struct nodeobj *n = find_nodeobj(a, ns);
	if (n)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	snprintf(n->ns, sizeof(n->ns), "%s", ns);
	n->next = a->nodeobjs;
	a->nodeobjs = n;
	return n;
}

void agent_mark_dirty(struct agent *a, const char *ns)
{
	struct nodeobj *n = nodeobj_for(a, ns);
	if (!n)
		return;
	n->dirty = true;
	soon_timer_arm(&a->status_timer, a->o.status_debounce_ms);
}

/* One of this node's objects was deleted (by hand, or with its namespace):
 * write it again while caches of its namespace report on this node (the
 * cluster-scoped one always); otherwise it is created when one appears. */
void agent_on_nodeobj_event(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct agent *a = ud;
	const char *ns = obj_str(obj, "metadata.namespace");
	struct nodeobj *n = find_nodeobj(a, ns);
	if (t != OBJSTORE_DELETED || a->stopping || !n ||
	    strcmp(obj_str(obj, "metadata.name"), a->node) != 0)
		return;
	n->created = false;
	bool reported = !*ns;
	for (struct cache *c = a->caches; c && !reported; c = c->next)
		reported = c->entry && !strcmp(c->ns, ns);
	if (reported) {
		metrics_add(agent_m.rewritten, NULL, 1);
		if (a->node_rc == -ENOENT)
			log_warn(
			    "this node's object was deleted (the operator deletes the objects of "
			    "nodes it cannot find, and there is no Node of this name); writing "
			    "it again",
			    "node", a->node, "namespace", ns);
		else
			log_info("this node's object was deleted; writing it again", "node",
			         a->node, "namespace", ns);
		agent_mark_dirty(a, ns);
	}
}

struct status_job {
	struct agent *a;
	struct nodeobj *n;
	cJSON *obj, *status;
	int rc;
	char err[512];
	/* the Node cannot be read: an Event on each new incarnation of the object */
	char warn_reason[32], warn_message[1024], warned_uid[64];
};

/* The NodeFound condition: can this agent read its Node? (Kubernetes only) */
static void node_condition(const struct agent *a, char *status, size_t slen, char *reason,
                           size_t rlen, char *message, size_t mlen)
{
	const char *st = "Unknown", *why = "NodeLookupFailed";
	switch (a->node_rc) {
	case 0:
		st = "True";
		why = "Found";
		snprintf(message, mlen, "Node %s owns this object (uid %s)", a->node, a->node_uid);
		break;
	case -ENOENT:
		st = "False";
		why = "NodeNotFound";
		snprintf(message, mlen,
		         "there is no Node named %s: the operator deletes node objects of nodes it "
		         "cannot find, and this agent writes them again; set the agent's --node "
		         "(NODE_NAME, from spec.nodeName) to its Kubernetes node name",
		         a->node);
		break;
	case -EACCES:
		why = "NodeForbidden";
		snprintf(message, mlen,
		         "the agent may not read Node %s (%s): its node objects get no owner and "
		         "are not removed with the node; give its service account get on nodes "
		         "(the chart's node ClusterRole)",
		         a->node, a->node_err);
		break;
	default:
		snprintf(message, mlen, "cannot read Node %s: %s; trying again", a->node,
		         a->node_err);
	}
	snprintf(status, slen, "%s", st);
	snprintf(reason, rlen, "%s", why);
}

/* Build the node object and its status from what the caches reported. */
static struct status_job *status_job_for(struct agent *a, struct nodeobj *n)
{
	struct status_job *sj = calloc(1, sizeof(*sj));
	if (!sj)
		return NULL;
	sj->a = a;
	sj->n = n;
	bool cluster = !*n->ns;
	cJSON *obj = cJSON_CreateObject();
	cJSON_AddStringToObject(obj, "apiVersion", GKM_API_VERSION);
	cJSON_AddStringToObject(obj, "kind", cluster ? "ClusterGKMCacheNode" : "GKMCacheNode");
	cJSON *meta = cJSON_AddObjectToObject(obj, "metadata");
	cJSON_AddStringToObject(meta, "name", a->node);
	if (!cluster)
		cJSON_AddStringToObject(meta, "namespace", n->ns);
	cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "labels"), "gkm.io/node", a->node);
	if (a->o.owner_node_refs && a->node_uid[0]) {
		cJSON *ref = cJSON_CreateObject();
		cJSON_AddStringToObject(ref, "apiVersion", "v1");
		cJSON_AddStringToObject(ref, "kind", "Node");
		cJSON_AddStringToObject(ref, "name", a->node);
		cJSON_AddStringToObject(ref, "uid", a->node_uid);
		cJSON_AddItemToArray(cJSON_AddArrayToObject(meta, "ownerReferences"), ref);
	}
	cJSON_AddStringToObject(cJSON_AddObjectToObject(obj, "spec"), "nodeName", a->node);

	cJSON *st = obj_without(obj, "spec");
	cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "metadata"),
	                                        "ownerReferences");
	cJSON *status = cJSON_AddObjectToObject(st, "status");
	cJSON *groups = cJSON_GetObjectItemCaseSensitive(a->gpus, "groups");
	cJSON_AddItemToObject(status, "gpus",
	                      groups ? cJSON_Duplicate(groups, 1) : cJSON_CreateArray());
	cJSON *caches = cJSON_AddObjectToObject(status, "caches");
	unsigned total = 0, ready = 0, failed = 0, incompatible = 0;
	for (struct cache *c = a->caches; c; c = c->next) {
		if (!c->entry || strcmp(c->ns, n->ns) != 0)
			continue;
		cJSON *e = cJSON_Duplicate(c->entry, 1);
		if (c->captures)
			cJSON_AddItemToObject(e, "captures", cJSON_Duplicate(c->captures, 1));
		cJSON_AddItemToObject(caches, c->name, e);
		const char *state = obj_str(c->entry, "state");
		total++;
		ready += !strcmp(state, "Ready");
		failed += !strcmp(state, "Failed");
		incompatible += !strcmp(state, "Incompatible"); /* not a failure */
	}
	/* the counts `kubectl get gkmcn` prints */
	cJSON_AddNumberToObject(status, "totalCaches", total);
	cJSON_AddNumberToObject(status, "readyCaches", ready);
	cJSON_AddNumberToObject(status, "failedCaches", failed);
	cJSON_AddNumberToObject(status, "incompatibleCaches", incompatible);
	char now[32];
	obj_now(now, sizeof(now));
	cJSON_AddStringToObject(status, "lastUpdated", now);
	if (a->o.owner_node_refs) {
		char cst[16], reason[32], message[1024];
		node_condition(a, cst, sizeof(cst), reason, sizeof(reason), message,
		               sizeof(message));
		cJSON *cond = cJSON_CreateObject();
		cJSON_AddStringToObject(cond, "type", "NodeFound");
		cJSON_AddStringToObject(cond, "status", cst);
		cJSON_AddStringToObject(cond, "reason", reason);
		cJSON_AddStringToObject(cond, "message", message);
		cJSON_AddStringToObject(cond, "lastTransitionTime", a->node_since);
		cJSON_AddItemToArray(cJSON_AddArrayToObject(status, "conditions"), cond);
		if (a->node_rc) {
			snprintf(sj->warn_reason, sizeof(sj->warn_reason), "%s", reason);
			snprintf(sj->warn_message, sizeof(sj->warn_message), "%s", message);
			snprintf(sj->warned_uid, sizeof(sj->warned_uid), "%s", n->warned_uid);
		}
	}
	sj->obj = n->created ? NULL : obj;
	if (n->created)
		cJSON_Delete(obj);
	/* no caches left in this namespace: no caches member (an applied {}
	 * would freeze the object, see objstore.h), which removes the entries */
	obj_drop_empty_maps(st);
	sj->status = st;
	return sj;
}

static void status_work(void *ud)
{
	struct status_job *sj = ud;
	struct objstore *os = sj->a->os;
	if (sj->obj)
		sj->rc = os->ops->apply(os, sj->obj, sj->a->manager, false, NULL, sj->err,
		                        sizeof(sj->err));
	cJSON *stored = NULL;
	if (!sj->rc)
		sj->rc = os->ops->apply(os, sj->status, sj->a->manager, true, &stored, sj->err,
		                        sizeof(sj->err));
	const char *uid = obj_str(stored, "metadata.uid");
	if (!sj->rc && sj->warn_reason[0] && *uid && strcmp(uid, sj->warned_uid) != 0) {
		os->ops->event(os, stored, "Warning", sj->warn_reason, sj->warn_message, NULL);
		snprintf(sj->warned_uid, sizeof(sj->warned_uid), "%s", uid);
	}
	cJSON_Delete(stored);
}

static void status_done(struct loop *l, void *ud)
{
	struct status_job *sj = ud;
	struct agent *a = sj->a;
	(void)l;
	a->jobs--;
	sj->n->writing = false;
	if (sj->rc) {
		agent_count_error("status_write");
		unsigned delay = backoff_ms(sj->n->failures++, a->o.status_debounce_ms,
		                            STATUS_BACKOFF_MAX_MS, &a->seed);
		char in[24];
		snprintf(in, sizeof(in), "%.1fs", delay / 1000.0);
		log_warn("node status write failed; will retry", "node", a->node, "namespace",
		         sj->n->ns, "in", in, "error", sj->err);
		sj->n->write_not_before = loop_now_ms() + delay;
		if (sj->rc == -ENOENT) /* the object was deleted: create it again */
			sj->n->created = false;
		if (!a->stopping) {
			sj->n->dirty = true;
			soon_timer_arm(&a->status_timer, delay);
		}
	} else {
		sj->n->failures = 0;
		sj->n->write_not_before = 0;
		if (sj->obj)
			sj->n->created = true;
		if (sj->warn_reason[0])
			snprintf(sj->n->warned_uid, sizeof(sj->n->warned_uid), "%s",
			         sj->warned_uid);
	}
	cJSON_Delete(sj->obj);
	cJSON_Delete(sj->status);
	free(sj);
}

void agent_flush_status(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	uint64_t now = loop_now_ms();
	for (struct nodeobj *n = a->nodeobjs; n; n = n->next) {
		if (!n->dirty)
			continue;
		/* one write per object at a time, none before its backoff: retry after */
		if (n->writing || n->write_not_before > now) {
			soon_timer_arm(&a->status_timer, n->writing ? a->o.status_debounce_ms
			                                            : n->write_not_before - now);
			continue;
		}
		struct status_job *sj = status_job_for(a, n);
		if (!sj)
			continue;
		n->dirty = false;
		n->writing = true;
		a->jobs++;
		if (workers_submit(a->workers, status_work, status_done, sj) != 0) {
			a->jobs--;
			n->writing = false;
			n->dirty = true;
			cJSON_Delete(sj->obj);
			cJSON_Delete(sj->status);
			free(sj);
		}
	}
}

/* ---- this node's Node ---- */

/* Node objects carry an ownerReference to their Node (the garbage collector
 * removes them with it), and the operator deletes the objects of nodes it
 * cannot find. An agent that cannot read its Node (a --node that names no
 * Node, or RBAC) says so where users look: the NodeFound condition and an
 * Event on its node objects, gkm_agent_node_found, the log; and it keeps
 * looking, so that a fixed RBAC or a Node that appears is picked up. */

struct node_job {
	struct agent *a;
	int rc;
	char uid[64], err[256];
	cJSON *labels;
};

static void node_set(struct agent *a, int rc, const char *uid, const char *err);

static void node_lookup_work(void *ud)
{
	struct node_job *nj = ud;
	struct objstore *os = nj->a->os;
	cJSON *node = NULL;
	nj->rc = os->ops->get(os, "v1", "Node", NULL, nj->a->node, &node, nj->err, sizeof(nj->err));
	if (!nj->rc) {
		snprintf(nj->uid, sizeof(nj->uid), "%s", obj_str(node, "metadata.uid"));
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(node, "metadata"), "labels");
		nj->labels = l ? cJSON_Duplicate(l, 1) : cJSON_CreateObject();
	}
	cJSON_Delete(node);
}

/* The Node's labels: which LocalModelCaches' node groups take this node. */
static void node_labels_seen(struct agent *a, cJSON *labels)
{
	if (!labels || (a->node_labels && cJSON_Compare(a->node_labels, labels, 1))) {
		cJSON_Delete(labels);
		return;
	}
	cJSON_Delete(a->node_labels);
	a->node_labels = labels;
	agent_place_all(a);
}

static void node_lookup_done(struct loop *l, void *ud)
{
	struct node_job *nj = ud;
	(void)l;
	nj->a->jobs--;
	if (!nj->a->stopping) {
		node_labels_seen(nj->a, nj->labels);
		nj->labels = NULL;
		node_set(nj->a, nj->rc, nj->uid, nj->err);
	}
	cJSON_Delete(nj->labels);
	free(nj);
}

void agent_node_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	a->node_timer = 0;
	struct node_job *nj = calloc(1, sizeof(*nj));
	if (nj) {
		nj->a = a;
		a->jobs++;
		if (workers_submit(a->workers, node_lookup_work, node_lookup_done, nj) == 0)
			return;
		a->jobs--;
		free(nj);
	}
	node_set(a, -ENOMEM, "", strerror(ENOMEM));
}

static void mark_all_nodeobjs(struct agent *a, bool reapply)
{
	for (struct nodeobj *n = a->nodeobjs; n; n = n->next) {
		if (reapply) /* the object itself changes: its ownerReference */
			n->created = false;
		agent_mark_dirty(a, n->ns);
	}
}

static void node_set(struct agent *a, int rc, const char *uid, const char *err)
{
	bool changed = rc != a->node_rc;
	a->node_rc = rc;
	if (changed) /* the labels are known now, or known to be none */
		agent_place_all(a);
	metrics_set(agent_m.node_found, NULL, rc == 0);
	if (changed)
		obj_now(a->node_since, sizeof(a->node_since));
	if (rc == 0) {
		snprintf(a->node_uid, sizeof(a->node_uid), "%s", uid);
		a->node_failures = 0;
		if (changed && a->node_failures == 0 && a->nodeobjs)
			log_info(
			    "this node's Node can be read now; its node objects get it as owner",
			    "node", a->node);
		if (changed)
			mark_all_nodeobjs(a, true);
		return;
	}
	agent_count_error("node_lookup");
	snprintf(a->node_err, sizeof(a->node_err), "%s", err);
	if (changed) {
		char st[16], reason[32], message[1024];
		node_condition(a, st, sizeof(st), reason, sizeof(reason), message, sizeof(message));
		log_warn("cannot read this node's Node; will keep trying", "node", a->node,
		         "reason", reason, "error", message);
		mark_all_nodeobjs(a, false);
	}
	if (!a->stopping)
		a->node_timer =
		    loop_add_timer(a->loop,
		                   backoff_ms(a->node_failures++, NODE_LOOKUP_BACKOFF_MS,
		                              NODE_LOOKUP_BACKOFF_MAX_MS, &a->seed),
		                   agent_node_tick, a);
}

void agent_node_lookup_now(struct agent *a)
{
	struct node_job nj = {.a = a};
	node_lookup_work(&nj);
	a->node_rc = 1; /* so that the first result counts as a change */
	node_labels_seen(a, nj.labels);
	node_set(a, nj.rc, nj.uid, nj.err);
}
