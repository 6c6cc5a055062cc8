#include "gzwrite.h"

#include <errno.h>
#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A compressed chunk must save at least 1/32 of it, or it is stored. */
#define MIN_SAVING_SHIFT 5
#define OUT_CAP (2 * GZW_CHUNK + ISAL_DEF_MAX_HDR_SIZE + 64)

struct gzw {
	struct isal_zstream z; /* z.level_buf is ours to free */
	unsigned char in[GZW_CHUNK];
	size_t in_len;
	unsigned char out[OUT_CAP];
	gzw_out_fn emit;
	void *ud;
	uint32_t crc;
	uint64_t size, stored, chunks;
};

int gzw_new(int level, gzw_out_fn out, void *ud, struct gzw **wp)
{
	static const uint32_t sizes[] = {0, ISAL_DEF_LVL1_DEFAULT, ISAL_DEF_LVL2_DEFAULT,
	                                 ISAL_DEF_LVL3_DEFAULT};
	if (level < 0 || level > 3)
		level = 1;
	struct gzw *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	isal_deflate_init(&w->z);
	w->z.level = (uint32_t)level;
	w->z.gzip_flag = IGZIP_DEFLATE; /* the gzip wrapper is ours */
	w->z.flush = SYNC_FLUSH;        /* each chunk ends byte-aligned */
	if (sizes[level] && !(w->z.level_buf = malloc(sizes[level]))) {
		free(w);
		return -ENOMEM;
	}
	w->z.level_buf_size = sizes[level];
	w->emit = out;
	w->ud = ud;
	/* gzip member header: deflate, no name, no time, unknown OS */
	static const unsigned char hdr[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255};
	int rc = out(ud, hdr, sizeof(hdr));
	if (rc) {
		gzw_free(w);
		return rc;
	}
	*wp = w;
	return 0;
}

/* One chunk: deflate it (so that isa-l's history, like the inflater's
 * window, holds every byte, whichever block type is written), then keep
 * the compressed form only if it pays. */
static int flush_chunk(struct gzw *w)
{
	if (w->in_len == 0)
		return 0;
	w->z.next_in = w->in;
	w->z.avail_in = (uint32_t)w->in_len;
	w->z.next_out = w->out;
	w->z.avail_out = OUT_CAP;
	/* done when all input is in and the sync flush written (a new block next) */
	bool done;
	do {
		if (isal_deflate(&w->z) != COMP_OK)
			return -EIO;
		done = w->z.avail_in == 0 && (w->z.internal_state.state == ZSTATE_NEW_HDR ||
		                              w->z.internal_state.state == ZSTATE_TMP_NEW_HDR);
	} while (!done && w->z.avail_out > 0);
	if (!done)
		return -EIO;
	size_t n = OUT_CAP - w->z.avail_out;
	w->crc = crc32_gzip_refl(w->crc, w->in, w->in_len);
	w->size += w->in_len;
	w->chunks++;
	int rc;
	if (n + (w->in_len >> MIN_SAVING_SHIFT) <= w->in_len) {
		rc = w->emit(w->ud, w->out, n);
	} else {
		/* a stored block: BFINAL 0, BTYPE 00, byte-aligned (the stream is,
		 * after a sync flush), then LEN and its complement */
		unsigned char h[5] = {0, (unsigned char)w->in_len, (unsigned char)(w->in_len >> 8),
		                      (unsigned char)~w->in_len, (unsigned char)(~w->in_len >> 8)};
		w->stored++;
		rc = w->emit(w->ud, h, sizeof(h));
		if (!rc)
			rc = w->emit(w->ud, w->in, w->in_len);
	}
	w->in_len = 0;
	return rc;
}

int gzw_write(struct gzw *w, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len > 0) {
		size_t k = GZW_CHUNK - w->in_len < len ? GZW_CHUNK - w->in_len : len;
		memcpy(w->in + w->in_len, p, k);
		w->in_len += k;
		p += k;
		len -= k;
		if (w->in_len == GZW_CHUNK) {
			int rc = flush_chunk(w);
			if (rc)
				return rc;
		}
	}
	return 0;
}

int gzw_finish(struct gzw *w)
{
	int rc = flush_chunk(w);
	if (rc)
		return rc;
	/* an empty final stored block, then CRC-32 and ISIZE, little-endian */
	unsigned char t[13] = {1, 0, 0, 0xff, 0xff};
	for (int i = 0; i < 4; i++) {
		t[5 + i] = (unsigned char)(w->crc >> (8 * i));
		t[9 + i] = (unsigned char)(w->size >> (8 * i));
	}
	return w->emit(w->ud, t, sizeof(t));
}

void gzw_counts(const struct gzw *w, uint64_t *stored, uint64_t *chunks)
{
	*stored = w->stored;
	*chunks = w->chunks;
}

void gzw_free(struct gzw *w)
{
	if (!w)
		return;
	free(w->z.level_buf);
	free(w);
}
