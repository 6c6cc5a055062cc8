/* The variables a runtime needs to read a cache image: from its labels,
 * and the annotation form the webhook records on the cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cache_env.h"

static cJSON *parse(const char *text)
{
	cJSON *j = cJSON_Parse(text);
	assert_non_null(j);
	return j;
}

/* MCV's label first, then gkm's format. */
static void test_trees_from_labels(void **state)
{
	(void)state;
	struct cache_env_tree t[CACHE_ENV_TREES_MAX];
	cJSON *labels = parse("{\"io.kserve.km/cache-root-env\":"
	                      "\"VLLM_CACHE_ROOT=/home/kserve/.cache/vllm\","
	                      "\"io.kserve.km/cache-mount-subpath\":\"/cache/vllm/\","
	                      "\"cache.triton.image/entry-count\":\"3\"}");
	assert_int_equal(cache_env_trees(labels, t, CACHE_ENV_TREES_MAX), 2);
	assert_string_equal(t[0].variable, "VLLM_CACHE_ROOT");
	assert_string_equal(t[0].subpath, "cache/vllm");
	assert_string_equal(t[1].variable, "TRITON_CACHE_DIR");
	assert_string_equal(t[1].subpath, "io.triton.cache");
	assert_int_equal(cache_env_trees(labels, t, 1), 1);
	assert_int_equal(cache_env_trees(labels, t, 0), 0);
	cJSON_Delete(labels);
	/* the label and the format name the same variable: once */
	labels = parse("{\"io.kserve.km/cache-root-env\":\"VLLM_CACHE_ROOT=/v\","
	               "\"cache.vllm.image/summary\":\"{}\"}");
	assert_int_equal(cache_env_trees(labels, t, CACHE_ENV_TREES_MAX), 1);
	assert_int_equal(cache_format_of_labels(labels), CACHE_VLLM);
	cJSON_Delete(labels);
	/* not a variable name, a path that climbs out: nothing */
	labels = parse("{\"io.kserve.km/cache-root-env\":\"1BAD=/x\"}");
	assert_int_equal(cache_env_trees(labels, t, CACHE_ENV_TREES_MAX), 0);
	cJSON_Delete(labels);
	labels = parse("{\"io.kserve.km/cache-root-env\":\"X=/x\","
	               "\"io.kserve.km/cache-mount-subpath\":\"a/../../etc\"}");
	assert_int_equal(cache_env_trees(labels, t, CACHE_ENV_TREES_MAX), 0);
	cJSON_Delete(labels);
	assert_int_equal(cache_env_trees(NULL, t, CACHE_ENV_TREES_MAX), 0);
	assert_int_equal(cache_format_of_labels(NULL), CACHE_AUTO);
	/* the size the files take, for the store's free-space check */
	labels = parse("{\"cache.triton.image/entry-count\":\"1\","
	               "\"cache.triton.image/cache-size-bytes\":\"41943040\"}");
	assert_true(cache_env_size_bytes(labels) == 41943040ull);
	cJSON_Delete(labels);
	labels = parse("{\"cache.triton.image/entry-count\":\"1\","
	               "\"cache.triton.image/cache-size-bytes\":\"12x\"}");
	assert_true(cache_env_size_bytes(labels) == 0);
	cJSON_Delete(labels);
	assert_true(cache_env_size_bytes(NULL) == 0);
}

/* The annotation form, written and read back; bad entries are left out. */
static void test_annotation_round_trip(void **state)
{
	(void)state;
	struct cache_env_tree t[2] = {{"TRITON_CACHE_DIR", "io.triton.cache"},
	                              {"VLLM_CACHE_ROOT", ""}};
	struct cache_env_tree back[CACHE_ENV_TREES_MAX];
	char text[CACHE_ENV_TEXT_MAX];
	cache_env_format(t, 2, text, sizeof(text));
	assert_string_equal(text, "TRITON_CACHE_DIR=io.triton.cache,VLLM_CACHE_ROOT=");
	assert_int_equal(cache_env_parse(text, back, CACHE_ENV_TREES_MAX), 2);
	assert_string_equal(back[0].subpath, "io.triton.cache");
	assert_string_equal(back[1].variable, "VLLM_CACHE_ROOT");
	assert_string_equal(back[1].subpath, "");
	cache_env_format(t, 0, text, sizeof(text));
	assert_string_equal(text, "");
	assert_int_equal(cache_env_parse("", back, CACHE_ENV_TREES_MAX), 0);
	/* too small for the second entry: no half entry */
	char small[40];
	cache_env_format(t, 2, small, sizeof(small));
	assert_string_equal(small, "TRITON_CACHE_DIR=io.triton.cache");
	assert_int_equal(
	    cache_env_parse("A=x,no-equals,B-C=y,D=../up,A=again,E=/e/", back, CACHE_ENV_TREES_MAX),
	    2);
	assert_string_equal(back[0].variable, "A");
	assert_string_equal(back[1].variable, "E");
	assert_string_equal(back[1].subpath, "e");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_trees_from_labels),
	    cmocka_unit_test(test_annotation_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
