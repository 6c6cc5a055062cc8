/* Which pull Secrets the node agents may read. The agents' ClusterRole
 * reads no Secret; the operator keeps, in each namespace where caches name
 * pull Secrets (a GKMCache's own namespace, gkm's for a ClusterGKMCache),
 * a Role that may `get` exactly those Secrets by name, bound to the agents'
 * ServiceAccount. A compromised node then reads what caches name, never
 * every Secret of the cluster. The Role goes when no cache there names a
 * Secret any more (a rule with no resourceNames would allow every name, so
 * none is ever written). Roles of namespaces no cache needs are found by
 * their label and removed once every cache was seen.
 * Loop thread; the API calls run as worker jobs. */
#ifndef GKM_SECRET_GRANTS_H
#define GKM_SECRET_GRANTS_H

#include <cjson/cJSON.h>

#include "objstore.h"
#include "workers.h"

#define SECRET_GRANTS_NAME "gkm-agent-pull-secrets"
#define SECRET_GRANTS_LABEL "gkm.io/agent-pull-secrets"

struct secret_grants;

/* agent_sa: the agents' ServiceAccount "namespace/name"; home: gkm's
 * namespace (where a ClusterGKMCache's Secrets are; NULL: as
 * pull_secret_home()). Starts the watch of
 * the Roles it made. -EINVAL for an agent_sa that is not NS/NAME. */
__attribute__((warn_unused_result)) int secret_grants_new(struct workers *w, struct objstore *os,
                                                          const char *manager, const char *agent_sa,
                                                          const char *home,
                                                          struct secret_grants **out);
void secret_grants_free(struct secret_grants *g);

/* The cache (key as the operator keys it) as it is now, NULL when deleted. */
void secret_grants_cache(struct secret_grants *g, const char *key, const cJSON *cache);
/* Every cache has been seen: Roles no cache needs are removed from now on. */
void secret_grants_caches_known(struct secret_grants *g);
/* Apply every Role again (hand edits), at the operator's resync. */
void secret_grants_resync(struct secret_grants *g);

#endif
