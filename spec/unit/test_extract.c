/* Safe layer extraction: what lands on disk, and every refusal with the
 * message a user would read. Layers are made here with libarchive's writer
 * (and zlib for hand-cut streams). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "extract.h"
#include "tarbuild.h"

struct fx {
	char dir[300];   /* destination */
	char outer[256]; /* its parent: escapes would land here */
	int fd;
	struct extract *x;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	tmpdir_make(f->outer, sizeof(f->outer), "extract");
	snprintf(f->dir, sizeof(f->dir), "%s/dest", f->outer);
	if (mkdir(f->dir, 0755) < 0)
		return -1;
	f->fd = open(f->dir, O_RDONLY | O_DIRECTORY);
	if (extract_new(f->fd, NULL, &f->x) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	extract_free(f->x);
	close(f->fd);
	tmpdir_remove(f->outer);
	free(f);
	return 0;
}

static int run_layer(struct fx *f, struct tb *t, size_t chunk)
{
	struct memsrc m = {t->buf, t->len, 0, chunk, 0};
	return extract_layer(f->x, memsrc_read, &m);
}

static void assert_file(struct fx *f, const char *rel, const char *content, unsigned mode)
{
	char p[512], buf[4096];
	snprintf(p, sizeof(p), "%s/%s", f->dir, rel);
	struct stat st;
	if (lstat(p, &st) != 0)
		fail_msg("missing: %s", rel);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, mode);
	assert_int_equal(read_file_str(p, buf, sizeof(buf)), (int)strlen(content));
	assert_string_equal(buf, content);
}

static bool exists(const char *dir, const char *rel)
{
	char p[512];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	return lstat(p, &st) == 0;
}

static void assert_refused(struct fx *f, struct tb *t, int want_rc, const char *want_msg)
{
	int rc = run_layer(f, t, 0);
	if (rc == 0)
		rc = extract_finish(f->x);
	if (rc != want_rc || strstr(extract_error(f->x), want_msg) == NULL)
		fail_msg("got %d '%s', want %d containing '%s'", rc, extract_error(f->x), want_rc,
		         want_msg);
	/* The session is dead after a failure. */
	struct tb empty;
	tb_begin(&empty, TB_NONE);
	tb_end(&empty);
	assert_int_equal(run_layer(f, &empty, 0), -ECANCELED);
	tb_free(&empty);
}

/* ---- what lands on disk ---- */

static void build_tree(struct tb *t, enum tb_filter filt)
{
	tb_begin(t, filt);
	tb_dir(t, "./", 0755, 1600000000);
	tb_dir(t, "io.triton.cache/", 0750, 1600000001);
	tb_dir(t, "io.triton.cache/ABC/", 0555, 1600000002);
	tb_file(t, "io.triton.cache/ABC/add_kernel.json", 0640, "{\"target\":1}", 1600000003);
	tb_file(t, "io.triton.cache/ABC/add_kernel.cubin", 0755,
	        "\x7f"
	        "ELF....",
	        1600000004);
	tb_file(t, "./implicit/parent/file.txt", 0600, "made without dir entries", 0);
	tb_symlink(t, "io.triton.cache/latest", "ABC/add_kernel.json");
	tb_hardlink(t, "io.triton.cache/ABC/hard.json", "io.triton.cache/ABC/add_kernel.json");
	tb_file(t, "empty", 0644, "", 0);
	tb_end(t);
}

static void check_tree(struct fx *f)
{
	assert_file(f, "io.triton.cache/ABC/add_kernel.json", "{\"target\":1}", 0640);
	assert_file(f, "io.triton.cache/ABC/add_kernel.cubin",
	            "\x7f"
	            "ELF....",
	            0755);
	assert_file(f, "implicit/parent/file.txt", "made without dir entries", 0600);
	assert_file(f, "empty", "", 0644);
	char p[512], q[512], l[256];
	struct stat st, st2;
	snprintf(p, sizeof(p), "%s/io.triton.cache/ABC", f->dir);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0555);
	assert_int_equal(st.st_mtime, 1600000002);
	snprintf(p, sizeof(p), "%s/io.triton.cache", f->dir);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(st.st_mtime, 1600000001);
	assert_int_equal(stat(f->dir, &st), 0);
	assert_int_equal(st.st_mtime, 1600000000);
	snprintf(p, sizeof(p), "%s/io.triton.cache/ABC/add_kernel.cubin", f->dir);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mtime, 1600000004);
	snprintf(p, sizeof(p), "%s/io.triton.cache/latest", f->dir);
	ssize_t n = readlink(p, l, sizeof(l) - 1);
	assert_true(n > 0);
	l[n] = '\0';
	assert_string_equal(l, "ABC/add_kernel.json");
	snprintf(p, sizeof(p), "%s/io.triton.cache/ABC/hard.json", f->dir);
	snprintf(q, sizeof(q), "%s/io.triton.cache/ABC/add_kernel.json", f->dir);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(stat(q, &st2), 0);
	assert_int_equal(st.st_ino, st2.st_ino);
}

static void extract_and_check(void **state, enum tb_filter filt, size_t chunk)
{
	struct fx *f = *state;
	struct tb t;
	build_tree(&t, filt);
	int rc = run_layer(f, &t, chunk);
	if (rc)
		fail_msg("extract: %d %s", rc, extract_error(f->x));
	assert_int_equal(extract_finish(f->x), 0);
	check_tree(f);
	struct extract_stats st;
	extract_get_stats(f->x, &st);
	assert_int_equal(st.files, 4);
	assert_int_equal(st.hardlinks, 1);
	assert_int_equal(st.symlinks, 1);
	assert_int_equal(st.layers, 1);
	assert_int_equal(st.compressed_bytes, t.len);
	tb_free(&t);
}

static void test_plain_tar_keeps_modes_and_mtimes(void **state)
{
	extract_and_check(state, TB_NONE, 0);
}

static void test_gzip_layer(void **state)
{
	extract_and_check(state, TB_GZIP, 0);
}

static void test_zstd_layer(void **state)
{
	extract_and_check(state, TB_ZSTD, 0);
}

static void test_tiny_reads(void **state)
{
	extract_and_check(state, TB_GZIP, 3); /* the decoder sees 3 bytes at a time */
}

/* The real caches copied into the repository (spec/fixtures/caches), so the
 * round trip runs wherever the tests run. */
static bool fixtures_dir(char *buf, size_t len)
{
	const char *root = getenv("GKM_ROOT");
	struct stat st;
	snprintf(buf, len, "%s/spec/fixtures/caches", root ? root : ".");
	return stat(buf, &st) == 0;
}

static void test_fixtures_roundtrip(void **state)
{
	/* A real Triton cache, tarred by GNU tar (another producer). */
	struct fx *f = *state;
	char fixtures[512], cmd[1600], tgz[512];
	if (!fixtures_dir(fixtures, sizeof(fixtures)))
		fail_msg("no fixture caches at %s (run from the repository root or set GKM_ROOT)",
		         fixtures);
	snprintf(tgz, sizeof(tgz), "%s/fx.tgz", f->outer);
	snprintf(cmd, sizeof(cmd), "tar -C '%s/triton' -czf '%s' .", fixtures, tgz);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(extract_layer_file(f->x, tgz), 0);
	assert_int_equal(extract_finish(f->x), 0);
	snprintf(cmd, sizeof(cmd), "diff -r '%s/triton' '%s'", fixtures, f->dir);
	assert_int_equal(system(cmd), 0);
}

static void test_umoci_layer_without_end_blocks(void **state)
{
	/* Debian's umoci writes layers with a "/" root entry and without the
	 * tar padding and end-of-archive blocks (GNU tar and bsdtar reject
	 * them). They must extract. */
	struct fx *f = *state;
	char cmd[2048];
	if (system("command -v umoci >/dev/null 2>&1") != 0) {
		print_message("# skipped: umoci is not installed (make deps installs it)\n");
		skip();
	}
	snprintf(
	    cmd, sizeof(cmd),
	    "cd '%s' && umask 022 && mkdir -p src/io.triton.cache/abc && printf '{\"a\":1}' > "
	    "src/io.triton.cache/abc/k.json && "
	    "head -c 1000 /dev/zero | tr '\\0' x > src/io.triton.cache/abc/k.cubin && "
	    "umoci init --layout L && umoci new --image L:t && umoci insert --image L:t src / && "
	    "for b in L/blobs/sha256/*; do if [ \"$(head -c2 $b | od -An -tx1 | tr -d ' ')\" = "
	    "1f8b ]; then cp $b layer.gz; fi; done && "
	    "test $(( $(gzip -dc layer.gz | wc -c) %% 512 )) -ne 0",
	    f->outer);
	if (system(cmd) != 0)
		fail_msg("could not make an umoci layer without end blocks");
	char layer[600];
	snprintf(layer, sizeof(layer), "%s/layer.gz", f->outer);
	int rc = extract_layer_file(f->x, layer);
	if (rc)
		fail_msg("%d %s", rc, extract_error(f->x));
	assert_int_equal(extract_finish(f->x), 0);
	assert_file(f, "io.triton.cache/abc/k.json", "{\"a\":1}", 0644);
	snprintf(cmd, sizeof(cmd), "diff -r '%s/src' '%s'", f->outer, f->dir);
	assert_int_equal(system(cmd), 0);
}

/* ---- refusals ---- */

static void test_absolute_path(void **state)
{
	struct fx *f = *state;
	struct tb t;
	char victim[512];
	snprintf(victim, sizeof(victim), "%s/victim", f->outer);
	tb_begin(&t, TB_NONE);
	tb_file(&t, victim, 0644, "pwned", 0);
	tb_end(&t);
	char want[600];
	snprintf(want, sizeof(want), "refused entry '%s': absolute path", victim);
	assert_refused(f, &t, -EPERM, want);
	assert_false(exists(f->outer, "victim"));
	tb_free(&t);
}

static void test_dotdot(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_GZIP);
	tb_file(&t, "ok.txt", 0644, "fine", 0);
	tb_file(&t, "a/../../victim", 0644, "pwned", 0);
	tb_end(&t);
	assert_refused(f, &t, -EPERM, "refused entry 'a/../../victim': path escapes the tree");
	assert_false(exists(f->outer, "victim"));
	tb_free(&t);
}

static void test_symlink_escape(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_symlink(&t, "evil", "../victim");
	tb_file(&t, "evil", 0644, "pwned", 0);
	tb_end(&t);
	assert_refused(
	    f, &t, -EPERM,
	    "refused entry 'evil': symlink target '../victim' resolves outside the tree");
	assert_false(exists(f->outer, "victim"));
	assert_false(exists(f->dir, "evil"));
	tb_free(&t);
}

static void test_symlink_absolute(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_symlink(&t, "etc", "/etc");
	tb_end(&t);
	assert_refused(f, &t, -EPERM, "refused entry 'etc': symlink target '/etc' is absolute");
	tb_free(&t);
}

static void test_write_through_symlink(void **state)
{
	/* The link stays inside, but nothing is ever written through a link. */
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_dir(&t, "real", 0755, 0);
	tb_symlink(&t, "sub", "real");
	tb_file(&t, "sub/x", 0644, "through the link", 0);
	tb_end(&t);
	assert_refused(f, &t, -EPERM, "refused entry 'sub/x': path passes through a symlink");
	assert_false(exists(f->dir, "real/x"));
	tb_free(&t);
}

static void test_symlink_chain_escape(void **state)
{
	/* Each link looks inside on its own ("z" -> ".", "a/x" -> "../z/.."),
	 * but a/x really resolves to the tree's parent: caught over the
	 * finished tree. */
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_dir(&t, "a", 0755, 0);
	tb_symlink(&t, "a/x", "../z/..");
	tb_symlink(&t, "z", ".");
	tb_end(&t);
	assert_int_equal(run_layer(f, &t, 0), 0);
	assert_int_equal(extract_finish(f->x), -EPERM);
	assert_string_equal(
	    extract_error(f->x),
	    "refused entry 'a/x': symlink target '../z/..' resolves outside the tree "
	    "(through other links)");
	tb_free(&t);
}

static void test_hardlink_outside(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_hardlink(&t, "passwd", "/etc/passwd");
	tb_end(&t);
	assert_refused(
	    f, &t, -EPERM,
	    "refused entry 'passwd': hard link target '/etc/passwd' is outside the tree");
	assert_false(exists(f->dir, "passwd"));
	tb_free(&t);
}

static void test_hardlink_dotdot_and_missing(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_hardlink(&t, "h", "../victim");
	tb_end(&t);
	assert_refused(f, &t, -EPERM,
	               "refused entry 'h': hard link target '../victim' is outside the tree");
	tb_free(&t);

	struct extract *x2;
	assert_int_equal(extract_new(f->fd, NULL, &x2), 0);
	extract_free(f->x);
	f->x = x2;
	tb_begin(&t, TB_NONE);
	tb_hardlink(&t, "h", "nowhere");
	tb_end(&t);
	assert_refused(f, &t, -EPERM,
	               "refused entry 'h': hard link target 'nowhere' is not in the tree");
	tb_free(&t);
}

static void refuse_special(void **state, const char *path, unsigned type, const char *want)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_entry(&t, path, type, 0600, 0, NULL, 0, 0);
	tb_end(&t);
	assert_refused(f, &t, -EPERM, want);
	assert_false(exists(f->dir, path));
	tb_free(&t);
}

static void test_device_node(void **state)
{
	refuse_special(state, "sda", AE_IFBLK, "refused entry 'sda': device nodes are not allowed");
}

static void test_char_device(void **state)
{
	refuse_special(state, "null", AE_IFCHR,
	               "refused entry 'null': device nodes are not allowed");
}

static void test_fifo(void **state)
{
	refuse_special(state, "pipe", AE_IFIFO, "refused entry 'pipe': FIFOs are not allowed");
}

static void test_setuid(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_file(&t, "bin/su", 04755, "#!", 0);
	tb_end(&t);
	assert_refused(f, &t, -EPERM, "refused entry 'bin/su': setuid/setgid bit set (mode 4755)");
	assert_false(exists(f->dir, "bin/su"));
	tb_free(&t);
}

static void test_setgid_dir(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_dir(&t, "shared", 02775, 0);
	tb_end(&t);
	assert_refused(f, &t, -EPERM, "refused entry 'shared': setuid/setgid bit set (mode 2775)");
	tb_free(&t);
}

static void bomb(void **state, enum tb_filter filt)
{
	struct fx *f = *state;
	struct extract_limits lim;
	extract_limits_default(&lim);
	lim.ratio_grace = 1 << 20;
	lim.max_ratio = 100;
	extract_free(f->x);
	assert_int_equal(extract_new(f->fd, &lim, &f->x), 0);
	struct tb t;
	tb_begin(&t, filt);
	tb_fill(&t, "zeros", 64 << 20, 0); /* 64 MiB that packs into a few KiB */
	tb_end(&t);
	assert_true(t.len < (64 << 20) / 100);
	assert_refused(f, &t, -EFBIG, "refused as a decompression bomb");
	/* Stopped early: far less than the whole file was written. */
	char p[512];
	struct stat st;
	snprintf(p, sizeof(p), "%s/zeros", f->dir);
	assert_true(stat(p, &st) != 0 || st.st_size < (8 << 20));
	tb_free(&t);
}

static void test_gzip_bomb(void **state)
{
	bomb(state, TB_GZIP);
}

static void test_zstd_bomb(void **state)
{
	bomb(state, TB_ZSTD);
}

static void limited(struct fx *f, uint64_t entries, uint64_t entry_bytes, uint64_t total)
{
	struct extract_limits lim;
	extract_limits_default(&lim);
	lim.max_entries = entries;
	lim.max_entry_bytes = entry_bytes;
	lim.max_total_bytes = total;
	extract_free(f->x);
	assert_int_equal(extract_new(f->fd, &lim, &f->x), 0);
}

static void test_entry_count_cap(void **state)
{
	struct fx *f = *state;
	limited(f, 10, 1 << 20, 1 << 20);
	struct tb t;
	tb_begin(&t, TB_GZIP);
	for (int i = 0; i < 11; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%02d", i);
		tb_file(&t, name, 0644, "x", 0);
	}
	tb_end(&t);
	assert_refused(f, &t, -EFBIG,
	               "refused entry 'f10': more than 10 entries (entry count cap)");
	tb_free(&t);
}

static void test_entry_size_cap(void **state)
{
	struct fx *f = *state;
	limited(f, 100, 1000, 1 << 20);
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_fill(&t, "big", 1001, 'a');
	tb_end(&t);
	assert_refused(f, &t, -EFBIG,
	               "refused entry 'big': 1001 bytes, over the per-entry cap of 1000");
	assert_false(exists(f->dir, "big"));
	tb_free(&t);
}

static void test_total_size_cap(void **state)
{
	struct fx *f = *state;
	limited(f, 100, 1000, 2500);
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_fill(&t, "a", 1000, 'a');
	tb_fill(&t, "b", 1000, 'b');
	tb_fill(&t, "c", 1000, 'c');
	tb_end(&t);
	assert_refused(f, &t, -EFBIG,
	               "refused entry 'c': the tree would pass the total cap of 2500 bytes");
	tb_free(&t);
}

/* A plain tar of two files, the second one 1000 bytes (not a multiple of
 * 512, so its padding is part of what a writer may leave out). */
static void two_files(struct tb *t)
{
	tb_begin(t, TB_NONE);
	tb_file(t, "first", 0644, "one", 0);
	tb_fill(t, "second", 1000, 's');
	tb_end(t);
}

static size_t strip_zeros(const struct tb *t)
{
	size_t n = t->len;
	while (n > 0 && t->buf[n - 1] == 0)
		n--;
	return n;
}

static void test_missing_end_of_archive(void **state)
{
	struct fx *f = *state;
	struct tb t;
	two_files(&t);
	size_t n = strip_zeros(&t); /* no padding, no end-of-archive blocks */
	assert_int_equal(n % 512, 1000 % 512);
	struct memsrc m = {t.buf, n, 0, 0, 0};
	int rc = extract_layer(f->x, memsrc_read, &m);
	if (rc)
		fail_msg("%d %s", rc, extract_error(f->x));
	assert_int_equal(extract_finish(f->x), 0);
	char p[512];
	struct stat st;
	snprintf(p, sizeof(p), "%s/second", f->dir);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_size, 1000);
	tb_free(&t);
}

static void test_missing_end_of_archive_gzip(void **state)
{
	struct fx *f = *state;
	struct tb t;
	two_files(&t);
	unsigned char *gz;
	size_t gzlen;
	tb_gzip(t.buf, strip_zeros(&t), &gz, &gzlen);
	struct memsrc m = {gz, gzlen, 0, 0, 0};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), 0);
	assert_int_equal(extract_finish(f->x), 0);
	assert_true(exists(f->dir, "second"));
	free(gz);
	tb_free(&t);
}

static void test_truncated_entry(void **state)
{
	struct fx *f = *state;
	struct tb t;
	two_files(&t);
	size_t n = strip_zeros(&t) - 10; /* cut inside the second file's data */
	unsigned char *gz;
	size_t gzlen;
	tb_gzip(t.buf, n, &gz, &gzlen); /* a complete gzip stream of a cut tar */
	struct memsrc m = {gz, gzlen, 0, 0, 0};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), -EBADMSG);
	assert_string_equal(
	    extract_error(f->x),
	    "entry 'second' is cut short: the layer ends 990 bytes into its 1000 bytes of data");
	free(gz);
	tb_free(&t);
}

static void test_layer_ends_inside_header(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_file(&t, "first", 0644, "one", 0);
	tb_file(&t, "second", 0644, "two", 0);
	tb_end(&t);
	/* "first" is header+1 block; cut 100 bytes into the second header. */
	struct memsrc m = {t.buf, 1024 + 100, 0, 0, 0};
	int rc = extract_layer(f->x, memsrc_read, &m);
	if (rc != -EBADMSG)
		fail_msg("%d %s", rc, extract_error(f->x));
	assert_non_null(strstr(extract_error(f->x), "tar"));
	assert_false(exists(f->dir, "second"));
	tb_free(&t);
}

static void test_truncated_gzip_stream(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_GZIP);
	tb_fill(&t, "data", 200000, 'q');
	tb_file(&t, "after", 0644, "x", 0);
	tb_end(&t);
	struct memsrc m = {t.buf, t.len / 2, 0, 0, 0};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), -EBADMSG);
	assert_non_null(strstr(extract_error(f->x), "truncated"));
	tb_free(&t);
}

static void test_source_error_fails_layer(void **state)
{
	/* The registry client reports a digest mismatch at the end of the blob:
	 * the layer fails with its code even though the tar was fine. */
	struct fx *f = *state;
	struct tb t;
	build_tree(&t, TB_GZIP);
	struct memsrc m = {t.buf, t.len, 0, 4096, -EILSEQ};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), -EILSEQ);
	assert_non_null(strstr(extract_error(f->x), "reading the layer"));
	tb_free(&t);
}

static void test_unsupported_compression(void **state)
{
	struct fx *f = *state;
	static const unsigned char bz[] = "BZh91AY&SY";
	struct memsrc m = {bz, sizeof(bz), 0, 0, 0};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), -EPROTONOSUPPORT);
	assert_non_null(strstr(extract_error(f->x), "bzip2"));
}

static void test_garbage_is_malformed(void **state)
{
	struct fx *f = *state;
	unsigned char junk[4096];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (unsigned char)(i * 7 + 3);
	struct memsrc m = {junk, sizeof(junk), 0, 0, 0};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), -EBADMSG);
}

/* ---- layers ---- */

static void test_whiteouts_across_layers(void **state)
{
	struct fx *f = *state;
	struct tb l1, l2;
	tb_begin(&l1, TB_GZIP);
	tb_file(&l1, "a/x", 0644, "lower x", 0);
	tb_file(&l1, "a/y", 0644, "lower y", 0);
	tb_file(&l1, "b/z", 0644, "lower z", 0);
	tb_file(&l1, "c/old", 0644, "lower old", 0);
	tb_file(&l1, "c/sub/deep", 0644, "lower deep", 0);
	tb_file(&l1, "keep/k", 0644, "kept", 0);
	tb_file(&l1, "f", 0644, "a file that becomes a dir", 0);
	tb_dir(&l1, "d", 0755, 0);
	tb_file(&l1, "d/inner", 0644, "a dir that becomes a file", 0);
	tb_end(&l1);
	tb_begin(&l2, TB_ZSTD);
	tb_file(&l2, "c/new", 0644, "upper new", 0); /* same layer as the opaque marker: stays */
	tb_file(&l2, "c/sub/fresh", 0644, "upper fresh", 0);
	tb_file(&l2, "a/.wh.x", 0644, "", 0);
	tb_file(&l2, ".wh.b", 0644, "", 0);
	tb_file(&l2, "c/.wh..wh..opq", 0644, "", 0);
	tb_file(&l2, "e/made", 0644, "upper e", 0);
	tb_file(&l2, "e/.wh.made", 0644, "", 0); /* only hides lower layers: made stays */
	tb_dir(&l2, "f", 0755, 0);
	tb_file(&l2, "d", 0644, "now a file", 0);
	tb_end(&l2);
	int rc = run_layer(f, &l1, 0);
	if (rc)
		fail_msg("%d %s", rc, extract_error(f->x));
	rc = run_layer(f, &l2, 0);
	if (rc)
		fail_msg("%d %s", rc, extract_error(f->x));
	assert_int_equal(extract_finish(f->x), 0);
	assert_false(exists(f->dir, "a/x"));
	assert_file(f, "a/y", "lower y", 0644);
	assert_false(exists(f->dir, "b"));
	assert_false(exists(f->dir, "c/old"));
	assert_false(exists(f->dir, "c/sub/deep"));
	assert_file(f, "c/new", "upper new", 0644);
	assert_file(f, "c/sub/fresh", "upper fresh", 0644);
	assert_file(f, "keep/k", "kept", 0644);
	assert_file(f, "e/made", "upper e", 0644);
	assert_file(f, "d", "now a file", 0644);
	struct stat st;
	char p[512];
	snprintf(p, sizeof(p), "%s/f", f->dir);
	assert_int_equal(lstat(p, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_false(exists(f->dir, "a/.wh.x"));
	assert_false(exists(f->dir, "c/.wh..wh..opq"));
	struct extract_stats s;
	extract_get_stats(f->x, &s);
	assert_int_equal(s.layers, 2);
	assert_int_equal(s.whiteouts, 4);
	tb_free(&l1);
	tb_free(&l2);
}

static void test_push_model(void **state)
{
	struct fx *f = *state;
	struct tb t;
	build_tree(&t, TB_GZIP);
	struct extract_push *p;
	assert_int_equal(extract_push_begin(f->x, &p), 0);
	for (size_t off = 0; off < t.len; off += 1000) {
		size_t n = t.len - off < 1000 ? t.len - off : 1000;
		assert_int_equal(extract_push_write(p, t.buf + off, n), 0);
	}
	assert_int_equal(extract_push_end(p, true), 0);
	assert_int_equal(extract_finish(f->x), 0);
	check_tree(f);
	tb_free(&t);
}

static void test_push_failure_stops_writer(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_file(&t, "../escape", 0644, "x", 0);
	tb_fill(&t, "pad", 4 << 20, 'p');
	tb_end(&t);
	struct extract_push *p;
	assert_int_equal(extract_push_begin(f->x, &p), 0);
	int rc = 0;
	for (size_t off = 0; off < t.len && rc == 0; off += 65536) {
		size_t n = t.len - off < 65536 ? t.len - off : 65536;
		rc = extract_push_write(p, t.buf + off, n);
	}
	assert_int_equal(rc, -EPERM); /* the writer learns of the refusal */
	assert_int_equal(extract_push_end(p, false), -EPERM);
	assert_non_null(strstr(extract_error(f->x), "refused entry '../escape'"));
	tb_free(&t);
}

static void test_push_abandoned(void **state)
{
	struct fx *f = *state;
	struct tb t;
	build_tree(&t, TB_GZIP);
	struct extract_push *p;
	assert_int_equal(extract_push_begin(f->x, &p), 0);
	assert_int_equal(extract_push_write(p, t.buf, t.len / 2), 0);
	assert_int_equal(extract_push_end(p, false), -ECANCELED);
	tb_free(&t);
}

/* ---- the decoding thread ---- */

/* Many small files (slow to write, so the decoder runs ahead and fills its
 * ring), then with_bad an entry refused, then 48 MiB of noise. Built once
 * per filter and kept (borrowed: do not free or change it). */
static const struct tb *slow_then_noise(enum tb_filter filt, bool with_bad)
{
	static struct tb made[3][2];
	struct tb *t = &made[filt][with_bad];
	if (t->buf)
		return t;
	tb_begin(t, filt);
	for (int i = 0; i < 1500; i++) {
		char name[32];
		snprintf(name, sizeof(name), "small/%04d", i);
		tb_chunks(t, name, 1000, 0, (uint32_t)i + 1);
	}
	if (with_bad)
		tb_file(t, "../escape", 0644, "x", 0);
	tb_noise(t, "noise", 48 << 20, 7);
	tb_file(t, "after", 0644, "x", 0);
	tb_end(t);
	return t;
}

/* The parser refuses an entry while the decoder waits on a full ring: the
 * decoder is stopped and joined, and reads no further. */
static void refusal_stops_decoder(void **state, enum tb_filter filt)
{
	struct fx *f = *state;
	const struct tb *t = slow_then_noise(filt, true);
	struct memsrc m = {t->buf, t->len, 0, 0, 0};
	assert_int_equal(extract_layer(f->x, memsrc_read, &m), -EPERM);
	assert_string_equal(extract_error(f->x),
	                    "refused entry '../escape': path escapes the tree ('..' component)");
	assert_true(m.pos < t->len / 2);
	assert_true(exists(f->dir, "small/1499"));
}

static void test_refusal_stops_gzip_decoder(void **state)
{
	refusal_stops_decoder(state, TB_GZIP);
}

static void test_refusal_stops_zstd_decoder(void **state)
{
	refusal_stops_decoder(state, TB_ZSTD);
}

/* The same through the push model: the refusal reaches the writer, which
 * has not had to send the whole layer. */
static void test_push_refusal_stops_decoder(void **state)
{
	struct fx *f = *state;
	const struct tb *t = slow_then_noise(TB_GZIP, true);
	struct extract_push *p;
	assert_int_equal(extract_push_begin(f->x, &p), 0);
	int rc = 0;
	size_t off = 0;
	for (; off < t->len && rc == 0; off += 65536)
		rc = extract_push_write(p, t->buf + off,
		                        t->len - off < 65536 ? t->len - off : 65536);
	assert_int_equal(rc, -EPERM);
	assert_true(off < t->len / 2);
	assert_int_equal(extract_push_end(p, false), -EPERM);
	assert_non_null(strstr(extract_error(f->x), "refused entry '../escape'"));
}

/* Damage deep in the compressed stream: the decoder's error arrives after
 * many good slots, in order, and names the entry being written. */
static void corrupt_after_good_slots(void **state, enum tb_filter filt, const char *want)
{
	struct fx *f = *state;
	const struct tb *t = slow_then_noise(filt, false);
	unsigned char *bad = malloc(t->len);
	memcpy(bad, t->buf, t->len);
	memset(bad + t->len * 3 / 4, 0xa5, 64);
	struct memsrc m = {bad, t->len, 0, 0, 0};
	int rc = extract_layer(f->x, memsrc_read, &m);
	free(bad);
	if (rc != -EBADMSG || strncmp(extract_error(f->x), want, strlen(want)) != 0)
		fail_msg("got %d '%s', want '%s'", rc, extract_error(f->x), want);
	struct extract_stats st;
	extract_get_stats(f->x, &st);
	assert_true(st.tar_bytes > (24u << 20));
	assert_true(exists(f->dir, "small/1499"));
}

static void test_corrupt_gzip_after_good_slots(void **state)
{
	corrupt_after_good_slots(state, TB_GZIP,
	                         "entry 'noise': the gzip data is corrupt (isa-l error ");
}

static void test_corrupt_zstd_after_good_slots(void **state)
{
	corrupt_after_good_slots(state, TB_ZSTD, "entry 'noise': the zstd data is corrupt: ");
}

/* Bytes past the tar's end are read (for the digest) but not decoded, as
 * before: junk after the gzip member is no error, however far the decoder
 * had run ahead. */
static void test_junk_after_tar_end_not_decoded(void **state)
{
	struct fx *f = *state;
	struct tb t;
	build_tree(&t, TB_GZIP);
	unsigned char junk[4096];
	memset(junk, 0x5a, sizeof(junk));
	size_t n = t.len;
	for (int i = 0; i < 64; i++)
		tb_write_cb(NULL, &t, junk, sizeof(junk));
	struct memsrc m = {t.buf, t.len, 0, 0, 0};
	int rc = extract_layer(f->x, memsrc_read, &m);
	if (rc)
		fail_msg("%d %s", rc, extract_error(f->x));
	struct extract_stats st;
	extract_get_stats(f->x, &st);
	assert_int_equal(st.compressed_bytes, n + sizeof(junk) * 64);
	tb_free(&t);
}

/* ---- path rules ---- */

static void test_clean_path(void **state)
{
	(void)state;
	char out[64];
	const char *rule;
	assert_int_equal(extract_clean_path("./a//b/./c/", out, sizeof(out), &rule), 0);
	assert_string_equal(out, "a/b/c");
	assert_int_equal(extract_clean_path("./", out, sizeof(out), &rule), 0);
	assert_string_equal(out, "");
	assert_int_equal(extract_clean_path("/etc/passwd", out, sizeof(out), &rule), -EPERM);
	assert_string_equal(rule, "absolute path");
	assert_int_equal(extract_clean_path("/", out, sizeof(out), &rule),
	                 0); /* the root, as umoci writes it */
	assert_string_equal(out, "");
	assert_int_equal(extract_clean_path("//./", out, sizeof(out), &rule), 0);
	assert_int_equal(extract_clean_path("/..", out, sizeof(out), &rule), -EPERM);
	assert_int_equal(extract_clean_path("/.../x", out, sizeof(out), &rule), -EPERM);
	assert_int_equal(extract_clean_path("a/..", out, sizeof(out), &rule), -EPERM);
	assert_int_equal(extract_clean_path("..", out, sizeof(out), &rule), -EPERM);
	assert_int_equal(extract_clean_path("", out, sizeof(out), &rule), -EPERM);
	assert_int_equal(extract_clean_path("a/...", out, sizeof(out), &rule), 0); /* a real name */
	assert_int_equal(
	    extract_clean_path(
	        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", out,
	        sizeof(out), &rule),
	    -EPERM);
	assert_true(extract_symlink_inside("a/b/l", "../c"));
	assert_true(extract_symlink_inside("a/b/l", "../../c"));
	assert_false(extract_symlink_inside("a/b/l", "../../../c"));
	assert_false(extract_symlink_inside("l", "x/../../y"));
	assert_false(extract_symlink_inside("l", "/abs"));
	assert_true(extract_symlink_inside("l", "./x/./y"));
}

static void test_control_chars_in_messages(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_file(&t, "../x\nlevel=error msg=forged", 0644, "x", 0);
	tb_end(&t);
	assert_refused(f, &t, -EPERM, "refused entry '../x\\x0alevel=error msg=forged'");
	assert_null(strchr(extract_error(f->x), '\n'));
	tb_free(&t);
}

/* Tar's last entry wins: a later entry unlinks the name (a hard link made
 * to the first keeps its content), and a file can give way to a directory. */
static void test_later_entry_wins(void **state)
{
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_file(&t, "a/x", 0644, "first version", 0);
	tb_hardlink(&t, "a/x-link", "a/x");
	tb_file(&t, "a/x", 0600, "second", 0);
	tb_file(&t, "a/y", 0644, "a file, then a directory", 0);
	tb_dir(&t, "a/y/", 0755, 0);
	tb_file(&t, "a/y/z", 0644, "inside", 0);
	tb_end(&t);
	int rc = run_layer(f, &t, 0);
	if (rc)
		fail_msg("extract: %d %s", rc, extract_error(f->x));
	assert_int_equal(extract_finish(f->x), 0);
	assert_file(f, "a/x", "second", 0600);
	assert_file(f, "a/x-link", "first version", 0644);
	assert_file(f, "a/y/z", "inside", 0644);
	tb_free(&t);
}

/* A write that fails (here: past the process's file size limit, so in a
 * child) fails the layer with the file's name and the reason. */
static void test_failed_write_names_the_file(void **state)
{
	(void)state;
	char outer[256], dir[300], msg[1024];
	tmpdir_make(outer, sizeof(outer), "extract-efbig");
	snprintf(dir, sizeof(dir), "%s/dest", outer);
	assert_int_equal(mkdir(dir, 0755), 0);
	struct tb t;
	tb_begin(&t, TB_GZIP);
	tb_file(&t, "before", 0644, "fits", 0);
	tb_fill(&t, "too-big.bin", 300000, 'x');
	tb_file(&t, "after", 0644, "never written", 0);
	tb_end(&t);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		signal(SIGXFSZ, SIG_IGN);
		struct rlimit rl = {8192, 8192};
		setrlimit(RLIMIT_FSIZE, &rl);
		int fd = open(dir, O_RDONLY | O_DIRECTORY);
		struct extract *x;
		if (fd < 0 || extract_new(fd, NULL, &x) < 0)
			_exit(2);
		struct memsrc m = {t.buf, t.len, 0, 0, 0};
		int rc = extract_layer(x, memsrc_read, &m);
		dprintf(pfd[1], "%d %s", rc, extract_error(x));
		_exit(0);
	}
	close(pfd[1]);
	ssize_t n = read(pfd[0], msg, sizeof(msg) - 1);
	msg[n > 0 ? n : 0] = '\0';
	close(pfd[0]);
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	char want[128];
	snprintf(want, sizeof(want), "%d writing 'too-big.bin': %s", -EFBIG, strerror(EFBIG));
	if (strcmp(msg, want) != 0)
		fail_msg("got '%s', want '%s'", msg, want);
	assert_false(exists(dir, "after"));
	tb_free(&t);
	tmpdir_remove(outer);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	    T(test_plain_tar_keeps_modes_and_mtimes),
	    T(test_gzip_layer),
	    T(test_zstd_layer),
	    T(test_tiny_reads),
	    T(test_fixtures_roundtrip),
	    T(test_umoci_layer_without_end_blocks),
	    T(test_absolute_path),
	    T(test_dotdot),
	    T(test_symlink_escape),
	    T(test_symlink_absolute),
	    T(test_write_through_symlink),
	    T(test_symlink_chain_escape),
	    T(test_hardlink_outside),
	    T(test_hardlink_dotdot_and_missing),
	    T(test_device_node),
	    T(test_char_device),
	    T(test_fifo),
	    T(test_setuid),
	    T(test_setgid_dir),
	    T(test_gzip_bomb),
	    T(test_zstd_bomb),
	    T(test_entry_count_cap),
	    T(test_entry_size_cap),
	    T(test_total_size_cap),
	    T(test_missing_end_of_archive),
	    T(test_missing_end_of_archive_gzip),
	    T(test_truncated_entry),
	    T(test_layer_ends_inside_header),
	    T(test_truncated_gzip_stream),
	    T(test_source_error_fails_layer),
	    T(test_unsupported_compression),
	    T(test_garbage_is_malformed),
	    T(test_whiteouts_across_layers),
	    T(test_push_model),
	    T(test_push_failure_stops_writer),
	    T(test_push_abandoned),
	    T(test_refusal_stops_gzip_decoder),
	    T(test_refusal_stops_zstd_decoder),
	    T(test_push_refusal_stops_decoder),
	    T(test_corrupt_gzip_after_good_slots),
	    T(test_corrupt_zstd_after_good_slots),
	    T(test_junk_after_tar_end_not_decoded),
	    T(test_clean_path),
	    T(test_control_chars_in_messages),
	    T(test_later_entry_wins),
	    T(test_failed_write_names_the_file),
#undef T
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
