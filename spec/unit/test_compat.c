/* The C side of the compat policy: reading a cache's targets from labels,
 * manifests and the real caches' kernel JSON (spec/fixtures/compat/caches),
 * the hook's validator, and one evaluation of the built-in policy through the engine. */
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
#include "hook_compat.h"
#include "compat_targets.h"
#include "engine.h"

static char caches[1024];

static cJSON *parse(const char *s)
{
	cJSON *j = cJSON_Parse(s);
	assert_non_null(j);
	return j;
}

static void assert_json(const cJSON *got, const char *want)
{
	cJSON *w = parse(want);
	if (!cJSON_Compare(got, w, true)) {
		char *g = cJSON_PrintUnformatted(got);
		fail_msg("got %s\nwant %s", g, want);
	}
	cJSON_Delete(w);
}

static void from_dir(const char *name, const char *want)
{
	char path[1200], err[512] = "";
	snprintf(path, sizeof(path), "%s/%s", caches, name);
	cJSON *t = NULL;
	int r = compat_targets_from_dir(path, &t, err, sizeof(err));
	if (r != 0)
		fail_msg("%s: %d %s", name, r, err);
	assert_json(t, want);
	cJSON_Delete(t);
}

static void test_targets_from_real_caches(void **state)
{
	(void)state;
	from_dir("triton-cuda-sm75", "[{\"backend\":\"cuda\",\"arch\":75,\"warp_size\":32}]");
	from_dir("triton-hip-gfx90a",
	         "[{\"backend\":\"hip\",\"arch\":\"gfx90a\",\"warp_size\":64}]");
	/* five kernels below torch_compile_cache/.../triton_cache, one target */
	from_dir("vllm-hip-gfx90a", "[{\"backend\":\"hip\",\"arch\":\"gfx90a\",\"warp_size\":64}]");
	/* a binary cache: device and CUDA version, no arch (the policy says UnknownTarget) */
	from_dir("vllm-binary-llama", "[{\"backend\":\"cuda\",\"cuda_version\":\"12.9\"}]");
}

static void write_file(const char *dir, const char *rel, const char *text)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	for (char *p = path + strlen(dir) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0755);
		*p = '/';
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_targets_from_manifest(void **state)
{
	(void)state;
	char dir[] = "/tmp/gkm-compat.XXXXXX";
	assert_non_null(mkdtemp(dir));
	/* an MCV triton manifest: flat entries, ptx_version kept, duplicates folded */
	write_file(dir, "io.triton.manifest/manifest.json",
	           "{\"triton\":[{\"hash\":\"a\",\"ptx_version\":84,\"backend\":\"cuda\","
	           "\"arch\":90,\"warp_size\":32},{\"hash\":\"b\",\"ptx_version\":84,"
	           "\"backend\":\"cuda\",\"arch\":90,\"warp_size\":32},{\"hash\":\"c\","
	           "\"backend\":\"cuda\",\"arch\":80,\"warp_size\":32}]}");
	/* kernel JSON below is not read when the manifest has targets */
	write_file(dir, "io.triton.cache/H/k.json",
	           "{\"target\":{\"backend\":\"hip\",\"arch\":\"gfx942\",\"warp_size\":64}}");
	cJSON *t = NULL;
	char err[256] = "";
	assert_int_equal(compat_targets_from_dir(dir, &t, err, sizeof(err)), 0);
	assert_json(t, "[{\"backend\":\"cuda\",\"arch\":90,\"warp_size\":32,\"ptx_version\":84},"
	               "{\"backend\":\"cuda\",\"arch\":80,\"warp_size\":32}]");
	cJSON_Delete(t);

	/* a vLLM manifest with triton and binary entries */
	write_file(dir, "io.triton.manifest/manifest.json", "{\"triton\":[]}");
	write_file(
	    dir, "io.vllm.manifest/manifest.json",
	    "{\"vllm\":[{\"vllmHash\":\"h\",\"cacheFormat\":\"binary\",\"binary\":[{\"rank\":"
	    "\"rank_0_0\",\"env\":{\"VLLM_TARGET_DEVICE\":\"cuda\","
	    "\"VLLM_MAIN_CUDA_VERSION\":\"12.8\"}}]},{\"vllmHash\":\"i\",\"triton\":[{"
	    "\"backend\":\"hip\",\"arch\":\"gfx942\",\"warp_size\":64}]}]}");
	assert_int_equal(compat_targets_from_dir(dir, &t, err, sizeof(err)), 0);
	assert_json(t, "[{\"backend\":\"cuda\",\"cuda_version\":\"12.8\"},"
	               "{\"backend\":\"hip\",\"arch\":\"gfx942\",\"warp_size\":64}]");
	cJSON_Delete(t);

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_targets_from_dir_errors(void **state)
{
	(void)state;
	char dir[] = "/tmp/gkm-compat.XXXXXX";
	assert_non_null(mkdtemp(dir));
	cJSON *t = NULL;
	char err[512] = "";
	/* nothing but junk and group files: no metadata, said so */
	write_file(dir, "X/__grp__k.json", "{\"target\":{\"backend\":\"cuda\",\"arch\":90}}");
	write_file(dir, "X/k.json", "{not json");
	write_file(dir, "X/k.ptx", "//");
	assert_int_equal(compat_targets_from_dir(dir, &t, err, sizeof(err)), -ENOENT);
	assert_null(t);
	assert_non_null(strstr(err, "no target metadata"));

	/* a link to metadata outside the cache is not followed */
	char link[1200];
	snprintf(link, sizeof(link), "%s/X/link.json", dir);
	char target[1200];
	snprintf(target, sizeof(target),
	         "%s/triton-cuda-sm75/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/"
	         "add_kernel.json",
	         caches);
	assert_int_equal(symlink(target, link), 0);
	assert_int_equal(compat_targets_from_dir(dir, &t, err, sizeof(err)), -ENOENT);

	/* more distinct targets than a cache may have (in one manifest: creating
	 * thousands of files is slow on some file systems) */
	size_t cap = (COMPAT_TARGETS_MAX + 1) * 48 + 32, used = 0;
	char *m = malloc(cap);
	assert_non_null(m);
	used += (size_t)snprintf(m, cap, "{\"triton\":[");
	for (int i = 0; i < COMPAT_TARGETS_MAX + 1; i++)
		used += (size_t)snprintf(m + used, cap - used,
		                         "%s{\"backend\":\"cuda\",\"arch\":%d}", i ? "," : "", i);
	snprintf(m + used, cap - used, "]}");
	write_file(dir, "io.triton.manifest/manifest.json", m);
	free(m);
	assert_int_equal(compat_targets_from_dir(dir, &t, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "more than 4096 distinct targets"));

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);

	assert_int_equal(compat_targets_from_dir("/nonexistent", &t, err, sizeof(err)), -ENOENT);
}

static void test_targets_from_labels(void **state)
{
	(void)state;
	cJSON *labels =
	    parse("{\"cache.triton.image/entry-count\":\"1\",\"cache.triton.image/summary\":"
	          "\"{\\\"targets\\\":[{\\\"backend\\\":\\\"hip\\\",\\\"arch\\\":\\\"gfx90a\\\","
	          "\\\"warp_size\\\":64},{\\\"backend\\\":\\\"hip\\\",\\\"arch\\\":\\\"gfx90a\\\","
	          "\\\"warp_size\\\":64}]}\"}");
	cJSON *t = NULL;
	char err[256] = "";
	assert_int_equal(compat_targets_from_labels(labels, &t, err, sizeof(err)), 0);
	assert_json(t, "[{\"backend\":\"hip\",\"arch\":\"gfx90a\",\"warp_size\":64}]");
	cJSON_Delete(t);
	cJSON_Delete(labels);

	labels = parse("{\"cache.vllm.image/summary\":\"{\\\"targets\\\":[{\\\"backend\\\":"
	               "\\\"cuda\\\",\\\"arch\\\":\\\"90\\\",\\\"warp_size\\\":32,"
	               "\\\"cuda_version\\\":\\\"12.9\\\"}]}\"}");
	assert_int_equal(compat_targets_from_labels(labels, &t, err, sizeof(err)), 0);
	assert_json(t, "[{\"backend\":\"cuda\",\"arch\":\"90\",\"warp_size\":32,"
	               "\"cuda_version\":\"12.9\"}]");
	cJSON_Delete(t);
	cJSON_Delete(labels);

	static const struct {
		const char *labels;
		int rc;
		const char *err;
	} bad[] = {
	    {"{\"org.opencontainers.image.title\":\"x\"}", -ENOENT,
	     "no cache.triton.image/summary"},
	    {"{\"cache.triton.image/summary\":7}", -EINVAL, "not a string"},
	    {"{\"cache.triton.image/summary\":\"{targets\"}", -EINVAL, "invalid JSON"},
	    {"{\"cache.triton.image/summary\":\"[]\"}", -EINVAL, "want {\\\"targets\\\": [...]}"},
	    {"{\"cache.triton.image/summary\":\"{\\\"targets\\\":{}}\"}", -EINVAL, "targets"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		labels = parse(bad[i].labels);
		t = NULL;
		err[0] = '\0';
		assert_int_equal(compat_targets_from_labels(labels, &t, err, sizeof(err)),
		                 bad[i].rc);
		assert_null(t);
		if (!strstr(err, bad[i].err) && !strstr(err, "targets"))
			fail_msg("case %zu: '%s'", i, err);
		cJSON_Delete(labels);
	}
}

static const char *validate(const char *result)
{
	static char err[256];
	const struct engine_hook *h = engine_hook_find("compat");
	assert_non_null(h);
	cJSON *r = parse(result);
	err[0] = '\0';
	int rc = h->validate(r, err, sizeof(err));
	cJSON_Delete(r);
	return rc == 0 ? NULL : err;
}

static void test_validator(void **state)
{
	(void)state;
	assert_null(validate("{\"gpus\":[]}"));
	assert_null(validate("{\"gpus\":{}}")); /* an empty Lua table */
	assert_null(validate("{\"gpus\":[{\"index\":0,\"compatible\":true,\"reason\":"
	                     "\"Compatible\",\"message\":\"m\"},{\"index\":1,\"compatible\":false,"
	                     "\"reason\":\"ArchitectureMismatch\",\"message\":\"m\"}]}"));
	assert_non_null(strstr(validate("[]"), "list 'gpus'"));
	assert_non_null(strstr(validate("{\"gpus\":[{\"compatible\":true}]}"), "integer 'index'"));
	assert_non_null(strstr(validate("{\"gpus\":[{\"index\":1.5,\"compatible\":true}]}"),
	                       "integer 'index'"));
	assert_non_null(strstr(validate("{\"gpus\":[{\"index\":0,\"compatible\":1}]}"),
	                       "boolean 'compatible'"));
	assert_non_null(
	    strstr(validate("{\"gpus\":[{\"index\":0,\"compatible\":false}]}"), "'reason'"));
	assert_non_null(strstr(validate("{\"gpus\":[{\"index\":0,\"compatible\":false,\"reason\":"
	                                "\"Arch\",\"message\":7}]}"),
	                       "'message'"));
	assert_non_null(strstr(validate("{\"gpus\":[{\"index\":0,\"compatible\":true,\"reason\":"
	                                "\"not camel\"}]}"),
	                       "CamelCase"));
	assert_non_null(strstr(validate("{\"gpus\":[{\"index\":2,\"compatible\":true},{\"index\":2,"
	                                "\"compatible\":true}]}"),
	                       "index 2 appears twice"));
	/* more verdicts than any node has GPUs */
	cJSON *big = parse("{\"gpus\":[]}");
	cJSON *arr = cJSON_GetObjectItem(big, "gpus");
	for (int i = 0; i <= COMPAT_MAX_VERDICTS; i++) {
		cJSON *v = cJSON_CreateObject();
		cJSON_AddNumberToObject(v, "index", i);
		cJSON_AddBoolToObject(v, "compatible", 1);
		cJSON_AddItemToArray(arr, v);
	}
	char err[256];
	assert_int_equal(engine_hook_find("compat")->validate(big, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "more than 1024"));
	cJSON_Delete(big);
}

/* What the agent does: targets from the cache, inventory, built-in policy. */
static void test_builtin_policy(void **state)
{
	(void)state;
	char path[1200], err[512] = "";
	snprintf(path, sizeof(path), "%s/triton-hip-gfx90a", caches);
	cJSON *targets = NULL;
	assert_int_equal(compat_targets_from_dir(path, &targets, err, sizeof(err)), 0);
	cJSON *input =
	    parse("{\"cache\":{\"name\":\"default/vector-add\"},\"gpus\":["
	          "{\"index\":0,\"backend\":\"cuda\",\"arch\":\"sm_75\",\"name\":\"T4\"},"
	          "{\"index\":1,\"backend\":\"hip\",\"arch\":\"gfx90a\",\"name\":\"MI210\"},"
	          "{\"index\":2,\"backend\":\"hip\",\"arch\":\"gfx90a\",\"name\":\"MI210\"}]}");
	cJSON_AddItemToObject(cJSON_GetObjectItem(input, "cache"), "targets", targets);

	struct bundle *b = NULL;
	struct engine *e = NULL;
	struct engine_error ee;
	assert_int_equal(bundle_builtin(&b), 0);
	assert_int_equal(engine_new(b, NULL, &e, &ee), 0);
	cJSON *out = NULL;
	assert_int_equal(engine_call(e, "compat", input, &out, &ee), ENGINE_OK);
	assert_json(out, "{\"gpus\":[{\"index\":0,\"compatible\":false,\"reason\":"
	                 "\"BackendMismatch\",\"message\":\"the cache targets hip; the GPU runs "
	                 "cuda\"},{\"index\":1,\"compatible\":true,\"reason\":\"Compatible\","
	                 "\"message\":\"the cache has kernels for this GPU (MI210 gfx90a)\"},"
	                 "{\"index\":2,\"compatible\":true,\"reason\":\"Compatible\","
	                 "\"message\":\"the cache has kernels for this GPU (MI210 gfx90a)\"}]}");
	cJSON_Delete(out);
	cJSON_Delete(input);
	engine_unref(e);
	bundle_free(b);
}

int main(void)
{
	const char *root = getenv("GKM_ROOT") ? getenv("GKM_ROOT") : ".";
	snprintf(caches, sizeof(caches), "%s/spec/fixtures/compat/caches", root);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_targets_from_real_caches),
	    cmocka_unit_test(test_targets_from_manifest),
	    cmocka_unit_test(test_targets_from_dir_errors),
	    cmocka_unit_test(test_targets_from_labels),
	    cmocka_unit_test(test_validator),
	    cmocka_unit_test(test_builtin_policy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
