/* Where a node's GPU inventory (gpu_probe.h) comes from: NVML, the AMD KFD
 * topology in sysfs, a JSON file, or every source present, merged. */
#ifndef GKM_GPU_SOURCES_H
#define GKM_GPU_SOURCES_H

#include <stddef.h>

#include "gpu_probe.h"

/* ---- Sources. Each fills a fresh inventory; on failure *out is untouched
 * and err says why ("libnvidia-ml.so.1: cannot open shared object ..."). ---- */

/* NVML. lib is the library to dlopen, NULL for "libnvidia-ml.so.1".
 * -ENOENT: library not found; -ENODEV: NVML loaded but init failed (no
 * driver); -ENOSYS: a required symbol is missing; -EIO: a call failed. */
__attribute__((warn_unused_result)) int gpu_nvml_probe(const char *lib, struct gpu_probe **out,
                                                       char *err, size_t errlen);

/* AMD KFD topology under sysfs_root (NULL for "/sys").
 * -ENOENT: no KFD topology there; -EINVAL: a malformed properties file. */
__attribute__((warn_unused_result)) int
gpu_rocm_probe(const char *sysfs_root, struct gpu_probe **out, char *err, size_t errlen);
/* "gfx90a" from KFD's gfx_target_version 90010 (decimal major, then minor
 * and stepping as hex digits). -EINVAL if v is 0 or out of range. */
__attribute__((warn_unused_result)) int gpu_rocm_gfx_name(unsigned v, char *buf, size_t len);

/* A JSON document of the shape above (gpus[] is required; index, groups and
 * source are recomputed). At most 1 MiB. -EINVAL with err naming the field. */
__attribute__((warn_unused_result)) int gpu_file_probe(const char *path, struct gpu_probe **out,
                                                       char *err, size_t errlen);
__attribute__((warn_unused_result)) int
gpu_file_parse(const char *text, size_t len, struct gpu_probe **out, char *err, size_t errlen);

/* Every source that is present on this node, merged (NVIDIA first). Absent
 * sources are not errors; a source that is present but broken is reported
 * as a warning. nvml_lib/sysfs_root as above. */
__attribute__((warn_unused_result)) int gpu_probe_auto(const char *nvml_lib, const char *sysfs_root,
                                                       struct gpu_probe **out, char *err,
                                                       size_t errlen);

#endif
