/* The on-node cache views: what the agent writes for the CSI plugin, and what
 * the CSI plugin writes back for the agent. Both daemons run on the same node
 * and never talk to each other directly; these files are the whole contract.
 *
 * Written by the agent, under the store root (--root, /var/lib/gkm):
 *
 *   <root>/store/sha256/<hex>/            one extracted image tree per digest,
 *                                         immutable once renamed into place
 *   <root>/caches/<scope>/<name>/         one view per cache the node knows
 *       data        relative symlink to the store entry of the cache's digest,
 *                   e.g. "../../../store/sha256/<hex>"; only while the cache is
 *                   (or was, and a pod still uses it) extracted here
 *       ready.json  the agent's record of the cache on this node, in every
 *                   state (the state and reason of its node status entry),
 *                   so that the CSI plugin can say why it does not mount:
 *         {"digest": "sha256:<hex>",      the image digest; required when
 *                                          Ready, absent while unresolved
 *          "state": "Ready",              required; only "Ready" is mounted
 *                                          (others: Pending, Pulling, Failed,
 *                                          Incompatible, Deleting)
 *          "compatible": true,            required; false: no GPU here can use it
 *          "compatibleGPUs": ["GPU-..."], optional, GPU ids that can use it
 *          "reason": "", "message": "",   optional, why not ready / incompatible
 *          "updated": "RFC3339"}          optional, when the agent wrote it
 *         Unknown members are ignored (newer agents may add some).
 *         A record says Ready only when cache_view_publish() wrote it, after
 *         the data link; cache_view_record() writes every other state and
 *         refuses Ready, so no record can make a cache mountable without
 *         its data in place.
 *
 *       capture     present (empty) while the cache captures what pods wrote
 *                   (spec.capture, on pod exit): the CSI plugin then hands
 *                   the upper layer of each writable volume it unpublishes
 *                   to the agent instead of deleting it:
 *   <root>/captures/<scope>/<name>/<key>.<seconds>/   one handed-over volume
 *       upper/      the overlay's upper layer: what the pod added or changed
 *       pod.json    {"name", "namespace", "uid", "node"} of the pod
 *                   The agent packages it as a candidate image and removes it.
 *
 *   <scope> is the namespace of a GKMCache, or "_cluster" for a
 *   ClusterGKMCache ("_" can never start a namespace: namespaces are DNS
 *   labels). <name> is the cache's object name (a DNS-1123 subdomain).
 *
 *   Update order (cache_view_publish() does it): the store entry exists
 *   first; then `data` is replaced atomically (symlink + rename), then
 *   ready.json (write, rename; fsync'd when it replaces a Ready record). A
 *   reader that finds `data` pointing at another digest than ready.json
 *   names is looking at an update in flight and must retry later; it never
 *   mounts anything but the store entry of the digest ready.json names.
 *   Removal (cache_view_unpublish()) deletes ready.json first, so a view
 *   disappears atomically for readers.
 *
 * Written by the CSI plugin, under the run directory (--run-dir, /run/gkm):
 *
 *   <run-dir>/usage/<scope>/<name>/usage.json   pods using the cache here:
 *     {"namespace": "ns" | "", "name": "cache",
 *      "pods": [{"name", "namespace", "uid", "volumeId", "targetPath",
 *                "digest", "readOnly": bool, "started": "RFC3339",
 *                "fallback": {"state", "reason", "message"}}],
 *      "updated": "RFC3339"}
 *
 *   "fallback" (optional) marks a volume that asked for onMiss "empty" and
 *   got an empty directory because the cache was not usable here when it
 *   was published: the state and reason of the node's record ("Unknown" and
 *   NotOnNode without one) and the sentence a refused mount would have
 *   shown. Such a volume uses nothing of the cache ("digest" is "").
 *
 *   <run-dir>/usage/<scope>/<name>/wanted      an empty file whose
 *     modification time is when a publish last asked for the cache while
 *     the agent's record said Evicted (it was taken out of the store to
 *     free space): the agent pulls it again (cache_view_want()).
 *
 *   The agent's in-use guard (cache_view_in_use(), cache_view_digest_in_use())
 *   keeps a cache and its store entry while any pod uses them (fallback
 *   volumes do not); the agent reports the pod list in node status
 *   (cache_view_usage_list()).
 *
 * Every file here is written atomically (temp file in the same directory,
 * fsync, rename, fsync of the directory), so a reader sees the old or the new
 * content, never a torn one, and a crash loses at most the last update. The
 * one exception is a ready.json that replaces a record not saying Ready (or
 * none): it is not fsync'd, since losing it leaves a record the CSI plugin
 * refuses (not Ready, none, or empty) until the agent writes it again.
 *
 * Everything read from these files or from API attributes is untrusted:
 * names are validated before they become path components, sizes and counts
 * are bounded, and `data` must resolve to the store entry of the digest.
 */
#ifndef GKM_CACHE_VIEW_H
#define GKM_CACHE_VIEW_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define CACHE_VIEW_CLUSTER "_cluster"
#define CACHE_VIEW_READY "ready.json"
#define CACHE_VIEW_DATA "data"
#define CACHE_VIEW_USAGE "usage.json"
#define CACHE_VIEW_WANTED "wanted"

enum {
	CACHE_VIEW_NAMESPACE_MAX = 63, /* DNS-1123 label */
	CACHE_VIEW_NAME_MAX = 253,     /* DNS-1123 subdomain */
	CACHE_VIEW_DIGEST_LEN = 71,    /* "sha256:" + 64 hex */
	CACHE_VIEW_READY_MAX = 64 * 1024,
	CACHE_VIEW_GPUS_MAX = 256,
	CACHE_VIEW_USAGE_MAX = 8 * 1024 * 1024,
	CACHE_VIEW_PODS_MAX = 8192,
	CACHE_VIEW_FINISHED_MAX = 16,
};

/* Kubernetes name rules (lower-case alphanumerics and '-', plus '.' between
 * labels for names). They also rule out "", ".", "..", "/" and "_cluster". */
bool cache_view_valid_namespace(const char *s);
bool cache_view_valid_name(const char *s);
/* "sha256:" followed by exactly 64 lower-case hex digits. */
bool cache_view_valid_digest(const char *s);

/* ns NULL or "" means cluster-scoped. Writes "<base>/<sub>/<scope>/<name>"
 * into buf; -EINVAL for an invalid ns or name, -ENAMETOOLONG. */
__attribute__((warn_unused_result)) int cache_view_dir(char *buf, size_t size, const char *base,
                                                       const char *sub, const char *ns,
                                                       const char *name);

/* ---- ready.json ---- */

struct cache_view_ready {
	char digest[CACHE_VIEW_DIGEST_LEN + 1]; /* "" in a record without one */
	char state[32];
	bool compatible;
	char **compatible_gpus; /* owned */
	size_t ncompatible_gpus;
	char *reason;  /* owned, "" when absent */
	char *message; /* owned, "" when absent */
	char updated[40];
	/* the fingerprint of the trusted key that verified the digest ("" when
	 * nothing was verified): a Ready view whose key is no longer trusted is
	 * verified again */
	char verified_by[80];
};

/* Parse ready.json text. On failure returns -EINVAL (or -ENOMEM, -EFBIG) and
 * writes a one-line reason into err (may be NULL); *out is untouched. On
 * success the caller frees *out with cache_view_ready_free(). */
__attribute__((warn_unused_result)) int cache_view_ready_parse(const char *json, size_t len,
                                                               struct cache_view_ready *out,
                                                               char *err, size_t errlen);
void cache_view_ready_free(struct cache_view_ready *r);

/* Read <root>/caches/<scope>/<name>/ready.json. -ENOENT when the cache has
 * no view on this node; parse errors as above. */
__attribute__((warn_unused_result)) int cache_view_ready_read(const char *root, const char *ns,
                                                              const char *name,
                                                              struct cache_view_ready *out,
                                                              char *err, size_t errlen);

/* Open the store entry the view's `data` link names, checking that it
 * resolves to <root>/store/sha256/<hex of digest> and nothing else.
 * On success *fd is an O_PATH directory descriptor of the entry (caller
 * closes) and *path its canonical path (caller frees). Errors, with a reason
 * in err: -ENOENT (no data link, or the store entry is missing), -EINVAL
 * (data is not a symlink, or bad arguments), -EXDEV (it resolves outside the
 * store), -ESTALE (it names another digest than `digest`: update in flight),
 * -ENOTDIR (the entry is not a directory). */
__attribute__((warn_unused_result)) int cache_view_open_data(const char *root, const char *ns,
                                                             const char *name, const char *digest,
                                                             int *fd, char **path, char *err,
                                                             size_t errlen);

/* Agent side: make the view of (ns, name) point at the store entry of
 * r->digest (which must exist) and write ready.json, in the documented order. */
__attribute__((warn_unused_result)) int cache_view_publish(const char *root, const char *ns,
                                                           const char *name,
                                                           const struct cache_view_ready *r);
/* Agent side: write ready.json with a state other than Ready (r->digest may
 * be "" while unresolved), leaving `data` as it is: the cache is then not
 * mountable, whatever `data` links to. -EINVAL for a Ready record. */
__attribute__((warn_unused_result)) int cache_view_record(const char *root, const char *ns,
                                                          const char *name,
                                                          const struct cache_view_ready *r);
/* The digest the view's `data` link names ("sha256:<hex>" into out), read
 * from the link itself. -ENOENT when there is no link, -EINVAL when it is
 * not a link into the store. */
__attribute__((warn_unused_result)) int
cache_view_linked_digest(const char *root, const char *ns, const char *name,
                         char out[CACHE_VIEW_DIGEST_LEN + 1]);
/* Agent side: remove the view (ready.json first). 0 also when it was gone. */
__attribute__((warn_unused_result)) int cache_view_unpublish(const char *root, const char *ns,
                                                             const char *name);

/* ---- captures (spec.capture) ---- */

#define CACHE_VIEW_CAPTURE "capture"
#define CACHE_VIEW_CAPTURES "captures"

/* Agent side: mark the view of (ns, name) as capturing (on) or not; the
 * view directory is created when missing. Writes only what changes. */
__attribute__((warn_unused_result)) int cache_view_capture_set(const char *root, const char *ns,
                                                               const char *name, bool on);
/* CSI side: whether the view of (ns, name) is marked as capturing. */
bool cache_view_capture_on(const char *root, const char *ns, const char *name);
/* CSI side: hand the private directory vdir of an unpublished writable
 * volume (its upper/ inside) to the agent: pod.json is written into it
 * (pod_json, one JSON object), then it is renamed to
 * <root>/captures/<scope>/<name>/<key>.<now>. 0, or -errno (vdir is then
 * left where it was, for the caller to remove). */
__attribute__((warn_unused_result)) int
cache_view_capture_handover(const char *root, const char *ns, const char *name, const char *key,
                            const char *vdir, const char *pod_json);

/* ---- usage.json ---- */

struct cache_view_pod {
	char *name; /* all strings owned */
	char *namespace;
	char *uid;
	char *volume_id;
	char *target_path;
	char *digest;
	bool read_only;
	time_t started;
	bool fallback; /* an empty directory instead of the cache; the strings say why */
	char *fallback_state, *fallback_reason, *fallback_message; /* "" when not */
};

struct cache_view_usage {
	char *namespace; /* owned; "" for a cluster-scoped cache */
	char *name;      /* owned */
	struct cache_view_pod *pods;
	size_t npods;
	/* the pods whose volumes were unpublished, newest last (at most
	 * CACHE_VIEW_FINISHED_MAX): {podName, podNamespace, podUID, volumeId,
	 * finished, and what cache_view_usage_finish() was given}; NULL when
	 * none. Owned. */
	cJSON *finished;
};

/* Read the usage of one cache. A cache nobody uses (no file) reads as 0 pods.
 * Caller frees with cache_view_usage_free(). -EINVAL for a malformed file. */
__attribute__((warn_unused_result)) int cache_view_usage_read(const char *run_dir, const char *ns,
                                                              const char *name,
                                                              struct cache_view_usage *out);
void cache_view_usage_free(struct cache_view_usage *u);

/* Add (or replace, keyed by volume id) one pod entry / remove one. Safe
 * against concurrent callers in this and other processes (flock on the
 * cache's usage directory). remove returns 0 when the entry was not there. */
__attribute__((warn_unused_result)) int cache_view_usage_add(const char *run_dir, const char *ns,
                                                             const char *name,
                                                             const struct cache_view_pod *pod);
__attribute__((warn_unused_result)) int cache_view_usage_remove(const char *run_dir, const char *ns,
                                                                const char *name,
                                                                const char *volume_id);

/* Remove the entry of volume_id and keep record (an object the caller
 * keeps) among the finished pods, stamped with the time. */
__attribute__((warn_unused_result)) int cache_view_usage_finish(const char *run_dir, const char *ns,
                                                                const char *name,
                                                                const char *volume_id,
                                                                const cJSON *record);

/* Which version of (ns, name)'s usage file is there now: writers replace the
 * file whole (a new inode each time), so a different stamp means it was
 * written since. All zero when there is no file. One stat, nothing parsed. */
struct cache_view_usage_stamp {
	uint64_t dev, ino, mtime_ns, size;
};
__attribute__((warn_unused_result)) int cache_view_usage_stamp(const char *run_dir, const char *ns,
                                                               const char *name,
                                                               struct cache_view_usage_stamp *out);

/* In-use guard: number of pods using (ns, name) on this node (fallback
 * volumes are not counted). */
__attribute__((warn_unused_result)) int cache_view_in_use(const char *run_dir, const char *ns,
                                                          const char *name, size_t *pods);
/* In-use guard for store entries: does any pod use a view of this digest? */
__attribute__((warn_unused_result)) int cache_view_digest_in_use(const char *run_dir,
                                                                 const char *digest, bool *used);
/* Every cache with a usage file (including ones with 0 pods), for node
 * status. Caller frees with cache_view_usage_list_free(). Malformed files
 * are skipped (and logged), so one bad file does not hide the others. */
__attribute__((warn_unused_result)) int
cache_view_usage_list(const char *run_dir, struct cache_view_usage **out, size_t *n);
void cache_view_usage_list_free(struct cache_view_usage *list, size_t n);

/* ---- asks for an evicted cache ---- */

/* A pod asked for (ns, name) now: create or touch its "wanted" file. */
__attribute__((warn_unused_result)) int cache_view_want(const char *run_dir, const char *ns,
                                                        const char *name);
/* When (ns, name) was last asked for: 0 and *at (unix seconds); -ENOENT
 * when it never was. */
__attribute__((warn_unused_result)) int cache_view_wanted_at(const char *run_dir, const char *ns,
                                                             const char *name, int64_t *at);

/* ---- time stamps as the files above write them ---- */

/* RFC 3339 UTC ("2024-05-01T12:00:00Z") into buf (>= 21 bytes). */
void cache_view_rfc3339(time_t t, char *buf, size_t size);
/* Parse what cache_view_rfc3339 writes; -EINVAL otherwise. */
__attribute__((warn_unused_result)) int cache_view_parse_rfc3339(const char *s, time_t *out);

#endif
