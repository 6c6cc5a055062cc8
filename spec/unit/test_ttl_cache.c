/* The webhook's bounded expiring cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ttl_cache.h"

static void test_put_get_expire(void **state)
{
	(void)state;
	struct ttl_cache *c = NULL;
	char v[16];
	assert_int_equal(ttl_cache_new(0, &c), -EINVAL);
	assert_int_equal(ttl_cache_new(4, &c), 0);
	assert_int_equal(ttl_cache_get(c, "a", 0, v, sizeof(v)), -ENOENT);
	assert_int_equal(ttl_cache_put(c, "a", "one", 4, 100), 0);
	assert_int_equal(ttl_cache_get(c, "a", 99, v, sizeof(v)), 4);
	assert_string_equal(v, "one");
	/* replace */
	assert_int_equal(ttl_cache_put(c, "a", "two!", 5, 200), 0);
	assert_int_equal(ttl_cache_count(c), 1);
	assert_int_equal(ttl_cache_get(c, "a", 150, v, sizeof(v)), 5);
	assert_string_equal(v, "two!");
	/* expired entries are dropped on read */
	assert_int_equal(ttl_cache_get(c, "a", 200, v, sizeof(v)), -ENOENT);
	assert_int_equal(ttl_cache_count(c), 0);
	/* a short buffer gets a prefix, the size says how much there was */
	assert_int_equal(ttl_cache_put(c, "b", "0123456789", 10, 1000), 0);
	memset(v, 0, sizeof(v));
	assert_int_equal(ttl_cache_get(c, "b", 0, v, 3), 10);
	assert_string_equal(v, "012");
	ttl_cache_remove(c, "b");
	assert_int_equal(ttl_cache_get(c, "b", 0, v, sizeof(v)), -ENOENT);
	ttl_cache_free(c);
}

static void test_least_recently_used_goes_first(void **state)
{
	(void)state;
	struct ttl_cache *c = NULL;
	char v[8], k[16];
	assert_int_equal(ttl_cache_new(3, &c), 0);
	assert_int_equal(ttl_cache_put(c, "a", "1", 2, 1000), 0);
	assert_int_equal(ttl_cache_put(c, "b", "2", 2, 1000), 0);
	assert_int_equal(ttl_cache_put(c, "c", "3", 2, 1000), 0);
	assert_int_equal(ttl_cache_get(c, "a", 0, v, sizeof(v)), 2); /* a is now the newest */
	assert_int_equal(ttl_cache_put(c, "d", "4", 2, 1000), 0);    /* evicts b */
	assert_int_equal(ttl_cache_count(c), 3);
	assert_int_equal(ttl_cache_get(c, "b", 0, v, sizeof(v)), -ENOENT);
	assert_int_equal(ttl_cache_get(c, "a", 0, v, sizeof(v)), 2);
	assert_int_equal(ttl_cache_get(c, "c", 0, v, sizeof(v)), 2);
	assert_int_equal(ttl_cache_get(c, "d", 0, v, sizeof(v)), 2);
	/* many keys through a small cache: bounded, the newest survive */
	for (int i = 0; i < 1000; i++) {
		snprintf(k, sizeof(k), "k%d", i);
		assert_int_equal(ttl_cache_put(c, k, &i, sizeof(i), 5000), 0);
	}
	assert_int_equal(ttl_cache_count(c), 3);
	int got = 0;
	assert_int_equal(ttl_cache_get(c, "k999", 0, &got, sizeof(got)), (long)sizeof(got));
	assert_int_equal(got, 999);
	assert_int_equal(ttl_cache_get(c, "k996", 0, &got, sizeof(got)), -ENOENT);
	ttl_cache_clear(c);
	assert_int_equal(ttl_cache_count(c), 0);
	ttl_cache_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_put_get_expire),
	    cmocka_unit_test(test_least_recently_used_goes_first),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
