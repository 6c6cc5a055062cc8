#include "gpu_probe.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpu_probe_new(const char *src, struct gpu_probe **out)
{
	struct gpu_probe *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	snprintf(p->source, sizeof(p->source), "%s", src);
	*out = p;
	return 0;
}

void gpu_probe_free(struct gpu_probe *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nwarnings; i++)
		free(p->warnings[i]);
	free(p->gpus);
	free(p);
}

void gpu_info_init(struct gpu_info *g)
{
	memset(g, 0, sizeof(*g));
	g->cc_major = -1;
	g->cc_minor = -1;
}

int gpu_probe_add(struct gpu_probe *p, const struct gpu_info *g)
{
	if (p->count >= GPU_PROBE_MAX_GPUS)
		return -E2BIG;
	if (p->count == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 8;
		struct gpu_info *n = realloc(p->gpus, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		p->gpus = n;
		p->cap = cap;
	}
	p->gpus[p->count] = *g;
	p->gpus[p->count].index = (int)p->count;
	p->count++;
	return 0;
}

void gpu_probe_warn(struct gpu_probe *p, const char *fmt, ...)
{
	if (p->nwarnings >= GPU_PROBE_MAX_WARNINGS)
		return;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	char *s = strdup(buf);
	if (s)
		p->warnings[p->nwarnings++] = s;
}

void gpu_info_clique(const struct gpu_info *g, char *buf, size_t len)
{
	if (g->fabric_has_clique)
		snprintf(buf, len, "%s.%u", g->fabric_cluster_uuid, (unsigned)g->fabric_clique_id);
	else if (len)
		buf[0] = '\0';
}

static const char *fabric_state_name(enum gpu_fabric_state s)
{
	switch (s) {
	case GPU_FABRIC_NOT_STARTED:
		return "notStarted";
	case GPU_FABRIC_IN_PROGRESS:
		return "inProgress";
	case GPU_FABRIC_COMPLETED:
		return "completed";
	default:
		return NULL;
	}
}

/* cJSON_Add*ToObject return NULL on allocation failure; collect that in *ok. */
static void add_str(cJSON *o, const char *k, const char *v, bool *ok)
{
	if (v && *v && !cJSON_AddStringToObject(o, k, v))
		*ok = false;
}

static void add_num(cJSON *o, const char *k, double v, bool *ok)
{
	if (!cJSON_AddNumberToObject(o, k, v))
		*ok = false;
}

static cJSON *gpu_to_json(const struct gpu_info *g)
{
	bool ok = true;
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	add_num(o, "index", g->index, &ok);
	add_num(o, "deviceIndex", g->device_index, &ok);
	add_str(o, "vendor", g->vendor, &ok);
	add_str(o, "backend", g->backend, &ok);
	add_str(o, "name", g->name, &ok);
	add_str(o, "uuid", g->uuid, &ok);
	add_str(o, "arch", g->arch, &ok);
	if (g->cc_major >= 0) {
		char cc[24];
		snprintf(cc, sizeof(cc), "%d.%d", g->cc_major, g->cc_minor);
		add_str(o, "computeCapability", cc, &ok);
	}
	if (g->gfx_target_version)
		add_num(o, "gfxTargetVersion", g->gfx_target_version, &ok);
	add_str(o, "features", g->features, &ok);
	if (g->warp_size > 0)
		add_num(o, "warpSize", g->warp_size, &ok);
	add_str(o, "driverVersion", g->driver_version, &ok);
	add_str(o, "cudaDriverVersion", g->cuda_driver_version, &ok);
	/* doubles hold integers exactly up to 2^53 bytes (8 PiB) */
	if (g->memory_bytes)
		add_num(o, "memoryBytes", (double)g->memory_bytes, &ok);
	add_str(o, "pciBusId", g->pci_bus_id, &ok);
	const char *state = fabric_state_name(g->fabric_state);
	if (state) {
		cJSON *f = cJSON_AddObjectToObject(o, "fabric");
		if (!f) {
			ok = false;
		} else {
			add_str(f, "state", state, &ok);
			add_str(f, "clusterUuid", g->fabric_cluster_uuid, &ok);
			if (g->fabric_state == GPU_FABRIC_COMPLETED)
				add_num(f, "cliqueId", g->fabric_clique_id, &ok);
			char clique[64];
			gpu_info_clique(g, clique, sizeof(clique));
			add_str(f, "clique", clique, &ok);
		}
	}
	if (!ok) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

static bool same_group(const struct gpu_info *a, const struct gpu_info *b)
{
	char ca[64], cb[64];
	gpu_info_clique(a, ca, sizeof(ca));
	gpu_info_clique(b, cb, sizeof(cb));
	return strcmp(a->name, b->name) == 0 && strcmp(a->arch, b->arch) == 0 &&
	       strcmp(a->driver_version, b->driver_version) == 0 && strcmp(ca, cb) == 0 &&
	       a->memory_bytes == b->memory_bytes;
}

/* Groups in order of their lowest id; O(n^2) over at most
 * GPU_PROBE_MAX_GPUS entries. */
static cJSON *groups_to_json(const struct gpu_probe *p)
{
	cJSON *arr = cJSON_CreateArray();
	bool *done = calloc(p->count ? p->count : 1, sizeof(bool));
	bool ok = arr && done;
	for (size_t i = 0; ok && i < p->count; i++) {
		if (done[i])
			continue;
		const struct gpu_info *g = &p->gpus[i];
		cJSON *grp = cJSON_CreateObject();
		if (!grp || !cJSON_AddItemToArray(arr, grp)) {
			cJSON_Delete(grp);
			ok = false;
			break;
		}
		cJSON *ids = cJSON_AddArrayToObject(grp, "ids");
		if (!ids) {
			ok = false;
			break;
		}
		for (size_t j = i; j < p->count; j++) {
			if (done[j] || !same_group(g, &p->gpus[j]))
				continue;
			done[j] = true;
			cJSON *id = cJSON_CreateNumber(p->gpus[j].index);
			if (!id || !cJSON_AddItemToArray(ids, id)) {
				cJSON_Delete(id);
				ok = false;
			}
		}
		/* the fields of the node status gpus[] items (the CRD's names) */
		add_str(grp, "gpuType", g->name, &ok);
		add_str(grp, "backend", g->backend, &ok);
		add_str(grp, "arch", g->arch, &ok);
		if (g->warp_size > 0)
			add_num(grp, "warpSize", g->warp_size, &ok);
		add_str(grp, "driverVersion", g->driver_version, &ok);
		add_str(grp, "cudaVersion", g->cuda_driver_version, &ok);
		if (g->memory_bytes)
			add_num(grp, "memoryBytes", (double)g->memory_bytes, &ok);
		char clique[64];
		gpu_info_clique(g, clique, sizeof(clique));
		add_str(grp, "fabricClique", clique, &ok);
	}
	free(done);
	if (!ok) {
		cJSON_Delete(arr);
		return NULL;
	}
	return arr;
}

cJSON *gpu_probe_to_json(const struct gpu_probe *p)
{
	cJSON *root = cJSON_CreateObject();
	bool ok = root != NULL;
	if (ok)
		add_str(root, "source", p->source, &ok);
	cJSON *gpus = ok ? cJSON_AddArrayToObject(root, "gpus") : NULL;
	ok = ok && gpus;
	for (size_t i = 0; ok && i < p->count; i++) {
		cJSON *g = gpu_to_json(&p->gpus[i]);
		if (!g || !cJSON_AddItemToArray(gpus, g)) {
			cJSON_Delete(g);
			ok = false;
		}
	}
	cJSON *groups = ok ? groups_to_json(p) : NULL;
	if (groups && !cJSON_AddItemToObject(root, "groups", groups)) {
		cJSON_Delete(groups);
		groups = NULL;
	}
	ok = ok && groups;
	if (ok && p->nwarnings) {
		cJSON *w = cJSON_AddArrayToObject(root, "warnings");
		ok = w != NULL;
		for (size_t i = 0; ok && i < p->nwarnings; i++) {
			cJSON *s = cJSON_CreateString(p->warnings[i]);
			if (!s || !cJSON_AddItemToArray(w, s)) {
				cJSON_Delete(s);
				ok = false;
			}
		}
	}
	if (!ok) {
		cJSON_Delete(root);
		return NULL;
	}
	return root;
}
