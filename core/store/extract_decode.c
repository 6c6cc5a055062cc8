#include "extract_impl.h"

#include <archive.h>
#include <errno.h>
#include <isa-l/igzip_lib.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

/* ---- decoding source ---- */

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

int ex_src_init(struct source *s, struct extract *x, extract_read_fn fn, void *ctx)
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
int ex_ring_start(struct source *s)
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

la_ssize_t ex_src_read(struct archive *a, void *cd, const void **buf)
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

void ex_src_free(struct source *s)
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
int ex_src_drain(struct source *s)
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
