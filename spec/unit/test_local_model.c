/* Kernel caches in KServe's local model storage, the agent's side: which
 * nodes a LocalModelCache's node groups take (node affinity as Kubernetes
 * reads it), and the copy into <path>/kernel-caches/<name>/, refused below
 * a symlink, replaced whole, removed. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "shell.h"

#include "local_model.h"

static char dir[256];

static cJSON *cache_with(const char *groups)
{
	char text[4096];
	snprintf(text, sizeof(text),
	         "{\"spec\":{\"image\":\"r/c:v1\",\"localModel\":{\"cacheName\":\"llama\","
	         "\"nodeGroups\":%s}}}",
	         groups);
	cJSON *c = cJSON_Parse(text);
	assert_non_null(c);
	return c;
}

static bool here(const char *groups, const char *node, const char *labels, char *path)
{
	cJSON *c = cache_with(groups), *l = labels ? cJSON_Parse(labels) : NULL;
	bool r = local_model_here(c, node, l, path, 4096);
	cJSON_Delete(c);
	cJSON_Delete(l);
	return r;
}

static void test_affinity(void **state)
{
	(void)state;
	char path[4096] = "";
	const char *gpu = "[{\"name\":\"g\",\"path\":\"/models\",\"nodeSelectorTerms\":[{"
	                  "\"matchExpressions\":[{\"key\":\"pool\",\"operator\":\"In\","
	                  "\"values\":[\"gpu\",\"a100\"]}]}]}]";
	assert_true(here(gpu, "n1", "{\"pool\":\"a100\"}", path));
	assert_string_equal(path, "/models");
	assert_false(here(gpu, "n1", "{\"pool\":\"cpu\"}", path));
	assert_false(here(gpu, "n1", "{}", path));
	assert_false(here(gpu, "n1", NULL, path)); /* labels not read yet */
	/* terms are ORed, requirements ANDed */
	const char *two = "[{\"name\":\"g\",\"path\":\"/m\",\"nodeSelectorTerms\":["
	                  "{\"matchExpressions\":[{\"key\":\"a\",\"operator\":\"Exists\"},"
	                  "{\"key\":\"b\",\"operator\":\"DoesNotExist\"}]},"
	                  "{\"matchFields\":[{\"key\":\"metadata.name\",\"operator\":\"In\","
	                  "\"values\":[\"special\"]}]}]}]";
	assert_true(here(two, "n1", "{\"a\":\"1\"}", path));
	assert_false(here(two, "n1", "{\"a\":\"1\",\"b\":\"2\"}", path));
	assert_true(here(two, "special", "{\"b\":\"2\"}", path));
	const char *gt = "[{\"name\":\"g\",\"path\":\"/m\",\"nodeSelectorTerms\":[{"
	                 "\"matchExpressions\":[{\"key\":\"gpus\",\"operator\":\"Gt\","
	                 "\"values\":[\"4\"]},{\"key\":\"zone\",\"operator\":\"NotIn\","
	                 "\"values\":[\"z9\"]}]}]}]";
	assert_true(here(gt, "n", "{\"gpus\":\"8\"}", path));
	assert_false(here(gt, "n", "{\"gpus\":\"2\"}", path));
	assert_false(here(gt, "n", "{\"gpus\":\"8x\"}", path));
	assert_false(here(gt, "n", "{\"gpus\":\"8\",\"zone\":\"z9\"}", path));
	/* an unknown operator selects nothing; no affinity: every node; an
	 * empty list of terms: none; a relative path: never */
	assert_false(here("[{\"name\":\"g\",\"path\":\"/m\",\"nodeSelectorTerms\":[{"
	                  "\"matchExpressions\":[{\"key\":\"a\",\"operator\":\"Near\"}]}]}]",
	                  "n", "{\"a\":\"1\"}", path));
	assert_true(here("[{\"name\":\"g\",\"path\":\"/any\"}]", "n", "{}", path));
	assert_string_equal(path, "/any");
	assert_false(
	    here("[{\"name\":\"g\",\"path\":\"/m\",\"nodeSelectorTerms\":[]}]", "n", "{}", path));
	assert_false(here("[{\"name\":\"g\",\"path\":\"models\"}]", "n", "{}", path));
	/* the first group that takes the node gives the path */
	assert_true(here("[{\"name\":\"a\",\"path\":\"/a\",\"nodeSelectorTerms\":[]},"
	                 "{\"name\":\"b\",\"path\":\"/b\"}]",
	                 "n", "{}", path));
	assert_string_equal(path, "/b");
	cJSON *plain = cJSON_Parse("{\"spec\":{\"image\":\"r/c:v1\"}}");
	assert_string_equal(local_model_name(plain), "");
	cJSON_Delete(plain);
}

static int src_fd(const char *name)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	int fd = open(p, O_PATH | O_DIRECTORY);
	assert_true(fd >= 0);
	return fd;
}

static void test_place(void **state)
{
	(void)state;
	char err[700], p[600];
	sh("mkdir -p %s/src/io.triton.cache/H %s/src2/x %s/models/models/llama && "
	   "echo k > %s/src/io.triton.cache/H/k.cubin && echo v2 > %s/src2/x/new && "
	   "ln -s H %s/src/io.triton.cache/link && echo w > %s/models/models/llama/weights",
	   dir, dir, dir, dir, dir, dir, dir);
	snprintf(p, sizeof(p), "%s/models", dir);
	int s1 = src_fd("src"), s2 = src_fd("src2");
	assert_int_equal(local_model_place(p, "llama", s1, err, sizeof(err)), 0);
	sh("test \"$(cat %s/models/kernel-caches/llama/io.triton.cache/H/k.cubin)\" = k", dir);
	sh("test \"$(readlink %s/models/kernel-caches/llama/io.triton.cache/link)\" = H", dir);
	sh("test \"$(stat -c %%a %s/models/kernel-caches/llama/io.triton.cache/H/k.cubin)\" = 444",
	   dir);
	sh("test \"$(stat -c %%a %s/models/kernel-caches/llama)\" = 555", dir);
	/* a new digest replaces the tree whole; nothing else moves */
	assert_int_equal(local_model_place(p, "llama", s2, err, sizeof(err)), 0);
	sh("test -f %s/models/kernel-caches/llama/x/new && ! test -e "
	   "%s/models/kernel-caches/llama/io.triton.cache && test \"$(ls -A "
	   "%s/models/kernel-caches)\" = llama && test -f %s/models/models/llama/weights",
	   dir, dir, dir, dir);
	assert_int_equal(local_model_remove(p, "llama", err, sizeof(err)), 0);
	sh("! test -e %s/models/kernel-caches/llama && test -f %s/models/models/llama/weights", dir,
	   dir);
	assert_int_equal(local_model_remove(p, "llama", err, sizeof(err)), 0); /* gone: fine */

	/* a storage path that is a symlink, or through one; a kernel-caches that
	 * is one; a name that is not one */
	sh("mkdir -p %s/outside %s/kc && ln -s %s/outside %s/link && ln -s %s/outside "
	   "%s/kc/kernel-caches",
	   dir, dir, dir, dir, dir, dir);
	snprintf(p, sizeof(p), "%s/link", dir);
	assert_int_equal(local_model_place(p, "llama", s1, err, sizeof(err)), -ELOOP);
	assert_non_null(strstr(err, "is a symlink or passes through one"));
	snprintf(p, sizeof(p), "%s/link/sub", dir);
	sh("mkdir -p %s/outside/sub", dir);
	assert_int_equal(local_model_place(p, "llama", s1, err, sizeof(err)), -ELOOP);
	snprintf(p, sizeof(p), "%s/kc", dir);
	assert_true(local_model_place(p, "llama", s1, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, "kernel-caches is a symlink or not a directory"));
	assert_true(local_model_remove(p, "llama", err, sizeof(err)) < 0);
	snprintf(p, sizeof(p), "%s/models", dir);
	assert_int_equal(local_model_place(p, "../x", s1, err, sizeof(err)), -EINVAL);
	sh("test \"$(ls -A %s/outside)\" = sub && test -z \"$(ls -A %s/outside/sub)\"", dir, dir);
	snprintf(p, sizeof(p), "%s/missing", dir);
	assert_int_equal(local_model_place(p, "llama", s1, err, sizeof(err)), -ENOENT);
	close(s1);
	close(s2);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "%s/gkm-local-model.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_affinity),
	    cmocka_unit_test(test_place),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
