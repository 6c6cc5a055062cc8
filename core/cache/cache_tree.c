#include "cache_tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fstree.h"
#include "fsutil.h"

#define UNITE_MAX_DEPTH 64

#define LINKS_MAX 4096

/* A file of several names met once already: its copy is linked again. */
struct seen_link {
	dev_t dev;
	ino_t ino;
	char rel[PATH_MAX];
};

struct unite {
	const char *src_name;
	struct oci_err *err;
	/* a copy of a layer as it is (cache_tree_copy_layer): every kind of
	 * entry, set-id bits and hard links kept */
	bool faithful;
	int droot; /* dst, for links by relative path */
	struct seen_link *links;
	size_t nlinks;
};

/* Copy in's bytes to out, holes kept (a sparse file stays sparse). */
static int copy_data(int in, int out, off_t size)
{
	char buf[1 << 16];
	off_t pos = 0;
	while (pos < size) {
		off_t data = lseek(in, pos, SEEK_DATA);
		if (data < 0 && errno == ENXIO)
			break; /* a hole to the end */
		off_t hole = data < 0 ? size : lseek(in, data, SEEK_HOLE);
		if (data < 0) /* no SEEK_DATA here: copy everything */
			data = pos;
		if (hole < 0)
			hole = size;
		for (pos = data; pos < hole;) {
			size_t want =
			    (size_t)(hole - pos) < sizeof(buf) ? (size_t)(hole - pos) : sizeof(buf);
			ssize_t n = pread(in, buf, want, pos);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return n < 0 ? -errno : 0; /* shrank: what there was */
			for (ssize_t w = 0; w < n;) {
				ssize_t k = pwrite(out, buf + w, (size_t)(n - w), pos + w);
				if (k < 0 && errno != EINTR)
					return -errno;
				w += k > 0 ? k : 0;
			}
			pos += n;
		}
	}
	return ftruncate(out, size) == 0 ? 0 : -errno;
}

/* faithful: a second name of a file already copied is linked to its copy.
 * 1 when linked, 0 when not (the first name, or not a hard link). */
static int link_again(struct unite *u, int ddir, const char *name, const char *rel,
                      const struct stat *st)
{
	if (!u->faithful || st->st_nlink < 2)
		return 0;
	for (size_t i = 0; i < u->nlinks; i++) {
		if (u->links[i].dev != st->st_dev || u->links[i].ino != st->st_ino)
			continue;
		if (linkat(u->droot, u->links[i].rel, ddir, name, 0) != 0) {
			oci_errf(u->err, "cannot link %s: %s", rel, strerror(errno));
			return -errno;
		}
		return 1;
	}
	if (u->nlinks % 64 == 0) {
		struct seen_link *n =
		    u->nlinks < LINKS_MAX ? realloc(u->links, (u->nlinks + 64) * sizeof(*n)) : NULL;
		if (!n)
			return 0; /* past the bound: copied as separate files */
		u->links = n;
	}
	struct seen_link *l = &u->links[u->nlinks++];
	l->dev = st->st_dev;
	l->ino = st->st_ino;
	snprintf(l->rel, sizeof(l->rel), "%s", rel);
	return 0;
}

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
	if ((rc = link_again(u, ddir, name, rel, st)) != 0) {
		rc = rc > 0 ? 0 : rc;
		goto out;
	}
	out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0) {
		rc = -errno;
		oci_errf(u->err, "cannot create %s: %s", rel, strerror(errno));
		goto out;
	}
	rc = copy_data(in, out, st->st_size);
	struct timespec ts[2] = {st->st_atim, st->st_mtim};
	/* after the data (a write clears set-id bits), and past the umask */
	if (rc == 0 &&
	    (fchmod(out, st->st_mode & (u->faithful ? 07777 : 0777)) < 0 || futimens(out, ts) < 0))
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
		} else if (u->faithful && !have) {
			/* whiteouts, devices, FIFOs, sockets: as they are, for what
			 * reads the copy to judge (a capture refuses them) */
			if (mknodat(ddir, de->d_name, st.st_mode & (S_IFMT | 07777), st.st_rdev) !=
			    0) {
				rc = -errno;
				oci_errf(u->err, "cannot copy %s: %s", crel, strerror(errno));
			}
		} else {
			oci_errf(u->err, "%s in %s is not a regular file, directory or symlink",
			         crel, u->src_name);
			rc = -EPERM;
		}
	}
	closedir(d);
	return rc;
}

static int unite_trees(const char *src, const char *dst, const char *src_name, bool faithful,
                       struct oci_err *err)
{
	struct unite u = {.src_name = src_name, .err = err, .faithful = faithful};
	int s = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int d = open(dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc;
	if (s < 0 || d < 0) {
		rc = -errno;
		oci_errf(err, "cannot open %s: %s", s < 0 ? src : dst, strerror(errno));
	} else {
		u.droot = d;
		rc = unite(&u, s, d, "", 0);
	}
	free(u.links);
	if (s >= 0)
		close(s);
	if (d >= 0)
		close(d);
	return rc;
}

int cache_tree_unite(const char *src, const char *dst, const char *src_name, struct oci_err *err)
{
	return unite_trees(src, dst, src_name, false, err);
}

int cache_tree_copy_layer(const char *src, const char *dst, struct oci_err *err)
{
	return unite_trees(src, dst, "the layer", true, err);
}
