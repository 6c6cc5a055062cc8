/* Kubernetes API errors: Status bodies, reasons, errnos (see kube_client.h). */
#include "kube_client_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

void kc_copy_str(char *dst, size_t len, const char *src)
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
	kc_copy_str(err->reason_text, sizeof(err->reason_text), kube_reason_name(r));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
}

const char *kc_jstr(const cJSON *o, const char *key)
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
	const char *kind = kc_jstr(st, "kind");
	if (st && kind && !strcmp(kind, "Status")) {
		const char *reason = kc_jstr(st, "reason");
		enum kube_reason r = reason_from_text(reason);
		/* 409 AlreadyExists and 410 Expired are told apart by reason only. */
		if (r != KUBE_UNKNOWN)
			err->reason = r;
		kc_copy_str(err->reason_text, sizeof(err->reason_text),
		            reason && *reason ? reason : kube_reason_name(err->reason));
		kc_copy_str(err->message, sizeof(err->message), kc_jstr(st, "message"));
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(st, "code");
		if (!code && cJSON_IsNumber(c) && c->valuedouble >= 100 && c->valuedouble < 600) {
			err->http_code = (long)c->valuedouble;
			if (err->reason == KUBE_UNKNOWN)
				err->reason = reason_from_code(err->http_code);
		}
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(st, "details");
		kc_copy_str(err->kind, sizeof(err->kind), kc_jstr(d, "kind"));
		kc_copy_str(err->name, sizeof(err->name), kc_jstr(d, "name"));
		kc_copy_str(err->group, sizeof(err->group), kc_jstr(d, "group"));
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
			kc_copy_str(kc->reason, sizeof(kc->reason), kc_jstr(cause, "reason"));
			kc_copy_str(kc->field, sizeof(kc->field), kc_jstr(cause, "field"));
			kc_copy_str(kc->message, sizeof(kc->message), kc_jstr(cause, "message"));
		}
	} else {
		kc_copy_str(err->reason_text, sizeof(err->reason_text),
		            kube_reason_name(err->reason));
		char ex[256];
		kube_text_excerpt(ex, sizeof(ex), body ? body : "", body ? len : 0);
		snprintf(err->message, sizeof(err->message), "HTTP %ld%s%s", code, *ex ? ": " : "",
		         ex);
	}
	if (!err->message[0])
		snprintf(err->message, sizeof(err->message), "HTTP %ld %s", code, err->reason_text);
	cJSON_Delete(st);
}
