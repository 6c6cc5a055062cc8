/* The registry credentials a cache names: GKMCache spec.pullSecrets (as a
 * pod's imagePullSecrets: [{name: ...}]) are kubernetes.io/dockerconfigjson
 * Secrets of the cache's namespace; a ClusterGKMCache's are in gkm's own
 * namespace. Each Secret is read by name (GET, never a list or a watch),
 * when a registry job of the cache starts, so that a changed Secret is used
 * at the next try.
 *
 * The Secret chosen is the first that holds credentials for the registry
 * host; when none does, the first that exists (a mirror's credentials may
 * be all it holds, or the registry lets anyone read). Blocking (worker
 * threads). */
#ifndef GKM_PULL_SECRET_H
#define GKM_PULL_SECRET_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "objstore.h"

#define PULL_SECRET_MAX 8

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
