/* Test helper: build tar layers in memory with libarchive's writer (an
 * independent producer for the extractor), plus a chunked memory reader and
 * temp-dir helpers. Header-only: each unit test is one program. */
#ifndef GKM_SPEC_TARBUILD_H
#define GKM_SPEC_TARBUILD_H

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

enum tb_filter { TB_NONE, TB_GZIP, TB_ZSTD };

struct tb {
	struct archive *a;
	unsigned char *buf;
	size_t len, cap;
};

#define TB_UNUSED __attribute__((unused))

static la_ssize_t tb_write_cb(struct archive *a, void *cd, const void *data, size_t n)
{
	(void)a;
	struct tb *t = cd;
	if (t->len + n > t->cap) {
		size_t ncap = t->cap ? t->cap : 65536;
		while (ncap < t->len + n)
			ncap *= 2;
		unsigned char *nb = realloc(t->buf, ncap);
		if (nb == NULL)
			return -1;
		t->buf = nb;
		t->cap = ncap;
	}
	memcpy(t->buf + t->len, data, n);
	t->len += n;
	return (la_ssize_t)n;
}

TB_UNUSED static void tb_begin(struct tb *t, enum tb_filter f)
{
	memset(t, 0, sizeof(*t));
	t->a = archive_write_new();
	archive_write_set_format_pax_restricted(t->a);
	if (f == TB_GZIP)
		archive_write_add_filter_gzip(t->a);
	else if (f == TB_ZSTD)
		archive_write_add_filter_zstd(t->a);
	archive_write_set_bytes_in_last_block(t->a, 1);
	if (archive_write_open(t->a, t, NULL, tb_write_cb, NULL) != ARCHIVE_OK)
		abort();
}

TB_UNUSED static void tb_entry(struct tb *t, const char *path, unsigned type, unsigned mode,
                               int64_t size, const char *link, int hard, time_t mtime)
{
	struct archive_entry *e = archive_entry_new();
	archive_entry_set_pathname(e, path);
	archive_entry_set_filetype(e, type);
	archive_entry_set_perm(e, mode);
	archive_entry_set_size(e, size);
	archive_entry_set_mtime(e, mtime ? mtime : 1700000000, 0);
	if (link && hard)
		archive_entry_set_hardlink(e, link);
	else if (link)
		archive_entry_set_symlink(e, link);
	if (archive_write_header(t->a, e) != ARCHIVE_OK) {
		fprintf(stderr, "tb: %s\n", archive_error_string(t->a));
		abort();
	}
	archive_entry_free(e);
}

TB_UNUSED static void tb_file(struct tb *t, const char *path, unsigned mode, const char *data,
                              time_t mtime)
{
	size_t n = strlen(data);
	tb_entry(t, path, AE_IFREG, mode, (int64_t)n, NULL, 0, mtime);
	if (n && archive_write_data(t->a, data, n) != (la_ssize_t)n)
		abort();
}

/* A file of size bytes written in chunks: all equal to byte c, or with a
 * non-zero seed, a seeded random run of 256 words of 32 letters (packs to
 * about a twelfth: far from a decompression bomb, quick to compress, and
 * damage to it is found by the decoder). */
TB_UNUSED static void tb_chunks(struct tb *t, const char *path, int64_t size, int c, uint32_t seed)
{
	static unsigned char chunk[65536];
	memset(chunk, c, sizeof(chunk));
	tb_entry(t, path, AE_IFREG, 0644, size, NULL, 0, 0);
	for (int64_t left = size; left > 0;) {
		size_t n = left < (int64_t)sizeof(chunk) ? (size_t)left : sizeof(chunk);
		for (size_t i = 0; seed && i < n; i++) {
			if (i % 32 == 0) {
				seed ^= seed << 13;
				seed ^= seed >> 17;
				seed ^= seed << 5;
			}
			uint32_t h = ((seed >> 24) << 5 | (uint32_t)(i % 32)) * 2654435761u;
			chunk[i] = (unsigned char)('a' + (h >> 28));
		}
		if (archive_write_data(t->a, chunk, n) != (la_ssize_t)n)
			abort();
		left -= (int64_t)n;
	}
}

TB_UNUSED static void tb_fill(struct tb *t, const char *path, int64_t size, int c)
{
	tb_chunks(t, path, size, c, 0);
}

TB_UNUSED static void tb_noise(struct tb *t, const char *path, int64_t size, uint32_t seed)
{
	tb_chunks(t, path, size, 0, seed);
}

TB_UNUSED static void tb_dir(struct tb *t, const char *path, unsigned mode, time_t mtime)
{
	tb_entry(t, path, AE_IFDIR, mode, 0, NULL, 0, mtime);
}

TB_UNUSED static void tb_symlink(struct tb *t, const char *path, const char *target)
{
	tb_entry(t, path, AE_IFLNK, 0777, 0, target, 0, 0);
}

TB_UNUSED static void tb_hardlink(struct tb *t, const char *path, const char *target)
{
	tb_entry(t, path, AE_IFREG, 0644, 0, target, 1, 0);
}

TB_UNUSED static void tb_end(struct tb *t)
{
	archive_write_close(t->a);
	archive_write_free(t->a);
	t->a = NULL;
}

TB_UNUSED static void tb_free(struct tb *t)
{
	free(t->buf);
	memset(t, 0, sizeof(*t));
}

/* gzip a buffer (one member) with zlib; caller frees *out. */
TB_UNUSED static void tb_gzip(const unsigned char *in, size_t len, unsigned char **out,
                              size_t *out_len)
{
	z_stream z;
	memset(&z, 0, sizeof(z));
	if (deflateInit2(&z, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK)
		abort();
	size_t cap = deflateBound(&z, len) + 64;
	*out = malloc(cap);
	z.next_in = (unsigned char *)in;
	z.avail_in = (uInt)len;
	z.next_out = *out;
	z.avail_out = (uInt)cap;
	if (deflate(&z, Z_FINISH) != Z_STREAM_END)
		abort();
	*out_len = cap - z.avail_out;
	deflateEnd(&z);
}

/* Memory source for extract_read_fn, handing out at most chunk bytes per
 * call; fail_at_end (if non-zero) is returned instead of 0 at the end, as a
 * digest check that failed would. */
struct memsrc {
	const unsigned char *p;
	size_t len, pos, chunk;
	int fail_at_end;
};

TB_UNUSED static ssize_t memsrc_read(void *ctx, void *buf, size_t len)
{
	struct memsrc *m = ctx;
	size_t n = m->len - m->pos;
	if (n == 0)
		return m->fail_at_end ? m->fail_at_end : 0;
	if (m->chunk && n > m->chunk)
		n = m->chunk;
	if (n > len)
		n = len;
	memcpy(buf, m->p + m->pos, n);
	m->pos += n;
	return (ssize_t)n;
}

/* A fresh temp dir under TMPDIR (or /tmp); path written to buf. */
TB_UNUSED static void tmpdir_make(char *buf, size_t len, const char *tag)
{
	const char *base = getenv("TMPDIR");
	snprintf(buf, len, "%s/gkm-%s.XXXXXX", base && *base ? base : "/tmp", tag);
	if (mkdtemp(buf) == NULL)
		abort();
}

TB_UNUSED static void tmpdir_remove(const char *path)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", path, path);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", path);
}

TB_UNUSED static int read_file_str(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return -errno;
	size_t n = fread(buf, 1, len - 1, f);
	buf[n] = '\0';
	fclose(f);
	return (int)n;
}

#endif
