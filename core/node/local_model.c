#include "local_model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fstree.h"
#include "kube_affinity.h"
#include "objstore.h"

#define DIR_NAME "kernel-caches"

const char *local_model_name(const cJSON *cache)
{
	return obj_str(cache, "spec.localModel.cacheName");
}

bool local_model_here(const cJSON *cache, const char *node, const cJSON *labels, char *path,
                      size_t size)
{
	if (!labels)
		return false;
	const cJSON *g;
	cJSON_ArrayForEach(
	    g, cJSON_GetObjectItemCaseSensitive(
	           cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cache, "spec"),
	                                            "localModel"),
	           "nodeGroups"))
	{
		const cJSON *terms = cJSON_GetObjectItemCaseSensitive(g, "nodeSelectorTerms"), *t;
		bool here = !terms; /* no node affinity: every node */
		cJSON_ArrayForEach(t, terms)
		{
			here = here || kube_affinity_term(t, node, labels);
		}
		if (here && *obj_str(g, "path") == '/') {
			snprintf(path, size, "%s", obj_str(g, "path"));
			return true;
		}
	}
	return false;
}

/* ---- the copy ---- */

static int say(char *err, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int say(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return rc;
}

static int copy_file(int sdir, int ddir, const char *name)
{
	int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc = 0;
	if (in < 0)
		return -errno;
	int out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
	if (out < 0) {
		rc = -errno;
		close(in);
		return rc;
	}
	char buf[65536];
	ssize_t n;
	while ((n = read(in, buf, sizeof(buf))) > 0) {
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(out, buf + off, (size_t)(n - off));
			if (w < 0) {
				rc = -errno;
				goto out;
			}
			off += w;
		}
	}
	if (n < 0)
		rc = -errno;
out:
	close(in);
	if (close(out) != 0 && !rc)
		rc = -errno;
	return rc;
}

/* Copy the entries of directory sdir into directory ddir: directories,
 * regular files and symlinks (as links); nothing else. */
static int copy_tree(int sdir, int ddir)
{
	DIR *d;
	int rc = fstree_opendir(sdir, &d);
	if (rc)
		return rc;
	struct dirent *e;
	while (!rc && (e = readdir(d)) != NULL) {
		struct stat st;
		if (fstree_dot(e->d_name))
			continue;
		if (fstatat(sdir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			rc = -errno;
		} else if (S_ISDIR(st.st_mode)) {
			int s = -1, t = -1;
			if (mkdirat(ddir, e->d_name, 0755) != 0 ||
			    (s = openat(sdir, e->d_name,
			                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
			    (t = openat(ddir, e->d_name,
			                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
				rc = -errno;
			if (!rc)
				rc = copy_tree(s, t);
			if (!rc && fchmod(t, 0555) != 0)
				rc = -errno;
			if (s >= 0)
				close(s);
			if (t >= 0)
				close(t);
		} else if (S_ISREG(st.st_mode)) {
			rc = copy_file(sdir, ddir, e->d_name);
		} else if (S_ISLNK(st.st_mode)) {
			char target[PATH_MAX];
			ssize_t n = readlinkat(sdir, e->d_name, target, sizeof(target) - 1);
			if (n < 0)
				rc = -errno;
			else {
				target[n] = '\0';
				if (symlinkat(target, ddir, e->d_name) != 0)
					rc = -errno;
			}
		}
	}
	closedir(d);
	return rc;
}

/* The kernel-caches directory under path (created when missing), refusing
 * a path that is or passes through a symlink, and a kernel-caches that is
 * one. */
static int open_dir(const char *path, bool create, char *err, size_t len)
{
	char real[PATH_MAX];
	if (!realpath(path, real))
		return say(err, len, -errno, "storage path %s: %s", path, strerror(errno));
	if (strcmp(real, path) != 0)
		return say(err, len, -ELOOP,
		           "storage path %s is a symlink or passes through one (to %s): kernel "
		           "caches are placed only below a real directory",
		           path, real);
	int root = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (root < 0)
		return say(err, len, -errno, "storage path %s: %s", path, strerror(errno));
	if (create && mkdirat(root, DIR_NAME, 0755) != 0 && errno != EEXIST) {
		int e = errno;
		close(root);
		return say(err, len, -e, "cannot make %s/" DIR_NAME ": %s", path, strerror(e));
	}
	int fd = fstree_open_dir(root, DIR_NAME);
	close(root);
	if (fd < 0)
		return say(err, len, fd, "%s/" DIR_NAME " %s", path,
		           fd == -ELOOP || fd == -ENOTDIR
		               ? "is a symlink or not a directory: refused"
		               : strerror(-fd));
	return fd;
}

int local_model_place(const char *path, const char *name, int src, char *err, size_t errlen)
{
	char tmp[300];
	if (!obj_valid_name(name))
		return say(err, errlen, -EINVAL, "'%s' is not a LocalModelCache name", name);
	int kc = open_dir(path, true, err, errlen);
	if (kc < 0)
		return kc;
	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	int rc = fstree_remove(kc, tmp), t = -1;
	int s = openat(src, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!rc && (s < 0 || mkdirat(kc, tmp, 0755) != 0 ||
	            (t = openat(kc, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0))
		rc = -errno;
	if (!rc)
		rc = copy_tree(s, t);
	if (!rc && fchmod(t, 0555) != 0)
		rc = -errno;
	/* into place: swapped with what is there (then removed), or renamed */
	if (!rc && renameat2(kc, tmp, kc, name, RENAME_EXCHANGE) != 0) {
		if (errno != ENOENT || renameat(kc, tmp, kc, name) != 0)
			rc = -errno;
	}
	if (fstree_remove(kc, tmp) != 0 && !rc)
		rc = -EIO;
	if (rc)
		say(err, errlen, rc, "cannot place the kernel cache in %s/" DIR_NAME "/%s: %s",
		    path, name, strerror(-rc));
	if (s >= 0)
		close(s);
	if (t >= 0)
		close(t);
	close(kc);
	return rc;
}

int local_model_remove(const char *path, const char *name, char *err, size_t errlen)
{
	if (!obj_valid_name(name))
		return say(err, errlen, -EINVAL, "'%s' is not a LocalModelCache name", name);
	int kc = open_dir(path, false, err, errlen);
	if (kc == -ENOENT)
		return 0;
	if (kc < 0)
		return kc;
	int rc = fstree_remove(kc, name);
	close(kc);
	if (rc)
		say(err, errlen, rc, "cannot remove %s/" DIR_NAME "/%s: %s", path, name,
		    strerror(-rc));
	return rc;
}
