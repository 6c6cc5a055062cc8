/* The node agent (agent.h): the caches it watches, the GPUs it probes, its
 * periodic passes, start and stop. Its other parts are listed in agent_impl.h. */

#include "agent_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fallback_notice.h"
#include "gpu_sources.h"
#include "kube_workqueue.h"
#include "kube_affinity.h"
#include "local_model.h"
#include "oci_mirrors.h"
#include "log.h"
#include "node_capture.h"
#include "oci_ref.h"
#include "store.h"

struct agent_metrics agent_m;

void agent_count_error(const char *kind)
{
	metrics_add(agent_m.errors, METRICS_L(kind), 1);
}

static void init_metrics(void)
{
	static const double secs[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
	agent_m.reconciles = metrics_counter("gkm_agent_reconciles_total",
	                                     "Agent reconciles of a cache, by result", "result");
	agent_m.errors =
	    metrics_counter("gkm_agent_errors_total",
	                    "Agent failures, by kind (policy, gpu_probe, image, pull, view, "
	                    "status_write, node_lookup)",
	                    "kind");
	agent_m.pulls =
	    metrics_counter("gkm_pulls_total", "Image pulls into the store, by result", "result");
	agent_m.pulling = metrics_gauge(
	    "gkm_pulls_running",
	    "Image pulls running now on this node (in a rollout, only granted ones run)", NULL);
	metrics_set(agent_m.pulling, NULL, 0);
	agent_m.pull_bytes = metrics_counter(
	    "gkm_pull_bytes_total", "Bytes of extracted cache trees written to the store", NULL);
	agent_m.hits = metrics_counter(
	    "gkm_cache_hits_total", "Caches made ready from a digest already in the store", NULL);
	agent_m.verdicts = metrics_counter("gkm_compat_verdicts_total",
	                                   "Compatibility verdicts per GPU, by reason", "reason");
	agent_m.extract_s =
	    metrics_histogram("gkm_extraction_seconds", "Time to pull, verify and extract an image",
	                      NULL, secs, sizeof(secs) / sizeof(secs[0]));
	agent_m.node_found = metrics_gauge(
	    "gkm_agent_node_found",
	    "1 when the agent can read its Node (which owns its node objects), 0 when it cannot "
	    "(no such Node, or RBAC; always 0 in gkm up, which has none); see the NodeFound "
	    "condition of its node objects",
	    NULL);
	agent_m.rewritten = metrics_counter(
	    "gkm_agent_node_objects_rewritten_total",
	    "This node's objects written again after something else deleted them (the operator "
	    "deletes the objects of a node whose Node it cannot find)",
	    NULL);
	agent_m.misses = metrics_counter(
	    "gkm_cache_miss_kernels_total",
	    "Kernels pods compiled themselves because the cache they mount lacked them (new kernel "
	    "directories in a writable volume's own layer), by cache",
	    "namespace,cache");
	agent_m.source_checks = metrics_counter(
	    "gkm_agent_source_checks_total",
	    "Pulls that checked a cache's source (manifest, signatures, layers) at its registry "
	    "(checked), or took an earlier check of the same reference with the same credentials "
	    "and trust (shared)",
	    "result");
	/* unlabelled series exist from the start, so a scrape shows them at 0 */
	metrics_add(agent_m.pull_bytes, NULL, 0);
	metrics_add(agent_m.hits, NULL, 0);
	metrics_add(agent_m.rewritten, NULL, 0);
}

/* ---- caches ---- */

struct cache *agent_find_cache(struct agent *a, const char *key)
{
	for (struct cache *c = a->caches; c; c = c->next)
		if (!strcmp(c->key, key))
			return c;
	return NULL;
}

int agent_volume_dir(const struct agent *a, const char *key, const char *sub, char *buf, size_t len)
{
	if (!key || !*key || key[0] == '.' || strchr(key, '/'))
		return -EINVAL;
	int n = snprintf(buf, len, "%s/csi/volumes/%s%s%s", a->root, key, sub ? "/" : "",
	                 sub ? sub : "");
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static void cache_free(struct cache *c)
{
	cJSON_Delete(c->obj);
	oci_ref_clear(&c->pin);
	cJSON_Delete(c->targets);
	cJSON_Delete(c->entry);
	cJSON_Delete(c->captures);
	cJSON_Delete(c->live);
	free(c->demand);
	cJSON_Delete(c->misses);
	free(c->placed);
	free(c);
}

/* Only once no job of c runs: a running job's completion needs it. */
void agent_forget_cache(struct agent *a, struct cache *c)
{
	pull_sched_cancel(a->sched, &c->fetch.job);
	pull_sched_cancel(a->sched, &c->pull.job);
	node_capture_forget(a->root, c->ns, c->name);
	for (struct cache **p = &a->caches; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			cache_free(c);
			return;
		}
	}
}

/* A new digest or reference: what the old one did or failed says nothing
 * about it. A job still running ends on its own and is then ignored. */
void agent_attempt_reset(struct agent *a, struct attempt *att)
{
	pull_sched_cancel(a->sched, &att->job);
	att->failures = 0;
	att->permanent = att->recheck = false;
	att->retry_at = 0;
	att->retry_time[0] = att->reason[0] = att->message[0] = '\0';
}

void agent_enqueue(struct agent *a, const char *key, uint64_t delay_ms)
{
	if (delay_ms)
		kube_workqueue_add_after(a->queue, key, delay_ms, loop_now_ms());
	else
		kube_workqueue_add(a->queue, key);
	agent_kick(a);
}

static void enqueue_all(struct agent *a)
{
	for (struct cache *c = a->caches; c; c = c->next)
		kube_workqueue_add(a->queue, c->key);
	agent_kick(a);
}

/* The digest to use: the webhook's annotation, else what the operator resolved. */
static const char *cache_digest(const cJSON *obj)
{
	const cJSON *ann = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "annotations");
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(ann, "gkm.io/resolvedDigest");
	if (cJSON_IsString(d) && cache_view_valid_digest(d->valuestring))
		return d->valuestring;
	const char *s = obj_str(obj, "status.resolvedDigest");
	return cache_view_valid_digest(s) ? s : "";
}

/* spec.image pinned to digest (the agent pulls by digest only, never by
 * tag), parsed once here for every job of the cache; its canonical text in
 * text (where it does not parse, the image's own text: the jobs then fail
 * with err, and a change of it is still seen). */
static int pin_image(const char *image, const char *digest, struct oci_ref *out, char *text,
                     size_t len, struct oci_err *err)
{
	int rc = oci_ref_pin(image, digest, out, err);
	char *s = rc ? NULL : oci_ref_format(out);
	snprintf(text, len, "%s", s ? s : image);
	free(s);
	return rc;
}

/* Whether pulls of ref go through a mirror: a rollout's first wave is then
 * one node, which fills the mirror for the others. A configuration that
 * does not read says no here; the pull reports it. */
static bool mirrored(const struct agent *a, const struct oci_ref *ref)
{
	struct oci_mirrors *m = NULL;
	struct oci_route route;
	struct oci_err e = {{0}};
	bool yes = false;
	if ((a->reg.hosts_dir || a->reg.registries_conf) &&
	    oci_mirrors_load(a->reg.hosts_dir, a->reg.registries_conf, ref->registry, &m, &e) ==
	        0 &&
	    m && oci_mirrors_route(m, ref->registry, ref->repository, true, &route, &e) == 0)
		for (size_t i = 0; i < route.n; i++)
			yes = yes || route.ep[i].mirror;
	oci_mirrors_free(m);
	return yes;
}

/* The cache's reference changed to ref (parsed into pinned, or failed with
 * rc and err): what was learnt about the old one does not hold. */
static void set_image(struct agent *a, struct cache *c, const char *ref, struct oci_ref *pinned,
                      int rc, const struct oci_err *err)
{
	snprintf(c->ref, sizeof(c->ref), "%s", ref);
	oci_ref_clear(&c->pin);
	c->pin = *pinned;
	memset(pinned, 0, sizeof(*pinned));
	c->pin_rc = rc;
	snprintf(c->pin_err, sizeof(c->pin_err), "%s", rc ? oci_err_str(err, rc) : "");
	/* fair slots are per registry host */
	const char *host = "";
	if (*ref && !rc)
		host = c->pin.kind == OCI_REF_LAYOUT ? "oci-layout" : oci_ref_api_host(&c->pin);
	snprintf(c->host, sizeof(c->host), "%s", host);
	c->mirrored = *ref && !rc && c->pin.kind != OCI_REF_LAYOUT && mirrored(a, &c->pin);
	agent_attempt_reset(a, &c->pull);
}

static bool user_edited(const cJSON *before, const cJSON *after)
{
	static const char *const paths[][2] = {{"metadata", "generation"},
	                                       {"metadata", "annotations"}};
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		const cJSON *x = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(before, paths[i][0]), paths[i][1]);
		const cJSON *y = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(after, paths[i][0]), paths[i][1]);
		if (!(x ? y && cJSON_Compare(x, y, 1) : !y))
			return true;
	}
	return false;
}

/* One more try for a failure that only a change can fix. */
static void recheck_permanent(struct cache *c)
{
	c->fetch.recheck = c->fetch.failures && c->fetch.permanent;
	c->pull.recheck = c->pull.failures && c->pull.permanent;
}

/* Whether c is for this node: a LocalModelCache's kernel cache whose node
 * groups leave this node out (or before the Node's labels are known) is
 * away, and so is a cache whose spec.nodeSelector or node affinity does not
 * select this node's Node. Away is handled as deleted: the view stays while
 * a pod uses it, and nothing is reported. A selection waits for the Node's
 * labels (undecided); where there is no Node to read (gkm up), or it cannot
 * be read, the node has no labels. */
void agent_place_cache(const struct agent *a, struct cache *c)
{
	char path[PATH_MAX];
	const cJSON *spec = cJSON_GetObjectItemCaseSensitive(c->obj, "spec");
	bool selects = c->obj && kube_affinity_set(spec);
	bool labels_known = !a->o.owner_node_refs || a->node_rc != 1;
	c->undecided = selects && !labels_known;
	c->away = c->obj && !c->undecided &&
	          ((*local_model_name(c->obj) &&
	            !local_model_here(c->obj, a->node, a->node_labels, path, sizeof(path))) ||
	           (selects && !kube_affinity_selects(spec, a->node, a->node_labels)));
	if (!c->obj || c->away || c->undecided) {
		pull_sched_cancel(a->sched, &c->fetch.job);
		pull_sched_cancel(a->sched, &c->pull.job);
	}
}

void agent_place_all(struct agent *a)
{
	for (struct cache *c = a->caches; c; c = c->next) {
		agent_place_cache(a, c);
		agent_enqueue(a, c->key, 0);
	}
}

/* Whether what verified c's digest is still trusted (always, when nothing
 * is verified on the node). */
static bool still_trusted(const struct agent *a, const struct cache *c)
{
	if (!a->trust || !a->trust->s.verify_enabled)
		return true;
	return c->verified_by[0] && sig_keyset_has(a->trust->keys, c->verified_by);
}

static void on_cache_event(void *ud, enum objstore_event_type t, const cJSON *obj)
{
	struct agent *a = ud;
	char key[320];
	const char *ns = obj_str(obj, "metadata.namespace"), *name = obj_str(obj, "metadata.name");
	if (!cache_view_valid_name(name) || (*ns && !cache_view_valid_namespace(ns)))
		return;
	snprintf(key, sizeof(key), "%s/%s", *ns ? ns : CACHE_VIEW_CLUSTER, name);
	struct cache *c = agent_find_cache(a, key);
	bool created = !c;
	if (!c) {
		if (t == OBJSTORE_DELETED)
			return;
		c = calloc(1, sizeof(*c));
		if (!c)
			return;
		snprintf(c->key, sizeof(c->key), "%s", key);
		snprintf(c->ns, sizeof(c->ns), "%s", ns);
		snprintf(c->name, sizeof(c->name), "%s", name);
		/* after a restart the view tells what was linked and ready before */
		char linked[CACHE_VIEW_DIGEST_LEN + 1];
		struct cache_view_ready r;
		if (cache_view_linked_digest(a->root, ns, name, linked) == 0)
			snprintf(c->view_digest, sizeof(c->view_digest), "%s", linked);
		if (cache_view_ready_read(a->root, ns, name, &r, NULL, 0) == 0) {
			c->record = strcmp(r.state, "Ready") ? REC_UNKNOWN : REC_READY;
			snprintf(c->verified_by, sizeof(c->verified_by), "%s", r.verified_by);
			cache_view_ready_free(&r);
		}
		c->captures = node_capture_records_load(a->root, ns, name);
		c->next = a->caches;
		a->caches = c;
	}
	/* a user's edit (spec or annotations: `kubectl annotate gkmc NAME
	 * gkm.io/recheck=...`) is a change a permanent failure waits for, e.g.
	 * after the image was signed; the status the operator writes is not */
	if (c->obj && t != OBJSTORE_DELETED && user_edited(c->obj, obj)) {
		recheck_permanent(c);
		agent_evict_edited(c);
	}
	cJSON_Delete(c->obj);
	c->obj = t == OBJSTORE_DELETED ? NULL : cJSON_Duplicate(obj, 1);
	agent_place_cache(a, c);
	if (c->obj && !c->away && !c->undecided) {
		const char *d = cache_digest(obj);
		char ref[sizeof(c->ref)] = "";
		struct oci_ref pinned = {0};
		struct oci_err e = {{0}};
		int rc =
		    *d ? pin_image(obj_str(obj, "spec.image"), d, &pinned, ref, sizeof(ref), &e)
		       : 0;
		if (strcmp(d, c->digest) != 0) {
			snprintf(c->digest, sizeof(c->digest), "%s", d);
			c->image = IMG_UNKNOWN;
			c->targets_need_pull = false;
			agent_attempt_reset(a, &c->fetch);
		}
		if (strcmp(ref, c->ref) != 0)
			set_image(a, c, ref, &pinned, rc, &e);
		oci_ref_clear(&pinned);
		/* after a restart: the view was published only once a pull of
		 * this cache had verified the digest through its own reference
		 * (with a key still trusted) */
		if (created && *d && !strcmp(c->view_digest, d) && still_trusted(a, c))
			snprintf(c->verified_ref, sizeof(c->verified_ref), "%s", ref);
	}
	agent_enqueue(a, key, 0);
}

/* ---- GPUs, resync, lifecycle ---- */

static int probe(struct agent *a, cJSON **out)
{
	struct gpu_probe *p = NULL;
	char err[512] = "";
	const char *src = a->o.gpu_source ? a->o.gpu_source : "auto";
	int rc;
	if (!strcmp(src, "file"))
		rc = gpu_file_probe(a->o.gpu_file, &p, err, sizeof(err));
	else if (!strcmp(src, "nvml"))
		rc = gpu_nvml_probe(a->o.nvml_lib, &p, err, sizeof(err));
	else if (!strcmp(src, "rocm"))
		rc = gpu_rocm_probe(a->o.sysfs_root, &p, err, sizeof(err));
	else
		rc = gpu_probe_auto(a->o.nvml_lib, a->o.sysfs_root, &p, err, sizeof(err));
	if (rc) {
		agent_count_error("gpu_probe");
		log_error("GPU probe failed", "source", src, "error", err);
		return rc;
	}
	*out = gpu_probe_to_json(p);
	gpu_probe_free(p);
	return *out ? 0 : -ENOMEM;
}

void agent_reprobe(struct agent *a)
{
	cJSON *g = NULL;
	if (probe(a, &g) != 0)
		return;
	bool first = !a->probed;
	a->probed = true;
	if (a->gpus && cJSON_Compare(a->gpus, g, 1)) {
		cJSON_Delete(g);
		return;
	}
	cJSON_Delete(a->gpus);
	a->gpus = g;
	char count[16];
	snprintf(count, sizeof(count), "%d",
	         cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g, "gpus")));
	log_info(first ? "GPUs probed" : "GPUs changed", "node", a->node, "gpus", count);
	agent_mark_dirty(a, "");
	enqueue_all(a);
}

static void probe_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	agent_reprobe(a);
	a->probe_timer = loop_add_timer(l, (uint64_t)a->o.reprobe_s * 1000, probe_tick, a);
}

/* Pod usage changes (CSI) and store state are picked up by a periodic pass. */
/* Does a cache depend on this node's labels (a LocalModelCache's node
 * groups and a cache's node selection select nodes by them)? */
static bool wants_node_labels(const struct agent *a)
{
	for (const struct cache *c = a->caches; c; c = c->next)
		if (c->obj && (*local_model_name(c->obj) ||
		               kube_affinity_set(cJSON_GetObjectItemCaseSensitive(c->obj, "spec"))))
			return true;
	return false;
}

static void resync_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	enqueue_all(a);
	agent_gc_request(a);
	/* labels change: read them again (a lookup that failed retries anyway) */
	if (a->o.owner_node_refs && !a->node_timer && wants_node_labels(a))
		agent_node_tick(l, a);
	fallback_notice_scan(a->notice, a->run_dir);
	a->resync_timer = loop_add_timer(l, (uint64_t)a->o.resync_s * 1000, resync_tick, a);
}

/* The CSI plugin rewrites a cache's usage file as the kubelet publishes and
 * unpublishes volumes. One stat per cache each USAGE_POLL_MS brings a change
 * into node status (and releases a deleted cache's last use) at once, not at
 * the next resync. */
static void usage_tick(struct loop *l, void *ud)
{
	struct agent *a = ud;
	bool changed = false;
	for (struct cache *c = a->caches; c; c = c->next) {
		struct cache_view_usage_stamp st;
		if (cache_view_usage_stamp(a->run_dir, c->ns, c->name, &st) != 0 ||
		    memcmp(&st, &c->usage_seen, sizeof(st)) == 0)
			continue;
		c->usage_seen = st;
		kube_workqueue_add(a->queue, c->key);
		changed = true;
	}
	if (changed)
		agent_kick(a);
	agent_captures_start(a);
	a->usage_timer = loop_add_timer(l, USAGE_POLL_MS, usage_tick, a);
}

/* New policies may change what a permanent failure was about (a trusted
 * key, an allowed unsigned image): each gets one more try. */
void agent_policies_changed(struct agent *a)
{
	for (struct cache *c = a->caches; c; c = c->next)
		recheck_permanent(c);
	enqueue_all(a);
}

void agent_set_trust(struct agent *a, struct trust *t)
{
	struct trust *old = a->trust;
	unsigned again = 0;
	a->trust = t ? trust_ref(t) : NULL;
	trust_unref(old);
	agent_checks_forget(a); /* what they proved was under the old trust */
	for (struct cache *c = a->caches; c; c = c->next) {
		recheck_permanent(c);
		if (c->verified_ref[0] && !still_trusted(a, c)) {
			/* not mountable until its own pull verifies it again */
			c->verified_ref[0] = '\0';
			again++;
		}
	}
	char n[24];
	snprintf(n, sizeof(n), "%u", again);
	log_info("trusted keys changed", "keys", t ? t->keys_fp : "none", "verify_again", n);
	enqueue_all(a);
}

bool agent_ready(const struct agent *a)
{
	return a->probed && a->synced_caches && a->synced_cluster;
}

static void synced_ns(void *ud)
{
	((struct agent *)ud)->synced_caches = true;
}

static void synced_cluster(void *ud)
{
	((struct agent *)ud)->synced_cluster = true;
}

int agent_start(struct loop *l, struct workers *w, struct objstore *os,
                struct engine_slot *policies, const struct agent_opts *o, struct agent **out)
{
	if (!o->node || !cache_view_valid_name(o->node) || !o->root || !o->run_dir)
		return -EINVAL;
	struct agent *a = calloc(1, sizeof(*a));
	int rc;
	if (!a)
		return -ENOMEM;
	init_metrics();
	pthread_mutex_init(&a->clients_lock, NULL);
	if (agent_checks_new(a) != 0) {
		agent_checks_free(a);
		pthread_mutex_destroy(&a->clients_lock);
		free(a);
		return -ENOMEM;
	}
	a->loop = l;
	soon_timer_init(&a->status_timer, l, agent_flush_status, a);
	a->workers = w;
	a->os = os;
	a->policies = policies;
	a->o = *o;
	a->trust = o->trust ? trust_ref(o->trust) : NULL;
	snprintf(a->node, sizeof(a->node), "%s", o->node);
	snprintf(a->root, sizeof(a->root), "%s", o->root);
	snprintf(a->run_dir, sizeof(a->run_dir), "%s", o->run_dir);
	snprintf(a->manager, sizeof(a->manager), MANAGER_PREFIX "%s", o->node);
	a->o.node = a->node;
	a->o.root = a->root;
	a->o.run_dir = a->run_dir;
	if (!a->o.max_pulls)
		a->o.max_pulls = 2;
	if (!a->o.reprobe_s)
		a->o.reprobe_s = 300;
	if (!a->o.resync_s)
		a->o.resync_s = 30;
	if (!a->o.status_debounce_ms)
		a->o.status_debounce_ms = 200;
	if (!a->o.store_high_percent)
		a->o.store_high_percent = AGENT_STORE_HIGH_PERCENT;
	if (!a->o.store_low_percent || a->o.store_low_percent >= a->o.store_high_percent)
		a->o.store_low_percent = a->o.store_high_percent > AGENT_STORE_LOW_PERCENT
		                             ? AGENT_STORE_LOW_PERCENT
		                             : a->o.store_high_percent - 1;
	/* a failed request is tried again by the agent after a backoff that
	 * holds no slot, not by the registry client sleeping in one */
	if (o->registry)
		a->reg = *o->registry;
	else
		oci_registry_opts_init(&a->reg);
	a->reg.retries = 0;
	a->reg.cancel = &a->cancel;
	a->o.registry = &a->reg;
	unsigned slots[PULL_SCHED_LANES] = {
	    [PULL_SCHED_FETCH] = FETCH_SLOTS, [PULL_SCHED_PULL] = a->o.max_pulls};
	if ((rc = pull_sched_new(slots, &a->sched)) ||
	    (rc = workers_new(l, FETCH_SLOTS + a->o.max_pulls, &a->pool)) ||
	    (rc = fallback_notice_new(w, os, &a->notice))) {
		agent_stop(a);
		return rc;
	}
	char store_root[600];
	snprintf(store_root, sizeof(store_root), "%s/store", a->root);
	struct kube_workqueue_opts qo = {
	    .max_in_flight = 64, .base_delay_ms = 500, .max_delay_ms = 300000};
	if ((rc = store_open(store_root, &a->store)) || (rc = kube_workqueue_new(&qo, &a->queue))) {
		log_error("cannot open the store", "path", store_root, "error", strerror(-rc));
		agent_stop(a);
		return rc;
	}
	if ((rc = agent_budget_start(a))) {
		agent_stop(a);
		return rc;
	}
	if (o->owner_node_refs) {
		agent_node_lookup_now(a); /* before the first status write */
	}
	agent_reprobe(a);
	a->probe_timer = loop_add_timer(l, (uint64_t)a->o.reprobe_s * 1000, probe_tick, a);
	a->resync_timer = loop_add_timer(l, (uint64_t)a->o.resync_s * 1000, resync_tick, a);
	a->usage_timer = loop_add_timer(l, USAGE_POLL_MS, usage_tick, a);
	struct objstore_watch ns_w = {.api_version = GKM_API_VERSION,
	                              .kind = "GKMCache",
	                              .on_event = on_cache_event,
	                              .on_synced = synced_ns,
	                              .ud = a};
	struct objstore_watch cl_w = {.api_version = GKM_API_VERSION,
	                              .kind = "ClusterGKMCache",
	                              .on_event = on_cache_event,
	                              .on_synced = synced_cluster,
	                              .ud = a};
	char mine[300];
	snprintf(mine, sizeof(mine), "gkm.io/node=%s", a->node);
	struct objstore_watch ns_nw = {.api_version = GKM_API_VERSION,
	                               .kind = "GKMCacheNode",
	                               .label_selector = mine,
	                               .on_event = agent_on_nodeobj_event,
	                               .ud = a,
	                               .no_cache = true, /* only deletions matter */
	                               .list_page = GKM_NODEOBJ_LIST_PAGE};
	struct objstore_watch cl_nw = ns_nw;
	cl_nw.kind = "ClusterGKMCacheNode";
	if ((rc = os->ops->watch(os, &ns_w)) || (rc = os->ops->watch(os, &cl_w)) ||
	    (rc = os->ops->watch(os, &ns_nw)) || (rc = os->ops->watch(os, &cl_nw))) {
		agent_stop(a);
		return rc;
	}
	agent_mark_dirty(a, ""); /* the ClusterGKMCacheNode exists as soon as the agent runs */
	*out = a;
	return 0;
}

void agent_quiesce(struct agent *a)
{
	a->stopping = true;
	/* running registry jobs end (a registry that hangs does not hold the
	 * shutdown) and post their completions (loop_drain) */
	atomic_store(&a->cancel, true);
	workers_free(a->pool);
	a->pool = NULL;
}

void agent_stop(struct agent *a)
{
	if (!a)
		return;
	a->stopping = true;
	if (a->kick_timer)
		loop_cancel_timer(a->loop, a->kick_timer);
	if (a->resync_timer)
		loop_cancel_timer(a->loop, a->resync_timer);
	if (a->usage_timer)
		loop_cancel_timer(a->loop, a->usage_timer);
	if (a->probe_timer)
		loop_cancel_timer(a->loop, a->probe_timer);
	soon_timer_cancel(&a->status_timer);
	if (a->sched_timer)
		loop_cancel_timer(a->loop, a->sched_timer);
	if (a->node_timer)
		loop_cancel_timer(a->loop, a->node_timer);
	agent_budget_stop(a);
	workers_free(a->pool);
	if (a->clients_timer)
		loop_cancel_timer(a->loop, a->clients_timer);
	agent_clients_drop_idle(a->loop, a);
	pthread_mutex_destroy(&a->clients_lock);
	agent_checks_free(a);
	while (a->caches) {
		struct cache *c = a->caches;
		a->caches = c->next;
		cache_free(c);
	}
	while (a->nodeobjs) {
		struct nodeobj *n = a->nodeobjs;
		a->nodeobjs = n->next;
		free(n);
	}
	cJSON_Delete(a->gpus);
	cJSON_Delete(a->node_labels);
	fallback_notice_free(a->notice);
	pull_sched_free(a->sched);
	kube_workqueue_free(a->queue);
	store_close(a->store);
	trust_unref(a->trust);
	free(a);
}
