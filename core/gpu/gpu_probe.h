/* GPU inventory of a node: one shape whichever source produced it.
 *
 * Sources: NVIDIA through NVML (gpu_nvml.c, loaded with dlopen at run time),
 * AMD through the KFD topology in sysfs (gpu_rocm.c), and a JSON file
 * (gpu_file.c) for clusters and CI without GPUs. gpu_probe_to_json() renders
 * the one documented shape; the file source reads that same shape back.
 *
 * The JSON shape (what `gkm gpus -o json` prints and the compat policy gets):
 *
 *   {
 *     "source": "nvml" | "rocm" | "file" | "auto",
 *     "gpus": [{
 *       "index": 0,              node-wide id, unique across vendors: the ids
 *                                of node status and of compat verdicts
 *       "deviceIndex": 0,        the vendor's own ordinal (NVML index, HIP
 *                                ordinal in KFD node order)
 *       "vendor": "nvidia" | "amd",
 *       "backend": "cuda" | "hip",
 *       "name": "NVIDIA H100 80GB HBM3",
 *       "uuid": "GPU-...",
 *       "arch": "sm_90" | "gfx90a",
 *       "computeCapability": "9.0",        NVIDIA only
 *       "gfxTargetVersion": 90010,         AMD only (KFD encoding)
 *       "features": "sramecc+:xnack-",     AMD target features, when known
 *       "warpSize": 32 | 64,
 *       "driverVersion": "550.54.15",
 *       "cudaDriverVersion": "12.4",       NVIDIA only: newest CUDA the driver runs
 *       "memoryBytes": 85520809984,        when reported
 *       "pciBusId": "00000000:19:00.0",    when reported
 *       "fabric": {                        only where NVML reports a fabric
 *         "state": "notStarted" | "inProgress" | "completed",
 *         "clusterUuid": "...", "cliqueId": 1,
 *         "clique": "<clusterUuid>.<cliqueId>"    only once completed
 *       }
 *     }],
 *     "groups": [{"ids": [0, 1], "gpuType": "...", "backend": "cuda",
 *                 "arch": "sm_90", "warpSize": 32, "driverVersion": "550.54.15",
 *                 "cudaVersion": "12.4", "memoryBytes": 85520809984,
 *                 "fabricClique": "..."}],       (absent fields: as for gpus)
 *     "warnings": ["..."]                  only when a GPU could not be read
 *   }
 *
 * Groups: GPUs with identical type (name), arch, driver version, memory and
 * fabric clique share one id set, in order of their lowest id; this is the
 * gpus[] list of node status, field for field (the CRD's names). */
#ifndef GKM_GPU_PROBE_H
#define GKM_GPU_PROBE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds on what a source may report (outside input). */
#define GPU_PROBE_MAX_GPUS 256
#define GPU_PROBE_MAX_WARNINGS 32

enum gpu_fabric_state {
	GPU_FABRIC_NONE = 0, /* not fabric-attached, or not reported */
	GPU_FABRIC_NOT_STARTED,
	GPU_FABRIC_IN_PROGRESS,
	GPU_FABRIC_COMPLETED,
};

struct gpu_info {
	int index;        /* node-wide id, set by gpu_probe_add() */
	int device_index; /* the vendor's ordinal */
	char vendor[16];  /* "nvidia", "amd" */
	char backend[8];  /* "cuda", "hip" */
	char name[96];
	char uuid[96];
	char arch[48];               /* "sm_90", "gfx90a" */
	int cc_major, cc_minor;      /* -1 when not NVIDIA */
	unsigned gfx_target_version; /* 0 when not AMD */
	char features[48];           /* "sramecc+:xnack-" or "" */
	int warp_size;               /* 0 if unknown */
	char driver_version[80];
	char cuda_driver_version[16]; /* "12.4" or "" */
	uint64_t memory_bytes;        /* 0 if unknown */
	char pci_bus_id[32];
	enum gpu_fabric_state fabric_state;
	char fabric_cluster_uuid[40]; /* canonical 8-4-4-4-12 lowercase hex */
	uint32_t fabric_clique_id;
	bool fabric_has_clique; /* completed, status success, non-zero cluster */
};

struct gpu_probe {
	char source[8]; /* "nvml", "rocm", "file", "auto" */
	struct gpu_info *gpus;
	size_t count, cap;
	char *warnings[GPU_PROBE_MAX_WARNINGS];
	size_t nwarnings;
};

/* An empty inventory for source src. Free with gpu_probe_free(). */
__attribute__((warn_unused_result)) int gpu_probe_new(const char *src, struct gpu_probe **out);
void gpu_probe_free(struct gpu_probe *p);

/* Append a copy of g, giving it the next node-wide index.
 * 0, -ENOMEM, or -E2BIG past GPU_PROBE_MAX_GPUS. */
__attribute__((warn_unused_result)) int gpu_probe_add(struct gpu_probe *p,
                                                      const struct gpu_info *g);
/* Record a per-GPU problem that did not stop the probe (printf format). */
void gpu_probe_warn(struct gpu_probe *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A gpu_info with every field "unknown" (cc -1, strings empty). */
void gpu_info_init(struct gpu_info *g);

/* "<clusterUuid>.<cliqueId>" into buf, or "" when the GPU has no clique. */
void gpu_info_clique(const struct gpu_info *g, char *buf, size_t len);

/* Render the documented JSON shape (groups included). Caller frees with
 * cJSON_Delete(). NULL only on allocation failure. */
cJSON *gpu_probe_to_json(const struct gpu_probe *p);

#endif
