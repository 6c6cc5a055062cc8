/* Kubernetes API client over libcurl: typed errors from Status objects,
 * resource addressing (built-in kinds, then discovery), and the verbs gkm
 * uses: GET, LIST (paginated), CREATE, PUT (optimistic concurrency), DELETE
 * (with preconditions), server-side apply on objects and their status, and
 * core/v1 Events. Watches are in kube_watch.h.
 *
 * Every function here blocks: call them from worker threads, never from the
 * loop thread. A client is thread-safe; it keeps a pool of curl handles so
 * each concurrent request has its own connection, reused (keep-alive, or
 * HTTP/2 over TLS) by the next request. Every request has a connect timeout
 * and a total timeout. Nothing is retried here: callers decide (the work
 * queue requeues with backoff, watches reconnect with backoff). */
#ifndef GKM_KUBE_CLIENT_H
#define GKM_KUBE_CLIENT_H

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "kube_config.h"

/* ---- Typed errors ---- */

enum kube_reason {
	KUBE_OK = 0,
	KUBE_UNKNOWN,        /* a failure the server did not explain */
	KUBE_NOT_FOUND,      /* 404 */
	KUBE_ALREADY_EXISTS, /* 409 on create */
	KUBE_CONFLICT,       /* 409: stale resourceVersion, field-manager conflict, precondition */
	KUBE_INVALID,        /* 422 with causes */
	KUBE_BAD_REQUEST,    /* 400 */
	KUBE_UNAUTHORIZED,   /* 401 */
	KUBE_FORBIDDEN,      /* 403 */
	KUBE_METHOD_NOT_ALLOWED, /* 405 */
	KUBE_NOT_ACCEPTABLE,     /* 406 */
	KUBE_GONE,               /* 410: resourceVersion or continue token too old */
	KUBE_TOO_LARGE,          /* 413, or a response over the client's bound */
	KUBE_UNSUPPORTED_MEDIA,  /* 415 */
	KUBE_TOO_MANY_REQUESTS,  /* 429 */
	KUBE_INTERNAL,           /* 500 */
	KUBE_UNAVAILABLE,        /* 503 */
	KUBE_TIMEOUT,            /* 504 / server or client timeout */
	KUBE_TRANSPORT,          /* could not connect, TLS failure, connection reset */
	KUBE_MALFORMED,          /* a 2xx whose body is not the JSON we expect */
};

#define KUBE_MAX_CAUSES 8
struct kube_cause {
	char reason[64]; /* "FieldValueInvalid", "FieldManagerConflict" */
	char field[256]; /* "spec.size", ".spec.size" */
	char message[512];
};

struct kube_error {
	long http_code; /* 0 when no HTTP response was received */
	enum kube_reason reason;
	char reason_text[64]; /* the server's reason string, or ours ("Transport") */
	char message[1024];   /* human readable; from the Status message when there is one */
	char kind[64], name[256], group[128]; /* Status details, when given */
	struct kube_cause causes[KUBE_MAX_CAUSES];
	unsigned ncauses;       /* causes kept (at most KUBE_MAX_CAUSES) */
	unsigned retry_after_s; /* Retry-After header or details.retryAfterSeconds; 0 if none */
};

const char *kube_reason_name(enum kube_reason r);
/* Transport failures, timeouts, 429, 500, 503, 504: worth retrying unchanged. */
bool kube_error_retryable(const struct kube_error *e);
/* -ENOENT NotFound, -EEXIST AlreadyExists, -EBUSY Conflict, -ESTALE Gone,
 * -EINVAL Invalid/BadRequest/415/405/406, -EACCES 401/403, -EAGAIN 429/503,
 * -ETIMEDOUT, -EMSGSIZE too large, -EBADMSG malformed, -EIO otherwise. */
int kube_error_errno(const struct kube_error *e);
/* Fill err from an HTTP status and body (a Status object, or anything else:
 * a proxy's HTML page still gives a reason from the code). Never fails. */
void kube_error_from_response(long http_code, const char *body, size_t len, struct kube_error *err);
/* Set a client-side error (transport, malformed, ...) with a message. */
void kube_error_set(struct kube_error *err, enum kube_reason r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- Resources ---- */

struct kube_resource {
	char group[128];  /* "" for the core group */
	char version[32]; /* "v1", "v1alpha1" */
	char plural[96];  /* "gkmcaches" */
	char kind[96];    /* "GKMCache" */
	bool namespaced;
};

/* The kinds gkm uses (core, coordination, events, apiextensions, gkm.io),
 * without a server. -ENOENT when not known here. */
__attribute__((warn_unused_result)) int
kube_resource_builtin(const char *api_version, const char *kind, struct kube_resource *out);
/* "apps/v1" or "v1" from a resource. buf of at least 161 bytes. */
void kube_resource_api_version(const struct kube_resource *r, char *buf, size_t len);
/* "/apis/G/V[/namespaces/NS]/PLURAL[/NAME[/SUB]]". ns is ignored for
 * cluster-scoped kinds; ns NULL on a namespaced kind means all namespaces.
 * Names are checked for characters that cannot appear in a path segment.
 * 0, -EINVAL (bad name), -ENAMETOOLONG. */
__attribute__((warn_unused_result)) int kube_resource_path(const struct kube_resource *r,
                                                           const char *ns, const char *name,
                                                           const char *sub, char *buf, size_t len);

/* ---- Query strings ---- */

/* Append "&key=value" (or "?key=value" when buf has no '?' yet) to the
 * NUL-terminated buf, percent-encoding the value. 0 or -ENAMETOOLONG (buf
 * untouched). */
__attribute__((warn_unused_result)) int kube_query_add(char *buf, size_t len, const char *key,
                                                       const char *value);

/* ---- The client ---- */

struct kube_client_opts {
	long connect_timeout_ms; /* default 5000 */
	long request_timeout_ms; /* default 30000 (per request, whole transfer) */
	size_t max_response;     /* default 64 MiB: bound of one response body */
	const char *user_agent;  /* default "gkm/<version>" */
};

struct kube_client;

/* The client keeps a pointer to cfg (which must outlive it). opts may be
 * NULL. Caller frees with kube_client_free(). */
__attribute__((warn_unused_result)) int kube_client_new(struct kube_config *cfg,
                                                        const struct kube_client_opts *opts,
                                                        struct kube_client **out);
void kube_client_free(struct kube_client *c);
struct kube_config *kube_client_config(struct kube_client *c);

/* Resolve apiVersion + kind: built-in table first, then the server's
 * discovery document for that group/version (cached for the client's life).
 * 0, or -errno with err set (-ENOENT: the server does not serve that kind). */
__attribute__((warn_unused_result)) int
kube_client_resource(struct kube_client *c, const char *api_version, const char *kind,
                     struct kube_resource *out, struct kube_error *err);

/* One request. path starts with '/' and may carry a query. On 2xx *out (if
 * out is not NULL) receives the parsed body (caller frees; NULL for an empty
 * body). Otherwise -errno and err says why. */
struct kube_request {
	const char *method; /* "GET", "POST", "PUT", "PATCH", "DELETE" */
	const char *path;
	const char *content_type; /* with a body */
	const char *body;
	size_t body_len;
	long timeout_ms; /* 0: the client's default */
};
__attribute__((warn_unused_result)) int kube_client_do(struct kube_client *c,
                                                       const struct kube_request *rq, cJSON **out,
                                                       struct kube_error *err);

/* A streaming GET (watches): on a 2xx response each body chunk goes to
 * on_data (return false to stop); on an error response the body is
 * collected (bounded) and parsed into err. The transfer stops within about a
 * second once *stop becomes true (returns -ECANCELED), and when no byte
 * arrived for idle_timeout_ms, or for stall_timeout_ms in the middle of a
 * message (returns -ETIMEDOUT). 0 when the server ended the stream. */
struct kube_stream {
	const char *path;
	long timeout_ms;      /* hard cap of the whole stream */
	long idle_timeout_ms; /* no bytes for this long: the connection is dead */
	/* When *pending is non-zero (the consumer holds part of a message) and
	 * no byte came for stall_timeout_ms, the stream is stalled mid-message:
	 * stop with -ETIMEDOUT. pending may be NULL. */
	long stall_timeout_ms;
	const size_t *pending;
	bool (*on_data)(const char *buf, size_t len, void *ud);
	void *ud;
	const atomic_bool *stop;
};
__attribute__((warn_unused_result)) int
kube_client_stream(struct kube_client *c, const struct kube_stream *s, struct kube_error *err);

/* ---- Verbs. out may be NULL where the result is not needed. ---- */

__attribute__((warn_unused_result)) int kube_client_get(struct kube_client *c,
                                                        const struct kube_resource *r,
                                                        const char *ns, const char *name,
                                                        cJSON **out, struct kube_error *err);

struct kube_list_opts {
	const char *label_selector; /* "app=demo,tier!=x" or NULL */
	const char *field_selector; /* "metadata.name=w3" or NULL */
	unsigned limit;             /* page size; default 500 */
	size_t max_items;           /* bound of the whole list; default 1,000,000 */
	/* Streaming: when set, each page's items (an array, owned by the callee)
	 * go to on_page as the page arrives instead of being collected, so a
	 * big list never sits in memory whole; first is true for the first page
	 * of a list (again after a restart: start over), and *items is set to
	 * NULL. */
	void (*on_page)(cJSON *items, bool first, void *ud);
	void *page_ud;
};
/* List every page (limit/continue). *items receives an array of the objects
 * (caller frees), rv the list's resourceVersion (for a following watch). An
 * expired continue token (410) restarts the list from the beginning, up to
 * three times. */
__attribute__((warn_unused_result)) int
kube_client_list(struct kube_client *c, const struct kube_resource *r, const char *ns,
                 const struct kube_list_opts *o, cJSON **items, char *rv, size_t rvlen,
                 struct kube_error *err);

__attribute__((warn_unused_result)) int kube_client_create(struct kube_client *c,
                                                           const struct kube_resource *r,
                                                           const char *ns, const cJSON *obj,
                                                           cJSON **out, struct kube_error *err);

/* PUT: obj's metadata.resourceVersion makes it conditional (409 when stale). */
__attribute__((warn_unused_result)) int
kube_client_replace(struct kube_client *c, const struct kube_resource *r, const char *ns,
                    const char *name, const cJSON *obj, cJSON **out, struct kube_error *err);

struct kube_apply_opts {
	const char *field_manager; /* required: "gkm-operator", "gkm-agent/node-1" */
	bool force;                /* take over fields other managers own */
	bool status;               /* apply to the status subresource */
};
/* Server-side apply (application/apply-patch+yaml; the JSON text of obj is
 * valid YAML). name and ns default to obj's metadata. */
__attribute__((warn_unused_result)) int
kube_client_apply(struct kube_client *c, const struct kube_resource *r, const char *ns,
                  const char *name, const cJSON *obj, const struct kube_apply_opts *o, cJSON **out,
                  struct kube_error *err);

struct kube_delete_opts {
	const char *uid;              /* precondition, or NULL */
	const char *resource_version; /* precondition, or NULL */
	const char *propagation;      /* "Background", "Foreground", "Orphan" or NULL */
};
/* 0 when deleted (or deletion started); -ENOENT when already gone. */
__attribute__((warn_unused_result)) int
kube_client_delete(struct kube_client *c, const struct kube_resource *r, const char *ns,
                   const char *name, const struct kube_delete_opts *o, struct kube_error *err);

/* A core/v1 Event about an object, carrying involvedObject.uid so that
 * `kubectl describe` lists it. Named "<object>.<hex time>" like kubectl's own;
 * cluster-scoped objects get their Events in namespace "default". */
struct kube_event {
	const cJSON *regarding; /* the object: apiVersion, kind, metadata.{name,namespace,uid} */
	const char *type;       /* "Normal" or "Warning" */
	const char *reason;     /* CamelCase, e.g. "Verified" */
	const char *message;    /* truncated to 1024 bytes */
	const char *component;  /* "gkm-agent" */
	const char *host;       /* node name, or NULL */
};
/* Build the Event object (no I/O): for tests and for kube_client_event. */
__attribute__((warn_unused_result)) int kube_event_build(const struct kube_event *ev, cJSON **out,
                                                         struct kube_error *err);
__attribute__((warn_unused_result)) int
kube_client_event(struct kube_client *c, const struct kube_event *ev, struct kube_error *err);

/* A printable excerpt (at most 200 bytes, control bytes as spaces) of
 * text from outside, for error messages. */
void kube_text_excerpt(char *dst, size_t dlen, const char *s, size_t n);

/* Helpers on objects. */
const char *kube_obj_str(const cJSON *obj, const char *section, const char *field);
/* An RFC 1123 subdomain as the API server checks object names: at most 253
 * characters, dot-separated parts of [a-z0-9-] that start and end with an
 * alphanumeric (a part may be longer than 63). */
bool kube_valid_subdomain(const char *s);
#define kube_obj_name(o) kube_obj_str((o), "metadata", "name")
#define kube_obj_namespace(o) kube_obj_str((o), "metadata", "namespace")
#define kube_obj_rv(o) kube_obj_str((o), "metadata", "resourceVersion")
#define kube_obj_uid(o) kube_obj_str((o), "metadata", "uid")

#endif
