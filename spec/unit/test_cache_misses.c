/* What a pod compiled: kernel directories in the upper layer that the
 * cache lacks, read without following the pod's links. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache_misses.h"
#include "fsutil.h"

static char root[64];

static void mk(const char *rel)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	assert_int_equal(fsutil_mkdirs(p, 0755), 0);
}

static void put(const char *rel, const char *text)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int dir(const char *rel)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	int fd = open(p, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	return fd;
}

static void test_counts_what_the_cache_lacks(void **state)
{
	(void)state;
	snprintf(root, sizeof(root), "/tmp/gkm-misses.XXXXXX");
	assert_non_null(mkdtemp(root));
	mk("lower/io.triton.cache/KEPT");
	put("lower/io.triton.cache/KEPT/add_kernel.json", "{}");
	/* copied up for a launcher added beside a kept kernel: no miss */
	mk("upper/io.triton.cache/KEPT");
	put("upper/io.triton.cache/KEPT/cuda_utils.so", "x");
	/* two kernels compiled in the pod, one with metadata */
	mk("upper/io.triton.cache/NEW1");
	put("upper/io.triton.cache/NEW1/__grp__mul_kernel.json", "{}");
	put("upper/io.triton.cache/NEW1/mul_kernel.json",
	    "{\"name\":\"mul_kernel\",\"target\":{\"backend\":\"cuda\",\"arch\":90,\"warp_size\":"
	    "32}}");
	mk("upper/io.triton.cache/NEW2");
	/* Triton's temporary directory, a file and a link: no kernels */
	mk("upper/io.triton.cache/tmp.pid_7_abc");
	put("upper/io.triton.cache/stray", "x");
	char p[256];
	snprintf(p, sizeof(p), "%s/upper/io.triton.cache/LINK", root);
	assert_int_equal(symlink("/etc", p), 0);
	/* a vLLM compile hash the cache lacks */
	mk("lower/io.vllm.cache/torch_compile_cache/old");
	mk("upper/io.vllm.cache/torch_compile_cache/old");
	mk("upper/io.vllm.cache/torch_compile_cache/1a2b3c4d5e");

	int up = dir("upper"), low = dir("lower");
	struct cache_misses m;
	assert_int_equal(cache_misses_count(up, low, &m), 0);
	assert_int_equal(m.kernels, 3);
	assert_int_equal(m.nnames, 3);
	const char *want[] = {"mul_kernel (cuda 90)", "NEW2", "vllm 1a2b3c4d5e"};
	for (size_t w = 0; w < 3; w++) {
		bool found = false;
		for (size_t i = 0; i < m.nnames; i++)
			found = found || strcmp(m.names[i], want[w]) == 0;
		if (!found)
			fail_msg("%s not among the names (%s, %s, %s)", want[w], m.names[0],
			         m.names[1], m.names[2]);
	}
	assert_false(m.truncated);
	/* without the cache's tree (an onMiss "empty" directory): all of them */
	assert_int_equal(cache_misses_count(up, -1, &m), 0);
	assert_int_equal(m.kernels, 5);
	close(up);
	close(low);
}

/* The pod's io.triton.cache as a link to elsewhere is not followed. */
static void test_links_are_not_followed(void **state)
{
	(void)state;
	char p[256], t[256];
	mk("upper2");
	mk("elsewhere/K1");
	snprintf(p, sizeof(p), "%s/upper2/io.triton.cache", root);
	snprintf(t, sizeof(t), "%s/elsewhere", root);
	assert_int_equal(symlink(t, p), 0);
	int up = dir("upper2");
	struct cache_misses m;
	assert_int_equal(cache_misses_count(up, -1, &m), 0);
	assert_int_equal(m.kernels, 0);
	close(up);
	/* no upper at all: 0 misses */
	mk("empty");
	up = dir("empty");
	assert_int_equal(cache_misses_count(up, -1, &m), 0);
	assert_int_equal(m.kernels, 0);
	close(up);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_counts_what_the_cache_lacks),
	    cmocka_unit_test(test_links_are_not_followed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
