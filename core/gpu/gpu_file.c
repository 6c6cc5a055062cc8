/* The JSON file source: an inventory written by hand (clusters and CI
 * without GPUs) or saved from `gkm gpus -o json` on a real node. Every field
 * is checked for type and size; anything wrong is refused with the field's
 * path ("gpus[1].arch: want a string"), never half-read. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_sources.h"
#include "jsonfile.h"

#define MAX_FILE_BYTES (1024 * 1024)

/* String field: 1 copied, 0 absent, -EINVAL wrong type or too long. */
static int get_str(const cJSON *o, const char *key, char *buf, size_t len, const char *where,
                   char *err, size_t errlen)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsString(v)) {
		snprintf(err, errlen, "%s.%s: want a string", where, key);
		return -EINVAL;
	}
	if (strlen(v->valuestring) >= len) {
		snprintf(err, errlen, "%s.%s: longer than %zu characters", where, key, len - 1);
		return -EINVAL;
	}
	snprintf(buf, len, "%s", v->valuestring);
	return 1;
}

/* Integer field in [lo, hi]: 1 read, 0 absent, -EINVAL otherwise. */
static int get_int(const cJSON *o, const char *key, double lo, double hi, double *out,
                   const char *where, char *err, size_t errlen)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
	    v->valuedouble > hi) {
		snprintf(err, errlen, "%s.%s: want an integer from %.0f to %.0f", where, key, lo,
		         hi);
		return -EINVAL;
	}
	*out = v->valuedouble;
	return 1;
}

static int parse_fabric(const cJSON *f, struct gpu_info *g, const char *where, char *err,
                        size_t errlen)
{
	char state[16] = "";
	double clique = 0;
	if (!cJSON_IsObject(f)) {
		snprintf(err, errlen, "%s.fabric: want an object", where);
		return -EINVAL;
	}
	char fw[64];
	snprintf(fw, sizeof(fw), "%s.fabric", where);
	if (get_str(f, "state", state, sizeof(state), fw, err, errlen) < 0 ||
	    get_str(f, "clusterUuid", g->fabric_cluster_uuid, sizeof(g->fabric_cluster_uuid), fw,
	            err, errlen) < 0 ||
	    get_int(f, "cliqueId", 0, 4294967295.0, &clique, fw, err, errlen) < 0)
		return -EINVAL;
	if (strcmp(state, "notStarted") == 0)
		g->fabric_state = GPU_FABRIC_NOT_STARTED;
	else if (strcmp(state, "inProgress") == 0)
		g->fabric_state = GPU_FABRIC_IN_PROGRESS;
	else if (strcmp(state, "completed") == 0)
		g->fabric_state = GPU_FABRIC_COMPLETED;
	else {
		snprintf(err, errlen, "%s.state: want notStarted, inProgress or completed", fw);
		return -EINVAL;
	}
	g->fabric_clique_id = (uint32_t)clique;
	g->fabric_has_clique = g->fabric_state == GPU_FABRIC_COMPLETED && g->fabric_cluster_uuid[0];
	return 0;
}

static int parse_gpu(const cJSON *o, int ordinal, struct gpu_info *g, char *err, size_t errlen)
{
	char where[32];
	snprintf(where, sizeof(where), "gpus[%d]", ordinal);
	gpu_info_init(g);
	if (!cJSON_IsObject(o)) {
		snprintf(err, errlen, "%s: want an object", where);
		return -EINVAL;
	}
	char cc[16] = "";
	double dev = ordinal, gfx = 0, warp = 0, mem = 0;
	int r = 0;
#define STR(key, field) (r = get_str(o, key, g->field, sizeof(g->field), where, err, errlen)) < 0
	if (STR("vendor", vendor) || STR("backend", backend) || STR("name", name) ||
	    STR("uuid", uuid) || STR("arch", arch) || STR("features", features) ||
	    STR("driverVersion", driver_version) || STR("cudaDriverVersion", cuda_driver_version) ||
	    STR("pciBusId", pci_bus_id) ||
	    get_str(o, "computeCapability", cc, sizeof(cc), where, err, errlen) < 0 ||
	    get_int(o, "deviceIndex", 0, GPU_PROBE_MAX_GPUS, &dev, where, err, errlen) < 0 ||
	    get_int(o, "gfxTargetVersion", 0, 999999, &gfx, where, err, errlen) < 0 ||
	    get_int(o, "warpSize", 0, 1024, &warp, where, err, errlen) < 0 ||
	    get_int(o, "memoryBytes", 0, 9007199254740992.0, &mem, where, err, errlen) < 0)
		return -EINVAL;
#undef STR
	/* backend and vendor imply each other */
	if (!g->backend[0] && strcmp(g->vendor, "nvidia") == 0)
		snprintf(g->backend, sizeof(g->backend), "cuda");
	if (!g->backend[0] && strcmp(g->vendor, "amd") == 0)
		snprintf(g->backend, sizeof(g->backend), "hip");
	if (strcmp(g->backend, "cuda") != 0 && strcmp(g->backend, "hip") != 0) {
		snprintf(err, errlen, "%s.backend: want \"cuda\" or \"hip\" (or vendor nvidia/amd)",
		         where);
		return -EINVAL;
	}
	bool cuda = strcmp(g->backend, "cuda") == 0;
	if (!g->vendor[0])
		snprintf(g->vendor, sizeof(g->vendor), "%s", cuda ? "nvidia" : "amd");
	if (!g->arch[0]) {
		snprintf(err, errlen, "%s.arch: missing (\"sm_90\", \"gfx90a\", ...)", where);
		return -EINVAL;
	}
	/* a ROCm target ID ("gfx90a:xnack-") carries its features after the colon */
	char *colon = strchr(g->arch, ':');
	if (colon) {
		if (!g->features[0])
			snprintf(g->features, sizeof(g->features), "%s", colon + 1);
		*colon = '\0';
	}
	if (cuda) {
		int maj = -1, min = -1;
		char extra;
		if (cc[0] && (sscanf(cc, "%d.%d%c", &maj, &min, &extra) != 2 || maj < 1 ||
		              maj > 99 || min < 0 || min > 9)) {
			snprintf(err, errlen, "%s.computeCapability: want \"MAJOR.MINOR\"", where);
			return -EINVAL;
		}
		/* "sm_90" (or "sm_90a") gives the capability when it is not spelled out */
		unsigned n = 0;
		if (maj < 0 && sscanf(g->arch, "sm_%u", &n) == 1 && n >= 10 && n < 1000) {
			maj = (int)n / 10;
			min = (int)n % 10;
		}
		g->cc_major = maj;
		g->cc_minor = min;
	}
	if (!g->name[0])
		snprintf(g->name, sizeof(g->name), "%s %s", cuda ? "NVIDIA" : "AMD", g->arch);
	g->device_index = (int)dev;
	g->gfx_target_version = (unsigned)gfx;
	/* GCN and CDNA (gfx9xx) run wave64, RDNA (gfx10xx and later) wave32 */
	bool gfx9 = strncmp(g->arch, "gfx9", 4) == 0 && strlen(g->arch) == 6;
	g->warp_size = warp > 0 ? (int)warp : (cuda || !gfx9) ? 32 : 64;
	g->memory_bytes = (uint64_t)mem;
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "fabric");
	if (f && !cJSON_IsNull(f) && parse_fabric(f, g, where, err, errlen) < 0)
		return -EINVAL;
	return 0;
}

/* The inventory in root (borrowed). */
static int from_json(const cJSON *root, struct gpu_probe **out, char *err, size_t errlen)
{
	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(root, "gpus");
	if (!cJSON_IsObject(root) || !cJSON_IsArray(gpus)) {
		snprintf(err, errlen, "want an object with a \"gpus\" array");
		return -EINVAL;
	}
	if (cJSON_GetArraySize(gpus) > GPU_PROBE_MAX_GPUS) {
		snprintf(err, errlen, "more than %d GPUs", GPU_PROBE_MAX_GPUS);
		return -E2BIG;
	}
	struct gpu_probe *p = NULL;
	int r = gpu_probe_new("file", &p);
	int i = 0;
	const cJSON *o;
	cJSON_ArrayForEach(o, gpus)
	{
		if (r < 0)
			break;
		struct gpu_info g;
		r = parse_gpu(o, i++, &g, err, errlen);
		if (r == 0)
			r = gpu_probe_add(p, &g);
	}
	if (r == 0)
		*out = p;
	else
		gpu_probe_free(p);
	return r;
}

int gpu_file_parse(const char *text, size_t len, struct gpu_probe **out, char *err, size_t errlen)
{
	cJSON *root = NULL;
	if (len > MAX_FILE_BYTES) {
		snprintf(err, errlen, "inventory larger than %d bytes", MAX_FILE_BYTES);
		return -EFBIG;
	}
	int r = jsonfile_parse("inventory", text, len, &root, err, errlen);
	if (r == 0)
		r = from_json(root, out, err, errlen);
	cJSON_Delete(root);
	return r;
}

int gpu_file_probe(const char *path, struct gpu_probe **out, char *err, size_t errlen)
{
	cJSON *root = NULL;
	char why[400];
	int r = jsonfile_read(path, &root, err, errlen);
	if (r < 0)
		return r;
	r = from_json(root, out, why, sizeof(why));
	if (r < 0)
		snprintf(err, errlen, "%s: %s", path, why);
	cJSON_Delete(root);
	return r;
}
