/* The placement webhook's view of the caches: every GKMCache and
 * ClusterGKMCache as the informers report them, reduced to what admission
 * needs (the image, the digest recorded for it, where the cache is Ready,
 * its Node label). Fed on the loop thread by the watches' events and read
 * there by the reviews; no locks, no I/O. */
#ifndef GKM_CACHE_CATALOG_H
#define GKM_CACHE_CATALOG_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "cache_env.h"
#include "cache_label.h"
#include "oci_digest.h"
#include "oci_ref.h"
#include "strmap.h"

struct catalog_cache {
	bool cluster;       /* a ClusterGKMCache */
	char *key;          /* "ns/name" or "name": the map key */
	char *ns, *name;    /* ns "" for a ClusterGKMCache */
	char *uid;          /* for Events about it ("" when unknown) */
	char *image;        /* spec.image as written ("" when absent) */
	struct oci_ref ref; /* spec.image parsed; ref.repository NULL when it does not parse */
	char *repo;         /* "registry/repository", NULL when spec.image does not parse */
	/* what the nodes pull: annotation gkm.io/resolvedDigest, else
	 * status.resolvedDigest, else the digest in spec.image; "" when none */
	char digest[OCI_DIGEST_MAX];
	long ready_nodes, total_nodes;   /* status; 0 when absent */
	bool ready;                      /* condition Ready is True */
	char label[CACHE_LABEL_KEY_MAX]; /* its Node label key */
	/* the variables a pod needs to read it (core/cache/cache_env.h):
	 * spec.runtimeEnv.variables when given, else annotation
	 * gkm.io/runtime-env; env_known false when neither says */
	bool env_known;
	size_t nenv;
	struct cache_env_tree env[CACHE_ENV_TREES_MAX];
	char **env_containers;       /* spec.runtimeEnv.containers, NULL-terminated; NULL: all */
	cJSON *identity;             /* annotation gkm.io/runtime-identity, parsed (NULL: none) */
	char *claim_ns, *claim_name; /* spec.claim: the PVC pods name (NULL without one) */
};

struct cache_catalog {
	struct strmap caches[2]; /* [0] GKMCaches by "ns/name", [1] ClusterGKMCaches by name */
};

void cache_catalog_init(struct cache_catalog *c);
void cache_catalog_clear(struct cache_catalog *c);

/* Add or replace the cache obj describes (cluster: a ClusterGKMCache). 0,
 * -EINVAL for an object without a usable name (ignored), -ENOMEM (the
 * catalog keeps what it had). */
__attribute__((warn_unused_result)) int cache_catalog_put(struct cache_catalog *c, bool cluster,
                                                          const cJSON *obj);
/* Forget the cache obj names (only metadata.name and .namespace are read). */
void cache_catalog_remove(struct cache_catalog *c, bool cluster, const cJSON *obj);
size_t cache_catalog_len(const struct cache_catalog *c);

/* The GKMCache ns/name, or with ns NULL or "" the ClusterGKMCache name;
 * NULL when unknown. Borrowed until the next put or remove. */
const struct catalog_cache *cache_catalog_get(const struct cache_catalog *c, const char *ns,
                                              const char *name);

/* The cache an image reference names for a pod of namespace ns: a cache
 * whose spec.image has the same registry and repository, a GKMCache of ns
 * before a ClusterGKMCache, one whose tag or digest matches the reference
 * before one that only shares the repository, then the first by name. NULL
 * when no cache has that repository. */
const struct catalog_cache *cache_catalog_find_image(const struct cache_catalog *c, const char *ns,
                                                     const struct oci_ref *ref);

/* The cache whose spec.claim is the PersistentVolumeClaim ns/claim; NULL
 * when none is. */
const struct catalog_cache *cache_catalog_find_claim(const struct cache_catalog *c, const char *ns,
                                                     const char *claim);

#endif
