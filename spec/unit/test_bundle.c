/* Policy bundles from directories and ConfigMap data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"

static void write_file(const char *dir, const char *name, const char *content)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(content, f);
	fclose(f);
}

static void test_dir_overlays_builtin(void **state)
{
	(void)state;
	char dir[] = "/tmp/gkm-bundle-XXXXXX";
	char err[256];
	struct bundle *b = NULL, *builtin = NULL;
	assert_non_null(mkdtemp(dir));
	write_file(dir, "admission.lua",
	           "return { evaluate = function() return {allowed=true} end }");
	write_file(dir, "extra.lua", "return {}");
	write_file(dir, "README.md", "ignored");
	assert_int_equal(bundle_from_dir(dir, &b, err, sizeof(err)), 0);
	assert_int_equal(bundle_builtin(&builtin), 0);
	const struct bundle_file *f = bundle_get(b, "admission.lua");
	assert_non_null(f);
	assert_non_null(strstr(f->source, "allowed=true"));
	assert_non_null(bundle_get(b, "extra.lua"));
	assert_null(bundle_get(b, "README.md"));
	assert_string_not_equal(b->digest, builtin->digest);
	assert_int_equal(strncmp(b->digest, "sha256:", 7), 0);
	assert_int_equal(strlen(b->digest), 71);

	/* the digest depends on content only, not on load order */
	struct bundle *again = NULL;
	assert_int_equal(bundle_from_dir(dir, &again, err, sizeof(err)), 0);
	assert_string_equal(b->digest, again->digest);
	bundle_free(again);
	bundle_free(b);
	bundle_free(builtin);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_dir_errors_name_the_problem(void **state)
{
	(void)state;
	char err[256];
	struct bundle *b = NULL;
	assert_int_equal(bundle_from_dir("/nonexistent/gkm", &b, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/gkm: cannot open policy directory"));
	char dir[] = "/tmp/gkm-bundle-XXXXXX";
	assert_non_null(mkdtemp(dir));
	assert_int_equal(bundle_from_dir(dir, &b, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "no *.lua policy files"));
	char sub[600];
	snprintf(sub, sizeof(sub), "%s/dir.lua", dir);
	assert_int_equal(mkdir(sub, 0755), 0);
	assert_int_equal(bundle_from_dir(dir, &b, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "dir.lua: not a regular file"));
	assert_null(b);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_map(void **state)
{
	(void)state;
	char err[256];
	struct bundle *b = NULL;
	cJSON *data = cJSON_Parse("{\"admission.lua\":\"return {}\",\"config.yaml\":\"x: 1\"}");
	assert_int_equal(bundle_from_map(data, &b, err, sizeof(err)), 0);
	assert_string_equal(bundle_get(b, "admission.lua")->source, "return {}");
	assert_null(bundle_get(b, "config.yaml"));
	bundle_free(b);
	cJSON_Delete(data);

	data = cJSON_Parse("{\"../x.lua\":\"return {}\"}");
	assert_int_equal(bundle_from_map(data, &b, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "../x.lua: not a valid policy file name"));
	cJSON_Delete(data);
	data = cJSON_Parse("{\"a.lua\":7}");
	assert_int_equal(bundle_from_map(data, &b, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "a.lua: value must be a string"));
	cJSON_Delete(data);
	data = cJSON_Parse("[1]");
	assert_int_equal(bundle_from_map(data, &b, err, sizeof(err)), -EINVAL);
	cJSON_Delete(data);
}

static void test_put_limits(void **state)
{
	(void)state;
	char err[256];
	struct bundle *b = NULL;
	assert_int_equal(bundle_builtin(&b), 0);
	assert_int_equal(bundle_put(b, "nul.lua", "a\0b", 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "NUL byte"));
	size_t big = (1u << 20) + 1;
	char *src = calloc(1, big);
	memset(src, ' ', big);
	assert_int_equal(bundle_put(b, "big.lua", src, big, err, sizeof(err)), -EFBIG);
	free(src);
	bundle_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_dir_overlays_builtin),
	    cmocka_unit_test(test_dir_errors_name_the_problem),
	    cmocka_unit_test(test_map),
	    cmocka_unit_test(test_put_limits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
