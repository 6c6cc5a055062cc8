/* Compat policy evaluation through the engine, as the agent calls it: a cJSON
 * input in, the validated cJSON verdicts out (policies/compat.lua, built-in
 * bundle, default limits). Prints figures; asserts nothing.
 *
 *   one cache, 1,000 targets, 8 GPUs, no target runs (every pair checked)
 *   1,000 caches of one target each, 8 GPUs (one call per cache)
 *
 * ops = target x GPU evaluations, per second of this process's CPU time (the
 * build machines are shared; wall time there measures the neighbours).
 * Medians of 5 runs, with min and max. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bundle.h"
#include "engine.h"

#define NTARGETS 1000
#define NGPUS 8
#define RUNS 5

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Eight GPUs of a mixed node: H100s on two NVLink cliques, A100s, MI300Xs. */
static cJSON *gpus(void)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < NGPUS; i++) {
		cJSON *g = cJSON_CreateObject();
		cJSON_AddNumberToObject(g, "index", i);
		if (i < 4) {
			cJSON_AddStringToObject(g, "backend", "cuda");
			cJSON_AddStringToObject(g, "name", "NVIDIA H100 80GB HBM3");
			cJSON_AddStringToObject(g, "arch", "sm_90");
			cJSON_AddStringToObject(g, "computeCapability", "9.0");
			cJSON_AddStringToObject(g, "driverVersion", "550.54.15");
			cJSON_AddStringToObject(g, "cudaDriverVersion", "12.4");
		} else if (i < 6) {
			cJSON_AddStringToObject(g, "backend", "cuda");
			cJSON_AddStringToObject(g, "name", "NVIDIA A100-SXM4-80GB");
			cJSON_AddStringToObject(g, "arch", "sm_80");
			cJSON_AddStringToObject(g, "computeCapability", "8.0");
			cJSON_AddStringToObject(g, "driverVersion", "535.161.08");
		} else {
			cJSON_AddStringToObject(g, "backend", "hip");
			cJSON_AddStringToObject(g, "name", "AMD Instinct MI300X");
			cJSON_AddStringToObject(g, "arch", "gfx942");
			cJSON_AddStringToObject(g, "driverVersion", "6.10.5");
		}
		cJSON_AddNumberToObject(g, "warpSize", i < 6 ? 32 : 64);
		cJSON_AddItemToArray(a, g);
	}
	return a;
}

/* Target i of a cache that runs nowhere on this node: other SM versions,
 * PTX too new for the H100 driver, other gfx targets and feature settings. */
static cJSON *target(int i)
{
	static const char *const sm[] = {"sm_70", "sm_75", "sm_86", "sm_89", "sm_100a", "sm_120"};
	static const char *const gfx[] = {"gfx90a",  "gfx90a:xnack-", "gfx942:xnack+",
	                                  "gfx1100", "gfx950",        "gfx942:sramecc-"};
	cJSON *t = cJSON_CreateObject();
	if (i % 3 == 2) {
		cJSON_AddStringToObject(t, "backend", "hip");
		cJSON_AddStringToObject(t, "arch", gfx[i % 6]);
		cJSON_AddNumberToObject(t, "warp_size", 64);
	} else if (i % 3 == 1) {
		/* the H100's arch, but PTX ISA 8.8 needs a newer driver */
		cJSON_AddStringToObject(t, "backend", "cuda");
		cJSON_AddNumberToObject(t, "arch", 90);
		cJSON_AddNumberToObject(t, "warp_size", 32);
		cJSON_AddNumberToObject(t, "ptx_version", 88);
		cJSON_AddStringToObject(t, "cuda_version", "12.9");
	} else {
		cJSON_AddStringToObject(t, "backend", "cuda");
		cJSON_AddStringToObject(t, "arch", sm[i % 6]);
		cJSON_AddNumberToObject(t, "warp_size", 32);
		cJSON_AddNumberToObject(t, "ptx_version", 80 + i % 5);
	}
	return t;
}

static cJSON *input(int first, int count)
{
	cJSON *in = cJSON_CreateObject();
	cJSON *cache = cJSON_AddObjectToObject(in, "cache");
	cJSON_AddStringToObject(cache, "name", "default/bench");
	cJSON *ts = cJSON_AddArrayToObject(cache, "targets");
	for (int i = first; i < first + count; i++)
		cJSON_AddItemToArray(ts, target(i));
	cJSON_AddItemToObject(in, "gpus", gpus());
	return in;
}

static int call(struct engine *e, const cJSON *in)
{
	cJSON *out = NULL;
	struct engine_error err;
	if (engine_call(e, "compat", in, &out, &err) != ENGINE_OK) {
		fprintf(stderr, "compat: %s: %s\n", engine_status_name(err.status), err.message);
		return -1;
	}
	cJSON_Delete(out);
	return 0;
}

static void report(const char *what, double *ops, const char *unit)
{
	qsort(ops, RUNS, sizeof(double), cmp_double);
	printf("%-58s median %9.0f %s  min %9.0f  max %9.0f\n", what, ops[RUNS / 2], unit, ops[0],
	       ops[RUNS - 1]);
}

int main(void)
{
	struct bundle *b = NULL;
	struct engine *e = NULL;
	struct engine_error err;
	if (bundle_builtin(&b) != 0 || engine_new(b, NULL, &e, &err) != 0) {
		fprintf(stderr, "cannot build the engine\n");
		return 1;
	}
	double big[RUNS], calls[RUNS], pairs[RUNS];

	/* one cache of 1,000 targets, 8 GPUs */
	cJSON *one = input(0, NTARGETS);
	if (call(e, one) < 0)
		return 1;
	for (int r = 0; r < RUNS; r++) {
		int n = 20;
		double t0 = now();
		for (int i = 0; i < n; i++)
			if (call(e, one) < 0)
				return 1;
		double dt = now() - t0;
		big[r] = (double)n * NTARGETS * NGPUS / dt;
	}
	cJSON_Delete(one);

	/* 1,000 caches of one target each, 8 GPUs */
	cJSON *each[NTARGETS];
	for (int i = 0; i < NTARGETS; i++)
		each[i] = input(i, 1);
	for (int r = 0; r < RUNS; r++) {
		double t0 = now();
		for (int i = 0; i < NTARGETS; i++)
			if (call(e, each[i]) < 0)
				return 1;
		double dt = now() - t0;
		calls[r] = NTARGETS / dt;
		pairs[r] = (double)NTARGETS * NGPUS / dt;
	}
	for (int i = 0; i < NTARGETS; i++)
		cJSON_Delete(each[i]);

	report("1 cache x 1,000 targets x 8 GPUs: target-GPU evaluations/s", big, "ops/s");
	report("1,000 caches x 1 target x 8 GPUs: hook calls/s", calls, "calls/s");
	report("1,000 caches x 1 target x 8 GPUs: target-GPU evaluations/s", pairs, "ops/s");
	engine_unref(e);
	bundle_free(b);
	return 0;
}
