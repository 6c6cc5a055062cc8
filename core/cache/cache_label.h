/* The Node label that says "cache X is Ready on this node", the one scheme
 * the operator (which sets the labels), the admission webhook (which steers
 * pods to them with node affinity) and the CLI share:
 *
 *   GKMCache NS/NAME      ->  NS.gkmcache.gkm.io/NAME-PART
 *   ClusterGKMCache NAME  ->  clustergkmcache.gkm.io/NAME-PART
 *   value                 ->  ready
 *
 * A namespace is a DNS label (at most 63 characters), so the prefix is a
 * valid DNS subdomain. The name part of a label key is at most 63
 * characters: a cache name (a DNS subdomain of up to 253) that fits is used
 * as it is; a longer one becomes its first 46 characters, trailing '-' and
 * '.' trimmed, then '-' and the first 16 hex digits of sha256(name), so
 * distinct long names keep distinct keys. */
#ifndef GKM_CACHE_LABEL_H
#define GKM_CACHE_LABEL_H

#include <stddef.h>

#define CACHE_LABEL_VALUE "ready"
#define CACHE_LABEL_NAME_MAX 63
/* 63 (namespace) + ".gkmcache.gkm.io/" + 63 + NUL, rounded up */
#define CACHE_LABEL_KEY_MAX 160

/* The label key of the cache ns/name; ns NULL or "" for a ClusterGKMCache.
 * 0, or -EINVAL when ns is not a DNS label or name not a DNS subdomain
 * (nothing a cluster would store), -ENOSPC when cap is smaller than
 * CACHE_LABEL_KEY_MAX. out is written only on success. */
__attribute__((warn_unused_result)) int cache_label_key(const char *ns, const char *name, char *out,
                                                        size_t cap);

#endif
