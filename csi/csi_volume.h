/* Per-volume state of the CSI plugin: one JSON file per published volume,
 * <run-dir>/volumes/<volume-id>.json, written atomically before anything is
 * mounted and removed after everything is undone, so that a plugin killed at
 * any point finds on restart every volume it may have mounted:
 *
 *   {"volumeId", "targetPath", "cacheNamespace" ("" = ClusterGKMCache),
 *    "cacheName", "digest", "writable": bool,
 *    "pod": {"name", "namespace", "uid"}, "started": "RFC3339",
 *    "onMiss": "fail" | "empty", "podReadOnly": bool,
 *    "fallback": {"state", "reason", "message"}, "shared": bool,
 *    "sizeLimit": bytes (a writable layer's, csi_layer.h; absent: none)}
 *
 * A shared volume is one the kubelet may publish at several targets of this
 * node at once (a multi-node access mode: a ReadOnlyMany PersistentVolume
 * mounted by several pods); each publication has its own state file and
 * private directories, named by csi_volume_key(). The last four are optional (files of earlier
 * versions have none): a volume with "fallback" is an empty directory published because the cache
 * was not usable here (its "digest" is ""), see csi_node.h.
 */
#ifndef GKM_CSI_VOLUME_H
#define GKM_CSI_VOLUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

enum {
	CSI_VOLUME_ID_MAX = 128,
	CSI_VOLUME_KEY_MAX = CSI_VOLUME_ID_MAX + 17,
	CSI_VOLUME_STATE_MAX = 64 * 1024
};

struct csi_volume {
	char *volume_id; /* all strings owned */
	char *target_path;
	char *cache_namespace; /* "" for a cluster-scoped cache */
	char *cache_name;
	char *digest;
	char *pod_name;
	char *pod_namespace;
	char *pod_uid;
	bool writable;      /* the cache as a private overlay (else read-only) */
	bool empty_on_miss; /* onMiss "empty": a fallback directory where the cache is not usable */
	bool pod_read_only; /* the request's readonly: nothing may be written */
	bool shared;        /* published per target: see above */
	uint64_t size_limit; /* what the pod may write (csi_layer.h); 0: no limit */
	time_t started;
	/* Published as a fallback: the cache's state and reason on the node
	 * and the sentence a refused mount would give; all "" otherwise. */
	bool fallback;
	char *fallback_state, *fallback_reason, *fallback_message;
};

/* A volume id usable as a file name: 1-128 of [A-Za-z0-9._-], not starting
 * with '.'. */
bool csi_volume_valid_id(const char *id);

/* The name of one publication (state file, private directories, usage
 * entry): the volume id, or for a shared volume the id, '@' and 16 hex
 * digits of a hash of the target path. buf has CSI_VOLUME_KEY_MAX + 1 bytes. */
void csi_volume_key(const struct csi_volume *v, char *buf);
/* A name csi_volume_key() can give. */
bool csi_volume_valid_key(const char *key);

/* Same publish request (everything but the digest, start time and what was
 * published), for idempotent repeats. */
bool csi_volume_same(const struct csi_volume *a, const struct csi_volume *b);

/* Deep copy; dst is written only on success. */
__attribute__((warn_unused_result)) int csi_volume_copy(struct csi_volume *dst,
                                                        const struct csi_volume *src);
void csi_volume_clear(struct csi_volume *v);

/* dir is <run-dir>/volumes (created by save when missing). */
__attribute__((warn_unused_result)) int csi_volume_save(const char *dir,
                                                        const struct csi_volume *v);
/* 0 also when the file was already gone. */
__attribute__((warn_unused_result)) int csi_volume_remove(const char *dir,
                                                          const struct csi_volume *v);
/* Every readable state file; malformed ones are logged and left in place.
 * Caller frees with csi_volume_free_all(). */
__attribute__((warn_unused_result)) int csi_volume_load_all(const char *dir,
                                                            struct csi_volume **out, size_t *n);
void csi_volume_free_all(struct csi_volume *v, size_t n);

#endif
