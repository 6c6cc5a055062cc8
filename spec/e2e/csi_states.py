#!/usr/bin/python3
"""Why a pod cannot mount, end to end: the real agent (`gkm up`, standalone)
against a real registry writes the node's record of each cache, and the real
`gkm csi` on the same node answers NodePublishVolume through a real gRPC
client with the state and reason of that record, for every state a cache can
be in on a node: Ready (mounted), Pending, Pulling, Failed, Incompatible,
Deleting, and not on the node at all. What the plugin says must be what the
node status says, and nothing but a Ready, compatible cache is mounted.

A volume with onMiss: "empty" in each of those states gets an empty, writable
directory instead: the node status lists it under fallbackPods with the same
state and reason, the agent records a CacheFallback Event on the pod, the
plugin counts it in gkm_csi_fallback_total, and nothing the pod writes lands
in the store or a view."""
import json
import os
import shutil
import sys
import tempfile
import urllib.request

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import csi_client as cc  # noqa: E402
import promtext  # noqa: E402
from proc import Child, free_port, registry, regproxy, sh, wait_for  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
FIXTURES = os.path.join(ROOT, "spec", "fixtures")
CUDA_CACHE = os.path.join(FIXTURES, "caches", "triton", "cuda-sm75-vector-add")
HIP_CACHE = os.path.join(FIXTURES, "caches", "triton", "hip-gfx90a-vector-add")
KERNEL = "io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin"
NS = "team-a"

t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-csi-states.")
cleanups = []


def path(*p):
    return os.path.join(tmp, *p)


def layer_digest(reg, repo, tag):
    req = urllib.request.Request("http://%s/v2/%s/manifests/%s" % (reg, repo, tag),
                                 headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["layers"][0]["digest"]


def main():
    reason = cc.mount_permitted(tmp)
    if reason:
        t.skip("why a pod cannot mount, end to end", reason)
        return
    if not os.access("/usr/bin/docker-registry", os.X_OK):
        t.skip("why a pod cannot mount, end to end", "/usr/bin/docker-registry missing")
        return
    cleanups.append(lambda: cc.unmount_below(tmp))
    import grpc
    pb, pbg = cc.load_stubs(path("py"))
    C = grpc.StatusCode

    reg, stop_registry = registry(ROOT)
    cleanups.append(stop_registry)
    proxy, control, _, proxy_stop = regproxy(ROOT, reg, tmp)
    sh(GKM, "cache", "keygen", "--output-key-prefix", path("trusted"))
    sh(GKM, "cache", "build", CUDA_CACHE, "-t", reg + "/caches/cuda:v1")
    sh(GKM, "cache", "build", HIP_CACHE, "-t", reg + "/caches/rocm:v1")
    sh(GKM, "cache", "build", CUDA_CACHE, "-t", reg + "/caches/unsigned:v1", "--label", "variant=unsigned")
    sh(GKM, "cache", "build", CUDA_CACHE, "-t", reg + "/caches/slow:v1", "--label", "variant=slow")
    for repo in ("cuda", "rocm", "slow"):
        sh(GKM, "cache", "sign", reg + "/caches/%s:v1" % repo, "--key", path("trusted.key"))
    # the slow image's layer never arrives through the proxy: its pull hangs
    control({"hang": True, "match": "^GET /v2/caches/slow/blobs/" + layer_digest(reg, "caches/slow", "v1")})

    state, run = path("state"), path("state", "run")
    caches = {
        "ready": reg + "/caches/cuda:v1",
        "wronggpu": reg + "/caches/rocm:v1",  # a HIP cache on a node with a T4 only
        "unsigned": reg + "/caches/unsigned:v1",
        "pulling": proxy + "/caches/slow:v1",
        "unresolved": reg + "/caches/nosuch:v1",  # no such tag: no digest
    }
    with open(path("caches.yaml"), "w") as f:
        f.write("---\n".join("apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: %s}\n"
                             "spec: {image: %s}\n" % (name, NS, image) for name, image in caches.items()))
    sh(GKM, "apply", "--state", state, "-f", path("caches.yaml"))
    up = Child([GKM, "up", "--state", state, "--node", "node-1", "--poll-ms", "100",
                     "--gpu-file", os.path.join(FIXTURES, "gpu", "inventory", "t4.json"),
                     "--key", path("trusted.pub"), "--timeout", "120",
                     "--health-listen", "127.0.0.1:%d" % free_port()], path("up.log"))
    cleanups.append(up.stop)
    # the hung pull ends with the proxy, so that gkm up stops at once
    cleanups.append(proxy_stop)
    plugin = cc.Plugin(tmp, state, run, node_id="node-1", name="csi").start()
    cleanups.append(plugin.stop)

    def entry(name):
        o = json.loads(sh(GKM, "get", "--state", state, "gkmcn", "node-1", "-n", NS, "-o", "json"))
        return o["status"]["caches"].get(name)

    def wait_state(name, want, reason=None):
        def check():
            e = entry(name)
            return e if e and e["state"] == want and (reason is None or e["reason"] == reason) else None
        return wait_for(check, 40)

    pods = path("pods")
    n = [0]

    def publish(cache, ns=NS, extra=None):
        n[0] += 1
        tgt = os.path.join(pods, "p%d" % n[0], "mount")
        os.makedirs(os.path.dirname(tgt))
        try:
            with grpc.insecure_channel(plugin.endpoint) as ch:
                pbg.NodeStub(ch).NodePublishVolume(
                    cc.publish_request(pb, "vol-%d" % n[0], tgt, cache, ns=ns, pod="pod-%d" % n[0],
                                       uid="uid-%d" % n[0], extra=extra), timeout=30)
            return C.OK, "", "vol-%d" % n[0], tgt
        except grpc.RpcError as e:
            return e.code(), e.details(), "vol-%d" % n[0], tgt

    def unpublish(vid, tgt):
        with grpc.insecure_channel(plugin.endpoint) as ch:
            pbg.NodeStub(ch).NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=tgt),
                                                 timeout=30)

    def refused(name, state_, reason_, phrase, what):
        """The cache reaches state_ (reason_) on the node; a publish is then
        FAILED_PRECONDITION with phrase and the entry's own reason and message,
        and mounts nothing."""
        e = wait_state(name, state_, reason_)
        t.ok(e, "%s: the node status says %s (%s)" % (what, state_, reason_ or "its reason"), diag=(entry(name), up.tail()))
        if not e:
            return
        code, details, _, tgt = publish(name)
        want = "GKMCache %s/%s %s" % (NS, name, phrase)
        t.ok(code == C.FAILED_PRECONDITION and details.startswith(want) and e["reason"] in details
             and e["message"][:60] in details and cc.mount_count(tgt) == 0,
             "%s: the publish is refused with the node's state and reason: %r" % (what, details[:150]),
             diag=(code, details, e))
        fallback(name, e["state"], e["reason"], e["state"], what)

    def metric(name, label):
        url = "http://127.0.0.1:%d/metrics" % plugin.health_port
        with urllib.request.urlopen(url, timeout=10) as r:
            fams = promtext.parse(r.read().decode())
        return promtext.value(fams, name, reason=label) or 0.0

    def events_about(pod):
        p = os.path.join(state, "events.jsonl")
        lines = open(p).read().splitlines() if os.path.exists(p) else []
        return [e for e in map(json.loads, lines) if e["involvedObject"].get("name") == pod]

    def files_named(top, name):
        return [os.path.join(d, name) for d, _, files in os.walk(top) if name in files]

    def fallback(name, state_, reason_, label, what):
        """The same cache with onMiss "empty": an empty, writable directory of
        the volume's own, reported as a fallback with the record's state and
        reason, told to the pod, counted, and gone at unpublish."""
        before = metric("gkm_csi_fallback_total", label)
        code, details, vid, tgt = publish(name, extra={"onMiss": "empty"})
        pod = "pod-%d" % n[0]
        own = cc.own_dir(state, vid, "fallback")[0]
        t.ok(code == C.OK and cc.mount_count(tgt) == 1 and os.listdir(tgt) == []
             and os.path.samefile(tgt, own),
             "%s, onMiss empty: published as an empty directory of the volume's own" % what,
             diag=(code, details))
        if code != C.OK:
            return
        with open(os.path.join(tgt, "kernel-compiled-by-pod"), "w") as f:
            f.write("compiled")
        t.ok(files_named(os.path.join(state, "store"), "kernel-compiled-by-pod") == []
             and files_named(os.path.join(state, "caches"), "kernel-compiled-by-pod") == []
             and os.path.isfile(os.path.join(own, "kernel-compiled-by-pod")),
             "%s: what the pod writes stays in its directory, never in the store or a view" % what)
        t.eq(metric("gkm_csi_fallback_total", label), before + 1,
             '%s: gkm_csi_fallback_total{reason="%s"} counts it' % (what, label))

        def reported():
            e = entry(name) or {}
            fb = [p for p in e.get("fallbackPods") or [] if p["volumeId"] == vid]
            used = [p for p in e.get("pods") or [] if p["volumeId"] == vid]
            return fb[0] if fb and not used else None
        fb = wait_for(reported, 20)
        t.ok(fb and (fb["podName"], fb["podUID"], fb["state"], fb["reason"]) == (pod, "uid-%d" % n[0], state_, reason_)
             and fb["message"].startswith("GKMCache %s/%s " % (NS, name)),
             "%s: the node status lists the pod under fallbackPods with the state and reason %s, %s"
             % (what, state_, reason_), diag=(entry(name), fb))
        ev = wait_for(lambda: events_about(pod), 20)
        t.ok(ev and ev[0]["reason"] == "CacheFallback" and ev[0]["type"] == "Warning"
             and ev[0]["involvedObject"]["kind"] == "Pod" and ev[0]["involvedObject"]["uid"] == "uid-%d" % n[0]
             and reason_ in ev[0]["message"] and vid in ev[0]["message"],
             "%s: the agent records a CacheFallback Event on the pod" % what, diag=ev)
        unpublish(vid, tgt)
        t.ok(cc.mount_count(tgt) == 0 and not os.path.exists(own)
             and wait_for(lambda: not reported(), 20),
             "%s: unpublish removes the directory and the fallback entry" % what, diag=entry(name))
        t.eq(len(events_about(pod)), 1, "%s: one Event per volume" % what)

    t.ok(wait_state("ready", "Ready"), "the signed CUDA cache is Ready on the node", diag=up.tail())
    code, details, vid, tgt = publish("ready")
    mounted = code == C.OK and open(os.path.join(tgt, KERNEL), "rb").read() == \
        open(os.path.join(CUDA_CACHE, KERNEL[len("io.triton.cache/"):]), "rb").read()
    t.ok(mounted, "Ready: the pod mounts the cache and reads the kernel binary", diag=(code, details))

    refused("unresolved", "Pending", "DigestNotResolved", "is not ready on this node yet (Pending, DigestNotResolved: ",
            "a cache whose digest is not resolved")
    refused("pulling", "Pulling", "Pulling", "is not ready on this node yet (Pulling: ", "a cache being pulled")
    refused("unsigned", "Failed", "Unsigned", "failed on this node (Unsigned: ", "an unsigned image")
    refused("wronggpu", "Incompatible", None, "is incompatible with this node's GPUs (", "a HIP cache on a T4 node")
    code, details, _, _ = publish("nosuch")
    t.ok(code == C.FAILED_PRECONDITION and "GKMCache team-a/nosuch is not on this node" in details,
         "a cache the node has no record of: not on this node", diag=(code, details))
    # onMiss empty for it: the empty directory, and an Event although the
    # agent has no cache (and so no node status entry) to report it under
    code, details, fvid, ftgt = publish("nosuch", extra={"onMiss": "empty"})
    pod = "pod-%d" % n[0]
    t.ok(code == C.OK and cc.mount_count(ftgt) == 1 and os.listdir(ftgt) == [],
         "a cache the node has no record of, onMiss empty: an empty directory", diag=(code, details))
    usage = json.load(open(os.path.join(run, "usage", NS, "nosuch", "usage.json")))["pods"]
    t.eq([(u["volumeId"], u["fallback"]["state"], u["fallback"]["reason"], u["digest"]) for u in usage],
         [(fvid, "Unknown", "NotOnNode", "")], "its usage entry says fallback: Unknown, NotOnNode")
    ev = wait_for(lambda: events_about(pod), 60)
    t.ok(ev and ev[0]["reason"] == "CacheFallback" and "is not on this node" in ev[0]["message"],
         "the agent tells that pod too (from the usage files, at its next resync)", diag=ev)
    unpublish(fvid, ftgt)
    # a pod of another namespace gets no fallback: that is authorisation
    code, details, _, ftgt = publish("pulling", extra={
        "onMiss": "empty", "csi.storage.k8s.io/pod.namespace": "team-b"})
    t.ok(code == C.PERMISSION_DENIED and "may not mount GKMCache team-a/pulling" in details
         and cc.mount_count(ftgt) == 0,
         "onMiss empty from a pod of another namespace: still PERMISSION_DENIED, nothing mounted",
         diag=(code, details))

    # Deleted while the first pod uses it: kept for that pod, refused to others.
    sh(GKM, "delete", "--state", state, "-n", NS, "gkmc", "ready")
    refused("ready", "Deleting", "InUse", "is being deleted and takes no new pods here (InUse: ",
            "a deleted cache still in use")
    t.ok(os.path.exists(os.path.join(tgt, KERNEL)), "the pod that uses the deleted cache still reads it")
    unpublish(vid, tgt)
    gone = wait_for(lambda: entry("ready") is None, 20)
    code, details, _, _ = publish("ready")
    t.ok(gone and code == C.FAILED_PRECONDITION and "is not on this node" in details,
         "once its last pod is gone, the deleted cache is not on this node", diag=(code, details))

    # The record files say what the node status says, and no cache that is
    # not Ready has a data link to mount.
    def records():
        out = {}
        for name in caches:
            p = os.path.join(state, "caches", NS, name, "ready.json")
            if os.path.exists(p):
                out[name] = (json.load(open(p))["state"],
                             os.path.lexists(os.path.join(state, "caches", NS, name, "data")))
        return out

    def agree():
        got = records()
        return got if got == {name: (e["state"], False) for name in caches for e in [entry(name)] if e} else None
    got = wait_for(agree, 20)
    t.ok(got and set(got) == {"unresolved", "pulling", "unsigned", "wronggpu"},
         "each cache's record on disk says the state of its node status entry, with no data link",
         diag=(records(), {name: entry(name) for name in caches}))


if __name__ == "__main__":
    try:
        t.run("why a pod cannot mount", main)
    finally:
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception:  # noqa: BLE001 - clean up the rest anyway
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(t.finish())
