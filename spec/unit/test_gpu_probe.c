/* GPU probes: NVML through the stand-in libnvidia-ml.so.1 built from
 * spec/fake_nvml (real dlopen, dlsym and NVML return codes), the KFD sysfs
 * trees of spec/fixtures/gpu/sysfs, the JSON file source, and the merged
 * "auto" inventory of a node with mixed GPUs. */
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

#include "gpu_sources.h"

static char fake_lib[1024], legacy_lib[1024], fixtures[1024], trace_path[256];

static void setup_paths(void)
{
	const char *build = getenv("GKM_BUILD") ? getenv("GKM_BUILD") : "build";
	const char *root = getenv("GKM_ROOT") ? getenv("GKM_ROOT") : ".";
	snprintf(fake_lib, sizeof(fake_lib), "%s/spec/fake_nvml/libnvidia-ml.so.1", build);
	snprintf(legacy_lib, sizeof(legacy_lib), "%s/spec/fake_nvml/legacy/libnvidia-ml.so.1",
	         build);
	snprintf(fixtures, sizeof(fixtures), "%s/spec/fixtures/gpu", root);
	snprintf(trace_path, sizeof(trace_path), "/tmp/gkm-fake-nvml-trace.%d", (int)getpid());
}

static void use_config(const char *name)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/nvml/%s", fixtures, name);
	setenv("FAKE_NVML_CONFIG", path, 1);
	unlink(trace_path);
	setenv("FAKE_NVML_TRACE", trace_path, 1);
}

static char *sysfs(const char *name)
{
	static char path[1200];
	snprintf(path, sizeof(path), "%s/sysfs/%s", fixtures, name);
	return path;
}

/* How many times fn appears in the fake library's call trace. */
static int calls(const char *fn)
{
	FILE *f = fopen(trace_path, "r");
	if (!f)
		return 0;
	char line[128];
	int n = 0;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		n += strcmp(line, fn) == 0;
	}
	fclose(f);
	return n;
}

static const char *jstr(const cJSON *o, const char *k)
{
	return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static void test_nvml_h100_fabric(void **state)
{
	(void)state;
	use_config("h100x4-nvlink.json");
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe(fake_lib, &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 4);
	assert_int_equal(p->nwarnings, 0); /* the v2 struct version was accepted */
	const struct gpu_info *g = &p->gpus[2];
	assert_string_equal(g->name, "NVIDIA H100 80GB HBM3");
	assert_string_equal(g->arch, "sm_90");
	assert_int_equal(g->cc_major, 9);
	assert_int_equal(g->cc_minor, 0);
	assert_string_equal(g->driver_version, "550.54.15");
	assert_string_equal(g->cuda_driver_version, "12.4");
	assert_string_equal(g->pci_bus_id, "00000000:4C:00.0");
	assert_int_equal(g->memory_bytes, 85520809984ULL);
	assert_int_equal(g->fabric_state, GPU_FABRIC_COMPLETED);
	char clique[64];
	gpu_info_clique(g, clique, sizeof(clique));
	assert_string_equal(clique, "5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.2");
	assert_int_equal(calls("nvmlDeviceGetGpuFabricInfoV"), 4);
	assert_int_equal(calls("nvmlDeviceGetGpuFabricInfo"), 0);
	assert_int_equal(calls("nvmlShutdown"), 1);

	cJSON *j = gpu_probe_to_json(p);
	assert_non_null(j);
	assert_string_equal(jstr(j, "source"), "nvml");
	const cJSON *groups = cJSON_GetObjectItem(j, "groups");
	assert_int_equal(cJSON_GetArraySize(groups), 2); /* two cliques, two id sets */
	const cJSON *g1 = cJSON_GetArrayItem(groups, 1);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(g1, "ids")), 2);
	assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(g1, "ids"), 0)->valueint, 2);
	/* a group carries the node status gpus[] fields, by the CRD's names */
	assert_string_equal(jstr(g1, "fabricClique"), "5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.2");
	assert_string_equal(jstr(g1, "backend"), "cuda");
	assert_string_equal(jstr(g1, "arch"), "sm_90");
	assert_int_equal(cJSON_GetObjectItem(g1, "warpSize")->valueint, 32);
	assert_string_equal(jstr(g1, "cudaVersion"), "12.4");
	assert_true(cJSON_GetObjectItem(g1, "memoryBytes")->valuedouble == 85520809984.0);
	assert_null(cJSON_GetObjectItem(g1, "clique"));
	const cJSON *f =
	    cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "gpus"), 0), "fabric");
	assert_string_equal(jstr(f, "state"), "completed");
	assert_int_equal(cJSON_GetObjectItem(f, "cliqueId")->valueint, 1);
	assert_null(cJSON_GetObjectItem(j, "warnings"));
	cJSON_Delete(j);
	gpu_probe_free(p);
}

static void test_nvml_no_fabric(void **state)
{
	(void)state;
	use_config("a100x2.json");
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe(fake_lib, &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 2);
	assert_int_equal(p->nwarnings, 0); /* NOT_SUPPORTED is not a problem */
	assert_int_equal(p->gpus[1].fabric_state, GPU_FABRIC_NONE);
	assert_string_equal(p->gpus[1].cuda_driver_version, "12.2");
	cJSON *j = gpu_probe_to_json(p);
	const cJSON *gpu = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "gpus"), 1);
	assert_null(cJSON_GetObjectItem(gpu, "fabric"));
	assert_string_equal(jstr(gpu, "computeCapability"), "8.0");
	assert_int_equal(cJSON_GetObjectItem(gpu, "warpSize")->valueint, 32);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "groups")), 1);
	cJSON_Delete(j);
	gpu_probe_free(p);
}

static void test_nvml_legacy_driver(void **state)
{
	(void)state;
	use_config("t4-r470.json");
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe(legacy_lib, &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 1);
	assert_string_equal(p->gpus[0].arch, "sm_75");
	assert_string_equal(p->gpus[0].cuda_driver_version, "11.4");
	assert_string_equal(p->gpus[0].pci_bus_id, ""); /* no nvmlDeviceGetPciInfo_v3 */
	assert_int_equal(p->gpus[0].fabric_state, GPU_FABRIC_NONE);
	/* the unversioned fallbacks were the ones called */
	assert_int_equal(calls("nvmlInit"), 1);
	assert_int_equal(calls("nvmlDeviceGetCount"), 1);
	assert_int_equal(calls("nvmlSystemGetCudaDriverVersion"), 1);
	assert_int_equal(calls("nvmlShutdown"), 1);
	gpu_probe_free(p);
}

static void test_nvml_device_errors(void **state)
{
	(void)state;
	use_config("errors.json");
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe(fake_lib, &p, err, sizeof(err)), 0);
	/* the lost GPU is left out, the others keep their NVML index */
	assert_int_equal(p->count, 2);
	assert_int_equal(p->gpus[1].device_index, 2);
	assert_int_equal(p->gpus[1].index, 1);
	assert_int_equal(p->gpus[0].memory_bytes, 0); /* NOT_SUPPORTED: omitted */
	assert_int_equal(p->gpus[0].fabric_state, GPU_FABRIC_IN_PROGRESS);
	assert_false(p->gpus[0].fabric_has_clique);
	assert_int_equal(p->nwarnings, 2);
	assert_non_null(strstr(p->warnings[0], "GPU 1: nvmlDeviceGetUUID: GPU is lost"));
	assert_non_null(strstr(p->warnings[1], "Insufficient Permissions"));
	cJSON *j = gpu_probe_to_json(p);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "warnings")), 2);
	const cJSON *gpu0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "gpus"), 0);
	assert_null(cJSON_GetObjectItem(gpu0, "memoryBytes"));
	assert_string_equal(jstr(cJSON_GetObjectItem(gpu0, "fabric"), "state"), "inProgress");
	assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(gpu0, "fabric"), "clique"));
	cJSON_Delete(j);
	gpu_probe_free(p);
}

static void test_nvml_missing_library(void **state)
{
	(void)state;
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe("/nonexistent/libnvidia-ml.so.1", &p, err, sizeof(err)),
	                 -ENOENT);
	assert_null(p);
	assert_non_null(strstr(err, "cannot load /nonexistent/libnvidia-ml.so.1"));
}

static void test_nvml_init_fails(void **state)
{
	(void)state;
	use_config("init-fails.json");
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe(fake_lib, &p, err, sizeof(err)), -ENODEV);
	assert_null(p);
	assert_string_equal(err, "nvmlInit: Driver Not Loaded");
	assert_int_equal(calls("nvmlShutdown"), 0); /* never initialised */
}

static void test_rocm_gfx_names(void **state)
{
	(void)state;
	char b[16];
	static const struct {
		unsigned v;
		const char *name;
	} cases[] = {{90010, "gfx90a"},   {90402, "gfx942"}, {110501, "gfx1151"},
	             {100300, "gfx1030"}, {90008, "gfx908"}, {120001, "gfx1201"}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(gpu_rocm_gfx_name(cases[i].v, b, sizeof(b)), 0);
		assert_string_equal(b, cases[i].name);
	}
	assert_int_equal(gpu_rocm_gfx_name(0, b, sizeof(b)), -EINVAL);
	assert_int_equal(gpu_rocm_gfx_name(91600, b, sizeof(b)), -EINVAL); /* minor 16 */
}

static void test_rocm_mi210(void **state)
{
	(void)state;
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_rocm_probe(sysfs("mi210"), &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 2); /* the CPU node is not a GPU */
	const struct gpu_info *g = &p->gpus[1];
	assert_string_equal(g->vendor, "amd");
	assert_string_equal(g->backend, "hip");
	assert_string_equal(g->name, "AMD Instinct MI210");
	assert_string_equal(g->arch, "gfx90a");
	assert_int_equal(g->gfx_target_version, 90010);
	assert_int_equal(g->warp_size, 64);
	assert_string_equal(g->driver_version, "6.7.0");
	assert_string_equal(g->pci_bus_id, "0000:83:00.0");
	assert_string_equal(g->uuid, "GPU-b846912060024fb1");
	assert_int_equal(g->memory_bytes, 68702699520ULL);
	assert_int_equal(g->device_index, 1);
	assert_int_equal(g->cc_major, -1);
	gpu_probe_free(p);
}

static void test_rocm_mi300x(void **state)
{
	(void)state;
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_rocm_probe(sysfs("mi300x"), &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 4); /* two CPU nodes skipped */
	assert_string_equal(p->gpus[0].name, "AMD Instinct MI300X");
	assert_string_equal(p->gpus[0].arch, "gfx942");
	assert_string_equal(p->gpus[3].pci_bus_id, "0000:5c:00.0");
	cJSON *j = gpu_probe_to_json(p);
	const cJSON *grp = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "groups"), 0);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "groups")), 1);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(grp, "ids")), 4);
	assert_string_equal(jstr(grp, "arch"), "gfx942");
	assert_string_equal(jstr(grp, "gpuType"), "AMD Instinct MI300X");
	cJSON_Delete(j);
	gpu_probe_free(p);
}

/* A scratch sysfs tree: nodes given as (number, properties text). */
static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static char *scratch_tree(char *root, size_t len, const unsigned *nodes, const char **props,
                          size_t n)
{
	snprintf(root, len, "/tmp/gkm-sysfs.XXXXXX");
	assert_non_null(mkdtemp(root));
	char path[512];
	const char *parts[] = {"class", "class/kfd", "class/kfd/kfd", "class/kfd/kfd/topology",
	                       "class/kfd/kfd/topology/nodes"};
	for (size_t i = 0; i < 5; i++) {
		snprintf(path, sizeof(path), "%s/%s", root, parts[i]);
		assert_int_equal(mkdir(path, 0755), 0);
	}
	for (size_t i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/class/kfd/kfd/topology/nodes/%u", root, nodes[i]);
		assert_int_equal(mkdir(path, 0755), 0);
		snprintf(path, sizeof(path), "%s/class/kfd/kfd/topology/nodes/%u/properties", root,
		         nodes[i]);
		write_file(path, props[i]);
	}
	return root;
}

static void remove_tree(const char *root)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	assert_int_equal(system(cmd), 0);
}

static void test_rocm_node_order_and_rdna(void **state)
{
	(void)state;
	char root[64];
	/* node 10 sorts after node 2 (numeric, the runtime's order); the RDNA GPU
	 * without wave_front_size gets wave32 */
	const unsigned nodes[] = {10, 2, 0};
	const char *props[] = {
	    "simd_count 96\ngfx_target_version 110000\nvendor_id 4098\ndevice_id 29772\n",
	    "simd_count 440\ngfx_target_version 90010\nvendor_id 4098\ndevice_id 29711\n"
	    "wave_front_size 64\n",
	    "cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n",
	};
	scratch_tree(root, sizeof(root), nodes, props, 3);
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_rocm_probe(root, &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 2);
	assert_string_equal(p->gpus[0].arch, "gfx90a");
	assert_string_equal(p->gpus[1].arch, "gfx1100");
	assert_int_equal(p->gpus[1].warp_size, 32);
	assert_string_equal(p->gpus[1].name, "AMD gfx1100 (0x744c)");
	assert_int_equal(p->gpus[1].memory_bytes, 0);
	gpu_probe_free(p);
	remove_tree(root);
}

static void test_rocm_malformed(void **state)
{
	(void)state;
	char root[64], err[256];
	struct gpu_probe *p = NULL;
	const unsigned nodes[] = {1};
	const char *missing[] = {"simd_count 440\nvendor_id 4098\n"};
	scratch_tree(root, sizeof(root), nodes, missing, 1);
	assert_int_equal(gpu_rocm_probe(root, &p, err, sizeof(err)), -EINVAL);
	assert_null(p);
	assert_non_null(strstr(err, "nodes/1/properties: gfx_target_version is missing"));
	remove_tree(root);

	const char *garbage[] = {"simd_count 440\ngfx_target_version 9x0010\n"};
	scratch_tree(root, sizeof(root), nodes, garbage, 1);
	assert_int_equal(gpu_rocm_probe(root, &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "gfx_target_version is not a number"));
	remove_tree(root);

	const char *bad_target[] = {"simd_count 440\ngfx_target_version 91700\n"};
	scratch_tree(root, sizeof(root), nodes, bad_target, 1);
	assert_int_equal(gpu_rocm_probe(root, &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "gfx_target_version 91700 is not a GFX target"));
	remove_tree(root);

	assert_int_equal(gpu_rocm_probe("/nonexistent", &p, err, sizeof(err)), -ENOENT);
	assert_null(p);
}

static void test_file_round_trip(void **state)
{
	(void)state;
	use_config("h100x4-nvlink.json");
	struct gpu_probe *p = NULL, *q = NULL;
	char err[256] = "";
	assert_int_equal(gpu_nvml_probe(fake_lib, &p, err, sizeof(err)), 0);
	cJSON *a = gpu_probe_to_json(p);
	char *text = cJSON_PrintUnformatted(a);
	assert_int_equal(gpu_file_parse(text, strlen(text), &q, err, sizeof(err)), 0);
	cJSON *b = gpu_probe_to_json(q);
	assert_string_equal(jstr(b, "source"), "file");
	cJSON_ReplaceItemInObject(b, "source", cJSON_CreateString("nvml"));
	assert_true(cJSON_Compare(a, b, true)); /* the file source reads what it wrote */
	free(text);
	cJSON_Delete(a);
	cJSON_Delete(b);
	gpu_probe_free(p);
	gpu_probe_free(q);
}

static void file_rejects(const char *json, const char *want)
{
	struct gpu_probe *p = NULL;
	char err[512] = "";
	int r = gpu_file_parse(json, strlen(json), &p, err, sizeof(err));
	assert_true(r < 0);
	assert_null(p);
	if (!strstr(err, want))
		fail_msg("error '%s' lacks '%s'", err, want);
}

static void test_file_rejects_bad_input(void **state)
{
	(void)state;
	file_rejects("{", "inventory: invalid JSON at line 1");
	file_rejects("[]", "want an object with a \"gpus\" array");
	file_rejects("{\"gpus\": {}}", "\"gpus\" array");
	file_rejects("{\"gpus\": [1]}", "gpus[0]: want an object");
	file_rejects("{\"gpus\": [{\"backend\": \"cuda\", \"arch\": 90}]}",
	             "gpus[0].arch: want a string");
	file_rejects("{\"gpus\": [{\"backend\": \"cuda\"}]}", "gpus[0].arch: missing");
	file_rejects("{\"gpus\": [{\"backend\": \"xpu\", \"arch\": \"pvc\"}]}",
	             "gpus[0].backend: want \"cuda\" or \"hip\"");
	file_rejects("{\"gpus\": [{\"vendor\": \"nvidia\", \"arch\": \"sm_90\", "
	             "\"computeCapability\": \"nine\"}]}",
	             "gpus[0].computeCapability");
	file_rejects("{\"gpus\": [{\"vendor\": \"amd\", \"arch\": \"gfx90a\", \"warpSize\": 1.5}]}",
	             "gpus[0].warpSize: want an integer");
	file_rejects(
	    "{\"gpus\": [{\"vendor\": \"amd\", \"arch\": \"gfx90a\", \"memoryBytes\": -1}]}",
	    "gpus[0].memoryBytes");
	file_rejects("{\"gpus\": [{\"vendor\": \"nvidia\", \"arch\": \"sm_90\", "
	             "\"fabric\": {\"state\": \"done\"}}]}",
	             "gpus[0].fabric.state");

	char name[300];
	memset(name, 'x', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	char doc[512];
	snprintf(doc, sizeof(doc),
	         "{\"gpus\": [{\"vendor\": \"amd\", \"arch\": \"gfx90a\", "
	         "\"name\": \"%s\"}]}",
	         name);
	file_rejects(doc, "gpus[0].name: longer than 95 characters");

	/* more GPUs than any node has */
	size_t cap = 300 * 40 + 64, used = 0;
	char *big = malloc(cap);
	used += (size_t)snprintf(big, cap, "{\"gpus\": [");
	for (int i = 0; i < 300; i++)
		used +=
		    (size_t)snprintf(big + used, cap - used,
		                     "%s{\"vendor\":\"amd\",\"arch\":\"gfx90a\"}", i ? "," : "");
	snprintf(big + used, cap - used, "]}");
	file_rejects(big, "more than 256 GPUs");
	free(big);
}

static void test_file_defaults(void **state)
{
	(void)state;
	const char *doc = "{\"gpus\": [{\"vendor\": \"nvidia\", \"arch\": \"sm_90a\"},"
	                  "{\"backend\": \"hip\", \"arch\": \"gfx90a:xnack-\"},"
	                  "{\"backend\": \"hip\", \"arch\": \"gfx1100\"}]}";
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_file_parse(doc, strlen(doc), &p, err, sizeof(err)), 0);
	assert_int_equal(p->gpus[0].cc_major, 9);
	assert_int_equal(p->gpus[0].cc_minor, 0);
	assert_int_equal(p->gpus[0].warp_size, 32);
	assert_string_equal(p->gpus[0].backend, "cuda");
	assert_string_equal(p->gpus[1].arch, "gfx90a");
	assert_string_equal(p->gpus[1].features, "xnack-");
	assert_int_equal(p->gpus[1].warp_size, 64);
	assert_int_equal(p->gpus[2].warp_size, 32);
	assert_string_equal(p->gpus[2].vendor, "amd");
	gpu_probe_free(p);

	char path[1200];
	snprintf(path, sizeof(path), "%s/inventory/does-not-exist.json", fixtures);
	assert_int_equal(gpu_file_probe(path, &p, err, sizeof(err)), -ENOENT);
}

static void test_auto_mixed_node(void **state)
{
	(void)state;
	use_config("t4-r470.json");
	struct gpu_probe *p = NULL;
	char err[256] = "";
	assert_int_equal(gpu_probe_auto(legacy_lib, sysfs("mi210"), &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 3);
	assert_string_equal(p->source, "auto");
	assert_string_equal(p->gpus[0].vendor, "nvidia");
	assert_string_equal(p->gpus[1].vendor, "amd");
	/* node-wide ids are unique; the vendor ordinals restart per vendor */
	assert_int_equal(p->gpus[2].index, 2);
	assert_int_equal(p->gpus[2].device_index, 1);
	cJSON *j = gpu_probe_to_json(p);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "groups")), 2);
	cJSON_Delete(j);
	gpu_probe_free(p);

	/* nothing present is not an error */
	assert_int_equal(
	    gpu_probe_auto("/nonexistent/libnvidia-ml.so.1", "/nonexistent", &p, err, sizeof(err)),
	    0);
	assert_int_equal(p->count, 0);
	assert_int_equal(p->nwarnings, 0);
	gpu_probe_free(p);

	/* a driver that is installed but broken is reported, and AMD still shows */
	use_config("init-fails.json");
	assert_int_equal(gpu_probe_auto(fake_lib, sysfs("mi300x"), &p, err, sizeof(err)), 0);
	assert_int_equal(p->count, 4);
	assert_int_equal(p->nwarnings, 1);
	assert_string_equal(p->warnings[0], "nvml: nvmlInit: Driver Not Loaded");
	gpu_probe_free(p);
}

int main(void)
{
	setup_paths();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_nvml_h100_fabric),
	    cmocka_unit_test(test_nvml_no_fabric),
	    cmocka_unit_test(test_nvml_legacy_driver),
	    cmocka_unit_test(test_nvml_device_errors),
	    cmocka_unit_test(test_nvml_missing_library),
	    cmocka_unit_test(test_nvml_init_fails),
	    cmocka_unit_test(test_rocm_gfx_names),
	    cmocka_unit_test(test_rocm_mi210),
	    cmocka_unit_test(test_rocm_mi300x),
	    cmocka_unit_test(test_rocm_node_order_and_rdna),
	    cmocka_unit_test(test_rocm_malformed),
	    cmocka_unit_test(test_file_round_trip),
	    cmocka_unit_test(test_file_rejects_bad_input),
	    cmocka_unit_test(test_file_defaults),
	    cmocka_unit_test(test_auto_mixed_node),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(trace_path);
	return r;
}
