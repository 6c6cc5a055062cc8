/* The CSI Identity and Node services of gkm, independent of the transport:
 * a call is a method path and a serialized request message in, a status code,
 * a message and a serialized response out. csi_server.c carries these over
 * gRPC; tests can call csi_node_call() directly.
 *
 * Volume attributes (the pod's volumeAttributes, CSI volume_context):
 *   cacheName       the GKMCache / ClusterGKMCache name (required)
 *   cacheNamespace  the GKMCache's namespace; absent or "" means the
 *                   ClusterGKMCache of that name
 *   readOnly        "true" (default): read-only bind mount of the shared
 *                   copy; "false": a private overlay (the shared copy below,
 *                   a per-volume upper directory), discarded on unpublish
 *   onMiss          "fail" (default): a cache that is not Ready here is
 *                   refused (FAILED_PRECONDITION with its state and reason,
 *                   the kubelet retries); "empty": the volume is published
 *                   as an empty, writable directory of its own instead (under
 *                   the state directory, never the store or a view; removed
 *                   on unpublish), recorded as a fallback in the usage file
 *                   and counted in gkm_csi_fallback_total{reason}. Requests
 *                   that are invalid or not allowed (a GKMCache of another
 *                   namespace) are refused either way.
 *   csi.gkm.io/GKMCache, csi.gkm.io/namespace   older spellings of the first two
 *   csi.storage.k8s.io/...  pod information from kubelet (podInfoOnMount)
 * A pod may mount a GKMCache of its own namespace or any ClusterGKMCache.
 *
 * Thread-safe: calls for different volumes run concurrently; a second call
 * for a volume with one in flight is answered ABORTED (CSI's rule). */
#ifndef GKM_CSI_NODE_H
#define GKM_CSI_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CSI_DRIVER_NAME "csi.gkm.io"

/* gRPC status codes, spelled out so this file does not depend on gRPC. */
enum csi_code {
	CSI_OK = 0,
	CSI_CANCELLED = 1,
	CSI_UNKNOWN = 2,
	CSI_INVALID_ARGUMENT = 3,
	CSI_DEADLINE_EXCEEDED = 4,
	CSI_NOT_FOUND = 5,
	CSI_ALREADY_EXISTS = 6,
	CSI_PERMISSION_DENIED = 7,
	CSI_RESOURCE_EXHAUSTED = 8,
	CSI_FAILED_PRECONDITION = 9,
	CSI_ABORTED = 10,
	CSI_OUT_OF_RANGE = 11,
	CSI_UNIMPLEMENTED = 12,
	CSI_INTERNAL = 13,
	CSI_UNAVAILABLE = 14,
};

/* A CSI driver name: 1-63 characters, alphanumerics with '-' and '.'
 * between (the spec's rule for GetPluginInfo's name). */
bool csi_node_valid_driver(const char *name);

/* "OK", "INVALID_ARGUMENT", ... ("UNKNOWN" for anything else). */
const char *csi_code_name(int code);

struct csi_node_config {
	const char *node_id;   /* NodeGetInfo's node_id (required) */
	const char *root;      /* store root: <root>/store, <root>/caches */
	const char *run_dir;   /* <run-dir>/volumes, <run-dir>/usage */
	const char *state_dir; /* overlay and fallback dirs; NULL: <root>/csi */
	const char *version;   /* GetPluginInfo's vendor_version */
	const char *driver;    /* GetPluginInfo's name; NULL: CSI_DRIVER_NAME */
	/* what a pod may write into a writable volume (or an onMiss "empty"
	 * directory) when the volume's sizeLimit attribute does not say
	 * (csi_layer.h); 0: no limit */
	uint64_t size_limit;
};

struct csi_node;

/* Recovers the volumes a previous run published (from <run-dir>/volumes),
 * re-records their usage and removes overlay directories nothing refers to.
 * All strings in cfg are copied. Caller frees with csi_node_free(). */
__attribute__((warn_unused_result)) int csi_node_new(const struct csi_node_config *cfg,
                                                     struct csi_node **out);
void csi_node_free(struct csi_node *n);

struct csi_reply {
	int code;          /* enum csi_code */
	char message[512]; /* human-readable reason when code != CSI_OK */
	uint8_t *body;     /* serialized response when code == CSI_OK; caller frees */
	size_t body_len;
};

/* Handle one unary call; method is the gRPC path ("/csi.v1.Node/NodeGetInfo").
 * *reply is fully written. Counts the call in gkm_csi_calls_total{method,code}
 * and gkm_csi_call_duration_seconds{method}. */
void csi_node_call(struct csi_node *n, const char *method, const uint8_t *req, size_t len,
                   struct csi_reply *reply);

/* Volumes currently recorded as published. */
size_t csi_node_volume_count(struct csi_node *n);

#endif
