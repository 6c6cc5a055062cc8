/* A client for the OCI distribution API over libcurl.
 *
 * One client per registry host; it keeps connections open between requests
 * (the multi handle's connection cache), remembers how the registry wants to
 * be authenticated, and caches bearer tokens per scope until they expire.
 *
 * - Accept sends the OCI and Docker manifest and index types.
 * - Tags resolve to digests with HEAD and Docker-Content-Digest; a manifest
 *   fetched by tag is checked against the header, one fetched by digest
 *   against the digest (a registry that lies is caught either way).
 * - Blobs stream through oci_blob_reader: SHA-256 checked while reading, a
 *   connection cut mid-blob resumes with a Range request.
 * - Anonymous, Basic and Bearer (WWW-Authenticate challenge, token endpoint,
 *   OAuth2 refresh tokens from `identitytoken`) authentication; credentials
 *   from a dockerconfigjson file, a Secret document or explicit user/password.
 * - Retries with exponential backoff and jitter on 5xx, 429, resets and
 *   timeouts; every request has a connect timeout and a stall timeout (no
 *   bytes for that long), small requests also a total timeout; manifests,
 *   configs, token answers and error bodies are size-capped.
 * - Push: blob upload (POST then monolithic PUT, or chunked PATCHes when
 *   asked or when the registry refuses a large PUT), manifest PUT.
 * - The OCI 1.1 referrers API, with artifactType filtering applied by the
 *   client when the registry does not.
 *
 * Mirrors (oci_mirrors.h): with opts.hosts_dir or opts.registries_conf,
 * reads go where the node's container runtime would send them: manifests by
 * digest and blobs to the mirrors that may pull, tags to those that may
 * resolve, the origin last. Anything a mirror sends is checked as the
 * origin's would be; a mirror that fails, lacks the content or sends other
 * bytes is passed over (logged) for the next. Credentials for a mirror are
 * looked up under the mirror's host in the same sources. Pushes go to the
 * host itself.
 *
 * HTTPS by default. Hosts named in opts.plain_http speak plain HTTP; a
 * loopback host (localhost, 127.0.0.0/8, ::1) that answers a TLS handshake
 * with plain HTTP falls back to HTTP, as docker and containerd do.
 * A client is not thread-safe: use one per thread. */
#ifndef GKM_OCI_REGISTRY_H
#define GKM_OCI_REGISTRY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "oci_blob.h"
#include "oci_err.h"
#include "oci_image.h"

struct oci_registry_opts {
	/* Credentials, first match wins: username/password; auth_json (a
	 * dockerconfigjson document or a whole Secret); auth_file; then
	 * $REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json,
	 * $DOCKER_CONFIG/config.json or ~/.docker/config.json. */
	const char *username, *password;
	const char *auth_json;
	const char *auth_source; /* names auth_json in messages ("Secret ns/name") */
	const char *auth_file;
	bool no_default_auth_files;  /* daemons: only what was configured */
	const char *plain_http;      /* "host[:port],..." or "*" */
	const char *ca_file;         /* extra CA bundle for TLS */
	const char *hosts_dir;       /* containerd hosts directory (certs.d), or NULL */
	const char *registries_conf; /* containers-registries.conf v2 file, or NULL */
	bool tls_no_verify;
	unsigned connect_timeout_s; /* default 10 */
	unsigned stall_timeout_s;   /* abort when no byte moved for this long; default 30 */
	unsigned request_timeout_s; /* whole small request (manifest, token...); default 120 */
	unsigned retries;           /* extra attempts after the first; default 4 */
	unsigned resumes;           /* a cut blob transfer is resumed this often; default 4 */
	unsigned backoff_ms;        /* first backoff; doubles, with jitter; default 250 */
	size_t max_manifest_bytes;  /* default 4 MiB */
	size_t chunk_size;          /* >0: upload blobs in chunks of this size */
	/* non-NULL: once it reads true (set from any thread), every transfer
	 * ends within a second with -ECANCELED and nothing is retried */
	const atomic_bool *cancel;
};

/* Fill defaults (everything zero/NULL except the numbers above). */
void oci_registry_opts_init(struct oci_registry_opts *o);

struct oci_registry;

/* host is the API host ("quay.io", "127.0.0.1:5000", "registry-1.docker.io").
 * Strings in opts are copied. -EINVAL with err naming the file and line when
 * the mirror configuration that applies to host is malformed. Caller frees
 * with oci_registry_free(). */
__attribute__((warn_unused_result)) int oci_registry_new(const char *host,
                                                         const struct oci_registry_opts *opts,
                                                         struct oci_registry **out,
                                                         struct oci_err *err);
void oci_registry_free(struct oci_registry *r);

/* Bytes of a manifest (or index) with what the registry said about them. */
struct oci_fetched {
	char *data; /* malloc'd, NUL-terminated */
	size_t len;
	char *media_type;
	char digest[OCI_DIGEST_MAX];
};
void oci_fetched_clear(struct oci_fetched *f);

/* HEAD a manifest: out gets media type, digest and size. Registries that
 * send no Docker-Content-Digest are answered with a GET and a hash.
 * -ENOENT when the tag or digest does not exist. */
__attribute__((warn_unused_result)) int
oci_registry_resolve(struct oci_registry *r, const char *repo, const char *reference,
                     struct oci_desc *out, struct oci_err *err);

/* GET a manifest or index by tag or digest, verified (see above). */
__attribute__((warn_unused_result)) int
oci_registry_get_manifest(struct oci_registry *r, const char *repo, const char *reference,
                          struct oci_fetched *out, struct oci_err *err);

/* Open a blob for streaming. The reader stays usable until oci_blob_close();
 * the client must outlive it. what names the blob in messages. A blob read
 * from a mirror that turns out wrong (digest, size) or breaks fails with
 * -ESTALE: the mirror is then passed over for that digest by this client,
 * so opening the blob again reads it from the next source. */
__attribute__((warn_unused_result)) int
oci_registry_blob_open(struct oci_registry *r, const char *repo, const struct oci_desc *d,
                       const char *what, struct oci_blob_reader **out, struct oci_err *err);

/* The blob d is served to these credentials from repo's sources (mirrors
 * first, as a pull goes; a HEAD, nothing downloaded): 0, -ENOENT, or the
 * registry's refusal (-EACCES ...). */
__attribute__((warn_unused_result)) int oci_registry_blob_readable(struct oci_registry *r,
                                                                   const char *repo,
                                                                   const struct oci_desc *d,
                                                                   struct oci_err *err);
__attribute__((warn_unused_result)) int oci_registry_blob_exists(struct oci_registry *r,
                                                                 const char *repo,
                                                                 const char *digest, bool *exists,
                                                                 struct oci_err *err);

/* Upload a blob whose digest and size are known, from a file descriptor
 * (read with pread from offset 0, so it may be retried) or from memory
 * (fd < 0). Skips the upload when the registry already has it. */
__attribute__((warn_unused_result)) int
oci_registry_push_blob(struct oci_registry *r, const char *repo, int fd, const void *mem,
                       const struct oci_desc *d, struct oci_err *err);

/* PUT a manifest under reference (a tag, or its own digest). digest_out
 * (may be NULL) receives the digest of the bytes; subject_ack (may be
 * NULL) is set when the registry answered with OCI-Subject (it indexes
 * referrers itself). */
__attribute__((warn_unused_result)) int
oci_registry_put_manifest(struct oci_registry *r, const char *repo, const char *reference,
                          const char *media_type, const char *data, size_t len,
                          char digest_out[OCI_DIGEST_MAX], bool *subject_ack, struct oci_err *err);

/* GET /v2/<repo>/referrers/<digest>[?artifactType=]: an index whose
 * entries, when artifact_type is given, all have that type (filtered here
 * when the registry did not). -EOPNOTSUPP when the registry has no
 * referrers API (then use the "sha256-<hex>" tag index). */
__attribute__((warn_unused_result)) int
oci_registry_referrers(struct oci_registry *r, const char *repo, const char *digest,
                       const char *artifact_type, struct oci_index *out, struct oci_err *err);

/* Blobs mirrors were passed over for since the client was made (a caller
 * that saw -ESTALE and opens again knows the next try goes elsewhere). */
unsigned oci_registry_mirror_refusals(const struct oci_registry *r);

/* "https" or "http", whichever the client speaks to its host now. */
const char *oci_registry_scheme(const struct oci_registry *r);

#endif
