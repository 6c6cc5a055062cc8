/* The agent's reconcile of one cache: the policy's decision, the view the
 * store publishes, the node's record of it. */

#include "agent_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cache_misses.h"
#include "fallback_notice.h"
#include "kube_workqueue.h"
#include "local_model.h"
#include "log.h"
#include "node_capture.h"
#include "store.h"

static int validate_decision(const cJSON *r, char *err, size_t errlen)
{
	static const char *const known[] = {"fetch_image", "pull", "link", "unlink"};
	const cJSON *actions = cJSON_GetObjectItemCaseSensitive(r, "actions"), *act;
	const cJSON *entry = cJSON_GetObjectItemCaseSensitive(r, "entry");
	if (!cJSON_IsObject(r) || !(cJSON_IsArray(actions) || cJSON_IsObject(actions))) {
		snprintf(err, errlen, "want {entry, actions}");
		return -1;
	}
	cJSON_ArrayForEach(act, actions)
	{
		const char *t = obj_str(act, "type");
		size_t i = 0;
		while (i < sizeof(known) / sizeof(known[0]) && strcmp(known[i], t))
			i++;
		if (i == sizeof(known) / sizeof(known[0])) {
			snprintf(err, errlen, "unknown action '%s'", t);
			return -1;
		}
	}
	if (entry && (!cJSON_IsObject(entry) || !*obj_str(entry, "state"))) {
		snprintf(err, errlen, "entry must be a table with a state");
		return -1;
	}
	return 0;
}

static cJSON *compat_verdicts(struct agent *a, struct cache *c)
{
	cJSON *in = cJSON_CreateObject(), *out = NULL;
	cJSON *cache = cJSON_AddObjectToObject(in, "cache");
	cJSON_AddStringToObject(cache, "name", c->key);
	cJSON_AddItemToObject(cache, "targets", cJSON_Duplicate(c->targets, 1));
	cJSON *gpus = cJSON_GetObjectItemCaseSensitive(a->gpus, "gpus");
	cJSON_AddItemToObject(in, "gpus", gpus ? cJSON_Duplicate(gpus, 1) : cJSON_CreateArray());
	struct engine_error err;
	if (engine_call(a->policies->current, "compat", in, &out, &err) != ENGINE_OK) {
		agent_count_error("policy");
		log_error("compat policy failed", "cache", c->key, "error", err.message);
		/* the first line: the traceback stays in the log */
		err.message[strcspn(err.message, "\n")] = '\0';
		out = cJSON_CreateObject();
		cJSON_AddStringToObject(out, "error", err.message);
	}
	cJSON_Delete(in);
	const cJSON *v;
	cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(out, "gpus"))
	{
		metrics_add(agent_m.verdicts, METRICS_L(obj_str(v, "reason")), 1);
	}
	return out;
}

static const char *const image_states[] = {"unknown", "fetching", "ready"};

/* state "failed" with why, and when (if ever by itself) it is tried again;
 * reported from the first failure until a try succeeds, retries included */
static void failure_json(cJSON *o, const struct attempt *att)
{
	cJSON_ReplaceItemInObjectCaseSensitive(o, "state", cJSON_CreateString("failed"));
	cJSON_AddStringToObject(o, "reason", att->reason);
	cJSON_AddStringToObject(o, "message", att->message);
	cJSON_AddNumberToObject(o, "attempts", att->failures);
	cJSON_AddBoolToObject(o, "permanent", att->permanent);
	if (att->recheck)
		cJSON_AddBoolToObject(o, "recheck", true);
	if (!att->permanent) {
		uint64_t now = loop_now_ms();
		cJSON_AddStringToObject(o, "nextAttemptTime", att->retry_time);
		cJSON_AddNumberToObject(
		    o, "retryIn", att->retry_at > now ? (double)(att->retry_at - now) / 1000 : 0);
	}
}

/* usage = {pods = n, list = [{podName, podNamespace, podUID, volumeId}],
 * fallback = [{..., state, reason, message}]}: the CSI plugin's records, in
 * the shape of the node status pods[] and fallbackPods[]; a fallback volume
 * (an empty directory instead of the cache) does not use the cache. */
/* A writable volume's size-limited layer (csi/csi_layer.h), as the CSI
 * plugin keeps it under ROOT/csi: its limit and what the pod wrote, rounded
 * to MiB so that a writing pod does not rewrite the node status at every
 * reconcile. Nothing for a volume without a layer. */
static void layer_usage(const struct agent *a, const char *key, cJSON *o)
{
	char vdir[PATH_MAX], layer[PATH_MAX];
	struct stat sd, sl;
	struct statvfs sv;
	if (agent_volume_dir(a, key, NULL, vdir, sizeof(vdir)) != 0 ||
	    agent_volume_dir(a, key, "layer", layer, sizeof(layer)) != 0)
		return;
	/* a mount of its own: another device than the directory it is in */
	if (stat(vdir, &sd) != 0 || stat(layer, &sl) != 0 || sd.st_dev == sl.st_dev ||
	    statvfs(layer, &sv) != 0)
		return;
	uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize;
	uint64_t used = total - (uint64_t)sv.f_bfree * sv.f_frsize;
	cJSON_AddNumberToObject(o, "sizeLimitBytes", (double)total);
	cJSON_AddNumberToObject(o, "writtenBytes", (double)(used >> 20 << 20));
}

/* What the pod compiled itself (cache_misses.h): the kernels of its upper
 * layer, or its onMiss "empty" directory, that the cache's tree lacks;
 * nothing when that cannot be told. */
static void volume_misses(const struct agent *a, const struct cache *c,
                          const struct cache_view_pod *p, cJSON *o)
{
	const char *own = p->fallback ? "fallback" : "upper";
	char sub[16], dir[PATH_MAX];
	struct cache_misses m;
	/* in the size-limited layer when the volume has one (csi/csi_node_dirs.c) */
	snprintf(sub, sizeof(sub), "layer/%s", own);
	if (agent_volume_dir(a, p->volume_id, sub, dir, sizeof(dir)) != 0)
		return;
	if (access(dir, F_OK) != 0 && agent_volume_dir(a, p->volume_id, own, dir, sizeof(dir)))
		return;
	if (cache_misses_of_volume(a->root, c->ns, c->name, p->fallback ? NULL : c->view_digest,
	                           dir, &m) == 0)
		(void)cache_misses_json(&m, o); /* out of memory: reported without them */
}

/* A Warning Event on the pod that compiled kernels the cache lacks. */
static void tell_misses(struct agent *a, const struct cache *c, const cJSON *p, int kernels)
{
	char msg[900], names[600] = "";
	const cJSON *k;
	size_t at = 0;
	cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(p, "missedKernels"))
	{
		if (cJSON_IsString(k) && at + strlen(k->valuestring) + 3 < sizeof(names))
			at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%s",
			                       at ? ", " : "", k->valuestring);
	}
	snprintf(msg, sizeof(msg),
	         "compiled %d kernel%s that %s %s%s%s lacks (%s%s); they stay in this pod's "
	         "volume, and the cache's spec.capture can collect them into a candidate image",
	         kernels, kernels == 1 ? "" : "s", *c->ns ? "GKMCache" : "ClusterGKMCache", c->ns,
	         *c->ns ? "/" : "", c->name, names,
	         kernels > (int)CACHE_MISSES_NAMES ? ", ..." : "");
	fallback_notice_pod_event(a->notice, obj_str(p, "podName"), obj_str(p, "podNamespace"),
	                          obj_str(p, "podUID"), "KernelsCompiled", msg);
}

/* gkm_cache_miss_kernels_total grows by what each volume compiled since it
 * was last counted (live, then as its pod finished), and a live pod is told
 * when that first happens and each time the count doubles; volumes gone
 * are forgotten. */
static void count_misses(struct agent *a, struct cache *c, const cJSON *list, const cJSON *fallback,
                         const cJSON *finished)
{
	cJSON *seen = cJSON_CreateObject();
	const cJSON *lists[] = {list, fallback, finished}, *p;
	for (int i = 0; i < 3 && seen; i++) {
		cJSON_ArrayForEach(p, lists[i])
		{
			const cJSON *m = cJSON_GetObjectItemCaseSensitive(p, "misses");
			const char *vol = obj_str(p, "volumeId");
			if (!cJSON_IsNumber(m) || !*vol)
				continue;
			const cJSON *was = cJSON_GetObjectItemCaseSensitive(c->misses, vol);
			double before = cJSON_IsNumber(was) ? was->valuedouble : 0;
			if (m->valuedouble > before)
				metrics_add(agent_m.misses, METRICS_L(c->ns, c->name),
				            m->valuedouble - before);
			if (i < 2 && m->valuedouble > 0 && m->valuedouble >= 2 * before)
				tell_misses(a, c, p, (int)m->valuedouble);
			cJSON_AddNumberToObject(seen, vol,
			                        m->valuedouble > before ? m->valuedouble : before);
		}
	}
	cJSON_Delete(c->misses);
	c->misses = seen;
}

static cJSON *usage_json(struct agent *a, struct cache *c, const struct cache_view_usage *u)
{
	cJSON *usage = cJSON_CreateObject();
	cJSON *list = cJSON_AddArrayToObject(usage, "list");
	cJSON *fallback = cJSON_AddArrayToObject(usage, "fallback");
	for (size_t i = 0; u && i < u->npods; i++) {
		const struct cache_view_pod *p = &u->pods[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "podName", p->name ? p->name : "");
		cJSON_AddStringToObject(o, "podNamespace", p->namespace ? p->namespace : "");
		cJSON_AddStringToObject(o, "podUID", p->uid ? p->uid : "");
		cJSON_AddStringToObject(o, "volumeId", p->volume_id ? p->volume_id : "");
		if (!p->read_only || p->fallback) {
			layer_usage(a, p->volume_id, o);
			volume_misses(a, c, p, o);
		}
		if (p->fallback) {
			cJSON_AddStringToObject(o, "state", p->fallback_state);
			cJSON_AddStringToObject(o, "reason", p->fallback_reason);
			cJSON_AddStringToObject(o, "message", p->fallback_message);
		}
		cJSON_AddItemToArray(p->fallback ? fallback : list, o);
	}
	cJSON_AddNumberToObject(usage, "pods", cJSON_GetArraySize(list));
	/* the pods that finished here, with what they compiled (csi unpublish) */
	cJSON *finished = u && u->finished ? cJSON_Duplicate(u->finished, true) : NULL;
	if (finished)
		cJSON_AddItemToObject(usage, "finished", finished);
	count_misses(a, c, list, fallback, finished);
	return usage;
}

/* What this node needs to know of c's rollout (lua/gkm/rollout.lua grants
 * pulls in the cache's status.rollout; lua/gkm/agent.lua decides from this
 * whether the node waits for its grant). */
static cJSON *rollout_json(const struct agent *a, const struct cache *c)
{
	const cJSON *max = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->obj, "spec"),
	                                     "rollout"),
	    "maxPulling");
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(c->obj, "status"), "rollout");
	bool current = *c->digest && !strcmp(obj_str(st, "digest"), c->digest);
	cJSON *r = cJSON_CreateObject();
	if (cJSON_IsNumber(max) || cJSON_IsString(max))
		cJSON_AddItemToObject(r, "maxPulling", cJSON_Duplicate(max, false));
	cJSON_AddBoolToObject(r, "mirrored", c->mirrored);
	const char *lists[] = {"pulling", "waiting"};
	for (size_t i = 0; i < 2; i++) {
		const cJSON *l = current ? cJSON_GetObjectItemCaseSensitive(st, lists[i]) : NULL,
		            *n;
		int at = 0, place = 0;
		cJSON_ArrayForEach(n, l)
		{
			at++;
			if (!place && cJSON_IsString(n) && !strcmp(n->valuestring, a->node))
				place = at;
		}
		char key[16];
		snprintf(key, sizeof(key), "%sPlace", lists[i]);
		cJSON_AddNumberToObject(r, lists[i], at);
		if (place)
			cJSON_AddNumberToObject(r, key, place);
	}
	const cJSON *limit = cJSON_GetObjectItemCaseSensitive(st, "maxPulling");
	if (current && cJSON_IsNumber(limit))
		cJSON_AddNumberToObject(r, "limit", limit->valuedouble);
	return r;
}

static cJSON *decide_input(struct agent *a, struct cache *c, const struct cache_view_usage *u)
{
	char now[32];
	obj_now(now, sizeof(now));
	cJSON *in = cJSON_CreateObject();
	cJSON_AddStringToObject(in, "node", a->node);
	cJSON_AddStringToObject(in, "now", now);
	if (c->obj && c->away)
		cJSON_AddBoolToObject(in, "away", true);
	if (c->obj && !c->away) {
		cJSON *cache = cJSON_AddObjectToObject(in, "cache");
		cJSON_AddStringToObject(cache, "kind", obj_str(c->obj, "kind"));
		cJSON_AddStringToObject(cache, "namespace", c->ns);
		cJSON_AddStringToObject(cache, "name", c->name);
		cJSON_AddStringToObject(cache, "image", obj_str(c->obj, "spec.image"));
		cJSON_AddStringToObject(cache, "digest", c->digest);
		cJSON_AddBoolToObject(cache, "deleting",
		                      *obj_str(c->obj, "metadata.deletionTimestamp") != '\0');
	}
	cJSON *gpus = cJSON_GetObjectItemCaseSensitive(a->gpus, "gpus");
	cJSON_AddItemToObject(in, "gpus", gpus ? cJSON_Duplicate(gpus, 1) : cJSON_CreateArray());
	bool image_current = !strcmp(c->image_digest, c->digest);
	cJSON *image = cJSON_AddObjectToObject(in, "image");
	cJSON_AddStringToObject(image, "state",
	                        image_states[image_current ? c->image : IMG_UNKNOWN]);
	/* without labels the targets come from the pull: its failure is the image's */
	const struct attempt *image_failure = c->fetch.failures                          ? &c->fetch
	                                      : c->targets_need_pull && c->pull.failures ? &c->pull
	                                                                                 : NULL;
	if (image_failure)
		failure_json(image, image_failure);
	if (c->targets_need_pull) /* no labels: reading the image is a pull */
		cJSON_AddBoolToObject(image, "pullToRead", true);
	if (image_current && c->image == IMG_READY && a->policies->current) {
		cJSON *v = compat_verdicts(a, c);
		if (v)
			cJSON_AddItemToObject(in, "compat", v);
	}
	/* present for this cache: in the store, and verified through this
	 * cache's own reference (another cache's check vouches for nothing) */
	const char *sd = c->store_digest[0] ? c->store_digest : c->digest;
	bool present =
	    *c->digest && !strcmp(c->verified_ref, c->ref) && store_lookup(a->store, sd, NULL) == 0;
	cJSON *store = cJSON_AddObjectToObject(in, "store");
	agent_evict_input(a, c, store, &present); /* not present while evicted */
	cJSON_AddBoolToObject(store, "present", present);
	cJSON *pull = cJSON_AddObjectToObject(in, "pull");
	cJSON_AddStringToObject(pull, "state",
	                        c->pull.job.queued || c->pull.job.running ? "running" : "idle");
	if (c->pull.failures && !c->targets_need_pull)
		failure_json(pull, &c->pull);
	cJSON *view = cJSON_AddObjectToObject(in, "view");
	if (c->view_digest[0]) {
		cJSON_AddStringToObject(view, "digest", c->view_digest);
		cJSON_AddBoolToObject(view, "ready", c->record == REC_READY);
	}
	struct cache_view_ready r;
	if (c->view_digest[0] && !(image_current && c->image == IMG_READY) &&
	    cache_view_ready_read(a->root, c->ns, c->name, &r, NULL, 0) == 0) {
		/* what the view was published for, while the image facts are read
		 * again (after a restart) */
		cJSON *ids = cJSON_AddArrayToObject(view, "compatibleGPUs");
		for (size_t i = 0; i < r.ncompatible_gpus; i++)
			cJSON_AddItemToArray(ids, cJSON_CreateString(r.compatible_gpus[i]));
		cache_view_ready_free(&r);
	}
	cJSON_AddItemToObject(in, "usage", usage_json(a, c, u));
	if (c->obj)
		cJSON_AddItemToObject(in, "rollout", rollout_json(a, c));
	if (c->entry)
		cJSON_AddItemToObject(in, "previous", cJSON_Duplicate(c->entry, 1));
	return in;
}

static int do_link(struct agent *a, struct cache *c, const cJSON *entry)
{
	if (strcmp(c->verified_ref, c->ref) != 0) {
		/* whatever a policy says: a view only after this cache's own pull */
		agent_count_error("view");
		log_error("not publishing a cache that was not pulled through its own reference",
		          "cache", c->key, "digest", c->digest);
		return -EPERM;
	}
	struct cache_view_ready r;
	memset(&r, 0, sizeof(r));
	const char *sd = c->store_digest[0] ? c->store_digest : c->digest;
	snprintf(r.digest, sizeof(r.digest), "%.71s", sd);
	snprintf(r.state, sizeof(r.state), "Ready");
	r.compatible = true;
	char *ids[CACHE_VIEW_GPUS_MAX], idbuf[CACHE_VIEW_GPUS_MAX][24];
	size_t n = 0;
	const cJSON *set, *id;
	cJSON_ArrayForEach(set, cJSON_GetObjectItemCaseSensitive(entry, "compatibleGPUs"))
	{
		cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(set, "ids"))
		{
			if (n >= CACHE_VIEW_GPUS_MAX)
				break;
			if (cJSON_IsNumber(id))
				snprintf(idbuf[n], sizeof(idbuf[n]), "%d", id->valueint);
			else
				snprintf(idbuf[n], sizeof(idbuf[n]), "%s",
				         cJSON_IsString(id) ? id->valuestring : "?");
			ids[n] = idbuf[n];
			n++;
		}
	}
	r.compatible_gpus = ids;
	r.ncompatible_gpus = n;
	r.reason = "";
	r.message = "";
	snprintf(r.verified_by, sizeof(r.verified_by), "%s", c->verified_by);
	obj_now(r.updated, sizeof(r.updated));
	int rc = cache_view_publish(a->root, c->ns, c->name, &r);
	if (rc == 0) {
		bool relink = !strcmp(c->view_digest, c->digest);
		c->record = REC_READY;
		snprintf(c->view_digest, sizeof(c->view_digest), "%s", c->digest);
		if (!relink && !c->extracted)
			metrics_add(agent_m.hits, NULL, 1);
		c->extracted = false;
	} else {
		agent_count_error("view");
		log_error("cannot publish the cache view", "cache", c->key, "error", strerror(-rc));
	}
	return rc;
}

static bool record_changed(const cJSON *entry, const cJSON *prev)
{
	static const char *const keys[] = {"digest", "state", "reason", "message"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (strcmp(obj_str(entry, keys[i]), obj_str(prev, keys[i])) != 0)
			return true;
	return false;
}

/* The node's record (ready.json) says what the status entry says, in every
 * state, so that the CSI plugin can tell a pod why it cannot mount. Ready is
 * written only with the view (do_link), and a record that is not Ready
 * makes the cache unmountable whatever the view still links. linked: the
 * view was linked in this reconcile (its Ready record is the newest word). */
static void write_record(struct agent *a, struct cache *c, const cJSON *entry, bool linked)
{
	if (!entry) {
		/* gone: no record, unless a pod still holds the view */
		if (!c->view_digest[0] && cache_view_unpublish(a->root, c->ns, c->name) == 0)
			c->record = REC_UNKNOWN;
		return;
	}
	if (linked)
		return;
	/* the view still serves the digest it was Ready with, to new pods too,
	 * until the new digest is Ready here (lua/gkm/agent.lua) */
	if (*obj_str(entry, "servingDigest"))
		return;
	const char *state = obj_str(entry, "state");
	if (!strcmp(state, "Ready")) {
		if (c->record != REC_READY && !strcmp(c->view_digest, c->digest))
			do_link(a, c, entry);
		return;
	}
	if (c->record == REC_OTHER && !record_changed(entry, c->entry))
		return;
	struct cache_view_ready r;
	char message[1024];
	memset(&r, 0, sizeof(r));
	const char *d = obj_str(entry, "digest");
	if (cache_view_valid_digest(d))
		snprintf(r.digest, sizeof(r.digest), "%s", d);
	snprintf(r.state, sizeof(r.state), "%s", state);
	snprintf(message, sizeof(message), "%s", obj_str(entry, "message"));
	r.compatible = strcmp(state, "Incompatible") != 0;
	r.reason = (char *)obj_str(entry, "reason");
	r.message = message;
	obj_now(r.updated, sizeof(r.updated));
	int rc = cache_view_record(a->root, c->ns, c->name, &r);
	if (rc == 0) {
		c->record = REC_OTHER;
	} else {
		agent_count_error("view");
		log_error("cannot write the cache's node record", "cache", c->key, "error",
		          strerror(-rc));
	}
}

/* The CRD's lists must stay lists. */
static void entry_lists(cJSON *entry)
{
	static const char *const lists[] = {"compatibleGPUs", "incompatibleGPUs", "pods"};
	obj_empty_lists(entry, lists, sizeof(lists) / sizeof(lists[0]));
}

/* A LocalModelCache's kernel cache: its tree copied into the node group's
 * storage while it is Ready here, removed when it is not; a failure makes
 * the entry Failed with the reason. */
static void place_local_model(struct agent *a, struct cache *c, cJSON *entry)
{
	char path[PATH_MAX] = "", err[640];
	const char *name = c->obj ? local_model_name(c->obj) : "";
	bool want = *name && !c->away && entry && !strcmp(obj_str(entry, "state"), "Ready") &&
	            *c->view_digest && !strcmp(c->view_digest, c->digest) &&
	            local_model_here(c->obj, a->node, a->node_labels, path, sizeof(path));
	if (c->placed && (!want || strcmp(c->placed, path) || strcmp(c->placed_name, name))) {
		if (local_model_remove(c->placed, c->placed_name, err, sizeof(err)) != 0)
			log_warn("cannot remove a kernel cache from local model storage", "cache",
			         c->key, "error", err);
		else
			log_info("removed a kernel cache from local model storage", "cache", c->key,
			         "path", c->placed);
		free(c->placed);
		c->placed = NULL;
	}
	if (!want || (c->placed && !strcmp(c->placed_digest, c->view_digest)))
		return;
	int fd = -1;
	char *real = NULL;
	int rc = cache_view_open_data(a->root, c->ns, c->name, c->view_digest, &fd, &real, err,
	                              sizeof(err));
	if (rc == 0)
		rc = local_model_place(path, name, fd, err, sizeof(err));
	if (fd >= 0)
		close(fd);
	free(real);
	if (rc) {
		agent_count_error("view");
		log_warn("cannot place a kernel cache in local model storage", "cache", c->key,
		         "error", err);
		obj_set(entry, "state", cJSON_CreateString("Failed"));
		obj_set(entry, "reason", cJSON_CreateString("LocalModelPathUnusable"));
		obj_set(entry, "message", cJSON_CreateString(err));
		return;
	}
	c->placed = strdup(path);
	snprintf(c->placed_name, sizeof(c->placed_name), "%s", name);
	snprintf(c->placed_digest, sizeof(c->placed_digest), "%s", c->view_digest);
	log_info("placed a kernel cache in local model storage", "cache", c->key, "path", path,
	         "localModelCache", name);
}

static void reconcile(struct agent *a, const char *key)
{
	struct cache *c = agent_find_cache(a, key);
	if (!c || !a->policies->current || !a->probed || c->undecided)
		return;
	struct cache_view_usage u;
	bool have_usage = cache_view_usage_read(a->run_dir, c->ns, c->name, &u) == 0;
	cJSON *in = decide_input(a, c, have_usage ? &u : NULL), *out = NULL;
	if (have_usage) {
		fallback_notice_usage(a->notice, c->key, &u);
		cache_view_usage_free(&u);
	}
	struct engine_error err;
	enum engine_status st = engine_call_fn(a->policies->current, "gkm.agent", "decide", in,
	                                       validate_decision, &out, &err);
	cJSON_Delete(in);
	if (st != ENGINE_OK) {
		metrics_add(agent_m.reconciles, METRICS_L("policy_error"), 1);
		agent_count_error("policy");
		log_error("agent decision failed", "cache", key, "error", err.message);
		kube_workqueue_add_rate_limited(a->queue, key, loop_now_ms());
		return;
	}
	metrics_add(agent_m.reconciles, METRICS_L("ok"), 1);
	cJSON *entry = cJSON_DetachItemFromObjectCaseSensitive(out, "entry");
	entry_lists(entry);
	bool released = false, linked = false;
	const cJSON *act;
	cJSON_ArrayForEach(act, cJSON_GetObjectItemCaseSensitive(out, "actions"))
	{
		const char *t = obj_str(act, "type");
		if (!strcmp(t, "fetch_image") && *c->digest && c->targets_need_pull) {
			agent_want(a, c, PULL_SCHED_PULL); /* the targets come with the pull */
		} else if (!strcmp(t, "fetch_image") && *c->digest) {
			agent_want(a, c, PULL_SCHED_FETCH);
			if (c->fetch.job.queued || c->fetch.job.running) {
				c->image = IMG_FETCHING;
				snprintf(c->image_digest, sizeof(c->image_digest), "%s", c->digest);
			}
		} else if (!strcmp(t, "pull") && *c->digest) {
			agent_want(a, c, PULL_SCHED_PULL);
		} else if (!strcmp(t, "link") && entry) {
			if (do_link(a, c, entry) == 0) {
				agent_enqueue(a, key, 0);
				released = true; /* the view may have left an older digest */
				linked = true;
			}
		} else if (!strcmp(t, "unlink")) {
			if (cache_view_unpublish(a->root, c->ns, c->name) == 0) {
				c->view_digest[0] = '\0';
				c->record = REC_UNKNOWN;
				released = true;
			} else {
				agent_count_error("view");
			}
		}
	}
	place_local_model(a, c, entry);
	write_record(a, c, entry, linked);
	if (cache_view_capture_set(a->root, c->ns, c->name,
	                           entry && c->obj && node_capture_on_exit(c->obj)) != 0)
		agent_count_error("view");
	agent_schedule(a);
	const cJSON *ra = cJSON_GetObjectItemCaseSensitive(out, "requeue_after");
	if (cJSON_IsNumber(ra) && ra->valuedouble > 0)
		agent_enqueue(a, key, (uint64_t)(ra->valuedouble * 1000));
	cJSON_Delete(out);
	if (!cJSON_Compare(entry, c->entry, 1)) {
		cJSON_Delete(c->entry);
		c->entry = entry;
		agent_mark_dirty(a, c->ns);
	} else {
		cJSON_Delete(entry);
	}
	kube_workqueue_forget(a->queue, key);
	/* deleted and released: forget it */
	if (!c->obj && !c->entry && !c->view_digest[0] && !c->pull.job.running &&
	    !c->fetch.job.running)
		agent_forget_cache(a, c);
	if (released)
		agent_gc_request(a);
}

static void process(struct loop *l, void *ud)
{
	struct agent *a = ud;
	(void)l;
	a->kick_timer = 0;
	const char *key;
	uint64_t now = loop_now_ms();
	while ((key = kube_workqueue_get(a->queue, now)) != NULL) {
		char k[512];
		snprintf(k, sizeof(k), "%s", key);
		reconcile(a, k);
		kube_workqueue_done(a->queue, k);
	}
	uint64_t due = kube_workqueue_next_due(a->queue);
	if (due != UINT64_MAX && !a->stopping)
		a->kick_timer = loop_add_timer(a->loop, due > now ? due - now : 0, process, a);
}

void agent_kick(struct agent *a)
{
	if (a->stopping)
		return;
	if (a->kick_timer)
		loop_cancel_timer(a->loop, a->kick_timer);
	a->kick_timer = loop_add_timer(a->loop, 0, process, a);
}
