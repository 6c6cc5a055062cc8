/* Captures in the cluster (spec.capture of a GKMCache or ClusterGKMCache):
 * the agent packages what pods wrote into their writable volumes of a
 * cache, as a candidate image on top of the cache's image. The CSI plugin
 * hands each unpublished volume's upper layer over (cache_view.h); the
 * agent runs `gkm cache capture --from` on it (the untrusted walk, the caps,
 * the check of the kernels against this node's GPUs, only the new layer
 * pushed, a fixed source date so that the same files give the same digest
 * on every node), never signs the result, records it for the node status
 * and removes the handed-over directory. Blocking parts run on a worker. */
#ifndef GKM_NODE_CAPTURE_H
#define GKM_NODE_CAPTURE_H

#include <limits.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "objstore.h"
#include "pull_secret.h"

#define NODE_CAPTURE_RECORDS 8 /* records kept per cache in the node status */

/* The repository spec.capture names (repo may be NULL); false when the
 * cache does not capture. */
bool node_capture_repository(const cJSON *cache, char *repo, size_t len);
/* Whether it captures each writable volume on pod exit (onPodExit not false). */
bool node_capture_on_exit(const cJSON *cache);
/* Whether a volume of a pod of namespace ns may be captured: a GKMCache's
 * own namespace; for a ClusterGKMCache (whose captures push with gkm's own
 * credentials) only the namespaces spec.capture.namespaces lists. */
bool node_capture_namespace_allowed(const cJSON *cache, const char *ns);

/* On demand: annotation gkm.io/capture; each new value asks for one capture
 * of the writable volumes live on the node. True (once per value, also
 * across restarts: the value is kept under root) when value is new.
 * *seen is the caller's copy of the value last handled: the file under
 * root is read only while it is NULL (after a start) and written only when
 * the value changes. */
#define NODE_CAPTURE_ANNOTATION "gkm.io/capture"
bool node_capture_demanded(const char *root, const char *ns, const char *name, const cJSON *cache,
                           char **seen);

/* The oldest volume handed over for (ns, name) under root, into path.
 * 0, or -ENOENT when there is none. */
int node_capture_pending(const char *root, const char *ns, const char *name, char *path,
                         size_t len);

/* Remove a handed-over directory (and log why). */
void node_capture_discard(const char *path, const char *why);

/* The records of a cache's captures on this node, kept under root so that
 * a restarted agent reports them again: load (NULL when none), save, and
 * forget (the cache is gone: its captures directory is removed). */
cJSON *node_capture_records_load(const char *root, const char *ns, const char *name);
void node_capture_records_save(const char *root, const char *ns, const char *name,
                               const cJSON *records);
void node_capture_forget(const char *root, const char *ns, const char *name);

struct node_capture {
	/* in, set on the loop thread */
	char dir[PATH_MAX];  /* the handed-over directory (removed by the run), or a live
	                        volume's (left alone) */
	bool live;           /* dir is a live volume's: its pod is pod */
	cJSON *pod;          /* owned: {name, namespace, uid, node} of a live volume */
	char work[PATH_MAX]; /* a scratch directory (made and removed by the run) */
	char base[700];      /* the cache's image, pinned to its digest */
	char repository[512];
	char *gpus_json;                /* owned: this node's GPU inventory */
	struct objstore *os;            /* reads the cache's Secrets */
	const atomic_bool *cancel;      /* set: the agent stops, the capture is ended */
	cJSON *cache;                   /* owned: the cache object, for its Event */
	struct pull_secret_ref secrets; /* the cache's spec.pullSecrets */
	/* out: {digest, repository, baseDigest, files, bytes, targets, pod,
	 * capturedAt, paths[{path, digest}]} or {refused: {reason, message},
	 * pod, capturedAt} */
	cJSON *record;
};

/* Run one capture (worker thread): k->record is what it gave (NULL: the pod
 * added nothing, or the agent stopped), told in an Event on the cache. */
void node_capture_run(struct node_capture *k);
void node_capture_clear(struct node_capture *k);

#endif
