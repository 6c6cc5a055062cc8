#include "cache_image_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "extract.h"
#include "fsutil.h"
#include "fstree.h"

#define WALK_MAX_DEPTH 64

/* ---- walking a cache directory in a stable order --------------------- */

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* The names in directory fd, sorted. Counted against the entry cap as they
 * are read, so a directory of a million files stops at the cap. */
static int read_names(struct walk_ctx *w, int fd, const char *full, char ***out, size_t *nout)
{
	DIR *d = NULL;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int rc = fstree_opendir(fd, &d);
	if (rc) {
		oci_errf(w->err, "cannot read directory %s: %s", full, strerror(-rc));
		return rc;
	}
	const struct dirent *de;
	errno = 0;
	while ((de = readdir(d))) {
		if (fstree_dot(de->d_name))
			continue;
		if (w->rules && w->rules->max_files && ++w->entries > w->rules->max_files) {
			oci_errf(
			    w->err,
			    "%s holds more than %" PRIu64
			    " files and directories: over the capture's file cap (--max-files)",
			    w->root, w->rules->max_files);
			rc = -E2BIG;
			goto out;
		}
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			char **nn = realloc(names, ncap * sizeof(*nn));
			if (!nn) {
				rc = -ENOMEM;
				goto out;
			}
			names = nn;
			cap = ncap;
		}
		if (!(names[n] = strdup(de->d_name))) {
			rc = -ENOMEM;
			goto out;
		}
		n++;
		errno = 0;
	}
	if (errno) {
		rc = -errno;
		oci_errf(w->err, "cannot read directory %s: %s", full, strerror(errno));
		goto out;
	}
	qsort(names, n, sizeof(*names), cmp_names);
	*out = names;
	*nout = n;
	names = NULL;
	n = 0;
out:
	free_names(names, n);
	closedir(d);
	return rc;
}

static bool same_inode(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
	       (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT);
}

static int walk(struct walk_ctx *w, int dirfd, const char *full, const char *rel, int depth)
{
	char **names = NULL;
	size_t n = 0;
	if (depth > WALK_MAX_DEPTH) {
		oci_errf(w->err, "%s is nested deeper than %d directories", full, WALK_MAX_DEPTH);
		return -ELOOP;
	}
	int rc = read_names(w, dirfd, full, &names, &n);
	for (size_t i = 0; i < n && rc == 0; i++) {
		char cfull[PATH_MAX], crel[PATH_MAX];
		struct walk_entry e = {
		    .rel = crel, .full = cfull, .dirfd = dirfd, .name = names[i]};
		if ((size_t)snprintf(cfull, sizeof(cfull), "%s/%s", full, names[i]) >=
		        sizeof(cfull) ||
		    (size_t)snprintf(crel, sizeof(crel), "%s%s%s", rel, *rel ? "/" : "",
		                     names[i]) >= sizeof(crel)) {
			oci_errf(w->err, "path too long under %s", full);
			rc = -ENAMETOOLONG;
			break;
		}
		if (fstatat(dirfd, names[i], &e.st, AT_SYMLINK_NOFOLLOW) < 0) {
			rc = -errno;
			oci_errf(w->err, "cannot stat %s: %s", cfull, strerror(errno));
			break;
		}
		rc = w->visit(w, &e);
		if (rc > 0) {
			rc = 0;
			continue;
		}
		if (rc || !S_ISDIR(e.st.st_mode))
			continue;
		struct stat now;
		int cfd = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (cfd < 0 || fstat(cfd, &now) < 0 || !same_inode(&now, &e.st)) {
			rc = cfd < 0 ? -errno : -EAGAIN;
			oci_errf(w->err, "cannot open directory %s: %s", cfull,
			         cfd < 0 ? strerror(errno) : "it was replaced while being read");
		} else {
			rc = walk(w, cfd, cfull, crel, depth + 1);
		}
		if (cfd >= 0)
			close(cfd);
	}
	free_names(names, n);
	return rc;
}

/* Walk the tree at dir (the root itself may be reached through a link). */
int ci_walk_root(struct walk_ctx *w, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		oci_errf(w->err, "%s is not a directory: %s", dir, strerror(errno));
		return rc;
	}
	w->root = dir;
	int rc = walk(w, fd, dir, "", 0);
	close(fd);
	return rc;
}

static const char *kind_of(mode_t m)
{
	return S_ISCHR(m)    ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
	       : S_ISFIFO(m) ? "a FIFO"
	       : S_ISSOCK(m) ? "a socket"
	                     : "not a regular file";
}

/* Open a regular file the walk met, making sure it is still that file. */
int ci_open_entry(struct walk_ctx *w, const struct walk_entry *e, int *out)
{
	struct stat now;
	int fd = openat(e->dirfd, e->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &now) < 0 || !same_inode(&now, &e->st)) {
		int rc = fd < 0 ? -errno : -EAGAIN;
		oci_errf(w->err, "cannot open %s: %s", e->full,
		         fd < 0 ? strerror(errno) : "it was replaced while being read");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	*out = fd;
	return 0;
}

/* Untrusted walks: a file whose size or time moved while it was read is
 * being written; its bytes are not what any kernel compile produced. */
int ci_check_unchanged(struct walk_ctx *w, const struct walk_entry *e, int fd)
{
	struct stat now;
	if (!w->rules)
		return 0;
	if (fstat(fd, &now) < 0)
		return -errno;
	if (now.st_size == e->st.st_size && now.st_mtim.tv_sec == e->st.st_mtim.tv_sec &&
	    now.st_mtim.tv_nsec == e->st.st_mtim.tv_nsec)
		return 0;
	oci_errf(w->err,
	         "%s changed while it was captured (%jd bytes, then %jd): something is still "
	         "writing it; capture again once the writer has finished",
	         e->full, (intmax_t)e->st.st_size, (intmax_t)now.st_size);
	return -EAGAIN;
}

/* 1 when the captured file has the bytes of the base's file at its path. */
static int same_as_base(struct walk_ctx *w, const struct walk_entry *e)
{
	char path[PATH_MAX];
	struct stat bst;
	int rc = 0, bfd = -1, fd = -1;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", w->rules->unchanged_from, e->rel) >=
	        sizeof(path) ||
	    lstat(path, &bst) < 0 || !S_ISREG(bst.st_mode) || bst.st_size != e->st.st_size)
		return 0;
	if ((bfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
	    (rc = ci_open_entry(w, e, &fd)))
		goto out;
	char a[1 << 15], b[sizeof(a)];
	for (;;) {
		ssize_t na = read(fd, a, sizeof(a));
		ssize_t nb = na > 0 ? read(bfd, b, (size_t)na) : 0;
		if (na < 0 || nb != na) {
			rc = na < 0 ? -errno : 0;
			if (rc)
				oci_errf(w->err, "reading %s: %s", e->full, strerror(-rc));
			goto out;
		}
		if (na == 0) {
			rc = 1;
			goto out;
		}
		if (memcmp(a, b, (size_t)na) != 0)
			goto out;
	}
out:
	if (fd >= 0)
		close(fd);
	if (bfd >= 0)
		close(bfd);
	return rc;
}

/* FNV-1a over the entry's path, size and modification time, added up (the
 * order of the walk does not matter). */
static uint64_t stamp_mix(uint64_t stamp, const struct walk_entry *e)
{
	uint64_t h = 1469598103934665603ull;
	int64_t v[3] = {(int64_t)e->st.st_size, (int64_t)e->st.st_mtim.tv_sec,
	                (int64_t)e->st.st_mtim.tv_nsec};
	for (const char *p = e->rel; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	for (size_t i = 0; i < sizeof(v); i++)
		h = (h ^ ((const unsigned char *)v)[i]) * 1099511628211ull;
	return stamp + h;
}

/* What a cache image may carry: 0 package, 1 leave out (unchanged from the
 * base), -errno refused (err says which path and why). */
int ci_admit(struct walk_ctx *w, struct walk_entry *e)
{
	const struct cache_walk_rules *r = w->rules;
	mode_t m = e->st.st_mode;
	if (S_ISLNK(m)) {
		ssize_t n = readlinkat(e->dirfd, e->name, e->link, sizeof(e->link) - 1);
		if (n < 0) {
			int rc = -errno;
			oci_errf(w->err, "cannot read link %s: %s", e->full, strerror(errno));
			return rc;
		}
		e->link[n] = '\0';
		if (r) {
			oci_errf(
			    w->err,
			    "cannot capture %s: a symlink (to '%s'); a capture takes only regular "
			    "files",
			    e->full, e->link);
			return -EPERM;
		}
		if (!extract_symlink_inside(e->rel, e->link)) {
			oci_errf(w->err,
			         "cannot package %s: symlink to '%s' leaves the cache directory",
			         e->full, e->link);
			return -EPERM;
		}
		return 0;
	}
	if (!S_ISREG(m) && !S_ISDIR(m)) {
		if (r && S_ISCHR(m) && e->st.st_rdev == 0)
			oci_errf(w->err,
			         "cannot capture %s: it was deleted from the base cache, and a "
			         "capture only adds files",
			         e->full);
		else
			oci_errf(w->err,
			         "cannot %s %s: %s, not a regular file, directory or symlink",
			         r ? "capture" : "package", e->full, kind_of(m));
		return -EPERM;
	}
	if (!r)
		return 0;
	if (m & (S_ISUID | S_ISGID)) {
		oci_errf(w->err, "cannot capture %s: it has the set-user-ID or set-group-ID bit",
		         e->full);
		return -EPERM;
	}
	if (S_ISDIR(m))
		return 0;
	if (e->st.st_nlink > 1) {
		oci_errf(w->err,
		         "cannot capture %s: it has %ju names (hard links); a capture takes files "
		         "with one name",
		         e->full, (uintmax_t)e->st.st_nlink);
		return -EPERM;
	}
	if (r->unchanged_from) {
		int same = same_as_base(w, e);
		if (same)
			return same;
	}
	w->bytes += (uint64_t)e->st.st_size;
	w->stamp = stamp_mix(w->stamp, e);
	if (r->max_bytes && w->bytes > r->max_bytes) {
		oci_errf(w->err,
		         "%s (%jd bytes) takes the capture over its byte cap of %" PRIu64
		         " (--max-bytes)",
		         e->full, (intmax_t)e->st.st_size, r->max_bytes);
		return -EFBIG;
	}
	return 0;
}

static bool is_json_name(const char *name)
{
	size_t nl = strlen(name);
	return nl >= 5 && strcmp(name + nl - 5, ".json") == 0;
}

/* A small JSON file's bytes, read from fd, for the metadata scan; NULL when
 * it is not one (or cannot be read: the caller streams it then). */
char *ci_read_small_json(const struct walk_entry *e, int fd, size_t *len)
{
	if (!is_json_name(e->name) || e->st.st_size > (off_t)CACHE_JSON_MAX)
		return NULL;
	char *buf = NULL;
	if (fsutil_read_fd(fd, CACHE_JSON_MAX, &buf, len))
		return NULL;
	return buf;
}

struct scan_ctx {
	struct walk_ctx w;
	struct cache_meta *m;
};

static int scan_visit(struct walk_ctx *w, struct walk_entry *e)
{
	struct scan_ctx *s = (struct scan_ctx *)w;
	int rc = ci_admit(w, e);
	if (rc || !S_ISREG(e->st.st_mode))
		return rc;
	size_t len = 0;
	char *data = NULL;
	if (is_json_name(e->name) && e->st.st_size <= (off_t)CACHE_JSON_MAX) {
		int fd = -1;
		if ((rc = ci_open_entry(w, e, &fd)))
			return rc;
		data = ci_read_small_json(e, fd, &len);
		rc = ci_check_unchanged(w, e, fd);
		close(fd);
	}
	if (rc == 0)
		cache_meta_add(s->m, e->rel, (uint64_t)e->st.st_size, data, len);
	free(data);
	return rc;
}

int ci_check_found(const char *dir, const struct cache_meta *m, struct oci_err *err)
{
	if (m->format == CACHE_VLLM && m->entries == 0) {
		oci_errf(err, "%s holds no vLLM cache (no torch_compile_cache/<hash>/ directories)",
		         dir);
		return -EINVAL;
	}
	if (m->format == CACHE_TRITON && m->entries == 0) {
		oci_errf(err,
		         "%s holds no Triton cache (no kernel metadata <hash>/<kernel>.json with a "
		         "target)",
		         dir);
		return -EINVAL;
	}
	return 0;
}

int cache_scan_check_found(const char *dir, const struct cache_meta *m, struct oci_err *err)
{
	return ci_check_found(dir, m, err);
}

int cache_scan_dir(const char *dir, enum cache_format f, const struct cache_walk_rules *rules,
                   bool allow_empty, struct cache_meta *m, struct oci_err *err)
{
	if (f == CACHE_AUTO)
		f = cache_detect_format(dir);
	int rc = cache_meta_init(m, f);
	if (rc)
		return rc;
	struct scan_ctx s = {.w = {.visit = scan_visit, .err = err, .rules = rules}, .m = m};
	if ((rc = ci_walk_root(&s.w, dir)) || (!allow_empty && (rc = ci_check_found(dir, m, err))))
		cache_meta_clear(m);
	else
		m->stamp = s.w.stamp;
	return rc;
}
