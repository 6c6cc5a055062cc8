#include "csi_node.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cache_tree.h"
#include "cache_view.h"
#include "fsutil.h"
#include "csi.pb-c.h"
#include "csi_layer.h"
#include "csi_mount.h"
#include "csi_volume.h"
#include "log.h"
#include "metrics.h"

enum {
	ATTRS_MAX = 64,       /* volume_context entries */
	ATTR_VALUE_MAX = 253, /* the values gkm reads */
	POD_UID_MAX = 64,
	USAGE_CACHE = 64, /* store entries whose size is remembered */
};

static const char ctx_prefix[] = "csi.storage.k8s.io/";

struct entry {
	struct csi_volume v;
	bool busy;        /* a call for this volume is in flight */
	bool placeholder; /* reserved by a publish that has not finished */
};

struct tree_size {
	char digest[CACHE_VIEW_DIGEST_LEN + 1];
	uint64_t bytes, inodes;
};

struct csi_node {
	char *node_id, *root, *run_dir, *state_dir, *volumes_dir, *version, *driver;
	uint64_t size_limit; /* the default of the sizeLimit attribute */
	pthread_mutex_t lock;
	struct entry **vols;
	size_t nvols, cap;
	/* Store entries never change once in place, so their size is computed
	 * once per digest (stats are polled every minute per volume). */
	struct tree_size sizes[USAGE_CACHE];
	size_t next_size;
	bool ready;
};

static struct metric *m_calls, *m_seconds, *m_volumes, *m_fallbacks;

static bool alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool csi_node_valid_driver(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > 63 || !alnum(name[0]) || !alnum(name[n - 1]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!alnum(name[i]) && name[i] != '-' && name[i] != '.')
			return false;
	return true;
}

const char *csi_code_name(int code)
{
	static const char *const names[] = {
	    "OK",
	    "CANCELLED",
	    "UNKNOWN",
	    "INVALID_ARGUMENT",
	    "DEADLINE_EXCEEDED",
	    "NOT_FOUND",
	    "ALREADY_EXISTS",
	    "PERMISSION_DENIED",
	    "RESOURCE_EXHAUSTED",
	    "FAILED_PRECONDITION",
	    "ABORTED",
	    "OUT_OF_RANGE",
	    "UNIMPLEMENTED",
	    "INTERNAL",
	    "UNAVAILABLE",
	};
	if (code < 0 || (size_t)code >= sizeof(names) / sizeof(names[0]))
		return "UNKNOWN";
	return names[code];
}

/* ---- replies ---- */

static void fail(struct csi_reply *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(struct csi_reply *r, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->message, sizeof(r->message), fmt, ap);
	va_end(ap);
	r->code = code;
	free(r->body);
	r->body = NULL;
	r->body_len = 0;
}

static void reply_msg(struct csi_reply *r, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf) {
		fail(r, CSI_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	protobuf_c_message_pack(m, buf);
	r->code = CSI_OK;
	r->message[0] = '\0';
	r->body = buf;
	r->body_len = len;
}

/* Untrusted text quoted in a message: bounded, control characters replaced. */
static const char *shown(const char *s, char *buf, size_t size)
{
	size_t i = 0;
	for (; s && s[i] && i + 1 < size; i++)
		buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	buf[i] = '\0';
	return buf;
}

/* ---- the volume table (callers hold n->lock) ---- */

/* A volume that is not shared is published at one target; a shared one
 * has an entry per target (its key names the two). */
static struct entry *find_id(struct csi_node *n, const char *id)
{
	for (size_t i = 0; i < n->nvols; i++)
		if (!n->vols[i]->v.shared && strcmp(n->vols[i]->v.volume_id, id) == 0)
			return n->vols[i];
	return NULL;
}

static struct entry *find_key(struct csi_node *n, const char *key)
{
	char k[CSI_VOLUME_KEY_MAX + 1];
	for (size_t i = 0; i < n->nvols; i++) {
		csi_volume_key(&n->vols[i]->v, k);
		if (strcmp(k, key) == 0)
			return n->vols[i];
	}
	return NULL;
}

static struct entry *find_target(struct csi_node *n, const char *target)
{
	for (size_t i = 0; i < n->nvols; i++)
		if (strcmp(n->vols[i]->v.target_path, target) == 0)
			return n->vols[i];
	return NULL;
}

/* The publication of volume id at target, or NULL; then *other is the
 * volume's one publication elsewhere when it is not shared. */
static struct entry *published_at(struct csi_node *n, const char *id, const char *target,
                                  struct entry **other)
{
	struct entry *e = find_target(n, target);
	*other = NULL;
	if (e && strcmp(e->v.volume_id, id) == 0)
		return e;
	*other = find_id(n, id);
	return NULL;
}

static int add_entry(struct csi_node *n, struct entry *e)
{
	if (n->nvols == n->cap) {
		size_t ncap = n->cap ? n->cap * 2 : 64;
		struct entry **nv = realloc(n->vols, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		n->vols = nv;
		n->cap = ncap;
	}
	n->vols[n->nvols++] = e;
	return 0;
}

static void drop_entry(struct csi_node *n, struct entry *e)
{
	for (size_t i = 0; i < n->nvols; i++) {
		if (n->vols[i] == e) {
			n->vols[i] = n->vols[--n->nvols];
			break;
		}
	}
	csi_volume_clear(&e->v);
	free(e);
}

static void count_volumes(struct csi_node *n)
{
	size_t c = 0;
	for (size_t i = 0; i < n->nvols; i++)
		c += !n->vols[i]->placeholder;
	metrics_set(m_volumes, NULL, (double)c);
}

size_t csi_node_volume_count(struct csi_node *n)
{
	pthread_mutex_lock(&n->lock);
	size_t c = 0;
	for (size_t i = 0; i < n->nvols; i++)
		c += !n->vols[i]->placeholder;
	pthread_mutex_unlock(&n->lock);
	return c;
}

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

/* <state>/volumes/<key>[/sub]: the private directories of one publication. */
static int key_dir(const struct csi_node *n, const char *key, const char *sub, char *buf,
                   size_t size)
{
	int len = sub ? snprintf(buf, size, "%s/volumes/%s/%s", n->state_dir, key, sub)
	              : snprintf(buf, size, "%s/volumes/%s", n->state_dir, key);
	return (len < 0 || (size_t)len >= size) ? -ENAMETOOLONG : 0;
}

static int overlay_dir(const struct csi_node *n, const struct csi_volume *v, const char *sub,
                       char *buf, size_t size)
{
	char key[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(v, key);
	return key_dir(n, key, sub, buf, size);
}

/* Writes of this volume go to a size-limited layer (csi_layer.h) mounted at
 * <dir>/layer: its upper, work and fallback directories live there. */
static bool layered(const struct csi_volume *v)
{
	return v->size_limit && (v->writable || v->fallback || v->empty_on_miss);
}

/* A directory the pod writes to ("upper", "work", "fallback"), in the layer
 * when there is one. */
static int own_dir(const struct csi_node *n, const struct csi_volume *v, const char *sub, char *buf,
                   size_t size)
{
	char rel[32];
	snprintf(rel, sizeof(rel), "%s%s", layered(v) ? "layer/" : "", sub);
	return overlay_dir(n, v, rel, buf, size);
}

/* Remove a volume's directory: its layer unmounted first (the image file
 * goes with the rest). 0 when it is gone. */
static int clear_dir(const char *vdir)
{
	char layer[PATH_MAX];
	int rc = snprintf(layer, sizeof(layer), "%s/layer", vdir) >= (int)sizeof(layer)
	             ? -ENAMETOOLONG
	             : csi_mount_unmount(layer);
	return rc ? rc : csi_mount_remove_tree(vdir);
}

/* A fresh volume directory, with its size-limited layer when it has one. */
static int make_dir(const struct csi_node *n, const struct csi_volume *v, struct csi_reply *r)
{
	char vdir[PATH_MAX], layer[PATH_MAX], img[PATH_MAX], err[256] = "";
	int rc;
	if ((rc = overlay_dir(n, v, NULL, vdir, sizeof(vdir))) ||
	    (rc = overlay_dir(n, v, "layer", layer, sizeof(layer))) ||
	    (rc = overlay_dir(n, v, "layer.img", img, sizeof(img)))) {
		fail(r, CSI_INTERNAL, "volume directories: %s", strerror(-rc));
		return rc;
	}
	/* Start from nothing: leftovers of an attempt that never got mounted
	 * hold nothing anyone wrote. */
	if ((rc = clear_dir(vdir)) || (rc = fsutil_mkdirs(layered(v) ? layer : vdir, 0700))) {
		fail(r, CSI_INTERNAL, "volume directory %s: %s", vdir, strerror(-rc));
		return rc;
	}
	if (layered(v) && (rc = csi_layer_mount(img, v->size_limit, layer, err, sizeof(err)))) {
		fail(r, CSI_INTERNAL,
		     "cannot make the volume's %llu-byte layer: %s (sizeLimit \"0\", or the "
		     "chart's csi.writableSizeLimit 0, goes without a limit)",
		     (unsigned long long)v->size_limit, err);
		if (csi_mount_remove_tree(vdir) != 0)
			log_warn("cannot remove volume directory", "dir", vdir);
	}
	return rc;
}

static void describe(const struct csi_volume *v, char *buf, size_t size)
{
	if (v->cache_namespace[0])
		snprintf(buf, size, "GKMCache %s/%s", v->cache_namespace, v->cache_name);
	else
		snprintf(buf, size, "ClusterGKMCache %s", v->cache_name);
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
		fail(r, CSI_INVALID_ARGUMENT,
		     "volume attribute %s=%s contradicts an earlier spelling (%s)", key,
		     shown(val, b1, sizeof(b1)), shown(*slot, b2, sizeof(b2)));
		return -EINVAL;
	}
	if (strlen(val) > ATTR_VALUE_MAX) {
		fail(r, CSI_INVALID_ARGUMENT, "volume attribute %s is longer than %d bytes", key,
		     ATTR_VALUE_MAX);
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
		fail(r, CSI_INVALID_ARGUMENT, "more than %d volume attributes", ATTRS_MAX);
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
			fail(r, CSI_INVALID_ARGUMENT,
			     "unknown volume attribute '%s' (gkm reads cacheName, cacheNamespace, "
			     "readOnly, onMiss, sizeLimit, and the older csi.gkm.io/GKMCache, "
			     "csi.gkm.io/namespace)",
			     shown(k, b, 64));
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

static int check_volume_id(const char *id, struct csi_reply *r)
{
	char b[80];
	if (!id || !*id) {
		fail(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		return -EINVAL;
	}
	if (!csi_volume_valid_id(id)) {
		fail(r, CSI_INVALID_ARGUMENT,
		     "volume_id '%s' is not usable (want 1-%d of A-Z a-z 0-9 . _ -, not starting "
		     "with .)",
		     shown(id, b, 64), CSI_VOLUME_ID_MAX);
		return -EINVAL;
	}
	return 0;
}

static int check_path(const char *field, const char *p, struct csi_reply *r)
{
	char b[160];
	if (!p || !*p) {
		fail(r, CSI_INVALID_ARGUMENT, "%s is required", field);
		return -EINVAL;
	}
	if (!valid_abs_path(p)) {
		fail(r, CSI_INVALID_ARGUMENT, "%s '%s' is not an absolute, normalised path", field,
		     shown(p, b, 128));
		return -EINVAL;
	}
	return 0;
}

/* Validate a publish request into *v (strings borrowed from req: copy before
 * keeping). Fails with INVALID_ARGUMENT or PERMISSION_DENIED. */
static int parse_publish(const struct csi_node *n, const Csi__V1__NodePublishVolumeRequest *req,
                         struct csi_volume *v, struct csi_reply *r)
{
	struct attrs a;
	char b[80];
	if (check_volume_id(req->volume_id, r) || check_path("target_path", req->target_path, r))
		return -EINVAL;
	const Csi__V1__VolumeCapability *cap = req->volume_capability;
	if (!cap) {
		fail(r, CSI_INVALID_ARGUMENT, "volume_capability is required");
		return -EINVAL;
	}
	if (cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK) {
		fail(r, CSI_INVALID_ARGUMENT,
		     "block access is not supported: gkm volumes are file systems");
		return -EINVAL;
	}
	if (cap->access_type_case != CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT) {
		fail(r, CSI_INVALID_ARGUMENT, "volume_capability needs an access type (mount)");
		return -EINVAL;
	}
	if (!cap->access_mode) {
		fail(r, CSI_INVALID_ARGUMENT, "volume_capability.access_mode is required");
		return -EINVAL;
	}
	/* Modes under which one volume may be published at several targets
	 * of a node: a PersistentVolume that several pods mount. */
	int mode = cap->access_mode->mode;
	bool shared =
	    mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_READER_ONLY ||
	    mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_SINGLE_WRITER ||
	    mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__MULTI_NODE_MULTI_WRITER ||
	    mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_MULTI_WRITER;
	if (read_attrs(req, &a, r))
		return -EINVAL;
	if (!a.name || !*a.name) {
		fail(r, CSI_INVALID_ARGUMENT, "volume attribute cacheName is required");
		return -EINVAL;
	}
	if (!cache_view_valid_name(a.name)) {
		fail(r, CSI_INVALID_ARGUMENT,
		     "cacheName '%s' is not a valid object name (lower-case DNS-1123 subdomain)",
		     shown(a.name, b, 64));
		return -EINVAL;
	}
	if (a.ns && *a.ns && !cache_view_valid_namespace(a.ns)) {
		fail(r, CSI_INVALID_ARGUMENT,
		     "cacheNamespace '%s' is not a valid namespace (lower-case DNS-1123 label)",
		     shown(a.ns, b, 64));
		return -EINVAL;
	}
	bool writable = false;
	if (a.read_only && strcmp(a.read_only, "false") == 0)
		writable = true;
	else if (a.read_only && strcmp(a.read_only, "true") != 0) {
		fail(r, CSI_INVALID_ARGUMENT, "readOnly must be \"true\" or \"false\", not '%s'",
		     shown(a.read_only, b, 64));
		return -EINVAL;
	}
	if (req->readonly) /* the pod spec's readOnly wins */
		writable = false;
	uint64_t limit = n->size_limit;
	if (a.size_limit && csi_layer_parse_size(a.size_limit, &limit) != 0) {
		fail(r, CSI_INVALID_ARGUMENT,
		     "sizeLimit must be a quantity of bytes (\"10Gi\", \"500Mi\", \"0\" for no "
		     "limit), not '%s'",
		     shown(a.size_limit, b, 64));
		return -EINVAL;
	}
	if (a.on_miss && strcmp(a.on_miss, "empty") != 0 && strcmp(a.on_miss, "fail") != 0) {
		fail(r, CSI_INVALID_ARGUMENT, "onMiss must be \"fail\" or \"empty\", not '%s'",
		     shown(a.on_miss, b, 64));
		return -EINVAL;
	}
	if (a.pod_ns && !cache_view_valid_namespace(a.pod_ns)) {
		fail(r, CSI_INVALID_ARGUMENT, "pod namespace '%s' is not a valid namespace",
		     shown(a.pod_ns, b, 64));
		return -EINVAL;
	}
	if (a.pod_name && !cache_view_valid_name(a.pod_name)) {
		fail(r, CSI_INVALID_ARGUMENT, "pod name '%s' is not a valid object name",
		     shown(a.pod_name, b, 64));
		return -EINVAL;
	}
	if (a.pod_uid && !valid_uid(a.pod_uid)) {
		fail(r, CSI_INVALID_ARGUMENT, "pod uid '%s' is not a valid uid",
		     shown(a.pod_uid, b, 64));
		return -EINVAL;
	}
	if (a.ns && *a.ns) {
		if (!a.pod_ns) {
			fail(r, CSI_PERMISSION_DENIED,
			     "GKMCache %s/%s: the pod's namespace is unknown (the CSIDriver needs "
			     "podInfoOnMount: true); only ClusterGKMCaches can be mounted without "
			     "it",
			     a.ns, a.name);
			return -EPERM;
		}
		if (strcmp(a.pod_ns, a.ns) != 0) {
			fail(r, CSI_PERMISSION_DENIED,
			     "a pod in namespace %s may not mount GKMCache %s/%s: pods mount "
			     "GKMCaches "
			     "of their own namespace or ClusterGKMCaches",
			     a.pod_ns, a.ns, a.name);
			return -EPERM;
		}
	}
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

/* ---- publish: the cache ---- */

/* Refuse a publish with what the agent's record says: its state, reason
 * and message, in the words a user reads in `kubectl describe pod`. */
static void refuse(struct csi_reply *r, const char *what, const struct cache_view_ready *rec)
{
	char reason[128], msg[320];
	shown(rec->reason, reason, sizeof(reason));
	shown(rec->message, msg, sizeof(msg));
	const char *sep = msg[0] ? ": " : "";
	const char *st = rec->state;
	if (!rec->compatible || strcmp(st, "Incompatible") == 0)
		fail(r, CSI_FAILED_PRECONDITION,
		     "%s is incompatible with this node's GPUs (%s%s%s)", what,
		     reason[0] ? reason : "no reason given", sep, msg);
	else if (strcmp(st, "Failed") == 0)
		fail(r, CSI_FAILED_PRECONDITION, "%s failed on this node (%s%s%s)", what,
		     reason[0] ? reason : "no reason given", sep, msg);
	else if (strcmp(st, "Deleting") == 0)
		fail(r, CSI_FAILED_PRECONDITION,
		     "%s is being deleted and takes no new pods here (%s%s%s)", what,
		     reason[0] ? reason : st, sep, msg);
	else if (!reason[0] || strcmp(reason, st) == 0)
		fail(r, CSI_FAILED_PRECONDITION, "%s is not ready on this node yet (%s%s%s)", what,
		     st, sep, msg);
	else
		fail(r, CSI_FAILED_PRECONDITION, "%s is not ready on this node yet (%s, %s%s%s)",
		     what, st, reason, sep, msg);
}

/* Why a cache cannot be mounted here: the state and reason of the node's
 * record (or what stands for them without a usable one), and the label of
 * gkm_csi_fallback_total, one of a fixed set. */
struct miss {
	char state[32], reason[128];
	const char *label;
};

static void set_miss(struct miss *m, const char *state, const char *reason, const char *label)
{
	shown(state, m->state, sizeof(m->state));
	shown(reason, m->reason, sizeof(m->reason));
	m->label = label;
}

/* The record's own words, with the metric label its state maps to. */
static void record_miss(struct miss *m, const struct cache_view_ready *rec)
{
	static const char *const states[] = {"Pending", "Pulling", "Failed", "Incompatible",
	                                     "Deleting"};
	const char *st = rec->compatible ? rec->state : "Incompatible";
	const char *label = "NotReady";
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(st, states[i]) == 0)
			label = states[i];
	set_miss(m, st, rec->reason[0] ? rec->reason : st, label);
}

/* Check the agent's record and open the store entry: only a record that
 * says Ready and compatible, whose digest the view's data link names, is
 * mounted. On success *fd is the entry (caller closes) and digest is set;
 * otherwise r says why (FAILED_PRECONDITION) and so does *m. */
static int resolve_cache(struct csi_node *n, const struct csi_volume *v, int *fd,
                         char digest[CACHE_VIEW_DIGEST_LEN + 1], struct miss *m,
                         struct csi_reply *r)
{
	struct cache_view_ready ready;
	char what[CACHE_VIEW_NAME_MAX + 96], err[384];
	char *path = NULL;
	describe(v, what, sizeof(what));
	int rc = cache_view_ready_read(n->root, v->cache_namespace, v->cache_name, &ready, err,
	                               sizeof(err));
	if (rc == -ENOENT) {
		fail(r, CSI_FAILED_PRECONDITION,
		     "%s is not on this node: the agent has no record of it here (it does not "
		     "exist, or the agent has not seen it yet)",
		     what);
		set_miss(m, "Unknown", "NotOnNode", "NotOnNode");
		return rc;
	}
	if (rc) {
		fail(r, CSI_FAILED_PRECONDITION, "%s: %s", what, err);
		set_miss(m, "Unknown", "RecordUnreadable", "RecordUnreadable");
		return rc;
	}
	if (!ready.compatible || strcmp(ready.state, "Ready") != 0) {
		refuse(r, what, &ready);
		record_miss(m, &ready);
		rc = -EAGAIN;
		goto out;
	}
	rc = cache_view_open_data(n->root, v->cache_namespace, v->cache_name, ready.digest, fd,
	                          &path, err, sizeof(err));
	if (rc) {
		fail(r, CSI_FAILED_PRECONDITION, "%s is marked ready but its data is unusable: %s",
		     what, err);
		set_miss(m, "Ready", "DataUnusable", "DataUnusable");
		goto out;
	}
	free(path);
	memcpy(digest, ready.digest, CACHE_VIEW_DIGEST_LEN + 1);
out:
	cache_view_ready_free(&ready);
	return rc;
}

static int usage_add(struct csi_node *n, const struct csi_volume *v)
{
	char key[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(v, key);
	struct cache_view_pod p = {
	    .name = v->pod_name,
	    .namespace = v->pod_namespace,
	    .uid = v->pod_uid,
	    .volume_id = key,
	    .target_path = v->target_path,
	    .digest = v->digest,
	    .read_only = v->fallback ? v->pod_read_only : !v->writable,
	    .started = v->started,
	    .fallback = v->fallback,
	    .fallback_state = v->fallback_state,
	    .fallback_reason = v->fallback_reason,
	    .fallback_message = v->fallback_message,
	};
	return cache_view_usage_add(n->run_dir, v->cache_namespace, v->cache_name, &p);
}

/* A fresh, empty directory of the volume's own under the state directory
 * (never under the store or a view: nothing written there reaches a cache),
 * bound at the target. */
static int mount_fallback(struct csi_node *n, const struct csi_volume *v, struct csi_reply *r)
{
	char vdir[PATH_MAX], dir[PATH_MAX];
	int rc, fd = -1;
	if ((rc = overlay_dir(n, v, NULL, vdir, sizeof(vdir))) ||
	    (rc = own_dir(n, v, "fallback", dir, sizeof(dir)))) {
		fail(r, CSI_INTERNAL, "fallback directory: %s", strerror(-rc));
		return rc;
	}
	if ((rc = make_dir(n, v, r)))
		return rc;
	/* Writable by the pod's user whoever that is, like an emptyDir. */
	if ((rc = fsutil_mkdirs(dir, 0700)) || (chmod(dir, 0777) != 0 && (rc = -errno)) ||
	    ((fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 &&
	     (rc = -errno))) {
		fail(r, CSI_INTERNAL, "fallback directory %s: %s", dir, strerror(-rc));
		goto out;
	}
	rc = csi_mount_bind(fd, v->target_path, v->pod_read_only);
	if (rc)
		fail(r, CSI_INTERNAL, "bind mount of the fallback directory at %s failed: %s",
		     v->target_path, strerror(-rc));
out:
	if (fd >= 0)
		close(fd);
	if (rc && clear_dir(vdir) != 0)
		log_warn("cannot remove fallback directory", "dir", vdir);
	return rc;
}

/* Mount the store entry (or the fallback directory) at the volume's target
 * (which exists). */
static int mount_volume(struct csi_node *n, const struct csi_volume *v, int fd, struct csi_reply *r)
{
	char vdir[PATH_MAX], upper[PATH_MAX], work[PATH_MAX];
	int rc;
	if (v->fallback)
		return mount_fallback(n, v, r);
	if (!v->writable) {
		rc = csi_mount_bind(fd, v->target_path, true);
		if (rc)
			fail(r, CSI_INTERNAL, "read-only bind mount at %s failed: %s",
			     v->target_path, strerror(-rc));
		return rc;
	}
	if ((rc = overlay_dir(n, v, NULL, vdir, sizeof(vdir))) ||
	    (rc = own_dir(n, v, "upper", upper, sizeof(upper))) ||
	    (rc = own_dir(n, v, "work", work, sizeof(work)))) {
		fail(r, CSI_INTERNAL, "overlay directories: %s", strerror(-rc));
		return rc;
	}
	if ((rc = make_dir(n, v, r)))
		return rc;
	if ((rc = fsutil_mkdirs(upper, 0700)) || (rc = fsutil_mkdirs(work, 0700))) {
		fail(r, CSI_INTERNAL, "overlay directories under %s: %s", vdir, strerror(-rc));
		goto out;
	}
	/* The upper root becomes the volume's root: writable by the pod's
	 * user whoever that is (the layer is private to this one volume). */
	if (chmod(upper, 0777) != 0) {
		rc = -errno;
		fail(r, CSI_INTERNAL, "chmod %s: %s", upper, strerror(-rc));
		goto out;
	}
	rc = csi_mount_overlay(fd, upper, work, v->target_path);
	if (rc)
		fail(r, CSI_INTERNAL, "overlay mount at %s failed: %s", v->target_path,
		     strerror(-rc));
out:
	if (rc && clear_dir(vdir) != 0)
		log_warn("cannot remove overlay directories", "dir", vdir);
	return rc;
}

/* The target directory: created when missing (CSI leaves that to the
 * plugin), refused when it is not a plain directory. */
static int prepare_target(const char *target, bool *created, struct csi_reply *r)
{
	struct stat st;
	*created = false;
	if (lstat(target, &st) != 0) {
		if (errno != ENOENT) {
			fail(r, CSI_INTERNAL, "target %s: %s", target, strerror(errno));
			return -errno;
		}
		if (mkdir(target, 0750) != 0) {
			int e = errno;
			fail(r, e == ENOENT ? CSI_INVALID_ARGUMENT : CSI_INTERNAL,
			     "cannot create target %s: %s", target, strerror(e));
			return -e;
		}
		*created = true;
		return 0;
	}
	if (!S_ISDIR(st.st_mode)) {
		fail(r, CSI_INVALID_ARGUMENT, "target %s exists and is not a directory", target);
		return -ENOTDIR;
	}
	return 0;
}

static void clear_reply(struct csi_reply *r)
{
	r->code = CSI_OK;
	r->message[0] = '\0';
}

/* Record what a publish mounts: the digest (or "" for a fallback) and the
 * why of a fallback (all "" otherwise). Stats may copy the entry meanwhile:
 * the fields change together under the lock, and not at all when out of
 * memory (-ENOMEM). */
static int set_source(struct csi_node *n, struct csi_volume *v, const char *digest,
                      const struct miss *m, const char *message)
{
	char *d = strdup(digest), *st = strdup(m ? m->state : "");
	char *re = strdup(m ? m->reason : ""), *msg = strdup(m ? message : "");
	if (!d || !st || !re || !msg) {
		free(d);
		free(st);
		free(re);
		free(msg);
		return -ENOMEM;
	}
	pthread_mutex_lock(&n->lock);
	char *old[] = {v->digest, v->fallback_state, v->fallback_reason, v->fallback_message};
	v->digest = d;
	v->fallback_state = st;
	v->fallback_reason = re;
	v->fallback_message = msg;
	v->fallback = m != NULL;
	pthread_mutex_unlock(&n->lock);
	for (size_t i = 0; i < sizeof(old) / sizeof(old[0]); i++)
		free(old[i]);
	return 0;
}

/* What a publish mounts: the cache's store entry (*fd, v->digest), or, for
 * a volume with onMiss "empty" whose cache is not usable here, a fallback
 * directory (*fd -1, v->fallback with the why, *label for the metric).
 * Anything else that keeps the cache from being mounted fails as before. */
static int choose_source(struct csi_node *n, struct csi_volume *v, int *fd, const char **label,
                         struct csi_reply *r)
{
	char digest[CACHE_VIEW_DIGEST_LEN + 1] = "";
	struct miss m = {.label = NULL};
	*fd = -1;
	int rc = resolve_cache(n, v, fd, digest, &m, r);
	if (rc && !v->empty_on_miss)
		return rc;
	bool fallback = rc != 0;
	if (set_source(n, v, digest, fallback ? &m : NULL, r->message) != 0) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		fail(r, CSI_RESOURCE_EXHAUSTED, "out of memory");
		return -ENOMEM;
	}
	*label = fallback ? m.label : NULL;
	clear_reply(r);
	return 0;
}

/* Remove what a failed publish made: the mount, the target it created,
 * the volume's private directories. */
static void undo_target(struct csi_node *n, const struct csi_volume *v, bool created)
{
	char vdir[PATH_MAX];
	if (csi_mount_unmount(v->target_path) != 0)
		log_error("cannot unmount after a failed publish", "target", v->target_path);
	if (created && rmdir(v->target_path) != 0 && errno != ENOENT)
		log_warn("cannot remove target after a failed publish", "target", v->target_path,
		         "error", strerror(errno));
	if (overlay_dir(n, v, NULL, vdir, sizeof(vdir)) == 0 && clear_dir(vdir) != 0)
		log_warn("cannot remove the volume's directories", "dir", vdir);
}

/* A new volume (e is a busy placeholder owned by this call). */
static int publish_new(struct csi_node *n, struct entry *e, const char **label, struct csi_reply *r)
{
	struct csi_volume *v = &e->v;
	bool created = false;
	int fd = -1;
	int rc = choose_source(n, v, &fd, label, r);
	if (rc)
		return rc;
	v->started = time(NULL);
	rc = csi_mount_is_mountpoint(v->target_path);
	if (rc == 1) {
		fail(r, CSI_ALREADY_EXISTS, "target %s already has something else mounted on it",
		     v->target_path);
		rc = -EEXIST;
		goto out;
	}
	/* State first: a plugin killed from here on finds the volume again. */
	rc = csi_volume_save(n->volumes_dir, v);
	if (rc) {
		fail(r, CSI_INTERNAL, "cannot record volume state: %s", strerror(-rc));
		goto out;
	}
	if ((rc = prepare_target(v->target_path, &created, r)) || (rc = mount_volume(n, v, fd, r)))
		goto undo;
	rc = usage_add(n, v);
	if (rc) {
		fail(r, CSI_INTERNAL, "cannot record usage: %s", strerror(-rc));
		goto undo;
	}
	goto out;
undo:
	undo_target(n, v, created);
	if (csi_volume_remove(n->volumes_dir, v) != 0)
		log_error("cannot remove volume state after a failed publish", "volume",
		          v->volume_id);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

/* A repeated publish of a known volume: make sure it is mounted and
 * recorded (a previous attempt may have been cut short by a restart). */
static int publish_again(struct csi_node *n, struct entry *e, const char **label,
                         struct csi_reply *r)
{
	struct csi_volume *v = &e->v;
	int rc = csi_mount_is_mountpoint(v->target_path);
	if (rc != 1) {
		bool created = false;
		int fd = -1;
		if ((rc = choose_source(n, v, &fd, label, r)))
			return rc;
		rc = csi_volume_save(n->volumes_dir, v);
		if (rc)
			fail(r, CSI_INTERNAL, "cannot record volume state: %s", strerror(-rc));
		else if ((rc = prepare_target(v->target_path, &created, r)) == 0 &&
		         (rc = mount_volume(n, v, fd, r)) != 0)
			undo_target(n, v, created);
		if (fd >= 0)
			close(fd);
		if (rc)
			return rc;
	}
	rc = usage_add(n, v);
	if (rc)
		fail(r, CSI_INTERNAL, "cannot record usage: %s", strerror(-rc));
	return rc;
}

static void node_publish(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	Csi__V1__NodePublishVolumeRequest *req =
	    csi__v1__node_publish_volume_request__unpack(NULL, len, data);
	struct csi_volume want;
	struct entry *e = NULL;
	bool fresh = false;
	char what[CACHE_VIEW_NAME_MAX + 96];
	if (!req) {
		fail(r, CSI_INVALID_ARGUMENT, "malformed NodePublishVolumeRequest");
		return;
	}
	if (parse_publish(n, req, &want, r))
		goto out;

	pthread_mutex_lock(&n->lock);
	e = find_target(n, want.target_path);
	struct entry *other = e || want.shared ? NULL : find_id(n, want.volume_id);
	if (e && strcmp(e->v.volume_id, want.volume_id) != 0) {
		fail(r, CSI_ALREADY_EXISTS, "target %s already holds volume %s", want.target_path,
		     e->v.volume_id);
		e = NULL;
	} else if ((e && e->busy) || (other && other->busy)) {
		fail(r, CSI_ABORTED, "an operation on volume %s is in progress", want.volume_id);
		e = NULL;
	} else if (other) {
		fail(r, CSI_FAILED_PRECONDITION, "volume %s is already published at %s",
		     want.volume_id, other->v.target_path);
	} else if (e && !csi_volume_same(&e->v, &want)) {
		describe(&e->v, what, sizeof(what));
		fail(r, CSI_ALREADY_EXISTS,
		     "volume %s is already published at %s with other attributes (%s, %s)",
		     want.volume_id, want.target_path, what,
		     e->v.writable ? "writable" : "read-only");
		e = NULL;
	} else if (!e) {
		if (!(e = calloc(1, sizeof(*e))) || csi_volume_copy(&e->v, &want) != 0 ||
		    add_entry(n, e) != 0) {
			if (e)
				csi_volume_clear(&e->v);
			free(e);
			e = NULL;
			fail(r, CSI_RESOURCE_EXHAUSTED, "out of memory");
		} else {
			e->placeholder = true;
			fresh = true;
		}
	}
	if (e)
		e->busy = true;
	pthread_mutex_unlock(&n->lock);
	if (!e)
		goto out;

	const char *label = NULL;
	int rc = fresh ? publish_new(n, e, &label, r) : publish_again(n, e, &label, r);

	describe(&e->v, what, sizeof(what));
	if (rc == 0 && label) {
		metrics_add(m_fallbacks, METRICS_L(label), 1);
		log_warn("published an empty fallback directory: the cache is not usable here",
		         "volume", e->v.volume_id, "cache", what, "state", e->v.fallback_state,
		         "reason", e->v.fallback_reason, "target", e->v.target_path,
		         "pod_namespace", e->v.pod_namespace, "pod", e->v.pod_name);
	} else if (rc == 0) {
		log_info(fresh ? "published volume" : "volume already published", "volume",
		         e->v.volume_id, "cache", what, "mode",
		         e->v.fallback   ? "fallback"
		         : e->v.writable ? "overlay"
		                         : "read-only",
		         "target", e->v.target_path, "pod_namespace", e->v.pod_namespace, "pod",
		         e->v.pod_name);
	}
	pthread_mutex_lock(&n->lock);
	if (rc && fresh) {
		drop_entry(n, e);
	} else {
		e->busy = false;
		e->placeholder = false;
	}
	count_volumes(n);
	pthread_mutex_unlock(&n->lock);
	if (rc == 0) {
		Csi__V1__NodePublishVolumeResponse resp =
		    CSI__V1__NODE_PUBLISH_VOLUME_RESPONSE__INIT;
		reply_msg(r, &resp.base);
	}
out:
	csi__v1__node_publish_volume_request__free_unpacked(req, NULL);
}

/* ---- unpublish ---- */

/* A writable volume of a cache that captures (cache_view.h): its upper
 * layer goes to the agent, which packages what the pod added as a
 * candidate image. false: not handed over (the caller removes it). */
static bool hand_over(struct csi_node *n, const struct csi_volume *v, const char *key,
                      const char *vdir)
{
	if (!v->writable || v->fallback ||
	    !cache_view_capture_on(n->root, v->cache_namespace, v->cache_name))
		return false;
	if (layered(v)) {
		/* the agent reads <vdir>/upper on the node's own disk: the layer
		 * is copied there as it is, then goes (clear_dir) */
		char from[PATH_MAX], to[PATH_MAX];
		struct oci_err e = {{0}};
		int rc = own_dir(n, v, "upper", from, sizeof(from));
		if (rc == 0)
			rc = overlay_dir(n, v, "upper", to, sizeof(to));
		if (rc == 0 && (rc = fsutil_mkdirs(to, 0700)) == 0)
			rc = cache_tree_copy_layer(from, to, &e);
		char layer[PATH_MAX], img[PATH_MAX];
		if (rc == 0 && (rc = overlay_dir(n, v, "layer", layer, sizeof(layer))) == 0 &&
		    (rc = csi_mount_unmount(layer)) == 0 &&
		    (rc = overlay_dir(n, v, "layer.img", img, sizeof(img))) == 0 &&
		    (rc = csi_mount_remove_tree(layer)) == 0 && unlink(img) != 0)
			rc = -errno;
		if (rc) {
			log_warn("cannot copy the volume's layer for capture; removing it",
			         "volume", v->volume_id, "error", e.msg[0] ? e.msg : strerror(-rc));
			return false;
		}
	}
	cJSON *pod = cJSON_CreateObject();
	cJSON_AddStringToObject(pod, "name", v->pod_name ? v->pod_name : "");
	cJSON_AddStringToObject(pod, "namespace", v->pod_namespace ? v->pod_namespace : "");
	cJSON_AddStringToObject(pod, "uid", v->pod_uid ? v->pod_uid : "");
	cJSON_AddStringToObject(pod, "node", n->node_id);
	char *text = cJSON_PrintUnformatted(pod);
	cJSON_Delete(pod);
	int rc = text ? cache_view_capture_handover(n->root, v->cache_namespace, v->cache_name, key,
	                                            vdir, text)
	              : -ENOMEM;
	cJSON_free(text);
	if (rc) {
		log_warn(
		    "cannot hand the volume's upper layer to the agent for capture; removing it",
		    "volume", v->volume_id, "error", strerror(-rc));
		return false;
	}
	log_info("handed the volume's upper layer to the agent for capture", "volume",
	         v->volume_id);
	return true;
}

static int teardown(struct csi_node *n, const struct csi_volume *v, struct csi_reply *r)
{
	int rc = csi_mount_unmount(v->target_path);
	if (rc) {
		fail(r, CSI_INTERNAL, "cannot unmount %s: %s", v->target_path, strerror(-rc));
		return rc;
	}
	if (rmdir(v->target_path) != 0 && errno != ENOENT)
		log_warn("target directory left in place", "target", v->target_path, "error",
		         strerror(errno));
	/* The overlay layers or the fallback directory, written by the pod:
	 * handed to the agent where the cache captures, else removed. */
	char vdir[PATH_MAX];
	char key[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(v, key);
	if (overlay_dir(n, v, NULL, vdir, sizeof(vdir)) == 0 && !hand_over(n, v, key, vdir) &&
	    clear_dir(vdir) != 0)
		log_warn("cannot remove the volume's directories (removed at next start)", "dir",
		         vdir);
	rc = cache_view_usage_remove(n->run_dir, v->cache_namespace, v->cache_name, key);
	if (rc) {
		fail(r, CSI_INTERNAL, "cannot release usage of volume %s: %s", v->volume_id,
		     strerror(-rc));
		return rc;
	}
	rc = csi_volume_remove(n->volumes_dir, v);
	if (rc)
		fail(r, CSI_INTERNAL, "cannot remove state of volume %s: %s", v->volume_id,
		     strerror(-rc));
	return rc;
}

static void node_unpublish(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	Csi__V1__NodeUnpublishVolumeRequest *req =
	    csi__v1__node_unpublish_volume_request__unpack(NULL, len, data);
	struct entry *e = NULL, *other = NULL;
	bool known = false;
	if (!req) {
		fail(r, CSI_INVALID_ARGUMENT, "malformed NodeUnpublishVolumeRequest");
		return;
	}
	if (check_volume_id(req->volume_id, r) || check_path("target_path", req->target_path, r))
		goto out;
	pthread_mutex_lock(&n->lock);
	e = published_at(n, req->volume_id, req->target_path, &other);
	if (e && e->busy) {
		fail(r, CSI_ABORTED, "an operation on volume %s is in progress", req->volume_id);
		known = true;
		e = NULL;
	} else if (other) {
		fail(r, CSI_NOT_FOUND, "volume %s is published at %s, not at %s", req->volume_id,
		     other->v.target_path, req->target_path);
		known = true;
	} else if (e) {
		e->busy = true;
	}
	pthread_mutex_unlock(&n->lock);

	if (!e && known)
		goto out;
	if (!e) {
		/* Unknown here: either already unpublished (a repeat) or never ours.
		 * Never unmount what this plugin did not mount. */
		if (csi_mount_is_mountpoint(req->target_path) == 1) {
			fail(r, CSI_NOT_FOUND,
			     "volume %s is not published by this plugin, and %s is mounted by "
			     "something "
			     "else: not unmounting it",
			     req->volume_id, req->target_path);
			goto out;
		}
		Csi__V1__NodeUnpublishVolumeResponse resp =
		    CSI__V1__NODE_UNPUBLISH_VOLUME_RESPONSE__INIT;
		reply_msg(r, &resp.base);
		goto out;
	}
	int rc = teardown(n, &e->v, r);
	if (rc == 0)
		log_info("unpublished volume", "volume", e->v.volume_id, "target",
		         e->v.target_path);
	pthread_mutex_lock(&n->lock);
	if (rc == 0)
		drop_entry(n, e);
	else
		e->busy = false;
	count_volumes(n);
	pthread_mutex_unlock(&n->lock);
	if (rc == 0) {
		Csi__V1__NodeUnpublishVolumeResponse resp =
		    CSI__V1__NODE_UNPUBLISH_VOLUME_RESPONSE__INIT;
		reply_msg(r, &resp.base);
	}
out:
	csi__v1__node_unpublish_volume_request__free_unpacked(req, NULL);
}

/* ---- stats ---- */

static int store_usage(struct csi_node *n, const char *digest, uint64_t *bytes, uint64_t *inodes)
{
	pthread_mutex_lock(&n->lock);
	for (size_t i = 0; i < USAGE_CACHE; i++) {
		if (strcmp(n->sizes[i].digest, digest) == 0) {
			*bytes = n->sizes[i].bytes;
			*inodes = n->sizes[i].inodes;
			pthread_mutex_unlock(&n->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&n->lock);
	char path[PATH_MAX];
	int len = snprintf(path, sizeof(path), "%s/store/sha256/%s", n->root, digest + 7);
	if (len < 0 || (size_t)len >= sizeof(path))
		return -ENAMETOOLONG;
	int rc = csi_mount_tree_usage(path, bytes, inodes);
	if (rc)
		return rc;
	pthread_mutex_lock(&n->lock);
	struct tree_size *s = &n->sizes[n->next_size++ % USAGE_CACHE];
	memcpy(s->digest, digest, CACHE_VIEW_DIGEST_LEN + 1);
	s->bytes = *bytes;
	s->inodes = *inodes;
	pthread_mutex_unlock(&n->lock);
	return 0;
}

static int64_t clamp64(uint64_t v)
{
	return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

static void node_stats(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	Csi__V1__NodeGetVolumeStatsRequest *req =
	    csi__v1__node_get_volume_stats_request__unpack(NULL, len, data);
	struct csi_volume v;
	bool found = false, at_path = false;
	char b[144], pb[160];
	memset(&v, 0, sizeof(v));
	if (!req) {
		fail(r, CSI_INVALID_ARGUMENT, "malformed NodeGetVolumeStatsRequest");
		return;
	}
	/* Missing arguments are INVALID_ARGUMENT; anything else names no
	 * volume published here (a malformed id or a relative path included),
	 * which CSI answers NOT_FOUND. */
	if (!req->volume_id || !*req->volume_id) {
		fail(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		goto out;
	}
	if (!req->volume_path || !*req->volume_path) {
		fail(r, CSI_INVALID_ARGUMENT, "volume_path is required");
		goto out;
	}
	pthread_mutex_lock(&n->lock);
	struct entry *other = NULL, *e = published_at(n, req->volume_id, req->volume_path, &other);
	if (e && !e->placeholder) {
		found = at_path = csi_volume_copy(&v, &e->v) == 0;
	} else if (other && !other->placeholder) {
		found = true; /* elsewhere */
	}
	pthread_mutex_unlock(&n->lock);
	if (!found) {
		fail(r, CSI_NOT_FOUND, "volume %s is not published on this node",
		     shown(req->volume_id, b, 140));
		goto out;
	}
	if (!at_path) {
		fail(r, CSI_NOT_FOUND, "volume %s is not published at %s", req->volume_id,
		     shown(req->volume_path, pb, sizeof(pb)));
		goto out;
	}
	if (csi_mount_is_mountpoint(v.target_path) != 1) {
		fail(r, CSI_NOT_FOUND, "volume %s is not mounted at %s", v.volume_id,
		     v.target_path);
		goto out;
	}
	uint64_t bytes = 0, inodes = 0, ubytes = 0, uinodes = 0, avail = 0, iavail = 0;
	/* What the pod can write to: an overlay's upper layer, a fallback
	 * directory (which has no cache below it). */
	const char *own = v.fallback ? "fallback" : v.writable ? "upper" : NULL;
	int rc = v.fallback ? 0 : store_usage(n, v.digest, &bytes, &inodes);
	if (rc == 0 && own) {
		char upper[PATH_MAX];
		struct statvfs sv;
		/* a limited layer's free space is what the limit leaves */
		rc = own_dir(n, &v, own, upper, sizeof(upper));
		if (rc == 0)
			rc = csi_mount_tree_usage(upper, &ubytes, &uinodes);
		if (rc == 0 && statvfs(upper, &sv) != 0)
			rc = -errno;
		if (rc == 0) {
			avail = (uint64_t)sv.f_bavail * sv.f_frsize;
			iavail = sv.f_favail;
		}
	}
	if (rc) {
		fail(r, CSI_INTERNAL, "cannot measure volume %s: %s", v.volume_id, strerror(-rc));
		goto out;
	}
	/* A read-only volume is exactly as big as the cache; a writable one can
	 * grow into the free space of its layer (sizeLimit), or without a limit
	 * of the file system its own directory is on. */
	Csi__V1__VolumeUsage ub = CSI__V1__VOLUME_USAGE__INIT, ui = CSI__V1__VOLUME_USAGE__INIT;
	ub.unit = CSI__V1__VOLUME_USAGE__UNIT__BYTES;
	ub.used = clamp64(bytes + ubytes);
	ub.available = clamp64(avail);
	ub.total = clamp64(bytes + ubytes + avail);
	ui.unit = CSI__V1__VOLUME_USAGE__UNIT__INODES;
	ui.used = clamp64(inodes + uinodes);
	ui.available = clamp64(iavail);
	ui.total = clamp64(inodes + uinodes + iavail);
	Csi__V1__VolumeUsage *usage[] = {&ub, &ui};
	Csi__V1__NodeGetVolumeStatsResponse resp = CSI__V1__NODE_GET_VOLUME_STATS_RESPONSE__INIT;
	resp.n_usage = 2;
	resp.usage = usage;
	reply_msg(r, &resp.base);
out:
	csi_volume_clear(&v);
	csi__v1__node_get_volume_stats_request__free_unpacked(req, NULL);
}

/* ---- identity and node information ---- */

static void get_plugin_info(struct csi_node *n, const uint8_t *data, size_t len,
                            struct csi_reply *r)
{
	(void)data;
	(void)len;
	Csi__V1__GetPluginInfoResponse resp = CSI__V1__GET_PLUGIN_INFO_RESPONSE__INIT;
	resp.name = n->driver;
	resp.vendor_version = n->version;
	reply_msg(r, &resp.base);
}

static void get_plugin_capabilities(struct csi_node *n, const uint8_t *data, size_t len,
                                    struct csi_reply *r)
{
	(void)n;
	(void)data;
	(void)len;
	/* A node-only plugin: no CONTROLLER_SERVICE, no topology constraints. */
	Csi__V1__GetPluginCapabilitiesResponse resp =
	    CSI__V1__GET_PLUGIN_CAPABILITIES_RESPONSE__INIT;
	reply_msg(r, &resp.base);
}

static void probe(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	(void)data;
	(void)len;
	Google__Protobuf__BoolValue ready = GOOGLE__PROTOBUF__BOOL_VALUE__INIT;
	struct stat st;
	/* Ready once the state is recovered and the run directory is there
	 * (a volume can be recorded). */
	ready.value = n->ready && stat(n->volumes_dir, &st) == 0 && S_ISDIR(st.st_mode);
	Csi__V1__ProbeResponse resp = CSI__V1__PROBE_RESPONSE__INIT;
	resp.ready = &ready;
	reply_msg(r, &resp.base);
}

static void node_get_info(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	(void)data;
	(void)len;
	Csi__V1__NodeGetInfoResponse resp = CSI__V1__NODE_GET_INFO_RESPONSE__INIT;
	resp.node_id = n->node_id;
	reply_msg(r, &resp.base);
}

static void node_get_capabilities(struct csi_node *n, const uint8_t *data, size_t len,
                                  struct csi_reply *r)
{
	(void)n;
	(void)data;
	(void)len;
	Csi__V1__NodeServiceCapability__RPC rpc = CSI__V1__NODE_SERVICE_CAPABILITY__RPC__INIT;
	rpc.type = CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME_STATS;
	Csi__V1__NodeServiceCapability cap = CSI__V1__NODE_SERVICE_CAPABILITY__INIT;
	cap.type_case = CSI__V1__NODE_SERVICE_CAPABILITY__TYPE_RPC;
	cap.rpc = &rpc;
	Csi__V1__NodeServiceCapability *caps[] = {&cap};
	Csi__V1__NodeGetCapabilitiesResponse resp = CSI__V1__NODE_GET_CAPABILITIES_RESPONSE__INIT;
	resp.n_capabilities = 1;
	resp.capabilities = caps;
	reply_msg(r, &resp.base);
}

/* A node-only plugin has no controller service, and says so in
 * GetPluginCapabilities. Conformance tools (csi-sanity releases before 5.5)
 * still ask for controller capabilities before every node test and fail on
 * an error, and also on an empty list (it decodes as nil in Go, which they
 * refuse); one capability of type UNKNOWN is what they read as "none".
 * kubelet never asks a node plugin this. */
static void controller_get_capabilities(struct csi_node *n, const uint8_t *data, size_t len,
                                        struct csi_reply *r)
{
	(void)n;
	(void)data;
	(void)len;
	Csi__V1__ControllerServiceCapability__RPC rpc =
	    CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__INIT;
	rpc.type = CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__UNKNOWN;
	Csi__V1__ControllerServiceCapability cap = CSI__V1__CONTROLLER_SERVICE_CAPABILITY__INIT;
	cap.type_case = CSI__V1__CONTROLLER_SERVICE_CAPABILITY__TYPE_RPC;
	cap.rpc = &rpc;
	Csi__V1__ControllerServiceCapability *caps[] = {&cap};
	Csi__V1__ControllerGetCapabilitiesResponse resp =
	    CSI__V1__CONTROLLER_GET_CAPABILITIES_RESPONSE__INIT;
	resp.n_capabilities = 1;
	resp.capabilities = caps;
	reply_msg(r, &resp.base);
}

/* ---- dispatch ---- */

typedef void (*handler_fn)(struct csi_node *, const uint8_t *, size_t, struct csi_reply *);

static const char no_staging[] = "gkm volumes are published without staging or expansion";
static const char node_only[] = "gkm is a node-only plugin (no controller service)";

/* Every method of the specification has its own metrics label; paths that
 * are not in the specification share "other", so a client cannot grow the
 * label set. */
static const struct method {
	const char *service, *name; /* the path is /csi.v1.<service>/<name> */
	handler_fn fn;              /* NULL: part of the spec, not offered by gkm */
	const char *why;            /* with fn NULL: the reason given in UNIMPLEMENTED */
} methods[] = {
    {"Identity", "GetPluginInfo", get_plugin_info, NULL},
    {"Identity", "GetPluginCapabilities", get_plugin_capabilities, NULL},
    {"Identity", "Probe", probe, NULL},
    {"Node", "NodeGetInfo", node_get_info, NULL},
    {"Node", "NodeGetCapabilities", node_get_capabilities, NULL},
    {"Node", "NodePublishVolume", node_publish, NULL},
    {"Node", "NodeUnpublishVolume", node_unpublish, NULL},
    {"Node", "NodeGetVolumeStats", node_stats, NULL},
    {"Node", "NodeStageVolume", NULL, no_staging},
    {"Node", "NodeUnstageVolume", NULL, no_staging},
    {"Node", "NodeExpandVolume", NULL, no_staging},
    {"Controller", "ControllerGetCapabilities", controller_get_capabilities, NULL},
    {"Controller", "CreateVolume", NULL, node_only},
    {"Controller", "DeleteVolume", NULL, node_only},
    {"Controller", "ControllerPublishVolume", NULL, node_only},
    {"Controller", "ControllerUnpublishVolume", NULL, node_only},
    {"Controller", "ValidateVolumeCapabilities", NULL, node_only},
    {"Controller", "ListVolumes", NULL, node_only},
    {"Controller", "GetCapacity", NULL, node_only},
    {"Controller", "CreateSnapshot", NULL, node_only},
    {"Controller", "DeleteSnapshot", NULL, node_only},
    {"Controller", "ListSnapshots", NULL, node_only},
    {"Controller", "ControllerExpandVolume", NULL, node_only},
    {"Controller", "ControllerGetVolume", NULL, node_only},
    {"Controller", "ControllerModifyVolume", NULL, node_only},
    {"GroupController", "GroupControllerGetCapabilities", NULL, node_only},
    {"GroupController", "CreateVolumeGroupSnapshot", NULL, node_only},
    {"GroupController", "DeleteVolumeGroupSnapshot", NULL, node_only},
    {"GroupController", "GetVolumeGroupSnapshot", NULL, node_only},
    {"SnapshotMetadata", "GetMetadataAllocated", NULL, node_only},
    {"SnapshotMetadata", "GetMetadataDelta", NULL, node_only},
};

static bool is_method(const char *path, const struct method *m)
{
	static const char pkg[] = "/csi.v1.";
	size_t sl = strlen(m->service);
	if (strncmp(path, pkg, sizeof(pkg) - 1) != 0)
		return false;
	path += sizeof(pkg) - 1;
	return strncmp(path, m->service, sl) == 0 && path[sl] == '/' &&
	       strcmp(path + sl + 1, m->name) == 0;
}

static bool controller_method(const char *m)
{
	return strncmp(m, "/csi.v1.Controller/", 19) == 0 ||
	       strncmp(m, "/csi.v1.GroupController/", 24) == 0 ||
	       strncmp(m, "/csi.v1.SnapshotMetadata/", 25) == 0;
}

void csi_node_call(struct csi_node *n, const char *method, const uint8_t *req, size_t len,
                   struct csi_reply *r)
{
	const struct method *m = NULL;
	const char *label = "other";
	char b[96];
	uint64_t start = 0;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	start = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; method && i < sizeof(methods) / sizeof(methods[0]); i++)
		if (is_method(method, &methods[i]))
			m = &methods[i];
	if (m) {
		label = m->name;
		if (m->fn)
			m->fn(n, req, len, r);
		else
			fail(r, CSI_UNIMPLEMENTED, "%s is not implemented: %s", m->name, m->why);
	} else if (method && controller_method(method)) {
		fail(r, CSI_UNIMPLEMENTED, "%s is not implemented: %s", shown(method, b, 80),
		     node_only);
	} else {
		fail(r, CSI_UNIMPLEMENTED, "unknown method %s", shown(method, b, 80));
	}
	if (r->code != CSI_OK)
		log_kv(r->code == CSI_INTERNAL ? LOG_ERROR : LOG_INFO, "CSI call failed", "method",
		       label, "code", csi_code_name(r->code), "message", r->message, (char *)0);

	clock_gettime(CLOCK_MONOTONIC, &ts);
	double secs =
	    (double)((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec - start) / 1e9;
	metrics_add(m_calls, METRICS_L(label, csi_code_name(r->code)), 1);
	metrics_observe(m_seconds, METRICS_L(label), secs);
}

/* ---- life cycle ---- */

/* Overlay directories with no volume recorded: a publish that died before
 * its state was written, or an unpublish whose clean-up failed. */
static void remove_orphans(struct csi_node *n)
{
	char dir[PATH_MAX];
	int len = snprintf(dir, sizeof(dir), "%s/volumes", n->state_dir);
	if (len < 0 || (size_t)len >= sizeof(dir))
		return;
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (!csi_volume_valid_key(de->d_name) || find_key(n, de->d_name))
			continue;
		char path[PATH_MAX];
		if (key_dir(n, de->d_name, NULL, path, sizeof(path)) != 0)
			continue;
		int rc = clear_dir(path);
		log_info("removed orphaned overlay directories", "dir", path, "error",
		         rc ? strerror(-rc) : "");
	}
	closedir(d);
}

static int recover(struct csi_node *n)
{
	struct csi_volume *list = NULL;
	size_t cnt = 0;
	int rc = csi_volume_load_all(n->volumes_dir, &list, &cnt);
	if (rc)
		return rc;
	for (size_t i = 0; i < cnt; i++) {
		struct entry *e = calloc(1, sizeof(*e));
		if (!e || add_entry(n, e) != 0) {
			free(e);
			rc = -ENOMEM;
			break;
		}
		e->v = list[i];
		memset(&list[i], 0, sizeof(list[i]));
		/* Usage may lag the state by one step if the last run died
		 * between the two writes. */
		int u = usage_add(n, &e->v);
		int mounted = csi_mount_is_mountpoint(e->v.target_path);
		log_info("recovered volume", "volume", e->v.volume_id, "target", e->v.target_path,
		         "mounted", mounted == 1 ? "yes" : "no", "usage_error",
		         u ? strerror(-u) : "");
	}
	csi_volume_free_all(list, cnt);
	if (rc == 0)
		remove_orphans(n);
	count_volumes(n);
	return rc;
}

static char *join(const char *a, const char *b)
{
	char *s = NULL;
	return asprintf(&s, "%s/%s", a, b) < 0 ? NULL : s;
}

void csi_node_free(struct csi_node *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nvols; i++) {
		csi_volume_clear(&n->vols[i]->v);
		free(n->vols[i]);
	}
	free(n->vols);
	pthread_mutex_destroy(&n->lock);
	free(n->node_id);
	free(n->root);
	free(n->run_dir);
	free(n->state_dir);
	free(n->volumes_dir);
	free(n->version);
	free(n->driver);
	free(n);
}

int csi_node_new(const struct csi_node_config *cfg, struct csi_node **out)
{
	static const double buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
	                                 0.05,   0.1,   0.25,   0.5,   1,    5};
	if (!cfg || !cfg->node_id || !*cfg->node_id || !cfg->root || !cfg->run_dir ||
	    strlen(cfg->node_id) > 128 || (cfg->driver && !csi_node_valid_driver(cfg->driver)))
		return -EINVAL;
	m_calls = metrics_counter("gkm_csi_calls_total", "CSI calls answered, by method and code",
	                          "method,code");
	m_seconds = metrics_histogram("gkm_csi_call_duration_seconds",
	                              "Time to answer a CSI call, by method", "method", buckets,
	                              sizeof(buckets) / sizeof(buckets[0]));
	m_volumes =
	    metrics_gauge("gkm_csi_volumes_published", "Volumes published on this node", NULL);
	m_fallbacks = metrics_counter(
	    "gkm_csi_fallback_total",
	    "Volumes published as an empty directory (onMiss \"empty\") because the cache was "
	    "not usable on this node, by why: its state here (Pending, Pulling, Failed, "
	    "Incompatible, Deleting, NotReady), NotOnNode, RecordUnreadable or DataUnusable",
	    "reason");

	struct csi_node *n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	pthread_mutex_init(&n->lock, NULL);
	n->node_id = strdup(cfg->node_id);
	n->root = strdup(cfg->root);
	n->run_dir = strdup(cfg->run_dir);
	n->state_dir = cfg->state_dir ? strdup(cfg->state_dir) : join(cfg->root, "csi");
	n->volumes_dir = join(cfg->run_dir, "volumes");
	n->version = strdup(cfg->version && *cfg->version ? cfg->version : "0.0.0");
	n->driver = strdup(cfg->driver ? cfg->driver : CSI_DRIVER_NAME);
	n->size_limit = cfg->size_limit;
	int rc = -ENOMEM;
	if (!n->node_id || !n->root || !n->run_dir || !n->state_dir || !n->volumes_dir ||
	    !n->version || !n->driver)
		goto fail;
	/* The state directory goes into overlay mount options. */
	rc = -EINVAL;
	if (n->state_dir[0] != '/' || strpbrk(n->state_dir, ",:\\="))
		goto fail;
	if ((rc = fsutil_mkdirs(n->volumes_dir, 0700)) != 0)
		goto fail;
	if ((rc = recover(n)) != 0)
		goto fail;
	n->ready = true;
	*out = n;
	return 0;
fail:
	csi_node_free(n);
	return rc;
}
