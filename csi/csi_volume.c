#include "csi_volume.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_view.h"
#include "fsutil.h"
#include "log.h"

static const char suffix[] = ".json";

bool csi_volume_valid_id(const char *id)
{
	size_t n = id ? strlen(id) : 0;
	if (n == 0 || n > CSI_VOLUME_ID_MAX || id[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* FNV-1a: the targets of one volume on one node are a handful of kubelet
 * paths, not chosen to collide. */
void csi_volume_key(const struct csi_volume *v, char *buf)
{
	if (!v->shared) {
		snprintf(buf, CSI_VOLUME_KEY_MAX + 1, "%s", v->volume_id);
		return;
	}
	uint64_t h = 0xcbf29ce484222325ULL;
	for (const unsigned char *p = (const unsigned char *)v->target_path; *p; p++)
		h = (h ^ *p) * 0x100000001b3ULL;
	snprintf(buf, CSI_VOLUME_KEY_MAX + 1, "%s@%016llx", v->volume_id, (unsigned long long)h);
}

bool csi_volume_valid_key(const char *key)
{
	const char *at = key ? strchr(key, '@') : NULL;
	if (!at)
		return csi_volume_valid_id(key);
	char id[CSI_VOLUME_ID_MAX + 1];
	size_t n = (size_t)(at - key);
	if (n > CSI_VOLUME_ID_MAX || strlen(at + 1) != 16)
		return false;
	memcpy(id, key, n);
	id[n] = '\0';
	for (const char *p = at + 1; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return csi_volume_valid_id(id);
}

static bool eq(const char *a, const char *b)
{
	return strcmp(a ? a : "", b ? b : "") == 0;
}

bool csi_volume_same(const struct csi_volume *a, const struct csi_volume *b)
{
	return eq(a->volume_id, b->volume_id) && eq(a->target_path, b->target_path) &&
	       eq(a->cache_namespace, b->cache_namespace) && eq(a->cache_name, b->cache_name) &&
	       eq(a->pod_name, b->pod_name) && eq(a->pod_namespace, b->pod_namespace) &&
	       eq(a->pod_uid, b->pod_uid) && a->writable == b->writable &&
	       a->empty_on_miss == b->empty_on_miss && a->pod_read_only == b->pod_read_only &&
	       a->shared == b->shared && a->size_limit == b->size_limit;
}

void csi_volume_clear(struct csi_volume *v)
{
	if (!v)
		return;
	free(v->volume_id);
	free(v->target_path);
	free(v->cache_namespace);
	free(v->cache_name);
	free(v->digest);
	free(v->pod_name);
	free(v->pod_namespace);
	free(v->pod_uid);
	free(v->fallback_state);
	free(v->fallback_reason);
	free(v->fallback_message);
	memset(v, 0, sizeof(*v));
}

int csi_volume_copy(struct csi_volume *dst, const struct csi_volume *src)
{
	struct csi_volume v = {
	    .volume_id = strdup(src->volume_id ? src->volume_id : ""),
	    .target_path = strdup(src->target_path ? src->target_path : ""),
	    .cache_namespace = strdup(src->cache_namespace ? src->cache_namespace : ""),
	    .cache_name = strdup(src->cache_name ? src->cache_name : ""),
	    .digest = strdup(src->digest ? src->digest : ""),
	    .pod_name = strdup(src->pod_name ? src->pod_name : ""),
	    .pod_namespace = strdup(src->pod_namespace ? src->pod_namespace : ""),
	    .pod_uid = strdup(src->pod_uid ? src->pod_uid : ""),
	    .writable = src->writable,
	    .empty_on_miss = src->empty_on_miss,
	    .pod_read_only = src->pod_read_only,
	    .shared = src->shared,
	    .size_limit = src->size_limit,
	    .started = src->started,
	    .fallback = src->fallback,
	    .fallback_state = strdup(src->fallback_state ? src->fallback_state : ""),
	    .fallback_reason = strdup(src->fallback_reason ? src->fallback_reason : ""),
	    .fallback_message = strdup(src->fallback_message ? src->fallback_message : ""),
	};
	if (!v.volume_id || !v.target_path || !v.cache_namespace || !v.cache_name || !v.digest ||
	    !v.pod_name || !v.pod_namespace || !v.pod_uid || !v.fallback_state ||
	    !v.fallback_reason || !v.fallback_message) {
		csi_volume_clear(&v);
		return -ENOMEM;
	}
	*dst = v;
	return 0;
}

static int state_path(char *buf, size_t size, const char *dir, const struct csi_volume *v)
{
	char key[CSI_VOLUME_KEY_MAX + 1];
	if (!csi_volume_valid_id(v->volume_id))
		return -EINVAL;
	csi_volume_key(v, key);
	int n = snprintf(buf, size, "%s/%s%s", dir, key, suffix);
	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

int csi_volume_save(const char *dir, const struct csi_volume *v)
{
	char path[PATH_MAX], ts[40];
	int rc = state_path(path, sizeof(path), dir, v);
	if (rc)
		return rc;
	rc = fsutil_mkdirs(dir, 0700);
	if (rc)
		return rc;
	cache_view_rfc3339(v->started, ts, sizeof(ts));
	cJSON *o = cJSON_CreateObject();
	cJSON *pod = o ? cJSON_AddObjectToObject(o, "pod") : NULL;
	cJSON *fb = o && v->fallback ? cJSON_AddObjectToObject(o, "fallback") : NULL;
	bool ok =
	    pod && (fb || !v->fallback) && cJSON_AddStringToObject(o, "volumeId", v->volume_id) &&
	    cJSON_AddStringToObject(o, "targetPath", v->target_path) &&
	    cJSON_AddStringToObject(o, "cacheNamespace", v->cache_namespace) &&
	    cJSON_AddStringToObject(o, "cacheName", v->cache_name) &&
	    cJSON_AddStringToObject(o, "digest", v->digest) &&
	    cJSON_AddBoolToObject(o, "writable", v->writable) &&
	    cJSON_AddStringToObject(pod, "name", v->pod_name) &&
	    cJSON_AddStringToObject(pod, "namespace", v->pod_namespace) &&
	    cJSON_AddStringToObject(pod, "uid", v->pod_uid) &&
	    cJSON_AddStringToObject(o, "started", ts) &&
	    cJSON_AddStringToObject(o, "onMiss", v->empty_on_miss ? "empty" : "fail") &&
	    cJSON_AddBoolToObject(o, "podReadOnly", v->pod_read_only) &&
	    (!v->shared || cJSON_AddBoolToObject(o, "shared", true)) &&
	    (!v->size_limit || cJSON_AddNumberToObject(o, "sizeLimit", (double)v->size_limit)) &&
	    (!fb || (cJSON_AddStringToObject(fb, "state", v->fallback_state) &&
	             cJSON_AddStringToObject(fb, "reason", v->fallback_reason) &&
	             cJSON_AddStringToObject(fb, "message", v->fallback_message)));
	char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
	cJSON_Delete(o);
	if (!text)
		return -ENOMEM;
	rc = fsutil_write_atomic(path, text, strlen(text), 0600);
	cJSON_free(text);
	return rc;
}

int csi_volume_remove(const char *dir, const struct csi_volume *v)
{
	char path[PATH_MAX];
	int rc = state_path(path, sizeof(path), dir, v);
	if (rc)
		return rc;
	if (unlink(path) != 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int get_string(const cJSON *o, const char *key, size_t max, char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsString(v) || strlen(v->valuestring) > max)
		return -EINVAL;
	*out = strdup(v->valuestring);
	return *out ? 0 : -ENOMEM;
}

/* The members later versions added: absent in older files. */
static int parse_fallback(const cJSON *o, struct csi_volume *v)
{
	const cJSON *miss = cJSON_GetObjectItemCaseSensitive(o, "onMiss");
	const cJSON *pro = cJSON_GetObjectItemCaseSensitive(o, "podReadOnly");
	const cJSON *fb = cJSON_GetObjectItemCaseSensitive(o, "fallback");
	const cJSON *shared = cJSON_GetObjectItemCaseSensitive(o, "shared");
	if ((miss && !cJSON_IsString(miss)) || (pro && !cJSON_IsBool(pro)) ||
	    (fb && !cJSON_IsObject(fb)) || (shared && !cJSON_IsBool(shared)))
		return -EINVAL;
	if (miss && strcmp(miss->valuestring, "empty") != 0 &&
	    strcmp(miss->valuestring, "fail") != 0)
		return -EINVAL;
	v->empty_on_miss = miss && strcmp(miss->valuestring, "empty") == 0;
	v->pod_read_only = cJSON_IsTrue(pro);
	v->shared = cJSON_IsTrue(shared);
	v->fallback = fb != NULL;
	if (!fb) {
		v->fallback_state = strdup("");
		v->fallback_reason = strdup("");
		v->fallback_message = strdup("");
		return v->fallback_state && v->fallback_reason && v->fallback_message ? 0 : -ENOMEM;
	}
	int rc;
	if ((rc = get_string(fb, "state", 64, &v->fallback_state)) ||
	    (rc = get_string(fb, "reason", 1024, &v->fallback_reason)) ||
	    (rc = get_string(fb, "message", 8192, &v->fallback_message)))
		return rc;
	return 0;
}

static int parse_state(const char *text, size_t len, struct csi_volume *out)
{
	struct csi_volume v;
	memset(&v, 0, sizeof(v));
	int rc = -EINVAL;
	cJSON *o = cJSON_ParseWithLength(text, len);
	const cJSON *pod = o ? cJSON_GetObjectItemCaseSensitive(o, "pod") : NULL;
	const cJSON *w = o ? cJSON_GetObjectItemCaseSensitive(o, "writable") : NULL;
	const cJSON *started = o ? cJSON_GetObjectItemCaseSensitive(o, "started") : NULL;
	if (!cJSON_IsObject(pod) || !cJSON_IsBool(w) || !cJSON_IsString(started))
		goto out;
	if ((rc = get_string(o, "volumeId", CSI_VOLUME_ID_MAX, &v.volume_id)) ||
	    (rc = get_string(o, "targetPath", PATH_MAX, &v.target_path)) ||
	    (rc = get_string(o, "cacheNamespace", CACHE_VIEW_NAMESPACE_MAX, &v.cache_namespace)) ||
	    (rc = get_string(o, "cacheName", CACHE_VIEW_NAME_MAX, &v.cache_name)) ||
	    (rc = get_string(o, "digest", CACHE_VIEW_DIGEST_LEN, &v.digest)) ||
	    (rc = get_string(pod, "name", CACHE_VIEW_NAME_MAX, &v.pod_name)) ||
	    (rc = get_string(pod, "namespace", CACHE_VIEW_NAMESPACE_MAX, &v.pod_namespace)) ||
	    (rc = get_string(pod, "uid", CACHE_VIEW_NAME_MAX, &v.pod_uid)) ||
	    (rc = parse_fallback(o, &v)))
		goto out;
	rc = -EINVAL;
	/* A fallback uses no store entry: no digest; a cache volume has one. */
	if (!csi_volume_valid_id(v.volume_id) || v.target_path[0] != '/' ||
	    (v.cache_namespace[0] && !cache_view_valid_namespace(v.cache_namespace)) ||
	    !cache_view_valid_name(v.cache_name) ||
	    (v.fallback ? v.digest[0] != '\0' : !cache_view_valid_digest(v.digest)) ||
	    (v.fallback && !v.empty_on_miss) ||
	    cache_view_parse_rfc3339(started->valuestring, &v.started) != 0)
		goto out;
	v.writable = cJSON_IsTrue(w);
	const cJSON *lim = cJSON_GetObjectItemCaseSensitive(o, "sizeLimit");
	if (cJSON_IsNumber(lim) && lim->valuedouble >= 0 && lim->valuedouble < 1e19)
		v.size_limit = (uint64_t)lim->valuedouble;
	*out = v;
	memset(&v, 0, sizeof(v));
	rc = 0;
out:
	csi_volume_clear(&v);
	cJSON_Delete(o);
	return rc;
}

void csi_volume_free_all(struct csi_volume *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		csi_volume_clear(&v[i]);
	free(v);
}

int csi_volume_load_all(const char *dir, struct csi_volume **out, size_t *nout)
{
	struct csi_volume *list = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	DIR *d = opendir(dir);
	if (!d) {
		if (errno != ENOENT)
			return -errno;
		*out = NULL;
		*nout = 0;
		return 0;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);
		if (len <= sizeof(suffix) - 1 || e->d_name[0] == '.' ||
		    strcmp(e->d_name + len - (sizeof(suffix) - 1), suffix) != 0)
			continue;
		char path[PATH_MAX], *text = NULL;
		size_t tlen = 0;
		struct csi_volume v;
		int n1 = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (n1 < 0 || (size_t)n1 >= sizeof(path))
			continue;
		int r = fsutil_read_file(path, CSI_VOLUME_STATE_MAX, &text, &tlen);
		if (r == 0)
			r = parse_state(text, tlen, &v);
		free(text);
		/* The file name must match the publication inside, or a copied
		 * file could shadow another volume. */
		if (r == 0) {
			char key[CSI_VOLUME_KEY_MAX + 1];
			csi_volume_key(&v, key);
			if (strlen(key) + sizeof(suffix) - 1 != len ||
			    strncmp(key, e->d_name, strlen(key)) != 0) {
				csi_volume_clear(&v);
				r = -EINVAL;
			}
		}
		if (r) {
			log_error("ignoring unreadable volume state; unmount and delete it by hand",
			          "file", path, "error", strerror(-r));
			continue;
		}
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			struct csi_volume *nl = realloc(list, ncap * sizeof(*nl));
			if (!nl) {
				csi_volume_clear(&v);
				rc = -ENOMEM;
				break;
			}
			list = nl;
			cap = ncap;
		}
		list[n++] = v;
	}
	closedir(d);
	if (rc) {
		csi_volume_free_all(list, n);
		return rc;
	}
	*out = list;
	*nout = n;
	return 0;
}
