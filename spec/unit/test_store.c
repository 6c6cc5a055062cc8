/* Content store: atomic entries, crash leftovers, concurrent pulls of one
 * digest (threads and processes), GC with the keep-guard. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "store.h"
#include "tarbuild.h"

#define D1 "sha256:1111111111111111111111111111111111111111111111111111111111111111"
#define D2 "sha256:2222222222222222222222222222222222222222222222222222222222222222"
#define D3 "sha256:3333333333333333333333333333333333333333333333333333333333333333"

struct fx {
	char root[300];
	struct store *s;
	struct tb layer;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	tmpdir_make(f->root, sizeof(f->root), "store");
	if (store_open(f->root, &f->s) < 0)
		return -1;
	tb_begin(&f->layer, TB_GZIP);
	tb_dir(&f->layer, "io.triton.cache/", 0755, 0);
	tb_file(&f->layer, "io.triton.cache/K/k.json", 0644, "{\"target\":{}}", 0);
	tb_fill(&f->layer, "io.triton.cache/K/k.cubin", 10000, 'c');
	tb_symlink(&f->layer, "io.triton.cache/latest", "K");
	tb_file(&f->layer, "io.triton.manifest/manifest.json", 0644, "[]", 0);
	tb_end(&f->layer);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	store_close(f->s);
	tmpdir_remove(f->root);
	tb_free(&f->layer);
	free(f);
	return 0;
}

static int pull(struct store *s, const char *digest, const struct tb *t, unsigned flags,
                struct store_entry_info *info, char *err, size_t errlen)
{
	struct store_txn *tx;
	int rc = store_begin(s, digest, NULL, flags, &tx);
	if (rc < 0)
		return rc;
	struct memsrc m = {t->buf, t->len, 0, 0, 0};
	rc = extract_layer(store_txn_extract(tx), memsrc_read, &m);
	if (rc < 0) {
		snprintf(err, errlen, "%s", extract_error(store_txn_extract(tx)));
		store_abort(tx);
		return rc;
	}
	return store_commit(tx, info, err, errlen);
}

static int count_dir(const char *root, const char *sub)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", root, sub);
	DIR *d = opendir(p);
	if (d == NULL)
		return -1;
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL)
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

static bool present_on_disk(struct fx *f, const char *digest, const char *rel)
{
	char p[600], e[512];
	struct stat st;
	assert_int_equal(store_entry_path(f->s, digest, e, sizeof(e)), 0);
	snprintf(p, sizeof(p), "%s%s%s", e, rel[0] ? "/" : "", rel);
	return lstat(p, &st) == 0;
}

static void test_commit_and_lookup(void **state)
{
	struct fx *f = *state;
	char err[512] = "";
	struct store_entry_info info;
	assert_int_equal(store_lookup(f->s, D1, NULL), -ENOENT);
	int rc = pull(f->s, D1, &f->layer, 0, &info, err, sizeof(err));
	if (rc)
		fail_msg("%d %s", rc, err);
	assert_string_equal(info.digest, D1);
	assert_int_equal(info.files, 3);
	assert_int_equal(info.bytes, 10000 + strlen("{\"target\":{}}") + 2);
	assert_int_equal(info.symlinks, 1);
	assert_int_equal(info.dirs, 3);
	assert_int_equal(info.layers, 1);
	struct store_entry_info again;
	assert_int_equal(store_lookup(f->s, D1, &again), 0);
	assert_memory_equal(&info, &again, sizeof(info));
	assert_true(present_on_disk(f, D1, "io.triton.manifest/manifest.json"));
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	/* metadata is a small JSON file a person can read */
	char meta[600], buf[1024];
	snprintf(meta, sizeof(meta), "%s/meta/sha256-%s.json", f->root, D1 + 7);
	assert_true(read_file_str(meta, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "\"bytes\":10015"));
}

/* An entry's last use starts at its commit, moves with store_touch(), and
 * is kept in the store (a new store_open() reads it back). */
static void test_last_used(void **state)
{
	struct fx *f = *state;
	char err[512] = "", meta[600];
	struct store_entry_info info, again;
	assert_int_equal(pull(f->s, D1, &f->layer, 0, &info, err, sizeof(err)), 0);
	assert_true(info.last_used == info.created);
	/* a commit a minute ago, never used since */
	snprintf(meta, sizeof(meta), "%s/meta/sha256-%s.json", f->root, D1 + 7);
	const struct timespec old[2] = {{.tv_sec = info.created - 60},
	                                {.tv_sec = info.created - 60}};
	assert_int_equal(utimensat(AT_FDCWD, meta, old, 0), 0);
	assert_int_equal(store_lookup(f->s, D1, &again), 0);
	assert_true(again.last_used == info.created); /* never before the commit */
	int64_t before = (int64_t)time(NULL);
	assert_int_equal(store_touch(f->s, D1), 0);
	struct store *s2;
	assert_int_equal(store_open(f->root, &s2), 0);
	assert_int_equal(store_lookup(s2, D1, &again), 0);
	assert_true(again.last_used >= before);
	assert_true(again.created == info.created);
	store_close(s2);
	assert_int_equal(store_touch(f->s, D2), -ENOENT);
	assert_int_equal(store_touch(f->s, "sha256:nope"), -EINVAL);
}

static void test_second_pull_is_a_hit(void **state)
{
	struct fx *f = *state;
	char err[512];
	assert_int_equal(pull(f->s, D1, &f->layer, 0, NULL, err, sizeof(err)), 0);
	struct store_txn *tx = NULL;
	assert_int_equal(store_begin(f->s, D1, NULL, 0, &tx), -EEXIST);
	assert_null(tx);
	/* another handle on the same root sees it too */
	struct store *s2;
	assert_int_equal(store_open(f->root, &s2), 0);
	assert_int_equal(store_lookup(s2, D1, NULL), 0);
	store_close(s2);
}

static void test_abort_leaves_nothing(void **state)
{
	struct fx *f = *state;
	struct store_txn *tx;
	assert_int_equal(store_begin(f->s, D1, NULL, 0, &tx), 0);
	struct memsrc m = {f->layer.buf, f->layer.len, 0, 0, 0};
	assert_int_equal(extract_layer(store_txn_extract(tx), memsrc_read, &m), 0);
	assert_int_equal(count_dir(f->root, "tmp"), 1);
	assert_false(present_on_disk(f, D1, ""));
	store_abort(tx);
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	assert_int_equal(store_lookup(f->s, D1, NULL), -ENOENT);
}

static void test_refused_layer_is_never_visible(void **state)
{
	struct fx *f = *state;
	struct tb bad;
	tb_begin(&bad, TB_GZIP);
	tb_file(&bad, "fine", 0644, "ok", 0);
	tb_hardlink(&bad, "pw", "/etc/passwd");
	tb_end(&bad);
	char err[512] = "";
	assert_int_equal(pull(f->s, D2, &bad, 0, NULL, err, sizeof(err)), -EPERM);
	assert_string_equal(
	    err, "refused entry 'pw': hard link target '/etc/passwd' is outside the tree");
	assert_false(present_on_disk(f, D2, ""));
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	assert_int_equal(count_dir(f->root, "meta"), 0);
	/* A refusal found only at commit (links chaining outside). */
	tb_free(&bad);
	tb_begin(&bad, TB_NONE);
	tb_dir(&bad, "a", 0755, 0);
	tb_symlink(&bad, "a/x", "../z/..");
	tb_symlink(&bad, "z", ".");
	tb_end(&bad);
	assert_int_equal(pull(f->s, D2, &bad, 0, NULL, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "refused entry 'a/x'"));
	assert_false(present_on_disk(f, D2, ""));
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	tb_free(&bad);
}

static void test_bad_digests(void **state)
{
	struct fx *f = *state;
	struct store_txn *tx;
	const char *bad[] = {
	    "sha256:abc",
	    "sha512:"
	    "1111111111111111111111111111111111111111111111111111111111111111",
	    "sha256:../../../../../../../../../../../../../../../../../../etc/passwd00",
	    "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", ""};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(store_begin(f->s, bad[i], NULL, 0, &tx), -EINVAL);
		assert_int_equal(store_lookup(f->s, bad[i], NULL), -EINVAL);
		assert_int_equal(store_remove(f->s, bad[i]), -EINVAL);
	}
}

/* ---- crash ---- */

struct stall_src {
	struct memsrc m;
	size_t signal_at;
	int pipe_w;
	bool signalled;
};

/* Hands out the layer; once past signal_at bytes tells the parent and
 * stops forever, in the middle of extraction. */
static ssize_t stall_read(void *ctx, void *buf, size_t len)
{
	struct stall_src *s = ctx;
	if (s->m.pos >= s->signal_at) {
		if (!s->signalled) {
			s->signalled = true;
			if (write(s->pipe_w, "x", 1) != 1)
				_exit(3);
		}
		for (;;)
			pause();
	}
	return memsrc_read(&s->m, buf, len);
}

static pid_t start_stalled_pull(struct fx *f, const struct tb *big)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		struct store *s;
		struct store_txn *tx;
		if (store_open(f->root, &s) < 0 || store_begin(s, D3, NULL, 0, &tx) < 0)
			_exit(2);
		struct stall_src src = {
		    {big->buf, big->len, 0, 65536, 0}, big->len / 2, p[1], false};
		int rc = extract_layer(store_txn_extract(tx), stall_read, &src);
		_exit(rc == 0 ? 1 : 4);
	}
	close(p[1]);
	char c;
	assert_int_equal(read(p[0], &c, 1), 1); /* the child is mid-extraction */
	close(p[0]);
	return pid;
}

static void test_crash_mid_extraction(void **state)
{
	struct fx *f = *state;
	struct tb big;
	tb_begin(&big, TB_GZIP);
	for (int i = 0; i < 200; i++) {
		char name[64];
		snprintf(name, sizeof(name), "io.triton.cache/d%03d/blob", i);
		tb_fill(&big, name, 20000, 'a' + i % 26);
	}
	tb_end(&big);
	pid_t pid = start_stalled_pull(f, &big);

	/* While the pull is alive, its temp dir is not a leftover. */
	assert_int_equal(count_dir(f->root, "tmp"), 1);
	assert_false(present_on_disk(f, D3, ""));
	struct store *s2;
	assert_int_equal(store_open(f->root, &s2), 0);
	assert_int_equal(count_dir(f->root, "tmp"), 1);
	assert_int_equal(store_lookup(s2, D3, NULL), -ENOENT);
	store_close(s2);
	/* Same digest without waiting: busy. */
	struct store_txn *tx;
	assert_int_equal(store_begin(f->s, D3, NULL, STORE_NOWAIT, &tx), -EWOULDBLOCK);

	kill(pid, SIGKILL);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));

	/* Half a tree sits in tmp/, nothing under the digest's name. */
	assert_int_equal(count_dir(f->root, "tmp"), 1);
	assert_false(present_on_disk(f, D3, ""));
	assert_int_equal(store_lookup(f->s, D3, NULL), -ENOENT);
	/* Start-up cleans it; then the pull works. */
	assert_int_equal(store_open(f->root, &s2), 0);
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	char err[512];
	assert_int_equal(pull(s2, D3, &big, 0, NULL, err, sizeof(err)), 0);
	assert_true(present_on_disk(f, D3, "io.triton.cache/d199/blob"));
	store_close(s2);
	tb_free(&big);
}

static void test_open_cleans_inconsistent_entries(void **state)
{
	struct fx *f = *state;
	char err[512], p[600];
	assert_int_equal(pull(f->s, D1, &f->layer, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(pull(f->s, D2, &f->layer, 0, NULL, err, sizeof(err)), 0);
	/* crash between writing metadata and the rename: metadata without tree */
	snprintf(p, sizeof(p), "%s/meta/sha256-%s.json", f->root, D3 + 7);
	FILE *m = fopen(p, "w");
	fputs("{}", m);
	fclose(m);
	/* a tree nobody committed */
	snprintf(p, sizeof(p), "%s/meta/sha256-%s.json", f->root, D2 + 7);
	assert_int_equal(unlink(p), 0);
	/* a stray metadata temp file */
	snprintf(p, sizeof(p), "%s/meta/sha256-%s.json.tmp", f->root, D1 + 7);
	m = fopen(p, "w");
	fclose(m);
	struct store *s2;
	assert_int_equal(store_open(f->root, &s2), 0);
	assert_int_equal(count_dir(f->root, "meta"), 1);
	assert_int_equal(count_dir(f->root, "sha256"), 1);
	assert_int_equal(store_lookup(s2, D1, NULL), 0);
	assert_int_equal(store_lookup(s2, D2, NULL), -ENOENT);
	assert_int_equal(store_lookup(s2, D3, NULL), -ENOENT);
	store_close(s2);
}

/* ---- concurrency ---- */

struct racer {
	struct fx *f;
	int rc;
};

static void *race_thread(void *arg)
{
	struct racer *r = arg;
	char err[512];
	r->rc = pull(r->f->s, D1, &r->f->layer, 0, NULL, err, sizeof(err));
	return NULL;
}

static void test_concurrent_same_digest_threads(void **state)
{
	struct fx *f = *state;
	struct racer r[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		r[i] = (struct racer){f, 1};
		assert_int_equal(pthread_create(&th[i], NULL, race_thread, &r[i]), 0);
	}
	int committed = 0, existed = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		committed += r[i].rc == 0;
		existed += r[i].rc == -EEXIST;
	}
	assert_int_equal(committed, 1);
	assert_int_equal(existed, 3);
	assert_true(present_on_disk(f, D1, "io.triton.cache/K/k.cubin"));
	assert_int_equal(count_dir(f->root, "tmp"), 0);
}

static void test_concurrent_same_digest_processes(void **state)
{
	struct fx *f = *state;
	struct tb big;
	tb_begin(&big, TB_GZIP);
	for (int i = 0; i < 50; i++) {
		char name[64];
		snprintf(name, sizeof(name), "d/%02d", i);
		tb_fill(&big, name, 40000, 'a' + i % 26);
	}
	tb_end(&big);
	pid_t pids[4];
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			struct store *s;
			char err[512];
			if (store_open(f->root, &s) < 0)
				_exit(9);
			int rc = pull(s, D2, &big, 0, NULL, err, sizeof(err));
			_exit(rc == 0 ? 0 : rc == -EEXIST ? 1 : 8);
		}
	}
	int committed = 0, existed = 0;
	for (int i = 0; i < 4; i++) {
		int st;
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		assert_true(WIFEXITED(st));
		committed += WEXITSTATUS(st) == 0;
		existed += WEXITSTATUS(st) == 1;
	}
	assert_int_equal(committed, 1);
	assert_int_equal(existed, 3);
	struct store_entry_info info;
	assert_int_equal(store_lookup(f->s, D2, &info), 0);
	assert_int_equal(info.files, 50);
	assert_int_equal(info.bytes, 50 * 40000);
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	tb_free(&big);
}

/* ---- GC ---- */

static bool keep_d1(void *ctx, const char *digest)
{
	int *calls = ctx;
	(*calls)++;
	return strcmp(digest, D1) == 0;
}

static void test_gc_with_guard(void **state)
{
	struct fx *f = *state;
	char err[512];
	assert_int_equal(pull(f->s, D1, &f->layer, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(pull(f->s, D2, &f->layer, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(pull(f->s, D3, &f->layer, 0, NULL, err, sizeof(err)), 0);
	struct store_entry_info i2;
	assert_int_equal(store_lookup(f->s, D2, &i2), 0);

	/* Young entries survive a GC with a grace period, guard or not. */
	struct store_gc_stats g;
	int calls = 0;
	assert_int_equal(store_gc(f->s, keep_d1, &calls, 3600, &g), 0);
	assert_int_equal(g.kept, 3);
	assert_int_equal(g.removed, 0);
	assert_int_equal(calls, 0);

	/* D3 is busy: another process holds its lock. */
	char lock[600];
	snprintf(lock, sizeof(lock), "%s/locks/sha256-%s.lock", f->root, D3 + 7);
	int lfd = open(lock, O_RDWR | O_CREAT, 0600);
	assert_true(lfd >= 0);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(lock, O_RDWR);
		flock(fd, LOCK_EX);
		pause();
		_exit(0);
	}
	/* wait until the child holds it */
	for (int i = 0; i < 3000 && flock(lfd, LOCK_EX | LOCK_NB) == 0; i++) {
		flock(lfd, LOCK_UN);
		usleep(10000);
	}
	close(lfd);

	calls = 0;
	assert_int_equal(store_gc(f->s, keep_d1, &calls, 0, &g), 0);
	assert_int_equal(calls, 3);
	assert_int_equal(g.kept, 1);
	assert_int_equal(g.removed, 1);
	assert_int_equal(g.busy, 1);
	assert_int_equal(g.bytes_removed, i2.bytes);
	assert_int_equal(store_lookup(f->s, D1, NULL), 0);
	assert_int_equal(store_lookup(f->s, D2, NULL), -ENOENT);
	assert_false(present_on_disk(f, D2, ""));
	assert_int_equal(store_lookup(f->s, D3, NULL), 0);
	assert_int_equal(store_remove(f->s, D3), -EBUSY);

	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	assert_int_equal(store_remove(f->s, D3), 0);
	assert_int_equal(store_remove(f->s, D3), -ENOENT);
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	assert_int_equal(count_dir(f->root, "meta"), 1);
	/* the removed digest can be pulled again */
	assert_int_equal(pull(f->s, D2, &f->layer, 0, NULL, err, sizeof(err)), 0);
}

static int count_each(void *ctx, const struct store_entry_info *e)
{
	int *n = ctx;
	(*n)++;
	return e->files == 3 ? 0 : -EIO;
}

static void test_each(void **state)
{
	struct fx *f = *state;
	char err[512];
	assert_int_equal(pull(f->s, D1, &f->layer, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(pull(f->s, D3, &f->layer, 0, NULL, err, sizeof(err)), 0);
	int n = 0;
	assert_int_equal(store_each(f->s, count_each, &n), 0);
	assert_int_equal(n, 2);
}

static void test_read_only_tree_can_be_removed(void **state)
{
	/* Directories without write permission (0555) are kept from the layer;
	 * removal still works. */
	struct fx *f = *state;
	struct tb t;
	tb_begin(&t, TB_NONE);
	tb_dir(&t, "./", 0555, 0);
	tb_dir(&t, "ro", 0555, 0);
	tb_file(&t, "ro/f", 0444, "x", 0);
	tb_end(&t);
	char err[512];
	assert_int_equal(pull(f->s, D1, &t, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(store_remove(f->s, D1), 0);
	assert_int_equal(count_dir(f->root, "tmp"), 0);
	assert_int_equal(count_dir(f->root, "sha256"), 0);
	tb_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	    T(test_commit_and_lookup),
	    T(test_last_used),
	    T(test_second_pull_is_a_hit),
	    T(test_abort_leaves_nothing),
	    T(test_refused_layer_is_never_visible),
	    T(test_bad_digests),
	    T(test_crash_mid_extraction),
	    T(test_open_cleans_inconsistent_entries),
	    T(test_concurrent_same_digest_threads),
	    T(test_concurrent_same_digest_processes),
	    T(test_gc_with_guard),
	    T(test_each),
	    T(test_read_only_tree_can_be_removed),
#undef T
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
