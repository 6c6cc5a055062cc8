#include "extract_impl.h"

#include "fsutil.h"
#include "fstree.h"
#include "progress.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- writing entries ---- */

static int note_created(struct extract *x, const char *path);

/* Makes the missing directories of parent, one component at a time with
 * O_NOFOLLOW, and returns an fd of the last one. */
static int make_parents(struct extract *x, const char *entry, const char *parent)
{
	char sofar[PATH_BUF];
	size_t so = 0;
	int fd = openat(x->root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return ex_fail(x, -errno, "opening the destination: %s", strerror(errno));
	const char *p = parent;
	while (*p) {
		size_t n = strcspn(p, "/");
		char comp[256];
		memcpy(comp, p, n);
		comp[n] = '\0';
		if (so)
			sofar[so++] = '/';
		memcpy(sofar + so, comp, n);
		so += n;
		sofar[so] = '\0';
		p += n;
		if (*p == '/')
			p++;
		int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0 && errno == ENOENT) {
			if (mkdirat(fd, comp, 0755) < 0 && errno != EEXIST) {
				int e = errno;
				close(fd);
				return ex_fail(x, -e, "creating directory '%s': %s", sofar,
				               strerror(e));
			}
			int rc = note_created(x, sofar);
			if (rc < 0) {
				close(fd);
				return rc;
			}
			x->st.dirs++;
			next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		}
		if (next < 0) {
			int e = errno;
			struct stat st;
			bool link =
			    fstatat(fd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
			close(fd);
			if (link || e == ELOOP)
				return ex_refuse(x, -EPERM, entry,
				                 "path passes through a symlink ('%s')", sofar);
			if (e == ENOTDIR)
				return ex_refuse(x, -EPERM, entry, "'%s' is not a directory",
				                 sofar);
			return ex_fail(x, -e, "opening directory '%s': %s", sofar, strerror(e));
		}
		close(fd);
		fd = next;
	}
	return fd;
}

/* fd of the entry's parent directory, borrowed (cached until the next
 * call or a removal). */
static int parent_fd(struct extract *x, const char *entry, const char *parent)
{
	if (x->pfd >= 0 && strcmp(x->ppath, parent) == 0)
		return x->pfd;
	ex_drop_parent(x);
	int fd = fstree_open_dir(x->root, parent);
	if (fd == -ENOENT)
		fd = make_parents(x, entry, parent);
	else if (fd == -ELOOP)
		return ex_refuse(x, -EPERM, entry, "path passes through a symlink");
	else if (fd == -ENOTDIR)
		return ex_refuse(x, -EPERM, entry, "a parent of the entry is not a directory");
	else if (fd == -EXDEV)
		return ex_refuse(x, -EPERM, entry, "path escapes the tree");
	else if (fd < 0)
		return ex_fail(x, fd, "opening directory '%s': %s", parent, strerror(-fd));
	if (fd < 0)
		return fd;
	x->pfd = fd;
	snprintf(x->ppath, sizeof(x->ppath), "%s", parent);
	return fd;
}

/* Removes whatever is at base so an entry can take its place (tar's
 * "last one wins"). Never follows a link. */
static int make_room(struct extract *x, int pfd, const char *path, const char *base, bool keep_dir)
{
	struct stat st;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT
		           ? 0
		           : ex_fail(x, -errno, "checking '%s': %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		if (keep_dir)
			return 1;
		int rc = fstree_remove(pfd, base);
		if (rc < 0)
			return ex_fail(x, rc, "replacing directory '%s': %s", path, strerror(-rc));
		return 0;
	}
	if (unlinkat(pfd, base, 0) < 0 && errno != ENOENT)
		return ex_fail(x, -errno, "replacing '%s': %s", path, strerror(errno));
	return 0;
}

/* Records that this layer wrote path, and so touched its ancestors: an
 * opaque whiteout in this layer keeps them (and only what this layer put in
 * them). */
static int note_created(struct extract *x, const char *path)
{
	if (!x->below)
		return 0;
	char buf[PATH_BUF];
	size_t n = strlen(path);
	if (n >= sizeof(buf))
		return 0;
	memcpy(buf, path, n + 1);
	for (;;) {
		int rc = ex_pathset_add(&x->created, buf);
		if (rc < 0)
			return ex_fail(x, rc, "out of memory");
		if (rc == 1)
			return 0; /* its ancestors are in too */
		char *slash = strrchr(buf, '/');
		if (slash == NULL)
			return 0;
		*slash = '\0';
	}
}

static void entry_times(struct archive_entry *e, struct timespec ts[2], bool *has)
{
	*has = archive_entry_mtime_is_set(e);
	ts[0].tv_sec = ts[1].tv_sec = archive_entry_mtime(e);
	ts[0].tv_nsec = ts[1].tv_nsec = archive_entry_mtime_nsec(e);
	if (ts[1].tv_nsec < 0 || ts[1].tv_nsec >= 1000000000)
		ts[0].tv_nsec = ts[1].tv_nsec = 0;
}

int ex_archive_failure(struct extract *x, struct archive *a, struct source *s, const char *entry)
{
	char name[300];
	if (s->failed)
		return ex_fail(x, s->err, "%s%s%s%s", entry ? "entry '" : "",
		               entry ? ex_shown(entry, name, sizeof(name)) : "", entry ? "': " : "",
		               s->errmsg);
	const char *m = archive_error_string(a);
	if (entry)
		return ex_fail(x, -EBADMSG, "entry '%s': malformed tar: %s",
		               ex_shown(entry, name, sizeof(name)), m ? m : "unknown error");
	return ex_fail(x, -EBADMSG, "malformed tar: %s", m ? m : "unknown error");
}

static int do_file(struct extract *x, struct archive *a, struct source *s, struct archive_entry *e,
                   const char *path, const char *parent, const char *base, mode_t mode)
{
	int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
	if (size < 0)
		return ex_refuse(x, -EPERM, path, "negative size");
	if (archive_entry_sparse_count(e) > 0)
		return ex_refuse(x, -EPERM, path, "sparse files are not supported");
	if ((uint64_t)size > x->lim.max_entry_bytes)
		return ex_refuse(x, -EFBIG, path, "%lld bytes, over the per-entry cap of %llu",
		                 (long long)size, (unsigned long long)x->lim.max_entry_bytes);
	if (x->st.bytes + (uint64_t)size > x->lim.max_total_bytes)
		return ex_refuse(x, -EFBIG, path, "the tree would pass the total cap of %llu bytes",
		                 (unsigned long long)x->lim.max_total_bytes);
	int pfd = parent_fd(x, path, parent);
	if (pfd < 0)
		return pfd;
	mode_t cmode = mode & 0777;
	int fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, cmode);
	if (fd < 0 && errno == EEXIST) {
		int rc = make_room(x, pfd, path, base, false);
		if (rc < 0)
			return rc;
		fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, cmode);
	}
	if (fd < 0)
		return ex_fail(x, -errno, "creating '%s': %s", path, strerror(errno));
	int rc = 0;
	uint64_t written = 0;
	for (;;) {
		const void *buf;
		size_t len;
		la_int64_t off;
		int r = archive_read_data_block(a, &buf, &len, &off);
		if (r == ARCHIVE_EOF)
			break;
		if (r < ARCHIVE_WARN) {
			rc = ex_archive_failure(x, a, s, path);
			goto out;
		}
		if (off < 0 || (uint64_t)off != written || written + len > (uint64_t)size) {
			rc = ex_refuse(x, -EBADMSG, path, "data does not match the header's size");
			goto out;
		}
		if ((rc = fsutil_write_all(fd, buf, len)) < 0) {
			rc = ex_fail(x, rc, "writing '%s': %s", path, strerror(-rc));
			goto out;
		}
		written += len;
	}
	if (written != (uint64_t)size) {
		rc = ex_refuse(x, -EBADMSG, path, "%llu bytes of data, the header says %lld",
		               (unsigned long long)written, (long long)size);
		goto out;
	}
	bool exact = x->umask >= 0 && (mode & 01777) == (cmode & ~(mode_t)x->umask);
	if (!exact && fchmod(fd, mode & 01777) < 0) {
		rc = ex_fail(x, -errno, "setting the mode of '%s': %s", path, strerror(errno));
		goto out;
	}
	struct timespec ts[2];
	bool has;
	entry_times(e, ts, &has);
	if (has && futimens(fd, ts) < 0) {
		rc = ex_fail(x, -errno, "setting the mtime of '%s': %s", path, strerror(errno));
		goto out;
	}
	x->st.files++;
	x->st.bytes += written;
	progress_add(PROGRESS_EXTRACTED, 0, 1);
	rc = note_created(x, path);
out:
	if (close(fd) < 0 && rc == 0)
		rc = ex_fail(x, -errno, "writing '%s': %s", path, strerror(errno));
	return rc;
}

static int add_dirattr(struct extract *x, const char *path, mode_t mode, struct archive_entry *e)
{
	if (x->ndirs == x->capdirs) {
		size_t ncap = x->capdirs ? x->capdirs * 2 : 64;
		struct dirattr *nd = realloc(x->dirs, ncap * sizeof(*nd));
		if (nd == NULL)
			return ex_fail(x, -ENOMEM, "out of memory");
		x->dirs = nd;
		x->capdirs = ncap;
	}
	struct dirattr *d = &x->dirs[x->ndirs];
	d->path = strdup(path);
	if (d->path == NULL)
		return ex_fail(x, -ENOMEM, "out of memory");
	struct timespec ts[2];
	entry_times(e, ts, &d->has_mtime);
	d->mtime = ts[1];
	d->mode = mode & 01777;
	d->seq = x->ndirs++;
	return 0;
}

static int do_dir(struct extract *x, struct archive_entry *e, const char *path, const char *parent,
                  const char *base, mode_t mode)
{
	if (path[0] == '\0') /* the root itself ("./") */
		return add_dirattr(x, "", mode, e);
	int pfd = parent_fd(x, path, parent);
	if (pfd < 0)
		return pfd;
	if (mkdirat(pfd, base, 0700 | (mode & 0777)) < 0) {
		if (errno != EEXIST)
			return ex_fail(x, -errno, "creating directory '%s': %s", path,
			               strerror(errno));
		int rc = make_room(x, pfd, path, base, true);
		if (rc < 0)
			return rc;
		if (rc == 0 && mkdirat(pfd, base, 0700 | (mode & 0777)) < 0)
			return ex_fail(x, -errno, "creating directory '%s': %s", path,
			               strerror(errno));
	}
	x->st.dirs++;
	int rc = note_created(x, path);
	return rc < 0 ? rc : add_dirattr(x, path, mode, e);
}

const char *ex_entry_str(const char *mbs, const char *utf8)
{
	return mbs ? mbs : utf8;
}

static int do_symlink(struct extract *x, struct archive_entry *e, const char *path,
                      const char *parent, const char *base)
{
	const char *target = ex_entry_str(archive_entry_symlink(e), archive_entry_symlink_utf8(e));
	char shown_t[300];
	if (target == NULL || target[0] == '\0')
		return ex_refuse(x, -EPERM, path, "symlink has no target");
	if (strlen(target) >= PATH_BUF)
		return ex_refuse(x, -EPERM, path, "symlink target is too long");
	if (target[0] == '/')
		return ex_refuse(x, -EPERM, path, "symlink target '%s' is absolute",
		                 ex_shown(target, shown_t, sizeof(shown_t)));
	if (!extract_symlink_inside(path, target))
		return ex_refuse(x, -EPERM, path, "symlink target '%s' resolves outside the tree",
		                 ex_shown(target, shown_t, sizeof(shown_t)));
	int pfd = parent_fd(x, path, parent);
	if (pfd < 0)
		return pfd;
	if (symlinkat(target, pfd, base) < 0) {
		if (errno != EEXIST)
			return ex_fail(x, -errno, "creating symlink '%s': %s", path,
			               strerror(errno));
		int rc = make_room(x, pfd, path, base, false);
		if (rc < 0)
			return rc;
		if (symlinkat(target, pfd, base) < 0)
			return ex_fail(x, -errno, "creating symlink '%s': %s", path,
			               strerror(errno));
	}
	struct timespec ts[2];
	bool has;
	entry_times(e, ts, &has);
	if (has && utimensat(pfd, base, ts, AT_SYMLINK_NOFOLLOW) < 0)
		return ex_fail(x, -errno, "setting the mtime of '%s': %s", path, strerror(errno));
	if (x->nlinks == x->caplinks) {
		size_t ncap = x->caplinks ? x->caplinks * 2 : 32;
		char **nl = realloc(x->links, ncap * sizeof(*nl));
		if (nl == NULL)
			return ex_fail(x, -ENOMEM, "out of memory");
		x->links = nl;
		x->caplinks = ncap;
	}
	if ((x->links[x->nlinks] = strdup(path)) == NULL)
		return ex_fail(x, -ENOMEM, "out of memory");
	x->nlinks++;
	x->st.symlinks++;
	return note_created(x, path);
}

static int do_hardlink(struct extract *x, const char *hl, const char *path, const char *parent,
                       const char *base)
{
	char tpath[PATH_BUF], tparent[PATH_BUF], shown_t[300];
	const char *rule;
	if (extract_clean_path(hl, tpath, sizeof(tpath), &rule) < 0 || tpath[0] == '\0')
		return ex_refuse(x, -EPERM, path, "hard link target '%s' is outside the tree",
		                 ex_shown(hl, shown_t, sizeof(shown_t)));
	if (strcmp(tpath, path) == 0)
		return 0; /* a link to itself: nothing to do */
	const char *tbase = ex_split_base(tpath, tparent, sizeof(tparent));
	int tfd = fstree_open_dir(x->root, tparent);
	if (tfd == -ELOOP)
		return ex_refuse(x, -EPERM, path, "hard link target '%s' passes through a symlink",
		                 ex_shown(hl, shown_t, sizeof(shown_t)));
	struct stat st;
	if (tfd < 0 || fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (tfd >= 0)
			close(tfd);
		return ex_refuse(x, -EPERM, path, "hard link target '%s' is not in the tree",
		                 ex_shown(hl, shown_t, sizeof(shown_t)));
	}
	int rc = 0;
	if (!S_ISREG(st.st_mode)) {
		rc = ex_refuse(x, -EPERM, path, "hard link target '%s' is not a regular file",
		               ex_shown(hl, shown_t, sizeof(shown_t)));
		goto out;
	}
	int pfd = parent_fd(x, path, parent);
	if (pfd < 0) {
		rc = pfd;
		goto out;
	}
	if (linkat(tfd, tbase, pfd, base, 0) < 0) {
		if (errno != EEXIST) {
			rc = ex_fail(x, -errno, "creating hard link '%s': %s", path,
			             strerror(errno));
			goto out;
		}
		if ((rc = make_room(x, pfd, path, base, false)) < 0)
			goto out;
		if (linkat(tfd, tbase, pfd, base, 0) < 0) {
			rc = ex_fail(x, -errno, "creating hard link '%s': %s", path,
			             strerror(errno));
			goto out;
		}
	}
	x->st.hardlinks++;
	rc = note_created(x, path);
out:
	close(tfd);
	return rc;
}

/* Opaque whiteout: remove what lower layers put under dfd (path dpath),
 * keeping what this layer created (recursing into directories it made or
 * touched, whose lower contents must go too). */
static int remove_lower(struct extract *x, int dfd, const char *dpath, int depth)
{
	if (depth > PATH_BUF / 2)
		return ex_fail(x, -ELOOP, "directory tree too deep at '%s'", dpath);
	DIR *d;
	int orc = fstree_opendir(dfd, &d);
	if (orc < 0)
		return ex_fail(x, orc, "reading '%s': %s", dpath, strerror(-orc));
	/* Collect names first: removing while reading may skip entries. */
	char **names = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (fstree_dot(de->d_name))
			continue;
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 32;
			char **nn = realloc(names, ncap * sizeof(*nn));
			if (nn == NULL) {
				rc = ex_fail(x, -ENOMEM, "out of memory");
				goto out;
			}
			names = nn;
			cap = ncap;
		}
		if ((names[n] = strdup(de->d_name)) == NULL) {
			rc = ex_fail(x, -ENOMEM, "out of memory");
			goto out;
		}
		n++;
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		char cpath[PATH_BUF];
		if ((size_t)snprintf(cpath, sizeof(cpath), "%s%s%s", dpath, dpath[0] ? "/" : "",
		                     names[i]) >= sizeof(cpath))
			continue;
		if (!ex_pathset_has(&x->created, cpath)) {
			int r = fstree_remove(dfd, names[i]);
			if (r < 0)
				rc = ex_fail(x, r, "removing '%s': %s", cpath, strerror(-r));
			continue;
		}
		int sub = openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub >= 0) {
			rc = remove_lower(x, sub, cpath, depth + 1);
			close(sub);
		}
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return rc;
}

static int do_whiteout(struct extract *x, const char *path, const char *parent, const char *base)
{
	bool opaque = strcmp(base, ".wh..wh..opq") == 0;
	if (!opaque && strncmp(base, ".wh..wh.", 8) == 0)
		return 0; /* other reserved names (aufs bookkeeping) carry no meaning here */
	const char *victim = base + 4;
	if (!opaque && (victim[0] == '\0' || strcmp(victim, ".") == 0 || strcmp(victim, "..") == 0))
		return ex_refuse(x, -EPERM, path, "whiteout names no file");
	x->st.whiteouts++;
	if (!x->below)
		return 0; /* nothing below the first layer */
	ex_drop_parent(x);
	int dfd = fstree_open_dir(x->root, parent);
	if (dfd == -ENOENT || dfd == -ENOTDIR)
		return 0;
	if (dfd == -ELOOP)
		return ex_refuse(x, -EPERM, path, "path passes through a symlink");
	if (dfd < 0)
		return ex_fail(x, dfd, "opening directory '%s': %s", parent, strerror(-dfd));
	int rc;
	if (opaque) {
		rc = remove_lower(x, dfd, parent, 0);
	} else {
		char vpath[2 * PATH_BUF]; /* parent and name each fit PATH_BUF */
		snprintf(vpath, sizeof(vpath), "%s%s%s", parent, parent[0] ? "/" : "", victim);
		rc = 0;
		if (!ex_pathset_has(&x->created, vpath)) {
			rc = fstree_remove(dfd, victim);
			if (rc < 0)
				rc = ex_fail(x, rc, "removing '%s': %s", vpath, strerror(-rc));
		}
	}
	close(dfd);
	return rc;
}

int ex_do_entry(struct extract *x, struct archive *a, struct source *s, struct archive_entry *e)
{
	const char *name = ex_entry_str(archive_entry_pathname(e), archive_entry_pathname_utf8(e));
	char path[PATH_BUF], parent[PATH_BUF];
	const char *rule;
	if (name == NULL)
		return ex_refuse(x, -EPERM, "?", "the entry's name cannot be read");
	if (++x->st.entries > x->lim.max_entries)
		return ex_refuse(x, -EFBIG, name, "more than %llu entries (entry count cap)",
		                 (unsigned long long)x->lim.max_entries);
	if (extract_clean_path(name, path, sizeof(path), &rule) < 0)
		return ex_refuse(x, -EPERM, name, "%s", rule);
	mode_t mode = archive_entry_mode(e);
	char tmp[PATH_BUF];
	memcpy(tmp, path, strlen(path) + 1);
	const char *base = ex_split_base(tmp, parent, sizeof(parent));
	const char *hl = ex_entry_str(archive_entry_hardlink(e), archive_entry_hardlink_utf8(e));
	unsigned type = archive_entry_filetype(e);

	if (strncmp(base, ".wh.", 4) == 0)
		return do_whiteout(x, path, parent, base);
	if (mode & (S_ISUID | S_ISGID))
		return ex_refuse(x, -EPERM, path, "setuid/setgid bit set (mode %04o)",
		                 (unsigned)(mode & 07777));
	if (path[0] == '\0' && (hl != NULL || type != AE_IFDIR))
		return ex_refuse(x, -EPERM, name, "the root can only be a directory");
	if (hl != NULL)
		return do_hardlink(x, hl, path, parent, base);
	switch (type) {
	case AE_IFREG:
		return do_file(x, a, s, e, path, parent, base, mode);
	case AE_IFDIR:
		return do_dir(x, e, path, parent, base, mode);
	case AE_IFLNK:
		return do_symlink(x, e, path, parent, base);
	case AE_IFCHR:
	case AE_IFBLK:
		return ex_refuse(x, -EPERM, path, "device nodes are not allowed");
	case AE_IFIFO:
		return ex_refuse(x, -EPERM, path, "FIFOs are not allowed");
	case AE_IFSOCK:
		return ex_refuse(x, -EPERM, path, "sockets are not allowed");
	default:
		return ex_refuse(x, -EPERM, path, "unsupported entry type (mode %06o)",
		                 (unsigned)mode);
	}
}
