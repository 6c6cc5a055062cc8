#!/usr/bin/python3
"""The CSI node plugin end to end: the real `gkm csi` on a unix socket, a real
gRPC client (stubs generated from csi/csi.proto), real mounts in temp dirs.
The agent's side (store entries, ready.json, data links) is fabricated here
in the documented on-node format."""
import concurrent.futures
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import csi_client as cc  # noqa: E402
from tap import Tap  # noqa: E402

import grpc  # noqa: E402

# The plugin reads untrusted messages and files: run its sanitizer build when
# there is one (a leak or an error then fails the clean-exit checks).
if os.access(os.environ.get("GKM_BIN_SAN", ""), os.X_OK):
    cc.BIN = os.environ["GKM_BIN_SAN"]

t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-csi-e2e.")
root, run, pods = os.path.join(tmp, "root"), os.path.join(tmp, "run"), os.path.join(tmp, "pods")
for d in (root, run, pods):
    os.makedirs(d)
plugin = None


def cleanup():
    if plugin:
        plugin.stop()
    cc.unmount_below(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


reason = cc.mount_permitted(tmp)
if reason:
    t.skip("CSI node plugin end to end", reason)
    cleanup()
    sys.exit(t.finish())

pb, pbg = cc.load_stubs(os.path.join(tmp, "py"))
C = grpc.StatusCode
lay = cc.Layout(root)

# ---- the agent's layout ----
FILES = {
    "io.triton.cache/AAAA/kernel.json": b'{"target":{"backend":"cuda","arch":90}}',
    "io.triton.cache/AAAA/kernel.cubin": b"\x7fELF" + b"\0" * 5000,
    "io.triton.cache/BBBB/__grp__kernel.json": b"{}",
    "io.triton.manifest/manifest.json": b'{"entries":2}',
}
digest = lay.store_entry(FILES)
store_entry = os.path.join(root, "store", "sha256", digest[7:])
lay.view("team-a", "llama", digest)
lay.view(None, "shared", digest)
# The agent's record in each state that is not Ready, as it writes it: no
# data link, except where an earlier digest is still linked ("stale").
lay.view("team-a", "pulling", digest, state="Pulling", reason="Pulling",
         message="pulling and extracting the image", data=False)
lay.view("team-a", "pending", None, state="Pending", reason="DigestNotResolved",
         message="waiting for the image digest", data=False)
lay.view("team-a", "failed", digest, state="Failed", reason="PullFailed",
         message="registry answered 503", data=False)
lay.view("team-a", "wronggpu", digest, state="Incompatible", compatible=False,
         reason="ArchMismatch", message="built for sm_90, node has sm_80", data=False)
lay.view("team-a", "deleting", digest, state="Deleting", reason="InUse",
         message="deleted; kept until 1 pod(s) stop using it")
lay.view("team-a", "stale", digest, state="Pulling", reason="Pulling",
         message="pulling and extracting the image")
lay.view("team-a", "readyincompatible", digest, compatible=False, reason="ArchMismatch",
         message="built for sm_90")
lay.view("team-a", "broken", digest, ready_text='{"digest": "sha256:nope"')
os.makedirs(os.path.join(tmp, "elsewhere", digest[7:]))
lay.view("team-a", "escape", digest, link="../../../../elsewhere/" + digest[7:])


def channel():
    return grpc.insecure_channel(plugin.endpoint)


def call(fn, req):
    """(code, response or details)."""
    try:
        return C.OK, fn(req, timeout=30)
    except grpc.RpcError as e:
        return e.code(), e.details()


def target(name):
    return os.path.join(pods, name, "mount")


def new_target(name):
    os.makedirs(os.path.join(pods, name), exist_ok=True)
    return target(name)


def usage(ns, name):
    p = os.path.join(run, "usage", ns or "_cluster", name, "usage.json")
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return json.load(f)["pods"]


def state_files():
    d = os.path.join(run, "volumes")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def publish(node, vid, tgt, cache="llama", **kw):
    return call(node.NodePublishVolume, cc.publish_request(pb, vid, tgt, cache, **kw))


def unpublish(node, vid, tgt):
    return call(node.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt))


def stats(node, vid, path):
    return call(node.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=path))


class UsageLock:
    """Hold the lock the plugin takes to update a cache's usage file, so that
    publishes of that cache are provably in flight until release()."""

    def __init__(self, ns, name):
        d = os.path.join(run, "usage", ns, name)
        os.makedirs(d, exist_ok=True)
        self.fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self):
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def tree_counts(path):
    n, size = 0, 0
    for d, dirs, files in os.walk(path):
        n += 1
        for f in files:
            n += 1
            size += os.lstat(os.path.join(d, f)).st_size
    return n, size


def test_identity_and_node_info():
    with channel() as ch:
        ident, node = pbg.IdentityStub(ch), pbg.NodeStub(ch)
        code, info = call(ident.GetPluginInfo, pb.GetPluginInfoRequest())
        t.ok(code == C.OK and info.name == "csi.gkm.io" and info.vendor_version,
             "GetPluginInfo names csi.gkm.io with a version", diag=(code, info))
        code, caps = call(ident.GetPluginCapabilities, pb.GetPluginCapabilitiesRequest())
        t.ok(code == C.OK and not any(c.service.type == pb.PluginCapability.Service.CONTROLLER_SERVICE
                                      for c in caps.capabilities),
             "GetPluginCapabilities: node-only plugin (no controller service)", diag=(code, caps))
        code, probe = call(ident.Probe, pb.ProbeRequest())
        t.ok(code == C.OK and probe.HasField("ready") and probe.ready.value, "Probe reports ready",
             diag=(code, probe))
        code, ni = call(node.NodeGetInfo, pb.NodeGetInfoRequest())
        t.ok(code == C.OK and ni.node_id == "node-1", "NodeGetInfo returns the node id", diag=(code, ni))
        code, nc = call(node.NodeGetCapabilities, pb.NodeGetCapabilitiesRequest())
        types = [c.rpc.type for c in nc.capabilities] if code == C.OK else None
        t.eq(types, [pb.NodeServiceCapability.RPC.GET_VOLUME_STATS],
             "NodeGetCapabilities advertises GET_VOLUME_STATS only")
        code, cc_ = call(pbg.ControllerStub(ch).ControllerGetCapabilities, pb.ControllerGetCapabilitiesRequest())
        t.ok(code == C.OK and len(cc_.capabilities) == 1 and cc_.capabilities[0].HasField("rpc")
             and cc_.capabilities[0].rpc.type == pb.ControllerServiceCapability.RPC.UNKNOWN,
             "ControllerGetCapabilities answers OK with one capability naming none (UNKNOWN)",
             diag=(code, cc_))


def test_unimplemented():
    with channel() as ch:
        node, ctl = pbg.NodeStub(ch), pbg.ControllerStub(ch)
        for name, fn, req in [
            ("NodeStageVolume", node.NodeStageVolume, pb.NodeStageVolumeRequest(volume_id="v")),
            ("NodeUnstageVolume", node.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(volume_id="v")),
            ("NodeExpandVolume", node.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_id="v")),
            ("Controller DeleteVolume", ctl.DeleteVolume, pb.DeleteVolumeRequest(volume_id="v")),
        ]:
            code, details = call(fn, req)
            t.ok(code == C.UNIMPLEMENTED and "not implemented" in details,
                 "%s answers UNIMPLEMENTED" % name, diag=(code, details))


def test_conformance_node():
    """What CSI conformance (csi-sanity's Node Service specs) expects of a
    node-only plugin, checked with the same requests it sends."""
    tgt = new_target("sanity")
    with channel() as ch:
        ident, node, ctl = pbg.IdentityStub(ch), pbg.NodeStub(ch), pbg.ControllerStub(ch)
        # Before every node spec: plugin capabilities, then controller
        # capabilities (an error or a nil list fails the spec).
        code, caps = call(ident.GetPluginCapabilities, pb.GetPluginCapabilitiesRequest())
        t.ok(code == C.OK and pb.PluginCapability.Service.CONTROLLER_SERVICE not in
             [c.service.type for c in caps.capabilities if c.HasField("service")],
             "sanity: no CONTROLLER_SERVICE in GetPluginCapabilities", diag=(code, caps))
        code, cc_ = call(ctl.ControllerGetCapabilities, pb.ControllerGetCapabilitiesRequest())
        t.ok(code == C.OK and len(cc_.capabilities) > 0 and all(c.HasField("rpc") for c in cc_.capabilities)
             and pb.ControllerServiceCapability.RPC.EXPAND_VOLUME not in [c.rpc.type for c in cc_.capabilities],
             "sanity: ControllerGetCapabilities succeeds with a non-empty list, every entry an rpc, "
             "no EXPAND_VOLUME", diag=(code, cc_))
        code, nc = call(node.NodeGetCapabilities, pb.NodeGetCapabilitiesRequest())
        known = set(pb.NodeServiceCapability.RPC.Type.values())
        t.ok(code == C.OK and all(c.HasField("rpc") and c.rpc.type in known for c in nc.capabilities),
             "sanity: NodeGetCapabilities lists known rpc capabilities only", diag=(code, nc))
        code, ni = call(node.NodeGetInfo, pb.NodeGetInfoRequest())
        t.ok(code == C.OK and ni.node_id and ni.max_volumes_per_node >= 0,
             "sanity: NodeGetInfo has a node id and max_volumes_per_node >= 0", diag=(code, ni))

        # Missing arguments: INVALID_ARGUMENT for every Node RPC.
        for name, fn, req in [
            ("NodePublishVolume without volume id", node.NodePublishVolume, pb.NodePublishVolumeRequest()),
            ("NodePublishVolume without target path", node.NodePublishVolume,
             pb.NodePublishVolumeRequest(volume_id="sanity-vol")),
            ("NodePublishVolume without volume capability", node.NodePublishVolume,
             pb.NodePublishVolumeRequest(volume_id="sanity-vol", target_path=tgt)),
            ("NodeUnpublishVolume without volume id", node.NodeUnpublishVolume,
             pb.NodeUnpublishVolumeRequest()),
            ("NodeUnpublishVolume without target path", node.NodeUnpublishVolume,
             pb.NodeUnpublishVolumeRequest(volume_id="sanity-vol")),
            ("NodeGetVolumeStats without volume id", node.NodeGetVolumeStats,
             pb.NodeGetVolumeStatsRequest(volume_path="some/path")),
            ("NodeGetVolumeStats without volume path", node.NodeGetVolumeStats,
             pb.NodeGetVolumeStatsRequest(volume_id="sanity-vol")),
        ]:
            code, details = call(fn, req)
            t.eq(code, C.INVALID_ARGUMENT, "sanity: %s: INVALID_ARGUMENT" % name)
        code, details = stats(node, "sanity-unknown", "some/path")
        t.ok(code == C.NOT_FOUND, "sanity: NodeGetVolumeStats of an unknown volume (relative path): NOT_FOUND",
             diag=(code, details))

        # Idempotent publish and unpublish.
        first = publish(node, "sanity-vol", tgt)
        second = publish(node, "sanity-vol", tgt)
        t.ok(first[0] == C.OK and second[0] == C.OK and cc.mount_count(tgt) == 1,
             "sanity: the same publish twice: OK both times, one mount", diag=(first, second))
        code, st = stats(node, "sanity-vol", tgt)
        t.ok(code == C.OK and len(st.usage) > 0, "sanity: stats of the published volume", diag=(code, st))
        code, details = stats(node, "sanity-vol", "some/path")
        t.ok(code == C.NOT_FOUND, "sanity: stats of the published volume at another (relative) path: NOT_FOUND",
             diag=(code, details))
        first, second = unpublish(node, "sanity-vol", tgt), unpublish(node, "sanity-vol", tgt)
        t.ok(first[0] == C.OK and second[0] == C.OK and not os.path.exists(tgt),
             "sanity: the same unpublish twice: OK both times, the target path removed", diag=(first, second))
        code, details = unpublish(node, "sanity-never", new_target("sanity-never"))
        t.ok(code == C.OK, "sanity: unpublish of an unknown volume and target: OK", diag=(code, details))


def test_invalid_arguments():
    tgt = new_target("invalid")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        cases = [
            ("missing volume_id", cc.publish_request(pb, "", tgt, "llama"), "volume_id is required"),
            ("missing target_path", cc.publish_request(pb, "v-inv", "", "llama"), "target_path is required"),
            ("relative target_path", cc.publish_request(pb, "v-inv", "pods/x", "llama"), "absolute"),
            ("missing volume_capability", cc.publish_request(pb, "v-inv", tgt, "llama", cap=False),
             "volume_capability is required"),
            ("missing cacheName", cc.publish_request(pb, "v-inv", tgt, None), "cacheName is required"),
            ("unknown attribute", cc.publish_request(pb, "v-inv", tgt, "llama", extra={"cachename": "x"}),
             "unknown volume attribute"),
            ("bad readOnly", cc.publish_request(pb, "v-inv", tgt, "llama", extra={"readOnly": "yes"}),
             "readOnly must be"),
            ("volume_id with a slash", cc.publish_request(pb, "a/b", tgt, "llama"), "not usable"),
        ]
        for name, req, want in cases:
            code, details = call(node.NodePublishVolume, req)
            t.ok(code == C.INVALID_ARGUMENT and want in details, "publish with %s: INVALID_ARGUMENT" % name,
                 diag=(code, details))
        block = cc.publish_request(pb, "v-inv", tgt, "llama")
        block.volume_capability.ClearField("mount")
        block.volume_capability.block.SetInParent()
        code, details = call(node.NodePublishVolume, block)
        t.ok(code == C.INVALID_ARGUMENT and "block" in details, "publish of a block volume: INVALID_ARGUMENT",
             diag=(code, details))
        code, details = unpublish(node, "", tgt)
        t.ok(code == C.INVALID_ARGUMENT, "unpublish without volume_id: INVALID_ARGUMENT", diag=(code, details))
        code, details = unpublish(node, "v-inv", "")
        t.ok(code == C.INVALID_ARGUMENT, "unpublish without target_path: INVALID_ARGUMENT", diag=(code, details))
        code, details = stats(node, "v-inv", "")
        t.ok(code == C.INVALID_ARGUMENT, "stats without volume_path: INVALID_ARGUMENT", diag=(code, details))
    t.ok(not os.path.exists(tgt), "rejected publishes created nothing at the target")


def test_path_traversal():
    tgt = new_target("traversal")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        for name, cache, ns in [("cacheName ../../store", "../../store", "team-a"),
                                ("cacheName with a slash", "llama/../../x", "team-a"),
                                ("cacheName ..", "..", "team-a"),
                                ("cacheNamespace ..", "llama", ".."),
                                ("cacheNamespace ../../..", "llama", "../../.."),
                                ("cacheNamespace _cluster", "shared", "_cluster")]:
            code, details = publish(node, "v-trav", tgt, cache=cache, ns=ns, pod_ns=ns if ns else None)
            t.ok(code == C.INVALID_ARGUMENT, "path traversal in attributes (%s): INVALID_ARGUMENT" % name,
                 diag=(code, details))
        code, details = publish(node, "v-trav", tgt, cache="llama", ns="team-a",
                                extra={"csi.gkm.io/GKMCache": "../llama"})
        t.ok(code == C.INVALID_ARGUMENT, "contradicting old and new spellings: INVALID_ARGUMENT",
             diag=(code, details))
    t.ok(not os.path.exists(tgt) and cc.mount_count(tgt) == 0, "nothing mounted after traversal attempts")


def test_permission_denied():
    tgt = new_target("denied")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        code, details = publish(node, "v-deny", tgt, cache="llama", ns="team-a", pod_ns="team-b")
        t.ok(code == C.PERMISSION_DENIED and "team-b" in details and "team-a/llama" in details,
             "pod of team-b mounting a GKMCache of team-a: PERMISSION_DENIED", diag=(code, details))
        code, details = publish(node, "v-deny", tgt, cache="llama", ns="team-a", pod_ns=None, pod=None)
        t.ok(code == C.PERMISSION_DENIED and "podInfoOnMount" in details,
             "namespaced cache without the pod's namespace: PERMISSION_DENIED", diag=(code, details))
        code, details = publish(node, "v-deny", tgt, cache="pulling", ns="team-a", pod_ns="team-b",
                                extra={"onMiss": "empty"})
        t.ok(code == C.PERMISSION_DENIED and "team-b" in details,
             'onMiss: "empty" is no way around it: PERMISSION_DENIED, not a fallback', diag=(code, details))
    t.ok(cc.mount_count(tgt) == 0, "nothing mounted after denied publishes")


def test_failed_precondition():
    tgt = new_target("precond")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        for cache, want, name in [
            ("nosuch", "GKMCache team-a/nosuch is not on this node: the agent has no record of it",
             "a cache the agent never prepared here"),
            ("pulling", "GKMCache team-a/pulling is not ready on this node yet (Pulling: pulling and "
             "extracting the image)", "a cache being pulled"),
            ("pending", "GKMCache team-a/pending is not ready on this node yet (Pending, "
             "DigestNotResolved: waiting for the image digest)", "a cache without a digest yet"),
            ("failed", "GKMCache team-a/failed failed on this node (PullFailed: registry answered 503)",
             "a cache whose pull failed"),
            ("wronggpu", "GKMCache team-a/wronggpu is incompatible with this node's GPUs (ArchMismatch: "
             "built for sm_90, node has sm_80)", "an incompatible cache"),
            ("deleting", "GKMCache team-a/deleting is being deleted and takes no new pods here (InUse: "
             "deleted; kept until 1 pod(s) stop using it)", "a deleted cache still in use"),
            ("stale", "GKMCache team-a/stale is not ready on this node yet (Pulling:",
             "a cache pulling a new digest while its data still links the old one"),
            ("readyincompatible", "incompatible with this node's GPUs (ArchMismatch: built for sm_90)",
             "a Ready record that says incompatible"),
            ("broken", "malformed", "a malformed ready.json"),
            ("escape", "outside the store", "a data link escaping the store"),
        ]:
            code, details = publish(node, "v-pre", tgt, cache=cache)
            t.ok(code == C.FAILED_PRECONDITION and want in details,
                 "%s: FAILED_PRECONDITION saying what is missing" % name, diag=(code, details))
    t.ok(cc.mount_count(tgt) == 0 and state_files() == [], "no mount and no state after refused publishes",
         diag=state_files())


def test_fallback():
    """onMiss: "empty" for the records only a fabricated layout has: an
    unreadable record, a Ready one that says incompatible, a data link out
    of the store. Published and unpublished like any volume (csi-sanity's
    rules: a repeat is OK, so is unpublishing what is gone)."""
    with channel() as ch:
        node = pbg.NodeStub(ch)
        for cache, state, reason in [("broken", "Unknown", "RecordUnreadable"),
                                     ("readyincompatible", "Incompatible", "ArchMismatch"),
                                     ("escape", "Ready", "DataUnusable")]:
            tgt, vid = new_target("fb-" + cache), "v-fb-" + cache
            first = publish(node, vid, tgt, cache=cache, extra={"onMiss": "empty"})
            again = publish(node, vid, tgt, cache=cache, extra={"onMiss": "empty"})
            opts, fstype = cc.mounts().get(tgt, ("", ""))
            t.ok(first[0] == C.OK and again[0] == C.OK and cc.mount_count(tgt) == 1
                 and {"rw", "nosuid", "nodev"} <= set(opts.split(",")) and os.listdir(tgt) == [],
                 "%s, onMiss empty: an empty rw, nosuid, nodev directory; published twice, mounted once"
                 % cache, diag=(first, again, opts, fstype))
            entries = [(u["volumeId"], u["digest"], u["fallback"]["state"], u["fallback"]["reason"])
                       for u in usage("team-a", cache)]
            t.eq(entries, [(vid, "", state, reason)], "%s: the usage entry says fallback, %s" % (cache, reason))
            other = publish(node, vid, tgt, cache=cache)
            t.eq(other[0], C.ALREADY_EXISTS, "%s: the same volume without onMiss is another request" % cache)
            code1, _ = unpublish(node, vid, tgt)
            code2, _ = unpublish(node, vid, tgt)
            t.ok(code1 == C.OK and code2 == C.OK and not os.path.exists(tgt) and usage("team-a", cache) == []
                 and not os.path.exists(os.path.join(root, "csi", "volumes", vid)),
                 "%s: unpublished twice, OK; its directory and usage entry are gone" % cache)
        code, details = publish(node, "v-fb-bad", new_target("fb-bad"), extra={"onMiss": "yes"})
        t.ok(code == C.INVALID_ARGUMENT and 'onMiss must be "fail" or "empty"' in details,
             "an onMiss that is neither: INVALID_ARGUMENT", diag=(code, details))
    t.ok(os.listdir(os.path.join(store_entry, "..")) == [digest[7:]] and tree_counts(store_entry)[0] == len(FILES) + 5,
         "the store holds the one entry it held, unchanged")


def test_read_only_publish_and_sharing():
    a, b = new_target("ro-a"), new_target("ro-b")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        code, details = publish(node, "v-ro-a", a, pod="pod-a", uid="uid-a")
        t.eq((code, details if code != C.OK else ""), (C.OK, ""), "read-only publish succeeds")
        opts, fstype = cc.mounts().get(a, ("", ""))
        t.ok({"ro", "nosuid", "nodev"} <= set(opts.split(",")), "mounted read-only, nosuid, nodev",
             diag=opts)
        with open(os.path.join(a, "io.triton.manifest/manifest.json"), "rb") as f:
            t.eq(f.read(), FILES["io.triton.manifest/manifest.json"], "the pod reads the cache content")
        try:
            with open(os.path.join(a, "new-file"), "w") as f:
                f.write("x")
            t.ok(False, "writes to a read-only volume fail")
        except OSError as e:
            t.eq(e.errno, errno.EROFS, "writes to a read-only volume fail with EROFS")

        code, _ = publish(node, "v-ro-a", a, pod="pod-a", uid="uid-a")
        t.ok(code == C.OK and cc.mount_count(a) == 1 and len(usage("team-a", "llama")) == 1,
             "a repeated identical publish is idempotent (one mount, one usage entry)",
             diag=(code, cc.mount_count(a), usage("team-a", "llama")))

        code, details = publish(node, "v-ro-a", a, cache="shared", ns=None, pod="pod-a", uid="uid-a")
        t.ok(code == C.ALREADY_EXISTS, "same volume and target with other attributes: ALREADY_EXISTS",
             diag=(code, details))
        code, details = publish(node, "v-ro-a", a, writable=True, pod="pod-a", uid="uid-a")
        t.ok(code == C.ALREADY_EXISTS, "same volume and target, writable instead of read-only: ALREADY_EXISTS",
             diag=(code, details))
        code, details = publish(node, "v-other", a, pod="pod-a", uid="uid-a")
        t.ok(code == C.ALREADY_EXISTS, "another volume on an occupied target: ALREADY_EXISTS",
             diag=(code, details))

        code, details = publish(node, "v-ro-b", b, pod="pod-b", uid="uid-b")
        t.ok(code == C.OK, "a second pod publishes the same cache", diag=details)
        t.ok(os.path.samefile(os.path.join(a, "io.triton.cache/AAAA/kernel.cubin"),
                              os.path.join(b, "io.triton.cache/AAAA/kernel.cubin")),
             "two pods share one copy of the cache (same inode)")
        pods_using = sorted((p["name"], p["volumeId"], p["targetPath"], p["readOnly"], p["digest"])
                            for p in usage("team-a", "llama"))
        t.eq(pods_using, [("pod-a", "v-ro-a", a, True, digest), ("pod-b", "v-ro-b", b, True, digest)],
             "usage.json lists both pods with volume ids, targets and the digest")
        t.eq(sorted(state_files()), ["v-ro-a.json", "v-ro-b.json"], "one state file per volume")

        # Cluster-scoped cache from any namespace, older attribute spelling.
        c = new_target("cluster")
        req = cc.publish_request(pb, "v-cluster", c, None, ns=None, pod_ns="team-z", pod="pod-z",
                                 extra={"csi.gkm.io/GKMCache": "shared"})
        code, details = call(node.NodePublishVolume, req)
        t.ok(code == C.OK and len(usage(None, "shared")) == 1,
             "a ClusterGKMCache mounts from any namespace (older attribute spelling)", diag=(code, details))

        # Stats: bytes and inodes of the read-only volume.
        code, st = stats(node, "v-ro-a", a)
        want_inodes, want_bytes = tree_counts(store_entry)
        units = {u.unit: u for u in st.usage} if code == C.OK else {}
        by, ino = units.get(pb.VolumeUsage.BYTES), units.get(pb.VolumeUsage.INODES)
        t.ok(by and ino and ino.used == want_inodes and by.used >= want_bytes and by.available == 0
             and by.total == by.used and ino.total == ino.used,
             "stats of a read-only volume: bytes and inodes of the cache, nothing available",
             diag=(code, st, want_inodes, want_bytes))
        code, details = stats(node, "v-nosuch", a)
        t.ok(code == C.NOT_FOUND, "stats of an unknown volume: NOT_FOUND", diag=(code, details))
        code, details = stats(node, "v-ro-a", b)
        t.ok(code == C.NOT_FOUND, "stats at a path the volume is not published at: NOT_FOUND",
             diag=(code, details))

        for vid, tgt in [("v-ro-a", a), ("v-ro-b", b), ("v-cluster", c)]:
            code, details = unpublish(node, vid, tgt)
            t.ok(code == C.OK and not os.path.exists(tgt) and cc.mount_count(tgt) == 0,
                 "unpublish %s unmounts and removes the target" % vid, diag=(code, details))
        t.eq((usage("team-a", "llama"), usage(None, "shared"), state_files()), ([], [], []),
             "unpublish releases usage entries and volume state")
        code, details = unpublish(node, "v-ro-a", a)
        t.ok(code == C.OK, "a repeated unpublish succeeds", diag=(code, details))
        t.ok(os.path.isdir(store_entry) and tree_counts(store_entry)[0] == len(FILES) + 5,
             "the shared store entry is untouched")


def test_writable_overlay():
    w1, w2, ro = new_target("rw-1"), new_target("rw-2"), new_target("rw-ro")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        code, details = publish(node, "v-rw-1", w1, writable=True, pod="rw-1", uid="u1")
        t.ok(code == C.OK and cc.mounts().get(w1, ("", ""))[1] == "overlay",
             "readOnly \"false\" gets an overlay mount", diag=(code, details, cc.mounts().get(w1)))
        opts = cc.mounts().get(w1, ("", ""))[0].split(",")
        t.ok("rw" in opts and "nosuid" in opts and "nodev" in opts, "the overlay is rw, nosuid, nodev",
             diag=opts)
        code2, _ = publish(node, "v-rw-2", w2, writable=True, pod="rw-2", uid="u2")
        code3, _ = publish(node, "v-rw-ro", ro, pod="rw-ro", uid="u3")
        t.ok(code2 == C.OK and code3 == C.OK, "a second writable and a read-only volume of the same cache")

        manifest = "io.triton.manifest/manifest.json"
        with open(os.path.join(w1, "io.triton.cache/NEW.json"), "w") as f:
            f.write("compiled here")
        with open(os.path.join(w1, manifest), "w") as f:
            f.write("changed")
        os.unlink(os.path.join(w1, "io.triton.cache/AAAA/kernel.json"))
        with open(os.path.join(w1, manifest)) as f:
            t.eq(f.read(), "changed", "the writing pod sees its own writes")
        for where, path in [("the shared store", store_entry), ("another writable pod", w2),
                            ("a read-only pod", ro)]:
            with open(os.path.join(path, manifest), "rb") as f:
                same = f.read() == FILES[manifest]
            t.ok(same and not os.path.exists(os.path.join(path, "io.triton.cache/NEW.json"))
                 and os.path.exists(os.path.join(path, "io.triton.cache/AAAA/kernel.json")),
                 "writes stay private: %s sees the original cache" % where)

        with open(os.path.join(w1, "big.bin"), "wb") as f:
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        code, st = stats(node, "v-rw-1", w1)
        units = {u.unit: u for u in st.usage} if code == C.OK else {}
        by, ino = units.get(pb.VolumeUsage.BYTES), units.get(pb.VolumeUsage.INODES)
        base_inodes, base_bytes = tree_counts(store_entry)
        t.ok(by and ino and by.used >= base_bytes + (1 << 20) and by.available > 0
             and by.total == by.used + by.available and ino.used > base_inodes and ino.available > 0,
             "stats of a writable volume count its own writes and the free space",
             diag=(code, st, base_bytes, base_inodes))

        upper = os.path.join(root, "csi", "volumes", "v-rw-1")
        t.ok(os.path.isdir(upper), "the upper layer lives under the state dir")
        for vid, tgt in [("v-rw-1", w1), ("v-rw-2", w2), ("v-rw-ro", ro)]:
            code, details = unpublish(node, vid, tgt)
            t.ok(code == C.OK and cc.mount_count(tgt) == 0, "unpublish %s" % vid, diag=(code, details))
        t.ok(not os.path.exists(upper), "unpublish discards the private upper layer")
        with open(os.path.join(store_entry, manifest), "rb") as f:
            t.eq(f.read(), FILES[manifest], "the store entry never changed")


def loop_backing():
    """The image files loop devices are attached to now."""
    out = []
    for dev in os.listdir("/sys/block"):
        try:
            with open("/sys/block/%s/loop/backing_file" % dev) as f:
                out.append(f.read().strip())
        except OSError:
            pass
    return out


def test_size_limit():
    """sizeLimit: the pod's writes go to an ext4 layer of that size; past it
    the write fails with ENOSPC, and nothing else feels it."""
    small, other = new_target("lim-1"), new_target("lim-2")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        code, details = publish(node, "v-lim-1", small, writable=True, pod="lim-1", uid="l1",
                                extra={"sizeLimit": "16Mi"})
        code2, _ = publish(node, "v-lim-2", other, writable=True, pod="lim-2", uid="l2")
        t.ok(code == C.OK and code2 == C.OK and cc.mounts().get(small, ("", ""))[1] == "overlay",
             "a writable volume with sizeLimit 16Mi is published (an overlay on its own layer)",
             diag=(code, details))
        vdir = os.path.join(root, "csi", "volumes", "v-lim-1")
        img = os.path.join(vdir, "layer.img")
        t.ok(os.path.getsize(img) == 16 << 20 and img in loop_backing(),
             "its layer is a 16 MiB image file on a loop device", diag=loop_backing())
        err, written = None, 0
        try:
            with open(os.path.join(small, "io.triton.cache", "huge.bin"), "wb") as f:
                for _ in range(32):
                    f.write(os.urandom(1 << 20))
                    f.flush()
                    written += 1 << 20
                os.fsync(f.fileno())
        except OSError as e:
            err = e.errno
        t.ok(err == errno.ENOSPC and written < 17 << 20,
             "a pod writing 32 MiB into it gets ENOSPC before 17 MiB", diag=(err, written))
        t.ok(os.stat(img).st_blocks * 512 <= 17 << 20,
             "the node holds at most the limit for it (the image is sparse)", diag=os.stat(img).st_blocks)
        with open(os.path.join(other, "io.triton.cache", "fine.bin"), "wb") as f:
            f.write(os.urandom(4 << 20))
        with open(os.path.join(small, "io.triton.cache", "AAAA", "kernel.json"), "rb") as f:
            cached = f.read()
        t.ok(cached == FILES["io.triton.cache/AAAA/kernel.json"]
             and os.path.getsize(os.path.join(other, "io.triton.cache", "fine.bin")) == 4 << 20,
             "the full volume still reads the cache, and another volume of it writes 4 MiB")
        code, st = stats(node, "v-lim-1", small)
        units = {u.unit: u for u in st.usage} if code == C.OK else {}
        by = units.get(pb.VolumeUsage.BYTES)
        base_bytes = tree_counts(store_entry)[1]
        t.ok(by and by.used >= base_bytes + (14 << 20) and by.available < (1 << 20)
             and by.total <= base_bytes + (16 << 20),
             "NodeGetVolumeStats: the cache plus the full layer used, next to nothing available",
             diag=(code, st))
        code, details = publish(node, "v-lim-bad", new_target("lim-bad"), writable=True, pod="lim-3",
                                uid="l3", extra={"sizeLimit": "lots"})
        t.ok(code == C.INVALID_ARGUMENT and "sizeLimit" in details, "a sizeLimit that is no quantity is refused",
             diag=(code, details))
        for vid, tgt in (("v-lim-1", small), ("v-lim-2", other)):
            code, details = unpublish(node, vid, tgt)
            t.ok(code == C.OK, "unpublish %s" % vid, diag=(code, details))
        t.ok(not os.path.exists(vdir) and img not in loop_backing(),
             "unpublish unmounts the layer, releases its loop device and removes its image")


def test_unpublish_edge_cases():
    with channel() as ch:
        node = pbg.NodeStub(ch)
        gone = new_target("gone")
        code, _ = publish(node, "v-gone", gone)
        subprocess.run(["umount", gone], check=True)
        os.rmdir(gone)
        code, details = unpublish(node, "v-gone", gone)
        t.ok(code == C.OK and "v-gone.json" not in state_files() and usage("team-a", "llama") == [],
             "unpublish of an already-gone target succeeds and cleans up", diag=(code, details))

        foreign, src = new_target("foreign"), os.path.join(tmp, "foreign-src")
        os.makedirs(foreign)
        os.makedirs(src)
        subprocess.run(["mount", "--bind", src, foreign], check=True)
        code, details = unpublish(node, "v-unknown", foreign)
        t.ok(code == C.NOT_FOUND and cc.mount_count(foreign) == 1,
             "unpublish of an unknown volume on someone else's mount: NOT_FOUND, mount left alone",
             diag=(code, details))
        subprocess.run(["umount", foreign], check=True)
        code, details = unpublish(node, "v-unknown", new_target("never"))
        t.ok(code == C.OK, "unpublish of an unknown volume at an empty path succeeds (idempotent)",
             diag=(code, details))

        p = new_target("elsewhere")
        code, _ = publish(node, "v-else", p)
        code, details = unpublish(node, "v-else", target("not-there"))
        t.ok(code == C.NOT_FOUND and cc.mount_count(p) == 1,
             "unpublish at another target than published: NOT_FOUND", diag=(code, details))
        code, details = publish(node, "v-else", target("not-there"))
        t.ok(code == C.FAILED_PRECONDITION, "publish of a volume at a second target: FAILED_PRECONDITION",
             diag=(code, details))
        code, _ = unpublish(node, "v-else", p)
        t.ok(code == C.OK, "clean-up")


def test_shared_volume():
    """A ReadOnlyMany PersistentVolume: one volume id, a target per pod."""
    rox = pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY
    a, b, w1, w2 = (new_target(n) for n in ("pv-a", "pv-b", "pv-w1", "pv-w2"))
    with channel() as ch:
        node = pbg.NodeStub(ch)
        res = [publish(node, "gkm-pv", a, pod="pod-a", uid="uid-a", mode=rox),
               publish(node, "gkm-pv", b, pod="pod-b", uid="uid-b", mode=rox)]
        t.ok(all(c == C.OK for c, _ in res) and cc.mount_count(a) == 1 and cc.mount_count(b) == 1,
             "one persistent volume id published at two targets (MULTI_NODE_READER_ONLY)", diag=res)
        files = state_files()
        t.ok(len(files) == 2 and all(f.startswith("gkm-pv@") for f in files),
             "a state file per target: <volume id>@<hash of the target>", diag=files)
        t.eq(sorted((p["name"], p["targetPath"]) for p in usage("team-a", "llama")),
             [("pod-a", a), ("pod-b", b)], "the usage record lists both pods")
        code, _ = publish(node, "gkm-pv", a, pod="pod-a", uid="uid-a", mode=rox)
        t.ok(code == C.OK and cc.mount_count(a) == 1 and len(state_files()) == 2,
             "a repeated publish at one target is idempotent")
        code, details = publish(node, "gkm-pv", a, pod="pod-a", uid="uid-a", mode=rox, writable=True)
        t.ok(code == C.ALREADY_EXISTS, "the same target with other attributes: ALREADY_EXISTS",
             diag=(code, details))
        code, st = stats(node, "gkm-pv", b)
        t.ok(code == C.OK and st.usage, "stats at either target", diag=(code, st))

        res = [publish(node, "gkm-pvw", w, pod=p, uid=p, mode=rox, writable=True)
               for w, p in ((w1, "pod-w1"), (w2, "pod-w2"))]
        t.ok(all(c == C.OK for c, _ in res)
             and [cc.mounts().get(w, ("", ""))[1] for w in (w1, w2)] == ["overlay", "overlay"],
             'readOnly "false": each target its own overlay', diag=res)
        with open(os.path.join(w1, "io.triton.cache/NEW.json"), "w") as f:
            f.write("compiled by w1")
        t.ok(not os.path.exists(os.path.join(w2, "io.triton.cache/NEW.json"))
             and not os.path.exists(os.path.join(a, "io.triton.cache/NEW.json"))
             and not os.path.exists(os.path.join(store_entry, "io.triton.cache/NEW.json")),
             "a write at one target is in no other target of the volume and not in the store")
        uppers = sorted(d for d in os.listdir(os.path.join(root, "csi", "volumes")) if d.startswith("gkm-pvw@"))
        t.eq(len(uppers), 2, "two private directories, one per target")

        code, _ = unpublish(node, "gkm-pv", a)
        t.ok(code == C.OK and cc.mount_count(a) == 0 and cc.mount_count(b) == 1,
             "unpublish at one target leaves the other mounted")
        t.eq(sorted(p["name"] for p in usage("team-a", "llama")), ["pod-b", "pod-w1", "pod-w2"],
             "the usage record drops that pod only")
        for vid, tgt in (("gkm-pv", b), ("gkm-pvw", w1), ("gkm-pvw", w2)):
            code, details = unpublish(node, vid, tgt)
            t.ok(code == C.OK and cc.mount_count(tgt) == 0, "unpublish %s at %s" % (vid, os.path.basename(
                os.path.dirname(tgt))), diag=(code, details))
        t.eq((state_files(), usage("team-a", "llama")), ([], []), "no state and no usage left")
        t.ok(not any(d.startswith("gkm-pv") for d in os.listdir(os.path.join(root, "csi", "volumes"))),
             "the private directories are removed")


def test_concurrent_100():
    targets = {"v-c%03d" % i: new_target("c%03d" % i) for i in range(100)}
    with channel() as ch:
        node = pbg.NodeStub(ch)
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            res = list(ex.map(lambda kv: publish(node, kv[0], kv[1], writable=int(kv[0][3:]) % 4 == 0,
                                                 pod="pod-" + kv[0][2:], uid=kv[0]),
                              targets.items()))
        bad = [r for r in res if r[0] != C.OK]
        t.ok(not bad, "100 concurrent publishes succeed", diag=bad[:3])
        mounted = sum(cc.mount_count(p) for p in targets.values())
        t.eq((mounted, len(usage("team-a", "llama")), len(state_files())), (100, 100, 100),
             "100 mounts, 100 usage entries, 100 state files")

        # Unpublish the first half while publishing them again under new ids
        # into new targets, all at once.
        extra = {"v-d%03d" % i: new_target("d%03d" % i) for i in range(50)}
        jobs = [("un", v, p) for v, p in list(targets.items())[:50]] + [("pub", v, p) for v, p in extra.items()]
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            res = list(ex.map(lambda j: unpublish(node, j[1], j[2]) if j[0] == "un"
                              else publish(node, j[1], j[2], pod="pod-" + j[1][2:], uid=j[1]), jobs))
        t.ok(all(r[0] == C.OK for r in res), "50 unpublishes interleaved with 50 publishes succeed",
             diag=[r for r in res if r[0] != C.OK][:3])
        rest = dict(list(targets.items())[50:])
        rest.update(extra)
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            res = list(ex.map(lambda kv: unpublish(node, kv[0], kv[1]), rest.items()))
        t.ok(all(r[0] == C.OK for r in res), "100 concurrent unpublishes succeed")
        left = sum(cc.mount_count(p) for p in list(targets.values()) + list(extra.values()))
        t.eq((left, usage("team-a", "llama"), state_files(), os.listdir(os.path.join(root, "csi", "volumes"))),
             (0, [], [], []), "nothing left: no mounts, usage, state or upper layers")


def test_busy_volume():
    # A publish held in flight by the usage lock; other calls for the same
    # volume meanwhile are answered ABORTED, and it ends with one mount.
    tgt = new_target("busy")
    with UsageLock("team-a", "llama") as lock:
        with channel() as ch, concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
            node = pbg.NodeStub(ch)
            first = ex.submit(publish, node, "v-busy", tgt)
            time.sleep(0.5)
            code, details = publish(node, "v-busy", tgt)
            t.ok(code == C.ABORTED and "in progress" in details,
                 "a second publish while one runs for the volume: ABORTED", diag=(code, details))
            code, details = unpublish(node, "v-busy", tgt)
            t.ok(code == C.ABORTED, "an unpublish while a publish runs for the volume: ABORTED",
                 diag=(code, details))
            lock.release()
            code, details = first.result()
            t.ok(code == C.OK and cc.mount_count(tgt) == 1, "the first publish then completes, one mount",
                 diag=(code, details))
            code, _ = unpublish(node, "v-busy", tgt)
            t.ok(code == C.OK and cc.mount_count(tgt) == 0, "and it unpublishes")


def test_internal_error_undoes():
    # A usage file the plugin cannot parse: the publish fails INTERNAL and
    # takes back what it did (no mount, no state), and the file is kept.
    tgt = new_target("internal")
    udir = os.path.join(run, "usage", "_cluster", "shared")
    os.makedirs(udir, exist_ok=True)
    with open(os.path.join(udir, "usage.json"), "w") as f:
        f.write('{"pods": [{"name": 7}]}')
    with channel() as ch:
        node = pbg.NodeStub(ch)
        code, details = publish(node, "v-int", tgt, cache="shared", ns=None)
        t.ok(code == C.INTERNAL and "usage" in details, "an unreadable usage file: INTERNAL", diag=(code, details))
        t.ok(cc.mount_count(tgt) == 0 and not os.path.exists(tgt) and "v-int.json" not in state_files(),
             "the failed publish left no mount, target or state behind")
        with open(os.path.join(udir, "usage.json")) as f:
            t.eq(f.read(), '{"pods": [{"name": 7}]}', "the unreadable usage file is left as it was")
    os.unlink(os.path.join(udir, "usage.json"))


def test_sigkill_and_restart():
    global plugin
    ro, rw = new_target("kill-ro"), new_target("kill-rw")
    with channel() as ch:
        node = pbg.NodeStub(ch)
        c1, _ = publish(node, "v-kill-ro", ro, pod="k1", uid="k1")
        c2, _ = publish(node, "v-kill-rw", rw, writable=True, pod="k2", uid="k2")
    with open(os.path.join(rw, "written-before-kill"), "w") as f:
        f.write("kept")
    plugin.signal(signal.SIGKILL)
    plugin.wait()
    t.ok(c1 == C.OK and c2 == C.OK and os.path.exists(plugin.sock),
         "plugin killed with SIGKILL after publishing (stale socket left behind)")
    plugin = cc.Plugin(tmp, root, run).start()
    t.ok(True, "a restarted plugin replaces the stale socket and gets ready")
    with channel() as ch:
        node, ident = pbg.NodeStub(ch), pbg.IdentityStub(ch)
        code, probe = call(ident.Probe, pb.ProbeRequest())
        t.ok(code == C.OK and probe.ready.value, "Probe is ready after the restart")
        code, st = stats(node, "v-kill-ro", ro)
        t.ok(code == C.OK, "the recovered volume answers stats", diag=(code, st))
        code, details = publish(node, "v-kill-rw", rw, writable=True, pod="k2", uid="k2")
        with open(os.path.join(rw, "written-before-kill")) as f:
            kept = f.read()
        t.ok(code == C.OK and kept == "kept" and cc.mount_count(rw) == 1,
             "a repeated publish after the restart is idempotent and keeps the pod's writes",
             diag=(code, details))
        for vid, tgt in [("v-kill-ro", ro), ("v-kill-rw", rw)]:
            code, details = unpublish(node, vid, tgt)
            t.ok(code == C.OK and cc.mount_count(tgt) == 0 and not os.path.exists(tgt),
                 "unpublish of %s after the restart works" % vid, diag=(code, details))
        t.eq((state_files(), usage("team-a", "llama")), ([], []), "state and usage are clean after the restart")


def test_metrics():
    with channel() as ch:
        call(pbg.IdentityStub(ch).GetPluginInfo, pb.GetPluginInfoRequest())
        call(pbg.NodeStub(ch).NodeStageVolume, pb.NodeStageVolumeRequest(volume_id="v"))
        call(pbg.ControllerStub(ch).DeleteVolume, pb.DeleteVolumeRequest(volume_id="v"))
        call(pbg.ControllerStub(ch).ControllerGetCapabilities, pb.ControllerGetCapabilitiesRequest())
    url = "http://127.0.0.1:%d/metrics" % plugin.health_port
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    t.ok('gkm_csi_calls_total{method="NodePublishVolume",code="OK"}' in text
         and 'gkm_csi_calls_total{method="NodeUnpublishVolume",code="OK"}' in text
         and 'gkm_csi_calls_total{method="GetPluginInfo",code="OK"} 1' in text
         and 'gkm_csi_calls_total{method="NodeStageVolume",code="UNIMPLEMENTED"} 1' in text
         and 'gkm_csi_call_duration_seconds_count{method="NodePublishVolume"}' in text,
         "/metrics counts CSI calls by method and code", diag=text[:2000])
    t.ok('gkm_csi_calls_total{method="DeleteVolume",code="UNIMPLEMENTED"} 1' in text
         and 'gkm_csi_calls_total{method="ControllerGetCapabilities",code="OK"} 1' in text
         and 'method="Controller"' not in text,
         "/metrics names each controller method on its own", diag=text[:2000])
    with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % plugin.health_port, timeout=10) as r:
        t.eq(r.status, 200, "/readyz is 200 while serving")


def test_second_instance_refused():
    other = cc.Plugin(tmp, root, run)
    other.log = os.path.join(tmp, "second.log")
    other.start(wait=False)
    try:
        rc = other.wait(30)
    finally:
        other.stop()
    with open(other.log) as f:
        log = f.read()
    t.ok(rc != 0 and "another process serves this socket" in log, "a second plugin on a live socket refuses",
         diag=log[-1000:])
    with channel() as ch:
        code, _ = call(pbg.IdentityStub(ch).Probe, pb.ProbeRequest())
        t.eq(code, C.OK, "the first plugin still serves")


def test_chart_flags():
    # How the Helm chart starts it: --config-dir (the gkm-config ConfigMap as
    # files), --node-name, --driver-name.
    r2, u2, conf = (os.path.join(tmp, d) for d in ("root2", "run2", "config"))
    lay2 = cc.Layout(r2)
    lay2.view("ns2", "c2", lay2.store_entry({"k.json": b"{}"}))
    os.makedirs(conf)
    for k, v in {"store-dir": r2 + "/store\n", "views-dir": r2 + "/caches", "usage-dir": u2 + "/usage"}.items():
        with open(os.path.join(conf, k), "w") as f:
            f.write(v)
    p2 = cc.Plugin(tmp, None, None, name="chart", flags=[
        "--config-dir", conf, "--node-name", "node-2", "--driver-name", "csi.example.com"]).start()
    try:
        tgt = new_target("chart")
        with grpc.insecure_channel(p2.endpoint) as ch:
            ident, node = pbg.IdentityStub(ch), pbg.NodeStub(ch)
            code, info = call(ident.GetPluginInfo, pb.GetPluginInfoRequest())
            t.ok(code == C.OK and info.name == "csi.example.com", "--driver-name sets the plugin name",
                 diag=(code, info))
            code, ni = call(node.NodeGetInfo, pb.NodeGetInfoRequest())
            t.ok(code == C.OK and ni.node_id == "node-2", "--node-name sets the node id", diag=(code, ni))
            code, details = call(node.NodePublishVolume, cc.publish_request(pb, "v-chart", tgt, "c2", ns="ns2",
                                                                            pod_ns="ns2"))
            used = os.path.exists(os.path.join(u2, "usage", "ns2", "c2", "usage.json"))
            t.ok(code == C.OK and cc.mount_count(tgt) == 1 and used,
                 "--config-dir: views from views-dir, usage under usage-dir", diag=(code, details))
            code, _ = call(node.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="v-chart",
                                                                                   target_path=tgt))
            t.eq(code, C.OK, "and unpublish")
    finally:
        t.eq(p2.stop(), 0, "the chart-style plugin stops cleanly")

    with open(os.path.join(conf, "views-dir"), "w") as f:
        f.write("/elsewhere/caches")
    for name, flags, want in [
        ("store-dir and views-dir of different roots", ["--config-dir", conf, "--node-name", "n"],
         "must be ROOT/store and ROOT/caches"),
        ("a bad --driver-name", ["--node-id", "n", "--driver-name", "-bad-"], "not a valid CSI driver name"),
        ("no node id", ["--root", r2, "--run-dir", u2], "--node-id is required"),
    ]:
        r = subprocess.run([cc.BIN, "csi", "--endpoint", "unix://" + os.path.join(tmp, "bad.sock")] + flags,
                           capture_output=True, text=True, timeout=30, env={"PATH": os.environ.get("PATH", "")})
        t.ok(r.returncode == 2 and want in r.stderr, "usage error for %s" % name, diag=(r.returncode, r.stderr))


def test_sigterm_drains():
    # Publishes held in flight by the usage lock when SIGTERM arrives.
    global plugin
    targets = {"v-t%02d" % i: new_target("t%02d" % i) for i in range(10)}
    with UsageLock("team-a", "llama") as lock:
        with channel() as ch, concurrent.futures.ThreadPoolExecutor(max_workers=10) as ex:
            node = pbg.NodeStub(ch)
            futs = [ex.submit(publish, node, v, p, pod="pod-" + v[2:], uid=v) for v, p in targets.items()]
            time.sleep(1)
            t.ok(not any(f.done() for f in futs), "publishes wait while the usage file is locked")
            plugin.signal(signal.SIGTERM)
            time.sleep(1)
            t.ok(plugin.proc.poll() is None, "after SIGTERM the plugin waits for the calls in flight")
            with channel() as ch2:
                code, _ = call(pbg.IdentityStub(ch2).Probe, pb.ProbeRequest())
            t.eq(code, C.UNAVAILABLE, "while draining, new calls are refused")
            lock.release()
            res = [f.result()[0] for f in futs]
    rc = plugin.wait(60)
    t.ok(all(c == C.OK for c in res) and all(cc.mount_count(p) == 1 for p in targets.values()),
         "every call in flight at SIGTERM completed and is mounted", diag=res)
    t.ok(rc == 0 and not os.path.exists(plugin.sock), "the plugin then exits 0 and removes its socket",
         diag=(rc, plugin.tail()))
    plugin = cc.Plugin(tmp, root, run).start()
    with channel() as ch:
        node = pbg.NodeStub(ch)
        res = [unpublish(node, v, p)[0] for v, p in targets.items()]
    t.ok(all(c == C.OK for c in res) and state_files() == [] and usage("team-a", "llama") == [],
         "after a restart every drained volume unpublishes")


try:
    plugin = cc.Plugin(tmp, root, run).start()
    for fn in [test_identity_and_node_info, test_unimplemented, test_conformance_node, test_invalid_arguments,
               test_path_traversal,
               test_permission_denied, test_failed_precondition, test_fallback,
               test_read_only_publish_and_sharing,
               test_writable_overlay, test_size_limit, test_unpublish_edge_cases, test_shared_volume, test_concurrent_100, test_busy_volume,
               test_internal_error_undoes,
               test_sigkill_and_restart, test_metrics, test_second_instance_refused, test_chart_flags,
               test_sigterm_drains]:
        t.run(fn.__name__, fn)
finally:
    if t.failed and plugin and plugin.proc:
        print("# plugin log tail:")
        for line in plugin.tail(40).splitlines():
            print("#   " + line)
    cleanup()
sys.exit(t.finish())
