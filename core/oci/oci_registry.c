#include "oci_registry.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "backoff.h"
#include "base64.h"
#include "curlerr.h"
#include "log.h"
#include "fsutil.h"
#include "oci_auth.h"
#include "oci_mirrors.h"

#define HDR_MAX 8192
#define ERR_BODY_MAX (64u << 10)
#define TOKEN_BODY_MAX (1u << 20)
/* Blob streams: libcurl receives up to STREAM_RECV bytes per read (its
 * default, 16 KiB, costs a recv and a callback per 16 KiB: about 38,000 of
 * each for a 600 MB layer) into a buffer that holds several of them. Under the
 * malloc mmap threshold (256 KiB, see main.c), so the copy libcurl keeps of
 * a chunk while the stream is paused reuses heap memory instead of mapping
 * fresh pages each time. */
#define STREAM_RECV (128u << 10)
#define STREAM_BUF (8 * STREAM_RECV)
#define URL_MAX 8192
#define RETRY_AFTER_MAX_S 30
#define BACKOFF_CAP_MS 8000
/* blobs up to this size are read whole from a mirror and checked before
 * they are handed out (configs, signature payloads): one that is wrong is
 * passed over for the next source at once */
#define MIRROR_WHOLE_MAX (4u << 20)
#define MIRROR_CLIENTS_MAX (OCI_MIRRORS_MAX + 2)
#define MIRROR_REFUSALS_MAX 64

struct token {
	char *scope;
	char *value;
	time_t expires;
	struct token *next;
};

struct oci_registry {
	char *host;
	bool plain_http;
	bool scheme_known; /* loopback hosts: https first until one answer says which */
	struct oci_registry_opts o;
	char *ca_file;
	CURLM *multi;
	struct oci_creds creds;
	bool have_creds;
	char creds_source[256];
	enum oci_auth_scheme auth;
	char *realm, *service;
	struct token *tokens;
	uint64_t seed;      /* backoff jitter */
	char api_path[256]; /* "/v2", or a mirror's override_path */
	char *ca_pem;       /* a mirror's CA files, concatenated */
	size_t ca_len;
	/* mirrors (the client made for the host; its endpoint clients point
	 * back to it with front) */
	struct oci_mirrors *mirrors;
	struct oci_registry *front;
	char *auth_json, *auth_file, *username, *password, *auth_source; /* endpoint clients' */
	bool creds_named;    /* credentials come from auth_json: messages name it */
	bool creds_why_none; /* none on purpose: creds_source says why */
	struct endpoint_client {
		char key[1400];
		struct oci_registry *reg;
	} eps[MIRROR_CLIENTS_MAX];
	size_t n_eps;
	struct refusal {
		char host[256];
		char digest[OCI_DIGEST_MAX];
	} refused[MIRROR_REFUSALS_MAX];
	unsigned n_refused;
	bool mirror; /* an endpoint client for a mirror */
};

/* One HTTP exchange. */
struct xfer {
	struct oci_registry *reg;
	CURL *h;
	struct curl_slist *hdrs;
	char errbuf[CURL_ERROR_SIZE];
	/* request body */
	int up_fd;
	const char *up_mem;
	uint64_t up_off, up_len, up_pos;
	/* response */
	long status;
	char content_type[256], docker_digest[OCI_DIGEST_MAX + 8], location[HDR_MAX];
	char www_auth[HDR_MAX], oci_subject[256], filters[256], retry_after[32], content_range[128];
	int64_t content_length;
	/* body to memory (small requests, and error bodies of streams) */
	char *body;
	size_t body_len, body_cap, body_max;
	bool body_too_big;
	/* body streamed to a reader */
	bool stream;
	char *sbuf;
	size_t s_off, s_len;
	bool paused;
	uint64_t skip; /* bytes to drop (a restart answered 200 instead of 206) */
	/* completion */
	bool done;
	CURLcode cc;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

void oci_registry_opts_init(struct oci_registry_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->connect_timeout_s = 10;
	o->stall_timeout_s = 30;
	o->request_timeout_s = 120;
	o->retries = 4;
	o->resumes = 4;
	o->backoff_ms = 250;
	o->max_manifest_bytes = 4u << 20;
}

static bool host_is_loopback(const char *host)
{
	char h[256];
	if (host[0] == '[') {
		const char *close = strchr(host, ']');
		if (!close || (size_t)(close - host - 1) >= sizeof(h))
			return false;
		memcpy(h, host + 1, (size_t)(close - host - 1));
		h[close - host - 1] = '\0';
	} else {
		snprintf(h, sizeof(h), "%s", host);
		char *colon = strchr(h, ':');
		if (colon)
			*colon = '\0';
	}
	if (strcmp(h, "localhost") == 0 || strcmp(h, "::1") == 0)
		return true;
	struct in_addr a;
	return inet_pton(AF_INET, h, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

static bool host_listed(const char *list, const char *host)
{
	if (!list)
		return false;
	size_t hl = strlen(host);
	for (const char *p = list; *p;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		while (n && *p == ' ')
			p++, n--;
		if ((n == 1 && *p == '*') || (n == hl && strncmp(p, host, n) == 0))
			return true;
		if (!comma)
			break;
		p = comma + 1;
	}
	return false;
}

static void load_creds(struct oci_registry *r, const struct oci_registry_opts *o,
                       struct oci_err *err)
{
	struct oci_err e = {{0}};
	int rc = -ENOENT;
	/* docker.io credentials are stored under docker.io, not the API host */
	const char *key = strcmp(r->host, "registry-1.docker.io") == 0 ? "docker.io" : r->host;
	if (o->username && o->password) {
		if ((r->creds.username = strdup(o->username)) &&
		    (r->creds.password = strdup(o->password)))
			rc = 0;
		snprintf(r->creds_source, sizeof(r->creds_source), "explicit credentials");
	} else if (o->auth_json) {
		rc = oci_creds_lookup(o->auth_json, strlen(o->auth_json), key, &r->creds, &e);
		snprintf(r->creds_source, sizeof(r->creds_source), "%s",
		         o->auth_source ? o->auth_source : "the pull secret");
		r->creds_named = true;
	} else if (o->no_default_auth_files && !o->auth_file && o->auth_source) {
		/* none on purpose: say why in messages */
		snprintf(r->creds_source, sizeof(r->creds_source), "%s", o->auth_source);
		r->creds_why_none = true;
	} else {
		const char *files[4] = {o->auth_file, NULL, NULL, NULL};
		char xdg[512] = "", dock[512] = "";
		size_t nf = 1;
		if (!o->auth_file && !o->no_default_auth_files) {
			const char *env = getenv("REGISTRY_AUTH_FILE");
			const char *run = getenv("XDG_RUNTIME_DIR");
			const char *dc = getenv("DOCKER_CONFIG");
			const char *home = getenv("HOME");
			files[0] = env;
			if (run)
				snprintf(xdg, sizeof(xdg), "%s/containers/auth.json", run);
			if (dc)
				snprintf(dock, sizeof(dock), "%s/config.json", dc);
			else if (home)
				snprintf(dock, sizeof(dock), "%s/.docker/config.json", home);
			files[1] = xdg[0] ? xdg : NULL;
			files[2] = dock[0] ? dock : NULL;
			nf = 3;
		}
		for (size_t i = 0; i < nf && rc == -ENOENT; i++) {
			if (!files[i])
				continue;
			if (access(files[i], R_OK) != 0 && files[i] != o->auth_file)
				continue;
			rc = oci_creds_lookup_file(files[i], key, &r->creds, &e);
			snprintf(r->creds_source, sizeof(r->creds_source), "%s", files[i]);
		}
	}
	if (rc == 0) {
		r->have_creds = true;
	} else if (rc != -ENOENT) {
		/* a broken credentials source is reported, then we go on anonymously */
		log_warn("registry credentials unusable", "host", r->host, "error", e.msg);
		if (err)
			oci_errf(err, "%s", e.msg);
		oci_creds_clear(&r->creds);
	} else {
		oci_creds_clear(&r->creds);
	}
}

int oci_registry_new(const char *host, const struct oci_registry_opts *opts,
                     struct oci_registry **out, struct oci_err *err)
{
	pthread_once(&curl_once, curl_init_once);
	struct oci_registry_opts defaults;
	if (!opts) {
		oci_registry_opts_init(&defaults);
		opts = &defaults;
	}
	struct oci_registry *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->o = *opts;
	/* only keep the numbers and flags; strings we need are copied */
	r->o.username = r->o.password = r->o.auth_json = r->o.auth_file = r->o.plain_http = NULL;
	r->o.auth_source = NULL;
	r->o.ca_file = r->o.hosts_dir = r->o.registries_conf = NULL;
	snprintf(r->api_path, sizeof(r->api_path), "/v2");
	if (!(r->host = strdup(host)) || !(r->multi = curl_multi_init()) ||
	    (opts->ca_file && !(r->ca_file = strdup(opts->ca_file)))) {
		oci_registry_free(r);
		return -ENOMEM;
	}
	int rc = oci_mirrors_load(opts->hosts_dir, opts->registries_conf, host, &r->mirrors, err);
	if (rc) {
		oci_registry_free(r);
		return rc;
	}
	/* endpoint clients look their credentials up in the same places */
	if (r->mirrors && ((opts->auth_json && !(r->auth_json = strdup(opts->auth_json))) ||
	                   (opts->auth_file && !(r->auth_file = strdup(opts->auth_file))) ||
	                   (opts->username && !(r->username = strdup(opts->username))) ||
	                   (opts->password && !(r->password = strdup(opts->password))) ||
	                   (opts->auth_source && !(r->auth_source = strdup(opts->auth_source))))) {
		oci_registry_free(r);
		return -ENOMEM;
	}
	if (host_listed(opts->plain_http, host)) {
		r->plain_http = true;
		r->scheme_known = true;
	} else {
		r->scheme_known = !host_is_loopback(host);
	}
	curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, 8L);
	load_creds(r, opts, NULL);
	*out = r;
	return 0;
}

void oci_registry_free(struct oci_registry *r)
{
	if (!r)
		return;
	for (struct token *t = r->tokens, *n; t; t = n) {
		n = t->next;
		free(t->scope);
		if (t->value)
			explicit_bzero(t->value, strlen(t->value));
		free(t->value);
		free(t);
	}
	oci_creds_clear(&r->creds);
	for (size_t i = 0; i < r->n_eps; i++)
		oci_registry_free(r->eps[i].reg);
	oci_mirrors_free(r->mirrors);
	char *secrets[] = {r->auth_json, r->auth_file, r->username, r->password, r->auth_source};
	for (size_t i = 0; i < 5; i++) {
		if (secrets[i])
			explicit_bzero(secrets[i], strlen(secrets[i]));
		free(secrets[i]);
	}
	free(r->ca_pem);
	if (r->multi)
		curl_multi_cleanup(r->multi);
	free(r->realm);
	free(r->service);
	free(r->ca_file);
	free(r->host);
	free(r);
}

const char *oci_registry_scheme(const struct oci_registry *r)
{
	return r->plain_http ? "http" : "https";
}

void oci_fetched_clear(struct oci_fetched *f)
{
	if (!f)
		return;
	free(f->data);
	free(f->media_type);
	memset(f, 0, sizeof(*f));
}

/* ---- one exchange ---------------------------------------------------- */

static void copy_hdr(char *dst, size_t cap, const char *v, size_t n)
{
	while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
		n--;
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, v, n);
	dst[n] = '\0';
}

static void reset_headers(struct xfer *x)
{
	x->content_type[0] = x->docker_digest[0] = x->location[0] = x->www_auth[0] = '\0';
	x->oci_subject[0] = x->filters[0] = x->retry_after[0] = x->content_range[0] = '\0';
	x->content_length = -1;
}

static bool body_wanted(const struct xfer *x)
{
	return !x->stream || x->status < 200 || x->status >= 300;
}

static size_t on_header(char *buf, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t len = size * n;
	if (len >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
		reset_headers(x); /* a new response (after a redirect or 100 Continue) */
		const char *sp = memchr(buf, ' ', len);
		x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		return len;
	}
	const char *colon = memchr(buf, ':', len);
	if (!colon)
		return len;
	size_t klen = (size_t)(colon - buf);
	const char *v = colon + 1;
	while (v < buf + len && (*v == ' ' || *v == '\t'))
		v++;
	size_t vlen = (size_t)(buf + len - v);
#define IS(name) (klen == sizeof(name) - 1 && strncasecmp(buf, name, klen) == 0)
	if (IS("Content-Type"))
		copy_hdr(x->content_type, sizeof(x->content_type), v, vlen);
	else if (IS("Docker-Content-Digest"))
		copy_hdr(x->docker_digest, sizeof(x->docker_digest), v, vlen);
	else if (IS("Location"))
		copy_hdr(x->location, sizeof(x->location), v, vlen);
	else if (IS("OCI-Subject"))
		copy_hdr(x->oci_subject, sizeof(x->oci_subject), v, vlen);
	else if (IS("OCI-Filters-Applied"))
		copy_hdr(x->filters, sizeof(x->filters), v, vlen);
	else if (IS("Retry-After"))
		copy_hdr(x->retry_after, sizeof(x->retry_after), v, vlen);
	else if (IS("Content-Range"))
		copy_hdr(x->content_range, sizeof(x->content_range), v, vlen);
	else if (IS("Content-Length")) {
		char tmp[32];
		copy_hdr(tmp, sizeof(tmp), v, vlen);
		x->content_length = strtoll(tmp, NULL, 10);
		/* refuse an oversized small body before reading it */
		if (body_wanted(x) && x->status >= 200 && x->status < 300 && x->body_max &&
		    x->content_length > (int64_t)x->body_max) {
			x->body_too_big = true;
			return 0;
		}
	} else if (IS("WWW-Authenticate")) {
		size_t have = strlen(x->www_auth);
		if (have && have + 2 < sizeof(x->www_auth)) {
			memcpy(x->www_auth + have, ", ", 3);
			have += 2;
		}
		copy_hdr(x->www_auth + have, sizeof(x->www_auth) - have, v, vlen);
	}
#undef IS
	return len;
}

static size_t on_body(char *buf, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t len = size * n;
	if (body_wanted(x)) {
		size_t max = x->stream || !x->body_max ? ERR_BODY_MAX : x->body_max;
		if (x->body_len + len > max) {
			if (x->stream || x->status < 200 || x->status >= 300)
				return len; /* error bodies: keep the start, drop the rest */
			x->body_too_big = true;
			return 0;
		}
		if (x->body_len + len + 1 > x->body_cap) {
			size_t ncap = x->body_cap ? x->body_cap : 4096;
			while (ncap < x->body_len + len + 1)
				ncap *= 2;
			char *nb = realloc(x->body, ncap);
			if (!nb)
				return 0;
			x->body = nb;
			x->body_cap = ncap;
		}
		memcpy(x->body + x->body_len, buf, len);
		x->body_len += len;
		x->body[x->body_len] = '\0';
		return len;
	}
	if (x->skip) {
		size_t k = len < x->skip ? len : (size_t)x->skip;
		x->skip -= k;
		buf += k;
		if (k == len)
			return len;
		len -= k;
		/* the rest goes through the buffer below; report the whole chunk taken */
		if (x->s_off + x->s_len + len > STREAM_BUF) {
			memmove(x->sbuf, x->sbuf + x->s_off, x->s_len);
			x->s_off = 0;
		}
		if (x->s_len + len > STREAM_BUF)
			return 0; /* cannot happen: chunks are at most STREAM_RECV */
		memcpy(x->sbuf + x->s_off + x->s_len, buf, len);
		x->s_len += len;
		return size * n;
	}
	if (x->s_off + x->s_len + len > STREAM_BUF) {
		memmove(x->sbuf, x->sbuf + x->s_off, x->s_len);
		x->s_off = 0;
	}
	if (x->s_len + len > STREAM_BUF) {
		x->paused = true;
		return CURL_WRITEFUNC_PAUSE;
	}
	memcpy(x->sbuf + x->s_off + x->s_len, buf, len);
	x->s_len += len;
	return len;
}

static size_t on_upload(char *buf, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t want = size * n;
	uint64_t left = x->up_len - x->up_pos;
	if (want > left)
		want = (size_t)left;
	if (want == 0)
		return 0;
	if (x->up_mem) {
		memcpy(buf, x->up_mem + x->up_off + x->up_pos, want);
	} else {
		ssize_t r;
		do
			r = pread(x->up_fd, buf, want, (off_t)(x->up_off + x->up_pos));
		while (r < 0 && errno == EINTR);
		if (r <= 0)
			return CURL_READFUNC_ABORT;
		want = (size_t)r;
	}
	x->up_pos += want;
	return want;
}

static int on_seek(void *ud, curl_off_t off, int origin)
{
	struct xfer *x = ud;
	if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->up_len)
		return CURL_SEEKFUNC_CANTSEEK;
	x->up_pos = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

struct req {
	const char *method; /* GET HEAD PUT POST PATCH */
	const char *url;    /* absolute */
	const char *accept;
	const char *content_type;
	const char *range;         /* "bytes=N-" */
	const char *content_range; /* chunked upload "start-end" */
	const char *auth;          /* full Authorization header value, or NULL */
	/* body: fd (pread) or memory; up_len 0 = no body */
	int up_fd;
	const char *up_mem;
	uint64_t up_off, up_len;
	size_t body_max;
	bool stream;
	bool total_timeout;
	/* blob downloads only: registries send them on to storage (S3, a CDN);
	 * curl sends the Authorization header given here to no other host or
	 * port, and a redirect never leaves HTTPS for a registry that speaks it */
	bool follow;
};

static void xfer_free(struct xfer *x)
{
	if (!x)
		return;
	if (x->h) {
		curl_multi_remove_handle(x->reg->multi, x->h);
		curl_easy_cleanup(x->h);
	}
	curl_slist_free_all(x->hdrs);
	free(x->body);
	free(x->sbuf);
	free(x);
}

/* "Name: value", or "Name:" (which removes a header curl would add) when v is NULL. */
static int add_hdr(struct xfer *x, const char *name, const char *v)
{
	char line[HDR_MAX + 64];
	if (v)
		snprintf(line, sizeof(line), "%s: %s", name, v);
	else
		snprintf(line, sizeof(line), "%s:", name);
	struct curl_slist *n = curl_slist_append(x->hdrs, line);
	if (!n)
		return -ENOMEM;
	x->hdrs = n;
	return 0;
}

static int xfer_start(struct oci_registry *r, const struct req *q, struct xfer **out)
{
	struct xfer *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->reg = r;
	x->up_fd = q->up_fd;
	x->up_mem = q->up_mem;
	x->up_off = q->up_off;
	x->up_len = q->up_len;
	x->stream = q->stream;
	x->body_max = q->body_max;
	reset_headers(x);
	if (q->stream && !(x->sbuf = malloc(STREAM_BUF)))
		goto nomem;
	if (!(x->h = curl_easy_init()))
		goto nomem;
	CURL *h = x->h;
	if (q->stream)
		curl_easy_setopt(h, CURLOPT_BUFFERSIZE, (long)STREAM_RECV);
	curl_easy_setopt(h, CURLOPT_URL, q->url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
	curl_easy_setopt(h, CURLOPT_USERAGENT, "gkm/" GKM_VERSION);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, r->plain_http ? "http,https" : "https");
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, q->follow ? 1L : 0L);
	curl_easy_setopt(h, CURLOPT_UNRESTRICTED_AUTH, 0L);
	curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)r->o.connect_timeout_s);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)r->o.stall_timeout_s);
	if (q->total_timeout && r->o.request_timeout_s)
		curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)r->o.request_timeout_s);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	if (r->ca_pem) {
		struct curl_blob ca = {
		    .data = r->ca_pem, .len = r->ca_len, .flags = CURL_BLOB_NOCOPY};
		curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &ca);
	} else if (r->ca_file) {
		curl_easy_setopt(h, CURLOPT_CAINFO, r->ca_file);
	}
	if (r->o.tls_no_verify) {
		curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
		curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
	}
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
	if (add_hdr(x, "Expect", NULL))
		goto nomem;
	if (q->accept && add_hdr(x, "Accept", q->accept))
		goto nomem;
	if (q->content_type && add_hdr(x, "Content-Type", q->content_type))
		goto nomem;
	if (q->range && add_hdr(x, "Range", q->range))
		goto nomem;
	if (q->content_range && add_hdr(x, "Content-Range", q->content_range))
		goto nomem;
	if (q->auth && add_hdr(x, "Authorization", q->auth))
		goto nomem;
	if (strcmp(q->method, "HEAD") == 0) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (strcmp(q->method, "POST") == 0) {
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		if (q->up_len) {
			curl_easy_setopt(h, CURLOPT_READFUNCTION, on_upload);
			curl_easy_setopt(h, CURLOPT_READDATA, x);
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->up_len);
		} else {
			curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
		}
	} else if (strcmp(q->method, "PUT") == 0 || strcmp(q->method, "PATCH") == 0) {
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_READFUNCTION, on_upload);
		curl_easy_setopt(h, CURLOPT_READDATA, x);
		curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
		curl_easy_setopt(h, CURLOPT_SEEKDATA, x);
		curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->up_len);
		if (strcmp(q->method, "PATCH") == 0)
			curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PATCH");
	} else if (strcmp(q->method, "GET") != 0) {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->hdrs);
	if (curl_multi_add_handle(r->multi, h) != CURLM_OK)
		goto nomem;
	*out = x;
	return 0;
nomem:
	xfer_free(x);
	return -ENOMEM;
}

/* Drive transfers until x completes, or (until_data) has stream bytes. */
static void xfer_drive(struct xfer *x, bool until_data)
{
	CURLM *m = x->reg->multi;
	while (!x->done && !(until_data && x->s_len > 0)) {
		int running = 0;
		curl_multi_perform(m, &running);
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(m, &left)))
			if (msg->msg == CURLMSG_DONE && msg->easy_handle == x->h) {
				x->done = true;
				x->cc = msg->data.result;
			}
		if (x->done || (until_data && x->s_len > 0))
			break;
		if (x->reg->o.cancel && atomic_load(x->reg->o.cancel)) {
			x->done = true;
			x->cc = CURLE_ABORTED_BY_CALLBACK;
			break;
		}
		curl_multi_poll(m, NULL, 0, 1000, NULL);
	}
	if (x->done && x->status == 0)
		curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
}

/* ---- errors, retries ------------------------------------------------- */

/* As curlerr_errno, and -EBADE ("invalid exchange") when the registry's
 * certificate is not trusted: the node lacks its CA, which retrying cannot
 * fix and the status says (CertificateUnknown). */
static int cc_errno(CURLcode cc)
{
	if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
	    cc == CURLE_SSL_ISSUER_ERROR)
		return -EBADE;
	return curlerr_errno(cc);
}

static bool cc_retryable(CURLcode cc)
{
	switch (cc) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_PARTIAL_FILE:
	case CURLE_GOT_NOTHING:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		return true;
	default:
		return false;
	}
}

static bool status_retryable(long s)
{
	return s == 429 || s == 500 || s == 502 || s == 503 || s == 504 || s == 408;
}

static int status_errno(long s)
{
	switch (s) {
	case 401:
		return -EACCES;
	case 403:
		return -EPERM;
	case 404:
		return -ENOENT;
	case 413:
		return -EFBIG;
	case 429:
		return -EAGAIN;
	default:
		return s >= 500 ? -EIO : -EPROTO;
	}
}

static void describe_cc(const struct oci_registry *r, const struct xfer *x, const char *method,
                        const char *url, struct oci_err *err)
{
	if (x->cc == CURLE_OPERATION_TIMEDOUT)
		oci_errf(err, "%s %s: timed out (%s)", method, url,
		         x->errbuf[0] ? x->errbuf : "no progress");
	else if (x->cc == CURLE_UNSUPPORTED_PROTOCOL)
		oci_errf(err,
		         "%s %s: redirected to a URL that is not followed (a registry that "
		         "speaks HTTPS may not send a download to plain HTTP)",
		         method, url);
	else
		oci_errf(err, "%s %s: %s%s%s", method, url, curl_easy_strerror(x->cc),
		         x->errbuf[0] ? ": " : "", x->errbuf);
	if (cc_errno(x->cc) == -EBADE)
		oci_err_prefix(err,
		               "the certificate of %s is not trusted (give its CA: hosts.toml "
		               "'ca', a CA ConfigMap, --ca-file)",
		               r->host);
}

/* What a registry says is shown to users (status, Events, denials): at most
 * max bytes of it, printable ASCII only, so that a registry can neither
 * flood a status nor put control sequences or markup in front of a user. */
static void excerpt(char *out, size_t cap, const char *in, size_t len, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < len && n < max && n + 4 < cap; i++)
		out[n++] = in[i] >= 0x20 && in[i] < 0x7f ? in[i] : in[i] == '\n' ? ' ' : '?';
	if (len > max && n + 4 < cap) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
}

#define ERROR_EXCERPT_MAX 120

/* "HTTP 404: MANIFEST_UNKNOWN manifest unknown" from a distribution error body. */
static void describe_status(const struct xfer *x, const char *method, const char *url,
                            struct oci_err *err)
{
	char detail[ERROR_EXCERPT_MAX * 2 + 16] = "", code_s[48] = "", msg_s[ERROR_EXCERPT_MAX + 4];
	if (x->body && x->body_len) {
		cJSON *j = cJSON_ParseWithLength(x->body, x->body_len);
		const cJSON *errs = j ? cJSON_GetObjectItemCaseSensitive(j, "errors") : NULL;
		const cJSON *e0 = cJSON_IsArray(errs) ? cJSON_GetArrayItem(errs, 0) : NULL;
		const cJSON *code = e0 ? cJSON_GetObjectItemCaseSensitive(e0, "code") : NULL;
		const cJSON *msg = e0 ? cJSON_GetObjectItemCaseSensitive(e0, "message") : NULL;
		if (cJSON_IsString(code) || cJSON_IsString(msg)) {
			if (cJSON_IsString(code))
				excerpt(code_s, sizeof(code_s), code->valuestring,
				        strlen(code->valuestring), 40);
			msg_s[0] = '\0';
			if (cJSON_IsString(msg))
				excerpt(msg_s, sizeof(msg_s), msg->valuestring,
				        strlen(msg->valuestring), ERROR_EXCERPT_MAX);
			snprintf(detail, sizeof(detail), ": %s%s%s", code_s,
			         code_s[0] && msg_s[0] ? " " : "", msg_s);
		} else if (!j) {
			excerpt(msg_s, sizeof(msg_s), x->body, x->body_len, ERROR_EXCERPT_MAX);
			snprintf(detail, sizeof(detail), ": %s", msg_s);
		}
		cJSON_Delete(j);
	}
	oci_errf(err, "%s %s: HTTP %ld%s", method, url, x->status, detail);
}

/* Exponential backoff with jitter, or the server's Retry-After. */
static void backoff(struct oci_registry *r, unsigned attempt, const char *retry_after)
{
	uint64_t ms;
	long ra = retry_after && *retry_after ? strtol(retry_after, NULL, 10) : 0;
	if (ra > 0)
		ms = (uint64_t)(ra > RETRY_AFTER_MAX_S ? RETRY_AFTER_MAX_S : ra) * 1000;
	else
		ms = backoff_ms(attempt, r->o.backoff_ms, BACKOFF_CAP_MS, &r->seed);
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* ---- authentication -------------------------------------------------- */

static const char *token_for(struct oci_registry *r, const char *scope)
{
	time_t now = time(NULL);
	for (struct token *t = r->tokens; t; t = t->next)
		if (strcmp(t->scope, scope ? scope : "") == 0 && t->expires > now)
			return t->value;
	return NULL;
}

static int token_store(struct oci_registry *r, const char *scope, const char *value, long ttl)
{
	struct token *t = NULL;
	for (t = r->tokens; t; t = t->next)
		if (strcmp(t->scope, scope ? scope : "") == 0)
			break;
	char *v = strdup(value);
	if (!v)
		return -ENOMEM;
	if (!t) {
		if (!(t = calloc(1, sizeof(*t))) || !(t->scope = strdup(scope ? scope : ""))) {
			free(t);
			free(v);
			return -ENOMEM;
		}
		t->next = r->tokens;
		r->tokens = t;
	}
	free(t->value);
	t->value = v;
	/* renew a little early; the spec's minimum lifetime is 60 s */
	t->expires = time(NULL) + (ttl > 60 ? ttl : 60) - 10;
	return 0;
}

static int basic_header(const struct oci_creds *c, char **out)
{
	char *plain = NULL, *b64 = NULL;
	if (asprintf(&plain, "%s:%s", c->username, c->password ? c->password : "") < 0)
		return -ENOMEM;
	int rc = base64_encode(plain, strlen(plain), &b64);
	explicit_bzero(plain, strlen(plain));
	free(plain);
	if (rc)
		return rc;
	rc = asprintf(out, "Basic %s", b64) < 0 ? -ENOMEM : 0;
	free(b64);
	return rc;
}

static int run_simple(struct oci_registry *r, const struct req *q, struct xfer **out,
                      struct oci_err *err);

/* GET (or POST for refresh tokens) the realm for scope. */
static int fetch_token(struct oci_registry *r, const char *scope, struct oci_err *err)
{
	char url[URL_MAX];
	char *form = NULL, *auth = NULL;
	struct xfer *x = NULL;
	cJSON *j = NULL;
	int rc;
	CURL *esc = curl_easy_init();
	if (!esc)
		return -ENOMEM;
	if (strncmp(r->realm, "https://", 8) != 0 && strncmp(r->realm, "http://", 7) != 0) {
		oci_errf(err, "token realm '%s' is not an http(s) URL", r->realm);
		rc = -EPROTO;
		goto out;
	}
	char *svc = r->service ? curl_easy_escape(esc, r->service, 0) : NULL;
	char *scp = scope && *scope ? curl_easy_escape(esc, scope, 0) : NULL;
	bool refresh = r->have_creds && r->creds.identity_token;
	struct req q = {.method = "GET",
	                .url = url,
	                .body_max = TOKEN_BODY_MAX,
	                .total_timeout = true,
	                .up_fd = -1};
	if (refresh) {
		char *tok = curl_easy_escape(esc, r->creds.identity_token, 0);
		if (asprintf(&form,
		             "grant_type=refresh_token&client_id=gkm&service=%s&scope=%s&"
		             "refresh_token=%s",
		             svc ? svc : "", scp ? scp : "", tok ? tok : "") < 0)
			form = NULL;
		curl_free(tok);
		snprintf(url, sizeof(url), "%s", r->realm);
		q.method = "POST";
		q.content_type = "application/x-www-form-urlencoded";
		q.up_mem = form;
		q.up_len = form ? strlen(form) : 0;
	} else {
		const char *sep = strchr(r->realm, '?') ? "&" : "?";
		snprintf(url, sizeof(url), "%s%s%s%s%s%s", r->realm, svc || scp ? sep : "",
		         svc ? "service=" : "", svc ? svc : "", svc && scp ? "&" : "",
		         scp ? "scope=" : "");
		if (scp)
			snprintf(url + strlen(url), sizeof(url) - strlen(url), "%s", scp);
		if (r->have_creds && r->creds.username && (rc = basic_header(&r->creds, &auth))) {
			curl_free(svc);
			curl_free(scp);
			goto out;
		}
		q.auth = auth;
	}
	curl_free(svc);
	curl_free(scp);
	if (refresh && !form) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = run_simple(r, &q, &x, err)))
		goto out;
	if (x->status == 401 || x->status == 403) {
		if (r->have_creds)
			oci_errf(err,
			         "token server %s rejected the credentials from %s for scope '%s' "
			         "(HTTP %ld)",
			         r->realm, r->creds_source, scope ? scope : "", x->status);
		else
			oci_errf(
			    err,
			    "token server %s refused anonymous access to scope '%s' (HTTP %ld); "
			    "credentials needed",
			    r->realm, scope ? scope : "", x->status);
		rc = -EACCES;
		goto out;
	}
	if (x->status != 200) {
		describe_status(x, q.method, r->realm, err);
		oci_err_prefix(err, "token request failed");
		rc = status_errno(x->status);
		goto out;
	}
	j = x->body ? cJSON_ParseWithLength(x->body, x->body_len) : NULL;
	const cJSON *t = j ? cJSON_GetObjectItemCaseSensitive(j, "token") : NULL;
	if (!cJSON_IsString(t) || !*t->valuestring)
		t = j ? cJSON_GetObjectItemCaseSensitive(j, "access_token") : NULL;
	if (!cJSON_IsString(t) || !*t->valuestring) {
		oci_errf(err, "token server %s answered without a token", r->realm);
		rc = -EPROTO;
		goto out;
	}
	const cJSON *ttl = cJSON_GetObjectItemCaseSensitive(j, "expires_in");
	rc = token_store(
	    r, scope, t->valuestring,
	    cJSON_IsNumber(ttl) && ttl->valuedouble < 86400 * 365 ? (long)ttl->valuedouble : 60);
out:
	cJSON_Delete(j);
	xfer_free(x);
	free(form);
	if (auth) {
		explicit_bzero(auth, strlen(auth));
		free(auth);
	}
	curl_easy_cleanup(esc);
	return rc;
}

/* The Authorization header for a request in scope, fetching a token when
 * the registry is known to want one. *out NULL for anonymous. */
static int auth_for(struct oci_registry *r, const char *scope, char **out, struct oci_err *err)
{
	*out = NULL;
	if (r->auth == OCI_AUTH_BASIC && r->have_creds && r->creds.username)
		return basic_header(&r->creds, out);
	if (r->auth != OCI_AUTH_BEARER)
		return 0;
	const char *t = token_for(r, scope);
	if (!t) {
		int rc = fetch_token(r, scope, err);
		if (rc)
			return rc;
		t = token_for(r, scope);
	}
	if (t && asprintf(out, "Bearer %s", t) < 0)
		return -ENOMEM;
	return 0;
}

/* Learn from a 401. 0 when trying again can help. */
static int on_unauthorized(struct oci_registry *r, const struct xfer *x, const char *scope,
                           bool sent_auth, struct oci_err *err)
{
	struct oci_challenge c = {0};
	int rc = oci_challenge_parse(x->www_auth, &c, err);
	if (rc) {
		if (!x->www_auth[0])
			oci_errf(err,
			         "registry %s answered 401 without a WWW-Authenticate challenge",
			         r->host);
		return -EACCES;
	}
	if (c.scheme == OCI_AUTH_BASIC) {
		bool had = r->auth == OCI_AUTH_BASIC;
		r->auth = OCI_AUTH_BASIC;
		if (!r->have_creds || !r->creds.username) {
			oci_errf(err,
			         "registry %s requires a login and no credentials were found for "
			         "it %s%s",
			         r->host,
			         r->creds_named      ? "in "
			         : r->creds_why_none ? ": "
			                             : "",
			         r->creds_named || r->creds_why_none
			             ? r->creds_source
			             : "(use --authfile, --creds or a pull secret)");
			rc = -EACCES;
		} else if (had && sent_auth) {
			oci_errf(err, "registry %s rejected the credentials from %s", r->host,
			         r->creds_source);
			rc = -EACCES;
		}
		oci_challenge_clear(&c);
		return rc;
	}
	/* Bearer: a token we sent was refused (expired, or too narrow a scope) */
	if (sent_auth && r->auth == OCI_AUTH_BEARER && c.error &&
	    strcmp(c.error, "insufficient_scope") != 0 && strcmp(c.error, "invalid_token") != 0) {
		oci_errf(err, "registry %s refused the token: %s", r->host, c.error);
		oci_challenge_clear(&c);
		return -EACCES;
	}
	bool same_realm = r->realm && strcmp(r->realm, c.realm) == 0;
	if (sent_auth && r->auth == OCI_AUTH_BEARER && same_realm && !c.error) {
		oci_errf(err, "registry %s refused the token it issued for '%s'%s", r->host,
		         scope ? scope : "",
		         r->have_creds ? "" : " (anonymous; credentials needed?)");
		oci_challenge_clear(&c);
		return -EACCES;
	}
	free(r->realm);
	free(r->service);
	r->realm = c.realm;
	r->service = c.service;
	c.realm = c.service = NULL;
	r->auth = OCI_AUTH_BEARER;
	/* Ask for what this request needs (our scope covers the challenge's:
	 * a push asks for pull,push even when a HEAD was challenged for pull). */
	rc = fetch_token(r, scope && *scope ? scope : c.scope, err);
	oci_challenge_clear(&c);
	return rc;
}

/* Run a request once with no auth or retry handling (token fetches). */
static int run_simple(struct oci_registry *r, const struct req *q, struct xfer **out,
                      struct oci_err *err)
{
	struct xfer *x = NULL;
	for (unsigned attempt = 0;; attempt++) {
		int rc = xfer_start(r, q, &x);
		if (rc)
			return rc;
		xfer_drive(x, false);
		bool retry =
		    attempt < r->o.retries &&
		    (x->cc != CURLE_OK ? cc_retryable(x->cc) : status_retryable(x->status));
		if (!retry)
			break;
		char at[16];
		snprintf(at, sizeof(at), "%u", attempt + 1);
		log_warn("registry request failed, retrying", "url", q->url, "attempt", at);
		backoff(r, attempt, x->retry_after);
		xfer_free(x);
		x = NULL;
	}
	if (x->cc != CURLE_OK) {
		describe_cc(r, x, q->method, q->url, err);
		int rc = cc_errno(x->cc);
		xfer_free(x);
		return rc;
	}
	*out = x;
	return 0;
}

static int build_url(const struct oci_registry *r, char *url, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int build_url(const struct oci_registry *r, char *url, size_t cap, const char *fmt, ...)
{
	int n = snprintf(url, cap, "%s://%s%s", oci_registry_scheme(r), r->host, r->api_path);
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(url + n, cap - (size_t)n, fmt, ap);
	va_end(ap);
	if (m < 0 || (size_t)(n + m) >= cap)
		return -ENAMETOOLONG;
	return 0;
}

/* Swap the scheme of an URL we built after learning the registry speaks HTTP. */
static void rebase_url(const struct oci_registry *r, char *url, size_t cap)
{
	const char *rest = strstr(url, "://");
	if (!rest)
		return;
	char tmp[URL_MAX];
	snprintf(tmp, sizeof(tmp), "%s%s", oci_registry_scheme(r), rest);
	snprintf(url, cap, "%s", tmp);
}

static bool tls_mismatch(CURLcode cc)
{
	return cc == CURLE_SSL_CONNECT_ERROR;
}

/* A request to the registry itself: auth, loopback HTTP fallback, retries.
 * scope: the token scope it needs. *out gets the finished exchange
 * whatever its status (the caller interprets 4xx); errors are transport
 * failures after retries, or authentication that cannot succeed. For
 * stream requests, *out is returned as soon as the headers and first
 * bytes of a 2xx body arrived. */
static int request(struct oci_registry *r, struct req *q, char *url, size_t url_cap,
                   const char *scope, struct xfer **out, struct oci_err *err)
{
	struct xfer *x = NULL;
	char *auth = NULL;
	int rc = 0;
	bool auth_retried = false;
	unsigned attempt = 0;
	for (;;) {
		free(auth);
		auth = NULL;
		if ((rc = auth_for(r, scope, &auth, err)))
			goto out;
		q->auth = auth;
		q->url = url;
		if ((rc = xfer_start(r, q, &x)))
			goto out;
		xfer_drive(x, q->stream);
		/* stream requests return once a 2xx body starts flowing (even when
		 * the connection broke right after: the reader resumes from there) */
		if (q->stream && x->status >= 200 && x->status < 300 && (!x->done || x->s_len > 0))
			break;
		if (!r->scheme_known) {
			if (x->cc != CURLE_OK && tls_mismatch(x->cc)) {
				r->scheme_known = true;
				r->plain_http = true;
				rebase_url(r, url, url_cap);
				log_debug("registry speaks plain HTTP", "host", r->host);
				xfer_free(x);
				x = NULL;
				continue;
			}
			if (x->cc == CURLE_OK)
				r->scheme_known = true;
		}
		if (x->cc == CURLE_OK && x->status == 401 && !auth_retried) {
			auth_retried = true;
			if ((rc = on_unauthorized(r, x, scope, auth != NULL, err)))
				goto out;
			xfer_free(x);
			x = NULL;
			continue;
		}
		if (x->cc == CURLE_OK && x->status == 401) {
			if (auth && r->auth == OCI_AUTH_BASIC) {
				oci_errf(err,
				         "registry %s rejected the credentials from %s (HTTP 401)",
				         r->host, r->creds_source);
			} else if (auth) {
				oci_errf(err,
				         "registry %s refused the token issued for '%s' (HTTP 401)",
				         r->host, scope ? scope : "");
			} else {
				describe_status(x, q->method, url, err);
				oci_err_prefix(err, "not authorized%s",
				               r->have_creds ? "" : " (no credentials)");
			}
			rc = -EACCES;
			goto out;
		}
		if (x->body_too_big) {
			oci_errf(err, "%s %s: response is larger than the %zu bytes accepted",
			         q->method, url, q->body_max);
			rc = -EFBIG;
			goto out;
		}
		bool retryable =
		    x->cc != CURLE_OK ? cc_retryable(x->cc) : status_retryable(x->status);
		if (!retryable)
			break;
		if (attempt >= r->o.retries) {
			if (x->cc != CURLE_OK) {
				describe_cc(r, x, q->method, url, err);
				rc = cc_errno(x->cc);
			} else {
				describe_status(x, q->method, url, err);
				rc = status_errno(x->status);
			}
			if (r->o.retries)
				oci_err_prefix(err, "giving up after %u attempts", attempt + 1);
			goto out;
		}
		char at[16];
		snprintf(at, sizeof(at), "%u", attempt + 1);
		char why[64];
		if (x->cc != CURLE_OK)
			snprintf(why, sizeof(why), "%s", curl_easy_strerror(x->cc));
		else
			snprintf(why, sizeof(why), "HTTP %ld", x->status);
		log_warn("registry request failed, retrying", "method", q->method, "url", url,
		         "error", why, "attempt", at);
		backoff(r, attempt, x->retry_after);
		attempt++;
		xfer_free(x);
		x = NULL;
	}
	if (x->cc != CURLE_OK && !(q->stream && x->s_len > 0)) {
		describe_cc(r, x, q->method, url, err);
		rc = cc_errno(x->cc);
		goto out;
	}
	*out = x;
	x = NULL;
out:
	xfer_free(x);
	if (auth) {
		explicit_bzero(auth, strlen(auth));
		free(auth);
	}
	return rc;
}

static void pull_scope(char *buf, size_t cap, const char *repo)
{
	snprintf(buf, cap, "repository:%s:pull", repo);
}

static void push_scope(char *buf, size_t cap, const char *repo)
{
	snprintf(buf, cap, "repository:%s:pull,push", repo);
}

/* ---- manifests ------------------------------------------------------- */

static int manifest_url(const struct oci_registry *r, char *url, size_t cap, const char *repo,
                        const char *reference)
{
	return build_url(r, url, cap, "/%s/manifests/%s", repo, reference);
}

static bool is_digest_ref(const char *reference)
{
	return strchr(reference, ':') != NULL;
}

/* HEAD or GET a manifest; *out is the exchange when it answered 200. */
static int manifest_request(struct oci_registry *r, const char *method, const char *repo,
                            const char *reference, struct xfer **out, struct oci_err *err)
{
	char url[URL_MAX], scope[512];
	struct xfer *x = NULL;
	pull_scope(scope, sizeof(scope), repo);
	int rc = manifest_url(r, url, sizeof(url), repo, reference);
	if (rc)
		return rc;
	struct req q = {
	    .method = method, .accept = OCI_MANIFEST_ACCEPT, .total_timeout = true, .up_fd = -1};
	if (strcmp(method, "GET") == 0)
		q.body_max = r->o.max_manifest_bytes;
	if ((rc = request(r, &q, url, sizeof(url), scope, &x, err))) {
		if (rc == -EFBIG)
			oci_errf(err, "manifest %s of %s/%s is larger than the %zu bytes accepted",
			         reference, r->host, repo, r->o.max_manifest_bytes);
		return rc;
	}
	if (x->status == 404) {
		oci_errf(err, "%s/%s:%s not found", r->host, repo, reference);
		rc = -ENOENT;
	} else if (x->status != 200) {
		describe_status(x, method, url, err);
		rc = status_errno(x->status);
	}
	if (rc) {
		xfer_free(x);
		return rc;
	}
	char *semi = strchr(x->content_type, ';');
	if (semi)
		*semi = '\0';
	*out = x;
	return 0;
}

static int get_manifest_at(struct oci_registry *r, const char *repo, const char *reference,
                           struct oci_fetched *out, struct oci_err *err);

static int resolve_at(struct oci_registry *r, const char *repo, const char *reference,
                      struct oci_desc *out, struct oci_err *err)
{
	struct xfer *x = NULL;
	int rc = manifest_request(r, "HEAD", repo, reference, &x, err);
	if (rc)
		return rc;
	if (!x->docker_digest[0] || !oci_digest_valid(x->docker_digest) || x->content_length < 0 ||
	    !x->content_type[0]) {
		/* no usable digest header: fetch and hash */
		struct oci_fetched f = {0};
		xfer_free(x);
		x = NULL;
		if ((rc = get_manifest_at(r, repo, reference, &f, err)))
			return rc;
		struct oci_desc d = {0};
		d.media_type = f.media_type;
		f.media_type = NULL;
		memcpy(d.digest, f.digest, sizeof(d.digest));
		d.size = (int64_t)f.len;
		oci_fetched_clear(&f);
		*out = d;
		return 0;
	}
	if (is_digest_ref(reference) && strcmp(reference, x->docker_digest) != 0) {
		oci_errf(err, "registry %s says manifest %s has digest %s", r->host, reference,
		         x->docker_digest);
		rc = -EBADMSG;
		goto out;
	}
	struct oci_desc d = {0};
	if (!(d.media_type = strdup(x->content_type))) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(d.digest, x->docker_digest, strlen(x->docker_digest) + 1); /* valid, so it fits */
	d.size = x->content_length;
	*out = d;
out:
	xfer_free(x);
	return rc;
}

static int get_manifest_at(struct oci_registry *r, const char *repo, const char *reference,
                           struct oci_fetched *out, struct oci_err *err)
{
	struct xfer *x = NULL;
	int rc = manifest_request(r, "GET", repo, reference, &x, err);
	if (rc)
		return rc;
	struct oci_fetched f = {0};
	/* Hash with the algorithm the reference or the header names. */
	const char *like = is_digest_ref(reference) ? reference
	                   : x->docker_digest[0]    ? x->docker_digest
	                                            : NULL;
	struct oci_hasher h;
	if ((rc = oci_hasher_init(&h, like)))
		goto out;
	oci_hasher_update(&h, x->body ? x->body : "", x->body_len);
	rc = oci_hasher_final(&h, f.digest);
	oci_hasher_free(&h);
	if (rc)
		goto out;
	if (is_digest_ref(reference) && strcmp(f.digest, reference) != 0) {
		oci_errf(err,
		         "manifest %s from %s/%s has content digest %s (the registry sent "
		         "other bytes than asked for)",
		         reference, r->host, repo, f.digest);
		rc = -EBADMSG;
		goto out;
	}
	if (x->docker_digest[0] && strcmp(f.digest, x->docker_digest) != 0) {
		oci_errf(err,
		         "registry %s sent Docker-Content-Digest %s for %s:%s but the manifest "
		         "it sent has digest %s",
		         r->host, x->docker_digest, repo, reference, f.digest);
		rc = -EBADMSG;
		goto out;
	}
	const char *mt = x->content_type;
	if (!*mt || strcmp(mt, "application/json") == 0 || strcmp(mt, "text/plain") == 0) {
		/* some registries and layouts do not say; look inside */
		enum oci_kind k = oci_detect_kind(x->body, x->body_len, NULL);
		mt = k == OCI_KIND_INDEX      ? OCI_MT_INDEX
		     : k == OCI_KIND_MANIFEST ? OCI_MT_MANIFEST
		                              : mt;
	}
	if (!(f.media_type = strdup(mt))) {
		rc = -ENOMEM;
		goto out;
	}
	if (!x->body && !(x->body = calloc(1, 1))) {
		oci_fetched_clear(&f);
		rc = -ENOMEM;
		goto out;
	}
	f.data = x->body;
	f.len = x->body_len;
	x->body = NULL;
	*out = f;
out:
	xfer_free(x);
	return rc;
}

/* ---- blobs ----------------------------------------------------------- */

struct stream {
	struct oci_registry *reg;
	struct xfer *x;
	char url[URL_MAX];
	char scope[512];
	char digest[OCI_DIGEST_MAX];
	uint64_t delivered;
	unsigned restarts;
};

static int stream_start(struct stream *s, struct oci_err *e)
{
	char range[64];
	struct req q = {.method = "GET", .stream = true, .follow = true, .up_fd = -1};
	if (s->delivered) {
		snprintf(range, sizeof(range), "bytes=%" PRIu64 "-", s->delivered);
		q.range = range;
	}
	int rc = request(s->reg, &q, s->url, sizeof(s->url), s->scope, &s->x, e);
	if (rc)
		return rc;
	struct xfer *x = s->x;
	if (x->status == 404) {
		oci_errf(e, "not found in %s (HTTP 404)", s->reg->host);
		return -ENOENT;
	}
	if (x->status == 206 && s->delivered) {
		/* "bytes N-M/T": make sure it starts where we stopped */
		const char *p = x->content_range;
		if (strncasecmp(p, "bytes ", 6) == 0)
			p += 6;
		if (strtoull(p, NULL, 10) != s->delivered) {
			oci_errf(e,
			         "registry resumed at the wrong offset (Content-Range '%s', wanted "
			         "%" PRIu64 ")",
			         x->content_range, s->delivered);
			return -EPROTO;
		}
		return 0;
	}
	if (x->status == 200) {
		x->skip = s->delivered; /* no range support: drop what we already have */
		return 0;
	}
	describe_status(x, "GET", s->url, e);
	return status_errno(x->status);
}

static ssize_t stream_read(void *ctx, void *buf, size_t len, struct oci_err *e)
{
	struct stream *s = ctx;
	for (;;) {
		struct xfer *x = s->x;
		if (x && x->s_len > 0) {
			size_t n = len < x->s_len ? len : x->s_len;
			memcpy(buf, x->sbuf + x->s_off, n);
			x->s_off += n;
			x->s_len -= n;
			if (x->s_len == 0)
				x->s_off = 0;
			if (x->paused && STREAM_BUF - x->s_len >= STREAM_RECV) {
				x->paused = false;
				curl_easy_pause(x->h, CURLPAUSE_CONT);
			}
			s->delivered += n;
			return (ssize_t)n;
		}
		if (x && !x->done) {
			xfer_drive(x, true);
			continue;
		}
		if (x && x->cc == CURLE_OK && x->status >= 200 && x->status < 300)
			return 0;
		/* the transfer broke (or never started): resume where we are */
		if (x) {
			bool can =
			    x->cc != CURLE_OK ? cc_retryable(x->cc) : status_retryable(x->status);
			if (!can || s->restarts >= s->reg->o.resumes) {
				if (x->cc != CURLE_OK)
					describe_cc(s->reg, x, "GET", s->url, e);
				else
					describe_status(x, "GET", s->url, e);
				if (s->delivered)
					oci_err_prefix(
					    e, "transfer cut short after %" PRIu64 " bytes%s",
					    s->delivered,
					    s->restarts ? " (resumed and failed again)" : "");
				return x->cc != CURLE_OK ? cc_errno(x->cc)
				                         : status_errno(x->status);
			}
			char n[24];
			snprintf(n, sizeof(n), "%" PRIu64, s->delivered);
			log_warn("blob transfer interrupted, resuming", "digest", s->digest,
			         "offset", n, "error",
			         x->cc != CURLE_OK ? curl_easy_strerror(x->cc) : "HTTP error");
			backoff(s->reg, s->restarts, x->retry_after);
			s->restarts++;
			xfer_free(x);
			s->x = NULL;
		}
		int rc = stream_start(s, e);
		if (rc)
			return rc;
	}
}

static void stream_close(void *ctx)
{
	struct stream *s = ctx;
	xfer_free(s->x);
	free(s);
}

static void refuse(struct oci_registry *front, const char *host, const char *digest,
                   const char *why);

/* A mirror's blob that failed: passed over for this digest from now on. */
static int stream_failed(void *ctx, int rc, struct oci_err *e)
{
	struct stream *s = ctx;
	if (!s->reg->mirror || rc == -ECANCELED)
		return rc;
	refuse(s->reg->front, s->reg->host, s->digest, oci_err_str(e, rc));
	oci_err_prefix(e, "mirror %s (passed over from now on)", s->reg->host);
	return -ESTALE;
}

static const struct oci_blob_source stream_source = {stream_read, stream_close, stream_failed};

static int blob_open_at(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                        const char *what, struct oci_blob_reader **out, struct oci_err *err)
{
	struct stream *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->reg = r;
	snprintf(s->digest, sizeof(s->digest), "%s", d->digest);
	pull_scope(s->scope, sizeof(s->scope), repo);
	int rc = build_url(r, s->url, sizeof(s->url), "/%s/blobs/%s", repo, d->digest);
	if (rc == 0)
		rc = stream_start(s, err);
	if (rc) {
		oci_err_prefix(err, "%s %s", what ? what : "blob", d->digest);
		stream_close(s);
		return rc;
	}
	return oci_blob_reader_new(&stream_source, s, d->digest, d->size, what, out);
}

/* HEAD a blob with the scope of a pull or of a push. */
static int blob_head(struct oci_registry *r, const char *repo, const char *digest, bool push,
                     bool *exists, struct oci_err *err)
{
	char url[URL_MAX], scope[512];
	struct xfer *x = NULL;
	(push ? push_scope : pull_scope)(scope, sizeof(scope), repo);
	int rc = build_url(r, url, sizeof(url), "/%s/blobs/%s", repo, digest);
	if (rc)
		return rc;
	struct req q = {.method = "HEAD", .total_timeout = true, .up_fd = -1};
	if ((rc = request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	/* a registry that sends the blob on to storage knows it and serves it */
	if (x->status == 200 || (!push && x->status >= 300 && x->status < 400))
		*exists = true;
	else if (x->status == 404)
		*exists = false;
	else {
		describe_status(x, "HEAD", url, err);
		rc = status_errno(x->status);
	}
	xfer_free(x);
	return rc;
}

int oci_registry_blob_exists(struct oci_registry *r, const char *repo, const char *digest,
                             bool *exists, struct oci_err *err)
{
	return blob_head(r, repo, digest, true, exists, err);
}

/* The source c serves the blob to these credentials: 0, or -ENOENT. */
static int blob_readable_at(struct oci_registry *c, const char *repo, const struct oci_desc *d,
                            struct oci_err *err)
{
	bool exists = false;
	int rc = blob_head(c, repo, d->digest, false, &exists, err);
	if (rc == 0 && !exists) {
		oci_errf(err, "blob %s not found in %s/%s", d->digest, c->host, repo);
		rc = -ENOENT;
	}
	return rc;
}

/* Location headers may be relative; make them absolute. */
static int absolute_location(const struct oci_registry *r, const char *loc, char *out, size_t cap)
{
	if (strncmp(loc, "http://", 7) == 0 || strncmp(loc, "https://", 8) == 0) {
		if ((size_t)snprintf(out, cap, "%s", loc) >= cap)
			return -ENAMETOOLONG;
		return 0;
	}
	if (loc[0] != '/')
		return -EPROTO;
	return build_url(r, out, cap, "%s", loc);
}

static int upload_once(struct oci_registry *r, const char *repo, int fd, const void *mem,
                       const struct oci_desc *d, bool chunked, struct oci_err *err)
{
	char url[URL_MAX], scope[512], loc[URL_MAX];
	struct xfer *x = NULL;
	push_scope(scope, sizeof(scope), repo);
	int rc = build_url(r, url, sizeof(url), "/%s/blobs/uploads/", repo);
	if (rc)
		return rc;
	struct req q = {.method = "POST", .total_timeout = true, .up_fd = -1};
	if ((rc = request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	if (x->status != 202 || !x->location[0]) {
		describe_status(x, "POST", url, err);
		oci_err_prefix(err, "cannot start blob upload");
		rc = x->status == 202 ? -EPROTO : status_errno(x->status);
		goto out;
	}
	if ((rc = absolute_location(r, x->location, loc, sizeof(loc)))) {
		oci_errf(err, "registry gave an unusable upload location '%s'", x->location);
		goto out;
	}
	xfer_free(x);
	x = NULL;
	uint64_t size = (uint64_t)d->size;
	uint64_t chunk = chunked ? (r->o.chunk_size ? r->o.chunk_size : (16u << 20)) : size;
	uint64_t off = 0;
	while (chunked && off < size) {
		uint64_t n = size - off < chunk ? size - off : chunk;
		char cr[64];
		snprintf(cr, sizeof(cr), "%" PRIu64 "-%" PRIu64, off, off + n - 1);
		struct req p = {.method = "PATCH",
		                .content_type = "application/octet-stream",
		                .content_range = cr,
		                .up_fd = fd,
		                .up_mem = mem,
		                .up_off = off,
		                .up_len = n};
		if ((rc = request(r, &p, loc, sizeof(loc), scope, &x, err)))
			goto out;
		if (x->status != 202 || !x->location[0]) {
			describe_status(x, "PATCH", loc, err);
			oci_err_prefix(err, "chunk at offset %" PRIu64 " refused", off);
			rc = status_errno(x->status);
			goto out;
		}
		char next[URL_MAX];
		if ((rc = absolute_location(r, x->location, next, sizeof(next)))) {
			oci_errf(err, "registry gave an unusable upload location '%s'",
			         x->location);
			goto out;
		}
		memcpy(loc, next, sizeof(loc));
		xfer_free(x);
		x = NULL;
		off += n;
	}
	char put[URL_MAX];
	if ((size_t)snprintf(put, sizeof(put), "%s%sdigest=%s", loc, strchr(loc, '?') ? "&" : "?",
	                     d->digest) >= sizeof(put)) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	struct req p = {.method = "PUT",
	                .content_type = "application/octet-stream",
	                .up_fd = fd,
	                .up_mem = mem,
	                .up_len = chunked ? 0 : size};
	if ((rc = request(r, &p, put, sizeof(put), scope, &x, err)))
		goto out;
	if (x->status == 413 && !chunked) {
		rc = -EFBIG; /* the caller switches to chunks */
		goto out;
	}
	if (x->status != 201) {
		describe_status(x, "PUT", put, err);
		oci_err_prefix(err, "blob upload of %s refused", d->digest);
		rc = status_errno(x->status);
		goto out;
	}
	if (x->docker_digest[0] && strcmp(x->docker_digest, d->digest) != 0) {
		oci_errf(err, "registry stored blob %s as %s", d->digest, x->docker_digest);
		rc = -EBADMSG;
	}
out:
	xfer_free(x);
	return rc;
}

int oci_registry_push_blob(struct oci_registry *r, const char *repo, int fd, const void *mem,
                           const struct oci_desc *d, struct oci_err *err)
{
	bool exists = false;
	int rc = oci_registry_blob_exists(r, repo, d->digest, &exists, err);
	if (rc)
		return rc;
	if (exists)
		return 0;
	bool chunked = r->o.chunk_size > 0 && (uint64_t)d->size > r->o.chunk_size;
	rc = upload_once(r, repo, fd, mem, d, chunked, err);
	if (rc == -EFBIG && !chunked) {
		log_info("registry refused a monolithic upload, sending chunks", "digest",
		         d->digest);
		rc = upload_once(r, repo, fd, mem, d, true, err);
	}
	return rc;
}

int oci_registry_put_manifest(struct oci_registry *r, const char *repo, const char *reference,
                              const char *media_type, const char *data, size_t len,
                              char digest_out[OCI_DIGEST_MAX], bool *subject_ack,
                              struct oci_err *err)
{
	char url[URL_MAX], scope[512], dg[OCI_DIGEST_MAX];
	struct xfer *x = NULL;
	push_scope(scope, sizeof(scope), repo);
	int rc = oci_digest_buf(data, len, dg);
	if (rc)
		return rc;
	if ((rc = manifest_url(r, url, sizeof(url), repo, reference)))
		return rc;
	struct req q = {.method = "PUT",
	                .content_type = media_type,
	                .up_fd = -1,
	                .up_mem = data,
	                .up_len = len,
	                .total_timeout = true};
	if ((rc = request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	if (x->status != 201 && x->status != 200) {
		describe_status(x, "PUT", url, err);
		oci_err_prefix(err, "manifest push refused");
		rc = status_errno(x->status);
		goto out;
	}
	if (x->docker_digest[0] && strcmp(x->docker_digest, dg) != 0) {
		oci_errf(err, "registry stored manifest as %s but its bytes hash to %s",
		         x->docker_digest, dg);
		rc = -EBADMSG;
		goto out;
	}
	if (digest_out)
		memcpy(digest_out, dg, OCI_DIGEST_MAX);
	if (subject_ack)
		*subject_ack = x->oci_subject[0] != '\0';
out:
	xfer_free(x);
	return rc;
}

static int referrers_at(struct oci_registry *r, const char *repo, const char *digest,
                        const char *artifact_type, struct oci_index *out, struct oci_err *err)
{
	char url[URL_MAX], scope[512];
	struct xfer *x = NULL;
	struct oci_index ix = {0};
	pull_scope(scope, sizeof(scope), repo);
	int rc;
	if (artifact_type) {
		CURL *esc = curl_easy_init();
		char *at = esc ? curl_easy_escape(esc, artifact_type, 0) : NULL;
		rc = at ? build_url(r, url, sizeof(url), "/%s/referrers/%s?artifactType=%s", repo,
		                    digest, at)
		        : -ENOMEM;
		curl_free(at);
		curl_easy_cleanup(esc);
	} else {
		rc = build_url(r, url, sizeof(url), "/%s/referrers/%s", repo, digest);
	}
	if (rc)
		return rc;
	struct req q = {.method = "GET",
	                .accept = OCI_MT_INDEX,
	                .total_timeout = true,
	                .body_max = r->o.max_manifest_bytes,
	                .up_fd = -1};
	if ((rc = request(r, &q, url, sizeof(url), scope, &x, err)))
		return rc;
	if (x->status == 404 || x->status == 405 || x->status == 400) {
		oci_errf(err, "registry %s has no referrers API (HTTP %ld)", r->host, x->status);
		rc = -EOPNOTSUPP;
		goto out;
	}
	if (x->status != 200) {
		describe_status(x, "GET", url, err);
		rc = status_errno(x->status);
		goto out;
	}
	char *semi = strchr(x->content_type, ';');
	if (semi)
		*semi = '\0';
	if (strcmp(x->content_type, OCI_MT_INDEX) != 0) {
		/* a catch-all route answering 200 with something else: no API */
		oci_errf(err, "registry %s answered the referrers API with '%s'", r->host,
		         x->content_type);
		rc = -EOPNOTSUPP;
		goto out;
	}
	if ((rc = oci_index_parse(x->body ? x->body : "", x->body_len, OCI_MT_INDEX, &ix, err))) {
		oci_err_prefix(err, "referrers of %s", digest);
		goto out;
	}
	if (artifact_type && !strstr(x->filters, "artifactType")) {
		size_t keep = 0;
		for (size_t i = 0; i < ix.n_manifests; i++) {
			const char *t = ix.manifests[i].artifact_type;
			if (t && strcmp(t, artifact_type) == 0)
				ix.manifests[keep++] = ix.manifests[i];
			else
				oci_desc_clear(&ix.manifests[i]);
		}
		ix.n_manifests = keep;
	}
	*out = ix;
	memset(&ix, 0, sizeof(ix));
out:
	oci_index_clear(&ix);
	xfer_free(x);
	return rc;
}

/* ---- mirrors ---------------------------------------------------------- */

unsigned oci_registry_mirror_refusals(const struct oci_registry *r)
{
	return r->n_refused;
}

static void refuse(struct oci_registry *front, const char *host, const char *digest,
                   const char *why)
{
	log_warn("mirror passed over for a blob: the next source is used", "mirror", host,
	         "registry", front->host, "digest", digest, "error", why);
	struct refusal *f = &front->refused[front->n_refused++ % MIRROR_REFUSALS_MAX];
	snprintf(f->host, sizeof(f->host), "%s", host);
	snprintf(f->digest, sizeof(f->digest), "%s", digest);
}

static bool refused(const struct oci_registry *front, const char *host, const char *digest)
{
	unsigned n =
	    front->n_refused < MIRROR_REFUSALS_MAX ? front->n_refused : MIRROR_REFUSALS_MAX;
	for (unsigned i = 0; i < n; i++)
		if (!strcmp(front->refused[i].host, host) &&
		    !strcmp(front->refused[i].digest, digest))
			return true;
	return false;
}

static int read_cas(struct oci_registry *c, const struct oci_endpoint *ep, struct oci_err *err)
{
	for (size_t i = 0; i < OCI_MIRRORS_CA_MAX && ep->ca[i][0]; i++) {
		char *pem = NULL;
		size_t len = 0;
		int rc = fsutil_read_file(ep->ca[i], 1u << 20, &pem, &len);
		if (rc) {
			oci_errf(err, "CA file %s of %s: %s", ep->ca[i], ep->host, strerror(-rc));
			return rc;
		}
		char *all = realloc(c->ca_pem, c->ca_len + len + 2);
		if (!all) {
			free(pem);
			return -ENOMEM;
		}
		memcpy(all + c->ca_len, pem, len);
		all[c->ca_len + len] = '\n';
		c->ca_len += len + 1;
		all[c->ca_len] = '\0';
		c->ca_pem = all;
		free(pem);
	}
	return 0;
}

/* The client that speaks to ep: the front itself for its own host as is,
 * else one made on first use and kept with the front. */
static int endpoint_client(struct oci_registry *r, const struct oci_endpoint *ep,
                           struct oci_registry **out, struct oci_err *err)
{
	if (!ep->mirror && !strcmp(ep->host, r->host) && !strcmp(ep->path, "/v2") &&
	    !ep->ca[0][0] && !ep->skip_verify && !ep->insecure && !ep->plain_http) {
		*out = r;
		return 0;
	}
	char key[sizeof(r->eps[0].key)];
	snprintf(key, sizeof(key), "%s|%s|%d%d%d%d|%s", ep->host, ep->path, ep->mirror,
	         ep->plain_http, ep->insecure, ep->skip_verify, ep->ca[0]);
	for (size_t i = 0; i < r->n_eps; i++)
		if (!strcmp(r->eps[i].key, key)) {
			*out = r->eps[i].reg;
			return 0;
		}
	if (r->n_eps >= MIRROR_CLIENTS_MAX) {
		oci_errf(err, "too many mirror endpoints for %s", r->host);
		return -E2BIG;
	}
	struct oci_registry_opts o = r->o;
	o.auth_json = r->auth_json;
	o.auth_file = r->auth_file;
	o.username = r->username;
	o.password = r->password;
	o.auth_source = r->auth_source;
	o.plain_http = ep->plain_http ? ep->host : NULL;
	o.ca_file = r->ca_file;
	o.tls_no_verify = r->o.tls_no_verify || ep->skip_verify || ep->insecure;
	o.hosts_dir = o.registries_conf = NULL;
	struct oci_registry *c = NULL;
	int rc = oci_registry_new(ep->host, &o, &c, err);
	if (rc)
		return rc;
	c->front = r;
	c->mirror = ep->mirror;
	snprintf(c->api_path, sizeof(c->api_path), "%s", ep->path);
	if (ep->insecure && !ep->plain_http)
		c->scheme_known = false; /* HTTPS, else HTTP */
	if ((rc = read_cas(c, ep, err))) {
		oci_registry_free(c);
		return rc;
	}
	snprintf(r->eps[r->n_eps].key, sizeof(key), "%s", key);
	r->eps[r->n_eps++].reg = c;
	*out = c;
	return 0;
}

/* A small blob read whole, handed out from memory. */
struct mem_blob {
	char *data;
	size_t len, off;
};

static ssize_t mem_read(void *ctx, void *buf, size_t len, struct oci_err *e)
{
	struct mem_blob *m = ctx;
	(void)e;
	size_t n = m->len - m->off < len ? m->len - m->off : len;
	memcpy(buf, m->data + m->off, n);
	m->off += n;
	return (ssize_t)n;
}

static void mem_close(void *ctx)
{
	struct mem_blob *m = ctx;
	free(m->data);
	free(m);
}

static const struct oci_blob_source mem_source = {mem_read, mem_close, NULL};

/* From a mirror: small blobs are checked before anyone sees them. */
static int mirror_blob_open(struct oci_registry *c, const char *repo, const struct oci_desc *d,
                            const char *what, struct oci_blob_reader **out, struct oci_err *err)
{
	struct oci_blob_reader *rd = NULL;
	int rc = blob_open_at(c, repo, d, what, &rd, err);
	if (rc || d->size < 0 || d->size > (int64_t)MIRROR_WHOLE_MAX) {
		*out = rd;
		return rc;
	}
	struct mem_blob *m = calloc(1, sizeof(*m));
	if (!m) {
		oci_blob_close(rd);
		return -ENOMEM;
	}
	if ((rc = oci_blob_slurp(rd, MIRROR_WHOLE_MAX, &m->data, &m->len, err))) {
		free(m);
		return rc;
	}
	return oci_blob_reader_new(&mem_source, m, d->digest, d->size, what, out);
}

enum op { OP_RESOLVE, OP_MANIFEST, OP_BLOB, OP_BLOB_READABLE, OP_REFERRERS };

struct call {
	enum op op;
	const char *reference; /* tag or digest; the blob's or subject's digest */
	const struct oci_desc *desc;
	const char *what, *artifact_type;
	void *out;
};

static int call_at(struct oci_registry *c, const char *repo, const struct call *k,
                   struct oci_err *err)
{
	switch (k->op) {
	case OP_RESOLVE:
		return resolve_at(c, repo, k->reference, k->out, err);
	case OP_MANIFEST:
		return get_manifest_at(c, repo, k->reference, k->out, err);
	case OP_BLOB:
		return c->mirror ? mirror_blob_open(c, repo, k->desc, k->what, k->out, err)
		                 : blob_open_at(c, repo, k->desc, k->what, k->out, err);
	case OP_BLOB_READABLE:
		return blob_readable_at(c, repo, k->desc, err);
	case OP_REFERRERS: {
		struct oci_index *ix = k->out;
		int rc = referrers_at(c, repo, k->reference, k->artifact_type, ix, err);
		if (rc == 0 && c->mirror && ix->n_manifests == 0) {
			/* a mirror may lack what was attached later */
			oci_errf(err, "no referrers of %s on %s", k->reference, c->host);
			return -ENOENT;
		}
		return rc;
	}
	}
	return -EINVAL;
}

static bool down(int rc)
{
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
	       rc == -ECONNRESET || rc == -EAGAIN || rc == -ENETUNREACH;
}

/* Ask each source of the route in turn until one answers. */
static int routed(struct oci_registry *r, const char *repo, const struct call *k,
                  struct oci_err *err)
{
	struct oci_route rt;
	bool blob = k->op == OP_BLOB || k->op == OP_BLOB_READABLE;
	bool by_digest = blob || k->op == OP_REFERRERS || is_digest_ref(k->reference);
	int rc = oci_mirrors_route(r->mirrors, r->host, repo, by_digest, &rt, err);
	if (rc)
		return rc;
	char passed[512] = "";
	size_t n_mirrors = 0;
	bool all_down = true;
	int mirror_said = 0; /* a mirror's "not there" */
	for (size_t i = 0; i < rt.n; i++) {
		const struct oci_endpoint *ep = &rt.ep[i];
		const char *digest = blob ? k->desc->digest : NULL;
		if (ep->mirror && digest && refused(r, ep->host, digest))
			continue;
		struct oci_registry *c = NULL;
		struct oci_err e;
		memset(&e, 0, sizeof(e));
		if ((rc = endpoint_client(r, ep, &c, &e)) == 0 &&
		    (rc = call_at(c, ep->repo, k, &e)) == 0)
			return 0;
		if (rc == -ECANCELED || !ep->mirror) {
			oci_errf(err, "%s", oci_err_str(&e, rc));
			if (mirror_said && down(rc)) {
				/* the origin cannot be asked (an air-gapped node):
				 * what the mirrors say is the answer */
				oci_err_prefix(err, "not on the mirrors (%s), origin unreachable",
				               passed);
				return mirror_said;
			}
			if (n_mirrors && all_down && down(rc)) {
				oci_err_prefix(err, "no mirror (%s) nor the origin answered",
				               passed);
				return -ENETUNREACH;
			}
			if (n_mirrors)
				oci_err_prefix(err, "mirrors passed over (%s), then", passed);
			return rc;
		}
		n_mirrors++;
		all_down = all_down && down(rc);
		if (rc == -ENOENT || (k->op == OP_REFERRERS && rc == -EOPNOTSUPP))
			mirror_said = k->op == OP_REFERRERS ? -EOPNOTSUPP : -ENOENT;
		size_t used = strlen(passed);
		snprintf(passed + used, sizeof(passed) - used, "%s%s", used ? ", " : "", ep->host);
		log_kv(rc == -ENOENT ? LOG_DEBUG : LOG_WARN,
		       "mirror did not serve, trying the next", "mirror", ep->host, "registry",
		       r->host, "error", oci_err_str(&e, rc), (char *)0);
	}
	oci_errf(err, "no source left for %s of %s/%s", k->reference, r->host, repo);
	return -ENOENT;
}

int oci_registry_blob_readable(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                               struct oci_err *err)
{
	struct call k = {.op = OP_BLOB_READABLE, .reference = d->digest, .desc = d};
	return routed(r, repo, &k, err);
}

int oci_registry_resolve(struct oci_registry *r, const char *repo, const char *reference,
                         struct oci_desc *out, struct oci_err *err)
{
	struct call k = {.op = OP_RESOLVE, .reference = reference, .out = out};
	return routed(r, repo, &k, err);
}

int oci_registry_get_manifest(struct oci_registry *r, const char *repo, const char *reference,
                              struct oci_fetched *out, struct oci_err *err)
{
	struct call k = {.op = OP_MANIFEST, .reference = reference, .out = out};
	return routed(r, repo, &k, err);
}

int oci_registry_blob_open(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                           const char *what, struct oci_blob_reader **out, struct oci_err *err)
{
	struct call k = {
	    .op = OP_BLOB, .reference = d->digest, .desc = d, .what = what, .out = out};
	return routed(r, repo, &k, err);
}

int oci_registry_referrers(struct oci_registry *r, const char *repo, const char *digest,
                           const char *artifact_type, struct oci_index *out, struct oci_err *err)
{
	struct call k = {
	    .op = OP_REFERRERS, .reference = digest, .artifact_type = artifact_type, .out = out};
	return routed(r, repo, &k, err);
}
