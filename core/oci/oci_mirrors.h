/* Registry mirrors as the node already configures them for its container
 * runtime, so that gkm pulls through the same mirrors and pull-through
 * caches as the node's images do:
 *
 * - containerd's hosts directory (`<dir>/<registry>/hosts.toml`, else
 *   `<dir>/_default/hosts.toml`): `server` (the origin), and `[host."URL"]`
 *   entries in file order with `capabilities` (pull, resolve, push; all
 *   three by default), `ca` (a file or a list; relative to the file's
 *   directory), `skip_verify` and `override_path` (URL's path is the API
 *   root itself, else "/v2" is appended). `client` and `header` are read
 *   but not used (a warning says so).
 * - containers-registries.conf v2: `[[registry]]` with `prefix` (default:
 *   `location`; "*.example.com" matches subdomains), `location`,
 *   `insecure`, `blocked`, `mirror-by-digest-only`, and `[[registry.mirror]]`
 *   with `location`, `insecure` and `pull-from-mirror` (all, digest-only,
 *   tag-only). The longest matching prefix applies; the matched part of
 *   "registry/repository" is replaced by each location.
 *
 * When a registry has a hosts.toml (its own or _default), it alone decides;
 * else registries.conf does; else the registry is reached directly.
 * Manifests by digest and blobs go to the mirrors that may pull, in order;
 * tags to those that may resolve (hosts.toml `resolve`, registries.conf
 * all/tag-only); the origin comes last. Unknown keys, wrong types and
 * values are errors naming the file and line, never ignored. */
#ifndef GKM_OCI_MIRRORS_H
#define GKM_OCI_MIRRORS_H

#include <stdbool.h>
#include <stddef.h>

#include "oci_err.h"

#define OCI_MIRRORS_MAX 8
#define OCI_MIRRORS_CA_MAX 4

/* One place to ask: a mirror or the origin. */
struct oci_endpoint {
	char host[256];   /* API host, "host[:port]" */
	char path[256];   /* API root, "/v2" unless override_path says otherwise */
	char repo[512];   /* the repository there */
	bool mirror;      /* false: the origin */
	bool plain_http;  /* an http:// URL */
	bool insecure;    /* registries.conf insecure: HTTP allowed, no certificate check */
	bool skip_verify; /* hosts.toml skip_verify */
	char ca[OCI_MIRRORS_CA_MAX][512]; /* CA bundles ("" unused) */
};

struct oci_route {
	struct oci_endpoint ep[OCI_MIRRORS_MAX + 1]; /* the origin last */
	size_t n;
};

struct oci_mirrors;

/* Read what applies to registry host ("docker.io" and its API host
 * "registry-1.docker.io" are the same) from hosts_dir and registries_conf
 * (either may be NULL; a directory or file that does not exist holds no
 * configuration). *out is NULL when nothing applies. -EINVAL with err
 * ("FILE:LINE: what") for a malformed file. Caller frees with
 * oci_mirrors_free(); immutable once loaded, so threads may share it. */
__attribute__((warn_unused_result)) int oci_mirrors_load(const char *hosts_dir,
                                                         const char *registries_conf,
                                                         const char *host, struct oci_mirrors **out,
                                                         struct oci_err *err);
void oci_mirrors_free(struct oci_mirrors *m);

/* Read every hosts.toml under hosts_dir and registries_conf (either may be
 * NULL), as a daemon does at start: 0, or the first error. */
__attribute__((warn_unused_result)) int
oci_mirrors_check(const char *hosts_dir, const char *registries_conf, struct oci_err *err);

/* Where to ask for repo of host (NULL m: the origin alone), for a
 * reference by digest or by tag. -EACCES with err when registries.conf
 * blocks it. */
__attribute__((warn_unused_result)) int oci_mirrors_route(const struct oci_mirrors *m,
                                                          const char *host, const char *repo,
                                                          bool by_digest, struct oci_route *out,
                                                          struct oci_err *err);

/* The file the configuration came from (borrowed). */
const char *oci_mirrors_file(const struct oci_mirrors *m);

#endif
