/* NVIDIA GPUs through NVML, loaded with dlopen at run time so that gkm has
 * no build or link dependency on the driver. The few NVML types and
 * constants used here are declared below from the NVML API reference
 * (nvml.h of the R5xx drivers); their layouts are part of NVML's stable ABI.
 *
 * Versioned entry points (_v2, _v3, ...V) are preferred and the older
 * spellings used when a driver lacks them. Fabric information (NVLink
 * domains, GB200/H100 NVL) comes from nvmlDeviceGetGpuFabricInfoV with the
 * v2 struct (R550+) or nvmlDeviceGetGpuFabricInfo (R525+); drivers or GPUs
 * without it simply report no fabric. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpu_sources.h"

/* ---- From the NVML API reference ---- */
typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
};
typedef struct nvmlDevice_st *nvmlDevice_t;

#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_GPU_FABRIC_UUID_LEN 16

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef unsigned char nvmlGpuFabricState_t;
enum {
	NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0,
	NVML_GPU_FABRIC_STATE_NOT_STARTED = 1,
	NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2,
	NVML_GPU_FABRIC_STATE_COMPLETED = 3,
};

typedef struct { /* nvmlGpuFabricInfo_t (R525) */
	unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
	nvmlReturn_t status;
	unsigned int cliqueId;
	nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

typedef struct { /* nvmlGpuFabricInfo_v2_t (R550), for nvmlDeviceGetGpuFabricInfoV */
	unsigned int version;
	unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
	nvmlReturn_t status;
	unsigned int cliqueId;
	nvmlGpuFabricState_t state;
	unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;
/* NVML_STRUCT_VERSION(GpuFabricInfo, 2): the size, and the version in the top byte */
#define nvmlGpuFabricInfo_v2 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2u << 24)))

/* ---- The entry points gkm uses ---- */
struct nvml {
	void *handle;
	nvmlReturn_t (*init)(void);
	nvmlReturn_t (*shutdown)(void);
	const char *(*error_string)(nvmlReturn_t);
	nvmlReturn_t (*driver_version)(char *, unsigned int);
	nvmlReturn_t (*cuda_driver_version)(int *);
	nvmlReturn_t (*count)(unsigned int *);
	nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t *);
	nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned int);
	nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
	nvmlReturn_t (*cc)(nvmlDevice_t, int *, int *);
	nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
	nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
	nvmlReturn_t (*fabric_v)(nvmlDevice_t, nvmlGpuFabricInfo_v2_t *);
	nvmlReturn_t (*fabric)(nvmlDevice_t, nvmlGpuFabricInfo_t *);
};

/* The first of the names the library exports, or NULL. */
static void *sym(void *h, const char *a, const char *b)
{
	void *p = dlsym(h, a);
	if (!p && b)
		p = dlsym(h, b);
	return p;
}

/* POSIX guarantees object and function pointers convert through dlsym. */
#define LOAD(field, ...) (*(void **)&n->field = sym(n->handle, __VA_ARGS__))

static int nvml_open(struct nvml *n, const char *lib, char *err, size_t errlen)
{
	memset(n, 0, sizeof(*n));
	n->handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!n->handle) {
		const char *why = dlerror();
		snprintf(err, errlen, "cannot load %s: %s", lib, why ? why : "unknown error");
		return -ENOENT;
	}
	LOAD(init, "nvmlInit_v2", "nvmlInit");
	LOAD(shutdown, "nvmlShutdown", NULL);
	LOAD(error_string, "nvmlErrorString", NULL);
	LOAD(driver_version, "nvmlSystemGetDriverVersion", NULL);
	LOAD(count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
	LOAD(handle_by_index, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
	LOAD(name, "nvmlDeviceGetName", NULL);
	LOAD(uuid, "nvmlDeviceGetUUID", NULL);
	LOAD(cc, "nvmlDeviceGetCudaComputeCapability", NULL);
	const char *missing = !n->init              ? "nvmlInit_v2"
	                      : !n->shutdown        ? "nvmlShutdown"
	                      : !n->error_string    ? "nvmlErrorString"
	                      : !n->driver_version  ? "nvmlSystemGetDriverVersion"
	                      : !n->count           ? "nvmlDeviceGetCount_v2"
	                      : !n->handle_by_index ? "nvmlDeviceGetHandleByIndex_v2"
	                      : !n->name            ? "nvmlDeviceGetName"
	                      : !n->uuid            ? "nvmlDeviceGetUUID"
	                      : !n->cc              ? "nvmlDeviceGetCudaComputeCapability"
	                                            : NULL;
	if (missing) {
		snprintf(err, errlen, "%s lacks %s (driver too old?)", lib, missing);
		dlclose(n->handle);
		n->handle = NULL;
		return -ENOSYS;
	}
	/* optional: older drivers lack them, and the probe reports less */
	LOAD(cuda_driver_version, "nvmlSystemGetCudaDriverVersion_v2",
	     "nvmlSystemGetCudaDriverVersion");
	LOAD(memory, "nvmlDeviceGetMemoryInfo", NULL);
	LOAD(pci, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2");
	LOAD(fabric_v, "nvmlDeviceGetGpuFabricInfoV", NULL);
	LOAD(fabric, "nvmlDeviceGetGpuFabricInfo", NULL);
	return 0;
}

static const char *nvml_err(const struct nvml *n, nvmlReturn_t r)
{
	const char *s = n->error_string ? n->error_string(r) : NULL;
	return s ? s : "unknown NVML error";
}

static void format_uuid(const unsigned char u[16], char *buf, size_t len)
{
	snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
	         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
	         u[13], u[14], u[15]);
}

/* Fill the fabric fields of g; silent when the GPU or driver has no fabric. */
static void read_fabric(const struct nvml *n, nvmlDevice_t dev, struct gpu_info *g,
                        struct gpu_probe *p)
{
	unsigned char cluster[NVML_GPU_FABRIC_UUID_LEN] = {0};
	nvmlReturn_t status = NVML_SUCCESS;
	unsigned int clique = 0;
	nvmlGpuFabricState_t state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
	nvmlReturn_t r = NVML_ERROR_FUNCTION_NOT_FOUND;

	if (n->fabric_v) {
		nvmlGpuFabricInfo_v2_t fi;
		memset(&fi, 0, sizeof(fi));
		fi.version = nvmlGpuFabricInfo_v2;
		r = n->fabric_v(dev, &fi);
		memcpy(cluster, fi.clusterUuid, sizeof(cluster));
		status = fi.status;
		clique = fi.cliqueId;
		state = fi.state;
	}
	/* an R550+ library answers ...InfoV; older ones only the unversioned call */
	if (r == NVML_ERROR_FUNCTION_NOT_FOUND && n->fabric) {
		nvmlGpuFabricInfo_t fi;
		memset(&fi, 0, sizeof(fi));
		r = n->fabric(dev, &fi);
		memcpy(cluster, fi.clusterUuid, sizeof(cluster));
		status = fi.status;
		clique = fi.cliqueId;
		state = fi.state;
	}
	if (r == NVML_ERROR_FUNCTION_NOT_FOUND || r == NVML_ERROR_NOT_SUPPORTED)
		return;
	if (r != NVML_SUCCESS) {
		gpu_probe_warn(p, "GPU %d: nvmlDeviceGetGpuFabricInfo: %s", g->device_index,
		               nvml_err(n, r));
		return;
	}
	switch (state) {
	case NVML_GPU_FABRIC_STATE_NOT_STARTED:
		g->fabric_state = GPU_FABRIC_NOT_STARTED;
		return;
	case NVML_GPU_FABRIC_STATE_IN_PROGRESS:
		g->fabric_state = GPU_FABRIC_IN_PROGRESS;
		return;
	case NVML_GPU_FABRIC_STATE_COMPLETED:
		break;
	default:
		return; /* NOT_SUPPORTED, or a state newer than this code */
	}
	g->fabric_state = GPU_FABRIC_COMPLETED;
	format_uuid(cluster, g->fabric_cluster_uuid, sizeof(g->fabric_cluster_uuid));
	g->fabric_clique_id = clique;
	static const unsigned char zero[NVML_GPU_FABRIC_UUID_LEN];
	if (status != NVML_SUCCESS)
		gpu_probe_warn(p, "GPU %d: fabric registration failed: %s", g->device_index,
		               nvml_err(n, status));
	else if (memcmp(cluster, zero, sizeof(zero)) != 0)
		g->fabric_has_clique = true;
}

/* One device; 1 if it was added, 0 if skipped with a warning, <0 on error. */
static int read_device(const struct nvml *n, unsigned int i, const char *driver, const char *cuda,
                       struct gpu_probe *p)
{
	struct gpu_info g;
	gpu_info_init(&g);
	g.device_index = (int)i;
	snprintf(g.vendor, sizeof(g.vendor), "nvidia");
	snprintf(g.backend, sizeof(g.backend), "cuda");
	snprintf(g.driver_version, sizeof(g.driver_version), "%s", driver);
	snprintf(g.cuda_driver_version, sizeof(g.cuda_driver_version), "%s", cuda);
	g.warp_size = 32; /* every CUDA GPU so far */

	nvmlDevice_t dev = NULL;
	const char *call = "nvmlDeviceGetHandleByIndex";
	nvmlReturn_t r = n->handle_by_index(i, &dev);
	char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "";
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
	if (r == NVML_SUCCESS) {
		call = "nvmlDeviceGetName";
		r = n->name(dev, name, sizeof(name));
	}
	if (r == NVML_SUCCESS) {
		call = "nvmlDeviceGetUUID";
		r = n->uuid(dev, uuid, sizeof(uuid));
	}
	if (r == NVML_SUCCESS) {
		call = "nvmlDeviceGetCudaComputeCapability";
		r = n->cc(dev, &g.cc_major, &g.cc_minor);
	}
	if (r == NVML_SUCCESS &&
	    (g.cc_major < 1 || g.cc_major > 99 || g.cc_minor < 0 || g.cc_minor > 9)) {
		gpu_probe_warn(p, "GPU %u: implausible compute capability %d.%d", i, g.cc_major,
		               g.cc_minor);
		return 0;
	}
	if (r != NVML_SUCCESS) {
		gpu_probe_warn(p, "GPU %u: %s: %s", i, call, nvml_err(n, r));
		return 0;
	}
	name[sizeof(name) - 1] = uuid[sizeof(uuid) - 1] = '\0';
	snprintf(g.name, sizeof(g.name), "%s", name);
	snprintf(g.uuid, sizeof(g.uuid), "%s", uuid);
	snprintf(g.arch, sizeof(g.arch), "sm_%d%d", g.cc_major, g.cc_minor);

	if (n->memory) {
		nvmlMemory_t m;
		memset(&m, 0, sizeof(m));
		r = n->memory(dev, &m);
		if (r == NVML_SUCCESS)
			g.memory_bytes = m.total;
		else if (r != NVML_ERROR_NOT_SUPPORTED)
			gpu_probe_warn(p, "GPU %u: nvmlDeviceGetMemoryInfo: %s", i, nvml_err(n, r));
	}
	if (n->pci) {
		nvmlPciInfo_t pci;
		memset(&pci, 0, sizeof(pci));
		r = n->pci(dev, &pci);
		if (r == NVML_SUCCESS) {
			pci.busId[sizeof(pci.busId) - 1] = '\0';
			snprintf(g.pci_bus_id, sizeof(g.pci_bus_id), "%s", pci.busId);
		} else if (r != NVML_ERROR_NOT_SUPPORTED) {
			gpu_probe_warn(p, "GPU %u: nvmlDeviceGetPciInfo: %s", i, nvml_err(n, r));
		}
	}
	read_fabric(n, dev, &g, p);
	r = gpu_probe_add(p, &g);
	return r < 0 ? r : 1;
}

int gpu_nvml_probe(const char *lib, struct gpu_probe **out, char *err, size_t errlen)
{
	struct nvml n;
	struct gpu_probe *p = NULL;
	bool initialised = false;
	if (!lib)
		lib = "libnvidia-ml.so.1";
	int rc = nvml_open(&n, lib, err, errlen);
	if (rc < 0)
		return rc;

	nvmlReturn_t r = n.init();
	if (r != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlInit: %s", nvml_err(&n, r));
		rc = -ENODEV;
		goto out;
	}
	initialised = true;

	char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "";
	r = n.driver_version(driver, sizeof(driver));
	if (r != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlSystemGetDriverVersion: %s", nvml_err(&n, r));
		rc = -EIO;
		goto out;
	}
	driver[sizeof(driver) - 1] = '\0';

	char cuda[16] = "";
	int cv = 0;
	if (n.cuda_driver_version && n.cuda_driver_version(&cv) == NVML_SUCCESS && cv > 0)
		snprintf(cuda, sizeof(cuda), "%d.%d", cv / 1000, (cv % 1000) / 10);

	unsigned int count = 0;
	r = n.count(&count);
	if (r != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlDeviceGetCount: %s", nvml_err(&n, r));
		rc = -EIO;
		goto out;
	}
	if (count > GPU_PROBE_MAX_GPUS) {
		snprintf(err, errlen, "NVML reports %u GPUs, more than the %d gkm handles", count,
		         GPU_PROBE_MAX_GPUS);
		rc = -E2BIG;
		goto out;
	}
	rc = gpu_probe_new("nvml", &p);
	for (unsigned int i = 0; rc == 0 && i < count; i++) {
		rc = read_device(&n, i, driver, cuda, p);
		if (rc > 0)
			rc = 0;
	}
	if (rc < 0) {
		snprintf(err, errlen, "%s", strerror(-rc));
		goto out;
	}
	*out = p;
	p = NULL;
out:
	gpu_probe_free(p);
	if (initialised)
		n.shutdown();
	dlclose(n.handle);
	return rc;
}
