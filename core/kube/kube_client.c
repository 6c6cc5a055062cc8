/* Kubernetes API client (see kube_client.h). */
#include "kube_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "curlerr.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"

#ifndef GKM_VERSION
#define GKM_VERSION "dev"
#endif

#define DEFAULT_CONNECT_MS 5000L
#define DEFAULT_REQUEST_MS 30000L
#define DEFAULT_MAX_RESPONSE ((size_t)64 << 20)
#define ERROR_BODY_MAX ((size_t)256 << 10) /* of a non-2xx response */
#define PATH_MAX_LEN 4096
#define TOKEN_MAX 16384
#define LIST_RESTARTS 3

/* ---- errors ---- */

static const struct {
	enum kube_reason r;
	const char *name;
	long code;
} reasons[] = {
    {KUBE_OK, "", 200},
    {KUBE_UNKNOWN, "Unknown", 0},
    {KUBE_NOT_FOUND, "NotFound", 404},
    {KUBE_ALREADY_EXISTS, "AlreadyExists", 409},
    {KUBE_CONFLICT, "Conflict", 409},
    {KUBE_INVALID, "Invalid", 422},
    {KUBE_BAD_REQUEST, "BadRequest", 400},
    {KUBE_UNAUTHORIZED, "Unauthorized", 401},
    {KUBE_FORBIDDEN, "Forbidden", 403},
    {KUBE_METHOD_NOT_ALLOWED, "MethodNotAllowed", 405},
    {KUBE_NOT_ACCEPTABLE, "NotAcceptable", 406},
    {KUBE_GONE, "Expired", 410},
    {KUBE_TOO_LARGE, "RequestEntityTooLarge", 413},
    {KUBE_UNSUPPORTED_MEDIA, "UnsupportedMediaType", 415},
    {KUBE_TOO_MANY_REQUESTS, "TooManyRequests", 429},
    {KUBE_INTERNAL, "InternalError", 500},
    {KUBE_UNAVAILABLE, "ServiceUnavailable", 503},
    {KUBE_TIMEOUT, "Timeout", 504},
    {KUBE_TRANSPORT, "Transport", 0},
    {KUBE_MALFORMED, "MalformedResponse", 0},
};

const char *kube_reason_name(enum kube_reason r)
{
	for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
		if (reasons[i].r == r)
			return reasons[i].name;
	return "Unknown";
}

/* The server's reason strings that are spelled differently from ours. */
static enum kube_reason reason_from_text(const char *s)
{
	if (!s || !*s)
		return KUBE_UNKNOWN;
	if (!strcmp(s, "Gone") || !strcmp(s, "Expired") || !strcmp(s, "ResourceExpired"))
		return KUBE_GONE;
	if (!strcmp(s, "ServerTimeout") || !strcmp(s, "Timeout"))
		return KUBE_TIMEOUT;
	for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
		if (reasons[i].code && !strcmp(reasons[i].name, s))
			return reasons[i].r;
	return KUBE_UNKNOWN;
}

static enum kube_reason reason_from_code(long code)
{
	switch (code) {
	case 400:
		return KUBE_BAD_REQUEST;
	case 401:
		return KUBE_UNAUTHORIZED;
	case 403:
		return KUBE_FORBIDDEN;
	case 404:
		return KUBE_NOT_FOUND;
	case 405:
		return KUBE_METHOD_NOT_ALLOWED;
	case 406:
		return KUBE_NOT_ACCEPTABLE;
	case 409:
		return KUBE_CONFLICT;
	case 410:
		return KUBE_GONE;
	case 413:
		return KUBE_TOO_LARGE;
	case 415:
		return KUBE_UNSUPPORTED_MEDIA;
	case 422:
		return KUBE_INVALID;
	case 429:
		return KUBE_TOO_MANY_REQUESTS;
	case 500:
		return KUBE_INTERNAL;
	case 502:
		return KUBE_UNAVAILABLE;
	case 503:
		return KUBE_UNAVAILABLE;
	case 504:
		return KUBE_TIMEOUT;
	default:
		return KUBE_UNKNOWN;
	}
}

bool kube_error_retryable(const struct kube_error *e)
{
	switch (e->reason) {
	case KUBE_TRANSPORT:
	case KUBE_TIMEOUT:
	case KUBE_TOO_MANY_REQUESTS:
	case KUBE_INTERNAL:
	case KUBE_UNAVAILABLE:
		return true;
	case KUBE_UNKNOWN:
		return e->http_code >= 500 || e->http_code == 0;
	default:
		return false;
	}
}

int kube_error_errno(const struct kube_error *e)
{
	switch (e->reason) {
	case KUBE_OK:
		return 0;
	case KUBE_NOT_FOUND:
		return -ENOENT;
	case KUBE_ALREADY_EXISTS:
		return -EEXIST;
	case KUBE_CONFLICT:
		return -EBUSY;
	case KUBE_GONE:
		return -ESTALE;
	case KUBE_INVALID:
	case KUBE_BAD_REQUEST:
	case KUBE_UNSUPPORTED_MEDIA:
	case KUBE_METHOD_NOT_ALLOWED:
	case KUBE_NOT_ACCEPTABLE:
		return -EINVAL;
	case KUBE_UNAUTHORIZED:
	case KUBE_FORBIDDEN:
		return -EACCES;
	case KUBE_TOO_MANY_REQUESTS:
	case KUBE_UNAVAILABLE:
		return -EAGAIN;
	case KUBE_TIMEOUT:
		return -ETIMEDOUT;
	case KUBE_TOO_LARGE:
		return -EMSGSIZE;
	case KUBE_MALFORMED:
		return -EBADMSG;
	default:
		return -EIO;
	}
}

static void copy_str(char *dst, size_t len, const char *src)
{
	if (!src)
		src = "";
	snprintf(dst, len, "%s", src);
}

void kube_error_set(struct kube_error *err, enum kube_reason r, const char *fmt, ...)
{
	if (!err)
		return;
	memset(err, 0, sizeof(*err));
	err->reason = r;
	copy_str(err->reason_text, sizeof(err->reason_text), kube_reason_name(r));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
}

static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

void kube_text_excerpt(char *dst, size_t dlen, const char *s, size_t n)
{
	size_t j = 0;
	for (size_t i = 0; i < n && j + 1 < dlen && i < 200; i++) {
		unsigned char ch = (unsigned char)s[i];
		dst[j++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : ' ';
	}
	if (dlen)
		dst[j] = '\0';
}

void kube_error_from_response(long code, const char *body, size_t len, struct kube_error *err)
{
	memset(err, 0, sizeof(*err));
	err->http_code = code;
	err->reason = reason_from_code(code);
	cJSON *st = body && len ? cJSON_ParseWithLength(body, len) : NULL;
	const char *kind = jstr(st, "kind");
	if (st && kind && !strcmp(kind, "Status")) {
		const char *reason = jstr(st, "reason");
		enum kube_reason r = reason_from_text(reason);
		/* 409 AlreadyExists and 410 Expired are told apart by reason only. */
		if (r != KUBE_UNKNOWN)
			err->reason = r;
		copy_str(err->reason_text, sizeof(err->reason_text),
		         reason && *reason ? reason : kube_reason_name(err->reason));
		copy_str(err->message, sizeof(err->message), jstr(st, "message"));
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(st, "code");
		if (!code && cJSON_IsNumber(c) && c->valuedouble >= 100 && c->valuedouble < 600) {
			err->http_code = (long)c->valuedouble;
			if (err->reason == KUBE_UNKNOWN)
				err->reason = reason_from_code(err->http_code);
		}
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(st, "details");
		copy_str(err->kind, sizeof(err->kind), jstr(d, "kind"));
		copy_str(err->name, sizeof(err->name), jstr(d, "name"));
		copy_str(err->group, sizeof(err->group), jstr(d, "group"));
		const cJSON *ra = cJSON_GetObjectItemCaseSensitive(d, "retryAfterSeconds");
		if (cJSON_IsNumber(ra) && ra->valuedouble > 0 && ra->valuedouble < 3600)
			err->retry_after_s = (unsigned)ra->valuedouble;
		const cJSON *cause;
		cJSON_ArrayForEach(cause, cJSON_GetObjectItemCaseSensitive(d, "causes"))
		{
			if (err->ncauses >= KUBE_MAX_CAUSES)
				break;
			if (!cJSON_IsObject(cause))
				continue;
			struct kube_cause *kc = &err->causes[err->ncauses++];
			copy_str(kc->reason, sizeof(kc->reason), jstr(cause, "reason"));
			copy_str(kc->field, sizeof(kc->field), jstr(cause, "field"));
			copy_str(kc->message, sizeof(kc->message), jstr(cause, "message"));
		}
	} else {
		copy_str(err->reason_text, sizeof(err->reason_text), kube_reason_name(err->reason));
		char ex[256];
		kube_text_excerpt(ex, sizeof(ex), body ? body : "", body ? len : 0);
		snprintf(err->message, sizeof(err->message), "HTTP %ld%s%s", code, *ex ? ": " : "",
		         ex);
	}
	if (!err->message[0])
		snprintf(err->message, sizeof(err->message), "HTTP %ld %s", code, err->reason_text);
	cJSON_Delete(st);
}

/* ---- resources ---- */

static const struct {
	const char *api_version, *kind, *plural;
	bool namespaced;
} builtin[] = {
    {"v1", "Namespace", "namespaces", false},
    {"v1", "Node", "nodes", false},
    {"v1", "Pod", "pods", true},
    {"v1", "ConfigMap", "configmaps", true},
    {"v1", "Secret", "secrets", true},
    {"v1", "Event", "events", true},
    {"v1", "Service", "services", true},
    {"v1", "ServiceAccount", "serviceaccounts", true},
    {"v1", "PersistentVolume", "persistentvolumes", false},
    {"v1", "PersistentVolumeClaim", "persistentvolumeclaims", true},
    {"serving.kserve.io/v1alpha1", "LocalModelCache", "localmodelcaches", false},
    {"serving.kserve.io/v1alpha1", "LocalModelNodeGroup", "localmodelnodegroups", false},
    {"events.k8s.io/v1", "Event", "events", true},
    {"coordination.k8s.io/v1", "Lease", "leases", true},
    {"rbac.authorization.k8s.io/v1", "Role", "roles", true},
    {"rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", true},
    {"apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", false},
    {"gkm.io/v1alpha1", "GKMCache", "gkmcaches", true},
    {"gkm.io/v1alpha1", "ClusterGKMCache", "clustergkmcaches", false},
    {"gkm.io/v1alpha1", "GKMCacheNode", "gkmcachenodes", true},
    {"gkm.io/v1alpha1", "ClusterGKMCacheNode", "clustergkmcachenodes", false},
};

static int split_api_version(const char *av, struct kube_resource *r)
{
	const char *slash = strchr(av, '/');
	if (slash) {
		size_t gl = (size_t)(slash - av);
		if (gl == 0 || gl >= sizeof(r->group) || strchr(slash + 1, '/'))
			return -EINVAL;
		memcpy(r->group, av, gl);
		r->group[gl] = '\0';
		av = slash + 1;
	} else {
		r->group[0] = '\0';
	}
	if (!*av || strlen(av) >= sizeof(r->version))
		return -EINVAL;
	copy_str(r->version, sizeof(r->version), av);
	return 0;
}

int kube_resource_builtin(const char *api_version, const char *kind, struct kube_resource *out)
{
	if (!api_version || !kind)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++) {
		if (strcmp(builtin[i].api_version, api_version) || strcmp(builtin[i].kind, kind))
			continue;
		struct kube_resource r;
		memset(&r, 0, sizeof(r));
		if (split_api_version(api_version, &r) < 0)
			return -EINVAL;
		copy_str(r.plural, sizeof(r.plural), builtin[i].plural);
		copy_str(r.kind, sizeof(r.kind), builtin[i].kind);
		r.namespaced = builtin[i].namespaced;
		*out = r;
		return 0;
	}
	return -ENOENT;
}

void kube_resource_api_version(const struct kube_resource *r, char *buf, size_t len)
{
	if (r->group[0])
		snprintf(buf, len, "%s/%s", r->group, r->version);
	else
		snprintf(buf, len, "%s", r->version);
}

/* Names in paths: what Kubernetes names allow, plus ':' (RBAC names) and
 * upper case (some kinds); never '/', '%', '?', '#', '..', or control bytes. */
static bool path_segment_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 253 || !strcmp(s, ".") || !strcmp(s, ".."))
		return false;
	for (const char *p = s; *p; p++) {
		char ch = *p;
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
		      ch == ':' || ch == '@'))
			return false;
	}
	return true;
}

int kube_resource_path(const struct kube_resource *r, const char *ns, const char *name,
                       const char *sub, char *buf, size_t len)
{
	if ((name && !path_segment_ok(name)) || (ns && r->namespaced && !path_segment_ok(ns)) ||
	    (sub && !path_segment_ok(sub)) || !path_segment_ok(r->plural))
		return -EINVAL;
	int n;
	const char *prefix = r->group[0] ? "/apis/" : "/api";
	const char *group = r->group[0] ? r->group : "";
	if (r->namespaced && ns)
		n = snprintf(buf, len, "%s%s/%s/namespaces/%s/%s", prefix, group, r->version, ns,
		             r->plural);
	else
		n = snprintf(buf, len, "%s%s/%s/%s", prefix, group, r->version, r->plural);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	if (name) {
		int m = snprintf(buf + n, len - (size_t)n, "/%s%s%s", name, sub ? "/" : "",
		                 sub ? sub : "");
		if (m < 0 || (size_t)(n + m) >= len)
			return -ENAMETOOLONG;
	}
	return 0;
}

int kube_query_add(char *buf, size_t len, const char *key, const char *value)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(buf);
	size_t need = n + 1 + strlen(key) + 1;
	for (const char *p = value; *p; p++) {
		unsigned char ch = (unsigned char)*p;
		bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		             (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
		             ch == '~';
		need += plain ? 1 : 3;
	}
	if (need + 1 > len)
		return -ENAMETOOLONG;
	char *w = buf + n;
	*w++ = strchr(buf, '?') ? '&' : '?';
	for (const char *p = key; *p; p++)
		*w++ = *p;
	*w++ = '=';
	for (const char *p = value; *p; p++) {
		unsigned char ch = (unsigned char)*p;
		bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		             (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
		             ch == '~';
		if (plain) {
			*w++ = (char)ch;
		} else {
			*w++ = '%';
			*w++ = hex[ch >> 4];
			*w++ = hex[ch & 15];
		}
	}
	*w = '\0';
	return 0;
}

const char *kube_obj_str(const cJSON *obj, const char *section, const char *field)
{
	const cJSON *s = section ? cJSON_GetObjectItemCaseSensitive(obj, section) : obj;
	return jstr(s, field);
}

/* ---- the client ---- */

struct handle {
	CURL *curl;
	struct handle *next;
};

struct discovered {
	struct kube_resource r;
	char api_version[160];
	struct discovered *next;
};

struct kube_client {
	struct kube_config *cfg;
	struct kube_client_opts opts;
	char user_agent[128];
	CURLSH *share;
	pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
	pthread_mutex_t lock; /* pool and discovery cache */
	struct handle *idle;
	struct discovered *disc;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	/* With CURLOPT_NOSIGNAL (needed with threads) curl leaves SIGPIPE
	 * alone, and a write to a connection the server closed must be an
	 * error, not the end of the daemon. */
	signal(SIGPIPE, SIG_IGN);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
	(void)h;
	(void)access;
	struct kube_client *c = ud;
	pthread_mutex_lock(&c->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ud)
{
	(void)h;
	struct kube_client *c = ud;
	pthread_mutex_unlock(&c->share_locks[data]);
}

int kube_client_new(struct kube_config *cfg, const struct kube_client_opts *opts,
                    struct kube_client **out)
{
	pthread_once(&curl_once, curl_init_once);
	struct kube_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cfg = cfg;
	if (opts)
		c->opts = *opts;
	if (c->opts.connect_timeout_ms <= 0)
		c->opts.connect_timeout_ms = DEFAULT_CONNECT_MS;
	if (c->opts.request_timeout_ms <= 0)
		c->opts.request_timeout_ms = DEFAULT_REQUEST_MS;
	if (!c->opts.max_response)
		c->opts.max_response = DEFAULT_MAX_RESPONSE;
	copy_str(c->user_agent, sizeof(c->user_agent),
	         c->opts.user_agent ? c->opts.user_agent : "gkm/" GKM_VERSION);
	c->opts.user_agent = c->user_agent;
	pthread_mutex_init(&c->lock, NULL);
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&c->share_locks[i], NULL);
	c->share = curl_share_init();
	if (!c->share) {
		kube_client_free(c);
		return -ENOMEM;
	}
	curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(c->share, CURLSHOPT_USERDATA, c);
	curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
	*out = c;
	return 0;
}

void kube_client_free(struct kube_client *c)
{
	if (!c)
		return;
	while (c->idle) {
		struct handle *h = c->idle;
		c->idle = h->next;
		curl_easy_cleanup(h->curl);
		free(h);
	}
	while (c->disc) {
		struct discovered *d = c->disc;
		c->disc = d->next;
		free(d);
	}
	if (c->share)
		curl_share_cleanup(c->share);
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&c->share_locks[i]);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

struct kube_config *kube_client_config(struct kube_client *c)
{
	return c->cfg;
}

static struct handle *handle_get(struct kube_client *c)
{
	pthread_mutex_lock(&c->lock);
	struct handle *h = c->idle;
	if (h)
		c->idle = h->next;
	pthread_mutex_unlock(&c->lock);
	if (h) {
		/* Options go back to defaults; live connections, the TLS session
		 * and DNS caches stay: that is the connection reuse. */
		curl_easy_reset(h->curl);
		return h;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->curl = curl_easy_init();
	if (!h->curl) {
		free(h);
		return NULL;
	}
	return h;
}

static void handle_put(struct kube_client *c, struct handle *h)
{
	pthread_mutex_lock(&c->lock);
	h->next = c->idle;
	c->idle = h;
	pthread_mutex_unlock(&c->lock);
}

/* Per-transfer state shared by the write, header and progress callbacks. */
struct xfer {
	struct kube_client *c;
	char *buf;
	size_t len, cap, max;
	bool too_large;
	long code; /* HTTP status once the headers are in */
	unsigned retry_after;
	/* streaming */
	const struct kube_stream *stream;
	bool stopped_by_callback;
	unsigned long long last_byte_ms;
	bool idle_expired;
	bool stalled;
};

static int buf_append(struct xfer *x, const char *data, size_t n)
{
	if (x->len + n > x->max) {
		x->too_large = true;
		return -1;
	}
	if (x->len + n + 1 > x->cap) {
		size_t ncap = x->cap ? x->cap : 16384;
		while (ncap < x->len + n + 1)
			ncap *= 2;
		char *b = realloc(x->buf, ncap);
		if (!b)
			return -1;
		x->buf = b;
		x->cap = ncap;
	}
	memcpy(x->buf + x->len, data, n);
	x->len += n;
	x->buf[x->len] = '\0';
	return 0;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	size_t n = size * nmemb;
	x->last_byte_ms = loop_now_ms();
	if (x->stream) {
		if (x->code >= 200 && x->code < 300) {
			if (!x->stream->on_data(data, n, x->stream->ud)) {
				x->stopped_by_callback = true;
				return 0;
			}
			return n;
		}
	}
	return buf_append(x, data, n) < 0 ? 0 : n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	size_t n = size * nmemb;
	/* "HTTP/1.1 200 OK" (a fresh status line per response, redirects and
	 * 100-continue included). */
	if (n > 9 && !strncmp(data, "HTTP/", 5)) {
		const char *sp = memchr(data, ' ', n);
		if (sp && (size_t)(sp - data) + 4 <= n) {
			long code = 0;
			for (int i = 1; i <= 3; i++) {
				char ch = sp[i];
				if (ch < '0' || ch > '9') {
					code = 0;
					break;
				}
				code = code * 10 + (ch - '0');
			}
			x->code = code;
		}
	} else if (n > 12 && !strncasecmp(data, "retry-after:", 12)) {
		unsigned long v = 0;
		size_t i = 12;
		while (i < n && data[i] == ' ')
			i++;
		for (; i < n && data[i] >= '0' && data[i] <= '9' && v < 100000; i++)
			v = v * 10 + (unsigned long)(data[i] - '0');
		x->retry_after = v > 3600 ? 3600 : (unsigned)v;
	}
	return n;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
	(void)dltotal;
	(void)dlnow;
	(void)ultotal;
	(void)ulnow;
	struct xfer *x = ud;
	if (!x->stream)
		return 0;
	if (x->stream->stop && atomic_load(x->stream->stop))
		return 1;
	unsigned long long quiet = loop_now_ms() - x->last_byte_ms;
	if (x->stream->idle_timeout_ms > 0 &&
	    quiet > (unsigned long long)x->stream->idle_timeout_ms) {
		x->idle_expired = true;
		return 1;
	}
	if (x->stream->stall_timeout_ms > 0 && x->stream->pending && *x->stream->pending &&
	    quiet > (unsigned long long)x->stream->stall_timeout_ms) {
		x->stalled = true;
		return 1;
	}
	return 0;
}

/* PEM material given inline (a blob curl reads from our memory) or as a
 * file (curl reads it at each new connection, so rotated files are seen). */
static void set_pem(CURL *h, const struct kube_blob *data, const char *file, CURLoption blob_opt,
                    CURLoption file_opt, CURLoption type_opt)
{
	if (data->data) {
		struct curl_blob b = {data->data, data->len, CURL_BLOB_NOCOPY};
		curl_easy_setopt(h, blob_opt, &b);
		if (type_opt)
			curl_easy_setopt(h, type_opt, "PEM");
	} else if (file) {
		curl_easy_setopt(h, file_opt, file);
	}
}

/* Apply connection, TLS, auth and timeout options. hdrs receives the header
 * list to free after the transfer. */
static int setup(struct kube_client *c, CURL *h, const char *path, long timeout_ms,
                 const char *content_type, struct curl_slist **hdrs, struct kube_error *err)
{
	struct kube_config *cfg = c->cfg;
	char url[PATH_MAX_LEN + 512];
	int n = snprintf(url, sizeof(url), "%s%s", cfg->server, path);
	if (n < 0 || (size_t)n >= sizeof(url)) {
		kube_error_set(err, KUBE_BAD_REQUEST, "request path too long (%zu bytes)",
		               strlen(path));
		return -ENAMETOOLONG;
	}
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_SHARE, c->share);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->opts.connect_timeout_ms);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 10L);
	curl_easy_setopt(h, CURLOPT_USERAGENT, c->opts.user_agent);
	curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");
	if (cfg->insecure) {
		curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
		curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
	}
	set_pem(h, &cfg->ca_data, cfg->ca_file, CURLOPT_CAINFO_BLOB, CURLOPT_CAINFO, 0);
	set_pem(h, &cfg->cert_data, cfg->cert_file, CURLOPT_SSLCERT_BLOB, CURLOPT_SSLCERT,
	        CURLOPT_SSLCERTTYPE);
	set_pem(h, &cfg->key_data, cfg->key_file, CURLOPT_SSLKEY_BLOB, CURLOPT_SSLKEY,
	        CURLOPT_SSLKEYTYPE);
	if (cfg->username) {
		curl_easy_setopt(h, CURLOPT_USERNAME, cfg->username);
		curl_easy_setopt(h, CURLOPT_PASSWORD, cfg->password ? cfg->password : "");
	}

	struct curl_slist *l = NULL, *t;
	l = curl_slist_append(l, "Accept: application/json");
	if (!l)
		goto nomem;
	/* No "Expect: 100-continue" round trip before bodies over 1 KiB. */
	if (!(t = curl_slist_append(l, "Expect:")))
		goto nomem;
	l = t;
	if (content_type) {
		char ct[128];
		snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
		if (!(t = curl_slist_append(l, ct)))
			goto nomem;
		l = t;
	}
	/* Token per request: it may have rotated since the last one. */
	char *tok = malloc(TOKEN_MAX + 32);
	if (!tok)
		goto nomem;
	memcpy(tok, "Authorization: Bearer ", 22);
	int rc = kube_config_token(cfg, tok + 22, TOKEN_MAX);
	if (rc == 0 && tok[22]) {
		t = curl_slist_append(l, tok);
		explicit_bzero(tok, TOKEN_MAX + 32);
		free(tok);
		if (!t)
			goto nomem;
		l = t;
	} else {
		explicit_bzero(tok, TOKEN_MAX + 32);
		free(tok);
		if (rc < 0) {
			curl_slist_free_all(l);
			kube_error_set(err, KUBE_UNAUTHORIZED, "no bearer token: %s",
			               strerror(-rc));
			return rc;
		}
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
	*hdrs = l;
	return 0;
nomem:
	curl_slist_free_all(l);
	kube_error_set(err, KUBE_TRANSPORT, "out of memory");
	return -ENOMEM;
}

static void transport_error(CURLcode cc, const char *errbuf, const char *method, const char *path,
                            struct kube_error *err)
{
	enum kube_reason r = cc == CURLE_OPERATION_TIMEDOUT ? KUBE_TIMEOUT : KUBE_TRANSPORT;
	kube_error_set(err, r, "%s %s: %s", method, path,
	               errbuf[0] ? errbuf : curl_easy_strerror(cc));
}

/* Requests by verb and outcome ("200", "409", "transport"), and their latency. */
static void observe(const char *method, long code, CURLcode cc, unsigned long long t0)
{
	static const double buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
	                                 0.5,   1,    2.5,   5,    10,  30};
	struct metric *total =
	    metrics_counter("gkm_kube_requests_total",
	                    "Requests to the Kubernetes API by verb and result", "verb,code");
	struct metric *secs = metrics_histogram("gkm_kube_request_seconds",
	                                        "Latency of requests to the Kubernetes API", "verb",
	                                        buckets, sizeof(buckets) / sizeof(buckets[0]));
	char cs[16];
	if (code)
		snprintf(cs, sizeof(cs), "%ld", code);
	else
		snprintf(cs, sizeof(cs), "%s",
		         cc == CURLE_OPERATION_TIMEDOUT ? "timeout" : "transport");
	metrics_add(total, METRICS_L(method, cs), 1);
	metrics_observe(secs, METRICS_L(method), (double)(loop_now_ms() - t0) / 1000.0);
}

int kube_client_do(struct kube_client *c, const struct kube_request *rq, cJSON **out,
                   struct kube_error *err)
{
	struct kube_error scratch;
	if (!err)
		err = &scratch;
	struct handle *h = handle_get(c);
	if (!h) {
		kube_error_set(err, KUBE_TRANSPORT, "out of memory");
		return -ENOMEM;
	}
	struct curl_slist *hdrs = NULL;
	struct xfer x = {.c = c, .max = c->opts.max_response};
	char errbuf[CURL_ERROR_SIZE] = "";
	long timeout = rq->timeout_ms > 0 ? rq->timeout_ms : c->opts.request_timeout_ms;
	int rc =
	    setup(c, h->curl, rq->path, timeout, rq->body ? rq->content_type : NULL, &hdrs, err);
	if (rc < 0)
		goto out;
	curl_easy_setopt(h->curl, CURLOPT_CUSTOMREQUEST, rq->method);
	if (!strcmp(rq->method, "GET"))
		curl_easy_setopt(h->curl, CURLOPT_HTTPGET, 1L);
	if (rq->body) {
		curl_easy_setopt(h->curl, CURLOPT_POSTFIELDS, rq->body);
		curl_easy_setopt(h->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
	}
	curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(h->curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h->curl, CURLOPT_HEADERDATA, &x);
	curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, errbuf);
	unsigned long long t0 = loop_now_ms();
	CURLcode cc = curl_easy_perform(h->curl);
	long code = 0;
	curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &code);
	observe(rq->method, code, cc, t0);
	if (x.too_large) {
		kube_error_set(err, KUBE_TOO_LARGE, "%s %s: response larger than %zu bytes",
		               rq->method, rq->path, x.max);
		err->http_code = code;
		rc = -EMSGSIZE;
		goto out;
	}
	if (cc != CURLE_OK) {
		transport_error(cc, errbuf, rq->method, rq->path, err);
		rc = curlerr_errno(cc);
		goto out;
	}
	if (code < 200 || code >= 300) {
		kube_error_from_response(code, x.buf, x.len, err);
		if (!err->retry_after_s)
			err->retry_after_s = x.retry_after;
		rc = kube_error_errno(err);
		if (rc == 0)
			rc = -EIO;
		goto out;
	}
	cJSON *j = NULL;
	if (x.len) {
		j = cJSON_ParseWithLength(x.buf, x.len);
		if (!j || !(cJSON_IsObject(j))) {
			cJSON_Delete(j);
			char ex[256];
			kube_text_excerpt(ex, sizeof(ex), x.buf, x.len);
			kube_error_set(err, KUBE_MALFORMED,
			               "%s %s: HTTP %ld with a body that is not a JSON object: %s",
			               rq->method, rq->path, code, ex);
			err->http_code = code;
			rc = -EBADMSG;
			goto out;
		}
	}
	memset(err, 0, sizeof(*err));
	err->http_code = code;
	if (out)
		*out = j;
	else
		cJSON_Delete(j);
	rc = 0;
out:
	curl_slist_free_all(hdrs);
	handle_put(c, h);
	free(x.buf);
	return rc;
}

int kube_client_stream(struct kube_client *c, const struct kube_stream *s, struct kube_error *err)
{
	struct kube_error scratch;
	if (!err)
		err = &scratch;
	struct handle *h = handle_get(c);
	if (!h) {
		kube_error_set(err, KUBE_TRANSPORT, "out of memory");
		return -ENOMEM;
	}
	struct curl_slist *hdrs = NULL;
	struct xfer x = {.c = c, .max = ERROR_BODY_MAX, .stream = s, .last_byte_ms = loop_now_ms()};
	char errbuf[CURL_ERROR_SIZE] = "";
	int rc =
	    setup(c, h->curl, s->path, s->timeout_ms > 0 ? s->timeout_ms : 0, NULL, &hdrs, err);
	if (rc < 0)
		goto out;
	curl_easy_setopt(h->curl, CURLOPT_HTTPGET, 1L);
	/* Compression would delay events behind the compressor's buffer. */
	curl_easy_setopt(h->curl, CURLOPT_ACCEPT_ENCODING, NULL);
	curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(h->curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h->curl, CURLOPT_HEADERDATA, &x);
	curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(h->curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(h->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(h->curl, CURLOPT_XFERINFODATA, &x);
	CURLcode cc = curl_easy_perform(h->curl);
	long code = 0;
	curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &code);
	metrics_add(metrics_counter(
	                "gkm_kube_watch_streams_total",
	                "Watch streams that ended, by the HTTP status they had (0: no response)",
	                "code"),
	            METRICS_L(code == 200   ? "200"
	                      : code == 0   ? "0"
	                      : code == 410 ? "410"
	                                    : "other"),
	            1);
	if (s->stop && atomic_load(s->stop)) {
		kube_error_set(err, KUBE_TRANSPORT, "GET %s: stopped", s->path);
		rc = -ECANCELED;
		goto out;
	}
	if (x.idle_expired || x.stalled) {
		kube_error_set(err, KUBE_TIMEOUT, "GET %s: %s for %ld ms", s->path,
		               x.stalled ? "stalled in the middle of a message" : "no data",
		               x.stalled ? s->stall_timeout_ms : s->idle_timeout_ms);
		rc = -ETIMEDOUT;
		goto out;
	}
	if (code >= 200 && code < 300) {
		if (cc == CURLE_OK || x.stopped_by_callback) {
			memset(err, 0, sizeof(*err));
			err->http_code = code;
			rc = 0;
		} else {
			/* The server closed mid-stream, a reset, or the cap ran out. */
			transport_error(cc, errbuf, "GET", s->path, err);
			err->http_code = code;
			rc = curlerr_errno(cc);
		}
		goto out;
	}
	if (cc != CURLE_OK && code == 0) {
		transport_error(cc, errbuf, "GET", s->path, err);
		rc = curlerr_errno(cc);
		goto out;
	}
	kube_error_from_response(code, x.buf, x.len, err);
	if (!err->retry_after_s)
		err->retry_after_s = x.retry_after;
	rc = kube_error_errno(err);
	if (rc == 0)
		rc = -EIO;
out:
	curl_slist_free_all(hdrs);
	handle_put(c, h);
	free(x.buf);
	return rc;
}

/* ---- discovery ---- */

int kube_client_resource(struct kube_client *c, const char *api_version, const char *kind,
                         struct kube_resource *out, struct kube_error *err)
{
	if (!api_version || !kind || !*kind) {
		kube_error_set(err, KUBE_BAD_REQUEST, "apiVersion and kind are required");
		return -EINVAL;
	}
	if (kube_resource_builtin(api_version, kind, out) == 0)
		return 0;
	struct kube_resource r;
	memset(&r, 0, sizeof(r));
	if (split_api_version(api_version, &r) < 0 || strlen(kind) >= sizeof(r.kind)) {
		kube_error_set(err, KUBE_BAD_REQUEST, "malformed apiVersion \"%s\"", api_version);
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	for (struct discovered *d = c->disc; d; d = d->next) {
		if (!strcmp(d->api_version, api_version) && !strcmp(d->r.kind, kind)) {
			*out = d->r;
			pthread_mutex_unlock(&c->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&c->lock);

	char path[512];
	if (r.group[0])
		snprintf(path, sizeof(path), "/apis/%s/%s", r.group, r.version);
	else
		snprintf(path, sizeof(path), "/api/%s", r.version);
	if (!path_segment_ok(r.version) || (r.group[0] && !path_segment_ok(r.group))) {
		kube_error_set(err, KUBE_BAD_REQUEST, "malformed apiVersion \"%s\"", api_version);
		return -EINVAL;
	}
	cJSON *list = NULL;
	struct kube_request rq = {.method = "GET", .path = path};
	int rc = kube_client_do(c, &rq, &list, err);
	if (rc < 0)
		return rc;
	rc = -ENOENT;
	const cJSON *res;
	cJSON_ArrayForEach(res, cJSON_GetObjectItemCaseSensitive(list, "resources"))
	{
		const char *name = jstr(res, "name");
		const char *k = jstr(res, "kind");
		if (!name || !k || strchr(name, '/') || strcmp(k, kind))
			continue;
		if (strlen(name) >= sizeof(r.plural))
			continue;
		copy_str(r.plural, sizeof(r.plural), name);
		copy_str(r.kind, sizeof(r.kind), kind);
		r.namespaced = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "namespaced"));
		rc = 0;
		break;
	}
	cJSON_Delete(list);
	if (rc < 0) {
		kube_error_set(err, KUBE_NOT_FOUND, "the server does not serve kind %s in %s", kind,
		               api_version);
		return rc;
	}
	struct discovered *d = calloc(1, sizeof(*d));
	if (d) {
		d->r = r;
		copy_str(d->api_version, sizeof(d->api_version), api_version);
		pthread_mutex_lock(&c->lock);
		d->next = c->disc;
		c->disc = d;
		pthread_mutex_unlock(&c->lock);
	}
	*out = r;
	return 0;
}

/* ---- verbs ---- */

static int path_or_fail(const struct kube_resource *r, const char *ns, const char *name,
                        const char *sub, char *buf, size_t len, struct kube_error *err)
{
	int rc = kube_resource_path(r, ns, name, sub, buf, len);
	if (rc < 0)
		kube_error_set(err, KUBE_BAD_REQUEST, "invalid %s name \"%s\"%s%s", r->kind,
		               name ? name : "", ns ? " in namespace " : "", ns ? ns : "");
	return rc;
}

int kube_client_get(struct kube_client *c, const struct kube_resource *r, const char *ns,
                    const char *name, cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = path_or_fail(r, ns, name, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	struct kube_request rq = {.method = "GET", .path = path};
	cJSON *obj = NULL;
	rc = kube_client_do(c, &rq, &obj, err);
	if (rc < 0)
		return rc;
	if (!obj) {
		kube_error_set(err, KUBE_MALFORMED, "GET %s: empty body", path);
		return -EBADMSG;
	}
	if (out)
		*out = obj;
	else
		cJSON_Delete(obj);
	return 0;
}

int kube_client_list(struct kube_client *c, const struct kube_resource *r, const char *ns,
                     const struct kube_list_opts *o, cJSON **items, char *rv, size_t rvlen,
                     struct kube_error *err)
{
	struct kube_list_opts dflt = {0};
	if (!o)
		o = &dflt;
	unsigned limit = o->limit ? o->limit : 500;
	size_t max_items = o->max_items ? o->max_items : 1000000;
	char base[PATH_MAX_LEN];
	int rc = path_or_fail(r, ns, NULL, NULL, base, sizeof(base), err);
	if (rc < 0)
		return rc;
	char limit_s[16];
	snprintf(limit_s, sizeof(limit_s), "%u", limit);
	if ((o->label_selector && *o->label_selector &&
	     kube_query_add(base, sizeof(base), "labelSelector", o->label_selector) < 0) ||
	    (o->field_selector && *o->field_selector &&
	     kube_query_add(base, sizeof(base), "fieldSelector", o->field_selector) < 0) ||
	    kube_query_add(base, sizeof(base), "limit", limit_s) < 0) {
		kube_error_set(err, KUBE_BAD_REQUEST, "list %s: selectors too long", r->plural);
		return -ENAMETOOLONG;
	}
	cJSON *all = NULL, *page = NULL;
	char *cont = NULL;
	int restarts = 0;
	size_t count = 0;
restart:
	count = 0;
	cJSON_Delete(all);
	all = cJSON_CreateArray();
	free(cont);
	cont = NULL;
	if (!all) {
		rc = -ENOMEM;
		goto out;
	}
	for (;;) {
		char path[PATH_MAX_LEN + 1024];
		copy_str(path, sizeof(path), base);
		if (cont && kube_query_add(path, sizeof(path), "continue", cont) < 0) {
			kube_error_set(err, KUBE_MALFORMED, "list %s: continue token too long",
			               r->plural);
			rc = -EBADMSG;
			goto out;
		}
		struct kube_request rq = {.method = "GET", .path = path};
		rc = kube_client_do(c, &rq, &page, err);
		if (rc == -ESTALE && cont && restarts < LIST_RESTARTS) {
			/* The continue token expired (compaction): a consistent
			 * list needs a fresh start. */
			restarts++;
			log_info("kube: list continue token expired, listing again", "resource",
			         r->plural);
			goto restart;
		}
		if (rc < 0)
			goto out;
		cJSON *its = cJSON_GetObjectItemCaseSensitive(page, "items");
		cJSON *meta = cJSON_GetObjectItemCaseSensitive(page, "metadata");
		if (!page || !(cJSON_IsArray(its) || cJSON_IsNull(its) || !its) ||
		    (meta && !cJSON_IsObject(meta))) {
			kube_error_set(err, KUBE_MALFORMED, "GET %s: not a list", path);
			rc = -EBADMSG;
			goto out;
		}
		cJSON *it;
		while (its && (it = cJSON_DetachItemFromArray(its, 0))) {
			if (!cJSON_IsObject(it)) {
				cJSON_Delete(it);
				kube_error_set(err, KUBE_MALFORMED,
				               "GET %s: a list item is not an object", path);
				rc = -EBADMSG;
				goto out;
			}
			if (count++ >= max_items) {
				cJSON_Delete(it);
				kube_error_set(err, KUBE_TOO_LARGE, "list %s: more than %zu items",
				               r->plural, max_items);
				rc = -EMSGSIZE;
				goto out;
			}
			cJSON_AddItemToArray(all, it);
		}
		if (o->on_page) {
			o->on_page(all, cont == NULL /* the first page */, o->page_ud);
			all = cJSON_CreateArray();
			if (!all) {
				rc = -ENOMEM;
				goto out;
			}
		}
		const char *lrv = jstr(meta, "resourceVersion");
		const char *next = jstr(meta, "continue");
		if (!next || !*next) {
			if (rv && rvlen) {
				if (!lrv || strlen(lrv) >= rvlen) {
					kube_error_set(
					    err, KUBE_MALFORMED,
					    "GET %s: list without a usable resourceVersion", path);
					rc = -EBADMSG;
					goto out;
				}
				copy_str(rv, rvlen, lrv);
			}
			break;
		}
		free(cont);
		cont = strdup(next);
		cJSON_Delete(page);
		page = NULL;
		if (!cont) {
			rc = -ENOMEM;
			goto out;
		}
	}
	if (o->on_page) {
		cJSON_Delete(all);
		all = NULL;
	}
	*items = all;
	all = NULL;
	rc = 0;
out:
	cJSON_Delete(page);
	cJSON_Delete(all);
	free(cont);
	return rc;
}

static int send_json(struct kube_client *c, const char *method, const char *path, const char *ctype,
                     const cJSON *body, cJSON **out, struct kube_error *err)
{
	char *text = cJSON_PrintUnformatted(body);
	if (!text) {
		kube_error_set(err, KUBE_BAD_REQUEST, "cannot serialise the request body");
		return -ENOMEM;
	}
	struct kube_request rq = {
	    .method = method,
	    .path = path,
	    .content_type = ctype,
	    .body = text,
	    .body_len = strlen(text),
	};
	int rc = kube_client_do(c, &rq, out, err);
	free(text);
	return rc;
}

/* Every write's first step: the path of the object verb acts on, ns and
 * name taken from obj (when given) where the caller passes none; a name is
 * required unless the verb creates (the collection's path then). */
static int object_path(const struct kube_resource *r, const char *verb, const char *ns,
                       const char *name, const cJSON *obj, const char *sub, char *buf, size_t len,
                       struct kube_error *err)
{
	bool create = strcmp(verb, "create") == 0;
	if (!ns && obj)
		ns = kube_obj_namespace(obj);
	if (!name && obj && !create)
		name = kube_obj_name(obj);
	if ((!create && !name) || (r->namespaced && !ns)) {
		kube_error_set(err, KUBE_BAD_REQUEST, "%s %s: %s required", verb, r->kind,
		               create ? "a namespace is" : "name and namespace are");
		return -EINVAL;
	}
	return path_or_fail(r, ns, create ? NULL : name, sub, buf, len, err);
}

int kube_client_create(struct kube_client *c, const struct kube_resource *r, const char *ns,
                       const cJSON *obj, cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = object_path(r, "create", ns, NULL, obj, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	return send_json(c, "POST", path, "application/json", obj, out, err);
}

int kube_client_replace(struct kube_client *c, const struct kube_resource *r, const char *ns,
                        const char *name, const cJSON *obj, cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = object_path(r, "replace", ns, name, obj, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	return send_json(c, "PUT", path, "application/json", obj, out, err);
}

int kube_client_apply(struct kube_client *c, const struct kube_resource *r, const char *ns,
                      const char *name, const cJSON *obj, const struct kube_apply_opts *o,
                      cJSON **out, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	if (!o || !o->field_manager || !*o->field_manager || strlen(o->field_manager) > 128) {
		kube_error_set(err, KUBE_BAD_REQUEST,
		               "apply: a field manager (at most 128 bytes) is required");
		return -EINVAL;
	}
	int rc = object_path(r, "apply", ns, name, obj, o->status ? "status" : NULL, path,
	                     sizeof(path), err);
	if (rc < 0)
		return rc;
	if (kube_query_add(path, sizeof(path), "fieldManager", o->field_manager) < 0 ||
	    (o->force && kube_query_add(path, sizeof(path), "force", "true") < 0)) {
		kube_error_set(err, KUBE_BAD_REQUEST, "apply %s: path too long", r->kind);
		return -ENAMETOOLONG;
	}
	/* JSON is YAML: the apply content type takes it as is. */
	return send_json(c, "PATCH", path, "application/apply-patch+yaml", obj, out, err);
}

int kube_client_delete(struct kube_client *c, const struct kube_resource *r, const char *ns,
                       const char *name, const struct kube_delete_opts *o, struct kube_error *err)
{
	char path[PATH_MAX_LEN];
	int rc = object_path(r, "delete", ns, name, NULL, NULL, path, sizeof(path), err);
	if (rc < 0)
		return rc;
	cJSON *body = cJSON_CreateObject();
	if (!body)
		return -ENOMEM;
	cJSON_AddStringToObject(body, "kind", "DeleteOptions");
	cJSON_AddStringToObject(body, "apiVersion", "v1");
	if (o && (o->uid || o->resource_version)) {
		cJSON *pre = cJSON_AddObjectToObject(body, "preconditions");
		if (pre && o->uid)
			cJSON_AddStringToObject(pre, "uid", o->uid);
		if (pre && o->resource_version)
			cJSON_AddStringToObject(pre, "resourceVersion", o->resource_version);
	}
	if (o && o->propagation) {
		if (strcmp(o->propagation, "Background") && strcmp(o->propagation, "Foreground") &&
		    strcmp(o->propagation, "Orphan")) {
			cJSON_Delete(body);
			kube_error_set(err, KUBE_BAD_REQUEST,
			               "delete: unknown propagation policy \"%s\"", o->propagation);
			return -EINVAL;
		}
		cJSON_AddStringToObject(body, "propagationPolicy", o->propagation);
	}
	rc = send_json(c, "DELETE", path, "application/json", body, NULL, err);
	cJSON_Delete(body);
	return rc;
}

bool kube_valid_subdomain(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 253)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
		if (alnum)
			continue;
		if (ch != '-' && ch != '.')
			return false;
		if (i == 0 || i == n - 1)
			return false;
		if (ch == '.' && (s[i - 1] == '.' || s[i - 1] == '-' || s[i + 1] == '-'))
			return false;
	}
	return true;
}

static void rfc3339_now(char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int kube_event_build(const struct kube_event *ev, cJSON **out, struct kube_error *err)
{
	const cJSON *o = ev->regarding;
	const char *av = jstr(o, "apiVersion"), *kind = jstr(o, "kind");
	const char *name = kube_obj_name(o), *ns = kube_obj_namespace(o), *uid = kube_obj_uid(o);
	if (!av || !kind || !name) {
		kube_error_set(
		    err, KUBE_BAD_REQUEST,
		    "event: the regarding object needs apiVersion, kind and metadata.name");
		return -EINVAL;
	}
	if (!ev->reason || !*ev->reason || strlen(ev->reason) > 128) {
		kube_error_set(err, KUBE_BAD_REQUEST,
		               "event: a reason of 1 to 128 bytes is required");
		return -EINVAL;
	}
	const char *type = ev->type ? ev->type : "Normal";
	if (strcmp(type, "Normal") && strcmp(type, "Warning")) {
		kube_error_set(err, KUBE_BAD_REQUEST,
		               "event: type must be Normal or Warning, not \"%s\"", type);
		return -EINVAL;
	}
	/* "<object>.<hex nanoseconds>" like kubectl's recorder; an object name
	 * that is not a DNS subdomain gets a generic prefix. */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	unsigned long long nanos =
	    (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
	static _Atomic unsigned long long seq;
	nanos += atomic_fetch_add(&seq, 1) % 1000;
	char evname[254], suffix[24];
	snprintf(suffix, sizeof(suffix), ".%llx", nanos);
	size_t maxprefix = sizeof(evname) - 1 - strlen(suffix);
	if (kube_valid_subdomain(name))
		snprintf(evname, sizeof(evname), "%.*s%s", (int)maxprefix, name, suffix);
	else
		snprintf(evname, sizeof(evname), "gkm%s", suffix);
	if (!kube_valid_subdomain(evname)) /* the truncation ended on '.' or '-' */
		snprintf(evname, sizeof(evname), "gkm%s", suffix);
	char msg[1025];
	snprintf(msg, sizeof(msg), "%s", ev->message ? ev->message : "");
	char now[32];
	rfc3339_now(now, sizeof(now));

	cJSON *e = cJSON_CreateObject();
	cJSON *meta = cJSON_AddObjectToObject(e, "metadata");
	cJSON *inv = cJSON_AddObjectToObject(e, "involvedObject");
	cJSON *src = cJSON_AddObjectToObject(e, "source");
	if (!e || !meta || !inv || !src) {
		cJSON_Delete(e);
		return -ENOMEM;
	}
	cJSON_AddStringToObject(e, "apiVersion", "v1");
	cJSON_AddStringToObject(e, "kind", "Event");
	cJSON_AddStringToObject(meta, "name", evname);
	cJSON_AddStringToObject(meta, "namespace", ns && *ns ? ns : "default");
	cJSON_AddStringToObject(inv, "apiVersion", av);
	cJSON_AddStringToObject(inv, "kind", kind);
	if (ns && *ns)
		cJSON_AddStringToObject(inv, "namespace", ns);
	cJSON_AddStringToObject(inv, "name", name);
	if (uid)
		cJSON_AddStringToObject(inv, "uid", uid);
	const char *orv = kube_obj_rv(o);
	if (orv)
		cJSON_AddStringToObject(inv, "resourceVersion", orv);
	cJSON_AddStringToObject(e, "reason", ev->reason);
	cJSON_AddStringToObject(e, "message", msg);
	cJSON_AddStringToObject(e, "type", type);
	cJSON_AddStringToObject(src, "component", ev->component ? ev->component : "gkm");
	if (ev->host)
		cJSON_AddStringToObject(src, "host", ev->host);
	cJSON_AddStringToObject(e, "firstTimestamp", now);
	cJSON_AddStringToObject(e, "lastTimestamp", now);
	cJSON_AddNumberToObject(e, "count", 1);
	cJSON_AddStringToObject(e, "reportingComponent", ev->component ? ev->component : "gkm");
	cJSON_AddStringToObject(e, "reportingInstance", ev->host ? ev->host : "");
	*out = e;
	return 0;
}

int kube_client_event(struct kube_client *c, const struct kube_event *ev, struct kube_error *err)
{
	cJSON *e = NULL;
	int rc = kube_event_build(ev, &e, err);
	if (rc < 0)
		return rc;
	struct kube_resource r;
	rc = kube_resource_builtin("v1", "Event", &r);
	if (rc == 0)
		rc = kube_client_create(c, &r, kube_obj_namespace(e), e, NULL, err);
	cJSON_Delete(e);
	return rc;
}
