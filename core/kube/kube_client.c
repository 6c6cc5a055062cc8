/* Kubernetes API client (see kube_client.h). */
#include "kube_client_impl.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "curlerr.h"
#include "loop.h"
#include "metrics.h"

#ifndef GKM_VERSION
#define GKM_VERSION "dev"
#endif

#define DEFAULT_CONNECT_MS 5000L
#define DEFAULT_REQUEST_MS 30000L
#define DEFAULT_MAX_RESPONSE ((size_t)64 << 20)
#define ERROR_BODY_MAX ((size_t)256 << 10) /* of a non-2xx response */
#define TOKEN_MAX 16384

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
	kc_copy_str(c->user_agent, sizeof(c->user_agent),
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
	if (kc_split_api_version(api_version, &r) < 0 || strlen(kind) >= sizeof(r.kind)) {
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
	if (!kc_path_segment_ok(r.version) || (r.group[0] && !kc_path_segment_ok(r.group))) {
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
		const char *name = kc_jstr(res, "name");
		const char *k = kc_jstr(res, "kind");
		if (!name || !k || strchr(name, '/') || strcmp(k, kind))
			continue;
		if (strlen(name) >= sizeof(r.plural))
			continue;
		kc_copy_str(r.plural, sizeof(r.plural), name);
		kc_copy_str(r.kind, sizeof(r.kind), kind);
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
		kc_copy_str(d->api_version, sizeof(d->api_version), api_version);
		pthread_mutex_lock(&c->lock);
		d->next = c->disc;
		c->disc = d;
		pthread_mutex_unlock(&c->lock);
	}
	*out = r;
	return 0;
}
