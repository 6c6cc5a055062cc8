#include "cache_tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fstree.h"
#include "fsutil.h"

#define UNITE_MAX_DEPTH 64

struct unite {
	const char *src_name;
	struct oci_err *err;
};

/* 1 same bytes, 0 different, -errno. */
static int same_bytes(int a, int b)
{
	char x[1 << 15], y[sizeof(x)];
	for (;;) {
		ssize_t na = read(a, x, sizeof(x));
		if (na < 0)
			return -errno;
		ssize_t nb = na ? read(b, y, (size_t)na) : read(b, y, 1);
		if (nb < 0)
			return -errno;
		if (na != nb || memcmp(x, y, (size_t)na) != 0)
			return 0;
		if (na == 0)
			return 1;
	}
}

static int copy_file(struct unite *u, int sdir, int ddir, const char *name, const char *rel,
                     const struct stat *st)
{
	/* the file the walk met, still: never through a link, never blocking on
	 * a FIFO or device put in its place */
	int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), out = -1,
	    rc = 0;
	struct stat now;
	if (in < 0 || fstat(in, &now) < 0 || !S_ISREG(now.st_mode) || now.st_dev != st->st_dev ||
	    now.st_ino != st->st_ino) {
		rc = in < 0 ? -errno : -EAGAIN;
		oci_errf(u->err, "cannot open %s in %s: %s", rel, u->src_name,
		         in < 0 ? strerror(errno) : "it was replaced while being read");
		if (in >= 0)
			close(in);
		return rc;
	}
	out = openat(ddir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (out >= 0) {
		rc = same_bytes(in, out);
		if (rc == 0) {
			oci_errf(u->err, "%s has other contents in %s than in the trees before it",
			         rel, u->src_name);
			rc = -EEXIST;
		} else if (rc > 0) {
			rc = 0;
		} else {
			oci_errf(u->err, "comparing %s: %s", rel, strerror(-rc));
		}
		goto out;
	}
	out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
	             st->st_mode & 0777);
	if (out < 0) {
		rc = -errno;
		oci_errf(u->err, "cannot create %s: %s", rel, strerror(errno));
		goto out;
	}
	char buf[1 << 16];
	for (;;) {
		ssize_t n = read(in, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : 0;
			break;
		}
		if ((rc = fsutil_write_all(out, buf, (size_t)n)))
			break;
	}
	struct timespec ts[2] = {st->st_atim, st->st_mtim};
	if (rc == 0 && futimens(out, ts) < 0)
		rc = -errno;
	if (rc)
		oci_errf(u->err, "copying %s: %s", rel, strerror(-rc));
out:
	close(in);
	if (out >= 0)
		close(out);
	return rc;
}

static int copy_link(struct unite *u, int sdir, int ddir, const char *name, const char *rel)
{
	char t[PATH_MAX], have[PATH_MAX];
	ssize_t n = readlinkat(sdir, name, t, sizeof(t) - 1);
	if (n < 0) {
		oci_errf(u->err, "cannot read link %s: %s", rel, strerror(errno));
		return -errno;
	}
	t[n] = '\0';
	ssize_t h = readlinkat(ddir, name, have, sizeof(have) - 1);
	if (h >= 0) {
		have[h] = '\0';
		if (strcmp(have, t) == 0)
			return 0;
		oci_errf(u->err, "%s links elsewhere in %s than in the trees before it", rel,
		         u->src_name);
		return -EEXIST;
	}
	if (symlinkat(t, ddir, name) < 0) {
		int rc = -errno;
		oci_errf(u->err, "%s: %s", rel,
		         errno == EEXIST ? "a link in one tree, a file in another"
		                         : strerror(errno));
		return rc;
	}
	return 0;
}

static int unite(struct unite *u, int sdir, int ddir, const char *rel, int depth)
{
	DIR *d = NULL;
	const struct dirent *de;
	int rc = depth > UNITE_MAX_DEPTH ? -ELOOP : fstree_opendir(sdir, &d);
	if (rc) {
		oci_errf(u->err, "cannot read %s in %s: %s", *rel ? rel : ".", u->src_name,
		         strerror(-rc));
		return rc;
	}
	while (rc == 0 && (de = readdir(d))) {
		char crel[PATH_MAX];
		struct stat st, dst;
		if (fstree_dot(de->d_name))
			continue;
		snprintf(crel, sizeof(crel), "%s%s%s", rel, *rel ? "/" : "", de->d_name);
		if (fstatat(sdir, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			rc = -errno;
			oci_errf(u->err, "cannot stat %s in %s: %s", crel, u->src_name,
			         strerror(errno));
			break;
		}
		bool have = fstatat(ddir, de->d_name, &dst, AT_SYMLINK_NOFOLLOW) == 0;
		if (have && (st.st_mode & S_IFMT) != (dst.st_mode & S_IFMT)) {
			oci_errf(u->err, "%s is a %s in %s and a %s in the trees before it", crel,
			         S_ISDIR(st.st_mode) ? "directory" : "file", u->src_name,
			         S_ISDIR(dst.st_mode) ? "directory" : "file");
			rc = -EEXIST;
		} else if (S_ISREG(st.st_mode)) {
			rc = copy_file(u, sdir, ddir, de->d_name, crel, &st);
		} else if (S_ISLNK(st.st_mode)) {
			rc = copy_link(u, sdir, ddir, de->d_name, crel);
		} else if (S_ISDIR(st.st_mode)) {
			if (!have && mkdirat(ddir, de->d_name, 0755) < 0) {
				rc = -errno;
				oci_errf(u->err, "cannot create %s: %s", crel, strerror(errno));
				break;
			}
			int s = openat(sdir, de->d_name,
			               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int t = openat(ddir, de->d_name,
			               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (s < 0 || t < 0) {
				rc = -errno;
				oci_errf(u->err, "cannot open %s: %s", crel, strerror(errno));
			} else {
				rc = unite(u, s, t, crel, depth + 1);
			}
			if (s >= 0)
				close(s);
			if (t >= 0)
				close(t);
			if (rc == 0 && !have &&
			    fchmodat(ddir, de->d_name, st.st_mode & 0777, 0) < 0)
				rc = -errno;
		} else {
			oci_errf(u->err, "%s in %s is not a regular file, directory or symlink",
			         crel, u->src_name);
			rc = -EPERM;
		}
	}
	closedir(d);
	return rc;
}

int cache_tree_unite(const char *src, const char *dst, const char *src_name, struct oci_err *err)
{
	struct unite u = {.src_name = src_name, .err = err};
	int s = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int d = open(dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc;
	if (s < 0 || d < 0) {
		rc = -errno;
		oci_errf(err, "cannot open %s: %s", s < 0 ? src : dst, strerror(errno));
	} else {
		rc = unite(&u, s, d, "", 0);
	}
	if (s >= 0)
		close(s);
	if (d >= 0)
		close(d);
	return rc;
}
