/* gpu_probe_auto(): every GPU source present on the node, merged. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpu_sources.h"

/* Append every GPU and warning of src to dst, renumbering node-wide ids. */
static int merge(struct gpu_probe *dst, const struct gpu_probe *src)
{
	for (size_t i = 0; i < src->count; i++) {
		int r = gpu_probe_add(dst, &src->gpus[i]);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < src->nwarnings; i++)
		gpu_probe_warn(dst, "%s", src->warnings[i]);
	return 0;
}

/* Fold one source's outcome into the merged inventory: its GPUs if it
 * answered, nothing if it is absent from the node (-ENOENT), a warning if it
 * is present but broken. */
static int absorb(struct gpu_probe *all, int r, const struct gpu_probe *src, const char *name,
                  const char *why)
{
	if (r == 0)
		return merge(all, src);
	if (r != -ENOENT)
		gpu_probe_warn(all, "%s: %s", name, why);
	return 0;
}

int gpu_probe_auto(const char *nvml_lib, const char *sysfs_root, struct gpu_probe **out, char *err,
                   size_t errlen)
{
	struct gpu_probe *all = NULL, *nv = NULL, *amd = NULL;
	char why[512] = "";
	int r = gpu_probe_new("auto", &all);
	/* each probe runs before absorb() reads its output */
	if (r == 0) {
		r = gpu_nvml_probe(nvml_lib, &nv, why, sizeof(why));
		r = absorb(all, r, nv, "nvml", why);
	}
	if (r == 0) {
		r = gpu_rocm_probe(sysfs_root, &amd, why, sizeof(why));
		r = absorb(all, r, amd, "rocm", why);
	}
	if (r == 0) {
		*out = all;
		all = NULL;
	} else {
		snprintf(err, errlen, "%s", strerror(-r));
	}
	gpu_probe_free(amd);
	gpu_probe_free(nv);
	gpu_probe_free(all);
	return r;
}
