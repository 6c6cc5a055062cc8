/* Checking a NodePublishVolume request: its volume id, target and
 * capability, and the volume attributes (csi_node.h) into a csi_volume. */
#include "csi_node_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "cache_view.h"
#include "textfmt.h"

static const char ctx_prefix[] = "csi.storage.k8s.io/";

/* ---- paths ---- */

static bool valid_abs_path(const char *p)
{
	size_t n = strlen(p);
	if (n < 2 || n >= PATH_MAX || p[0] != '/' || p[n - 1] == '/')
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
			return false;
	/* Normalised: no empty, "." or ".." components. */
	for (const char *c = p; c && *c;) {
		const char *next = strchr(c + 1, '/');
		size_t len = next ? (size_t)(next - c - 1) : strlen(c + 1);
		if (len == 0 || (len == 1 && c[1] == '.') ||
		    (len == 2 && c[1] == '.' && c[2] == '.'))
			return false;
		c = next;
	}
	return true;
}

/* ---- publish: request parsing ---- */

struct attrs {
	const char *name, *ns, *read_only, *on_miss, *pod_name, *pod_ns, *pod_uid, *size_limit;
};

/* One of two spellings; both given and different is an error. */
static int set_attr(const char **slot, const char *key, const char *val, struct csi_reply *r)
{
	char b1[80], b2[80];
	if (*slot && strcmp(*slot, val) != 0) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "volume attribute %s=%s contradicts an earlier spelling (%s)", key,
		              csi_node_shown(val, b1, sizeof(b1)),
		              csi_node_shown(*slot, b2, sizeof(b2)));
		return -EINVAL;
	}
	if (strlen(val) > ATTR_VALUE_MAX) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "volume attribute %s is longer than %d bytes", key, ATTR_VALUE_MAX);
		return -EINVAL;
	}
	*slot = val;
	return 0;
}

static int read_attrs(const Csi__V1__NodePublishVolumeRequest *req, struct attrs *a,
                      struct csi_reply *r)
{
	char b[80];
	memset(a, 0, sizeof(*a));
	if (req->n_volume_context > ATTRS_MAX) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "more than %d volume attributes", ATTRS_MAX);
		return -EINVAL;
	}
	for (size_t i = 0; i < req->n_volume_context; i++) {
		const char *k = req->volume_context[i]->key, *v = req->volume_context[i]->value;
		const char **slot = NULL;
		if (strcmp(k, "cacheName") == 0 || strcmp(k, "csi.gkm.io/GKMCache") == 0)
			slot = &a->name;
		else if (strcmp(k, "cacheNamespace") == 0 || strcmp(k, "csi.gkm.io/namespace") == 0)
			slot = &a->ns;
		else if (strcmp(k, "readOnly") == 0)
			slot = &a->read_only;
		else if (strcmp(k, "onMiss") == 0)
			slot = &a->on_miss;
		else if (strcmp(k, "sizeLimit") == 0)
			slot = &a->size_limit;
		else if (strcmp(k, "csi.storage.k8s.io/pod.name") == 0)
			slot = &a->pod_name;
		else if (strcmp(k, "csi.storage.k8s.io/pod.namespace") == 0)
			slot = &a->pod_ns;
		else if (strcmp(k, "csi.storage.k8s.io/pod.uid") == 0)
			slot = &a->pod_uid;
		else if (strncmp(k, ctx_prefix, sizeof(ctx_prefix) - 1) == 0)
			continue; /* other kubelet-provided information */
		if (!slot) {
			csi_node_fail(
			    r, CSI_INVALID_ARGUMENT,
			    "unknown volume attribute '%s' (gkm reads cacheName, cacheNamespace, "
			    "readOnly, onMiss, sizeLimit, and the older csi.gkm.io/GKMCache, "
			    "csi.gkm.io/namespace)",
			    csi_node_shown(k, b, 64));
			return -EINVAL;
		}
		if (set_attr(slot, k, v, r))
			return -EINVAL;
	}
	return 0;
}

static bool valid_uid(const char *s)
{
	size_t n = strlen(s);
	if (n > POD_UID_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
		      (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '-'))
			return false;
	return true;
}

int csi_node_check_volume_id(const char *id, struct csi_reply *r)
{
	char b[80];
	if (!id || !*id) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		return -EINVAL;
	}
	if (!csi_volume_valid_id(id)) {
		csi_node_fail(
		    r, CSI_INVALID_ARGUMENT,
		    "volume_id '%s' is not usable (want 1-%d of A-Z a-z 0-9 . _ -, not starting "
		    "with .)",
		    csi_node_shown(id, b, 64), CSI_VOLUME_ID_MAX);
		return -EINVAL;
	}
	return 0;
}

int csi_node_check_path(const char *field, const char *p, struct csi_reply *r)
{
	char b[160];
	if (!p || !*p) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "%s is required", field);
		return -EINVAL;
	}
	if (!valid_abs_path(p)) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "%s '%s' is not an absolute, normalised path", field,
		              csi_node_shown(p, b, 128));
		return -EINVAL;
	}
	return 0;
}

/* The volume capability: a mount (file system) with an access mode. *shared:
 * one of the modes under which one volume may be published at several
 * targets of a node (a PersistentVolume that several pods mount). */
static int check_capability(const Csi__V1__VolumeCapability *cap, bool *shared, struct csi_reply *r)
{
	if (!cap) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "volume_capability is required");
		return -EINVAL;
	}
	if (cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "block access is not supported: gkm volumes are file systems");
		return -EINVAL;
	}
	if (cap->access_type_case != CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "volume_capability needs an access type (mount)");
		return -EINVAL;
	}
	if (!cap->access_mode) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "volume_capability.access_mode is required");
		return -EINVAL;
	}
	int mode = cap->access_mode->mode;
	*shared = mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_READER_ONLY ||
	          mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_SINGLE_WRITER ||
	          mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_MULTI_WRITER ||
	          mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_MULTI_WRITER;
	return 0;
}

/* cacheName (required) and cacheNamespace: valid object names. */
static int check_cache(const struct attrs *a, struct csi_reply *r)
{
	char b[80];
	if (!a->name || !*a->name) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "volume attribute cacheName is required");
		return -EINVAL;
	}
	if (!cache_view_valid_name(a->name)) {
		csi_node_fail(
		    r, CSI_INVALID_ARGUMENT,
		    "cacheName '%s' is not a valid object name (lower-case DNS-1123 subdomain)",
		    csi_node_shown(a->name, b, 64));
		return -EINVAL;
	}
	if (a->ns && *a->ns && !cache_view_valid_namespace(a->ns)) {
		csi_node_fail(
		    r, CSI_INVALID_ARGUMENT,
		    "cacheNamespace '%s' is not a valid namespace (lower-case DNS-1123 label)",
		    csi_node_shown(a->ns, b, 64));
		return -EINVAL;
	}
	return 0;
}

/* readOnly, sizeLimit and onMiss. *writable: the default, a private overlay
 * (a runtime's cache writes beside what it reads: Triton makes a directory
 * per kernel it looks up and a temporary one per kernel it stores, so a
 * read-only volume fails at its first miss), unless readOnly is "true" or
 * the pod spec's readOnly (pod_read_only) says so; *limit: sizeLimit, else
 * the node's default. */
static int check_mode(const struct csi_node *n, const struct attrs *a, bool pod_read_only,
                      bool *writable, uint64_t *limit, struct csi_reply *r)
{
	char b[80];
	*writable = true;
	if (a->read_only && strcmp(a->read_only, "true") == 0)
		*writable = false;
	else if (a->read_only && strcmp(a->read_only, "false") != 0) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "readOnly must be \"true\" or \"false\", not '%s'",
		              csi_node_shown(a->read_only, b, 64));
		return -EINVAL;
	}
	if (pod_read_only)
		*writable = false;
	*limit = n->size_limit;
	if (a->size_limit && quantity_parse_bytes(a->size_limit, limit) != 0) {
		csi_node_fail(
		    r, CSI_INVALID_ARGUMENT,
		    "sizeLimit must be a quantity of bytes (\"10Gi\", \"500Mi\", \"0\" for no "
		    "limit), not '%s'",
		    csi_node_shown(a->size_limit, b, 64));
		return -EINVAL;
	}
	if (a->on_miss && strcmp(a->on_miss, "empty") != 0 && strcmp(a->on_miss, "fail") != 0) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "onMiss must be \"fail\" or \"empty\", not '%s'",
		              csi_node_shown(a->on_miss, b, 64));
		return -EINVAL;
	}
	return 0;
}

/* What kubelet says of the pod (podInfoOnMount), where it says it. */
static int check_pod(const struct attrs *a, struct csi_reply *r)
{
	char b[80];
	if (a->pod_ns && !cache_view_valid_namespace(a->pod_ns)) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT,
		              "pod namespace '%s' is not a valid namespace",
		              csi_node_shown(a->pod_ns, b, 64));
		return -EINVAL;
	}
	if (a->pod_name && !cache_view_valid_name(a->pod_name)) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "pod name '%s' is not a valid object name",
		              csi_node_shown(a->pod_name, b, 64));
		return -EINVAL;
	}
	if (a->pod_uid && !valid_uid(a->pod_uid)) {
		csi_node_fail(r, CSI_INVALID_ARGUMENT, "pod uid '%s' is not a valid uid",
		              csi_node_shown(a->pod_uid, b, 64));
		return -EINVAL;
	}
	return 0;
}

/* A pod may mount a GKMCache of its own namespace (which it must name) or
 * any ClusterGKMCache. */
static int check_access(const struct attrs *a, struct csi_reply *r)
{
	if (!a->ns || !*a->ns)
		return 0;
	if (!a->pod_ns) {
		csi_node_fail(r, CSI_PERMISSION_DENIED,
		              "GKMCache %s/%s: the pod's namespace is unknown (the CSIDriver needs "
		              "podInfoOnMount: true); only ClusterGKMCaches can be mounted without "
		              "it",
		              a->ns, a->name);
		return -EPERM;
	}
	if (strcmp(a->pod_ns, a->ns) != 0) {
		csi_node_fail(r, CSI_PERMISSION_DENIED,
		              "a pod in namespace %s may not mount GKMCache %s/%s: pods mount "
		              "GKMCaches of their own namespace or ClusterGKMCaches",
		              a->pod_ns, a->ns, a->name);
		return -EPERM;
	}
	return 0;
}

/* Validate a publish request into *v (strings borrowed from req: copy before
 * keeping). Fails with INVALID_ARGUMENT or PERMISSION_DENIED. */
int csi_node_parse_publish(const struct csi_node *n, const Csi__V1__NodePublishVolumeRequest *req,
                           struct csi_volume *v, struct csi_reply *r)
{
	struct attrs a;
	bool shared = false, writable = false;
	uint64_t limit = 0;
	int rc;
	if (csi_node_check_volume_id(req->volume_id, r) ||
	    csi_node_check_path("target_path", req->target_path, r) ||
	    check_capability(req->volume_capability, &shared, r) || read_attrs(req, &a, r) ||
	    check_cache(&a, r) || check_mode(n, &a, req->readonly, &writable, &limit, r) ||
	    check_pod(&a, r))
		return -EINVAL;
	if ((rc = check_access(&a, r)) != 0)
		return rc;
	memset(v, 0, sizeof(*v));
	v->volume_id = req->volume_id;
	v->target_path = req->target_path;
	v->cache_namespace = (char *)(a.ns ? a.ns : "");
	v->cache_name = (char *)a.name;
	v->pod_name = (char *)(a.pod_name ? a.pod_name : "");
	v->pod_namespace = (char *)(a.pod_ns ? a.pod_ns : "");
	v->pod_uid = (char *)(a.pod_uid ? a.pod_uid : "");
	v->digest = "";
	v->writable = writable;
	v->empty_on_miss = a.on_miss && strcmp(a.on_miss, "empty") == 0;
	v->pod_read_only = req->readonly;
	v->shared = shared;
	v->size_limit = limit;
	v->fallback_state = v->fallback_reason = v->fallback_message = "";
	return 0;
}
