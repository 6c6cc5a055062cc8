/* The layer's gzip writer: what it writes is read back by zlib (an
 * independent inflater that checks the CRC-32 and size), incompressible
 * chunks go out as stored blocks, compressible ones compressed, and an
 * output error stops it; compressed on a thread of its own (gzpipe), the
 * stream is the same bytes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>

#include "gzpipe.h"
#include "gzwrite.h"

struct sink {
	unsigned char *buf;
	size_t len, cap;
	size_t fail_after; /* 0: never */
};

static int sink_out(void *ud, const void *b, size_t n)
{
	struct sink *s = ud;
	if (s->fail_after && s->len + n > s->fail_after)
		return -ENOSPC;
	if (s->len + n > s->cap) {
		s->cap = (s->len + n) * 2;
		s->buf = realloc(s->buf, s->cap);
		assert_non_null(s->buf);
	}
	memcpy(s->buf + s->len, b, n);
	s->len += n;
	return 0;
}

/* Deterministic noise (xorshift), incompressible. */
static void noise(unsigned char *b, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		b[i] = (unsigned char)seed;
	}
}

/* Text-like data: compressible. */
static void text(unsigned char *b, size_t n)
{
	static const char *const words[] = {"tt.load", "tt.store", "%ptr", "i32", "arith.addi",
	                                    "scf.for", "tt.dot",   "f16",  " = ", "\n"};
	for (size_t i = 0; i < n;) {
		const char *w = words[(i * 7 + i / 13) % 10];
		for (size_t k = 0; w[k] && i < n; k++)
			b[i++] = (unsigned char)w[k];
	}
}

/* zlib's gunzip of the whole stream (it checks the trailer) must give back
 * exactly want (n bytes); frees the sink's buffer. */
static void assert_gunzips_to(struct sink *s, const unsigned char *want, size_t n)
{
	unsigned char *out = malloc(n + 1);
	assert_non_null(out);
	z_stream z = {0};
	assert_int_equal(inflateInit2(&z, 16 + MAX_WBITS), Z_OK);
	z.next_in = s->buf;
	z.avail_in = (uInt)s->len;
	z.next_out = out;
	z.avail_out = (uInt)n + 1;
	assert_int_equal(inflate(&z, Z_FINISH), Z_STREAM_END);
	assert_int_equal(z.total_out, n);
	assert_int_equal(z.avail_in, 0); /* nothing after the trailer */
	inflateEnd(&z);
	assert_memory_equal(out, want, n);
	free(out);
	free(s->buf);
	s->buf = NULL;
}

static int gzw_put(void *w, const void *b, size_t n)
{
	return gzw_write(w, b, n);
}

static int gzp_put(void *p, const void *b, size_t n)
{
	return gzp_write(p, b, n);
}

/* Write data in uneven pieces (up to most bytes), as the tar writer hands
 * it over. */
static void write_all(int (*put)(void *, const void *, size_t), void *w, const unsigned char *d,
                      size_t n, size_t most)
{
	for (size_t off = 0, step = 1; off < n; step = step * 3 + 1) {
		size_t k = step % most + 1;
		if (k > n - off)
			k = n - off;
		assert_int_equal(put(w, d + off, k), 0);
		off += k;
	}
}

/* The whole of d through a writer at level into s; stored/chunks counts. */
static void gz_all(const unsigned char *d, size_t n, int level, struct sink *s, uint64_t *stored,
                   uint64_t *chunks)
{
	struct gzw *w;
	assert_int_equal(gzw_new(level, sink_out, s, &w), 0);
	write_all(gzw_put, w, d, n, 70001);
	assert_int_equal(gzw_finish(w), 0);
	gzw_counts(w, stored, chunks);
	gzw_free(w);
}

static void test_mixed_round_trip(void **state)
{
	(void)state;
	/* 8 chunks of noise, then 8 of text, then zeros and a short tail */
	size_t n = 20 * GZW_CHUNK + 1234;
	unsigned char *d = malloc(n);
	noise(d, 8 * GZW_CHUNK, 42);
	text(d + 8 * GZW_CHUNK, 8 * GZW_CHUNK);
	memset(d + 16 * GZW_CHUNK, 0, n - 16 * GZW_CHUNK);
	struct sink s = {0};
	uint64_t stored, chunks;
	gz_all(d, n, 1, &s, &stored, &chunks);
	assert_int_equal(chunks, 21);
	assert_int_equal(stored, 8); /* exactly the noise */
	/* noise costs 5 bytes a chunk; text and zeros shrink */
	assert_true(s.len < 8 * (GZW_CHUNK + 5) + 4 * GZW_CHUNK);
	assert_gunzips_to(&s, d, n);
	free(d);
}

static void test_noise_is_stored(void **state)
{
	(void)state;
	size_t n = 50 * GZW_CHUNK;
	unsigned char *d = malloc(n);
	noise(d, n, 7);
	struct sink s = {0};
	uint64_t stored, chunks;
	gz_all(d, n, 1, &s, &stored, &chunks);
	assert_int_equal(stored, 50);
	/* header 10 + 5 per stored block + final block 5 + trailer 8 */
	assert_int_equal(s.len, 10 + n + 50 * 5 + 5 + 8);
	assert_gunzips_to(&s, d, n);
	free(d);
}

static void test_every_level_and_empty(void **state)
{
	(void)state;
	size_t n = 3 * GZW_CHUNK + 5000;
	unsigned char *d = malloc(n);
	text(d, n);
	for (int level = 0; level <= 3; level++) {
		struct sink s = {0};
		uint64_t stored, chunks;
		gz_all(d, n, level, &s, &stored, &chunks);
		assert_int_equal(stored, 0);
		assert_true(s.len < n / 2);
		assert_gunzips_to(&s, d, n);
	}
	struct sink s = {0};
	uint64_t stored, chunks;
	gz_all(d, 0, 1, &s, &stored, &chunks);
	assert_int_equal(chunks, 0);
	assert_gunzips_to(&s, d, 0);
	free(d);
}

static void test_output_error_stops(void **state)
{
	(void)state;
	size_t n = 10 * GZW_CHUNK;
	unsigned char *d = malloc(n);
	noise(d, n, 3);
	struct sink s = {.fail_after = 3 * GZW_CHUNK};
	struct gzw *w;
	assert_int_equal(gzw_new(1, sink_out, &s, &w), 0);
	int rc = 0;
	for (size_t off = 0; off < n && rc == 0; off += GZW_CHUNK)
		rc = gzw_write(w, d + off, GZW_CHUNK);
	assert_int_equal(rc, -ENOSPC);
	gzw_free(w);
	free(s.buf);
	free(d);
}

/* Several of the pipe's 1 MiB slots of noise and text, in uneven pieces:
 * the same stream as gzw_* write on the caller's thread. */
static void test_pipe_same_bytes(void **state)
{
	(void)state;
	size_t n = 5 * (1u << 20) + 777;
	unsigned char *d = malloc(n);
	noise(d, n / 2, 11);
	text(d + n / 2, n - n / 2);
	struct sink one = {0}, two = {0};
	uint64_t stored, chunks;
	gz_all(d, n, 1, &one, &stored, &chunks);
	struct gzp *p;
	assert_int_equal(gzp_new(1, sink_out, &two, &p), 0);
	write_all(gzp_put, p, d, n, 400009);
	assert_int_equal(gzp_finish(p), 0);
	gzp_free(p);
	assert_int_equal(two.len, one.len);
	assert_memory_equal(two.buf, one.buf, one.len);
	free(one.buf);
	assert_gunzips_to(&two, d, n);
	free(d);
}

static void test_pipe_output_error_stops(void **state)
{
	(void)state;
	size_t n = 8 * (1u << 20);
	unsigned char *d = malloc(n);
	noise(d, n, 5);
	struct sink s = {.fail_after = 3 * (1u << 20)};
	struct gzp *p;
	assert_int_equal(gzp_new(1, sink_out, &s, &p), 0);
	int rc = 0;
	for (size_t off = 0; off < n && rc == 0; off += GZW_CHUNK)
		rc = gzp_write(p, d + off, n - off < GZW_CHUNK ? n - off : GZW_CHUNK);
	if (rc == 0)
		rc = gzp_finish(p);
	assert_int_equal(rc, -ENOSPC);
	gzp_free(p);
	/* stopped while slots were still queued */
	struct gzp *q;
	struct sink t = {0};
	assert_int_equal(gzp_new(1, sink_out, &t, &q), 0);
	assert_int_equal(gzp_write(q, d, 3 * (1u << 20)), 0);
	gzp_free(q);
	free(t.buf);
	free(s.buf);
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_mixed_round_trip),
	    cmocka_unit_test(test_noise_is_stored),
	    cmocka_unit_test(test_every_level_and_empty),
	    cmocka_unit_test(test_output_error_stops),
	    cmocka_unit_test(test_pipe_same_bytes),
	    cmocka_unit_test(test_pipe_output_error_stops),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
