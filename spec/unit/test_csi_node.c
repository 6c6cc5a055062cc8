/* csi_node without gRPC: requests packed with protobuf-c go through
 * csi_node_call(); everything that is refused before mounting, state
 * recovery, the per-volume state files, and fallback volumes (onMiss
 * "empty": real bind mounts, skipped where mount(2) is not permitted).
 * Mounting the cache itself is covered by spec/e2e/csi.py. */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "shell.h"

#include "cache_view.h"
#include "csi.pb-c.h"
#include "csi_node.h"
#include "csi_volume.h"
#include "metrics.h"

#define HEX "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define DIGEST "sha256:" HEX
#define HEX2 "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static char dir[256], root[300], run[300];
static struct csi_node *node;

static int new_node(void)
{
	struct csi_node_config cfg = {
	    .node_id = "node-1", .root = root, .run_dir = run, .version = "1.2.3"};
	return csi_node_new(&cfg, &node);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "%s/gkm-node.XXXXXX",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(dir))
		return -1;
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(run, sizeof(run), "%s/run", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	csi_node_free(node);
	node = NULL;
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static int start(void **state)
{
	if (setup(state))
		return -1;
	sh("mkdir -p '%s/store/sha256/" HEX "' && echo hi > '%s/store/sha256/" HEX "/f'", root,
	   root);
	struct cache_view_ready r = {.digest = DIGEST, .state = "Ready", .compatible = true};
	if (cache_view_publish(root, "team-a", "llama", &r) != 0)
		return -1;
	/* The agent's records of caches in every other state; "stale" still
	 * has the data link of an earlier Ready digest. */
	const struct {
		const char *name;
		struct cache_view_ready r;
	} recs[] = {
	    {"pulling",
	     {.digest = DIGEST,
	      .state = "Pulling",
	      .compatible = true,
	      .reason = "Pulling",
	      .message = "pulling and extracting the image"}},
	    {"pending",
	     {.state = "Pending",
	      .compatible = true,
	      .reason = "DigestNotResolved",
	      .message = "waiting for the image digest"}},
	    {"failed",
	     {.digest = DIGEST,
	      .state = "Failed",
	      .compatible = true,
	      .reason = "PullFailed",
	      .message = "registry answered 503"}},
	    {"wronggpu",
	     {.digest = DIGEST,
	      .state = "Incompatible",
	      .compatible = false,
	      .reason = "ArchMismatch",
	      .message = "built for sm_90, node has sm_75"}},
	    {"deleting",
	     {.digest = DIGEST,
	      .state = "Deleting",
	      .compatible = true,
	      .reason = "InUse",
	      .message = "deleted; kept until 1 pod(s) stop using it"}},
	    {"evicted",
	     {.digest = DIGEST,
	      .state = "Evicted",
	      .compatible = true,
	      .reason = "HighThreshold",
	      .message = "evicted from the store of node n1 (25 MiB freed)"}},
	    {"stale",
	     {.digest = "sha256:" HEX2,
	      .state = "Pulling",
	      .compatible = true,
	      .reason = "Pulling",
	      .message = "pulling and extracting the image"}},
	};
	if (cache_view_publish(root, "team-a", "stale", &r) != 0)
		return -1;
	for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++)
		if (cache_view_record(root, "team-a", recs[i].name, &recs[i].r) != 0)
			return -1;
	return new_node();
}

/* Pack m, call method, return the reply (caller frees body). */
static struct csi_reply call(const char *method, const ProtobufCMessage *m)
{
	struct csi_reply r;
	size_t len = m ? protobuf_c_message_get_packed_size(m) : 0;
	uint8_t *buf = malloc(len + 1);
	assert_non_null(buf);
	if (m)
		protobuf_c_message_pack(m, buf);
	csi_node_call(node, method, buf, len, &r);
	free(buf);
	return r;
}

static void expect(struct csi_reply r, int code, const char *needle)
{
	if (r.code != code || (needle && !strstr(r.message, needle)))
		fail_msg("got %s '%s', want %s containing '%s'", csi_code_name(r.code), r.message,
		         csi_code_name(code), needle ? needle : "");
	free(r.body);
}

static void test_identity(void **state)
{
	(void)state;
	Csi__V1__GetPluginInfoRequest req = CSI__V1__GET_PLUGIN_INFO_REQUEST__INIT;
	struct csi_reply r = call("/csi.v1.Identity/GetPluginInfo", &req.base);
	assert_int_equal(r.code, CSI_OK);
	Csi__V1__GetPluginInfoResponse *info =
	    csi__v1__get_plugin_info_response__unpack(NULL, r.body_len, r.body);
	assert_non_null(info);
	assert_string_equal(info->name, "csi.gkm.io");
	assert_string_equal(info->vendor_version, "1.2.3");
	csi__v1__get_plugin_info_response__free_unpacked(info, NULL);
	free(r.body);

	Csi__V1__ProbeRequest preq = CSI__V1__PROBE_REQUEST__INIT;
	r = call("/csi.v1.Identity/Probe", &preq.base);
	assert_int_equal(r.code, CSI_OK);
	Csi__V1__ProbeResponse *probe = csi__v1__probe_response__unpack(NULL, r.body_len, r.body);
	assert_non_null(probe);
	assert_non_null(probe->ready);
	assert_true(probe->ready->value);
	csi__v1__probe_response__free_unpacked(probe, NULL);
	free(r.body);

	Csi__V1__NodeGetInfoRequest nreq = CSI__V1__NODE_GET_INFO_REQUEST__INIT;
	r = call("/csi.v1.Node/NodeGetInfo", &nreq.base);
	Csi__V1__NodeGetInfoResponse *ni =
	    csi__v1__node_get_info_response__unpack(NULL, r.body_len, r.body);
	assert_non_null(ni);
	assert_string_equal(ni->node_id, "node-1");
	csi__v1__node_get_info_response__free_unpacked(ni, NULL);
	free(r.body);

	Csi__V1__NodeGetCapabilitiesRequest creq = CSI__V1__NODE_GET_CAPABILITIES_REQUEST__INIT;
	r = call("/csi.v1.Node/NodeGetCapabilities", &creq.base);
	Csi__V1__NodeGetCapabilitiesResponse *caps =
	    csi__v1__node_get_capabilities_response__unpack(NULL, r.body_len, r.body);
	assert_non_null(caps);
	assert_int_equal(caps->n_capabilities, 1);
	assert_int_equal(caps->capabilities[0]->rpc->type,
	                 CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME_STATS);
	csi__v1__node_get_capabilities_response__free_unpacked(caps, NULL);
	free(r.body);

	/* Node-only: no CONTROLLER_SERVICE, and controller capabilities are
	 * answered with one entry that names none (UNKNOWN). */
	Csi__V1__GetPluginCapabilitiesRequest pcreq =
	    CSI__V1__GET_PLUGIN_CAPABILITIES_REQUEST__INIT;
	r = call("/csi.v1.Identity/GetPluginCapabilities", &pcreq.base);
	assert_int_equal(r.code, CSI_OK);
	Csi__V1__GetPluginCapabilitiesResponse *pc =
	    csi__v1__get_plugin_capabilities_response__unpack(NULL, r.body_len, r.body);
	assert_non_null(pc);
	for (size_t i = 0; i < pc->n_capabilities; i++)
		assert_false(pc->capabilities[i]->service &&
		             pc->capabilities[i]->service->type ==
		                 CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__CONTROLLER_SERVICE);
	csi__v1__get_plugin_capabilities_response__free_unpacked(pc, NULL);
	free(r.body);

	Csi__V1__ControllerGetCapabilitiesRequest ccreq =
	    CSI__V1__CONTROLLER_GET_CAPABILITIES_REQUEST__INIT;
	r = call("/csi.v1.Controller/ControllerGetCapabilities", &ccreq.base);
	assert_int_equal(r.code, CSI_OK);
	Csi__V1__ControllerGetCapabilitiesResponse *cc =
	    csi__v1__controller_get_capabilities_response__unpack(NULL, r.body_len, r.body);
	assert_non_null(cc);
	assert_int_equal(cc->n_capabilities, 1);
	assert_int_equal(cc->capabilities[0]->type_case,
	                 CSI__V1__CONTROLLER_SERVICE_CAPABILITY__TYPE_RPC);
	assert_non_null(cc->capabilities[0]->rpc);
	assert_int_equal(cc->capabilities[0]->rpc->type,
	                 CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__UNKNOWN);
	csi__v1__controller_get_capabilities_response__free_unpacked(cc, NULL);
	free(r.body);
}

static void test_unimplemented(void **state)
{
	(void)state;
	expect(call("/csi.v1.Node/NodeStageVolume", NULL), CSI_UNIMPLEMENTED, "NodeStageVolume");
	expect(call("/csi.v1.Node/NodeExpandVolume", NULL), CSI_UNIMPLEMENTED, "NodeExpandVolume");
	expect(call("/csi.v1.Controller/CreateVolume", NULL), CSI_UNIMPLEMENTED, "node-only");
	expect(call("/csi.v1.GroupController/GroupControllerGetCapabilities", NULL),
	       CSI_UNIMPLEMENTED, "node-only");
	expect(call("/some.Other/Method\n", NULL), CSI_UNIMPLEMENTED,
	       "unknown method /some.Other/Method?");
	struct csi_reply r;
	csi_node_call(node, NULL, NULL, 0, &r);
	expect(r, CSI_UNIMPLEMENTED, "unknown method");
}

static void test_malformed_messages(void **state)
{
	(void)state;
	const uint8_t junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
	struct csi_reply r;
	csi_node_call(node, "/csi.v1.Node/NodePublishVolume", junk, sizeof(junk), &r);
	expect(r, CSI_INVALID_ARGUMENT, "malformed");
	csi_node_call(node, "/csi.v1.Node/NodeUnpublishVolume", junk, sizeof(junk), &r);
	expect(r, CSI_INVALID_ARGUMENT, "malformed");
	csi_node_call(node, "/csi.v1.Node/NodeGetVolumeStats", junk, sizeof(junk), &r);
	expect(r, CSI_INVALID_ARGUMENT, "malformed");
}

struct kv {
	const char *k, *v;
};

static struct csi_reply publish_req(const char *vid, const char *target, const struct kv *ctx,
                                    bool with_cap, bool readonly)
{
	Csi__V1__NodePublishVolumeRequest req = CSI__V1__NODE_PUBLISH_VOLUME_REQUEST__INIT;
	Csi__V1__VolumeCapability cap = CSI__V1__VOLUME_CAPABILITY__INIT;
	Csi__V1__VolumeCapability__MountVolume mnt = CSI__V1__VOLUME_CAPABILITY__MOUNT_VOLUME__INIT;
	Csi__V1__VolumeCapability__AccessMode mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__INIT;
	Csi__V1__NodePublishVolumeRequest__VolumeContextEntry e[16], *ep[16];
	mode.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER;
	cap.access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT;
	cap.mount = &mnt;
	cap.access_mode = &mode;
	req.volume_id = (char *)vid;
	req.target_path = (char *)target;
	req.volume_capability = with_cap ? &cap : NULL;
	req.readonly = readonly;
	size_t n = 0;
	for (; ctx && ctx[n].k; n++) {
		Csi__V1__NodePublishVolumeRequest__VolumeContextEntry init =
		    CSI__V1__NODE_PUBLISH_VOLUME_REQUEST__VOLUME_CONTEXT_ENTRY__INIT;
		e[n] = init;
		e[n].key = (char *)ctx[n].k;
		e[n].value = (char *)ctx[n].v;
		ep[n] = &e[n];
	}
	req.n_volume_context = n;
	req.volume_context = ep;
	return call("/csi.v1.Node/NodePublishVolume", &req.base);
}

static struct csi_reply publish(const char *vid, const char *target, const struct kv *ctx,
                                bool with_cap)
{
	return publish_req(vid, target, ctx, with_cap, false);
}

#define POD_A                                                                                      \
	{"csi.storage.k8s.io/pod.namespace", "team-a"},                                            \
	{                                                                                          \
		"csi.storage.k8s.io/pod.name", "p"                                                 \
	}

static void test_publish_refusals(void **state)
{
	(void)state;
	char target[400];
	snprintf(target, sizeof(target), "%s/pod/mount", dir);
	const struct kv ok[] = {
	    {"cacheName", "llama"}, {"cacheNamespace", "team-a"}, POD_A, {0, 0}};

	expect(publish("", target, ok, true), CSI_INVALID_ARGUMENT, "volume_id is required");
	expect(publish("../v", target, ok, true), CSI_INVALID_ARGUMENT, "not usable");
	expect(publish("v1", "", ok, true), CSI_INVALID_ARGUMENT, "target_path is required");
	expect(publish("v1", "relative/path", ok, true), CSI_INVALID_ARGUMENT, "absolute");
	expect(publish("v1", "/a/../b", ok, true), CSI_INVALID_ARGUMENT, "normalised");
	expect(publish("v1", "/a//b", ok, true), CSI_INVALID_ARGUMENT, "normalised");
	expect(publish("v1", "/a/./b", ok, true), CSI_INVALID_ARGUMENT, "normalised");
	expect(publish("v1", "/a/b/", ok, true), CSI_INVALID_ARGUMENT, "normalised");
	expect(publish("v1", target, ok, false), CSI_INVALID_ARGUMENT, "volume_capability");

	const struct kv noname[] = {{"cacheNamespace", "team-a"}, POD_A, {0, 0}};
	expect(publish("v1", target, noname, true), CSI_INVALID_ARGUMENT, "cacheName is required");
	const struct kv trav[] = {
	    {"cacheName", "../../../etc"}, {"cacheNamespace", "team-a"}, POD_A, {0, 0}};
	expect(publish("v1", target, trav, true), CSI_INVALID_ARGUMENT, "not a valid object name");
	const struct kv travns[] = {
	    {"cacheName", "llama"}, {"cacheNamespace", "../x"}, POD_A, {0, 0}};
	expect(publish("v1", target, travns, true), CSI_INVALID_ARGUMENT, "not a valid namespace");
	const struct kv unknown[] = {{"cacheName", "llama"}, {"cachenamespace", "team-a"}, {0, 0}};
	expect(publish("v1", target, unknown, true), CSI_INVALID_ARGUMENT,
	       "unknown volume attribute");
	const struct kv both[] = {{"cacheName", "llama"}, {"csi.gkm.io/GKMCache", "other"}, {0, 0}};
	expect(publish("v1", target, both, true), CSI_INVALID_ARGUMENT, "contradicts");
	const struct kv ro[] = {{"cacheName", "llama"}, {"readOnly", "False"}, {0, 0}};
	expect(publish("v1", target, ro, true), CSI_INVALID_ARGUMENT, "readOnly");
	const struct kv miss[] = {{"cacheName", "nosuch"}, {"onMiss", "Empty"}, {0, 0}};
	expect(publish("v1", target, miss, true), CSI_INVALID_ARGUMENT,
	       "onMiss must be \"fail\" or \"empty\", not 'Empty'");
	const struct kv baduid[] = {
	    {"cacheName", "llama"}, {"csi.storage.k8s.io/pod.uid", "x/../y"}, {0, 0}};
	expect(publish("v1", target, baduid, true), CSI_INVALID_ARGUMENT, "uid");

	const struct kv other_ns[] = {{"cacheName", "llama"},
	                              {"csi.gkm.io/namespace", "team-a"},
	                              {"csi.storage.k8s.io/pod.namespace", "team-b"},
	                              {0, 0}};
	expect(publish("v1", target, other_ns, true), CSI_PERMISSION_DENIED, "namespace team-b");
	/* Authorisation is not readiness: a fallback is never a way in. */
	const struct kv other_ns_miss[] = {{"cacheName", "nosuch"},
	                                   {"cacheNamespace", "team-a"},
	                                   {"onMiss", "empty"},
	                                   {"csi.storage.k8s.io/pod.namespace", "team-b"},
	                                   {0, 0}};
	expect(publish("v1", target, other_ns_miss, true), CSI_PERMISSION_DENIED,
	       "a pod in namespace team-b may not mount GKMCache team-a/nosuch");
	const struct kv no_pod_ns_miss[] = {
	    {"cacheName", "pulling"}, {"cacheNamespace", "team-a"}, {"onMiss", "empty"}, {0, 0}};
	expect(publish("v1", target, no_pod_ns_miss, true), CSI_PERMISSION_DENIED,
	       "podInfoOnMount");
	const struct kv no_pod_ns[] = {
	    {"cacheName", "llama"}, {"cacheNamespace", "team-a"}, {0, 0}};
	expect(publish("v1", target, no_pod_ns, true), CSI_PERMISSION_DENIED, "podInfoOnMount");

	const struct kv missing[] = {
	    {"cacheName", "nosuch"}, {"cacheNamespace", "team-a"}, POD_A, {0, 0}};
	expect(publish("v1", target, missing, true), CSI_FAILED_PRECONDITION, "not on this node");
	const struct kv missing_fail[] = {{"cacheName", "nosuch"},
	                                  {"cacheNamespace", "team-a"},
	                                  {"onMiss", "fail"},
	                                  POD_A,
	                                  {0, 0}};
	expect(publish("v1", target, missing_fail, true), CSI_FAILED_PRECONDITION,
	       "not on this node");
	const struct kv cluster_missing[] = {{"cacheName", "llama"}, POD_A, {0, 0}};
	expect(publish("v1", target, cluster_missing, true), CSI_FAILED_PRECONDITION,
	       "ClusterGKMCache llama is not on this node");
	/* Each state of the agent's record, in the words the pod's events show. */
	const struct {
		const char *cache, *want;
	} states[] = {
	    {"pulling", "GKMCache team-a/pulling is not ready on this node yet (Pulling: pulling "
	                "and extracting the image)"},
	    {"pending", "GKMCache team-a/pending is not ready on this node yet (Pending, "
	                "DigestNotResolved: waiting for the image digest)"},
	    {"failed", "GKMCache team-a/failed failed on this node (PullFailed: registry answered "
	               "503)"},
	    {"wronggpu", "GKMCache team-a/wronggpu is incompatible with this node's GPUs "
	                 "(ArchMismatch: built for sm_90, node has sm_75)"},
	    {"deleting", "GKMCache team-a/deleting is being deleted and takes no new pods here "
	                 "(InUse: deleted; kept until 1 pod(s) stop using it)"},
	    {"stale", "GKMCache team-a/stale is not ready on this node yet (Pulling: pulling and "
	              "extracting the image)"},
	    {"evicted", "GKMCache team-a/evicted was evicted from this node's store to free space "
	                "(HighThreshold: evicted from the store of node n1 (25 MiB freed)); the "
	                "node pulls it again now, and the kubelet's next try mounts it once it is "
	                "Ready"},
	};
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
		const struct kv c[] = {
		    {"cacheName", states[i].cache}, {"cacheNamespace", "team-a"}, POD_A, {0, 0}};
		struct csi_reply r = publish("v1", target, c, true);
		if (r.code != CSI_FAILED_PRECONDITION || strcmp(r.message, states[i].want) != 0)
			fail_msg("%s: got %s '%s', want '%s'", states[i].cache,
			         csi_code_name(r.code), r.message, states[i].want);
		free(r.body);
	}

	/* The ask for the evicted cache is left for the agent, and only that. */
	int64_t at = 0;
	assert_int_equal(cache_view_wanted_at(run, "team-a", "evicted", &at), 0);
	assert_true(at >= (int64_t)time(NULL) - 60);
	assert_int_equal(cache_view_wanted_at(run, "team-a", "failed", &at), -ENOENT);
	assert_int_equal(cache_view_wanted_at(run, "team-a", "deleting", &at), -ENOENT);

	/* Nothing was created or recorded by any of these. */
	struct stat st;
	assert_int_equal(stat(target, &st), -1);
	assert_int_equal(csi_node_volume_count(node), 0);
}

static void test_unpublish_and_stats_unknown(void **state)
{
	(void)state;
	Csi__V1__NodeUnpublishVolumeRequest u = CSI__V1__NODE_UNPUBLISH_VOLUME_REQUEST__INIT;
	u.volume_id = "v-none";
	u.target_path = "/nonexistent/gkm/target";
	expect(call("/csi.v1.Node/NodeUnpublishVolume", &u.base), CSI_OK, NULL);
	u.target_path = "";
	expect(call("/csi.v1.Node/NodeUnpublishVolume", &u.base), CSI_INVALID_ARGUMENT,
	       "target_path");

	Csi__V1__NodeGetVolumeStatsRequest s = CSI__V1__NODE_GET_VOLUME_STATS_REQUEST__INIT;
	s.volume_id = "v-none";
	s.volume_path = "/nonexistent/gkm/target";
	expect(call("/csi.v1.Node/NodeGetVolumeStats", &s.base), CSI_NOT_FOUND, "not published");
	/* The volume is looked up first: an unknown one is NOT_FOUND whatever
	 * the path (CSI conformance asks with "some/path"). */
	s.volume_path = "some/path";
	expect(call("/csi.v1.Node/NodeGetVolumeStats", &s.base), CSI_NOT_FOUND,
	       "volume v-none is not published on this node");
	s.volume_id = "a/../b";
	expect(call("/csi.v1.Node/NodeGetVolumeStats", &s.base), CSI_NOT_FOUND, "not published");
	s.volume_id = "";
	expect(call("/csi.v1.Node/NodeGetVolumeStats", &s.base), CSI_INVALID_ARGUMENT,
	       "volume_id is required");
	s.volume_id = "v-none";
	s.volume_path = "";
	expect(call("/csi.v1.Node/NodeGetVolumeStats", &s.base), CSI_INVALID_ARGUMENT,
	       "volume_path is required");
}

static void test_metrics(void **state)
{
	(void)state;
	struct metric *m = metrics_counter("gkm_csi_calls_total", "", "method,code");
	double before = metrics_value(m, METRICS_L("NodeGetInfo", "OK"));
	Csi__V1__NodeGetInfoRequest nreq = CSI__V1__NODE_GET_INFO_REQUEST__INIT;
	expect(call("/csi.v1.Node/NodeGetInfo", &nreq.base), CSI_OK, NULL);
	expect(call("/csi.v1.Node/NodeGetInfo", &nreq.base), CSI_OK, NULL);
	assert_true(metrics_value(m, METRICS_L("NodeGetInfo", "OK")) == before + 2);
	double unimpl = metrics_value(m, METRICS_L("NodeStageVolume", "UNIMPLEMENTED"));
	expect(call("/csi.v1.Node/NodeStageVolume", NULL), CSI_UNIMPLEMENTED, NULL);
	assert_true(metrics_value(m, METRICS_L("NodeStageVolume", "UNIMPLEMENTED")) == unimpl + 1);

	/* Each controller method under its own name; paths outside the
	 * specification under "other". */
	const char *ctl[][2] = {
	    {"/csi.v1.Controller/CreateVolume", "CreateVolume"},
	    {"/csi.v1.Controller/ControllerPublishVolume", "ControllerPublishVolume"},
	    {"/csi.v1.GroupController/GroupControllerGetCapabilities",
	     "GroupControllerGetCapabilities"},
	    {"/csi.v1.Controller/NoSuchMethod", "other"},
	    {"/csi.v1.Controller/NoSuchMethod2", "other"},
	};
	for (size_t i = 0; i < sizeof(ctl) / sizeof(ctl[0]); i++) {
		double before_i = metrics_value(m, METRICS_L(ctl[i][1], "UNIMPLEMENTED"));
		expect(call(ctl[i][0], NULL), CSI_UNIMPLEMENTED, "node-only");
		assert_true(metrics_value(m, METRICS_L(ctl[i][1], "UNIMPLEMENTED")) ==
		            before_i + 1);
	}
	assert_true(metrics_value(m, METRICS_L("Controller", "UNIMPLEMENTED")) == 0);
	double caps = metrics_value(m, METRICS_L("ControllerGetCapabilities", "OK"));
	expect(call("/csi.v1.Controller/ControllerGetCapabilities", NULL), CSI_OK, NULL);
	assert_true(metrics_value(m, METRICS_L("ControllerGetCapabilities", "OK")) == caps + 1);
}

static struct csi_volume volume(const char *id)
{
	struct csi_volume v = {
	    .volume_id = (char *)id,
	    .target_path = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/x/mount",
	    .cache_namespace = "team-a",
	    .cache_name = "llama",
	    .digest = DIGEST,
	    .pod_name = "p",
	    .pod_namespace = "team-a",
	    .pod_uid = "u",
	    .writable = true,
	    .started = 1714564800,
	};
	return v;
}

static void test_recovery(void **state)
{
	(void)state;
	char vdir[400];
	snprintf(vdir, sizeof(vdir), "%s/volumes", run);
	struct csi_volume v = volume("v-rec");
	assert_int_equal(csi_volume_save(vdir, &v), 0);
	/* Malformed, mismatching and stray files are ignored, never fatal. */
	sh("echo '{not json' > '%s/v-bad.json'", vdir);
	sh("sed 's/v-rec/v-other/' '%s/v-rec.json' > '%s/v-mismatch.json'", vdir, vdir);
	sh("echo x > '%s/README'", vdir);
	/* Overlay directories of volumes nobody knows are removed at start. */
	sh("mkdir -p '%s/csi/volumes/v-orphan/upper' '%s/csi/volumes/v-rec/upper'", root, root);
	assert_int_equal(new_node(), 0);
	assert_int_equal(csi_node_volume_count(node), 1);
	size_t pods = 0;
	assert_int_equal(cache_view_in_use(run, "team-a", "llama", &pods), 0);
	assert_int_equal(pods, 1);
	struct stat st;
	char p[512];
	snprintf(p, sizeof(p), "%s/csi/volumes/v-orphan", root);
	assert_int_equal(stat(p, &st), -1);
	snprintf(p, sizeof(p), "%s/csi/volumes/v-rec/upper", root);
	assert_int_equal(stat(p, &st), 0);
	snprintf(p, sizeof(p), "%s/v-bad.json", vdir);
	assert_int_equal(stat(p, &st), 0); /* left for a human */

	/* Stats of a recovered volume that is not mounted: NOT_FOUND. */
	Csi__V1__NodeGetVolumeStatsRequest s = CSI__V1__NODE_GET_VOLUME_STATS_REQUEST__INIT;
	s.volume_id = "v-rec";
	s.volume_path = v.target_path;
	expect(call("/csi.v1.Node/NodeGetVolumeStats", &s.base), CSI_NOT_FOUND, "not mounted");
}

static void test_volume_files(void **state)
{
	(void)state;
	char vdir[400];
	snprintf(vdir, sizeof(vdir), "%s/volumes", run);
	assert_true(csi_volume_valid_id("csi-0123abcd"));
	assert_false(csi_volume_valid_id(".hidden"));
	assert_false(csi_volume_valid_id("a/b"));
	assert_false(csi_volume_valid_id(""));
	struct csi_volume bad = volume("../escape");
	assert_int_equal(csi_volume_save(vdir, &bad), -EINVAL);

	struct csi_volume a = volume("v-a"), b = volume("v-a");
	assert_true(csi_volume_same(&a, &b));
	b.digest = "sha256:" HEX; /* digest and start time do not matter */
	b.started = 1;
	assert_true(csi_volume_same(&a, &b));
	b.writable = false;
	assert_false(csi_volume_same(&a, &b));
	b = a;
	b.empty_on_miss = true;
	assert_false(csi_volume_same(&a, &b));
	b = a;
	b.pod_read_only = true;
	assert_false(csi_volume_same(&a, &b));

	assert_int_equal(csi_volume_save(vdir, &a), 0);
	struct csi_volume *list = NULL;
	size_t n = 0;
	assert_int_equal(csi_volume_load_all(vdir, &list, &n), 0);
	assert_int_equal(n, 1);
	assert_true(csi_volume_same(&list[0], &a));
	assert_string_equal(list[0].digest, DIGEST);
	assert_int_equal(list[0].started, 1714564800);
	assert_false(list[0].fallback || list[0].empty_on_miss);
	csi_volume_free_all(list, n);

	/* A fallback volume: no digest, and the why kept for the usage file. */
	struct csi_volume fb = volume("v-fb");
	fb.digest = "";
	fb.empty_on_miss = true;
	fb.fallback = true;
	fb.fallback_state = "Failed";
	fb.fallback_reason = "PullFailed";
	fb.fallback_message = "GKMCache team-a/llama failed on this node";
	assert_int_equal(csi_volume_save(vdir, &fb), 0);
	assert_int_equal(csi_volume_load_all(vdir, &list, &n), 0);
	assert_int_equal(n, 2);
	struct csi_volume *got = strcmp(list[0].volume_id, "v-fb") == 0 ? &list[0] : &list[1];
	assert_true(csi_volume_same(got, &fb));
	assert_true(got->fallback);
	assert_string_equal(got->digest, "");
	assert_string_equal(got->fallback_state, "Failed");
	assert_string_equal(got->fallback_reason, "PullFailed");
	assert_string_equal(got->fallback_message, fb.fallback_message);
	csi_volume_free_all(list, n);
	/* A digest-less volume that is no fallback is not loaded. */
	sh("sed 's/\"fallback\":{[^}]*}/\"x\":1/' '%s/v-fb.json' > '%s/v-fb2.json' && "
	   "sed -i 's/v-fb/v-fb2/' '%s/v-fb2.json'",
	   vdir, vdir, vdir);
	assert_int_equal(csi_volume_load_all(vdir, &list, &n), 0);
	assert_int_equal(n, 2);
	csi_volume_free_all(list, n);
	sh("rm '%s/v-fb2.json'", vdir);
	struct csi_volume fbv = volume("v-fb");
	assert_int_equal(csi_volume_remove(vdir, &fbv), 0);
	assert_int_equal(csi_volume_remove(vdir, &a), 0);
	assert_int_equal(csi_volume_remove(vdir, &a), 0);
	assert_int_equal(csi_volume_load_all(vdir, &list, &n), 0);
	assert_int_equal(n, 0);
	free(list);

	/* A shared volume: a file per target, named by the key. */
	struct csi_volume s1 = volume("gkm-pv"), s2 = volume("gkm-pv");
	s1.shared = s2.shared = true;
	s2.target_path = "/var/lib/kubelet/pods/other/volumes/kubernetes.io~csi/gkm-pv/mount";
	assert_false(csi_volume_same(&s1, &a));
	char k1[CSI_VOLUME_KEY_MAX + 1], k2[CSI_VOLUME_KEY_MAX + 1];
	csi_volume_key(&s1, k1);
	csi_volume_key(&s2, k2);
	assert_true(strncmp(k1, "gkm-pv@", 7) == 0 && strlen(k1) == 7 + 16);
	assert_string_not_equal(k1, k2);
	assert_true(csi_volume_valid_key(k1));
	assert_false(csi_volume_valid_key("gkm-pv@xyz"));
	assert_false(csi_volume_valid_key("../x@0123456789abcdef"));
	assert_int_equal(csi_volume_save(vdir, &s1), 0);
	assert_int_equal(csi_volume_save(vdir, &s2), 0);
	assert_int_equal(csi_volume_load_all(vdir, &list, &n), 0);
	assert_int_equal(n, 2);
	assert_true(list[0].shared && list[1].shared);
	csi_volume_free_all(list, n);
	/* a file renamed to another target's key is not loaded */
	sh("mv '%s/%s.json' '%s/gkm-pv@0000000000000000.json'", vdir, k2, vdir);
	assert_int_equal(csi_volume_load_all(vdir, &list, &n), 0);
	assert_int_equal(n, 1);
	csi_volume_free_all(list, n);
	sh("rm '%s/gkm-pv@0000000000000000.json'", vdir);
	assert_int_equal(csi_volume_remove(vdir, &s1), 0);
}

/* ---- fallback volumes (onMiss "empty") ---- */

/* Whether this process may bind mount; says why it skips when not (the
 * probe's directories are the test's own: failing to make them fails). */
static bool mount_permitted(void)
{
	char a[400], b[400];
	snprintf(a, sizeof(a), "%s/probe-a", dir);
	snprintf(b, sizeof(b), "%s/probe-b", dir);
	assert_int_equal(mkdir(a, 0700), 0);
	assert_int_equal(mkdir(b, 0700), 0);
	bool ok = mount(a, b, NULL, MS_BIND, NULL) == 0;
	if (ok)
		assert_int_equal(umount2(b, 0), 0);
	else
		print_message("# skipped: bind mounts are not permitted here (%s; run as root)\n",
		              strerror(errno));
	rmdir(a);
	rmdir(b);
	return ok;
}

static struct csi_reply unpublish(const char *vid, const char *target)
{
	Csi__V1__NodeUnpublishVolumeRequest u = CSI__V1__NODE_UNPUBLISH_VOLUME_REQUEST__INIT;
	u.volume_id = (char *)vid;
	u.target_path = (char *)target;
	return call("/csi.v1.Node/NodeUnpublishVolume", &u.base);
}

static double fallbacks(const char *label)
{
	struct metric *m = metrics_counter("gkm_csi_fallback_total", "", "reason");
	return metrics_value(m, METRICS_L(label));
}

static bool same_inode(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* The one usage entry of cache (team-a, name); caller frees u. */
static const struct cache_view_pod *only_entry(const char *name, struct cache_view_usage *u)
{
	assert_int_equal(cache_view_usage_read(run, "team-a", name, u), 0);
	assert_int_equal(u->npods, 1);
	return &u->pods[0];
}

static void test_fallback_volumes(void **state)
{
	(void)state;
	if (!mount_permitted())
		skip();
	/* Every way a cache can be not usable here, as the record says it. */
	const struct {
		const char *cache, *state, *reason, *label, *message;
	} cases[] = {
	    {"pulling", "Pulling", "Pulling", "Pulling",
	     "GKMCache team-a/pulling is not ready on this node yet (Pulling: pulling and "
	     "extracting the image)"},
	    {"pending", "Pending", "DigestNotResolved", "Pending",
	     "GKMCache team-a/pending is not ready on this node yet (Pending, DigestNotResolved: "
	     "waiting for the image digest)"},
	    {"failed", "Failed", "PullFailed", "Failed",
	     "GKMCache team-a/failed failed on this node (PullFailed: registry answered 503)"},
	    {"wronggpu", "Incompatible", "ArchMismatch", "Incompatible",
	     "GKMCache team-a/wronggpu is incompatible with this node's GPUs (ArchMismatch: "
	     "built for sm_90, node has sm_75)"},
	    {"deleting", "Deleting", "InUse", "Deleting",
	     "GKMCache team-a/deleting is being deleted and takes no new pods here (InUse: "
	     "deleted; kept until 1 pod(s) stop using it)"},
	    {"stale", "Pulling", "Pulling", "Pulling",
	     "GKMCache team-a/stale is not ready on this node yet (Pulling: pulling and "
	     "extracting the image)"},
	    {"evicted", "Evicted", "HighThreshold", "Evicted",
	     "GKMCache team-a/evicted was evicted from this node's store to free space"},
	    {"nosuch", "Unknown", "NotOnNode", "NotOnNode",
	     "GKMCache team-a/nosuch is not on this node: the agent has no record of it here"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char target[400], vid[64], fdir[600], file[500];
		snprintf(vid, sizeof(vid), "v-fb-%s", cases[i].cache);
		snprintf(target, sizeof(target), "%s/pods/%s/mount", dir, cases[i].cache);
		snprintf(fdir, sizeof(fdir), "%s/csi/volumes/%s/fallback", root, vid);
		sh("mkdir -p '%s/pods/%s'", dir, cases[i].cache);
		const struct kv c[] = {{"cacheName", cases[i].cache},
		                       {"cacheNamespace", "team-a"},
		                       {"onMiss", "empty"},
		                       {"csi.storage.k8s.io/pod.uid", "uid-1"},
		                       POD_A,
		                       {0, 0}};
		double before = fallbacks(cases[i].label);
		expect(publish(vid, target, c, true), CSI_OK, NULL);
		/* A repeat is answered OK, and neither mounts nor counts again. */
		expect(publish(vid, target, c, true), CSI_OK, NULL);
		assert_true(fallbacks(cases[i].label) == before + 1);

		/* The target is the volume's own directory, empty and writable,
		 * under the state directory and nowhere near the store. */
		assert_true(same_inode(target, fdir));
		sh("test -z \"$(ls -A '%s')\"", target);
		snprintf(file, sizeof(file), "%s/compiled-by-pod", target);
		FILE *f = fopen(file, "w");
		assert_non_null(f);
		fputs("kernel", f);
		assert_int_equal(fclose(f), 0);
		sh("test \"$(cat '%s/compiled-by-pod')\" = kernel", fdir);
		sh("test -z \"$(find '%s/store' '%s/caches' -name compiled-by-pod)\"", root, root);

		/* The usage entry says fallback, and why. */
		struct cache_view_usage u;
		const struct cache_view_pod *p = only_entry(cases[i].cache, &u);
		assert_true(p->fallback);
		assert_string_equal(p->fallback_state, cases[i].state);
		assert_string_equal(p->fallback_reason, cases[i].reason);
		if (strncmp(p->fallback_message, cases[i].message, strlen(cases[i].message)) != 0)
			fail_msg("%s: message '%s'", cases[i].cache, p->fallback_message);
		assert_string_equal(p->digest, "");
		assert_false(p->read_only);
		assert_string_equal(p->uid, "uid-1");
		cache_view_usage_free(&u);
		size_t pods = 9;
		assert_int_equal(cache_view_in_use(run, "team-a", cases[i].cache, &pods), 0);
		assert_int_equal(pods, 0);

		/* Stats measure the pod's own directory. */
		Csi__V1__NodeGetVolumeStatsRequest sr =
		    CSI__V1__NODE_GET_VOLUME_STATS_REQUEST__INIT;
		sr.volume_id = vid;
		sr.volume_path = target;
		struct csi_reply r = call("/csi.v1.Node/NodeGetVolumeStats", &sr.base);
		assert_int_equal(r.code, CSI_OK);
		Csi__V1__NodeGetVolumeStatsResponse *st =
		    csi__v1__node_get_volume_stats_response__unpack(NULL, r.body_len, r.body);
		assert_non_null(st);
		assert_int_equal(st->n_usage, 2);
		assert_int_equal(st->usage[1]->used, 2); /* the directory and the file */
		assert_true(st->usage[0]->available > 0);
		csi__v1__node_get_volume_stats_response__free_unpacked(st, NULL);
		free(r.body);

		/* Unpublish removes everything the pod wrote; a repeat is OK. */
		expect(unpublish(vid, target), CSI_OK, NULL);
		struct stat sb;
		assert_int_equal(stat(target, &sb), -1);
		assert_int_equal(stat(fdir, &sb), -1);
		assert_int_equal(cache_view_in_use(run, "team-a", cases[i].cache, &pods), 0);
		assert_int_equal(cache_view_usage_read(run, "team-a", cases[i].cache, &u), 0);
		assert_int_equal(u.npods, 0);
		cache_view_usage_free(&u);
		expect(unpublish(vid, target), CSI_OK, NULL);
	}
	assert_int_equal(csi_node_volume_count(node), 0);
}

static void test_fallback_ready_and_read_only(void **state)
{
	(void)state;
	if (!mount_permitted())
		skip();
	char target[400], file[500];
	struct stat sb;
	/* A Ready cache is mounted as the cache, whatever onMiss says. */
	snprintf(target, sizeof(target), "%s/ready", dir);
	const struct kv ready[] = {{"cacheName", "llama"},
	                           {"cacheNamespace", "team-a"},
	                           {"onMiss", "empty"},
	                           POD_A,
	                           {0, 0}};
	double before = fallbacks("Pulling") + fallbacks("NotOnNode");
	expect(publish("v-ready", target, ready, true), CSI_OK, NULL);
	snprintf(file, sizeof(file), "%s/f", target);
	assert_int_equal(stat(file, &sb), 0);
	struct cache_view_usage u;
	const struct cache_view_pod *p = only_entry("llama", &u);
	assert_false(p->fallback);
	assert_string_equal(p->digest, DIGEST);
	cache_view_usage_free(&u);
	assert_true(fallbacks("Pulling") + fallbacks("NotOnNode") == before);
	/* The same volume with another onMiss is another request. */
	const struct kv ready_fail[] = {
	    {"cacheName", "llama"}, {"cacheNamespace", "team-a"}, POD_A, {0, 0}};
	expect(publish("v-ready", target, ready_fail, true), CSI_ALREADY_EXISTS,
	       "other attributes");
	expect(unpublish("v-ready", target), CSI_OK, NULL);

	/* The pod spec's readOnly holds for a fallback too. */
	snprintf(target, sizeof(target), "%s/ro", dir);
	const struct kv miss[] = {{"cacheName", "pulling"},
	                          {"cacheNamespace", "team-a"},
	                          {"onMiss", "empty"},
	                          POD_A,
	                          {0, 0}};
	expect(publish_req("v-ro", target, miss, true, true), CSI_OK, NULL);
	snprintf(file, sizeof(file), "%s/x", target);
	assert_null(fopen(file, "w"));
	assert_int_equal(errno, EROFS);
	p = only_entry("pulling", &u);
	assert_true(p->fallback && p->read_only);
	cache_view_usage_free(&u);

	/* A restarted plugin finds the fallback volume again. */
	csi_node_free(node);
	node = NULL;
	assert_int_equal(new_node(), 0);
	assert_int_equal(csi_node_volume_count(node), 1);
	p = only_entry("pulling", &u);
	assert_true(p->fallback);
	assert_string_equal(p->fallback_reason, "Pulling");
	cache_view_usage_free(&u);
	expect(publish_req("v-ro", target, miss, true, true), CSI_OK, NULL);
	expect(unpublish("v-ro", target), CSI_OK, NULL);
	char fdir[500];
	snprintf(fdir, sizeof(fdir), "%s/csi/volumes/v-ro", root);
	assert_int_equal(stat(fdir, &sb), -1);
	assert_int_equal(csi_node_volume_count(node), 0);
}

static void test_bad_config(void **state)
{
	(void)state;
	struct csi_node_config cfg = {.node_id = "n",
	                              .root = root,
	                              .run_dir = run,
	                              .state_dir = "/var/lib/gkm,upperdir=/etc"};
	assert_int_equal(csi_node_new(&cfg, &node), -EINVAL);
	assert_null(node);
	cfg.state_dir = NULL;
	cfg.node_id = "";
	assert_int_equal(csi_node_new(&cfg, &node), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_identity, start, teardown),
	    cmocka_unit_test_setup_teardown(test_unimplemented, start, teardown),
	    cmocka_unit_test_setup_teardown(test_malformed_messages, start, teardown),
	    cmocka_unit_test_setup_teardown(test_publish_refusals, start, teardown),
	    cmocka_unit_test_setup_teardown(test_unpublish_and_stats_unknown, start, teardown),
	    cmocka_unit_test_setup_teardown(test_metrics, start, teardown),
	    cmocka_unit_test_setup_teardown(test_recovery, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_volume_files, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_fallback_volumes, start, teardown),
	    cmocka_unit_test_setup_teardown(test_fallback_ready_and_read_only, start, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_config, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
