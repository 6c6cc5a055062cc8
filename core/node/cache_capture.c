#include "cache_capture.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"
#include "cache_tree.h"
#include "engine.h"
#include "fstree.h"
#include "log.h"

void cache_capture_rules_default(struct cache_walk_rules *r)
{
	memset(r, 0, sizeof(*r));
	r->max_files = CACHE_CAPTURE_MAX_FILES;
	r->max_bytes = CACHE_CAPTURE_MAX_BYTES;
}

static int sub(char *buf, const char *root, const char *name)
{
	return (size_t)snprintf(buf, PATH_MAX, "%s/%s", root, name) >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* Overlay of lower at ws->cache: with upper (and work) writable, else a
 * read-only view of top over lower. -errno where the kernel or our
 * privileges refuse (the caller copies then). */
static int mount_overlay(const struct cache_capture_ws *ws, const char *upper, const char *work,
                         const char *top)
{
	char opts[3 * PATH_MAX + 64];
	size_t n;
	const char *paths[] = {ws->lower, upper ? upper : top, upper ? work : ""};
	for (size_t i = 0; i < 3; i++)
		if (strpbrk(paths[i], ",:"))
			return -EINVAL; /* the option syntax has no escapes */
	if (upper)
		n = (size_t)snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s",
		                     ws->lower, upper, work);
	else
		n = (size_t)snprintf(opts, sizeof(opts), "lowerdir=%s:%s", top, ws->lower);
	if (n >= sizeof(opts))
		return -ENAMETOOLONG;
	unsigned long flags = MS_NOSUID | MS_NODEV | (upper ? 0 : MS_RDONLY);
	if (mount("overlay", ws->cache, "overlay", flags, opts) != 0)
		return -errno;
	return 0;
}

int cache_capture_ws_open(const char *root, const char *lower, const char *top, bool overlay,
                          struct cache_capture_ws *ws, struct oci_err *err)
{
	char upper[PATH_MAX], work[PATH_MAX];
	int rc;
	memset(ws, 0, sizeof(*ws));
	snprintf(ws->root, sizeof(ws->root), "%s", root);
	if (top && !lower) {
		snprintf(ws->cache, sizeof(ws->cache), "%s", top);
		snprintf(ws->added, sizeof(ws->added), "%s", top);
		return 0;
	}
	if ((rc = sub(ws->cache, root, "cache")) || (rc = sub(upper, root, "upper")) ||
	    (rc = sub(work, root, "work"))) {
		oci_errf(err, "workspace path too long under %s", root);
		return rc;
	}
	if (mkdir(ws->cache, 0755) < 0) {
		rc = -errno;
		oci_errf(err, "cannot create %s: %s", ws->cache, strerror(errno));
		return rc;
	}
	memcpy(ws->added, ws->cache, sizeof(ws->added));
	if (!lower)
		return 0;
	snprintf(ws->lower, sizeof(ws->lower), "%s", lower);
	if (top) {
		snprintf(ws->added, sizeof(ws->added), "%s", top);
		if (overlay && (rc = mount_overlay(ws, NULL, NULL, top)) == 0) {
			ws->mounted = true;
			return 0;
		}
		if ((rc = cache_tree_unite(lower, ws->cache, "the base cache", err)))
			return rc;
		return cache_tree_unite(top, ws->cache, "the captured files", err);
	}
	if (overlay) {
		if (mkdir(upper, 0755) < 0 || mkdir(work, 0700) < 0) {
			rc = -errno;
			oci_errf(err, "cannot create the overlay's layers: %s", strerror(errno));
			return rc;
		}
		rc = mount_overlay(ws, upper, work, NULL);
		if (rc == 0) {
			ws->mounted = true;
			memcpy(ws->added, upper, sizeof(ws->added));
			return 0;
		}
		log_info("no overlay mount for the capture; copying the base instead", "error",
		         strerror(-rc));
	}
	return cache_tree_unite(lower, ws->cache, "the base cache", err);
}

int cache_capture_ws_close(struct cache_capture_ws *ws)
{
	int rc = 0;
	if (ws->mounted && umount2(ws->cache, UMOUNT_NOFOLLOW) != 0 &&
	    umount2(ws->cache, MNT_DETACH | UMOUNT_NOFOLLOW) != 0) {
		rc = -errno;
		log_warn("cannot unmount the capture's overlay", "dir", ws->cache, "error",
		         strerror(errno));
		return rc; /* never remove through a live mount: it would empty the base */
	}
	ws->mounted = false;
	if (ws->root[0] && (rc = fstree_remove(AT_FDCWD, ws->root)))
		log_warn("cannot remove the capture's workspace", "dir", ws->root, "error",
		         strerror(-rc));
	return rc;
}

/* The verdicts' reasons, "GPU 0: BackendMismatch (message); ..." */
static void reasons(const cJSON *out, char *buf, size_t cap)
{
	size_t n = 0;
	const cJSON *v;
	buf[0] = '\0';
	cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(out, "gpus"))
	{
		const cJSON *i = cJSON_GetObjectItemCaseSensitive(v, "index");
		const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, "reason");
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(v, "message");
		int k = snprintf(
		    buf + n, cap - n, "%sGPU %d: %s%s%s%s", n ? "; " : "",
		    cJSON_IsNumber(i) ? i->valueint : -1, cJSON_IsString(r) ? r->valuestring : "?",
		    cJSON_IsString(m) ? " (" : "", cJSON_IsString(m) ? m->valuestring : "",
		    cJSON_IsString(m) ? ")" : "");
		if (k < 0 || (size_t)k >= cap - n)
			return;
		n += (size_t)k;
	}
}

static bool any_compatible(const cJSON *out)
{
	const cJSON *v;
	cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(out, "gpus"))
	{
		if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "compatible")))
			return true;
	}
	return false;
}

int cache_capture_check_targets(const cJSON *targets, const cJSON *gpus, const char *policy_dir,
                                struct oci_err *err)
{
	struct bundle *b = NULL;
	struct engine *e = NULL;
	struct engine_error ee;
	cJSON *in = NULL, *one = NULL;
	char why[512] = "";
	int rc = 0;
	if (cJSON_GetArraySize(targets) == 0)
		return 0;
	if (cJSON_GetArraySize(gpus) == 0) {
		oci_errf(err,
		         "no GPUs to check the captured kernels against (give a GPU inventory)");
		return -EPERM;
	}
	rc = policy_dir ? bundle_from_dir(policy_dir, &b, why, sizeof(why)) : bundle_builtin(&b);
	if (rc == 0 && engine_new(b, &engine_limits_default, &e, &ee) != 0) {
		oci_errf(err, "cannot load the compat policy: %s", ee.message);
		rc = -EINVAL;
		goto out;
	}
	if (rc) {
		oci_errf(err, "cannot load the compat policy: %s", why[0] ? why : strerror(-rc));
		rc = -EINVAL;
		goto out;
	}
	rc = -ENOMEM;
	cJSON *cache = NULL;
	if (!(in = cJSON_CreateObject()) || !(cache = cJSON_AddObjectToObject(in, "cache")) ||
	    !cJSON_AddStringToObject(cache, "name", "capture") ||
	    !(one = cJSON_AddArrayToObject(cache, "targets")) ||
	    !cJSON_AddItemReferenceToObject(in, "gpus", (cJSON *)gpus))
		goto out;
	rc = 0;
	const cJSON *t;
	cJSON_ArrayForEach(t, targets)
	{
		cJSON *out = NULL;
		cJSON_DeleteItemFromArray(one, 0);
		if (!cJSON_AddItemReferenceToArray(one, (cJSON *)t)) {
			rc = -ENOMEM;
			break;
		}
		if (engine_call(e, "compat", in, &out, &ee) != ENGINE_OK) {
			oci_errf(err, "the compat policy failed: %s", ee.message);
			rc = -EINVAL;
			break;
		}
		if (!any_compatible(out)) {
			char *ts = cJSON_PrintUnformatted(t);
			reasons(out, why, sizeof(why));
			oci_errf(
			    err,
			    "captured kernels for %s run on none of the GPUs they were captured "
			    "on: %s",
			    ts ? ts : "a target", why);
			free(ts);
			rc = -EPERM;
		}
		cJSON_Delete(out);
		if (rc)
			break;
	}
out:
	cJSON_Delete(in);
	engine_unref(e);
	bundle_free(b);
	return rc;
}
