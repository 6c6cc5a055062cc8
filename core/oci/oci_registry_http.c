#include "oci_registry_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "curlerr.h"
#include "log.h"
#include "progress.h"

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
	progress_add(PROGRESS_SENT, want, 0);
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

void reg_xfer_free(struct xfer *x)
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
		/* a blob goes out in reads of 1 MiB, not libcurl's 64 KiB */
		if (q->up_len > UPLOAD_BUF)
			curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, (long)UPLOAD_BUF);
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
	reg_xfer_free(x);
	return -ENOMEM;
}

/* Drive transfers until x completes, or (until_data) has stream bytes. */
void reg_xfer_drive(struct xfer *x, bool until_data)
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
int reg_cc_errno(CURLcode cc)
{
	if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
	    cc == CURLE_SSL_ISSUER_ERROR)
		return -EBADE;
	return curlerr_errno(cc);
}

bool reg_cc_retryable(CURLcode cc)
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

bool reg_status_retryable(long s)
{
	return s == 429 || s == 500 || s == 502 || s == 503 || s == 504 || s == 408;
}

int reg_status_errno(long s)
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

void reg_describe_cc(const struct oci_registry *r, const struct xfer *x, const char *method,
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
	if (reg_cc_errno(x->cc) == -EBADE)
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
void reg_describe_status(const struct xfer *x, const char *method, const char *url,
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
void reg_backoff(struct oci_registry *r, unsigned attempt, const char *retry_after)
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
/* Run a request once with no auth or retry handling (token fetches). */
int reg_run_simple(struct oci_registry *r, const struct req *q, struct xfer **out,
                   struct oci_err *err)
{
	struct xfer *x = NULL;
	for (unsigned attempt = 0;; attempt++) {
		int rc = xfer_start(r, q, &x);
		if (rc)
			return rc;
		reg_xfer_drive(x, false);
		bool retry =
		    attempt < r->o.retries &&
		    (x->cc != CURLE_OK ? reg_cc_retryable(x->cc) : reg_status_retryable(x->status));
		if (!retry)
			break;
		char at[16];
		snprintf(at, sizeof(at), "%u", attempt + 1);
		log_warn("registry request failed, retrying", "url", q->url, "attempt", at);
		reg_backoff(r, attempt, x->retry_after);
		reg_xfer_free(x);
		x = NULL;
	}
	if (x->cc != CURLE_OK) {
		reg_describe_cc(r, x, q->method, q->url, err);
		int rc = reg_cc_errno(x->cc);
		reg_xfer_free(x);
		return rc;
	}
	*out = x;
	return 0;
}

int reg_build_url(const struct oci_registry *r, char *url, size_t cap, const char *fmt, ...)
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

/* A loopback host answered: learn whether it speaks HTTPS. true when a TLS
 * handshake failed, so the request goes again over plain HTTP (url
 * rebased). */
static bool learn_scheme(struct oci_registry *r, const struct xfer *x, char *url, size_t url_cap)
{
	if (r->scheme_known)
		return false;
	if (x->cc != CURLE_OK && tls_mismatch(x->cc)) {
		r->scheme_known = true;
		r->plain_http = true;
		rebase_url(r, url, url_cap);
		log_debug("registry speaks plain HTTP", "host", r->host);
		return true;
	}
	if (x->cc == CURLE_OK)
		r->scheme_known = true;
	return false;
}

/* A second 401: what was refused (sent_auth: an Authorization header). */
static void describe_refusal(const struct oci_registry *r, const struct xfer *x,
                             const struct req *q, const char *url, const char *scope,
                             bool sent_auth, struct oci_err *err)
{
	if (sent_auth && r->auth == OCI_AUTH_BASIC) {
		oci_errf(err, "registry %s rejected the credentials from %s (HTTP 401)", r->host,
		         r->creds_source);
	} else if (sent_auth) {
		oci_errf(err, "registry %s refused the token issued for '%s' (HTTP 401)", r->host,
		         scope ? scope : "");
	} else {
		reg_describe_status(x, q->method, url, err);
		oci_err_prefix(err, "not authorized%s", r->have_creds ? "" : " (no credentials)");
	}
}

/* The last attempt failed too: describe it, and its -errno. */
static int give_up(const struct oci_registry *r, const struct xfer *x, const struct req *q,
                   const char *url, unsigned attempt, struct oci_err *err)
{
	int rc;
	if (x->cc != CURLE_OK) {
		reg_describe_cc(r, x, q->method, url, err);
		rc = reg_cc_errno(x->cc);
	} else {
		reg_describe_status(x, q->method, url, err);
		rc = reg_status_errno(x->status);
	}
	if (r->o.retries)
		oci_err_prefix(err, "giving up after %u attempts", attempt + 1);
	return rc;
}

static void log_retry(const struct xfer *x, const struct req *q, const char *url, unsigned attempt)
{
	char at[16];
	snprintf(at, sizeof(at), "%u", attempt + 1);
	char why[64];
	if (x->cc != CURLE_OK)
		snprintf(why, sizeof(why), "%s", curl_easy_strerror(x->cc));
	else
		snprintf(why, sizeof(why), "HTTP %ld", x->status);
	log_warn("registry request failed, retrying", "method", q->method, "url", url, "error", why,
	         "attempt", at);
}

/* A request to the registry itself: auth, loopback HTTP fallback, retries.
 * scope: the token scope it needs. *out gets the finished exchange
 * whatever its status (the caller interprets 4xx); errors are transport
 * failures after retries, or authentication that cannot succeed. For
 * stream requests, *out is returned as soon as the headers and first
 * bytes of a 2xx body arrived. */
int reg_request(struct oci_registry *r, struct req *q, char *url, size_t url_cap, const char *scope,
                struct xfer **out, struct oci_err *err)
{
	struct xfer *x = NULL;
	char *auth = NULL;
	int rc = 0;
	bool auth_retried = false;
	unsigned attempt = 0;
	for (;;) {
		free(auth);
		auth = NULL;
		if ((rc = reg_auth_for(r, scope, &auth, err)))
			goto out;
		q->auth = auth;
		q->url = url;
		if ((rc = xfer_start(r, q, &x)))
			goto out;
		reg_xfer_drive(x, q->stream);
		/* stream requests return once a 2xx body starts flowing (even when
		 * the connection broke right after: the reader resumes from there) */
		if (q->stream && x->status >= 200 && x->status < 300 && (!x->done || x->s_len > 0))
			break;
		if (learn_scheme(r, x, url, url_cap)) {
			reg_xfer_free(x);
			x = NULL;
			continue;
		}
		if (x->cc == CURLE_OK && x->status == 401 && !auth_retried) {
			auth_retried = true;
			if ((rc = reg_on_unauthorized(r, x, scope, auth != NULL, err)))
				goto out;
			reg_xfer_free(x);
			x = NULL;
			continue;
		}
		if (x->cc == CURLE_OK && x->status == 401) {
			describe_refusal(r, x, q, url, scope, auth != NULL, err);
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
		    x->cc != CURLE_OK ? reg_cc_retryable(x->cc) : reg_status_retryable(x->status);
		if (!retryable)
			break;
		if (attempt >= r->o.retries) {
			rc = give_up(r, x, q, url, attempt, err);
			goto out;
		}
		log_retry(x, q, url, attempt);
		reg_backoff(r, attempt, x->retry_after);
		attempt++;
		reg_xfer_free(x);
		x = NULL;
	}
	if (x->cc != CURLE_OK && !(q->stream && x->s_len > 0)) {
		reg_describe_cc(r, x, q->method, url, err);
		rc = reg_cc_errno(x->cc);
		goto out;
	}
	*out = x;
	x = NULL;
out:
	reg_xfer_free(x);
	if (auth) {
		explicit_bzero(auth, strlen(auth));
		free(auth);
	}
	return rc;
}

void reg_pull_scope(char *buf, size_t cap, const char *repo)
{
	snprintf(buf, cap, "repository:%s:pull", repo);
}

void reg_push_scope(char *buf, size_t cap, const char *repo)
{
	snprintf(buf, cap, "repository:%s:pull,push", repo);
}
