/* A stand-in libnvidia-ml.so.1 for tests on machines without NVIDIA GPUs.
 *
 * It exports the NVML entry points gkm's probe resolves with dlsym, with the
 * same signatures and struct layouts as the real library, and answers from a
 * JSON description named by $FAKE_NVML_CONFIG:
 *
 *   {"driverVersion": "550.54.15", "cudaDriverVersion": 12040,
 *    "errors": {"nvmlInit_v2": 9},                  return codes to force
 *    "devices": [{"name": "...", "uuid": "GPU-...", "cc": [9, 0],
 *                 "memoryTotal": 85899345920, "busId": "00000000:19:00.0",
 *                 "fabric": {"clusterUuid": "<32 hex>", "cliqueId": 1,
 *                            "state": 3, "status": 0},
 *                 "errors": {"nvmlDeviceGetGpuFabricInfoV": 3}}]}
 *
 * Built twice (spec/gpu.mk): the default exports what an R550+ driver has;
 * with -DFAKE_NVML_LEGACY it exports only what an R470 driver has (no _v2
 * names, no fabric calls, no nvmlSystemGetCudaDriverVersion_v2), so that the
 * probe's fallbacks run. Calls are appended to $FAKE_NVML_TRACE when set. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;
typedef struct {
	unsigned char clusterUuid[16];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
} nvmlGpuFabricInfo_t;
typedef struct {
	unsigned int version;
	unsigned char clusterUuid[16];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
	unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

static cJSON *config;
static int init_count;

static void trace(const char *fn)
{
	const char *path = getenv("FAKE_NVML_TRACE");
	if (!path)
		return;
	FILE *f = fopen(path, "a");
	if (f) {
		fprintf(f, "%s\n", fn);
		fclose(f);
	}
}

/* The forced return code of fn in obj's "errors", or NVML_SUCCESS. */
static nvmlReturn_t forced(const cJSON *obj, const char *fn)
{
	const cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "errors"), fn);
	return cJSON_IsNumber(e) ? e->valueint : NVML_SUCCESS;
}

static nvmlReturn_t enter(const char *fn)
{
	trace(fn);
	if (!init_count)
		return NVML_ERROR_UNINITIALIZED;
	return forced(config, fn);
}

static nvmlReturn_t device_enter(const char *fn, const void *dev)
{
	nvmlReturn_t r = enter(fn);
	if (r != NVML_SUCCESS)
		return r;
	if (!dev)
		return NVML_ERROR_INVALID_ARGUMENT;
	return forced(dev, fn);
}

static nvmlReturn_t do_init(const char *fn)
{
	trace(fn);
	if (init_count) {
		init_count++;
		return NVML_SUCCESS;
	}
	const char *path = getenv("FAKE_NVML_CONFIG");
	FILE *f = path ? fopen(path, "rb") : NULL;
	if (!f)
		return NVML_ERROR_UNKNOWN;
	char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	cJSON *c = cJSON_Parse(buf);
	if (!c)
		return NVML_ERROR_UNKNOWN;
	nvmlReturn_t r = forced(c, fn);
	if (r != NVML_SUCCESS) {
		cJSON_Delete(c);
		return r;
	}
	config = c;
	init_count = 1;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlShutdown(void)
{
	trace("nvmlShutdown");
	if (!init_count)
		return NVML_ERROR_UNINITIALIZED;
	if (--init_count == 0) {
		cJSON_Delete(config);
		config = NULL;
	}
	return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case 0:
		return "Success";
	case 1:
		return "Uninitialized";
	case 2:
		return "Invalid Argument";
	case 3:
		return "Not Supported";
	case 4:
		return "Insufficient Permissions";
	case 7:
		return "Insufficient Size";
	case 9:
		return "Driver Not Loaded";
	case 15:
		return "GPU is lost";
	case 25:
		return "Argument version mismatch";
	default:
		return "Unknown Error";
	}
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int len)
{
	if (!buf)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!s)
		s = "";
	if (strlen(s) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(buf, s, strlen(s) + 1);
	return NVML_SUCCESS;
}

static cJSON *device_at(unsigned int i)
{
	return cJSON_GetArrayItem(cJSON_GetObjectItem(config, "devices"), (int)i);
}

static const char *dev_str(const void *dev, const char *key)
{
	return cJSON_GetStringValue(cJSON_GetObjectItem(dev, key));
}

static double dev_num(const void *dev, const char *key)
{
	const cJSON *v = cJSON_GetObjectItem(dev, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* ---- system ---- */
static nvmlReturn_t driver_version(const char *fn, char *buf, unsigned int len)
{
	nvmlReturn_t r = enter(fn);
	return r ? r : copy_string(dev_str(config, "driverVersion"), buf, len);
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int len)
{
	return driver_version("nvmlSystemGetDriverVersion", buf, len);
}

static nvmlReturn_t cuda_version(const char *fn, int *v)
{
	nvmlReturn_t r = enter(fn);
	if (r)
		return r;
	if (!v)
		return NVML_ERROR_INVALID_ARGUMENT;
	*v = (int)dev_num(config, "cudaDriverVersion");
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
	return cuda_version("nvmlSystemGetCudaDriverVersion", v);
}

static nvmlReturn_t count(const char *fn, unsigned int *n)
{
	nvmlReturn_t r = enter(fn);
	if (r)
		return r;
	if (!n)
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = (unsigned int)cJSON_GetArraySize(cJSON_GetObjectItem(config, "devices"));
	return NVML_SUCCESS;
}

static nvmlReturn_t handle(const char *fn, unsigned int i, void **dev)
{
	nvmlReturn_t r = enter(fn);
	if (r)
		return r;
	cJSON *d = device_at(i);
	if (!d || !dev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*dev = d;
	return forced(d, fn);
}

#ifdef FAKE_NVML_LEGACY
API nvmlReturn_t nvmlInit(void)
{
	return do_init("nvmlInit");
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n)
{
	return count("nvmlDeviceGetCount", n);
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, void **dev)
{
	return handle("nvmlDeviceGetHandleByIndex", i, dev);
}
#else
API nvmlReturn_t nvmlInit_v2(void)
{
	return do_init("nvmlInit_v2");
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
	return cuda_version("nvmlSystemGetCudaDriverVersion_v2", v);
}
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
	return count("nvmlDeviceGetCount_v2", n);
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev)
{
	return handle("nvmlDeviceGetHandleByIndex_v2", i, dev);
}
#endif

/* ---- device ---- */
API nvmlReturn_t nvmlDeviceGetName(void *dev, char *buf, unsigned int len)
{
	nvmlReturn_t r = device_enter("nvmlDeviceGetName", dev);
	return r ? r : copy_string(dev_str(dev, "name"), buf, len);
}

API nvmlReturn_t nvmlDeviceGetUUID(void *dev, char *buf, unsigned int len)
{
	nvmlReturn_t r = device_enter("nvmlDeviceGetUUID", dev);
	return r ? r : copy_string(dev_str(dev, "uuid"), buf, len);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *dev, int *major, int *minor)
{
	nvmlReturn_t r = device_enter("nvmlDeviceGetCudaComputeCapability", dev);
	if (r)
		return r;
	const cJSON *cc = cJSON_GetObjectItem(dev, "cc");
	if (!major || !minor || cJSON_GetArraySize(cc) != 2)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = cJSON_GetArrayItem(cc, 0)->valueint;
	*minor = cJSON_GetArrayItem(cc, 1)->valueint;
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(void *dev, nvmlMemory_t *m)
{
	nvmlReturn_t r = device_enter("nvmlDeviceGetMemoryInfo", dev);
	if (r)
		return r;
	if (!m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = (unsigned long long)dev_num(dev, "memoryTotal");
	m->used = m->total / 100;
	m->free = m->total - m->used;
	return NVML_SUCCESS;
}

#ifndef FAKE_NVML_LEGACY
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *dev, nvmlPciInfo_t *pci)
{
	nvmlReturn_t r = device_enter("nvmlDeviceGetPciInfo_v3", dev);
	if (r)
		return r;
	if (!pci)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof(*pci));
	return copy_string(dev_str(dev, "busId"), pci->busId, sizeof(pci->busId));
}

/* "2f1e...": 32 hex digits, dashes ignored. */
static void parse_uuid(const char *s, unsigned char out[16])
{
	memset(out, 0, 16);
	for (int i = 0; s && *s && i < 32; s++) {
		if (*s == '-')
			continue;
		unsigned v;
		char hex[2] = {*s, 0};
		if (sscanf(hex, "%x", &v) != 1)
			return;
		out[i / 2] = (unsigned char)(out[i / 2] | (v << (i % 2 ? 0 : 4)));
		i++;
	}
}

static nvmlReturn_t fabric(const char *fn, void *dev, unsigned char uuid[16], nvmlReturn_t *status,
                           unsigned int *clique, unsigned char *state)
{
	nvmlReturn_t r = device_enter(fn, dev);
	if (r)
		return r;
	const cJSON *f = cJSON_GetObjectItem(dev, "fabric");
	if (!f)
		return NVML_ERROR_NOT_SUPPORTED; /* a GPU that is not fabric-attached */
	parse_uuid(dev_str(f, "clusterUuid"), uuid);
	*status = (nvmlReturn_t)dev_num(f, "status");
	*clique = (unsigned int)dev_num(f, "cliqueId");
	*state = (unsigned char)dev_num(f, "state");
	return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *dev, nvmlGpuFabricInfo_t *fi)
{
	if (!fi)
		return NVML_ERROR_INVALID_ARGUMENT;
	return fabric("nvmlDeviceGetGpuFabricInfo", dev, fi->clusterUuid, &fi->status,
	              &fi->cliqueId, &fi->state);
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *dev, nvmlGpuFabricInfo_v2_t *fi)
{
	if (!fi)
		return NVML_ERROR_INVALID_ARGUMENT;
	/* the real library checks the caller's struct version and size */
	if (fi->version != (unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2u << 24))) {
		trace("nvmlDeviceGetGpuFabricInfoV");
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	}
	fi->healthMask = 0;
	return fabric("nvmlDeviceGetGpuFabricInfoV", dev, fi->clusterUuid, &fi->status,
	              &fi->cliqueId, &fi->state);
}
#endif
