#include "cache_image_impl.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LAYER_MANIFEST_MAX (16u << 20)

const char *ci_fmt_prefix(enum cache_format f)
{
	return f == CACHE_VLLM ? "vllm" : "triton";
}

const char *cache_format_name(enum cache_format f)
{
	return f == CACHE_AUTO ? "auto" : ci_fmt_prefix(f);
}

int cache_meta_init(struct cache_meta *m, enum cache_format f)
{
	memset(m, 0, sizeof(*m));
	m->format = f;
	m->targets = cJSON_CreateArray();
	m->kernels = cJSON_CreateArray();
	m->vllm = cJSON_CreateObject();
	if (!m->targets || !m->kernels || !m->vllm) {
		cache_meta_clear(m);
		return -ENOMEM;
	}
	return 0;
}

void cache_meta_clear(struct cache_meta *m)
{
	if (!m)
		return;
	cJSON_Delete(m->targets);
	cJSON_Delete(m->kernels);
	cJSON_Delete(m->vllm);
	memset(m, 0, sizeof(*m));
}

static const char *jstr(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void add_target(struct cache_meta *m, cJSON *t)
{
	const cJSON *it;
	cJSON_ArrayForEach(it, m->targets)
	{
		if (cJSON_Compare(it, t, true)) {
			cJSON_Delete(t);
			return;
		}
	}
	if (!cJSON_AddItemToArray(m->targets, t))
		cJSON_Delete(t);
}

static void copy_field(cJSON *dst, const char *dkey, const cJSON *src, const char *skey)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, skey);
	if (v && !cJSON_IsNull(v)) {
		cJSON *c = cJSON_Duplicate(v, 1);
		if (c && !cJSON_AddItemToObject(dst, dkey, c))
			cJSON_Delete(c);
	}
}

/* Split "a/b/c" into at most n components (pointers into buf). */
static size_t split_path(char *buf, const char **parts, size_t n)
{
	size_t k = 0;
	for (char *p = buf; k < n;) {
		parts[k++] = p;
		char *slash = strchr(p, '/');
		if (!slash)
			break;
		*slash = '\0';
		p = slash + 1;
	}
	return k;
}

/* The vLLM manifest entry for hash h, created (and counted) on first sight. */
static cJSON *vllm_entry(struct cache_meta *m, const char *h)
{
	cJSON *e = cJSON_GetObjectItemCaseSensitive(m->vllm, h);
	if (e)
		return e;
	e = cJSON_CreateObject();
	if (!e || !cJSON_AddStringToObject(e, "vllmHash", h) ||
	    !cJSON_AddItemToObject(m->vllm, h, e)) {
		cJSON_Delete(e);
		return NULL;
	}
	m->entries++;
	return e;
}

static cJSON *entry_list(cJSON *e, const char *key)
{
	cJSON *a = cJSON_GetObjectItemCaseSensitive(e, key);
	if (!a)
		a = cJSON_AddArrayToObject(e, key);
	return a;
}

/* The "binary" record of rank/prefix within a vLLM entry. */
static cJSON *binary_record(cJSON *e, const char *rank, const char *prefix)
{
	cJSON *list = entry_list(e, "binary");
	const cJSON *it;
	cJSON_ArrayForEach(it, list)
	{
		const char *r = jstr(it, "rank"), *p = jstr(it, "prefix");
		if (r && p && strcmp(r, rank) == 0 && strcmp(p, prefix) == 0)
			return (cJSON *)it;
	}
	cJSON *b = cJSON_CreateObject();
	if (!b || !cJSON_AddStringToObject(b, "rank", rank) ||
	    !cJSON_AddStringToObject(b, "prefix", prefix) ||
	    !cJSON_AddArrayToObject(b, "artifact_names") || !cJSON_AddItemToArray(list, b)) {
		cJSON_Delete(b);
		return NULL;
	}
	return b;
}

static void add_kernel(struct cache_meta *m, const cJSON *j, const char *hash_dir,
                       const char *vllm_hash)
{
	const cJSON *target = cJSON_GetObjectItemCaseSensitive(j, "target");
	cJSON *t = cJSON_CreateObject();
	cJSON *k = cJSON_CreateObject();
	if (!t || !k)
		goto fail;
	copy_field(t, "backend", target, "backend");
	copy_field(t, "arch", target, "arch");
	copy_field(t, "warp_size", target, "warp_size");
	if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "ptx_version")))
		copy_field(t, "ptx_version", j, "ptx_version");
	copy_field(k, "hash", j, "hash");
	copy_field(k, "name", j, "name");
	if (hash_dir && !cJSON_AddStringToObject(k, "dir", hash_dir))
		goto fail;
	copy_field(k, "backend", target, "backend");
	copy_field(k, "arch", target, "arch");
	copy_field(k, "warp_size", target, "warp_size");
	static const char *const extra[] = {"ptx_version", "num_warps", "num_stages",
	                                    "num_ctas",    "debug",     "triton_version"};
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		copy_field(k, extra[i], j, extra[i]);
	cJSON *list = m->kernels;
	if (vllm_hash) {
		cJSON *e = vllm_entry(m, vllm_hash);
		list = e ? entry_list(e, "triton") : NULL;
		if (e && !jstr(e, "cacheFormat"))
			cJSON_AddStringToObject(e, "cacheFormat", "triton");
	} else if (m->format != CACHE_VLLM) {
		m->entries++;
	}
	if (!list || !cJSON_AddItemToArray(list, k))
		goto fail;
	add_target(m, t);
	return;
fail:
	cJSON_Delete(t);
	cJSON_Delete(k);
}

/* cache_key_factors.json of a vLLM binary cache. */
static void add_key_factors(struct cache_meta *m, const cJSON *j, const char *h, const char *rank,
                            const char *prefix)
{
	cJSON *e = vllm_entry(m, h);
	cJSON *b = e ? binary_record(e, rank, prefix) : NULL;
	if (!b)
		return;
	cJSON_DeleteItemFromObjectCaseSensitive(e, "cacheFormat");
	cJSON_AddStringToObject(e, "cacheFormat", "binary");
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "env");
	const char *device = env ? jstr(env, "VLLM_TARGET_DEVICE") : NULL;
	const char *cuda = env ? jstr(env, "VLLM_MAIN_CUDA_VERSION") : NULL;
	const char *save = env ? jstr(env, "VLLM_COMPILE_CACHE_SAVE_FORMAT") : NULL;
	copy_field(b, "code_hash", j, "code_hash");
	copy_field(b, "config_hash", j, "config_hash");
	copy_field(b, "compiler_hash", j, "compiler_hash");
	if (save)
		cJSON_AddStringToObject(b, "cache_save_format", save);
	if (device)
		cJSON_AddStringToObject(b, "target_device", device);
	if (env)
		copy_field(b, "env", j, "env");
	snprintf(m->vllm_format, sizeof(m->vllm_format), "%s", save ? save : "binary");
	if (!device)
		return;
	cJSON *t = cJSON_CreateObject();
	if (!t)
		return;
	bool rocm = strcmp(device, "rocm") == 0 || strcmp(device, "hip") == 0;
	cJSON_AddStringToObject(t, "backend", rocm ? "hip" : device);
	if (strcmp(device, "cuda") == 0 || rocm)
		cJSON_AddNumberToObject(t, "warp_size", rocm ? 64 : 32);
	if (cuda && strcmp(device, "cuda") == 0)
		cJSON_AddStringToObject(t, "cuda_version", cuda);
	add_target(m, t);
}

static void add_group(struct cache_meta *m, const cJSON *j)
{
	m->groups++;
	const cJSON *cp = cJSON_GetObjectItemCaseSensitive(j, "child_paths");
	const cJSON *it;
	bool absolute = false;
	cJSON_ArrayForEach(it, cp)
	{
		if (!cJSON_IsString(it) || it->valuestring[0] != '/')
			continue;
		if (!absolute && !m->abs_group_root[0]) {
			/* "/root/cache/<HASH>/<file>" -> "/root/cache" */
			char buf[sizeof(m->abs_group_root)];
			snprintf(buf, sizeof(buf), "%s", it->valuestring);
			for (int cut = 0; cut < 2; cut++) {
				char *slash = strrchr(buf, '/');
				if (slash && slash != buf)
					*slash = '\0';
			}
			memcpy(m->abs_group_root, buf, sizeof(buf));
		}
		absolute = true;
	}
	if (absolute)
		m->abs_groups++;
}

void cache_meta_add(struct cache_meta *m, const char *relpath, uint64_t size, const char *data,
                    size_t len)
{
	m->files++;
	m->bytes += size;
	const char *base = strrchr(relpath, '/');
	base = base ? base + 1 : relpath;
	char buf[PATH_MAX];
	const char *parts[8] = {0};
	snprintf(buf, sizeof(buf), "%s", relpath);
	size_t np = split_path(buf, parts, 8);
	const char *vllm_hash = NULL;
	if (m->format == CACHE_VLLM && np >= 3 && strcmp(parts[0], "torch_compile_cache") == 0) {
		vllm_hash = parts[1];
		if (!vllm_entry(m, vllm_hash))
			return;
		/* torch_compile_cache/<h>/<rank>/<prefix>/artifact_compile_range_* */
		if (np >= 5 && strncmp(parts[4], "artifact_compile_range_", 23) == 0) {
			cJSON *b = binary_record(vllm_entry(m, vllm_hash), parts[2], parts[3]);
			cJSON *names =
			    b ? cJSON_GetObjectItemCaseSensitive(b, "artifact_names") : NULL;
			bool seen = false;
			const cJSON *it;
			cJSON_ArrayForEach(it, names) seen |=
			    strcmp(it->valuestring, parts[4]) == 0;
			if (names && !seen) {
				cJSON_AddItemToArray(names, cJSON_CreateString(parts[4]));
				cJSON_DeleteItemFromObjectCaseSensitive(b, "artifact_count");
				cJSON_AddNumberToObject(b, "artifact_count",
				                        cJSON_GetArraySize(names));
			}
			if (np > 6 && strcmp(m->vllm_format, "binary") == 0)
				snprintf(m->vllm_format, sizeof(m->vllm_format), "unpacked");
		}
	}
	size_t bl = strlen(base);
	if (!data || bl < 5 || strcmp(base + bl - 5, ".json") != 0)
		return;
	cJSON *j = cJSON_ParseWithLength(data, len);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return;
	}
	if (strncmp(base, "__grp__", 7) == 0) {
		add_group(m, j);
	} else if (jstr(j, "hash") &&
	           cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "target"))) {
		const char *dir = np >= 2 ? parts[np - 2] : NULL;
		add_kernel(m, j, dir, vllm_hash);
	} else if (vllm_hash && np >= 5 && strcmp(base, "cache_key_factors.json") == 0) {
		add_key_factors(m, j, vllm_hash, parts[2], parts[3]);
	}
	cJSON_Delete(j);
}

char *cache_summary_json(const struct cache_meta *m)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *t = cJSON_Duplicate(m->targets, 1);
	char *s = NULL;
	if (o && t && cJSON_AddItemToObject(o, "targets", t)) {
		t = NULL;
		s = cJSON_PrintUnformatted(o);
	}
	cJSON_Delete(t);
	cJSON_Delete(o);
	return s;
}

/* Every distinct string value of key anywhere in j, into the array out
 * (sorted as found; few values). */
static void collect(const cJSON *j, const char *key, cJSON *out)
{
	const cJSON *it;
	cJSON_ArrayForEach(it, j)
	{
		if (it->string && strcmp(it->string, key) == 0 && cJSON_IsString(it)) {
			bool seen = false;
			const cJSON *v;
			cJSON_ArrayForEach(v, out) seen =
			    seen || strcmp(v->valuestring, it->valuestring) == 0;
			if (!seen && cJSON_GetArraySize(out) < 16)
				cJSON_AddItemToArray(out, cJSON_CreateString(it->valuestring));
		} else if (cJSON_IsObject(it) || cJSON_IsArray(it)) {
			collect(it, key, out);
		}
	}
}

char *cache_identity_json(const struct cache_meta *m)
{
	static const struct {
		const char *key, *name;
	} factors[] = {
	    {"triton_version", "triton"},
	    {"code_hash", "vllmCodeHash"},
	    {"compiler_hash", "vllmCompilerHash"},
	};
	cJSON *o = cJSON_CreateObject();
	char *s = NULL;
	for (size_t i = 0; o && i < sizeof(factors) / sizeof(factors[0]); i++) {
		cJSON *a = cJSON_CreateArray();
		if (!a)
			goto out;
		collect(m->kernels, factors[i].key, a);
		collect(m->vllm, factors[i].key, a);
		if (cJSON_GetArraySize(a) == 0 || !cJSON_AddItemToObject(o, factors[i].name, a))
			cJSON_Delete(a);
	}
	if (o && o->child)
		s = cJSON_PrintUnformatted(o);
out:
	cJSON_Delete(o);
	return s;
}

char *cache_manifest_json(const struct cache_meta *m)
{
	cJSON *o = cJSON_CreateObject();
	char *s = NULL;
	if (!o)
		return NULL;
	if (m->format == CACHE_VLLM) {
		cJSON *a = cJSON_AddArrayToObject(o, "vllm");
		const cJSON *it;
		cJSON_ArrayForEach(it, m->vllm)
		{
			cJSON *c = cJSON_Duplicate(it, 1);
			if (!a || !c || !cJSON_AddItemToArray(a, c)) {
				cJSON_Delete(c);
				goto out;
			}
		}
	} else {
		cJSON *k = cJSON_Duplicate(m->kernels, 1);
		if (!k || !cJSON_AddItemToObject(o, "triton", k)) {
			cJSON_Delete(k);
			goto out;
		}
	}
	s = cJSON_Print(o);
out:
	cJSON_Delete(o);
	return s;
}

static int set_label(cJSON *labels, const char *fmt, const char *key, const char *value)
{
	char k[128];
	snprintf(k, sizeof(k), "cache.%s.image/%s", fmt, key);
	cJSON_DeleteItemFromObjectCaseSensitive(labels, k);
	return cJSON_AddStringToObject(labels, k, value) ? 0 : -ENOMEM;
}

int cache_set_labels(const struct cache_meta *m, cJSON *labels)
{
	const char *f = ci_fmt_prefix(m->format);
	char num[32];
	char *summary = cache_summary_json(m), *identity = NULL;
	int rc = -ENOMEM;
	if (!summary)
		return rc;
	snprintf(num, sizeof(num), "%" PRIu64, m->entries);
	if ((rc = set_label(labels, f, "entry-count", num)))
		goto out;
	snprintf(num, sizeof(num), "%" PRIu64, m->bytes);
	if ((rc = set_label(labels, f, "cache-size-bytes", num)))
		goto out;
	if ((rc = set_label(labels, f, "summary", summary)))
		goto out;
	identity = cache_identity_json(m);
	if (identity && (rc = set_label(labels, f, "identity", identity)))
		goto out;
	if (m->format == CACHE_VLLM)
		rc =
		    set_label(labels, f, "format", m->vllm_format[0] ? m->vllm_format : "unpacked");
out:
	free(identity);
	free(summary);
	return rc;
}

enum cache_format cache_detect_format(const char *dir)
{
	char p[PATH_MAX];
	struct stat st;
	snprintf(p, sizeof(p), "%s/torch_compile_cache", dir);
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode) ? CACHE_VLLM : CACHE_TRITON;
}

/* ---- reading a cache layer ------------------------------------------- */

struct layer_src {
	struct oci_blob_reader *r;
	char buf[1 << 16];
	int err;
};

static la_ssize_t layer_read(struct archive *a, void *ud, const void **buf)
{
	struct layer_src *s = ud;
	ssize_t n = oci_blob_read(s->r, s->buf, sizeof(s->buf));
	if (n < 0) {
		s->err = (int)n;
		archive_set_error(a, EIO, "%s", oci_blob_error(s->r));
		return -1;
	}
	*buf = s->buf;
	return n;
}

static int read_entry_data(struct archive *a, size_t max, char **out, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (n + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		la_ssize_t k = archive_read_data(a, buf + n, cap - n - 1);
		if (k < 0) {
			free(buf);
			return -EIO;
		}
		if (k == 0)
			break;
		n += (size_t)k;
		if (n > max) {
			free(buf);
			return -EFBIG;
		}
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

int cache_scan_layer(struct oci_blob_reader *r, struct cache_meta *m, char **manifest_out,
                     struct oci_err *err)
{
	struct layer_src src = {.r = r};
	struct archive *a = archive_read_new();
	char *manifest = NULL;
	int rc = 0;
	if (!a)
		return -ENOMEM;
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_none(a);
	archive_read_support_format_tar(a);
	if (archive_read_open(a, &src, NULL, layer_read, NULL) != ARCHIVE_OK) {
		oci_errf(err, "cannot read the layer: %s", archive_error_string(a));
		rc = src.err ? src.err : -EBADMSG;
		goto out;
	}
	for (;;) {
		struct archive_entry *e = NULL;
		int h = archive_read_next_header(a, &e);
		if (h == ARCHIVE_EOF)
			break;
		if (h != ARCHIVE_OK && h != ARCHIVE_WARN) {
			if (src.err) {
				oci_errf(err, "%s", oci_blob_error(r));
				rc = src.err;
				goto out;
			}
			/* Layers written without end-of-archive blocks end here once
			 * the last entry is complete: fine if the blob verified. */
			int d = oci_blob_drain(r);
			if (d == 0 && oci_blob_bytes(r) > 0)
				break;
			oci_errf(err, "malformed layer: %s", archive_error_string(a));
			rc = d < 0 ? d : -EBADMSG;
			goto out;
		}
		const char *p = archive_entry_pathname(e);
		while (p && p[0] == '.' && p[1] == '/')
			p += 2;
		if (!p || archive_entry_filetype(e) != AE_IFREG)
			continue;
		if (m->format == CACHE_AUTO) {
			if (strncmp(p, "io.vllm.", 8) == 0)
				m->format = CACHE_VLLM;
			else if (strncmp(p, "io.triton.", 10) == 0)
				m->format = CACHE_TRITON;
		}
		char cprefix[32], mpath[48];
		snprintf(cprefix, sizeof(cprefix), "io.%s.cache/", ci_fmt_prefix(m->format));
		snprintf(mpath, sizeof(mpath), "io.%s.manifest/manifest.json",
		         ci_fmt_prefix(m->format));
		size_t cpl = strlen(cprefix);
		int64_t size = archive_entry_size(e);
		if (strcmp(p, mpath) == 0 && !manifest) {
			size_t len = 0;
			if ((rc = read_entry_data(a, LAYER_MANIFEST_MAX, &manifest, &len))) {
				oci_errf(err, "reading %s from the layer: %s", mpath,
				         rc == -EFBIG ? "too large" : archive_error_string(a));
				goto out;
			}
			continue;
		}
		if (strncmp(p, cprefix, cpl) != 0)
			continue;
		size_t nl = strlen(p);
		char *data = NULL;
		size_t len = 0;
		if (nl > 5 && strcmp(p + nl - 5, ".json") == 0 && size <= (int64_t)CACHE_JSON_MAX &&
		    (rc = read_entry_data(a, CACHE_JSON_MAX, &data, &len))) {
			oci_errf(err, "reading %s from the layer: %s", p, archive_error_string(a));
			goto out;
		}
		cache_meta_add(m, p + cpl, size > 0 ? (uint64_t)size : 0, data, len);
		free(data);
	}
	if ((rc = oci_blob_drain(r))) {
		oci_errf(err, "%s", oci_blob_error(r));
		goto out;
	}
	if (manifest_out) {
		*manifest_out = manifest;
		manifest = NULL;
	}
out:
	free(manifest);
	archive_read_free(a);
	return rc;
}
