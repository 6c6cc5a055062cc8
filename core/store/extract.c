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
#include "extract.h"

#include "fsutil.h"
#include "fstree.h"
#include "strmap.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <isa-l/igzip_lib.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define IN_BUF (256u * 1024)
/* The decoder ring: 1 MiB in all. Inflating is the slower stage, so the
 * ring only has to absorb bursts of small files on the writing side; 4 MiB
 * extracted no faster and cost 3 MiB of RSS. */
#define RING_SLOTS 4
#define SLOT_BUF (256u * 1024)
#define PATH_BUF 4096
#define PUSH_BUF (1024u * 1024)
#define MAX_LINK_HOPS 40

/* ---- small containers ---- */

/* Set of paths (created in the current layer): each key, a copy of the
 * path, is also its value. */
static bool pathset_has(const struct strmap *ps, const char *p)
{
	return strmap_get(ps, p) != NULL;
}

/* 0 when added, 1 when it was there, or -ENOMEM. */
static int pathset_add(struct strmap *ps, const char *p)
{
	if (pathset_has(ps, p))
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

struct dirattr {
	char *path;
	mode_t mode;
	struct timespec mtime;
	bool has_mtime;
	size_t seq;
};

/* ---- the session ---- */

struct extract {
	int root;
	struct extract_limits lim;
	struct extract_stats st;
	bool dead, finished;
	char err[1024];

	struct dirattr *dirs;
	size_t ndirs, capdirs;
	char **links; /* symlinks written, re-checked in extract_finish() */
	size_t nlinks, caplinks;

	struct strmap created; /* this layer's paths, only when a layer lies below */
	bool below;

	char ppath[PATH_BUF]; /* cached parent directory */
	int pfd;
	uint64_t last_end; /* stream offset where the last entry's data ends */
	int umask;         /* the process umask, or -1 if unknown (then always fchmod) */
};

static int fail(struct extract *x, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct extract *x, int rc, const char *fmt, ...)
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
static const char *shown(const char *name, char *buf, size_t len)
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

static int refuse(struct extract *x, int rc, const char *entry, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(struct extract *x, int rc, const char *entry, const char *fmt, ...)
{
	char name[300], rule[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rule, sizeof(rule), fmt, ap);
	va_end(ap);
	return fail(x, rc, "refused entry '%s': %s", shown(entry, name, sizeof(name)), rule);
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

static void drop_parent(struct extract *x)
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
	drop_parent(x);
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
static const char *split_base(char *path, char *parent, size_t plen)
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

/* ---- decoding source ---- */

enum comp { COMP_NONE, COMP_GZIP, COMP_ZSTD };

/* A compressed layer is decoded on a thread of its own, so inflating
 * overlaps the file writes of the thread parsing the tar. The decoder fills
 * free slots in order; the parser holds the oldest filled slot while
 * libarchive reads it (a read callback's buffer stays valid until its next
 * call) and frees it by asking for the next. */
struct ring {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned char *slot[RING_SLOTS];
	size_t len[RING_SLOTS];
	unsigned head, filled; /* the filled slots start at head */
	bool held;             /* the parser holds slot head */
	bool stop;             /* the parser wants no more */
	bool done;             /* the decoder has ended (source err says how) */
};

/* While a ring's decoder runs it alone uses the fields from fn to errmsg;
 * the parser reads them only once ring_take() has reported the end, or
 * after ring_stop(). */
struct source {
	struct extract *x;
	struct ring *ring; /* NULL for a plain tar, read on the parser's thread */
	extract_read_fn fn;
	void *ctx;
	enum comp comp;
	unsigned char *in;
	size_t in_pos, in_len;
	bool in_eof;
	struct inflate_state *gz;
	bool gz_done;
	ZSTD_DStream *zs;
	size_t zs_last;
	uint64_t compressed, tar, tar_cap, last_nonzero;
	bool read_failed; /* err came from the read callback */
	int err;
	char errmsg[256];
	/* the parser's own */
	bool failed;       /* src_read() reported err to libarchive */
	bool eof;          /* real data ended: tar is the real end */
	uint64_t pad_left; /* synthetic zeros still to hand out */
};

static const unsigned char zeros[2048];

static int src_fail(struct source *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int src_fail(struct source *s, int rc, const char *fmt, ...)
{
	if (s->err == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
		va_end(ap);
		s->err = rc;
	}
	return s->err;
}

/* Ensure unread input; 1 if some, 0 at the callback's end, <0 error. */
static int src_fill(struct source *s)
{
	if (s->in_pos < s->in_len)
		return 1;
	if (s->in_eof)
		return 0;
	ssize_t r;
	do
		r = s->fn(s->ctx, s->in, IN_BUF);
	while (r == -EINTR);
	if (r < 0 || (size_t)r > IN_BUF)
		s->read_failed = true;
	if (r < 0)
		return src_fail(s, (int)r, "reading the layer: %s", strerror((int)-r));
	if ((size_t)r > IN_BUF)
		return src_fail(s, -EIO, "reading the layer: read callback overran its buffer");
	if (r == 0) {
		s->in_eof = true;
		return 0;
	}
	s->compressed += (uint64_t)r;
	s->in_pos = 0;
	s->in_len = (size_t)r;
	return 1;
}

static int src_init(struct source *s, struct extract *x, extract_read_fn fn, void *ctx)
{
	memset(s, 0, sizeof(*s));
	s->x = x;
	s->fn = fn;
	s->ctx = ctx;
	s->in = malloc(IN_BUF);
	if (s->in == NULL)
		return -ENOMEM;
	uint64_t overhead =
	    x->lim.max_entries > (1u << 24) ? (1ull << 36) : x->lim.max_entries * 4096;
	s->tar_cap = x->lim.max_total_bytes + overhead;
	if (s->tar_cap < x->lim.max_total_bytes)
		s->tar_cap = UINT64_MAX;

	/* Detect compression from the first bytes (gather at least 4). */
	while (s->in_len < 4 && !s->in_eof) {
		ssize_t r = fn(ctx, s->in + s->in_len, IN_BUF - s->in_len);
		if (r == -EINTR)
			continue;
		if (r < 0)
			return src_fail(s, (int)r, "reading the layer: %s", strerror((int)-r));
		if ((size_t)r > IN_BUF - s->in_len)
			return src_fail(s, -EIO,
			                "reading the layer: read callback overran its buffer");
		if (r == 0)
			s->in_eof = true;
		s->in_len += (size_t)r;
		s->compressed += (uint64_t)r;
	}
	if (s->in_len >= 2 && s->in[0] == 0x1f && s->in[1] == 0x8b) {
		s->comp = COMP_GZIP;
		s->gz = calloc(1, sizeof(*s->gz));
		if (s->gz == NULL)
			return -ENOMEM;
		isal_inflate_init(s->gz);
		s->gz->crc_flag = ISAL_GZIP;
	} else if (s->in_len >= 4 && s->in[0] == 0x28 && s->in[1] == 0xb5 && s->in[2] == 0x2f &&
	           s->in[3] == 0xfd) {
		s->comp = COMP_ZSTD;
		s->zs = ZSTD_createDStream();
		if (s->zs == NULL)
			return -ENOMEM;
		ZSTD_initDStream(s->zs);
		/* libzstd's default window cap (128 MiB) bounds memory. */
	} else if (s->in_len >= 3 && s->in[0] == 'B' && s->in[1] == 'Z' && s->in[2] == 'h') {
		return src_fail(
		    s, -EPROTONOSUPPORT,
		    "the layer is bzip2-compressed; only gzip, zstd and plain tar are supported");
	} else if (s->in_len >= 6 && memcmp(s->in,
	                                    "\xfd"
	                                    "7zXZ",
	                                    5) == 0) {
		return src_fail(
		    s, -EPROTONOSUPPORT,
		    "the layer is xz-compressed; only gzip, zstd and plain tar are supported");
	} else {
		s->comp = COMP_NONE;
	}
	return 0;
}

/* Decode into out (cap bytes); returns bytes produced (> 0), 0 at the real
 * end, <0 (s->err, which stays). */
static ssize_t src_decode(struct source *s, unsigned char *out, size_t cap)
{
	if (s->err)
		return s->err;
	for (;;) {
		int f = src_fill(s);
		if (f < 0)
			return f;
		if (s->comp == COMP_GZIP) {
			if (s->gz_done) {
				if (f == 0)
					return 0;
				if (s->in[s->in_pos] != 0x1f)
					return src_fail(s, -EBADMSG,
					                "unexpected data after the gzip stream");
				isal_inflate_reset(s->gz); /* next gzip member */
				s->gz->crc_flag = ISAL_GZIP;
				s->gz_done = false;
			}
			if (f == 0)
				return src_fail(s, -EBADMSG, "the gzip stream is truncated");
			s->gz->next_in = s->in + s->in_pos;
			s->gz->avail_in = (uint32_t)(s->in_len - s->in_pos);
			s->gz->next_out = out;
			s->gz->avail_out = (uint32_t)cap;
			int r = isal_inflate(s->gz);
			s->in_pos = (size_t)(s->gz->next_in - s->in);
			if (r < 0)
				return src_fail(s, -EBADMSG,
				                "the gzip data is corrupt (isa-l error %d)", r);
			if (s->gz->block_state == ISAL_BLOCK_FINISH)
				s->gz_done = true;
			size_t n = cap - s->gz->avail_out;
			if (n > 0)
				return (ssize_t)n;
		} else { /* COMP_ZSTD */
			if (f == 0) {
				if (s->zs_last != 0)
					return src_fail(s, -EBADMSG,
					                "the zstd stream is truncated");
				return 0;
			}
			ZSTD_inBuffer zin = {s->in, s->in_len, s->in_pos};
			ZSTD_outBuffer zout = {out, cap, 0};
			size_t r = ZSTD_decompressStream(s->zs, &zout, &zin);
			s->in_pos = zin.pos;
			if (ZSTD_isError(r))
				return src_fail(s, -EBADMSG, "the zstd data is corrupt: %s",
				                ZSTD_getErrorName(r));
			s->zs_last = r;
			if (zout.pos > 0)
				return (ssize_t)zout.pos;
		}
	}
}

static void note_nonzero(struct source *s, const unsigned char *b, size_t n)
{
	size_t i = n;
	while (i >= 8) {
		uint64_t w;
		memcpy(&w, b + i - 8, 8);
		if (w != 0)
			break;
		i -= 8;
	}
	while (i > 0 && b[i - 1] == 0)
		i--;
	if (i > 0)
		s->last_nonzero = s->tar + i;
}

/* Count n more bytes of the tar stream in b against the caps; 0 or <0. */
static int src_account(struct source *s, const unsigned char *b, size_t n)
{
	note_nonzero(s, b, n);
	s->tar += (uint64_t)n;
	if (s->tar > s->tar_cap)
		return src_fail(s, -EFBIG, "the layer's tar stream is over %llu bytes",
		                (unsigned long long)s->tar_cap);
	uint64_t c = s->compressed ? s->compressed : 1;
	if (s->tar > s->x->lim.ratio_grace && s->x->lim.max_ratio > 0 &&
	    s->tar / c > s->x->lim.max_ratio)
		return src_fail(s, -EFBIG,
		                "the layer expands more than %u times (%llu bytes from %llu): "
		                "refused as a decompression bomb",
		                s->x->lim.max_ratio, (unsigned long long)s->tar,
		                (unsigned long long)s->compressed);
	return 0;
}

/* The decoder thread: fill each free slot whole, checked, until the end,
 * an error, or the parser's stop. */
static void *ring_decode(void *arg)
{
	struct source *s = arg;
	struct ring *r = s->ring;
	ssize_t n = 1;
	while (n > 0) {
		pthread_mutex_lock(&r->mu);
		while (r->filled == RING_SLOTS && !r->stop)
			pthread_cond_wait(&r->cv, &r->mu);
		bool stop = r->stop;
		unsigned i = (r->head + r->filled) % RING_SLOTS;
		pthread_mutex_unlock(&r->mu);
		if (stop)
			break;
		size_t got = 0;
		while (got < SLOT_BUF && (n = src_decode(s, r->slot[i] + got, SLOT_BUF - got)) > 0)
			got += (size_t)n;
		if (got > 0) /* an error or the end after some output comes next time */
			n = src_account(s, r->slot[i], got) < 0 ? -1 : (ssize_t)got;
		pthread_mutex_lock(&r->mu);
		if (n > 0) {
			r->len[i] = got;
			r->filled++;
		} else {
			r->done = true;
		}
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
	}
	return NULL;
}

static void ring_free(struct ring *r)
{
	for (unsigned i = 0; i < RING_SLOTS; i++)
		free(r->slot[i]);
	free(r);
}

/* Start the decoder thread for a compressed source. */
static int ring_start(struct source *s)
{
	struct ring *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return src_fail(s, -ENOMEM, "out of memory");
	for (unsigned i = 0; i < RING_SLOTS; i++)
		if ((r->slot[i] = malloc(SLOT_BUF)) == NULL) {
			ring_free(r);
			return src_fail(s, -ENOMEM, "out of memory");
		}
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	s->ring = r;
	int e = pthread_create(&r->th, NULL, ring_decode, s);
	if (e != 0) {
		s->ring = NULL;
		pthread_cond_destroy(&r->cv);
		pthread_mutex_destroy(&r->mu);
		ring_free(r);
		return src_fail(s, -e, "cannot start the decoder thread: %s", strerror(e));
	}
	return 0;
}

/* Stop the decoder (it may be waiting for a free slot or inside the read
 * callback) and wait for it. No-op without one. */
static void ring_stop(struct source *s)
{
	struct ring *r = s->ring;
	if (r == NULL)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->th, NULL);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	ring_free(r);
	s->ring = NULL;
}

/* The parser's next decoded slot, freeing the one it held: its length
 * (> 0) with *b, 0 at the real end, or the decoder's error. */
static ssize_t ring_take(struct source *s, const unsigned char **b)
{
	struct ring *r = s->ring;
	pthread_mutex_lock(&r->mu);
	if (r->held) {
		r->head = (r->head + 1) % RING_SLOTS;
		r->filled--;
		r->held = false;
		pthread_cond_broadcast(&r->cv);
	}
	while (r->filled == 0 && !r->done)
		pthread_cond_wait(&r->cv, &r->mu);
	ssize_t n;
	if (r->filled > 0) {
		r->held = true;
		*b = r->slot[r->head];
		n = (ssize_t)r->len[r->head];
	} else {
		n = s->err; /* the decoder is done: no more writes */
	}
	pthread_mutex_unlock(&r->mu);
	return n;
}

/* A plain tar's next bytes, read on the parser's thread. */
static ssize_t src_plain(struct source *s, const unsigned char **b)
{
	int f = src_fill(s);
	if (f <= 0)
		return f;
	size_t n = s->in_len - s->in_pos;
	*b = s->in + s->in_pos;
	s->in_pos = s->in_len;
	int rc = src_account(s, *b, n);
	return rc < 0 ? rc : (ssize_t)n;
}

static la_ssize_t src_read(struct archive *a, void *cd, const void **buf)
{
	struct source *s = cd;
	if (s->failed)
		goto failed;
	if (!s->eof) {
		const unsigned char *b = NULL;
		ssize_t n = s->ring ? ring_take(s, &b) : src_plain(s, &b);
		if (n < 0)
			goto failed;
		if (n > 0) {
			*buf = b;
			return n;
		}
		s->eof = true;
		s->pad_left = (512 - s->tar % 512) % 512 + 1024;
	}
	if (s->pad_left > 0) {
		size_t n = s->pad_left < sizeof(zeros) ? (size_t)s->pad_left : sizeof(zeros);
		s->pad_left -= n;
		*buf = zeros;
		return (la_ssize_t)n;
	}
	return 0;
failed:
	s->failed = true;
	archive_set_error(a, -s->err, "%s", s->errmsg);
	return -1;
}

static void src_free(struct source *s)
{
	ring_stop(s);
	free(s->in);
	free(s->gz);
	if (s->zs)
		ZSTD_freeDStream(s->zs);
}

/* After the tar's end: stop decoding and read the rest of the blob so the
 * caller sees all of it (and can check its digest). What the decoder found
 * past the tar's end is not used, so a decoding error there does not count;
 * a read error does. */
static int src_drain(struct source *s)
{
	ring_stop(s);
	if (!s->read_failed)
		s->err = 0;
	if (s->err)
		return s->err;
	s->in_pos = s->in_len;
	for (;;) {
		int f = src_fill(s);
		if (f <= 0)
			return f;
		s->in_pos = s->in_len;
	}
}

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
		return fail(x, -errno, "opening the destination: %s", strerror(errno));
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
				return fail(x, -e, "creating directory '%s': %s", sofar,
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
				return refuse(x, -EPERM, entry,
				              "path passes through a symlink ('%s')", sofar);
			if (e == ENOTDIR)
				return refuse(x, -EPERM, entry, "'%s' is not a directory", sofar);
			return fail(x, -e, "opening directory '%s': %s", sofar, strerror(e));
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
	drop_parent(x);
	int fd = fstree_open_dir(x->root, parent);
	if (fd == -ENOENT)
		fd = make_parents(x, entry, parent);
	else if (fd == -ELOOP)
		return refuse(x, -EPERM, entry, "path passes through a symlink");
	else if (fd == -ENOTDIR)
		return refuse(x, -EPERM, entry, "a parent of the entry is not a directory");
	else if (fd == -EXDEV)
		return refuse(x, -EPERM, entry, "path escapes the tree");
	else if (fd < 0)
		return fail(x, fd, "opening directory '%s': %s", parent, strerror(-fd));
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
		           : fail(x, -errno, "checking '%s': %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		if (keep_dir)
			return 1;
		int rc = fstree_remove(pfd, base);
		if (rc < 0)
			return fail(x, rc, "replacing directory '%s': %s", path, strerror(-rc));
		return 0;
	}
	if (unlinkat(pfd, base, 0) < 0 && errno != ENOENT)
		return fail(x, -errno, "replacing '%s': %s", path, strerror(errno));
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
		int rc = pathset_add(&x->created, buf);
		if (rc < 0)
			return fail(x, rc, "out of memory");
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

static int archive_failure(struct extract *x, struct archive *a, struct source *s,
                           const char *entry)
{
	char name[300];
	if (s->failed)
		return fail(x, s->err, "%s%s%s%s", entry ? "entry '" : "",
		            entry ? shown(entry, name, sizeof(name)) : "", entry ? "': " : "",
		            s->errmsg);
	const char *m = archive_error_string(a);
	if (entry)
		return fail(x, -EBADMSG, "entry '%s': malformed tar: %s",
		            shown(entry, name, sizeof(name)), m ? m : "unknown error");
	return fail(x, -EBADMSG, "malformed tar: %s", m ? m : "unknown error");
}

static int do_file(struct extract *x, struct archive *a, struct source *s, struct archive_entry *e,
                   const char *path, const char *parent, const char *base, mode_t mode)
{
	int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
	if (size < 0)
		return refuse(x, -EPERM, path, "negative size");
	if (archive_entry_sparse_count(e) > 0)
		return refuse(x, -EPERM, path, "sparse files are not supported");
	if ((uint64_t)size > x->lim.max_entry_bytes)
		return refuse(x, -EFBIG, path, "%lld bytes, over the per-entry cap of %llu",
		              (long long)size, (unsigned long long)x->lim.max_entry_bytes);
	if (x->st.bytes + (uint64_t)size > x->lim.max_total_bytes)
		return refuse(x, -EFBIG, path, "the tree would pass the total cap of %llu bytes",
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
		return fail(x, -errno, "creating '%s': %s", path, strerror(errno));
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
			rc = archive_failure(x, a, s, path);
			goto out;
		}
		if (off < 0 || (uint64_t)off != written || written + len > (uint64_t)size) {
			rc = refuse(x, -EBADMSG, path, "data does not match the header's size");
			goto out;
		}
		if ((rc = fsutil_write_all(fd, buf, len)) < 0) {
			rc = fail(x, rc, "writing '%s': %s", path, strerror(-rc));
			goto out;
		}
		written += len;
	}
	if (written != (uint64_t)size) {
		rc = refuse(x, -EBADMSG, path, "%llu bytes of data, the header says %lld",
		            (unsigned long long)written, (long long)size);
		goto out;
	}
	bool exact = x->umask >= 0 && (mode & 01777) == (cmode & ~(mode_t)x->umask);
	if (!exact && fchmod(fd, mode & 01777) < 0) {
		rc = fail(x, -errno, "setting the mode of '%s': %s", path, strerror(errno));
		goto out;
	}
	struct timespec ts[2];
	bool has;
	entry_times(e, ts, &has);
	if (has && futimens(fd, ts) < 0) {
		rc = fail(x, -errno, "setting the mtime of '%s': %s", path, strerror(errno));
		goto out;
	}
	x->st.files++;
	x->st.bytes += written;
	rc = note_created(x, path);
out:
	if (close(fd) < 0 && rc == 0)
		rc = fail(x, -errno, "writing '%s': %s", path, strerror(errno));
	return rc;
}

static int add_dirattr(struct extract *x, const char *path, mode_t mode, struct archive_entry *e)
{
	if (x->ndirs == x->capdirs) {
		size_t ncap = x->capdirs ? x->capdirs * 2 : 64;
		struct dirattr *nd = realloc(x->dirs, ncap * sizeof(*nd));
		if (nd == NULL)
			return fail(x, -ENOMEM, "out of memory");
		x->dirs = nd;
		x->capdirs = ncap;
	}
	struct dirattr *d = &x->dirs[x->ndirs];
	d->path = strdup(path);
	if (d->path == NULL)
		return fail(x, -ENOMEM, "out of memory");
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
			return fail(x, -errno, "creating directory '%s': %s", path,
			            strerror(errno));
		int rc = make_room(x, pfd, path, base, true);
		if (rc < 0)
			return rc;
		if (rc == 0 && mkdirat(pfd, base, 0700 | (mode & 0777)) < 0)
			return fail(x, -errno, "creating directory '%s': %s", path,
			            strerror(errno));
	}
	x->st.dirs++;
	int rc = note_created(x, path);
	return rc < 0 ? rc : add_dirattr(x, path, mode, e);
}

static const char *entry_str(const char *mbs, const char *utf8)
{
	return mbs ? mbs : utf8;
}

static int do_symlink(struct extract *x, struct archive_entry *e, const char *path,
                      const char *parent, const char *base)
{
	const char *target = entry_str(archive_entry_symlink(e), archive_entry_symlink_utf8(e));
	char shown_t[300];
	if (target == NULL || target[0] == '\0')
		return refuse(x, -EPERM, path, "symlink has no target");
	if (strlen(target) >= PATH_BUF)
		return refuse(x, -EPERM, path, "symlink target is too long");
	if (target[0] == '/')
		return refuse(x, -EPERM, path, "symlink target '%s' is absolute",
		              shown(target, shown_t, sizeof(shown_t)));
	if (!extract_symlink_inside(path, target))
		return refuse(x, -EPERM, path, "symlink target '%s' resolves outside the tree",
		              shown(target, shown_t, sizeof(shown_t)));
	int pfd = parent_fd(x, path, parent);
	if (pfd < 0)
		return pfd;
	if (symlinkat(target, pfd, base) < 0) {
		if (errno != EEXIST)
			return fail(x, -errno, "creating symlink '%s': %s", path, strerror(errno));
		int rc = make_room(x, pfd, path, base, false);
		if (rc < 0)
			return rc;
		if (symlinkat(target, pfd, base) < 0)
			return fail(x, -errno, "creating symlink '%s': %s", path, strerror(errno));
	}
	struct timespec ts[2];
	bool has;
	entry_times(e, ts, &has);
	if (has && utimensat(pfd, base, ts, AT_SYMLINK_NOFOLLOW) < 0)
		return fail(x, -errno, "setting the mtime of '%s': %s", path, strerror(errno));
	if (x->nlinks == x->caplinks) {
		size_t ncap = x->caplinks ? x->caplinks * 2 : 32;
		char **nl = realloc(x->links, ncap * sizeof(*nl));
		if (nl == NULL)
			return fail(x, -ENOMEM, "out of memory");
		x->links = nl;
		x->caplinks = ncap;
	}
	if ((x->links[x->nlinks] = strdup(path)) == NULL)
		return fail(x, -ENOMEM, "out of memory");
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
		return refuse(x, -EPERM, path, "hard link target '%s' is outside the tree",
		              shown(hl, shown_t, sizeof(shown_t)));
	if (strcmp(tpath, path) == 0)
		return 0; /* a link to itself: nothing to do */
	const char *tbase = split_base(tpath, tparent, sizeof(tparent));
	int tfd = fstree_open_dir(x->root, tparent);
	if (tfd == -ELOOP)
		return refuse(x, -EPERM, path, "hard link target '%s' passes through a symlink",
		              shown(hl, shown_t, sizeof(shown_t)));
	struct stat st;
	if (tfd < 0 || fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (tfd >= 0)
			close(tfd);
		return refuse(x, -EPERM, path, "hard link target '%s' is not in the tree",
		              shown(hl, shown_t, sizeof(shown_t)));
	}
	int rc = 0;
	if (!S_ISREG(st.st_mode)) {
		rc = refuse(x, -EPERM, path, "hard link target '%s' is not a regular file",
		            shown(hl, shown_t, sizeof(shown_t)));
		goto out;
	}
	int pfd = parent_fd(x, path, parent);
	if (pfd < 0) {
		rc = pfd;
		goto out;
	}
	if (linkat(tfd, tbase, pfd, base, 0) < 0) {
		if (errno != EEXIST) {
			rc = fail(x, -errno, "creating hard link '%s': %s", path, strerror(errno));
			goto out;
		}
		if ((rc = make_room(x, pfd, path, base, false)) < 0)
			goto out;
		if (linkat(tfd, tbase, pfd, base, 0) < 0) {
			rc = fail(x, -errno, "creating hard link '%s': %s", path, strerror(errno));
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
		return fail(x, -ELOOP, "directory tree too deep at '%s'", dpath);
	DIR *d;
	int orc = fstree_opendir(dfd, &d);
	if (orc < 0)
		return fail(x, orc, "reading '%s': %s", dpath, strerror(-orc));
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
				rc = fail(x, -ENOMEM, "out of memory");
				goto out;
			}
			names = nn;
			cap = ncap;
		}
		if ((names[n] = strdup(de->d_name)) == NULL) {
			rc = fail(x, -ENOMEM, "out of memory");
			goto out;
		}
		n++;
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		char cpath[PATH_BUF];
		if ((size_t)snprintf(cpath, sizeof(cpath), "%s%s%s", dpath, dpath[0] ? "/" : "",
		                     names[i]) >= sizeof(cpath))
			continue;
		if (!pathset_has(&x->created, cpath)) {
			int r = fstree_remove(dfd, names[i]);
			if (r < 0)
				rc = fail(x, r, "removing '%s': %s", cpath, strerror(-r));
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
		return refuse(x, -EPERM, path, "whiteout names no file");
	x->st.whiteouts++;
	if (!x->below)
		return 0; /* nothing below the first layer */
	drop_parent(x);
	int dfd = fstree_open_dir(x->root, parent);
	if (dfd == -ENOENT || dfd == -ENOTDIR)
		return 0;
	if (dfd == -ELOOP)
		return refuse(x, -EPERM, path, "path passes through a symlink");
	if (dfd < 0)
		return fail(x, dfd, "opening directory '%s': %s", parent, strerror(-dfd));
	int rc;
	if (opaque) {
		rc = remove_lower(x, dfd, parent, 0);
	} else {
		char vpath[PATH_BUF];
		snprintf(vpath, sizeof(vpath), "%s%s%s", parent, parent[0] ? "/" : "", victim);
		rc = 0;
		if (!pathset_has(&x->created, vpath)) {
			rc = fstree_remove(dfd, victim);
			if (rc < 0)
				rc = fail(x, rc, "removing '%s': %s", vpath, strerror(-rc));
		}
	}
	close(dfd);
	return rc;
}

static int do_entry(struct extract *x, struct archive *a, struct source *s, struct archive_entry *e)
{
	const char *name = entry_str(archive_entry_pathname(e), archive_entry_pathname_utf8(e));
	char path[PATH_BUF], parent[PATH_BUF];
	const char *rule;
	if (name == NULL)
		return refuse(x, -EPERM, "?", "the entry's name cannot be read");
	if (++x->st.entries > x->lim.max_entries)
		return refuse(x, -EFBIG, name, "more than %llu entries (entry count cap)",
		              (unsigned long long)x->lim.max_entries);
	if (extract_clean_path(name, path, sizeof(path), &rule) < 0)
		return refuse(x, -EPERM, name, "%s", rule);
	mode_t mode = archive_entry_mode(e);
	char tmp[PATH_BUF];
	memcpy(tmp, path, strlen(path) + 1);
	const char *base = split_base(tmp, parent, sizeof(parent));
	const char *hl = entry_str(archive_entry_hardlink(e), archive_entry_hardlink_utf8(e));
	unsigned type = archive_entry_filetype(e);

	if (strncmp(base, ".wh.", 4) == 0)
		return do_whiteout(x, path, parent, base);
	if (mode & (S_ISUID | S_ISGID))
		return refuse(x, -EPERM, path, "setuid/setgid bit set (mode %04o)",
		              (unsigned)(mode & 07777));
	if (path[0] == '\0' && (hl != NULL || type != AE_IFDIR))
		return refuse(x, -EPERM, name, "the root can only be a directory");
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
		return refuse(x, -EPERM, path, "device nodes are not allowed");
	case AE_IFIFO:
		return refuse(x, -EPERM, path, "FIFOs are not allowed");
	case AE_IFSOCK:
		return refuse(x, -EPERM, path, "sockets are not allowed");
	default:
		return refuse(x, -EPERM, path, "unsupported entry type (mode %06o)",
		              (unsigned)mode);
	}
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
	int rc = src_init(&s, x, fn, ctx);
	if (rc < 0) {
		rc = s.err ? fail(x, rc, "%s", s.errmsg) : fail(x, rc, "%s", strerror(-rc));
		goto out;
	}
	if (s.comp != COMP_NONE && (rc = ring_start(&s)) < 0) {
		rc = fail(x, rc, "%s", s.errmsg);
		goto out;
	}
	x->below = x->st.layers > 0;
	x->last_end = 0;
	a = archive_read_new();
	if (a == NULL || archive_read_support_format_tar(a) != ARCHIVE_OK) {
		rc = fail(x, -ENOMEM, "out of memory");
		goto out;
	}
	if (archive_read_open(a, &s, NULL, src_read, NULL) != ARCHIVE_OK) {
		rc = archive_failure(x, a, &s, NULL);
		goto out;
	}
	for (;;) {
		struct archive_entry *e;
		int r = archive_read_next_header(a, &e);
		if (r == ARCHIVE_EOF)
			break;
		if (r < ARCHIVE_WARN) {
			rc = archive_failure(x, a, &s, NULL);
			goto out;
		}
		uint64_t data_at = (uint64_t)archive_filter_bytes(a, 0);
		if (s.eof && data_at > s.tar) {
			char sn[300];
			rc = fail(x, -EBADMSG,
			          "the layer ends inside a tar header (after entry '%s')",
			          last[0] ? shown(last, sn, sizeof(sn)) : "(none)");
			goto out;
		}
		const char *name =
		    entry_str(archive_entry_pathname(e), archive_entry_pathname_utf8(e));
		snprintf(last, sizeof(last), "%s", name ? name : "?");
		if ((rc = do_entry(x, a, &s, e)) < 0)
			goto out;
		int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
		x->last_end = data_at + (uint64_t)(size > 0 ? size : 0);
		if (s.eof && x->last_end > s.tar) {
			char sn[300];
			rc = fail(x, -EBADMSG,
			          "entry '%s' is cut short: the layer ends %llu bytes into its "
			          "%lld bytes of data",
			          shown(last, sn, sizeof(sn)),
			          (unsigned long long)(s.tar - data_at), (long long)size);
			goto out;
		}
	}
	/* Zero padding stood in for the end-of-archive blocks: then nothing but
	 * zeros may follow the last entry's data in the real stream. */
	if (s.eof && (uint64_t)archive_filter_bytes(a, 0) > s.tar && s.last_nonzero > x->last_end) {
		char sn[300];
		rc = fail(x, -EBADMSG, "the layer ends inside a tar header (after entry '%s')",
		          last[0] ? shown(last, sn, sizeof(sn)) : "(none)");
		goto out;
	}
	if ((rc = src_drain(&s)) < 0) {
		rc = fail(x, rc, "%s", s.errmsg);
		goto out;
	}
	x->st.layers++;
out:
	if (a)
		archive_read_free(a);
	src_free(&s); /* first: the decoder thread stops */
	x->st.compressed_bytes += s.compressed;
	x->st.tar_bytes += s.tar;
	pathset_clear(&x->created);
	drop_parent(x);
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
		return fail(x, -errno, "opening layer file '%s': %s", path, strerror(errno));
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
		const char *base = split_base(tmp, parent, sizeof(parent));
		int pfd = fstree_open_dir(x->root, parent);
		if (pfd < 0)
			continue; /* removed by a later layer */
		ssize_t n = readlinkat(pfd, base, target, sizeof(target) - 1);
		close(pfd);
		if (n < 0)
			continue;
		target[n] = '\0';
		if (!resolves_inside(x->root, parent, target))
			return refuse(
			    x, -EPERM, x->links[i],
			    "symlink target '%s' resolves outside the tree (through other links)",
			    shown(target, sn, sizeof(sn)));
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
			rc = fail(x, -errno, "setting the mode of '%s': %s", d->path,
			          strerror(errno));
		struct timespec ts[2] = {d->mtime, d->mtime};
		if (rc == 0 && d->has_mtime && futimens(fd, ts) < 0)
			rc = fail(x, -errno, "setting the mtime of '%s': %s", d->path,
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
		rc = fail(p->x, -ECANCELED, "the layer stream was abandoned");
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->buf);
	free(p);
	return rc;
}
