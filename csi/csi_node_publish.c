/* NodePublishVolume: the agent's record of the cache, the source a volume
 * mounts (the store entry or a fallback directory), and the volume table's
 * bookkeeping around the mount. */
#include "csi_node_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "csi_mount.h"
#include "log.h"
#include "metrics.h"

static void describe(const struct csi_volume *v, char *buf, size_t size)
{
	if (v->cache_namespace[0])
		snprintf(buf, size, "GKMCache %s/%s", v->cache_namespace, v->cache_name);
	else
		snprintf(buf, size, "ClusterGKMCache %s", v->cache_name);
}

/* ---- publish: the cache ---- */

/* Refuse a publish with what the agent's record says: its state, reason
 * and message, in the words a user reads in `kubectl describe pod`. */
static void refuse(struct csi_reply *r, const char *what, const struct cache_view_ready *rec)
{
	char reason[128], msg[320];
	csi_node_shown(rec->reason, reason, sizeof(reason));
	csi_node_shown(rec->message, msg, sizeof(msg));
	const char *sep = msg[0] ? ": " : "";
	const char *st = rec->state;
	if (!rec->compatible || strcmp(st, "Incompatible") == 0)
		csi_node_fail(r, CSI_FAILED_PRECONDITION,
		              "%s is incompatible with this node's GPUs (%s%s%s)", what,
		              reason[0] ? reason : "no reason given", sep, msg);
	else if (strcmp(st, "Failed") == 0)
		csi_node_fail(r, CSI_FAILED_PRECONDITION, "%s failed on this node (%s%s%s)", what,
		              reason[0] ? reason : "no reason given", sep, msg);
	else if (strcmp(st, "Evicted") == 0)
		csi_node_fail(
		    r, CSI_FAILED_PRECONDITION,
		    "%s was evicted from this node's store to free space (%s%s%s); the node "
		    "pulls it again now, and the kubelet's next try mounts it once it is Ready",
		    what, reason[0] ? reason : st, sep, msg);
	else if (strcmp(st, "Deleting") == 0)
		csi_node_fail(r, CSI_FAILED_PRECONDITION,
		              "%s is being deleted and takes no new pods here (%s%s%s)", what,
		              reason[0] ? reason : st, sep, msg);
	else if (!reason[0] || strcmp(reason, st) == 0)
		csi_node_fail(r, CSI_FAILED_PRECONDITION,
		              "%s is not ready on this node yet (%s%s%s)", what, st, sep, msg);
	else
		csi_node_fail(r, CSI_FAILED_PRECONDITION,
		              "%s is not ready on this node yet (%s, %s%s%s)", what, st, reason,
		              sep, msg);
}

/* Why a cache cannot be mounted here: the state and reason of the node's
 * record (or what stands for them without a usable one), and the label of
 * gkm_csi_fallback_total, one of a fixed set. */
struct miss {
	char state[32], reason[128];
	const char *label;
};

static void set_miss(struct miss *m, const char *state, const char *reason, const char *label)
{
	csi_node_shown(state, m->state, sizeof(m->state));
	csi_node_shown(reason, m->reason, sizeof(m->reason));
	m->label = label;
}

/* The record's own words, with the metric label its state maps to. */
static void record_miss(struct miss *m, const struct cache_view_ready *rec)
{
	static const char *const states[] = {"Pending",      "Pulling",  "Failed",
	                                     "Incompatible", "Deleting", "Evicted"};
	const char *st = rec->compatible ? rec->state : "Incompatible";
	const char *label = "NotReady";
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(st, states[i]) == 0)
			label = states[i];
	set_miss(m, st, rec->reason[0] ? rec->reason : st, label);
}

/* Check the agent's record and open the store entry: only a record that
 * says Ready and compatible, whose digest the view's data link names, is
 * mounted. On success *fd is the entry (caller closes) and digest is set;
 * otherwise r says why (FAILED_PRECONDITION) and so does *m. */
static int resolve_cache(struct csi_node *n, const struct csi_volume *v, int *fd,
                         char digest[CACHE_VIEW_DIGEST_LEN + 1], struct miss *m,
                         struct csi_reply *r)
{
	struct cache_view_ready ready;
	char what[CACHE_VIEW_NAME_MAX + 96], err[384];
	char *path = NULL;
	describe(v, what, sizeof(what));
	int rc = cache_view_ready_read(n->root, v->cache_namespace, v->cache_name, &ready, err,
	                               sizeof(err));
	if (rc == -ENOENT) {
		csi_node_fail(
		    r, CSI_FAILED_PRECONDITION,
		    "%s is not on this node: the agent has no record of it here (it does not "
		    "exist, or the agent has not seen it yet)",
		    what);
		set_miss(m, "Unknown", "NotOnNode", "NotOnNode");
		return rc;
	}
	if (rc) {
		csi_node_fail(r, CSI_FAILED_PRECONDITION, "%s: %s", what, err);
		set_miss(m, "Unknown", "RecordUnreadable", "RecordUnreadable");
		return rc;
	}
	if (!ready.compatible || strcmp(ready.state, "Ready") != 0) {
		/* a pod asks for it here: the agent pulls it again (cache_view.h) */
		if (!strcmp(ready.state, "Evicted") &&
		    cache_view_want(n->run_dir, v->cache_namespace, v->cache_name) != 0)
			log_warn("cannot ask the agent for an evicted cache", "cache", what);
		refuse(r, what, &ready);
		record_miss(m, &ready);
		rc = -EAGAIN;
		goto out;
	}
	rc = cache_view_open_data(n->root, v->cache_namespace, v->cache_name, ready.digest, fd,
	                          &path, err, sizeof(err));
	if (rc) {
		csi_node_fail(r, CSI_FAILED_PRECONDITION,
		              "%s is marked ready but its data is unusable: %s", what, err);
		set_miss(m, "Ready", "DataUnusable", "DataUnusable");
		goto out;
	}
	free(path);
	memcpy(digest, ready.digest, CACHE_VIEW_DIGEST_LEN + 1);
out:
	cache_view_ready_free(&ready);
	return rc;
}

int csi_node_usage_add(struct csi_node *n, const struct csi_volume *v)
{
	char key[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(v, key);
	struct cache_view_pod p = {
	    .name = v->pod_name,
	    .namespace = v->pod_namespace,
	    .uid = v->pod_uid,
	    .volume_id = key,
	    .target_path = v->target_path,
	    .digest = v->digest,
	    .read_only = v->fallback ? v->pod_read_only : !v->writable,
	    .started = v->started,
	    .fallback = v->fallback,
	    .fallback_state = v->fallback_state,
	    .fallback_reason = v->fallback_reason,
	    .fallback_message = v->fallback_message,
	};
	return cache_view_usage_add(n->run_dir, v->cache_namespace, v->cache_name, &p);
}
static void clear_reply(struct csi_reply *r)
{
	r->code = CSI_OK;
	r->message[0] = '\0';
}

/* Record what a publish mounts: the digest (or "" for a fallback) and the
 * why of a fallback (all "" otherwise). Stats may copy the entry meanwhile:
 * the fields change together under the lock, and not at all when out of
 * memory (-ENOMEM). */
static int set_source(struct csi_node *n, struct csi_volume *v, const char *digest,
                      const struct miss *m, const char *message)
{
	char *d = strdup(digest), *st = strdup(m ? m->state : "");
	char *re = strdup(m ? m->reason : ""), *msg = strdup(m ? message : "");
	if (!d || !st || !re || !msg) {
		free(d);
		free(st);
		free(re);
		free(msg);
		return -ENOMEM;
	}
	pthread_mutex_lock(&n->lock);
	char *old[] = {v->digest, v->fallback_state, v->fallback_reason, v->fallback_message};
	v->digest = d;
	v->fallback_state = st;
	v->fallback_reason = re;
	v->fallback_message = msg;
	v->fallback = m != NULL;
	pthread_mutex_unlock(&n->lock);
	for (size_t i = 0; i < sizeof(old) / sizeof(old[0]); i++)
		free(old[i]);
	return 0;
}

/* What a publish mounts: the cache's store entry (*fd, v->digest), or, for
 * a volume with onMiss "empty" whose cache is not usable here, a fallback
 * directory (*fd -1, v->fallback with the why, *label for the metric).
 * Anything else that keeps the cache from being mounted fails as before. */
static int choose_source(struct csi_node *n, struct csi_volume *v, int *fd, const char **label,
                         struct csi_reply *r)
{
	char digest[CACHE_VIEW_DIGEST_LEN + 1] = "";
	struct miss m = {.label = NULL};
	*fd = -1;
	int rc = resolve_cache(n, v, fd, digest, &m, r);
	if (rc && !v->empty_on_miss)
		return rc;
	bool fallback = rc != 0;
	if (set_source(n, v, digest, fallback ? &m : NULL, r->message) != 0) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		csi_node_fail(r, CSI_RESOURCE_EXHAUSTED, "out of memory");
		return -ENOMEM;
	}
	*label = fallback ? m.label : NULL;
	clear_reply(r);
	return 0;
}

/* A new volume (e is a busy placeholder owned by this call). */
static int publish_new(struct csi_node *n, struct entry *e, const char **label, struct csi_reply *r)
{
	struct csi_volume *v = &e->v;
	bool created = false;
	int fd = -1;
	int rc = choose_source(n, v, &fd, label, r);
	if (rc)
		return rc;
	v->started = time(NULL);
	rc = csi_mount_is_mountpoint(v->target_path);
	if (rc == 1) {
		csi_node_fail(r, CSI_ALREADY_EXISTS,
		              "target %s already has something else mounted on it", v->target_path);
		rc = -EEXIST;
		goto out;
	}
	/* State first: a plugin killed from here on finds the volume again. */
	rc = csi_volume_save(n->volumes_dir, v);
	if (rc) {
		csi_node_fail(r, CSI_INTERNAL, "cannot record volume state: %s", strerror(-rc));
		goto out;
	}
	if ((rc = csi_node_prepare_target(v->target_path, &created, r)) ||
	    (rc = csi_node_mount_volume(n, v, fd, r)))
		goto undo;
	rc = csi_node_usage_add(n, v);
	if (rc) {
		csi_node_fail(r, CSI_INTERNAL, "cannot record usage: %s", strerror(-rc));
		goto undo;
	}
	goto out;
undo:
	csi_node_undo_target(n, v, created);
	if (csi_volume_remove(n->volumes_dir, v) != 0)
		log_error("cannot remove volume state after a failed publish", "volume",
		          v->volume_id);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

/* A repeated publish of a known volume: make sure it is mounted and
 * recorded (a previous attempt may have been cut short by a restart). */
static int publish_again(struct csi_node *n, struct entry *e, const char **label,
                         struct csi_reply *r)
{
	struct csi_volume *v = &e->v;
	int rc = csi_mount_is_mountpoint(v->target_path);
	if (rc != 1) {
		bool created = false;
		int fd = -1;
		if ((rc = choose_source(n, v, &fd, label, r)))
			return rc;
		rc = csi_volume_save(n->volumes_dir, v);
		if (rc)
			csi_node_fail(r, CSI_INTERNAL, "cannot record volume state: %s",
			              strerror(-rc));
		else if ((rc = csi_node_prepare_target(v->target_path, &created, r)) == 0 &&
		         (rc = csi_node_mount_volume(n, v, fd, r)) != 0)
			csi_node_undo_target(n, v, created);
		if (fd >= 0)
			close(fd);
		if (rc)
			return rc;
	}
	rc = csi_node_usage_add(n, v);
	if (rc)
		csi_node_fail(r, CSI_INTERNAL, "cannot record usage: %s", strerror(-rc));
	return rc;
}

void csi_node_publish(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	Csi__V1__NodePublishVolumeRequest *req =
	    csi__v1__node_publish_volume_request__unpack(NULL, len, data);
	struct csi_volume want;
	struct entry *e = NULL;
	bool fresh = false;
	char what[CACHE_VIEW_NAME_MAX + 96];
	if (!req) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "malformed NodePublishVolumeRequest");
		return;
	}
	if (csi_node_parse_publish(n, req, &want, r))
		goto out;

	pthread_mutex_lock(&n->lock);
	e = csi_node_find_target(n, want.target_path);
	struct entry *other = e || want.shared ? NULL : csi_node_find_id(n, want.volume_id);
	if (e && strcmp(e->v.volume_id, want.volume_id) != 0) {
		csi_node_fail(r, CSI_ALREADY_EXISTS, "target %s already holds volume %s",
		              want.target_path, e->v.volume_id);
		e = NULL;
	} else if ((e && e->busy) || (other && other->busy)) {
		csi_node_fail(r, CSI_ABORTED, "an operation on volume %s is in progress",
		              want.volume_id);
		e = NULL;
	} else if (other) {
		csi_node_fail(r, CSI_FAILED_PRECONDITION, "volume %s is already published at %s",
		              want.volume_id, other->v.target_path);
	} else if (e && !csi_volume_same(&e->v, &want)) {
		describe(&e->v, what, sizeof(what));
		csi_node_fail(r, CSI_ALREADY_EXISTS,
		              "volume %s is already published at %s with other attributes (%s, %s)",
		              want.volume_id, want.target_path, what,
		              e->v.writable ? "writable" : "read-only");
		e = NULL;
	} else if (!e) {
		if (!(e = calloc(1, sizeof(*e))) || csi_volume_copy(&e->v, &want) != 0 ||
		    csi_node_add_entry(n, e) != 0) {
			if (e)
				csi_volume_clear(&e->v);
			free(e);
			e = NULL;
			csi_node_fail(r, CSI_RESOURCE_EXHAUSTED, "out of memory");
		} else {
			e->placeholder = true;
			fresh = true;
		}
	}
	if (e)
		e->busy = true;
	pthread_mutex_unlock(&n->lock);
	if (!e)
		goto out;

	const char *label = NULL;
	int rc = fresh ? publish_new(n, e, &label, r) : publish_again(n, e, &label, r);

	describe(&e->v, what, sizeof(what));
	if (rc == 0 && label) {
		metrics_add(csi_node_m_fallbacks, METRICS_L(label), 1);
		log_warn("published an empty fallback directory: the cache is not usable here",
		         "volume", e->v.volume_id, "cache", what, "state", e->v.fallback_state,
		         "reason", e->v.fallback_reason, "target", e->v.target_path,
		         "pod_namespace", e->v.pod_namespace, "pod", e->v.pod_name);
	} else if (rc == 0) {
		log_info(fresh ? "published volume" : "volume already published", "volume",
		         e->v.volume_id, "cache", what, "mode",
		         e->v.fallback   ? "fallback"
		         : e->v.writable ? "overlay"
		                         : "read-only",
		         "target", e->v.target_path, "pod_namespace", e->v.pod_namespace, "pod",
		         e->v.pod_name);
	}
	pthread_mutex_lock(&n->lock);
	if (rc && fresh) {
		csi_node_drop_entry(n, e);
	} else {
		e->busy = false;
		e->placeholder = false;
	}
	csi_node_count_volumes(n);
	pthread_mutex_unlock(&n->lock);
	if (rc == 0) {
		Csi__V1__NodePublishVolumeResponse resp =
		    CSI__V1__NODE_PUBLISH_VOLUME_RESPONSE__INIT;
		csi_node_reply(r, &resp.base);
	}
out:
	csi__v1__node_publish_volume_request__free_unpacked(req, NULL);
}
