/* Safe streaming layer extraction (see extract.h for the rules).
 *
 * Pipeline per layer: caller's read callback -> decoder here (isa-l inflate
 * for gzip, libzstd, or pass-through) -> libarchive's tar parser reading the
 * uncompressed stream through archive_read_open() -> entries written with
 * *at() calls beneath the destination dirfd. A compressed layer is read and
 * decoded on a thread of its own (struct ring), so inflating overlaps the
 * file writes.
 *
 * Decoding here rather than in libarchive gives a faster inflate, exact
 * compressed/uncompressed counters for the ratio cap, and control over the
 * end of the tar stream: when the real data ends, the source appends zeros
 * (padding to a 512-byte record plus two end-of-archive blocks), so a layer
 * whose writer left them out still parses. Such padding must never stand in
 * for entry data, so each entry's data end (its data offset, from
 * archive_filter_bytes() which counts consumed bytes, plus its size) is
 * checked against the real end, and after a padded end no non-zero byte may
 * follow the last entry (that would be a header cut short). */
#include "extract_impl.h"

#include "fstree.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- small containers ---- */

/* Set of paths (created in the current layer): each key, a copy of the
 * path, is also its value. */
bool ex_pathset_has(const struct strmap *ps, const char *p)
{
	return strmap_get(ps, p) != NULL;
}

/* 0 when added, 1 when it was there, or -ENOMEM. */
int ex_pathset_add(struct strmap *ps, const char *p)
{
	if (ex_pathset_has(ps, p))
		return 1;
	char *dup = strdup(p);
	if (dup == NULL)
		return -ENOMEM;
	int rc = strmap_put(ps, dup, dup);
	if (rc != 0)
		free(dup);
	return rc;
}

static void pathset_clear(struct strmap *ps)
{
	size_t pos = 0;
	void *v;
	while (strmap_next(ps, &pos, NULL, &v))
		free(v);
	strmap_clear(ps);
}

/* ---- the session ---- */

int ex_fail(struct extract *x, int rc, const char *fmt, ...)
{
	if (!x->dead) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(x->err, sizeof(x->err), fmt, ap);
		va_end(ap);
	}
	x->dead = true;
	return rc;
}

/* Entry names go into messages and logs: bound them and make control bytes
 * visible instead of letting a name forge log lines. */
const char *ex_shown(const char *name, char *buf, size_t len)
{
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)name; *p && o + 5 < len; p++) {
		if (*p < 0x20 || *p == 0x7f || *p == '\'' || *p == '\\')
			o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
		else
			buf[o++] = (char)*p;
	}
	buf[o] = '\0';
	return buf;
}

int ex_refuse(struct extract *x, int rc, const char *entry, const char *fmt, ...)
{
	char name[300], rule[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rule, sizeof(rule), fmt, ap);
	va_end(ap);
	return ex_fail(x, rc, "refused entry '%s': %s", ex_shown(entry, name, sizeof(name)), rule);
}

/* The umask from /proc (reading it with umask(2) would change it for every
 * thread for a moment). Knowing it saves an fchmod per file whose mode the
 * create call already gets right. */
static int read_umask(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (f == NULL)
		return -1;
	char line[256];
	int m = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned v;
		if (sscanf(line, "Umask: %o", &v) == 1) {
			m = (int)(v & 0777);
			break;
		}
	}
	fclose(f);
	return m;
}

void extract_limits_default(struct extract_limits *out)
{
	out->max_total_bytes = 64ull << 30;
	out->max_entries = 1000000;
	out->max_entry_bytes = 16ull << 30;
	out->max_ratio = 200;
	out->ratio_grace = 32ull << 20;
}

int extract_new(int dirfd, const struct extract_limits *limits, struct extract **out)
{
	if (dirfd < 0 || out == NULL)
		return -EINVAL;
	struct extract *x = calloc(1, sizeof(*x));
	if (x == NULL)
		return -ENOMEM;
	x->root = dirfd;
	if (limits)
		x->lim = *limits;
	else
		extract_limits_default(&x->lim);
	x->pfd = -1;
	x->umask = read_umask();
	*out = x;
	return 0;
}

void ex_drop_parent(struct extract *x)
{
	if (x->pfd >= 0)
		close(x->pfd);
	x->pfd = -1;
	x->ppath[0] = '\0';
}

void extract_free(struct extract *x)
{
	if (x == NULL)
		return;
	ex_drop_parent(x);
	for (size_t i = 0; i < x->ndirs; i++)
		free(x->dirs[i].path);
	free(x->dirs);
	for (size_t i = 0; i < x->nlinks; i++)
		free(x->links[i]);
	free(x->links);
	pathset_clear(&x->created);
	free(x);
}

void extract_get_stats(const struct extract *x, struct extract_stats *out)
{
	*out = x->st;
}

const char *extract_error(const struct extract *x)
{
	return x->err;
}

/* ---- path rules ---- */

int extract_clean_path(const char *name, char *out, size_t outlen, const char **rule)
{
	if (name == NULL || name[0] == '\0') {
		*rule = "empty name";
		return -EPERM;
	}
	if (name[0] == '/') {
		/* "/" alone names the layer's root (umoci writes it); any other
		 * absolute name would land outside the tree. */
		if (name[strspn(name, "/.")] != '\0' || strstr(name, "..") != NULL) {
			*rule = "absolute path";
			return -EPERM;
		}
		out[0] = '\0';
		return outlen ? 0 : -EPERM;
	}
	size_t o = 0;
	const char *p = name;
	while (*p) {
		size_t n = strcspn(p, "/");
		if (n == 0 || (n == 1 && p[0] == '.')) {
			p += n;
			while (*p == '/')
				p++;
			continue;
		}
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			*rule = "path escapes the tree ('..' component)";
			return -EPERM;
		}
		if (n > 255) {
			*rule = "a name component is longer than 255 bytes";
			return -EPERM;
		}
		if (o + (o ? 1 : 0) + n + 1 > outlen) {
			*rule = "path is too long";
			return -EPERM;
		}
		if (o)
			out[o++] = '/';
		memcpy(out + o, p, n);
		o += n;
		p += n;
		while (*p == '/')
			p++;
	}
	out[o] = '\0';
	return 0;
}

static size_t path_depth(const char *dir)
{
	if (dir[0] == '\0')
		return 0;
	size_t d = 1;
	for (const char *p = dir; *p; p++)
		d += *p == '/';
	return d;
}

bool extract_symlink_inside(const char *link_path, const char *target)
{
	if (target == NULL || target[0] == '\0' || target[0] == '/')
		return false;
	const char *slash = strrchr(link_path, '/');
	long depth = slash ? (long)path_depth(link_path) - 1 : 0;
	const char *p = target;
	while (*p) {
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			if (--depth < 0)
				return false;
		} else if (n > 0 && !(n == 1 && p[0] == '.')) {
			depth++;
		}
		p += n;
		while (*p == '/')
			p++;
	}
	return true;
}

/* Splits a clean path into parent ("" for the root) and base, in place. */
const char *ex_split_base(char *path, char *parent, size_t plen)
{
	char *slash = strrchr(path, '/');
	if (slash == NULL) {
		parent[0] = '\0';
		return path;
	}
	size_t n = (size_t)(slash - path);
	if (n >= plen)
		n = plen - 1;
	memcpy(parent, path, n);
	parent[n] = '\0';
	return slash + 1;
}

int extract_layer(struct extract *x, extract_read_fn fn, void *ctx)
{
	if (x->dead)
		return -ECANCELED;
	if (x->finished || fn == NULL)
		return -EINVAL;
	struct source s;
	struct archive *a = NULL;
	char last[PATH_BUF] = "";
	int rc = ex_src_init(&s, x, fn, ctx);
	if (rc < 0) {
		rc = s.err ? ex_fail(x, rc, "%s", s.errmsg) : ex_fail(x, rc, "%s", strerror(-rc));
		goto out;
	}
	if (s.comp != COMP_NONE && (rc = ex_ring_start(&s)) < 0) {
		rc = ex_fail(x, rc, "%s", s.errmsg);
		goto out;
	}
	x->below = x->st.layers > 0;
	x->last_end = 0;
	a = archive_read_new();
	if (a == NULL || archive_read_support_format_tar(a) != ARCHIVE_OK) {
		rc = ex_fail(x, -ENOMEM, "out of memory");
		goto out;
	}
	if (archive_read_open(a, &s, NULL, ex_src_read, NULL) != ARCHIVE_OK) {
		rc = ex_archive_failure(x, a, &s, NULL);
		goto out;
	}
	for (;;) {
		struct archive_entry *e;
		int r = archive_read_next_header(a, &e);
		if (r == ARCHIVE_EOF)
			break;
		if (r < ARCHIVE_WARN) {
			rc = ex_archive_failure(x, a, &s, NULL);
			goto out;
		}
		uint64_t data_at = (uint64_t)archive_filter_bytes(a, 0);
		if (s.eof && data_at > s.tar) {
			char sn[300];
			rc = ex_fail(x, -EBADMSG,
			             "the layer ends inside a tar header (after entry '%s')",
			             last[0] ? ex_shown(last, sn, sizeof(sn)) : "(none)");
			goto out;
		}
		const char *name =
		    ex_entry_str(archive_entry_pathname(e), archive_entry_pathname_utf8(e));
		snprintf(last, sizeof(last), "%s", name ? name : "?");
		if ((rc = ex_do_entry(x, a, &s, e)) < 0)
			goto out;
		int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
		x->last_end = data_at + (uint64_t)(size > 0 ? size : 0);
		if (s.eof && x->last_end > s.tar) {
			char sn[300];
			rc = ex_fail(x, -EBADMSG,
			             "entry '%s' is cut short: the layer ends %llu bytes into its "
			             "%lld bytes of data",
			             ex_shown(last, sn, sizeof(sn)),
			             (unsigned long long)(s.tar - data_at), (long long)size);
			goto out;
		}
	}
	/* Zero padding stood in for the end-of-archive blocks: then nothing but
	 * zeros may follow the last entry's data in the real stream. */
	if (s.eof && (uint64_t)archive_filter_bytes(a, 0) > s.tar && s.last_nonzero > x->last_end) {
		char sn[300];
		rc = ex_fail(x, -EBADMSG, "the layer ends inside a tar header (after entry '%s')",
		             last[0] ? ex_shown(last, sn, sizeof(sn)) : "(none)");
		goto out;
	}
	if ((rc = ex_src_drain(&s)) < 0) {
		rc = ex_fail(x, rc, "%s", s.errmsg);
		goto out;
	}
	x->st.layers++;
out:
	if (a)
		archive_read_free(a);
	ex_src_free(&s); /* first: the decoder thread stops */
	x->st.compressed_bytes += s.compressed;
	x->st.tar_bytes += s.tar;
	pathset_clear(&x->created);
	ex_drop_parent(x);
	return rc;
}

struct fd_src {
	int fd;
};

static ssize_t fd_read(void *ctx, void *buf, size_t len)
{
	struct fd_src *f = ctx;
	ssize_t r = read(f->fd, buf, len);
	return r < 0 ? -errno : r;
}

int extract_layer_fd(struct extract *x, int fd)
{
	struct fd_src f = {fd};
	return extract_layer(x, fd_read, &f);
}

int extract_layer_file(struct extract *x, const char *path)
{
	if (x->dead)
		return -ECANCELED;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ex_fail(x, -errno, "opening layer file '%s': %s", path, strerror(errno));
	int rc = extract_layer_fd(x, fd);
	close(fd);
	return rc;
}

/* ---- finishing ---- */

/* Resolve a symlink's target inside the finished tree the way the kernel
 * would (following other links, with ".." applied to where they lead).
 * 1 if it stays inside (or leads nowhere), 0 if it leaves the tree. */
static int resolves_inside(int root, const char *link_dir, const char *target)
{
	char cur[PATH_BUF], rest[2 * PATH_BUF], cand[PATH_BUF], lt[PATH_BUF];
	size_t curlen = (size_t)snprintf(cur, sizeof(cur), "%s", link_dir);
	if ((size_t)snprintf(rest, sizeof(rest), "%s", target) >= sizeof(rest))
		return 0;
	if (rest[0] == '/')
		return 0;
	bool lexical = false;
	int hops = 0;
	size_t pos = 0;
	while (rest[pos]) {
		while (rest[pos] == '/')
			pos++;
		size_t n = strcspn(rest + pos, "/");
		if (n == 0)
			break;
		const char *comp = rest + pos;
		pos += n;
		if (n == 1 && comp[0] == '.')
			continue;
		if (n == 2 && comp[0] == '.' && comp[1] == '.') {
			if (curlen == 0)
				return 0;
			char *sl = strrchr(cur, '/');
			curlen = sl ? (size_t)(sl - cur) : 0;
			cur[curlen] = '\0';
			continue;
		}
		if (curlen + 1 + n + 1 > sizeof(cur))
			return 0;
		memcpy(cand, cur, curlen);
		size_t cl = curlen;
		if (cl)
			cand[cl++] = '/';
		memcpy(cand + cl, comp, n);
		cand[cl + n] = '\0';
		struct stat st;
		if (!lexical && fstatat(root, cand, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISLNK(st.st_mode)) {
			if (++hops > MAX_LINK_HOPS)
				return 1; /* the kernel gives up (ELOOP): leads nowhere */
			ssize_t ln = readlinkat(root, cand, lt, sizeof(lt) - 1);
			if (ln <= 0)
				return 1;
			lt[ln] = '\0';
			if (lt[0] == '/')
				return 0;
			char tmp[2 * PATH_BUF];
			if ((size_t)snprintf(tmp, sizeof(tmp), "%s/%s", lt, rest + pos) >=
			    sizeof(tmp))
				return 0;
			memcpy(rest, tmp, strlen(tmp) + 1);
			pos = 0;
			continue;
		}
		if (!lexical &&
		    (fstatat(root, cand, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode)))
			lexical = true; /* missing or not a directory: the rest is only text */
		memcpy(cur, cand, cl + n + 1);
		curlen = cl + n;
	}
	return 1;
}

static int cmp_depth(const void *pa, const void *pb)
{
	const struct dirattr *a = pa, *b = pb;
	size_t da = path_depth(a->path), db = path_depth(b->path);
	if (da != db)
		return da > db ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

int extract_finish(struct extract *x)
{
	if (x->dead)
		return -ECANCELED;
	if (x->finished)
		return 0;
	for (size_t i = 0; i < x->nlinks; i++) {
		char parent[PATH_BUF], tmp[PATH_BUF], target[PATH_BUF], sn[300];
		memcpy(tmp, x->links[i], strlen(x->links[i]) + 1);
		const char *base = ex_split_base(tmp, parent, sizeof(parent));
		int pfd = fstree_open_dir(x->root, parent);
		if (pfd < 0)
			continue; /* removed by a later layer */
		ssize_t n = readlinkat(pfd, base, target, sizeof(target) - 1);
		close(pfd);
		if (n < 0)
			continue;
		target[n] = '\0';
		if (!resolves_inside(x->root, parent, target))
			return ex_refuse(
			    x, -EPERM, x->links[i],
			    "symlink target '%s' resolves outside the tree (through other links)",
			    ex_shown(target, sn, sizeof(sn)));
	}
	if (x->ndirs > 1)
		qsort(x->dirs, x->ndirs, sizeof(*x->dirs), cmp_depth);
	for (size_t i = 0; i < x->ndirs; i++) {
		struct dirattr *d = &x->dirs[i];
		int fd = fstree_open_dir(x->root, d->path);
		if (fd < 0)
			continue; /* removed or replaced by a later entry */
		int rc = 0;
		if (fchmod(fd, d->mode) < 0)
			rc = ex_fail(x, -errno, "setting the mode of '%s': %s", d->path,
			             strerror(errno));
		struct timespec ts[2] = {d->mtime, d->mtime};
		if (rc == 0 && d->has_mtime && futimens(fd, ts) < 0)
			rc = ex_fail(x, -errno, "setting the mtime of '%s': %s", d->path,
			             strerror(errno));
		close(fd);
		if (rc < 0)
			return rc;
	}
	x->finished = true;
	return 0;
}

/* ---- push model ---- */

struct extract_push {
	struct extract *x;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned char *buf;
	size_t head, len;
	bool eof, abandoned, done;
	int rc;
};

static ssize_t push_read(void *ctx, void *out, size_t want)
{
	struct extract_push *p = ctx;
	pthread_mutex_lock(&p->mu);
	while (p->len == 0 && !p->eof && !p->abandoned)
		pthread_cond_wait(&p->cv, &p->mu);
	ssize_t r;
	if (p->abandoned) {
		r = -ECANCELED;
	} else if (p->len == 0) {
		r = 0;
	} else {
		size_t n = want < p->len ? want : p->len;
		size_t first = PUSH_BUF - p->head < n ? PUSH_BUF - p->head : n;
		memcpy(out, p->buf + p->head, first);
		memcpy((char *)out + first, p->buf, n - first);
		p->head = (p->head + n) % PUSH_BUF;
		p->len -= n;
		r = (ssize_t)n;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return r;
}

static void *push_thread(void *arg)
{
	struct extract_push *p = arg;
	int rc = extract_layer(p->x, push_read, p);
	pthread_mutex_lock(&p->mu);
	p->rc = rc;
	p->done = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int extract_push_begin(struct extract *x, struct extract_push **out)
{
	if (x->dead)
		return -ECANCELED;
	struct extract_push *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	p->x = x;
	p->buf = malloc(PUSH_BUF);
	if (p->buf == NULL) {
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	int e = pthread_create(&p->th, NULL, push_thread, p);
	if (e != 0) {
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		free(p->buf);
		free(p);
		return -e;
	}
	*out = p;
	return 0;
}

int extract_push_write(struct extract_push *p, const void *buf, size_t len)
{
	const unsigned char *b = buf;
	int rc = 0;
	pthread_mutex_lock(&p->mu);
	while (len > 0) {
		while (p->len == PUSH_BUF && !p->done)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->done) {
			rc = p->rc < 0 ? p->rc : -EPIPE;
			break;
		}
		size_t tail = (p->head + p->len) % PUSH_BUF;
		size_t space = PUSH_BUF - p->len;
		size_t n = len < space ? len : space;
		size_t first = PUSH_BUF - tail < n ? PUSH_BUF - tail : n;
		memcpy(p->buf + tail, b, first);
		memcpy(p->buf, b + first, n - first);
		p->len += n;
		b += n;
		len -= n;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return rc;
}

int extract_push_end(struct extract_push *p, bool eof)
{
	pthread_mutex_lock(&p->mu);
	if (eof)
		p->eof = true;
	else
		p->abandoned = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->th, NULL);
	int rc = p->rc;
	if (!eof && rc == -ECANCELED)
		rc = ex_fail(p->x, -ECANCELED, "the layer stream was abandoned");
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->buf);
	free(p);
	return rc;
}
