/* What the node objects report, kept compact for the operator: for each
 * GKMCacheNode (namespace, node) and ClusterGKMCacheNode ("", node), the
 * entries of its status.caches. A thousand nodes report the same digests,
 * states, messages and GPU sets, so each entry is three interned strings:
 * the cache name, the entry without lastUpdated (compact JSON), and
 * lastUpdated. Lookups are hashed (node) and binary searched (cache).
 * One thread (the operator's loop). */
#ifndef GKM_NODE_REPORTS_H
#define GKM_NODE_REPORTS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

struct node_reports;

/* A cache whose entry on a node was added, changed or removed. */
typedef void (*node_reports_changed_fn)(const char *ns, const char *cache, void *ud);

__attribute__((warn_unused_result)) int node_reports_new(struct node_reports **out);
void node_reports_free(struct node_reports *r); /* NULL: no-op */

/* Replace what node object (ns, node) reports with caches (its
 * status.caches; NULL or not an object: no entries). changed (may be NULL)
 * hears of every entry that differs from before; *added (may be NULL) says
 * whether the node object was new. 0, -EINVAL (a name over 253 bytes) or
 * -ENOMEM; on error nothing changed. */
__attribute__((warn_unused_result)) int node_reports_set(struct node_reports *r, const char *ns,
                                                         const char *node, const cJSON *caches,
                                                         node_reports_changed_fn changed, void *ud,
                                                         bool *added);
/* Forget node object (ns, node); changed hears of each entry it had.
 * Whether it was known. */
bool node_reports_remove(struct node_reports *r, const char *ns, const char *node,
                         node_reports_changed_fn changed, void *ud);
bool node_reports_has(const struct node_reports *r, const char *ns, const char *node);

/* The entry node object (ns, node) reports for cache, as the agent wrote
 * it (a new object, caller frees), or NULL when it reports none. */
cJSON *node_reports_entry(const struct node_reports *r, const char *ns, const char *node,
                          const char *cache);

/* Every node object of namespace ns ("": the cluster-scoped ones; NULL:
 * all), in no particular order. fn must not change r. */
void node_reports_foreach(const struct node_reports *r, const char *ns,
                          void (*fn)(const char *ns, const char *node, void *ud), void *ud);

struct node_reports_stats {
	size_t objects, entries, strings, string_bytes;
};
void node_reports_stats(const struct node_reports *r, struct node_reports_stats *st);

#endif
