/* The untrusted walk of a capture (cache_scan_dir with rules): caps counted
 * while directories are read, what is refused and why, files unchanged from
 * a base left out, the stamp that tells two walks apart; and
 * cache_tree_unite, which merges trees and names a path with two contents. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache_capture.h"
#include "cache_image.h"
#include "cache_tree.h"
#include "shell.h"

#define KERNEL                                                                                     \
	"{\"hash\":\"h\",\"name\":\"k\",\"target\":{\"backend\":\"cuda\",\"arch\":75,\"warp_"      \
	"size\":32}}"

static char root[512], dir[600], base[600];

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof(root), "%s/gkm-capture.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(root))
		return -1;
	snprintf(dir, sizeof(dir), "%s/cache", root);
	snprintf(base, sizeof(base), "%s/base", root);
	sh("mkdir -p '%s/K' '%s/K' && printf '%%s' '" KERNEL "' >'%s/K/k.json' && "
	   "cp '%s/K/k.json' '%s/K/k.json' && echo bin >'%s/K/k.cubin'",
	   dir, base, dir, dir, base, dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : -1;
}

/* Scan dir with the default capture rules (changed by the caller). */
static int scan(const struct cache_walk_rules *r, struct cache_meta *m, struct oci_err *e)
{
	memset(e, 0, sizeof(*e));
	return cache_scan_dir(dir, CACHE_TRITON, r, true, m, e);
}

static void test_good_tree(void **state)
{
	(void)state;
	struct cache_walk_rules r;
	struct cache_meta m;
	struct oci_err e;
	cache_capture_rules_default(&r);
	assert_int_equal(scan(&r, &m, &e), 0);
	assert_int_equal(m.files, 2);
	assert_int_equal(m.entries, 1);
	assert_int_equal(cJSON_GetArraySize(m.targets), 1);
	uint64_t stamp = m.stamp;
	cache_meta_clear(&m);
	assert_int_equal(scan(&r, &m, &e), 0);
	assert_true(m.stamp == stamp); /* same tree, same stamp */
	cache_meta_clear(&m);
	sh("echo more >>'%s/K/k.cubin'", dir);
	assert_int_equal(scan(&r, &m, &e), 0);
	assert_true(m.stamp != stamp); /* a file grew */
	cache_meta_clear(&m);
}

static void test_caps(void **state)
{
	(void)state;
	struct cache_walk_rules r;
	struct cache_meta m;
	struct oci_err e;
	cache_capture_rules_default(&r);
	sh("mkdir '%s/many' && cd '%s/many' && touch a b c d e f g h i j", dir, dir);
	r.max_files = 5;
	assert_int_equal(scan(&r, &m, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "more than 5 files and directories"));
	r.max_files = 100;
	r.max_bytes = 10;
	sh("head -c 11 /dev/zero >'%s/many/big'", dir);
	assert_int_equal(scan(&r, &m, &e), -EFBIG);
	assert_non_null(strstr(e.msg, "byte cap of 10"));
	r.max_bytes = 0;
	sh("truncate -s 20G '%s/many/sparse'", dir);
	r.max_bytes = 1ull << 30;
	assert_int_equal(scan(&r, &m, &e), -EFBIG); /* a sparse file counts its size */
	assert_non_null(strstr(e.msg, "many/sparse (21474836480 bytes)"));
}

static void refused(const char *make, const char *want)
{
	struct cache_walk_rules r;
	struct cache_meta m;
	struct oci_err e;
	cache_capture_rules_default(&r);
	sh("cd '%s/K' && %s", dir, make);
	assert_int_equal(scan(&r, &m, &e), -EPERM);
	if (!strstr(e.msg, want))
		fail_msg("'%s' does not say '%s'", e.msg, want);
	sh("cd '%s/K' && rm -f x", dir);
}

static void test_refusals(void **state)
{
	(void)state;
	refused("ln -s /etc/passwd x", "K/x: a symlink (to '/etc/passwd')");
	refused("ln -s k.json x", "a symlink (to 'k.json')");
	refused("mkfifo x", "K/x: a FIFO");
	refused("echo a >x && chmod 2755 x", "set-group-ID");
	refused("ln k.cubin x", "2 names (hard links)");
	if (geteuid() == 0) {
		refused("mknod x c 1 3", "K/x: a character device");
		refused("mknod x c 0 0", "K/x: it was deleted from the base cache");
	}
}

static void test_unchanged_from_base(void **state)
{
	(void)state;
	struct cache_walk_rules r;
	struct cache_meta m;
	struct oci_err e;
	cache_capture_rules_default(&r);
	r.unchanged_from = base;
	assert_int_equal(scan(&r, &m, &e), 0);
	assert_int_equal(m.files, 1); /* k.json is the base's; k.cubin is new */
	assert_int_equal(m.entries, 0);
	cache_meta_clear(&m);
	sh("printf ' ' >>'%s/K/k.json'", dir); /* same path, other bytes: captured */
	assert_int_equal(scan(&r, &m, &e), 0);
	assert_int_equal(m.files, 2);
	cache_meta_clear(&m);
}

static void test_unite(void **state)
{
	(void)state;
	struct oci_err e = {{0}};
	char into[700];
	snprintf(into, sizeof(into), "%s/into", root);
	sh("mkdir '%s'", into);
	assert_int_equal(cache_tree_unite(dir, into, "A", &e), 0);
	assert_int_equal(cache_tree_unite(base, into, "B", &e), 0); /* k.json: same bytes */
	assert_int_equal(cache_tree_unite(dir, into, "A again", &e), 0);
	sh("cmp '%s/K/k.cubin' '%s/K/k.cubin'", dir, into);
	sh("echo other >'%s/K/k.cubin'", base);
	assert_int_equal(cache_tree_unite(base, into, "B2", &e), -EEXIST);
	assert_string_equal(e.msg,
	                    "K/k.cubin has other contents in B2 than in the trees before it");
	sh("rm -rf '%s/K' && echo file >'%s/K'", base, base);
	memset(&e, 0, sizeof(e));
	assert_int_equal(cache_tree_unite(base, into, "B3", &e), -EEXIST);
	assert_non_null(strstr(e.msg, "K is a file in B3 and a directory"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_good_tree, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_caps, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unchanged_from_base, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unite, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
