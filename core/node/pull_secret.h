/* The registry credentials a cache names: GKMCache spec.pullSecrets (as a
 * pod's imagePullSecrets: [{name: ...}]) are kubernetes.io/dockerconfigjson
 * Secrets of the cache's namespace; a ClusterGKMCache's are in gkm's own
 * namespace. Each Secret is read by name (GET, never a list or a watch),
 * when a registry job of the cache starts, so that a changed Secret is used
 * at the next try.
 *
 * A cache that names no Secret reads with the daemon's own credentials only
 * when it is a ClusterGKMCache or its namespace is one the operator of the
 * cluster lists (--global-credentials-namespaces); any other reads
 * anonymously, so that no tenant learns through gkm what only gkm's own
 * credentials may read.
 *
 * The Secret chosen is the first that holds credentials for the registry
 * host; when none does, the first that exists (a mirror's credentials may
 * be all it holds, or the registry lets anyone read). Blocking (worker
 * threads). */
#ifndef GKM_PULL_SECRET_H
#define GKM_PULL_SECRET_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "objstore.h"
#include "oci_registry.h"

#define PULL_SECRET_MAX 8

/* The Secrets a cache names, as a registry job takes them to its worker. */
struct pull_secret_ref {
	char ns[64];     /* the cache's namespace; gkm's for a ClusterGKMCache */
	char names[600]; /* "a,b"; "" for none: the daemon's own credentials, or none */
	char err[256];   /* why spec.pullSecrets cannot be read ("" when it can) */
	bool global;     /* without names: the daemon's own credentials serve it */
};

struct pull_secret {
	char *auth_json;  /* the Secret as JSON (oci_registry_opts.auth_json); NULL: none named */
	char source[384]; /* "Secret ns/name", for messages */
	char key[768];    /* names the credentials: "ns/name@resourceVersion" ("" for none) */
};

/* The names of obj's spec.pullSecrets, comma-separated, into buf. 0, or
 * -EINVAL with err for a malformed list (not [{name: ...}], a name that is
 * not a Secret name, more than PULL_SECRET_MAX). */
__attribute__((warn_unused_result)) int pull_secret_names(const cJSON *obj, char *buf, size_t len,
                                                          char *err, size_t errlen);

/* The Secrets cache (a GKMCache or ClusterGKMCache object) names; home is
 * gkm's namespace (NULL: $POD_NAMESPACE, else "gkm"); global lists the
 * namespaces whose caches the daemon's own credentials serve ("a,b"; "*":
 * every one; NULL or "": none but cluster-scoped caches). */
void pull_secret_ref_of(const cJSON *cache, const char *home, const char *global,
                        struct pull_secret_ref *out);
/* Why a cache reads with no credentials, in messages. */
#define PULL_SECRET_NONE_WHY                                                                       \
	"no credentials (no spec.pullSecrets, and the namespace is not one gkm's own "             \
	"credentials serve)"

/* A valid global list: "", "*" or namespace names separated by commas. */
bool pull_secret_global_valid(const char *list);
/* Whether namespace ns ("" for cluster-scoped) is one global lists. */
bool pull_secret_global(const char *global, const char *ns);

/* gkm's namespace, where a ClusterGKMCache's Secrets are: home, else
 * $POD_NAMESPACE, else "gkm". */
const char *pull_secret_home(const char *home);

/* Whether two caches read their images with the same credentials. */
bool pull_secret_ref_same(const struct pull_secret_ref *a, const struct pull_secret_ref *b);

/* The key (pull_secret.key) that pull_secret_opts() gives ref's credentials
 * when it needs no Secret to know it: "(anonymous)" for none, "" for the
 * daemon's own. false when ref names Secrets (their key carries the
 * resourceVersion read) or its list is malformed. */
bool pull_secret_ref_key(const struct pull_secret_ref *ref, const char **key);

/* The registry options of a registry job for a cache: base, with the
 * credentials of the Secret chosen for registry (the reference's registry
 * name) instead of the daemon's own when ref names any. ps keeps the
 * strings *out points to (clear it after the job). 0, or -EINVAL (a
 * malformed list) / pull_secret_read's -errno with err set. */
__attribute__((warn_unused_result)) int
pull_secret_opts(struct objstore *os, const struct pull_secret_ref *ref, const char *registry,
                 const struct oci_registry_opts *base, struct pull_secret *ps,
                 struct oci_registry_opts *out, char *err, size_t errlen);

/* Read the Secrets names ("a,b") of ns and choose one for host (see above).
 * names "": out empty, 0. -EACCES with err naming the Secrets when none of
 * them can be read (missing: that is what a user must fix) or one is not of
 * type kubernetes.io/dockerconfigjson; other -errno when the API server
 * fails. Caller clears out with pull_secret_clear(). */
__attribute__((warn_unused_result)) int pull_secret_read(struct objstore *os, const char *ns,
                                                         const char *names, const char *host,
                                                         struct pull_secret *out, char *err,
                                                         size_t errlen);
void pull_secret_clear(struct pull_secret *ps);

#endif
