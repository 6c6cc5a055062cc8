/* A volume's own directories under the state directory: the writable
 * overlay's upper and work directories, the size-limited layer (an image
 * on a loop device, csi_layer.h), the fallback directory; and mounting the
 * volume at its target. */
#include "csi_node_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "csi_layer.h"
#include "csi_mount.h"
#include "fsutil.h"
#include "log.h"

/* <state>/volumes/<key>[/sub]: the private directories of one publication. */
int csi_node_key_dir(const struct csi_node *n, const char *key, const char *sub, char *buf,
                     size_t size)
{
	int len = sub ? snprintf(buf, size, "%s/volumes/%s/%s", n->state_dir, key, sub)
	              : snprintf(buf, size, "%s/volumes/%s", n->state_dir, key);
	return (len < 0 || (size_t)len >= size) ? -ENAMETOOLONG : 0;
}

int csi_node_overlay_dir(const struct csi_node *n, const struct csi_volume *v, const char *sub,
                         char *buf, size_t size)
{
	char key[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(v, key);
	return csi_node_key_dir(n, key, sub, buf, size);
}

/* Writes of this volume go to a size-limited layer (csi_layer.h) mounted at
 * <dir>/layer: its upper, work and fallback directories live there. */
bool csi_node_layered(const struct csi_volume *v)
{
	return v->size_limit && (v->writable || v->fallback || v->empty_on_miss);
}

/* A directory the pod writes to ("upper", "work", "fallback"), in the layer
 * when there is one. */
int csi_node_own_dir(const struct csi_node *n, const struct csi_volume *v, const char *sub,
                     char *buf, size_t size)
{
	char rel[32];
	snprintf(rel, sizeof(rel), "%s%s", csi_node_layered(v) ? "layer/" : "", sub);
	return csi_node_overlay_dir(n, v, rel, buf, size);
}

/* Remove a volume's directory: its layer unmounted first (the image file
 * goes with the rest). 0 when it is gone. */
int csi_node_clear_dir(const char *vdir)
{
	char layer[PATH_MAX];
	int rc = snprintf(layer, sizeof(layer), "%s/layer", vdir) >= (int)sizeof(layer)
	             ? -ENAMETOOLONG
	             : csi_mount_unmount(layer);
	return rc ? rc : csi_mount_remove_tree(vdir);
}

/* A fresh volume directory, with its size-limited layer when it has one. */
static int make_dir(const struct csi_node *n, const struct csi_volume *v, struct csi_reply *r)
{
	char vdir[PATH_MAX], layer[PATH_MAX], img[PATH_MAX], err[256] = "";
	int rc;
	if ((rc = csi_node_overlay_dir(n, v, NULL, vdir, sizeof(vdir))) ||
	    (rc = csi_node_overlay_dir(n, v, "layer", layer, sizeof(layer))) ||
	    (rc = csi_node_overlay_dir(n, v, "layer.img", img, sizeof(img)))) {
		csi_node_fail(r, CSI_INTERNAL, "volume directories: %s", strerror(-rc));
		return rc;
	}
	/* Start from nothing: leftovers of an attempt that never got mounted
	 * hold nothing anyone wrote. */
	if ((rc = csi_node_clear_dir(vdir)) ||
	    (rc = fsutil_mkdirs(csi_node_layered(v) ? layer : vdir, 0700))) {
		csi_node_fail(r, CSI_INTERNAL, "volume directory %s: %s", vdir, strerror(-rc));
		return rc;
	}
	if (csi_node_layered(v) &&
	    (rc = csi_layer_mount(img, v->size_limit, layer, err, sizeof(err)))) {
		csi_node_fail(
		    r, CSI_INTERNAL,
		    "cannot make the volume's %llu-byte layer: %s (sizeLimit \"0\", or the "
		    "chart's csi.writableSizeLimit 0, goes without a limit)",
		    (unsigned long long)v->size_limit, err);
		if (csi_mount_remove_tree(vdir) != 0)
			log_warn("cannot remove volume directory", "dir", vdir);
	}
	return rc;
}

/* A fresh, empty directory of the volume's own under the state directory
 * (never under the store or a view: nothing written there reaches a cache),
 * bound at the target. */
static int mount_fallback(struct csi_node *n, const struct csi_volume *v, struct csi_reply *r)
{
	char vdir[PATH_MAX], dir[PATH_MAX];
	int rc, fd = -1;
	if ((rc = csi_node_overlay_dir(n, v, NULL, vdir, sizeof(vdir))) ||
	    (rc = csi_node_own_dir(n, v, "fallback", dir, sizeof(dir)))) {
		csi_node_fail(r, CSI_INTERNAL, "fallback directory: %s", strerror(-rc));
		return rc;
	}
	if ((rc = make_dir(n, v, r)))
		return rc;
	/* Writable by the pod's user whoever that is, like an emptyDir. */
	if ((rc = fsutil_mkdirs(dir, 0700)) || (chmod(dir, 0777) != 0 && (rc = -errno)) ||
	    ((fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 &&
	     (rc = -errno))) {
		csi_node_fail(r, CSI_INTERNAL, "fallback directory %s: %s", dir, strerror(-rc));
		goto out;
	}
	rc = csi_mount_bind(fd, v->target_path, v->pod_read_only);
	if (rc)
		csi_node_fail(r, CSI_INTERNAL,
		              "bind mount of the fallback directory at %s failed: %s",
		              v->target_path, strerror(-rc));
out:
	if (fd >= 0)
		close(fd);
	if (rc && csi_node_clear_dir(vdir) != 0)
		log_warn("cannot remove fallback directory", "dir", vdir);
	return rc;
}

/* Mount the store entry (or the fallback directory) at the volume's target
 * (which exists). */
int csi_node_mount_volume(struct csi_node *n, const struct csi_volume *v, int fd,
                          struct csi_reply *r)
{
	char vdir[PATH_MAX], upper[PATH_MAX], work[PATH_MAX];
	int rc;
	if (v->fallback)
		return mount_fallback(n, v, r);
	if (!v->writable) {
		rc = csi_mount_bind(fd, v->target_path, true);
		if (rc)
			csi_node_fail(r, CSI_INTERNAL, "read-only bind mount at %s failed: %s",
			              v->target_path, strerror(-rc));
		return rc;
	}
	if ((rc = csi_node_overlay_dir(n, v, NULL, vdir, sizeof(vdir))) ||
	    (rc = csi_node_own_dir(n, v, "upper", upper, sizeof(upper))) ||
	    (rc = csi_node_own_dir(n, v, "work", work, sizeof(work)))) {
		csi_node_fail(r, CSI_INTERNAL, "overlay directories: %s", strerror(-rc));
		return rc;
	}
	if ((rc = make_dir(n, v, r)))
		return rc;
	if ((rc = fsutil_mkdirs(upper, 0700)) || (rc = fsutil_mkdirs(work, 0700))) {
		csi_node_fail(r, CSI_INTERNAL, "overlay directories under %s: %s", vdir,
		              strerror(-rc));
		goto out;
	}
	/* The upper root becomes the volume's root: writable by the pod's
	 * user whoever that is (the layer is private to this one volume). */
	if (chmod(upper, 0777) != 0) {
		rc = -errno;
		csi_node_fail(r, CSI_INTERNAL, "chmod %s: %s", upper, strerror(-rc));
		goto out;
	}
	rc = csi_mount_overlay(fd, upper, work, v->target_path);
	if (rc)
		csi_node_fail(r, CSI_INTERNAL, "overlay mount at %s failed: %s", v->target_path,
		              strerror(-rc));
out:
	if (rc && csi_node_clear_dir(vdir) != 0)
		log_warn("cannot remove overlay directories", "dir", vdir);
	return rc;
}

/* The target directory: created when missing (CSI leaves that to the
 * plugin), refused when it is not a plain directory. */
int csi_node_prepare_target(const char *target, bool *created, struct csi_reply *r)
{
	struct stat st;
	*created = false;
	if (lstat(target, &st) != 0) {
		if (errno != ENOENT) {
			csi_node_fail(r, CSI_INTERNAL, "target %s: %s", target, strerror(errno));
			return -errno;
		}
		if (mkdir(target, 0750) != 0) {
			int e = errno;
			csi_node_fail(r, e == ENOENT ? CSI_INVALID_ARGUMENT : CSI_INTERNAL,
			              "cannot create target %s: %s", target, strerror(e));
			return -e;
		}
		*created = true;
		return 0;
	}
	if (!S_ISDIR(st.st_mode)) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "target %s exists and is not a directory",
		              target);
		return -ENOTDIR;
	}
	return 0;
}

/* Remove what a failed publish made: the mount, the target it created,
 * the volume's private directories. */
void csi_node_undo_target(struct csi_node *n, const struct csi_volume *v, bool created)
{
	char vdir[PATH_MAX];
	if (csi_mount_unmount(v->target_path) != 0)
		log_error("cannot unmount after a failed publish", "target", v->target_path);
	if (created && rmdir(v->target_path) != 0 && errno != ENOENT)
		log_warn("cannot remove target after a failed publish", "target", v->target_path,
		         "error", strerror(errno));
	if (csi_node_overlay_dir(n, v, NULL, vdir, sizeof(vdir)) == 0 &&
	    csi_node_clear_dir(vdir) != 0)
		log_warn("cannot remove the volume's directories", "dir", vdir);
}
