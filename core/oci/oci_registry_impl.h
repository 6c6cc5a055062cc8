/* The registry client's parts (private to core/oci/oci_registry*.c): the
 * client's state, one HTTP exchange, and the calls one part makes into
 * another (named reg_*). oci_registry.h is the interface; this is not.
 *
 *   oci_registry.c          the client (options, credentials, new, free) and
 *                           the routing of each call through the mirrors
 *   oci_registry_http.c     one exchange over libcurl, errors and retries,
 *                           the request to the registry (auth, scheme, retries)
 *   oci_registry_auth.c     tokens and challenges (Basic, Bearer, refresh)
 *   oci_registry_manifest.c manifests: resolve, fetch, push; referrers
 *   oci_registry_blob.c     blobs: streams that resume, HEAD, uploads */
#ifndef GKM_OCI_REGISTRY_IMPL_H
#define GKM_OCI_REGISTRY_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <curl/curl.h>

#include "oci_auth.h"
#include "oci_mirrors.h"
#include "oci_registry.h"

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
#define UPLOAD_BUF (1u << 20)
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

/* oci_registry_http.c */
void reg_xfer_free(struct xfer *x);
void reg_xfer_drive(struct xfer *x, bool until_data);
int reg_cc_errno(CURLcode cc);
bool reg_cc_retryable(CURLcode cc);
bool reg_status_retryable(long s);
int reg_status_errno(long s);
void reg_describe_cc(const struct oci_registry *r, const struct xfer *x, const char *method,
                     const char *url, struct oci_err *err);
void reg_describe_status(const struct xfer *x, const char *method, const char *url,
                         struct oci_err *err);
void reg_backoff(struct oci_registry *r, unsigned attempt, const char *retry_after);
int reg_run_simple(struct oci_registry *r, const struct req *q, struct xfer **out,
                   struct oci_err *err);
int reg_build_url(const struct oci_registry *r, char *url, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int reg_request(struct oci_registry *r, struct req *q, char *url, size_t url_cap, const char *scope,
                struct xfer **out, struct oci_err *err);
void reg_pull_scope(char *buf, size_t cap, const char *repo);
void reg_push_scope(char *buf, size_t cap, const char *repo);

/* oci_registry_auth.c */
int reg_auth_for(struct oci_registry *r, const char *scope, char **out, struct oci_err *err);
int reg_on_unauthorized(struct oci_registry *r, const struct xfer *x, const char *scope,
                        bool sent_auth, struct oci_err *err);

/* oci_registry_manifest.c */
bool reg_is_digest_ref(const char *reference);
int reg_resolve_at(struct oci_registry *r, const char *repo, const char *reference,
                   struct oci_desc *out, struct oci_err *err);
int reg_get_manifest_at(struct oci_registry *r, const char *repo, const char *reference,
                        struct oci_fetched *out, struct oci_err *err);
int reg_referrers_at(struct oci_registry *r, const char *repo, const char *digest,
                     const char *artifact_type, struct oci_index *out, struct oci_err *err);

/* oci_registry_blob.c */
int reg_blob_open_at(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                     const char *what, struct oci_blob_reader **out, struct oci_err *err);
int reg_blob_readable_at(struct oci_registry *c, const char *repo, const struct oci_desc *d,
                         struct oci_err *err);

/* oci_registry.c */
void reg_refuse(struct oci_registry *front, const char *host, const char *digest, const char *why);

#endif
