/* The content store (see store.h for the layout and the guarantees).
 *
 * Durability: before an entry is renamed into sha256/, the whole temp tree
 * is flushed with syncfs(2) on the store's filesystem. One syncfs writes the
 * tree's files and directories together; an fsync per file would cost a
 * journal commit each (tens of seconds for a 20,000-file cache on ext4). The
 * metadata file and the directories that gain or lose names are fsync'd. */
#include "store.h"

#include "fstree.h"
#include "fsutil.h"
#include "log.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define META_MAX 4096

struct store {
	char *root;
	int rootfd, shafd, metafd, lockfd, tmpfd;
};

struct store_txn {
	struct store *s;
	char digest[STORE_DIGEST_MAX];
	const char *hex; /* points into digest */
	int lock;
	char tmpname[128];
	int tmpfd;
	struct extract *x;
};

bool store_digest_valid(const char *d)
{
	if (d == NULL || strncmp(d, "sha256:", 7) != 0)
		return false;
	const char *h = d + 7;
	for (int i = 0; i < 64; i++)
		if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f')))
			return false;
	return h[64] == '\0';
}

static bool hex64(const char *h, size_t n)
{
	if (n != 64)
		return false;
	char d[72];
	snprintf(d, sizeof(d), "sha256:%.64s", h);
	return store_digest_valid(d);
}

const char *store_root(const struct store *s)
{
	return s->root;
}

static int open_sub(int rootfd, const char *name, mode_t mode)
{
	if (mkdirat(rootfd, name, mode) < 0 && errno != EEXIST)
		return -errno;
	int fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* Exclusive flock on locks/sha256-<hex>.lock. The lock file may be unlinked
 * by a removal while we wait, so after locking check that the name still
 * points at the file we hold. Returns the fd (the lock) or -errno. */
static int lock_digest(struct store *s, const char *hex, bool nowait)
{
	char name[96];
	snprintf(name, sizeof(name), "sha256-%s.lock", hex);
	for (;;) {
		int fd = openat(s->lockfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0)
			return -errno;
		int r;
		do
			r = flock(fd, LOCK_EX | (nowait ? LOCK_NB : 0));
		while (r < 0 && errno == EINTR);
		if (r < 0) {
			int e = errno;
			close(fd);
			return e == EWOULDBLOCK ? -EWOULDBLOCK : -e;
		}
		struct stat a, b;
		if (fstat(fd, &a) == 0 && fstatat(s->lockfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
		    a.st_ino == b.st_ino && a.st_dev == b.st_dev)
			return fd;
		close(fd); /* lost a race with a removal: lock the new file */
	}
}

static void unlock_digest(struct store *s, const char *hex, int fd, bool unlink_it)
{
	if (fd < 0)
		return;
	if (unlink_it) {
		char name[96];
		snprintf(name, sizeof(name), "sha256-%s.lock", hex);
		(void)unlinkat(s->lockfd, name, 0);
	}
	close(fd);
}

static int rand_suffix(char *buf, size_t len)
{
	unsigned char r[8];
	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return -EIO;
	snprintf(buf, len, "%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5],
	         r[6], r[7]);
	return 0;
}

static bool tree_exists(struct store *s, const char *hex)
{
	struct stat st;
	return fstatat(s->shafd, hex, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

static void meta_name(char *buf, size_t len, const char *hex)
{
	snprintf(buf, len, "sha256-%s.json", hex);
}

static bool meta_exists(struct store *s, const char *hex)
{
	char name[96];
	struct stat st;
	meta_name(name, sizeof(name), hex);
	return fstatat(s->metafd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/* Move sha256/<hex> into tmp/ under a trash name, then delete it. Caller
 * holds the digest's lock. */
static int trash_tree(struct store *s, const char *hex)
{
	char trash[160], rnd[24];
	int rc = rand_suffix(rnd, sizeof(rnd));
	if (rc < 0)
		return rc;
	snprintf(trash, sizeof(trash), "trash-sha256-%s.%s", hex, rnd);
	if (renameat(s->shafd, hex, s->tmpfd, trash) < 0)
		return errno == ENOENT ? 0 : -errno;
	(void)fsync(s->shafd);
	return fstree_remove(s->tmpfd, trash);
}

/* The digest hex a tmp/ name belongs to ("sha256-<hex>.<rnd>" or
 * "trash-sha256-<hex>.<rnd>"), or NULL. */
static const char *tmp_owner(const char *name)
{
	if (strncmp(name, "trash-", 6) == 0)
		name += 6;
	if (strncmp(name, "sha256-", 7) != 0)
		return NULL;
	const char *h = name + 7;
	const char *dot = strchr(h, '.');
	return dot && hex64(h, (size_t)(dot - h)) ? h : NULL;
}

static void cleanup(struct store *s)
{
	DIR *d;
	struct dirent *de;
	/* Temp and trash dirs whose digest nobody holds: a crash left them. */
	if (fstree_opendir(s->tmpfd, &d) == 0) {
		while ((de = readdir(d)) != NULL) {
			if (fstree_dot(de->d_name))
				continue;
			const char *h = tmp_owner(de->d_name);
			char hex[65] = "";
			if (h)
				snprintf(hex, sizeof(hex), "%.64s", h);
			int lk = h ? lock_digest(s, hex, true) : -1;
			if (h && lk < 0)
				continue; /* in progress elsewhere */
			int rc = fstree_remove(s->tmpfd, de->d_name);
			if (rc < 0)
				log_warn("store: cannot remove leftover", "path", de->d_name,
				         "error", strerror(-rc));
			else
				log_info("store: removed leftover from an interrupted pull", "path",
				         de->d_name);
			unlock_digest(s, hex, lk, false);
		}
		closedir(d);
	}
	/* Metadata without a tree (crash between writing it and the rename, or
	 * during a removal) and stray metadata temp files. */
	if (fstree_opendir(s->metafd, &d) == 0) {
		while ((de = readdir(d)) != NULL) {
			const char *n = de->d_name;
			if (fstree_dot(n) || strncmp(n, "sha256-", 7) != 0 || strlen(n) < 7 + 64 ||
			    !hex64(n + 7, 64))
				continue;
			char hex[65];
			snprintf(hex, sizeof(hex), "%.64s", n + 7);
			int lk = lock_digest(s, hex, true);
			if (lk < 0)
				continue;
			bool stray = strcmp(n + 7 + 64, ".json") != 0 || !tree_exists(s, hex);
			if (stray && unlinkat(s->metafd, n, 0) == 0)
				log_info("store: removed metadata without a tree", "file", n);
			unlock_digest(s, hex, lk, false);
		}
		closedir(d);
	}
	/* Trees without metadata were never committed by this code: drop them. */
	if (fstree_opendir(s->shafd, &d) == 0) {
		while ((de = readdir(d)) != NULL) {
			if (fstree_dot(de->d_name) || !hex64(de->d_name, strlen(de->d_name)))
				continue;
			int lk = lock_digest(s, de->d_name, true);
			if (lk < 0)
				continue;
			if (!meta_exists(s, de->d_name) && trash_tree(s, de->d_name) == 0)
				log_warn("store: removed an entry without metadata", "digest",
				         de->d_name);
			unlock_digest(s, de->d_name, lk, false);
		}
		closedir(d);
	}
}

void store_close(struct store *s)
{
	if (s == NULL)
		return;
	int fds[] = {s->tmpfd, s->lockfd, s->metafd, s->shafd, s->rootfd};
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(s->root);
	free(s);
}

int store_open(const char *root, struct store **out)
{
	if (root == NULL)
		root = STORE_DEFAULT_ROOT;
	if (root[0] == '\0')
		return -EINVAL;
	struct store *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return -ENOMEM;
	s->rootfd = s->shafd = s->metafd = s->lockfd = s->tmpfd = -1;
	int rc = -ENOMEM;
	if ((s->root = strdup(root)) == NULL)
		goto fail;
	if ((rc = fsutil_mkdirs(root, 0755)) < 0)
		goto fail;
	s->rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->rootfd < 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = s->shafd = open_sub(s->rootfd, "sha256", 0755)) < 0 ||
	    (rc = s->metafd = open_sub(s->rootfd, "meta", 0755)) < 0 ||
	    (rc = s->lockfd = open_sub(s->rootfd, "locks", 0700)) < 0 ||
	    (rc = s->tmpfd = open_sub(s->rootfd, "tmp", 0700)) < 0)
		goto fail;
	cleanup(s);
	*out = s;
	return 0;
fail:
	store_close(s);
	return rc;
}

int store_entry_path(const struct store *s, const char *digest, char *buf, size_t len)
{
	if (!store_digest_valid(digest))
		return -EINVAL;
	if ((size_t)snprintf(buf, len, "%s/sha256/%s", s->root, digest + 7) >= len)
		return -ENAMETOOLONG;
	return 0;
}

static int read_meta(struct store *s, const char *hex, struct store_entry_info *out)
{
	char name[96], buf[META_MAX + 1];
	meta_name(name, sizeof(name), hex);
	int fd = openat(s->metafd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : -EIO;
	struct stat st;
	ssize_t n = fstat(fd, &st) == 0 ? read(fd, buf, META_MAX + 1) : -1;
	close(fd);
	if (n <= 0 || n > META_MAX)
		return -EIO;
	cJSON *j = cJSON_ParseWithLength(buf, (size_t)n);
	if (j == NULL)
		return -EIO;
	struct store_entry_info e = {0};
	snprintf(e.digest, sizeof(e.digest), "sha256:%s", hex);
	const char *keys[] = {"bytes", "files", "dirs", "symlinks", "layers", "created"};
	double v[6];
	int rc = 0;
	for (int i = 0; i < 6; i++) {
		cJSON *it = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
		if (!cJSON_IsNumber(it) || it->valuedouble < 0) {
			rc = -EIO;
			break;
		}
		v[i] = it->valuedouble;
	}
	cJSON *dg = cJSON_GetObjectItemCaseSensitive(j, "digest");
	if (rc == 0 && (!cJSON_IsString(dg) || strcmp(dg->valuestring, e.digest) != 0))
		rc = -EIO;
	cJSON_Delete(j);
	if (rc < 0)
		return rc;
	e.bytes = (uint64_t)v[0];
	e.files = (uint64_t)v[1];
	e.dirs = (uint64_t)v[2];
	e.symlinks = (uint64_t)v[3];
	e.layers = (uint64_t)v[4];
	e.created = (int64_t)v[5];
	e.last_used =
	    (int64_t)st.st_mtim.tv_sec > e.created ? (int64_t)st.st_mtim.tv_sec : e.created;
	if (out)
		*out = e;
	return 0;
}

int store_lookup(struct store *s, const char *digest, struct store_entry_info *out)
{
	if (!store_digest_valid(digest))
		return -EINVAL;
	const char *hex = digest + 7;
	if (!tree_exists(s, hex))
		return -ENOENT;
	struct store_entry_info e;
	int rc = read_meta(s, hex, &e);
	if (rc < 0)
		return rc;
	if (out)
		*out = e;
	return 0;
}

int store_touch(struct store *s, const char *digest)
{
	char name[96];
	if (!store_digest_valid(digest))
		return -EINVAL;
	if (!tree_exists(s, digest + 7))
		return -ENOENT;
	meta_name(name, sizeof(name), digest + 7);
	return utimensat(s->metafd, name, NULL, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

int store_begin(struct store *s, const char *digest, const struct extract_limits *limits,
                unsigned flags, struct store_txn **out)
{
	if (!store_digest_valid(digest))
		return -EINVAL;
	struct store_txn *t = calloc(1, sizeof(*t));
	if (t == NULL)
		return -ENOMEM;
	t->s = s;
	t->tmpfd = -1;
	snprintf(t->digest, sizeof(t->digest), "%s", digest);
	t->hex = t->digest + 7;
	int rc = t->lock = lock_digest(s, t->hex, flags & STORE_NOWAIT);
	if (rc < 0)
		goto fail;
	if (tree_exists(s, t->hex)) {
		if (meta_exists(s, t->hex)) {
			rc = -EEXIST;
			goto fail;
		}
		if ((rc = trash_tree(s, t->hex)) < 0)
			goto fail;
	}
	char rnd[24];
	if ((rc = rand_suffix(rnd, sizeof(rnd))) < 0)
		goto fail;
	snprintf(t->tmpname, sizeof(t->tmpname), "sha256-%s.%s", t->hex, rnd);
	if (mkdirat(s->tmpfd, t->tmpname, 0755) < 0) {
		rc = -errno;
		goto fail;
	}
	t->tmpfd = openat(s->tmpfd, t->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (t->tmpfd < 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = extract_new(t->tmpfd, limits, &t->x)) < 0)
		goto fail;
	*out = t;
	return 0;
fail:
	store_abort(t);
	return rc;
}

struct extract *store_txn_extract(struct store_txn *t)
{
	return t->x;
}

void store_abort(struct store_txn *t)
{
	if (t == NULL)
		return;
	extract_free(t->x);
	if (t->tmpfd >= 0)
		close(t->tmpfd);
	if (t->tmpname[0]) {
		int rc = fstree_remove(t->s->tmpfd, t->tmpname);
		if (rc < 0)
			log_warn("store: cannot remove temp dir", "path", t->tmpname, "error",
			         strerror(-rc));
	}
	unlock_digest(t->s, t->hex, t->lock, false);
	free(t);
}

static int write_meta(struct store *s, const struct store_entry_info *e)
{
	char name[96], tmp[112], buf[META_MAX];
	meta_name(name, sizeof(name), e->digest + 7);
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	int n = snprintf(buf, sizeof(buf),
	                 "{\"digest\":\"%s\",\"bytes\":%llu,\"files\":%llu,\"dirs\":%llu,"
	                 "\"symlinks\":%llu,\"layers\":%llu,\"created\":%lld}\n",
	                 e->digest, (unsigned long long)e->bytes, (unsigned long long)e->files,
	                 (unsigned long long)e->dirs, (unsigned long long)e->symlinks,
	                 (unsigned long long)e->layers, (long long)e->created);
	int fd =
	    openat(s->metafd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	int rc = 0;
	/* the file's modification time is the entry's last use (store_touch) */
	const struct timespec ts[2] = {{.tv_sec = e->created}, {.tv_sec = e->created}};
	if (write(fd, buf, (size_t)n) != n)
		rc = errno ? -errno : -EIO;
	if (rc == 0 && futimens(fd, ts) < 0)
		rc = -errno;
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(s->metafd, tmp, s->metafd, name) < 0)
		rc = -errno;
	if (rc == 0 && fsync(s->metafd) < 0)
		rc = -errno;
	if (rc < 0)
		(void)unlinkat(s->metafd, tmp, 0);
	return rc;
}

int store_commit(struct store_txn *t, struct store_entry_info *out, char *errbuf, size_t errlen)
{
	struct store *s = t->s;
	struct store_entry_info e = {0};
	struct fstree_usage u;
	struct extract_stats st;
	const char *what = NULL;
	int rc = extract_finish(t->x);
	if (rc < 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s", extract_error(t->x));
		goto fail;
	}
	extract_get_stats(t->x, &st);
	if ((rc = fstree_walk(t->tmpfd, 0, &u)) < 0) {
		what = "measuring the extracted tree";
		goto fail;
	}
	if (syncfs(t->tmpfd) < 0 || fsync(t->tmpfd) < 0) {
		rc = -errno;
		what = "syncing the extracted tree";
		goto fail;
	}
	snprintf(e.digest, sizeof(e.digest), "%s", t->digest);
	e.bytes = u.bytes;
	e.files = u.files;
	e.dirs = u.dirs;
	e.symlinks = u.symlinks;
	e.layers = st.layers;
	e.created = e.last_used = (int64_t)time(NULL);
	if ((rc = write_meta(s, &e)) < 0) {
		what = "writing the entry's metadata";
		goto fail;
	}
	if (renameat(s->tmpfd, t->tmpname, s->shafd, t->hex) < 0) {
		rc = -errno;
		char name[96];
		meta_name(name, sizeof(name), t->hex);
		(void)unlinkat(s->metafd, name, 0);
		what = "renaming the tree into place";
		goto fail;
	}
	t->tmpname[0] = '\0';
	(void)fsync(s->shafd);
	(void)fsync(s->tmpfd);
	store_abort(t); /* frees t and releases the lock; nothing left to remove */
	if (out)
		*out = e;
	return 0;
fail:
	if (what && errbuf)
		snprintf(errbuf, errlen, "%s: %s", what, strerror(-rc));
	store_abort(t);
	return rc;
}

/* Valid digests of sha256/, collected before any callback runs. */
static int list_digests(struct store *s, char (**out)[STORE_DIGEST_MAX], size_t *n_out)
{
	DIR *d;
	int rc = fstree_opendir(s->shafd, &d);
	if (rc < 0)
		return rc;
	char(*v)[STORE_DIGEST_MAX] = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (!hex64(de->d_name, strlen(de->d_name)))
			continue;
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			void *nv = realloc(v, ncap * sizeof(*v));
			if (nv == NULL) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
			cap = ncap;
		}
		snprintf(v[n++], STORE_DIGEST_MAX, "sha256:%s", de->d_name);
	}
	closedir(d);
	if (rc < 0) {
		free(v);
		return rc;
	}
	*out = v;
	*n_out = n;
	return 0;
}

int store_each(struct store *s, store_each_fn fn, void *ctx)
{
	char(*v)[STORE_DIGEST_MAX] = NULL;
	size_t n = 0;
	int rc = list_digests(s, &v, &n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct store_entry_info e;
		if (store_lookup(s, v[i], &e) == 0)
			rc = fn(ctx, &e);
	}
	free(v);
	return rc;
}

int store_remove(struct store *s, const char *digest)
{
	if (!store_digest_valid(digest))
		return -EINVAL;
	const char *hex = digest + 7;
	int lk = lock_digest(s, hex, true);
	if (lk == -EWOULDBLOCK)
		return -EBUSY;
	if (lk < 0)
		return lk;
	int rc = 0;
	if (!tree_exists(s, hex)) {
		rc = -ENOENT;
		goto out;
	}
	char name[96], trash[160], rnd[24];
	if ((rc = rand_suffix(rnd, sizeof(rnd))) < 0)
		goto out;
	snprintf(trash, sizeof(trash), "trash-sha256-%s.%s", hex, rnd);
	if (renameat(s->shafd, hex, s->tmpfd, trash) < 0) {
		rc = -errno;
		goto out;
	}
	(void)fsync(s->shafd);
	meta_name(name, sizeof(name), hex);
	if (unlinkat(s->metafd, name, 0) < 0 && errno != ENOENT) {
		rc = -errno;
		goto out;
	}
	(void)fsync(s->metafd);
	rc = fstree_remove(s->tmpfd, trash);
out:
	unlock_digest(s, hex, lk, rc == 0);
	return rc;
}

int store_gc(struct store *s, store_keep_fn keep, void *ctx, int64_t min_age_s,
             struct store_gc_stats *out)
{
	char(*v)[STORE_DIGEST_MAX] = NULL;
	size_t n = 0;
	int rc = list_digests(s, &v, &n);
	if (rc < 0)
		return rc;
	struct store_gc_stats g = {0};
	int64_t now = (int64_t)time(NULL);
	for (size_t i = 0; i < n; i++) {
		struct store_entry_info e = {0};
		int r = store_lookup(s, v[i], &e);
		if (r == -ENOENT)
			continue;
		if (r == 0 && e.created + min_age_s > now) {
			g.kept++;
			continue;
		}
		if (keep && keep(ctx, v[i])) {
			g.kept++;
			continue;
		}
		r = store_remove(s, v[i]);
		if (r == 0) {
			g.removed++;
			g.bytes_removed += e.bytes;
		} else if (r == -EBUSY) {
			g.busy++;
		} else if (r != -ENOENT) {
			g.failed++;
			log_warn("store: gc could not remove entry", "digest", v[i], "error",
			         strerror(-r));
		}
	}
	free(v);
	if (out)
		*out = g;
	return 0;
}
