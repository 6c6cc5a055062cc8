/* On-node cache views and usage files; the format is documented in
 * cache_view.h. */
#include "cache_view.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "fsutil.h"
#include "log.h"
#include "textfmt.h"

enum {
	GPU_ID_MAX = 256,
	REASON_MAX = 1024,
	MESSAGE_MAX = 8192,
	POD_FIELD_MAX = 256,
};

/* Format a path into buf; buf is only written when the whole path fits. */
static int fmt_path(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fmt_path(char *buf, size_t size, const char *fmt, ...)
{
	char tmp[PATH_MAX];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	if ((size_t)n >= sizeof(tmp) || (size_t)n >= size)
		return -ENAMETOOLONG;
	memcpy(buf, tmp, (size_t)n + 1);
	return 0;
}

/* ---- names ---- */

static bool is_lower_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* A DNS label of at most max characters. */
static bool valid_label(const char *s, size_t n, size_t max)
{
	if (n == 0 || n > max || !is_lower_alnum(s[0]) || !is_lower_alnum(s[n - 1]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!is_lower_alnum(s[i]) && s[i] != '-')
			return false;
	return true;
}

bool cache_view_valid_namespace(const char *s)
{
	return s && valid_label(s, strlen(s), 63);
}

bool cache_view_valid_name(const char *s)
{
	if (!s)
		return false;
	size_t n = strlen(s);
	if (n == 0 || n > CACHE_VIEW_NAME_MAX)
		return false;
	const char *p = s;
	for (;;) {
		const char *dot = memchr(p, '.', (size_t)(s + n - p));
		size_t len = dot ? (size_t)(dot - p) : (size_t)(s + n - p);
		/* the API server takes a part of a name over 63 characters */
		if (!valid_label(p, len, CACHE_VIEW_NAME_MAX))
			return false;
		if (!dot)
			return true;
		p = dot + 1;
	}
}

bool cache_view_valid_digest(const char *s)
{
	if (!s || strncmp(s, "sha256:", 7) != 0 || strlen(s) != CACHE_VIEW_DIGEST_LEN)
		return false;
	for (const char *p = s + 7; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

static const char *scope_of(const char *ns)
{
	return (ns && *ns) ? ns : CACHE_VIEW_CLUSTER;
}

int cache_view_dir(char *buf, size_t size, const char *base, const char *sub, const char *ns,
                   const char *name)
{
	if (!base || !*base || !sub)
		return -EINVAL;
	if (ns && *ns && !cache_view_valid_namespace(ns))
		return -EINVAL;
	if (!cache_view_valid_name(name))
		return -EINVAL;
	return fmt_path(buf, size, "%s/%s/%s/%s", base, sub, scope_of(ns), name);
}

/* ---- files ---- */

/* Replace dir/data with a symlink to target, atomically (symlink beside it,
 * then rename over it). */
static int replace_symlink(const char *dir, const char *name, const char *target)
{
	static atomic_uint counter;
	char tmp[PATH_MAX], path[PATH_MAX];
	int rc = fmt_path(tmp, sizeof(tmp), "%s/.%s.%ld.%u.tmp", dir, name, (long)getpid(),
	                  atomic_fetch_add(&counter, 1));
	if (rc == 0)
		rc = fmt_path(path, sizeof(path), "%s/%s", dir, name);
	if (rc)
		return rc;
	if (symlink(target, tmp) != 0)
		return -errno;
	if (rename(tmp, path) != 0) {
		rc = -errno;
		unlink(tmp);
	}
	return rc;
}

void cache_view_rfc3339(time_t t, char *buf, size_t size)
{
	rfc3339_format((int64_t)t, buf, size);
}

int cache_view_parse_rfc3339(const char *s, time_t *out)
{
	int64_t t;
	if (rfc3339_parse(s, &t) != 0)
		return -EINVAL;
	*out = (time_t)t;
	return 0;
}

/* ---- ready.json ---- */

/* A member that must be absent or a string of at most max bytes. */
static int opt_string(const cJSON *obj, const char *key, size_t max, const char **out, char *err,
                      size_t errlen)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
	*out = "";
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsString(v) || !v->valuestring) {
		errbuf_set(err, errlen, "\"%s\" is not a string", key);
		return -EINVAL;
	}
	if (strlen(v->valuestring) > max) {
		errbuf_set(err, errlen, "\"%s\" is longer than %zu bytes", key, max);
		return -EINVAL;
	}
	*out = v->valuestring;
	return 0;
}

static bool printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

void cache_view_ready_free(struct cache_view_ready *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->ncompatible_gpus; i++)
		free(r->compatible_gpus[i]);
	free(r->compatible_gpus);
	free(r->reason);
	free(r->message);
	memset(r, 0, sizeof(*r));
}

int cache_view_ready_parse(const char *json, size_t len, struct cache_view_ready *out, char *err,
                           size_t errlen)
{
	struct cache_view_ready r;
	memset(&r, 0, sizeof(r));
	int rc = -EINVAL;
	cJSON *root = NULL;

	if (len > CACHE_VIEW_READY_MAX) {
		errbuf_set(err, errlen, "larger than %d bytes", CACHE_VIEW_READY_MAX);
		return -EFBIG;
	}
	root = cJSON_ParseWithLength(json, len);
	if (!root) {
		errbuf_set(err, errlen, "not valid JSON");
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		errbuf_set(err, errlen, "not a JSON object");
		goto out;
	}
	const cJSON *state = cJSON_GetObjectItemCaseSensitive(root, "state");
	if (!cJSON_IsString(state) || !state->valuestring[0] ||
	    strlen(state->valuestring) >= sizeof(r.state) || !printable(state->valuestring)) {
		errbuf_set(err, errlen, "\"state\" is missing or not a short string");
		goto out;
	}
	memcpy(r.state, state->valuestring, strlen(state->valuestring) + 1);

	/* A cache whose digest is not resolved yet has none; a Ready one must. */
	const cJSON *digest = cJSON_GetObjectItemCaseSensitive(root, "digest");
	bool need_digest = strcmp(r.state, "Ready") == 0;
	if ((digest || need_digest) &&
	    (!cJSON_IsString(digest) || !cache_view_valid_digest(digest->valuestring))) {
		errbuf_set(err, errlen, "\"digest\" is missing or not sha256:<64 hex digits>");
		goto out;
	}
	if (digest)
		memcpy(r.digest, digest->valuestring, CACHE_VIEW_DIGEST_LEN + 1);

	const cJSON *compat = cJSON_GetObjectItemCaseSensitive(root, "compatible");
	if (!cJSON_IsBool(compat)) {
		errbuf_set(err, errlen, "\"compatible\" is missing or not a boolean");
		goto out;
	}
	r.compatible = cJSON_IsTrue(compat);

	const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(root, "compatibleGPUs");
	if (gpus && !cJSON_IsNull(gpus)) {
		if (!cJSON_IsArray(gpus)) {
			errbuf_set(err, errlen, "\"compatibleGPUs\" is not an array");
			goto out;
		}
		int n = cJSON_GetArraySize(gpus);
		if (n > CACHE_VIEW_GPUS_MAX) {
			errbuf_set(err, errlen, "\"compatibleGPUs\" has more than %d entries",
			           CACHE_VIEW_GPUS_MAX);
			goto out;
		}
		if (n > 0) {
			r.compatible_gpus = calloc((size_t)n, sizeof(char *));
			if (!r.compatible_gpus) {
				rc = -ENOMEM;
				goto out;
			}
		}
		const cJSON *g;
		cJSON_ArrayForEach(g, gpus)
		{
			if (!cJSON_IsString(g) || strlen(g->valuestring) > GPU_ID_MAX ||
			    !printable(g->valuestring)) {
				errbuf_set(err, errlen,
				           "\"compatibleGPUs\" holds a non-string or overlong id");
				goto out;
			}
			r.compatible_gpus[r.ncompatible_gpus] = strdup(g->valuestring);
			if (!r.compatible_gpus[r.ncompatible_gpus]) {
				rc = -ENOMEM;
				goto out;
			}
			r.ncompatible_gpus++;
		}
	}

	const char *reason, *message, *updated, *by;
	if (opt_string(root, "reason", REASON_MAX, &reason, err, errlen) ||
	    opt_string(root, "message", MESSAGE_MAX, &message, err, errlen) ||
	    opt_string(root, "updated", sizeof(r.updated) - 1, &updated, err, errlen) ||
	    opt_string(root, "verifiedBy", sizeof(r.verified_by) - 1, &by, err, errlen))
		goto out;
	memcpy(r.updated, updated, strlen(updated) + 1);
	memcpy(r.verified_by, by, strlen(by) + 1);
	r.reason = strdup(reason);
	r.message = strdup(message);
	if (!r.reason || !r.message) {
		rc = -ENOMEM;
		goto out;
	}
	*out = r;
	memset(&r, 0, sizeof(r));
	rc = 0;
out:
	cache_view_ready_free(&r);
	cJSON_Delete(root);
	return rc;
}

int cache_view_ready_read(const char *root, const char *ns, const char *name,
                          struct cache_view_ready *out, char *err, size_t errlen)
{
	char dir[PATH_MAX], path[PATH_MAX];
	char *text = NULL;
	size_t len = 0;
	int rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc == 0)
		rc = fmt_path(path, sizeof(path), "%s/%s", dir, CACHE_VIEW_READY);
	if (rc) {
		errbuf_set(err, errlen, "invalid cache name or namespace");
		return rc;
	}
	rc = fsutil_read_file(path, CACHE_VIEW_READY_MAX, &text, &len);
	if (rc == -ENOENT || rc == -ENOTDIR) {
		errbuf_set(err, errlen, "no %s", path);
		return -ENOENT;
	}
	if (rc) {
		errbuf_set(err, errlen, "cannot read %s: %s", path, strerror(-rc));
		return rc;
	}
	char perr[256] = "";
	rc = cache_view_ready_parse(text, len, out, perr, sizeof(perr));
	if (rc)
		errbuf_set(err, errlen, "%s is malformed: %s", path, perr);
	free(text);
	return rc;
}

int cache_view_open_data(const char *root, const char *ns, const char *name, const char *digest,
                         int *fd, char **path, char *err, size_t errlen)
{
	char dir[PATH_MAX], link[PATH_MAX], store[PATH_MAX];
	char *rstore = NULL, *rdata = NULL;
	int sfd = -1, efd = -1, rc;
	struct stat st;

	if (!cache_view_valid_digest(digest)) {
		errbuf_set(err, errlen, "invalid digest");
		return -EINVAL;
	}
	rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc == 0)
		rc = fmt_path(link, sizeof(link), "%s/%s", dir, CACHE_VIEW_DATA);
	if (rc == 0)
		rc = fmt_path(store, sizeof(store), "%s/store/sha256", root);
	if (rc) {
		errbuf_set(err, errlen, "invalid cache name, namespace or root");
		return rc;
	}
	if (lstat(link, &st) != 0) {
		rc = -errno;
		errbuf_set(err, errlen, "no data link %s", link);
		return rc == -ENOTDIR ? -ENOENT : rc;
	}
	if (!S_ISLNK(st.st_mode)) {
		errbuf_set(err, errlen, "%s is not a symlink to the store", link);
		return -EINVAL;
	}
	rstore = realpath(store, NULL);
	if (!rstore) {
		rc = -errno;
		errbuf_set(err, errlen, "store %s: %s", store, strerror(-rc));
		goto out;
	}
	rdata = realpath(link, NULL);
	if (!rdata) {
		rc = -errno;
		errbuf_set(err, errlen, "data link %s does not resolve: %s", link, strerror(-rc));
		goto out;
	}
	size_t sl = strlen(rstore);
	const char *entry = rdata + sl + 1;
	if (strncmp(rdata, rstore, sl) != 0 || rdata[sl] != '/' || !*entry || strchr(entry, '/')) {
		rc = -EXDEV;
		errbuf_set(err, errlen, "data link %s resolves outside the store", link);
		goto out;
	}
	if (strcmp(entry, digest + 7) != 0) {
		rc = -ESTALE;
		errbuf_set(err, errlen,
		           "data link names %.19s..., ready.json %.19s... (update in flight)",
		           entry, digest + 7);
		goto out;
	}
	/* Open the entry by digest from the store directory without following
	 * links, so what gets mounted is the store entry and nothing else, even
	 * if the view changes after the checks above. */
	sfd = open(rstore, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (sfd < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "store %s: %s", rstore, strerror(-rc));
		goto out;
	}
	efd = openat(sfd, digest + 7, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (efd < 0) {
		rc = errno == ENOENT ? -ENOENT : -ENOTDIR;
		errbuf_set(err, errlen, "store entry %s/%s is %s", rstore, digest + 7,
		           rc == -ENOENT ? "missing" : "not a directory");
		goto out;
	}
	*fd = efd;
	*path = rdata;
	rdata = NULL;
	efd = -1;
	rc = 0;
out:
	if (sfd >= 0)
		close(sfd);
	free(rstore);
	free(rdata);
	return rc;
}

static cJSON *ready_to_json(const struct cache_view_ready *r)
{
	cJSON *o = cJSON_CreateObject();
	if (!o)
		return NULL;
	cJSON *gpus = cJSON_AddArrayToObject(o, "compatibleGPUs");
	bool ok = (!r->digest[0] || cJSON_AddStringToObject(o, "digest", r->digest)) &&
	          cJSON_AddStringToObject(o, "state", r->state) &&
	          cJSON_AddBoolToObject(o, "compatible", r->compatible) && gpus &&
	          cJSON_AddStringToObject(o, "reason", r->reason ? r->reason : "") &&
	          cJSON_AddStringToObject(o, "message", r->message ? r->message : "") &&
	          cJSON_AddStringToObject(o, "updated", r->updated) &&
	          (!r->verified_by[0] || cJSON_AddStringToObject(o, "verifiedBy", r->verified_by));
	for (size_t i = 0; ok && i < r->ncompatible_gpus; i++) {
		cJSON *s = cJSON_CreateString(r->compatible_gpus[i]);
		ok = s && cJSON_AddItemToArray(gpus, s);
	}
	if (!ok) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

/* Whether the record at path lets pods mount the cache (says Ready). */
static bool record_mountable(const char *path)
{
	char *text = NULL;
	size_t len = 0;
	struct cache_view_ready old;
	bool ready = false;
	if (fsutil_read_file(path, CACHE_VIEW_READY_MAX, &text, &len) != 0)
		return false;
	if (cache_view_ready_parse(text, len, &old, NULL, 0) == 0) {
		ready = strcmp(old.state, "Ready") == 0;
		cache_view_ready_free(&old);
	}
	free(text);
	return ready;
}

/* ready.json replaced whole (temp file, rename): a reader sees the old
 * record or the new one, never a torn one. A record that replaces a Ready
 * one takes a permission away (or moves it to another digest), so it is
 * made durable (fsync of the file, then of the directory) before this
 * returns. Any other write is not: lost in a power cut, it leaves a record
 * that does not say Ready, or none, or an empty one, and the CSI plugin
 * refuses all three until the agent, started again, writes it anew. One
 * cache going Pending, Pulling, Ready costs no fsync. */
static int write_ready(const char *path, const struct cache_view_ready *r)
{
	cJSON *j = ready_to_json(r);
	char *text = j ? cJSON_PrintUnformatted(j) : NULL;
	int rc = -ENOMEM;
	if (text && record_mountable(path))
		rc = fsutil_write_atomic(path, text, strlen(text), 0644);
	else if (text)
		rc = fsutil_write_replace(path, text, strlen(text), 0644);
	cJSON_free(text);
	cJSON_Delete(j);
	return rc;
}

int cache_view_publish(const char *root, const char *ns, const char *name,
                       const struct cache_view_ready *r)
{
	char dir[PATH_MAX], entry[PATH_MAX], target[PATH_MAX], ready[PATH_MAX];
	struct stat st;
	if (!r || !cache_view_valid_digest(r->digest))
		return -EINVAL;
	int rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc == 0)
		rc = fmt_path(entry, sizeof(entry), "%s/store/sha256/%s", root, r->digest + 7);
	if (rc == 0)
		rc = fmt_path(target, sizeof(target), "../../../store/sha256/%s", r->digest + 7);
	if (rc == 0)
		rc = fmt_path(ready, sizeof(ready), "%s/%s", dir, CACHE_VIEW_READY);
	if (rc)
		return rc;
	if (lstat(entry, &st) != 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	if ((rc = fsutil_mkdirs(dir, 0755)) || (rc = replace_symlink(dir, CACHE_VIEW_DATA, target)))
		return rc;
	/* Also makes the link's rename durable (it syncs the directory). */
	return write_ready(ready, r);
}

int cache_view_record(const char *root, const char *ns, const char *name,
                      const struct cache_view_ready *r)
{
	char dir[PATH_MAX], ready[PATH_MAX];
	/* Only cache_view_publish() writes Ready: it links the data first. */
	if (!r || !r->state[0] || strcmp(r->state, "Ready") == 0 ||
	    (r->digest[0] && !cache_view_valid_digest(r->digest)))
		return -EINVAL;
	int rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc == 0)
		rc = fmt_path(ready, sizeof(ready), "%s/%s", dir, CACHE_VIEW_READY);
	if (rc || (rc = fsutil_mkdirs(dir, 0755)))
		return rc;
	return write_ready(ready, r);
}

int cache_view_linked_digest(const char *root, const char *ns, const char *name,
                             char out[CACHE_VIEW_DIGEST_LEN + 1])
{
	static const char prefix[] = "../../../store/sha256/";
	char dir[PATH_MAX], link[PATH_MAX], target[256];
	int rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc == 0)
		rc = fmt_path(link, sizeof(link), "%s/%s", dir, CACHE_VIEW_DATA);
	if (rc)
		return rc;
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return errno == ENOTDIR ? -ENOENT : -errno;
	target[n] = '\0';
	char digest[CACHE_VIEW_DIGEST_LEN + 1];
	const char *hex = target + sizeof(prefix) - 1;
	if ((size_t)n != sizeof(prefix) - 1 + 64 ||
	    strncmp(target, prefix, sizeof(prefix) - 1) != 0)
		return -EINVAL;
	memcpy(digest, "sha256:", 7);
	memcpy(digest + 7, hex, 65);
	if (!cache_view_valid_digest(digest))
		return -EINVAL;
	memcpy(out, digest, CACHE_VIEW_DIGEST_LEN + 1);
	return 0;
}

int cache_view_unpublish(const char *root, const char *ns, const char *name)
{
	char dir[PATH_MAX];
	int rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc)
		return rc;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (unlinkat(dfd, CACHE_VIEW_READY, 0) != 0 && errno != ENOENT)
		rc = -errno;
	if (rc == 0 && fsync(dfd) != 0)
		rc = -errno;
	if (rc == 0 && unlinkat(dfd, CACHE_VIEW_DATA, 0) != 0 && errno != ENOENT)
		rc = -errno;
	if (rc == 0 && unlinkat(dfd, CACHE_VIEW_CAPTURE, 0) != 0 && errno != ENOENT)
		rc = -errno;
	close(dfd);
	if (rc == 0 && rmdir(dir) != 0 && errno != ENOENT)
		rc = -errno;
	return rc;
}

/* ---- captures ---- */

int cache_view_capture_set(const char *root, const char *ns, const char *name, bool on)
{
	char dir[PATH_MAX], path[PATH_MAX];
	int rc = cache_view_dir(dir, sizeof(dir), root, "caches", ns, name);
	if (rc || (rc = fmt_path(path, sizeof(path), "%s/%s", dir, CACHE_VIEW_CAPTURE)))
		return rc;
	bool is = access(path, F_OK) == 0;
	if (is == on)
		return 0;
	if (!on)
		return unlink(path) == 0 || errno == ENOENT ? 0 : -errno;
	if ((rc = fsutil_mkdirs(dir, 0755)))
		return rc;
	return fsutil_write_atomic(path, "", 0, 0644);
}

bool cache_view_capture_on(const char *root, const char *ns, const char *name)
{
	char dir[PATH_MAX], path[PATH_MAX];
	return cache_view_dir(dir, sizeof(dir), root, "caches", ns, name) == 0 &&
	       fmt_path(path, sizeof(path), "%s/%s", dir, CACHE_VIEW_CAPTURE) == 0 &&
	       access(path, F_OK) == 0;
}

int cache_view_capture_handover(const char *root, const char *ns, const char *name, const char *key,
                                const char *vdir, const char *pod_json)
{
	char dir[PATH_MAX], path[PATH_MAX];
	int rc = cache_view_dir(dir, sizeof(dir), root, CACHE_VIEW_CAPTURES, ns, name);
	if (rc || (rc = fmt_path(path, sizeof(path), "%s/pod.json", vdir)) ||
	    (rc = fsutil_write_atomic(path, pod_json, strlen(pod_json), 0600)) ||
	    (rc = fsutil_mkdirs(dir, 0700)) ||
	    (rc = fmt_path(path, sizeof(path), "%s/%s.%lld", dir, key, (long long)time(NULL))))
		return rc;
	return rename(vdir, path) == 0 ? 0 : -errno;
}

/* ---- usage.json ---- */

static void pod_free(struct cache_view_pod *p)
{
	free(p->name);
	free(p->namespace);
	free(p->uid);
	free(p->volume_id);
	free(p->target_path);
	free(p->digest);
	free(p->fallback_state);
	free(p->fallback_reason);
	free(p->fallback_message);
	memset(p, 0, sizeof(*p));
}

void cache_view_usage_free(struct cache_view_usage *u)
{
	if (!u)
		return;
	for (size_t i = 0; i < u->npods; i++)
		pod_free(&u->pods[i]);
	free(u->pods);
	free(u->namespace);
	free(u->name);
	cJSON_Delete(u->finished);
	memset(u, 0, sizeof(*u));
}

void cache_view_usage_list_free(struct cache_view_usage *list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cache_view_usage_free(&list[i]);
	free(list);
}

static int pod_copy(struct cache_view_pod *dst, const struct cache_view_pod *src)
{
	struct cache_view_pod p = {
	    .name = strdup(src->name ? src->name : ""),
	    .namespace = strdup(src->namespace ? src->namespace : ""),
	    .uid = strdup(src->uid ? src->uid : ""),
	    .volume_id = strdup(src->volume_id ? src->volume_id : ""),
	    .target_path = strdup(src->target_path ? src->target_path : ""),
	    .digest = strdup(src->digest ? src->digest : ""),
	    .read_only = src->read_only,
	    .started = src->started,
	    .fallback = src->fallback,
	    .fallback_state =
	        strdup(src->fallback && src->fallback_state ? src->fallback_state : ""),
	    .fallback_reason =
	        strdup(src->fallback && src->fallback_reason ? src->fallback_reason : ""),
	    .fallback_message =
	        strdup(src->fallback && src->fallback_message ? src->fallback_message : ""),
	};
	if (!p.name || !p.namespace || !p.uid || !p.volume_id || !p.target_path || !p.digest ||
	    !p.fallback_state || !p.fallback_reason || !p.fallback_message) {
		pod_free(&p);
		return -ENOMEM;
	}
	*dst = p;
	return 0;
}

static int pod_string(const cJSON *o, const char *key, size_t max, char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsString(v) || strlen(v->valuestring) > max)
		return -EINVAL;
	*out = strdup(v->valuestring);
	return *out ? 0 : -ENOMEM;
}

/* The optional "fallback" member of a pod entry (NULL: none). */
static int parse_fallback(const cJSON *fb, struct cache_view_pod *p)
{
	int rc;
	p->fallback = fb != NULL;
	if (!fb) {
		p->fallback_state = strdup("");
		p->fallback_reason = strdup("");
		p->fallback_message = strdup("");
		return p->fallback_state && p->fallback_reason && p->fallback_message ? 0 : -ENOMEM;
	}
	if (!cJSON_IsObject(fb))
		return -EINVAL;
	if ((rc = pod_string(fb, "state", POD_FIELD_MAX, &p->fallback_state)) ||
	    (rc = pod_string(fb, "reason", REASON_MAX, &p->fallback_reason)) ||
	    (rc = pod_string(fb, "message", MESSAGE_MAX, &p->fallback_message)))
		return rc;
	return 0;
}

static int parse_pod(const cJSON *o, struct cache_view_pod *out)
{
	struct cache_view_pod p;
	memset(&p, 0, sizeof(p));
	int rc = -EINVAL;
	if (!cJSON_IsObject(o))
		goto out;
	if ((rc = pod_string(o, "name", POD_FIELD_MAX, &p.name)) ||
	    (rc = pod_string(o, "namespace", POD_FIELD_MAX, &p.namespace)) ||
	    (rc = pod_string(o, "uid", POD_FIELD_MAX, &p.uid)) ||
	    (rc = pod_string(o, "volumeId", POD_FIELD_MAX, &p.volume_id)) ||
	    (rc = pod_string(o, "targetPath", PATH_MAX, &p.target_path)) ||
	    (rc = pod_string(o, "digest", CACHE_VIEW_DIGEST_LEN, &p.digest)))
		goto out;
	rc = -EINVAL;
	const cJSON *ro = cJSON_GetObjectItemCaseSensitive(o, "readOnly");
	const cJSON *started = cJSON_GetObjectItemCaseSensitive(o, "started");
	if (!cJSON_IsBool(ro) || !cJSON_IsString(started) ||
	    cache_view_parse_rfc3339(started->valuestring, &p.started) != 0)
		goto out;
	p.read_only = cJSON_IsTrue(ro);
	if ((rc = parse_fallback(cJSON_GetObjectItemCaseSensitive(o, "fallback"), &p)))
		goto out;
	*out = p;
	return 0;
out:
	pod_free(&p);
	return rc;
}

/* Parse usage.json text into the pods of u (namespace and name come from
 * the directory the file lives in, not from its content). */
static int parse_usage(const char *text, size_t len, struct cache_view_usage *u)
{
	int rc = -EINVAL;
	cJSON *root = cJSON_ParseWithLength(text, len);
	struct cache_view_pod *pods = NULL;
	size_t n = 0;
	const cJSON *arr = root ? cJSON_GetObjectItemCaseSensitive(root, "pods") : NULL;
	if (!cJSON_IsArray(arr))
		goto out;
	int cnt = cJSON_GetArraySize(arr);
	if (cnt > CACHE_VIEW_PODS_MAX)
		goto out;
	if (cnt > 0 && !(pods = calloc((size_t)cnt, sizeof(*pods)))) {
		rc = -ENOMEM;
		goto out;
	}
	const cJSON *o;
	cJSON_ArrayForEach(o, arr)
	{
		if ((rc = parse_pod(o, &pods[n])) != 0)
			goto out;
		n++;
	}
	const cJSON *fin = cJSON_GetObjectItemCaseSensitive(root, "finished");
	if (cJSON_IsArray(fin) && cJSON_GetArraySize(fin) > 0) {
		rc = -EINVAL;
		if (cJSON_GetArraySize(fin) > CACHE_VIEW_FINISHED_MAX)
			goto out;
		cJSON_ArrayForEach(o, fin) if (!cJSON_IsObject(o)) goto out;
		if (!(u->finished = cJSON_Duplicate(fin, true))) {
			rc = -ENOMEM;
			goto out;
		}
	}
	u->pods = pods;
	u->npods = n;
	pods = NULL;
	n = 0;
	rc = 0;
out:
	for (size_t i = 0; i < n; i++)
		pod_free(&pods[i]);
	free(pods);
	cJSON_Delete(root);
	return rc;
}

static char *usage_to_text(const struct cache_view_usage *u)
{
	char ts[40];
	cJSON *o = cJSON_CreateObject();
	cJSON *arr = o ? cJSON_AddArrayToObject(o, "pods") : NULL;
	bool ok = arr && cJSON_AddStringToObject(o, "namespace", u->namespace) &&
	          cJSON_AddStringToObject(o, "name", u->name);
	for (size_t i = 0; ok && i < u->npods; i++) {
		const struct cache_view_pod *p = &u->pods[i];
		cJSON *e = cJSON_CreateObject();
		cache_view_rfc3339(p->started, ts, sizeof(ts));
		ok = e && cJSON_AddItemToArray(arr, e) &&
		     cJSON_AddStringToObject(e, "name", p->name) &&
		     cJSON_AddStringToObject(e, "namespace", p->namespace) &&
		     cJSON_AddStringToObject(e, "uid", p->uid) &&
		     cJSON_AddStringToObject(e, "volumeId", p->volume_id) &&
		     cJSON_AddStringToObject(e, "targetPath", p->target_path) &&
		     cJSON_AddStringToObject(e, "digest", p->digest) &&
		     cJSON_AddBoolToObject(e, "readOnly", p->read_only) &&
		     cJSON_AddStringToObject(e, "started", ts);
		cJSON *fb = ok && p->fallback ? cJSON_AddObjectToObject(e, "fallback") : NULL;
		if (ok && p->fallback)
			ok = fb && cJSON_AddStringToObject(fb, "state", p->fallback_state) &&
			     cJSON_AddStringToObject(fb, "reason", p->fallback_reason) &&
			     cJSON_AddStringToObject(fb, "message", p->fallback_message);
	}
	cache_view_rfc3339(time(NULL), ts, sizeof(ts));
	ok = ok && cJSON_AddStringToObject(o, "updated", ts) &&
	     (!u->finished || cJSON_AddItemReferenceToObject(o, "finished", u->finished));
	char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
	cJSON_Delete(o);
	return text;
}

static int usage_init(struct cache_view_usage *u, const char *ns, const char *name)
{
	memset(u, 0, sizeof(*u));
	u->namespace = strdup(ns ? ns : "");
	u->name = strdup(name);
	if (!u->namespace || !u->name) {
		cache_view_usage_free(u);
		return -ENOMEM;
	}
	return 0;
}

/* Read dir/usage.json into a fresh usage for (ns, name); no file (or no
 * directory) is a cache nobody uses. */
static int usage_read_dir(const char *dir, const char *ns, const char *name,
                          struct cache_view_usage *out)
{
	struct cache_view_usage u;
	char path[PATH_MAX], *text = NULL;
	size_t len = 0;
	int rc = fmt_path(path, sizeof(path), "%s/%s", dir, CACHE_VIEW_USAGE);
	if (rc == 0)
		rc = usage_init(&u, ns, name);
	if (rc)
		return rc;
	rc = fsutil_read_file(path, CACHE_VIEW_USAGE_MAX, &text, &len);
	if (rc == -ENOENT || rc == -ENOTDIR)
		rc = 0;
	else if (rc == 0)
		rc = parse_usage(text, len, &u);
	free(text);
	if (rc) {
		cache_view_usage_free(&u);
		return rc;
	}
	*out = u;
	return 0;
}

int cache_view_usage_read(const char *run_dir, const char *ns, const char *name,
                          struct cache_view_usage *out)
{
	char dir[PATH_MAX];
	int rc = cache_view_dir(dir, sizeof(dir), run_dir, "usage", ns, name);
	if (rc)
		return rc;
	return usage_read_dir(dir, ns, name, out);
}

/* Keep record (stamped now) as the newest finished pod of u. */
static int keep_finished(struct cache_view_usage *u, const cJSON *record)
{
	char ts[40];
	cJSON *r = cJSON_Duplicate(record, true);
	cache_view_rfc3339(time(NULL), ts, sizeof(ts));
	if (!u->finished)
		u->finished = cJSON_CreateArray();
	if (!r || !u->finished || !cJSON_AddStringToObject(r, "finished", ts) ||
	    !cJSON_AddItemToArray(u->finished, r)) {
		cJSON_Delete(r);
		return -ENOMEM;
	}
	while (cJSON_GetArraySize(u->finished) > CACHE_VIEW_FINISHED_MAX)
		cJSON_DeleteItemFromArray(u->finished, 0);
	return 0;
}

/* Locked read-modify-write: drop the entry of volume_id (if any), then append
 * add (if not NULL), or keep finished (if not NULL) among the finished pods. */
static int usage_update(const char *run_dir, const char *ns, const char *name,
                        const char *volume_id, const struct cache_view_pod *add,
                        const cJSON *finished)
{
	char dir[PATH_MAX];
	struct cache_view_usage u;
	bool have_u = false;
	char *text = NULL;
	int dfd = -1;
	int rc = cache_view_dir(dir, sizeof(dir), run_dir, "usage", ns, name);
	if (rc)
		return rc;
	if (add) {
		rc = fsutil_mkdirs(dir, 0755);
		if (rc)
			return rc;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return (!add && errno == ENOENT) ? 0 : -errno;
	/* flock is per open file description, so it also orders threads of this
	 * process that opened the directory themselves. */
	while (flock(dfd, LOCK_EX) != 0) {
		if (errno != EINTR) {
			rc = -errno;
			goto out;
		}
	}
	rc = usage_read_dir(dir, ns, name, &u);
	if (rc)
		goto out;
	have_u = true;
	size_t kept = 0;
	bool changed = false;
	for (size_t i = 0; i < u.npods; i++) {
		if (strcmp(u.pods[i].volume_id, volume_id) == 0) {
			pod_free(&u.pods[i]);
			changed = true;
			continue;
		}
		u.pods[kept++] = u.pods[i];
	}
	u.npods = kept;
	if (finished) {
		if ((rc = keep_finished(&u, finished)))
			goto out;
		changed = true;
	}
	if (add) {
		if (u.npods >= CACHE_VIEW_PODS_MAX) {
			rc = -ENOSPC;
			goto out;
		}
		struct cache_view_pod *np = realloc(u.pods, (u.npods + 1) * sizeof(*np));
		if (!np) {
			rc = -ENOMEM;
			goto out;
		}
		u.pods = np;
		rc = pod_copy(&u.pods[u.npods], add);
		if (rc)
			goto out;
		u.npods++;
		changed = true;
	}
	if (!changed)
		goto out;
	text = usage_to_text(&u);
	if (!text) {
		rc = -ENOMEM;
		goto out;
	}
	char path[PATH_MAX];
	rc = fmt_path(path, sizeof(path), "%s/%s", dir, CACHE_VIEW_USAGE);
	if (rc == 0) /* the lock keeps other writers out of the temp file too */
		rc = fsutil_write_atomic(path, text, strlen(text), 0644);
out:
	cJSON_free(text);
	if (have_u)
		cache_view_usage_free(&u);
	close(dfd); /* releases the lock */
	return rc;
}

int cache_view_usage_add(const char *run_dir, const char *ns, const char *name,
                         const struct cache_view_pod *pod)
{
	if (!pod || !pod->volume_id || !*pod->volume_id)
		return -EINVAL;
	return usage_update(run_dir, ns, name, pod->volume_id, pod, NULL);
}

int cache_view_usage_remove(const char *run_dir, const char *ns, const char *name,
                            const char *volume_id)
{
	if (!volume_id || !*volume_id)
		return -EINVAL;
	return usage_update(run_dir, ns, name, volume_id, NULL, NULL);
}

int cache_view_usage_finish(const char *run_dir, const char *ns, const char *name,
                            const char *volume_id, const cJSON *record)
{
	if (!volume_id || !*volume_id || !cJSON_IsObject(record))
		return -EINVAL;
	return usage_update(run_dir, ns, name, volume_id, NULL, record);
}

int cache_view_usage_stamp(const char *run_dir, const char *ns, const char *name,
                           struct cache_view_usage_stamp *out)
{
	char dir[PATH_MAX], path[PATH_MAX];
	struct stat st;
	int rc = cache_view_dir(dir, sizeof(dir), run_dir, "usage", ns, name);
	if (rc == 0)
		rc = fmt_path(path, sizeof(path), "%s/%s", dir, CACHE_VIEW_USAGE);
	if (rc)
		return rc;
	if (stat(path, &st) != 0) {
		if (errno != ENOENT)
			return -errno;
		memset(&st, 0, sizeof(st));
	}
	*out = (struct cache_view_usage_stamp){
	    .dev = (uint64_t)st.st_dev,
	    .ino = (uint64_t)st.st_ino,
	    .mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec,
	    .size = (uint64_t)st.st_size};
	return 0;
}

int cache_view_in_use(const char *run_dir, const char *ns, const char *name, size_t *pods)
{
	struct cache_view_usage u;
	int rc = cache_view_usage_read(run_dir, ns, name, &u);
	if (rc)
		return rc;
	*pods = 0;
	for (size_t i = 0; i < u.npods; i++)
		*pods += !u.pods[i].fallback;
	cache_view_usage_free(&u);
	return 0;
}

static int list_scope(const char *run_dir, const char *scope, struct cache_view_usage **list,
                      size_t *n, size_t *cap)
{
	char dir[PATH_MAX];
	int rc = fmt_path(dir, sizeof(dir), "%s/usage/%s", run_dir, scope);
	if (rc)
		return rc;
	const char *ns = strcmp(scope, CACHE_VIEW_CLUSTER) == 0 ? "" : scope;
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (!cache_view_valid_name(e->d_name))
			continue;
		struct cache_view_usage u;
		int r = cache_view_usage_read(run_dir, ns, e->d_name, &u);
		if (r) {
			log_warn("skipping unreadable usage file", "scope", scope, "cache",
			         e->d_name, "error", strerror(-r));
			continue;
		}
		if (*n == *cap) {
			size_t ncap = *cap ? *cap * 2 : 16;
			struct cache_view_usage *nl = realloc(*list, ncap * sizeof(*nl));
			if (!nl) {
				cache_view_usage_free(&u);
				rc = -ENOMEM;
				break;
			}
			*list = nl;
			*cap = ncap;
		}
		(*list)[(*n)++] = u;
	}
	closedir(d);
	return rc;
}

int cache_view_usage_list(const char *run_dir, struct cache_view_usage **out, size_t *nout)
{
	char dir[PATH_MAX];
	struct cache_view_usage *list = NULL;
	size_t n = 0, cap = 0;
	int rc = fmt_path(dir, sizeof(dir), "%s/usage", run_dir);
	if (rc)
		return rc;
	DIR *d = opendir(dir);
	if (!d && errno != ENOENT)
		return -errno;
	struct dirent *e;
	while (d && (e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, CACHE_VIEW_CLUSTER) != 0 &&
		    !cache_view_valid_namespace(e->d_name))
			continue;
		rc = list_scope(run_dir, e->d_name, &list, &n, &cap);
		if (rc)
			break;
	}
	if (d)
		closedir(d);
	if (rc) {
		cache_view_usage_list_free(list, n);
		return rc;
	}
	*out = list;
	*nout = n;
	return 0;
}

int cache_view_digest_in_use(const char *run_dir, const char *digest, bool *used)
{
	struct cache_view_usage *list = NULL;
	size_t n = 0;
	if (!cache_view_valid_digest(digest))
		return -EINVAL;
	int rc = cache_view_usage_list(run_dir, &list, &n);
	if (rc)
		return rc;
	bool found = false;
	for (size_t i = 0; i < n && !found; i++)
		for (size_t j = 0; j < list[i].npods && !found; j++)
			found = strcmp(list[i].pods[j].digest, digest) == 0;
	cache_view_usage_list_free(list, n);
	*used = found;
	return 0;
}
