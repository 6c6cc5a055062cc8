/* The Node label key of a cache: short names as they are, long names cut and
 * hashed, and what is not a cluster name refused. The hashes below were
 * computed with another sha256 implementation (Python's hashlib). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "cache_label.h"

static const char *key_of(const char *ns, const char *name)
{
	static char buf[CACHE_LABEL_KEY_MAX];
	assert_int_equal(cache_label_key(ns, name, buf, sizeof(buf)), 0);
	return buf;
}

/* The name part of a key: at most 63 characters of [A-Za-z0-9._-], starting
 * and ending with an alphanumeric (what the API server accepts). */
static void assert_valid_name_part(const char *key)
{
	const char *p = strchr(key, '/');
	assert_non_null(p);
	p++;
	size_t n = strlen(p);
	assert_true(n >= 1 && n <= 63);
	assert_true(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", p[0]));
	assert_true(
	    strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", p[n - 1]));
	for (size_t i = 0; i < n; i++)
		assert_true(strchr(
		    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.", p[i]));
}

static void test_short_names(void **state)
{
	(void)state;
	assert_string_equal(key_of("team-a", "llama-3-triton"),
	                    "team-a.gkmcache.gkm.io/llama-3-triton");
	assert_string_equal(key_of(NULL, "shared.kernels"),
	                    "clustergkmcache.gkm.io/shared.kernels");
	assert_string_equal(key_of("", "x"), "clustergkmcache.gkm.io/x");
	char name63[64];
	memset(name63, 'n', 63);
	name63[63] = '\0';
	const char *k = key_of("ns", name63);
	assert_string_equal(strchr(k, '/') + 1, name63);
	/* the longest namespace still gives a key the API server takes */
	char ns63[64];
	memset(ns63, 'z', 63);
	ns63[63] = '\0';
	k = key_of(ns63, name63);
	assert_int_equal(strlen(k), 63 + strlen(".gkmcache.gkm.io/") + 63);
	assert_valid_name_part(k);
}

static void test_long_names_are_cut_and_hashed(void **state)
{
	(void)state;
	assert_string_equal(
	    key_of("team-a", "llama-3-70b-instruct-triton-kernels-for-h100-sxm-and-a100-80gb-pcie"),
	    "team-a.gkmcache.gkm.io/"
	    "llama-3-70b-instruct-triton-kernels-for-h100-s-7f9fbf887efcab4e");
	char name64[65];
	memset(name64, 'n', 64);
	name64[64] = '\0';
	const char *k = key_of(NULL, name64);
	assert_int_equal(strlen(strchr(k, '/') + 1), 63);
	assert_valid_name_part(k);
	/* a cut that ends in '-' or '.' is trimmed back to an alphanumeric */
	char buf[77];
	memset(buf, 'a', 44);
	memset(buf + 44, '-', 2);
	memset(buf + 46, 'c', 30);
	buf[76] = '\0';
	assert_string_equal(key_of("ns", buf),
	                    "ns.gkmcache.gkm.io/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-"
	                    "50e110ad9c625d24");
	memset(buf, 'a', 45);
	buf[45] = '.';
	assert_string_equal(key_of("ns", buf),
	                    "ns.gkmcache.gkm.io/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-"
	                    "831e7552d2eb9e26");
}

static void test_distinct_long_names_keep_distinct_keys(void **state)
{
	(void)state;
	char a[254], b[254], ka[CACHE_LABEL_KEY_MAX], kb[CACHE_LABEL_KEY_MAX];
	memset(a, 'q', 253);
	a[253] = '\0';
	memcpy(b, a, sizeof(a));
	b[252] = 'r'; /* same first 46 characters */
	assert_int_equal(cache_label_key("ns", a, ka, sizeof(ka)), 0);
	assert_int_equal(cache_label_key("ns", b, kb, sizeof(kb)), 0);
	assert_string_not_equal(ka, kb);
	assert_valid_name_part(ka);
	assert_valid_name_part(kb);
	/* the same name in two namespaces, and namespaced against cluster-scoped */
	assert_string_not_equal(key_of("a", "c"), "b.gkmcache.gkm.io/c");
	assert_string_equal(key_of("b", "c"), "b.gkmcache.gkm.io/c");
}

static void test_refuses_what_no_cluster_stores(void **state)
{
	(void)state;
	char out[CACHE_LABEL_KEY_MAX] = "untouched";
	char long_name[256], long_ns[65];
	memset(long_name, 'a', 254);
	long_name[254] = '\0';
	memset(long_ns, 'a', 64);
	long_ns[64] = '\0';
	const char *bad[][2] = {
	    {"ns", ""},     {"ns", "Upper"}, {"ns", "-lead"},   {"ns", "trail-"}, {"ns", "a..b"},
	    {"ns", "a/b"},  {"ns", "a_b"},   {"ns", long_name}, {"Team", "c"},    {"a.b", "c"},
	    {long_ns, "c"}, {"ns", "a b"},   {"ns", "a-.b"},    {"ns", ".a"},     {"ns", "a.-b"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (cache_label_key(bad[i][0], bad[i][1], out, sizeof(out)) != -EINVAL)
			fail_msg("'%s'/'%s' was not refused", bad[i][0], bad[i][1]);
	}
	assert_int_equal(cache_label_key("ns", NULL, out, sizeof(out)), -EINVAL);
	assert_int_equal(cache_label_key("ns", "c", out, 20), -ENOSPC);
	assert_string_equal(out, "untouched");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_short_names),
	    cmocka_unit_test(test_long_names_are_cut_and_hashed),
	    cmocka_unit_test(test_distinct_long_names_keep_distinct_keys),
	    cmocka_unit_test(test_refuses_what_no_cluster_stores),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
