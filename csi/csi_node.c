/* The CSI Identity and Node services (csi_node.h): replies, the volume table,
 * identity and node information, dispatch, start and stop. The calls that
 * change volumes live in csi_node_publish.c, csi_node_unpublish.c and
 * csi_node_stats.c (csi_node_impl.h). */
#include "csi_node_impl.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "csi_mount.h"
#include "fsutil.h"
#include "log.h"
#include "metrics.h"

static struct metric *m_calls, *m_seconds, *m_volumes;
struct metric *csi_node_m_fallbacks;

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

void csi_node_fail(struct csi_reply *r, int code, const char *fmt, ...)
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

void csi_node_reply(struct csi_reply *r, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf) {
		csi_node_fail(r, CSI_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	protobuf_c_message_pack(m, buf);
	r->code = CSI_OK;
	r->message[0] = '\0';
	r->body = buf;
	r->body_len = len;
}

/* Untrusted text quoted in a message: bounded, control characters replaced. */
const char *csi_node_shown(const char *s, char *buf, size_t size)
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
struct entry *csi_node_find_id(struct csi_node *n, const char *id)
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

struct entry *csi_node_find_target(struct csi_node *n, const char *target)
{
	for (size_t i = 0; i < n->nvols; i++)
		if (strcmp(n->vols[i]->v.target_path, target) == 0)
			return n->vols[i];
	return NULL;
}

/* The publication of volume id at target, or NULL; then *other is the
 * volume's one publication elsewhere when it is not shared. */
struct entry *csi_node_published_at(struct csi_node *n, const char *id, const char *target,
                                    struct entry **other)
{
	struct entry *e = csi_node_find_target(n, target);
	*other = NULL;
	if (e && strcmp(e->v.volume_id, id) == 0)
		return e;
	*other = csi_node_find_id(n, id);
	return NULL;
}

int csi_node_add_entry(struct csi_node *n, struct entry *e)
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

void csi_node_drop_entry(struct csi_node *n, struct entry *e)
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

void csi_node_count_volumes(struct csi_node *n)
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
/* ---- identity and node information ---- */

static void get_plugin_info(struct csi_node *n, const uint8_t *data, size_t len,
                            struct csi_reply *r)
{
	(void)data;
	(void)len;
	Csi__V1__GetPluginInfoResponse resp = CSI__V1__GET_PLUGIN_INFO_RESPONSE__INIT;
	resp.name = n->driver;
	resp.vendor_version = n->version;
	csi_node_reply(r, &resp.base);
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
	csi_node_reply(r, &resp.base);
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
	csi_node_reply(r, &resp.base);
}

static void node_get_info(struct csi_node *n, const uint8_t *data, size_t len, struct csi_reply *r)
{
	(void)data;
	(void)len;
	Csi__V1__NodeGetInfoResponse resp = CSI__V1__NODE_GET_INFO_RESPONSE__INIT;
	resp.node_id = n->node_id;
	csi_node_reply(r, &resp.base);
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
	csi_node_reply(r, &resp.base);
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
	csi_node_reply(r, &resp.base);
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
    {"Node", "NodePublishVolume", csi_node_publish, NULL},
    {"Node", "NodeUnpublishVolume", csi_node_unpublish, NULL},
    {"Node", "NodeGetVolumeStats", csi_node_stats, NULL},
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
			csi_node_fail(r, CSI_UNIMPLEMENTED, "%s is not implemented: %s", m->name,
			              m->why);
	} else if (method && controller_method(method)) {
		csi_node_fail(r, CSI_UNIMPLEMENTED, "%s is not implemented: %s",
		              csi_node_shown(method, b, 80), node_only);
	} else {
		csi_node_fail(r, CSI_UNIMPLEMENTED, "unknown method %s",
		              csi_node_shown(method, b, 80));
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
		if (csi_node_key_dir(n, de->d_name, NULL, path, sizeof(path)) != 0)
			continue;
		int rc = csi_node_clear_dir(path);
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
		if (!e || csi_node_add_entry(n, e) != 0) {
			free(e);
			rc = -ENOMEM;
			break;
		}
		e->v = list[i];
		memset(&list[i], 0, sizeof(list[i]));
		/* Usage may lag the state by one step if the last run died
		 * between the two writes. */
		int u = csi_node_usage_add(n, &e->v);
		int mounted = csi_mount_is_mountpoint(e->v.target_path);
		log_info("recovered volume", "volume", e->v.volume_id, "target", e->v.target_path,
		         "mounted", mounted == 1 ? "yes" : "no", "usage_error",
		         u ? strerror(-u) : "");
	}
	csi_volume_free_all(list, cnt);
	if (rc == 0)
		remove_orphans(n);
	csi_node_count_volumes(n);
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
	csi_node_m_fallbacks = metrics_counter(
	    "gkm_csi_fallback_total",
	    "Volumes published as an empty directory (onMiss \"empty\") because the cache was "
	    "not usable on this node, by why: its state here (Pending, Pulling, Failed, "
	    "Incompatible, Deleting, Evicted, NotReady), NotOnNode, RecordUnreadable or "
	    "DataUnusable",
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
