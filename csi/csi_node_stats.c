/* NodeGetVolumeStats: what a volume holds (the store entry, measured once
 * per digest) and what the pod wrote and may still write. */
#include "csi_node_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "csi_mount.h"

/* ---- stats ---- */

static int store_usage(struct csi_node *n, const char *digest, uint64_t *bytes, uint64_t *inodes)
{
	pthread_mutex_lock(&n->lock);
	for (size_t i = 0; i < USAGE_CACHE; i++) {
		if (strcmp(n->sizes[i].digest, digest) == 0) {
			*bytes = n->sizes[i].bytes;
			*inodes = n->sizes[i].inodes;
			pthread_mutex_unlock(&n->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&n->lock);
	char path[PATH_MAX];
	int len = snprintf(path, sizeof(path), "%s/store/sha256/%s", n->root, digest + 7);
	if (len < 0 || (size_t)len >= sizeof(path))
		return -ENAMETOOLONG;
	int rc = csi_mount_tree_usage(path, bytes, inodes);
	if (rc)
		return rc;
	pthread_mutex_lock(&n->lock);
	struct tree_size *s = &n->sizes[n->next_size++ % USAGE_CACHE];
	memcpy(s->digest, digest, CACHE_VIEW_DIGEST_LEN + 1);
	s->bytes = *bytes;
	s->inodes = *inodes;
	pthread_mutex_unlock(&n->lock);
	return 0;
}

static int64_t clamp64(uint64_t v)
{
	return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

void csi_node_stats(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	Csi__V1__NodeGetVolumeStatsRequest *req =
	    csi__v1__node_get_volume_stats_request__unpack(NULL, len, data);
	struct csi_volume v;
	bool found = false, at_path = false;
	char b[144], pb[160];
	memset(&v, 0, sizeof(v));
	if (!req) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "malformed NodeGetVolumeStatsRequest");
		return;
	}
	/* Missing arguments are INVALID_ARGUMENT; anything else names no
	 * volume published here (a malformed id or a relative path included),
	 * which CSI answers NOT_FOUND. */
	if (!req->volume_id || !*req->volume_id) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		goto out;
	}
	if (!req->volume_path || !*req->volume_path) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "volume_path is required");
		goto out;
	}
	pthread_mutex_lock(&n->lock);
	struct entry *other = NULL,
	             *e = csi_node_published_at(n, req->volume_id, req->volume_path, &other);
	if (e && !e->placeholder) {
		found = at_path = csi_volume_copy(&v, &e->v) == 0;
	} else if (other && !other->placeholder) {
		found = true; /* elsewhere */
	}
	pthread_mutex_unlock(&n->lock);
	if (!found) {
		csi_node_fail(r, CSI_NOT_FOUND, "volume %s is not published on this node",
		              csi_node_shown(req->volume_id, b, 140));
		goto out;
	}
	if (!at_path) {
		csi_node_fail(r, CSI_NOT_FOUND, "volume %s is not published at %s", req->volume_id,
		              csi_node_shown(req->volume_path, pb, sizeof(pb)));
		goto out;
	}
	if (csi_mount_is_mountpoint(v.target_path) != 1) {
		csi_node_fail(r, CSI_NOT_FOUND, "volume %s is not mounted at %s", v.volume_id,
		              v.target_path);
		goto out;
	}
	uint64_t bytes = 0, inodes = 0, ubytes = 0, uinodes = 0, avail = 0, iavail = 0;
	/* What the pod can write to: an overlay's upper layer, a fallback
	 * directory (which has no cache below it). */
	const char *own = v.fallback ? "fallback" : v.writable ? "upper" : NULL;
	int rc = v.fallback ? 0 : store_usage(n, v.digest, &bytes, &inodes);
	if (rc == 0 && own) {
		char upper[PATH_MAX];
		struct statvfs sv;
		/* a limited layer's free space is what the limit leaves */
		rc = csi_node_own_dir(n, &v, own, upper, sizeof(upper));
		if (rc == 0)
			rc = csi_mount_tree_usage(upper, &ubytes, &uinodes);
		if (rc == 0 && statvfs(upper, &sv) != 0)
			rc = -errno;
		if (rc == 0) {
			avail = (uint64_t)sv.f_bavail * sv.f_frsize;
			iavail = sv.f_favail;
		}
	}
	if (rc) {
		csi_node_fail(r, CSI_INTERNAL, "cannot measure volume %s: %s", v.volume_id,
		              strerror(-rc));
		goto out;
	}
	/* A read-only volume is exactly as big as the cache; a writable one can
	 * grow into the free space of its layer (sizeLimit), or without a limit
	 * of the file system its own directory is on. */
	Csi__V1__VolumeUsage ub = CSI__V1__VOLUME_USAGE__INIT, ui = CSI__V1__VOLUME_USAGE__INIT;
	ub.unit = CSI__V1__VOLUME_USAGE__UNIT__BYTES;
	ub.used = clamp64(bytes + ubytes);
	ub.available = clamp64(avail);
	ub.total = clamp64(bytes + ubytes + avail);
	ui.unit = CSI__V1__VOLUME_USAGE__UNIT__INODES;
	ui.used = clamp64(inodes + uinodes);
	ui.available = clamp64(iavail);
	ui.total = clamp64(inodes + uinodes + iavail);
	Csi__V1__VolumeUsage *usage[] = {&ub, &ui};
	Csi__V1__NodeGetVolumeStatsResponse resp = CSI__V1__NODE_GET_VOLUME_STATS_RESPONSE__INIT;
	resp.n_usage = 2;
	resp.usage = usage;
	csi_node_reply(r, &resp.base);
out:
	csi_volume_clear(&v);
	csi__v1__node_get_volume_stats_request__free_unpacked(req, NULL);
}
