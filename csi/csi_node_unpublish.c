/* NodeUnpublishVolume: unmounting, and the hand-over of a writable
 * volume's upper layer to the agent where its cache captures. */
#include "csi_node_impl.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cache_misses.h"
#include "cache_tree.h"
#include "csi_mount.h"
#include "fsutil.h"
#include "log.h"

/* ---- unpublish ---- */

/* A writable volume of a cache that captures (cache_view.h): its upper
 * layer goes to the agent, which packages what the pod added as a
 * candidate image. false: not handed over (the caller removes it). */
static bool hand_over(struct csi_node *n, const struct csi_volume *v, const char *key,
                      const char *vdir)
{
	if (!v->writable || v->fallback ||
	    !cache_view_capture_on(n->root, v->cache_namespace, v->cache_name))
		return false;
	if (csi_node_layered(v)) {
		/* the agent reads <vdir>/upper on the node's own disk: the layer
		 * is copied there as it is, then goes (clear_dir) */
		char from[PATH_MAX], to[PATH_MAX];
		struct oci_err e = {{0}};
		int rc = csi_node_own_dir(n, v, "upper", from, sizeof(from));
		if (rc == 0)
			rc = csi_node_overlay_dir(n, v, "upper", to, sizeof(to));
		if (rc == 0 && (rc = fsutil_mkdirs(to, 0700)) == 0)
			rc = cache_tree_copy_layer(from, to, &e);
		char layer[PATH_MAX], img[PATH_MAX];
		if (rc == 0 &&
		    (rc = csi_node_overlay_dir(n, v, "layer", layer, sizeof(layer))) == 0 &&
		    (rc = csi_mount_unmount(layer)) == 0 &&
		    (rc = csi_node_overlay_dir(n, v, "layer.img", img, sizeof(img))) == 0 &&
		    (rc = csi_mount_remove_tree(layer)) == 0 && unlink(img) != 0)
			rc = -errno;
		if (rc) {
			log_warn("cannot copy the volume's layer for capture; removing it",
			         "volume", v->volume_id, "error", e.msg[0] ? e.msg : strerror(-rc));
			return false;
		}
	}
	cJSON *pod = cJSON_CreateObject();
	cJSON_AddStringToObject(pod, "name", v->pod_name ? v->pod_name : "");
	cJSON_AddStringToObject(pod, "namespace", v->pod_namespace ? v->pod_namespace : "");
	cJSON_AddStringToObject(pod, "uid", v->pod_uid ? v->pod_uid : "");
	cJSON_AddStringToObject(pod, "node", n->node_id);
	char *text = cJSON_PrintUnformatted(pod);
	cJSON_Delete(pod);
	int rc = text ? cache_view_capture_handover(n->root, v->cache_namespace, v->cache_name, key,
	                                            vdir, text)
	              : -ENOMEM;
	cJSON_free(text);
	if (rc) {
		log_warn(
		    "cannot hand the volume's upper layer to the agent for capture; removing it",
		    "volume", v->volume_id, "error", strerror(-rc));
		return false;
	}
	log_info("handed the volume's upper layer to the agent for capture", "volume",
	         v->volume_id);
	return true;
}

/* What the pod compiled itself, counted before its layer goes (a writable
 * volume, or a fallback directory): the record its usage keeps among the
 * finished pods. NULL for a read-only volume, or when it cannot be read. */
static cJSON *finished_record(const struct csi_node *n, const struct csi_volume *v, const char *key)
{
	char own[PATH_MAX];
	struct cache_misses m;
	if ((!v->writable && !v->fallback) ||
	    csi_node_own_dir(n, v, v->fallback ? "fallback" : "upper", own, sizeof(own)) != 0 ||
	    cache_misses_of_volume(n->root, v->cache_namespace, v->cache_name,
	                           v->fallback ? NULL
	                           : v->digest ? v->digest
	                                       : "",
	                           own, &m) != 0)
		return NULL;
	cJSON *o = cJSON_CreateObject();
	if (o && (!cJSON_AddStringToObject(o, "podName", v->pod_name ? v->pod_name : "") ||
	          !cJSON_AddStringToObject(o, "podNamespace",
	                                   v->pod_namespace ? v->pod_namespace : "") ||
	          !cJSON_AddStringToObject(o, "podUID", v->pod_uid ? v->pod_uid : "") ||
	          !cJSON_AddStringToObject(o, "volumeId", key) || !cache_misses_json(&m, o))) {
		cJSON_Delete(o);
		o = NULL;
	}
	return o;
}

static int teardown(struct csi_node *n, const struct csi_volume *v, struct csi_reply *r)
{
	int rc = csi_mount_unmount(v->target_path);
	if (rc) {
		csi_node_fail(r, CSI_INTERNAL, "cannot unmount %s: %s", v->target_path,
		              strerror(-rc));
		return rc;
	}
	if (rmdir(v->target_path) != 0 && errno != ENOENT)
		log_warn("target directory left in place", "target", v->target_path, "error",
		         strerror(errno));
	/* The overlay layers or the fallback directory, written by the pod:
	 * handed to the agent where the cache captures, else removed. */
	char vdir[PATH_MAX];
	char key[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(v, key);
	cJSON *finished = finished_record(n, v, key);
	if (csi_node_overlay_dir(n, v, NULL, vdir, sizeof(vdir)) == 0 &&
	    !hand_over(n, v, key, vdir) && csi_node_clear_dir(vdir) != 0)
		log_warn("cannot remove the volume's directories (removed at next start)", "dir",
		         vdir);
	rc = finished ? cache_view_usage_finish(n->run_dir, v->cache_namespace, v->cache_name, key,
	                                        finished)
	              : cache_view_usage_remove(n->run_dir, v->cache_namespace, v->cache_name, key);
	cJSON_Delete(finished);
	if (rc) {
		csi_node_fail(r, CSI_INTERNAL, "cannot release usage of volume %s: %s",
		              v->volume_id, strerror(-rc));
		return rc;
	}
	rc = csi_volume_remove(n->volumes_dir, v);
	if (rc)
		csi_node_fail(r, CSI_INTERNAL, "cannot remove state of volume %s: %s", v->volume_id,
		              strerror(-rc));
	return rc;
}

void csi_node_unpublish(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	Csi__V1__NodeUnpublishVolumeRequest *req =
	    csi__v1__node_unpublish_volume_request__unpack(NULL, len, data);
	struct entry *e = NULL, *other = NULL;
	bool known = false;
	if (!req) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "malformed NodeUnpublishVolumeRequest");
		return;
	}
	if (csi_node_check_volume_id(req->volume_id, r) ||
	    csi_node_check_path("target_path", req->target_path, r))
		goto out;
	pthread_mutex_lock(&n->lock);
	e = csi_node_published_at(n, req->volume_id, req->target_path, &other);
	if (e && e->busy) {
		csi_node_fail(r, CSI_ABORTED, "an operation on volume %s is in progress",
		              req->volume_id);
		known = true;
		e = NULL;
	} else if (other) {
		csi_node_fail(r, CSI_NOT_FOUND, "volume %s is published at %s, not at %s",
		              req->volume_id, other->v.target_path, req->target_path);
		known = true;
	} else if (e) {
		e->busy = true;
	}
	pthread_mutex_unlock(&n->lock);

	if (!e && known)
		goto out;
	if (!e) {
		/* Unknown here: either already unpublished (a repeat) or never ours.
		 * Never unmount what this plugin did not mount. */
		if (csi_mount_is_mountpoint(req->target_path) == 1) {
			csi_node_fail(
			    r, CSI_NOT_FOUND,
			    "volume %s is not published by this plugin, and %s is mounted by "
			    "something "
			    "else: not unmounting it",
			    req->volume_id, req->target_path);
			goto out;
		}
		Csi__V1__NodeUnpublishVolumeResponse resp =
		    CSI__V1__NODE_UNPUBLISH_VOLUME_RESPONSE__INIT;
		csi_node_reply(r, &resp.base);
		goto out;
	}
	int rc = teardown(n, &e->v, r);
	if (rc == 0)
		log_info("unpublished volume", "volume", e->v.volume_id, "target",
		         e->v.target_path);
	pthread_mutex_lock(&n->lock);
	if (rc == 0)
		csi_node_drop_entry(n, e);
	else
		e->busy = false;
	csi_node_count_volumes(n);
	pthread_mutex_unlock(&n->lock);
	if (rc == 0) {
		Csi__V1__NodeUnpublishVolumeResponse resp =
		    CSI__V1__NODE_UNPUBLISH_VOLUME_RESPONSE__INIT;
		csi_node_reply(r, &resp.base);
	}
out:
	csi__v1__node_unpublish_volume_request__free_unpacked(req, NULL);
}
