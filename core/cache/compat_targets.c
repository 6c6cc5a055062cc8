#include "compat_targets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jsonfile.h"

static const char *const summary_labels[] = {"cache.triton.image/summary",
                                             "cache.vllm.image/summary"};

/* The distinct targets found so far: the list handed out, and the targets'
 * compact JSON texts, sorted, to find duplicates in O(log n). */
struct targets {
	cJSON *list;
	char **keys;
	size_t n;
};

/* Append a copy of t unless an equal target is there already.
 * 0, -ENOMEM, or -E2BIG past COMPAT_TARGETS_MAX. */
static int add_unique(struct targets *ts, const cJSON *t)
{
	char *key = cJSON_PrintUnformatted(t);
	if (!key)
		return -ENOMEM;
	/* the insertion point: first key not less than key */
	size_t lo = 0, hi = ts->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(ts->keys[mid], key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < ts->n && strcmp(ts->keys[lo], key) == 0) {
		free(key);
		return 0;
	}
	if (ts->n >= COMPAT_TARGETS_MAX) {
		free(key);
		return -E2BIG;
	}
	if (!ts->keys) {
		ts->keys = calloc(COMPAT_TARGETS_MAX, sizeof(*ts->keys));
		if (!ts->keys) {
			free(key);
			return -ENOMEM;
		}
	}
	cJSON *copy = cJSON_Duplicate(t, true);
	if (!copy || !cJSON_AddItemToArray(ts->list, copy)) {
		cJSON_Delete(copy);
		free(key);
		return -ENOMEM;
	}
	memmove(ts->keys + lo + 1, ts->keys + lo, (ts->n - lo) * sizeof(*ts->keys));
	ts->keys[lo] = key;
	ts->n++;
	return 0;
}

/* Hand the list out (*out) on r == 0, free everything else. Returns r. */
static int targets_finish(struct targets *ts, int r, cJSON **out)
{
	for (size_t i = 0; i < ts->n; i++)
		free(ts->keys[i]);
	free(ts->keys);
	if (r == 0)
		*out = ts->list;
	else
		cJSON_Delete(ts->list);
	return r;
}

int compat_targets_from_labels(const cJSON *labels, cJSON **out, char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof(summary_labels) / sizeof(summary_labels[0]); i++) {
		const char *label = summary_labels[i];
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(labels, label);
		if (!v)
			continue;
		const char *s = cJSON_GetStringValue(v);
		if (!s) {
			snprintf(err, errlen, "label %s: not a string", label);
			return -EINVAL;
		}
		size_t len = strlen(s);
		if (len > COMPAT_TARGETS_MAX_JSON) {
			snprintf(err, errlen, "label %s: longer than %d bytes", label,
			         COMPAT_TARGETS_MAX_JSON);
			return -E2BIG;
		}
		cJSON *summary = NULL;
		int r = jsonfile_parse(label, s, len, &summary, err, errlen);
		if (r < 0)
			return r;
		const cJSON *targets = cJSON_GetObjectItemCaseSensitive(summary, "targets");
		struct targets ts = {.list = cJSON_CreateArray()};
		if (!cJSON_IsArray(targets)) {
			snprintf(err, errlen, "label %s: want {\"targets\": [...]}", label);
			r = -EINVAL;
		} else if (!ts.list) {
			r = -ENOMEM;
		}
		const cJSON *t;
		cJSON_ArrayForEach(t, targets)
		{
			if (r < 0)
				break;
			r = add_unique(&ts, t);
		}
		if (r == -E2BIG)
			snprintf(err, errlen, "label %s: more than %d targets", label,
			         COMPAT_TARGETS_MAX);
		cJSON_Delete(summary);
		return targets_finish(&ts, r, out);
	}
	snprintf(err, errlen, "no cache.triton.image/summary or cache.vllm.image/summary label");
	return -ENOENT;
}

/* ---- Cache directories ---- */

struct walk {
	struct targets ts;
	size_t visited;
	char *err;
	size_t errlen;
};

static int add_field(cJSON *t, const char *name, const cJSON *v)
{
	if (!v || cJSON_IsNull(v))
		return 0;
	cJSON *c = cJSON_Duplicate(v, true);
	if (!c || !cJSON_AddItemToObject(t, name, c)) {
		cJSON_Delete(c);
		return -ENOMEM;
	}
	return 0;
}

/* {backend, arch, warp_size, ptx_version?} from a Triton kernel JSON or an
 * MCV manifest entry: "target" holds the first three, or the entry itself
 * does (manifests flatten it). */
static int add_triton(struct walk *w, const cJSON *entry)
{
	const cJSON *target = cJSON_GetObjectItemCaseSensitive(entry, "target");
	if (!cJSON_IsObject(target))
		target = entry;
	cJSON *t = cJSON_CreateObject();
	int r = t ? 0 : -ENOMEM;
	if (r == 0)
		r = add_field(t, "backend", cJSON_GetObjectItemCaseSensitive(target, "backend"));
	if (r == 0)
		r = add_field(t, "arch", cJSON_GetObjectItemCaseSensitive(target, "arch"));
	if (r == 0)
		r = add_field(t, "warp_size",
		              cJSON_GetObjectItemCaseSensitive(target, "warp_size"));
	if (r == 0)
		r = add_field(t, "ptx_version",
		              cJSON_GetObjectItemCaseSensitive(entry, "ptx_version"));
	if (r == 0)
		r = add_unique(&w->ts, t);
	cJSON_Delete(t);
	return r;
}

/* A vLLM binary cache knows its device and CUDA version, not its arch. */
static int add_vllm_env(struct walk *w, const cJSON *env)
{
	const char *device =
	    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(env, "VLLM_TARGET_DEVICE"));
	if (!device)
		return 0;
	cJSON *t = cJSON_CreateObject();
	int r = t && cJSON_AddStringToObject(t, "backend", device) ? 0 : -ENOMEM;
	const cJSON *cuda = cJSON_GetObjectItemCaseSensitive(env, "VLLM_MAIN_CUDA_VERSION");
	if (r == 0 && strcmp(device, "cuda") == 0 && cJSON_IsString(cuda))
		r = add_field(t, "cuda_version", cuda);
	if (r == 0)
		r = add_unique(&w->ts, t);
	cJSON_Delete(t);
	return r;
}

/* Every target a manifest (or any JSON document) describes, depth-bounded. */
static int collect(struct walk *w, const cJSON *j, int depth)
{
	if (depth > COMPAT_TARGETS_MAX_DEPTH)
		return 0;
	if (cJSON_IsObject(j)) {
		const cJSON *target = cJSON_GetObjectItemCaseSensitive(j, "target");
		const cJSON *backend = cJSON_GetObjectItemCaseSensitive(j, "backend");
		const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "env");
		if ((cJSON_IsObject(target) &&
		     cJSON_GetObjectItemCaseSensitive(target, "backend")) ||
		    cJSON_IsString(backend))
			return add_triton(w, j);
		if (cJSON_IsObject(env))
			return add_vllm_env(w, env);
	}
	if (!cJSON_IsObject(j) && !cJSON_IsArray(j))
		return 0;
	const cJSON *c;
	cJSON_ArrayForEach(c, j)
	{
		int r = collect(w, c, depth + 1);
		if (r < 0)
			return r;
	}
	return 0;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* One JSON file: a kernel's metadata or a binary cache's key factors. Files
 * that are neither, too large or not JSON at all are not metadata: skipped. */
static int read_json(struct walk *w, const char *path, const char *name, off_t size)
{
	if (strncmp(name, "__grp__", 7) == 0 || size > COMPAT_TARGETS_MAX_JSON)
		return 0;
	cJSON *j = NULL;
	char why[256];
	if (jsonfile_read(path, &j, why, sizeof(why)) < 0)
		return 0;
	int r = 0;
	const cJSON *target = cJSON_GetObjectItemCaseSensitive(j, "target");
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "env");
	if (cJSON_IsObject(target))
		r = add_triton(w, j);
	else if (strcmp(name, "cache_key_factors.json") == 0 && cJSON_IsObject(env))
		r = add_vllm_env(w, env);
	cJSON_Delete(j);
	return r;
}

static int walk_dir(struct walk *w, const char *dir, int depth)
{
	if (depth > COMPAT_TARGETS_MAX_DEPTH)
		return 0;
	DIR *d = opendir(dir);
	if (!d) {
		int r = -errno;
		snprintf(w->err, w->errlen, "%s: %s", dir, strerror(errno));
		return r;
	}
	int r = 0;
	struct dirent *e;
	char path[4096];
	while (r == 0 && (e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (++w->visited > COMPAT_TARGETS_MAX_FILES) {
			snprintf(w->err, w->errlen, "more than %d entries in the cache",
			         COMPAT_TARGETS_MAX_FILES);
			r = -E2BIG;
			break;
		}
		int n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		struct stat st;
		if (n < 0 || (size_t)n >= sizeof(path) || lstat(path, &st) != 0)
			continue;
		if (S_ISDIR(st.st_mode))
			r = walk_dir(w, path, depth + 1);
		else if (S_ISREG(st.st_mode) && ends_with(e->d_name, ".json"))
			r = read_json(w, path, e->d_name, st.st_size);
	}
	closedir(d);
	return r;
}

int compat_targets_from_dir(const char *dir, cJSON **out, char *err, size_t errlen)
{
	static const char *const manifests[] = {"io.triton.manifest/manifest.json",
	                                        "io.vllm.manifest/manifest.json"};
	struct walk w = {.ts = {.list = cJSON_CreateArray()}, .err = err, .errlen = errlen};
	if (!w.ts.list)
		return -ENOMEM;
	int r = 0;
	bool manifest = false;
	for (size_t i = 0; r == 0 && i < sizeof(manifests) / sizeof(manifests[0]); i++) {
		char path[4096];
		struct stat st;
		int n = snprintf(path, sizeof(path), "%s/%s", dir, manifests[i]);
		if (n < 0 || (size_t)n >= sizeof(path) || lstat(path, &st) != 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		cJSON *j = NULL;
		r = jsonfile_read(path, &j, err, errlen);
		if (r == 0)
			r = collect(&w, j, 0);
		cJSON_Delete(j);
		manifest = true;
	}
	/* a manifest without targets says nothing: look at the kernels themselves */
	if (r == 0 && (!manifest || w.ts.n == 0))
		r = walk_dir(&w, dir, 0);
	if (r == -E2BIG && w.visited <= COMPAT_TARGETS_MAX_FILES)
		snprintf(err, errlen, "%s: more than %d distinct targets", dir, COMPAT_TARGETS_MAX);
	if (r == 0 && w.ts.n == 0) {
		snprintf(err, errlen,
		         "%s: no target metadata (no manifest, kernel JSON or "
		         "cache_key_factors.json)",
		         dir);
		r = -ENOENT;
	}
	return targets_finish(&w.ts, r, out);
}
