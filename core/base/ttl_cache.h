/* A bounded map from string keys to small values that expire: the webhook's
 * tag resolutions (short-lived) and verification results (by digest and
 * key set), the agent's checks of a cache's source (by reference,
 * credentials and trust). Not thread-safe: the webhook uses it on its loop
 * thread only, the agent under a lock. When full, the least recently used
 * entry makes room. */
#ifndef GKM_TTL_CACHE_H
#define GKM_TTL_CACHE_H

#include <stddef.h>
#include <stdint.h>

struct ttl_cache;

/* max_entries > 0. Caller frees with ttl_cache_free(). */
__attribute__((warn_unused_result)) int ttl_cache_new(size_t max_entries, struct ttl_cache **out);
void ttl_cache_free(struct ttl_cache *c);

/* On a live hit copy the value (at most cap bytes) into val and return its
 * size; -ENOENT on a miss or an expired entry (which is dropped). */
long ttl_cache_get(struct ttl_cache *c, const char *key, uint64_t now_ms, void *val, size_t cap);

/* Insert or replace (key and value copied); expires at expires_ms.
 * 0 or -ENOMEM (the cache is unchanged then). */
__attribute__((warn_unused_result)) int ttl_cache_put(struct ttl_cache *c, const char *key,
                                                      const void *val, size_t len,
                                                      uint64_t expires_ms);

void ttl_cache_remove(struct ttl_cache *c, const char *key);
void ttl_cache_clear(struct ttl_cache *c);
size_t ttl_cache_count(const struct ttl_cache *c);

#endif
