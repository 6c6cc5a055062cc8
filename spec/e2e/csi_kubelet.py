#!/usr/bin/python3
"""The CSI path through a real kubelet: a control plane (etcd, kube-apiserver)
and a node (containerd, kubelet v1.26) from GKM_KUBE_ASSETS, `gkm agent` and
`gkm csi` for that node at the paths the chart's DaemonSet gives them,
registered with the kubelet by csi-node-driver-registrar, the chart's
CSIDriver object, and a signed cache from a real registry made Ready by the
agent. Pods created and deleted with kubectl make the kubelet itself call
NodePublishVolume (with the pod's identity) and NodeUnpublishVolume; the test
checks what lands on the host (findmnt, the files), the FailedMount event a
pod of another namespace gets, and the pods the node object lists.

A second cache is not Ready on the node (built for HIP, the node has a T4):
a pod whose volume says onMiss: "empty" is published anyway, an empty,
writable directory of its own that nothing shares with the store; the node
object lists it under fallbackPods with the cache's state and reason, the
agent puts a CacheFallback Event on the pod; a pod without the attribute
gets FailedMount with that reason, as before.

Containers never start on these machines (runc cannot start the kubelet's
pod sandboxes), so pods stay ContainerCreating after their volumes are
mounted: what is tested is the kubelet's use of the plugin, not the pod."""
import errno
import json
import os
import shutil
import sys
import time
import urllib.request

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import csi_client as cc  # noqa: E402
import kube_e2e  # noqa: E402
import kubeenv  # noqa: E402
import kubenode  # noqa: E402
from kubelet_csi import chart_node_paths, findmnt, tree  # noqa: E402
from proc import Child, free_port, wait_for  # noqa: E402
from tap import Tap  # noqa: E402
import triton_standin  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
RENDER = os.path.join(BUILD, "spec", "gkm-chart-render")
FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "cuda-sm75-vector-add")
HIP_FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "hip-gfx90a-vector-add")
T4 = os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "t4.json")
DRIVER = "csi.gkm.io"
NODE = "node-1"
NS, OTHER = "team-a", "team-b"

t = Tap()
cleanups = []


def unavailable():
    why = kubeenv.unavailable("kubelet", "csi-node-driver-registrar") or kubenode.unavailable()
    if why:
        return why
    if not os.access("/usr/bin/docker-registry", os.X_OK):
        return "/usr/bin/docker-registry missing"
    if not os.access(RENDER, os.X_OK):
        return "no chart renderer (make spec-extra builds %s)" % os.path.relpath(RENDER, ROOT)
    if not shutil.which("findmnt"):
        return "findmnt missing (util-linux)"
    return None


def pod_manifest(name, ns, cache_ns, read_only=None, cache="vector-add", on_miss=None):
    attrs = {"cacheName": cache, "cacheNamespace": cache_ns}
    if read_only is not None:
        attrs["readOnly"] = read_only
    if on_miss is not None:
        attrs["onMiss"] = on_miss
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": NODE, "hostNetwork": True, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "model", "image": kubenode.KubeNode.BUSYBOX,
                                     "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                                     "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                     "volumes": [{"name": "cache", "csi": {"driver": DRIVER,
                                                           "volumeAttributes": attrs}}]}}


def main():
    why = unavailable()
    if why:
        t.skip("the CSI path through a real kubelet", why)
        return
    tmp, why = kube_e2e.mount_workdir("gkm-csi-kubelet.", cleanups)
    if why:
        t.skip("the CSI path through a real kubelet", why)
        return

    def path(*p):
        return os.path.join(tmp, *p)

    # ---- a signed cache in a real registry ----
    reg, digests, trust = kube_e2e.signed_caches(GKM, ROOT, tmp, cleanups,
                                                 {FIXTURE: "caches/cuda:v1", HIP_FIXTURE: "caches/rocm:v1"})
    digest, hip_digest = digests[reg + "/caches/cuda:v1"], digests[reg + "/caches/rocm:v1"]
    t.ok(digest.startswith("sha256:") and hip_digest.startswith("sha256:"),
         "cache images (CUDA, HIP) built with gkm cache build, signed, in a real registry")

    # ---- the control plane and the node ----
    kube = kubeenv.KubeEnv()
    kubectl, get = kube.kubectl, kube.get_json
    cleanups.append(kube.stop)
    kube.start()
    kube.apply_crds()
    node = kubenode.KubeNode(kube, NODE)
    cleanups.append(node.stop)
    node.start()
    st, n = kube.request("GET", "/api/v1/nodes/" + NODE)
    t.ok(st == 200 and node.ready() and n["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://"),
         "a kubelet registers Node %s, Ready, on containerd" % NODE, diag=n)

    state, run = path("state"), path("run")
    chart = chart_node_paths(RENDER, os.path.join(ROOT, "charts", "gkm"), node.root_dir, state, run)
    t.ok(chart["socket"] == os.path.join(node.plugin_dir(DRIVER), "csi.sock")
         and chart["registration_path"] == chart["socket"]
         and chart["registration_dir"] == node.registration_dir()
         and (chart["root"], chart["run"]) == (state, run),
         "the chart's DaemonSet: gkm csi listens where the registrar tells the kubelet to call, "
         "under the kubelet's plugins/%s; the registrar writes into its plugins_registry" % DRIVER,
         diag=chart)
    p = kubectl("apply", "-f", "-", input=json.dumps(chart["csidriver"]))
    t.ok(p.returncode == 0, "the chart's CSIDriver object applied", diag=p.stderr)

    # ---- gkm on the node ----
    for ns in (NS, OTHER):
        kube.make_namespace(ns)
    agent_port = free_port()
    agent = Child([GKM, "agent", "--node", NODE, "--kubeconfig", kube.kubeconfig, "--gpu-file", T4,
                   "--root", state, "--run-dir", run, "--trust-dir", trust,
                   "--health-listen", "127.0.0.1:%d" % agent_port], path("agent.log"))
    cleanups.append(agent.stop)
    os.makedirs(os.path.dirname(chart["socket"]), exist_ok=True)
    csi_port = free_port()
    csi = Child([GKM, "csi", "--endpoint", "unix://" + chart["socket"], "--node-id", NODE,
                 "--root", state, "--run-dir", run,
                 "--health-listen", "127.0.0.1:%d" % csi_port], path("csi.log"))
    cleanups.append(csi.stop)
    wait_for(lambda: os.path.exists(chart["socket"]), 15)
    node.register_plugin(DRIVER, chart["registration_path"])
    csinode = get("csinode", NODE)
    drv = [d for d in (csinode or {}).get("spec", {}).get("drivers") or [] if d["name"] == DRIVER]
    t.ok(drv and drv[0]["nodeID"] == NODE,
         "csi-node-driver-registrar registers gkm csi: the kubelet called NodeGetInfo, CSINode lists "
         "%s with node id %s" % (DRIVER, NODE), diag=csinode)

    for name, ref, d in (("vector-add", reg + "/caches/cuda:v1", digest),
                         ("vector-add-hip", reg + "/caches/rocm:v1", hip_digest)):
        kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
            "metadata": {"name": name, "namespace": NS,
                         # what the webhook writes after verifying (no webhook runs here;
                         # the agent verifies the signature again before extracting)
                         "annotations": {"gkm.io/resolvedDigest": d}},
            "spec": {"image": ref}}))

    def entry(name="vector-add"):
        o = get("gkmcn", NODE, "-n", NS)
        return ((o or {}).get("status") or {}).get("caches", {}).get(name)
    e = wait_for(lambda: (entry() or {}).get("state") == "Ready" and entry(), 30)
    t.ok(e and e["digest"] == digest, "the agent makes the cache Ready on %s (GKMCacheNode)" % NODE,
         diag=e or agent.tail())
    view = os.path.join(state, "caches", NS, "vector-add", "data")

    # ---- pods: the kubelet publishes ----
    pods = {"reader": pod_manifest("reader", NS, NS, read_only="true"),
            "writer": pod_manifest("writer", NS, NS),
            "intruder": pod_manifest("intruder", OTHER, NS)}
    p = kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                     "items": list(pods.values())}))
    t.ok(p.returncode == 0, "three pods created with kubectl on %s" % NODE, diag=p.stderr)
    uid = {n: get("pod", n, "-n", m["metadata"]["namespace"])["metadata"]["uid"] for n, m in pods.items()}

    def target(name):
        return os.path.join(node.root_dir, "pods", uid[name], "volumes", "kubernetes.io~csi", "cache",
                            "mount")

    ro = wait_for(lambda: findmnt(target("reader")), 30)
    src = os.path.realpath(view)
    t.ok(ro and ro["options"].split(",")[0] == "ro" and ro["fstype"] != "overlay"
         and ro["source"].endswith("[%s]" % src),
         "the kubelet calls NodePublishVolume: a read-only bind mount of the cache at its own target "
         "path (pods/<uid>/volumes/kubernetes.io~csi/cache/mount)", diag="%s\nstore entry %s\n%s" % (
             ro, src, csi.tail()))
    want = tree(view)
    fixture = {os.path.join("io.triton.cache", k): v for k, v in tree(FIXTURE).items()}
    got = tree(target("reader")) if ro else {}
    t.ok(got == want and all(got.get(k) == v for k, v in fixture.items()) and fixture,
         "the pod's volume holds the cache byte for byte (%d files, every packaged kernel file)" % len(want),
         diag=sorted(set(got) ^ set(want)))
    try:
        open(os.path.join(target("reader"), "x"), "w").close()
        ro_write = "written"
    except OSError as err:
        ro_write = err.strerror
    t.eq(ro_write, "Read-only file system", "the read-only volume refuses writes")

    rw = wait_for(lambda: findmnt(target("writer")), 30)
    t.ok(rw and rw["fstype"] == "overlay" and rw["options"].split(",")[0] == "rw",
         "no readOnly attribute (the default): a private overlay at the kubelet's target path", diag=rw)
    hit_rel = sorted(k for k in fixture if k.count("/") == 2)[0]
    hit_key, hit_file = hit_rel.split("/")[1:]
    got_hit = triton_standin.lookup(target("writer"), hit_key, hit_file)
    # a kernel the cache lacks: its metadata (which names it) and its binary
    meta = {"name": "add_kernel", "target": {"backend": "cuda", "arch": 75, "warp_size": 32}}
    triton_standin.lookup(target("writer"), "k" * 52, "add_kernel.json", json.dumps(meta).encode())
    got_miss = triton_standin.lookup(target("writer"), "k" * 52, "miss.cubin")
    t.ok(got_hit == ("hit", fixture[hit_rel]) and got_miss == ("stored", b"compiled on a miss")
         and not [n for n in os.listdir(os.path.join(target("writer"), "io.triton.cache", "k" * 52))
                  if n.startswith("tmp.pid_")],
         "Triton's cache code on the default volume: a hit reads the shared file, a miss makes its key "
         "directory and a temporary one, os.replace()s its file in and removes the temporary directory",
         diag=(got_hit, got_miss))
    ro_miss = triton_standin.lookup(target("reader"), "k" * 52, "miss.cubin")
    t.eq(ro_miss, ("error", errno.EROFS), 'readOnly: "true": Triton\'s first miss fails with EROFS')
    t.ok(not os.path.exists(os.path.join(view, "io.triton.cache", "k" * 52))
         and not os.path.exists(os.path.join(target("reader"), "io.triton.cache", "k" * 52)),
         "what the runtime stored on a miss reaches neither the store nor the other pod")
    if rw:
        with open(os.path.join(target("writer"), "io.triton.cache", "written-by-pod"), "w") as fh:
            fh.write("mine")
    t.ok(rw and os.path.exists(os.path.join(target("writer"), "io.triton.cache", "written-by-pod"))
         and not os.path.exists(os.path.join(view, "io.triton.cache", "written-by-pod"))
         and not os.path.exists(os.path.join(target("reader"), "io.triton.cache", "written-by-pod"))
         and tree(view) == want,
         "a file written into the writable volume stays in it: the shared cache and the other pod's "
         "volume do not see it")

    def failed_mount():
        ev = get("events", "-n", OTHER, "--field-selector",
                 "involvedObject.name=intruder,reason=FailedMount")
        return [x["message"] for x in (ev or {}).get("items", [])]
    why_not = "a pod in namespace %s may not mount GKMCache %s/vector-add" % (OTHER, NS)
    msgs = wait_for(lambda: [m for m in failed_mount() if why_not in m], 30)
    t.ok(msgs and "PermissionDenied" in msgs[0],
         "a pod of another namespace: a FailedMount event with gkm's reason", diag=failed_mount())
    described = kubectl("describe", "pod", "intruder", "-n", OTHER).stdout
    t.ok("FailedMount" in described and why_not in described and not findmnt(target("intruder")),
         "kubectl describe pod shows it; nothing is mounted for that pod", diag=described[-1500:])

    # ---- usage follows the pods ----
    def listed():
        """The pods the node object lists for the cache; None without an entry."""
        e = entry()
        return None if e is None else sorted((p["podName"], p["podNamespace"], p["podUID"])
                                             for p in e.get("pods") or [])
    both = sorted([("reader", NS, uid["reader"]), ("writer", NS, uid["writer"])])
    t0 = time.monotonic()
    wait_for(lambda: listed() == both, 40)
    t.eq(listed(), both, "the node object lists the two pods that mount the cache, with their uids")
    usage = json.load(open(os.path.join(run, "usage", NS, "vector-add", "usage.json")))
    t.eq(sorted((u["name"], u["targetPath"], u["volumeId"].startswith("csi-")) for u in usage["pods"]),
         sorted([("reader", target("reader"), True), ("writer", target("writer"), True)]),
         "the usage record names each pod's kubelet target path and the kubelet's volume id")
    print("# usage reached the node object %.1f s after the mounts" % (time.monotonic() - t0))
    vid = {u["name"]: u["volumeId"] for u in usage["pods"]}
    upper = cc.own_dir(state, vid.get("writer", "?"), "upper")[0]
    t.ok(os.path.isfile(os.path.join(upper, "io.triton.cache", "written-by-pod")),
         "the writer's file is in its volume's own upper layer (ROOT/csi/volumes/<kubelet's volume id>)")
    with open(os.path.join(target("writer"), "io.triton.cache", "compiled.bin"), "wb") as fh:
        fh.write(os.urandom(3 << 20))

    def writer_usage():
        e = entry() or {}
        p = [p for p in e.get("pods") or [] if p.get("podName") == "writer"]
        return p[0] if p and p[0].get("writtenBytes", 0) >= 3 << 20 else None
    w = wait_for(writer_usage, 60) or {}
    t.ok((10 << 30) - (1 << 28) <= w.get("sizeLimitBytes", 0) <= 10 << 30
         and 3 << 20 <= w.get("writtenBytes", 0) < 5 << 20
         and not [p for p in (entry() or {}).get("pods") or [] if p.get("podName") == "reader" and "writtenBytes" in p],
         "the node object reports the writer's size limit (10Gi by default) and the MiB it wrote; "
         "nothing for the read-only pod", diag=(w, entry()))

    # ---- every miss counted ----
    def writer_misses():
        e = entry() or {}
        p = [p for p in e.get("pods") or [] if p.get("podName") == "writer"]
        return p[0] if p and p[0].get("missedKernels") else None
    w = wait_for(writer_misses, 60) or {}
    t.eq((w.get("misses"), w.get("missedKernels")), (1, ["add_kernel (cuda 75)"]),
         "the node object counts the kernel the pod compiled itself (misses, missedKernels); the "
         "hit and the files beside the cache's own kernels are no miss")

    def compiled_event():
        ev = get("events", "-n", NS, "--field-selector", "involvedObject.name=writer,reason=KernelsCompiled")
        return [x["message"] for x in (ev or {}).get("items", [])]
    msgs = wait_for(compiled_event, 30)
    t.ok(msgs and msgs[0].startswith("compiled 1 kernel that GKMCache %s/vector-add lacks "
                                     "(add_kernel (cuda 75))" % NS),
         "a Warning Event KernelsCompiled on the pod names what it compiled", diag=compiled_event())
    scrape = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % agent_port, timeout=10).read().decode()
    t.ok('gkm_cache_miss_kernels_total{namespace="%s",cache="vector-add"} 1' % NS in scrape,
         "gkm_cache_miss_kernels_total counts it", diag=[x for x in scrape.splitlines() if "miss" in x])

    # ---- pods deleted: the kubelet unpublishes ----
    kubectl("delete", "pod", "reader", "-n", NS, "--wait=false")
    gone = wait_for(lambda: findmnt(target("reader")) is None and not os.path.exists(target("reader")), 30)
    t.ok(gone, "reader deleted: the kubelet calls NodeUnpublishVolume, its mount is gone",
         diag=csi.tail())
    t.ok(findmnt(target("writer")), "the writer's volume stays mounted")
    wait_for(lambda: listed() == [("writer", NS, uid["writer"])], 40)
    t.eq(listed(), [("writer", NS, uid["writer"])], "the node object lists the writer only")
    kubectl("delete", "pod", "writer", "-n", NS, "--wait=false")
    # The plugin removes the target directory before the volume's layers: wait for both.
    gone = wait_for(lambda: findmnt(target("writer")) is None and not os.path.exists(target("writer"))
                    and not os.path.exists(upper), 30)
    t.ok(gone, "writer deleted: its overlay is unmounted, its upper layer removed",
         diag="target %s, upper layer %s" % (os.path.exists(target("writer")), os.path.exists(upper)))
    wait_for(lambda: listed() == [], 40)
    t.eq(listed(), [], "the node object lists no pods")
    fin = wait_for(lambda: [p for p in (entry() or {}).get("finishedPods") or []
                            if p.get("podName") == "writer"], 40) or [{}]
    t.eq((fin[0].get("podUID"), fin[0].get("misses"), fin[0].get("missedKernels"),
          bool(fin[0].get("finished"))),
         (uid["writer"], 1, ["add_kernel (cuda 75)"], True),
         "the kernels a pod compiled are counted once more as its volume is unpublished, and the "
         "node object keeps them among its finishedPods")
    # The kubelet removes a deleted pod's object once its volumes are torn
    # down. (A pod whose mount failed waits for the kubelet's mount timeout,
    # two minutes: the intruder is deleted at once with --force.)
    kubectl("delete", "pod", "intruder", "-n", OTHER, "--grace-period=0", "--force")
    t.ok(wait_for(lambda: get("pods", "-A")["items"] == [], 30),
         "the kubelet finishes the deletions: no pod objects left",
         diag=kubectl("get", "pods", "-A").stdout)
    t.ok(not os.path.exists(os.path.join(run, "usage", NS, "vector-add", "usage.json"))
         or json.load(open(os.path.join(run, "usage", NS, "vector-add", "usage.json")))["pods"] == [],
         "the usage record is empty")
    t.ok(tree(view) == want, "the shared cache is unchanged")

    # ---- a cache that is not Ready here: onMiss "empty" starts the pod anyway ----
    hip = wait_for(lambda: (entry("vector-add-hip") or {}).get("state") == "Incompatible"
                   and entry("vector-add-hip"), 30)
    t.ok(hip and hip["reason"] == "BackendMismatch",
         "the HIP cache is Incompatible on %s (BackendMismatch): not Ready here" % NODE, diag=entry("vector-add-hip"))
    pods = {"fallback": pod_manifest("fallback", NS, NS, cache="vector-add-hip", on_miss="empty"),
            "stuck": pod_manifest("stuck", NS, NS, cache="vector-add-hip")}
    p = kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                     "items": list(pods.values())}))
    t.ok(p.returncode == 0, 'two pods of that cache, one with onMiss: "empty"', diag=p.stderr)
    uid.update({n: get("pod", n, "-n", NS)["metadata"]["uid"] for n in pods})
    fb = wait_for(lambda: findmnt(target("fallback")), 30)
    usage = json.load(open(os.path.join(run, "usage", NS, "vector-add-hip", "usage.json")))["pods"]
    vid = usage[0]["volumeId"] if len(usage) == 1 else "?"
    own, root = cc.own_dir(state, vid, "fallback")
    t.ok(fb and fb["fstype"] != "overlay" and fb["options"].split(",")[0] == "rw"
         and {"nosuid", "nodev"} <= set(fb["options"].split(",")) and fb["source"].endswith("[%s]" % root)
         and os.listdir(target("fallback")) == [],
         "the kubelet publishes it: an empty, rw, nosuid, nodev bind of the volume's own directory "
         "(ROOT/csi/volumes/<volume id>/fallback) at the pod's target path", diag=(fb, usage, csi.tail()))
    compiled = os.path.join("io.triton.cache", "KERNELHASH", "add_kernel.hsaco")
    os.makedirs(os.path.dirname(os.path.join(target("fallback"), compiled)))
    with open(os.path.join(target("fallback"), compiled), "w") as fh:
        fh.write("compiled by the pod")

    def found(top):
        return [d for d, _, files in os.walk(top) if "add_kernel.hsaco" in files and "KERNELHASH" in d]
    t.ok(found(os.path.join(state, "store")) == [] and found(os.path.join(state, "caches")) == []
         and found(own) and tree(view) == want,
         "what the pod writes there is in its own directory only: never in the store or any view",
         diag=(found(state), own))
    t.eq([(u["name"], u["uid"], u["digest"], u["fallback"]["state"], u["fallback"]["reason"]) for u in usage],
         [("fallback", uid["fallback"], "", "Incompatible", "BackendMismatch")],
         "the usage record says fallback, with the node's state and reason")

    def fallback_pods():
        e = entry("vector-add-hip") or {}
        return (e.get("pods"), [(p["podName"], p["podUID"], p["state"], p["reason"])
                                for p in e.get("fallbackPods") or []])
    want_fb = ([], [("fallback", uid["fallback"], "Incompatible", "BackendMismatch")])
    wait_for(lambda: fallback_pods() == want_fb, 40)
    t.eq(fallback_pods(), want_fb, "the node object lists the pod under fallbackPods (Incompatible, "
         "BackendMismatch), not among the pods that use the cache")

    def pod_events(name, reason):
        ev = get("events", "-n", NS, "--field-selector", "involvedObject.name=%s,reason=%s" % (name, reason))
        return [(x["type"], x["involvedObject"].get("uid"), x["message"]) for x in (ev or {}).get("items", [])]
    ev = wait_for(lambda: pod_events("fallback", "CacheFallback"), 30)
    t.ok(ev and ev[0][:2] == ("Warning", uid["fallback"])
         and "GKMCache %s/vector-add-hip is incompatible with this node's GPUs (BackendMismatch" % NS in ev[0][2]
         and vid in ev[0][2],
         "the agent records a CacheFallback Warning Event on the pod, with the reason", diag=ev)
    described = kubectl("describe", "pod", "fallback", "-n", NS).stdout
    t.ok("CacheFallback" in described and "FailedMount" not in described,
         "kubectl describe pod shows it, and no FailedMount", diag=described[-1500:])
    why_not = "GKMCache %s/vector-add-hip is incompatible with this node's GPUs (BackendMismatch" % NS
    msgs = wait_for(lambda: [m for _, _, m in pod_events("stuck", "FailedMount") if why_not in m], 30)
    t.ok(msgs and not findmnt(target("stuck")),
         "the pod without onMiss: FailedMount with the cache's reason, nothing mounted",
         diag=pod_events("stuck", "FailedMount"))
    scrape = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % csi_port, timeout=10).read().decode()
    t.ok('gkm_csi_fallback_total{reason="Incompatible"} 1' in scrape,
         'gkm csi counts it: gkm_csi_fallback_total{reason="Incompatible"} 1',
         diag=[line for line in scrape.splitlines() if "fallback" in line])

    kubectl("delete", "pod", "fallback", "-n", NS, "--wait=false")
    vdir = os.path.join(state, "csi", "volumes", vid)
    gone = wait_for(lambda: findmnt(target("fallback")) is None and not os.path.exists(target("fallback"))
                    and not os.path.exists(vdir), 30)
    t.ok(gone,
         "the pod deleted: the kubelet unpublishes, the directory and all it held are removed", diag=csi.tail())
    wait_for(lambda: fallback_pods() == ([], []), 40)
    t.eq(fallback_pods(), ([], []), "the node object lists it no more")
    kubectl("delete", "pod", "stuck", "-n", NS, "--grace-period=0", "--force")
    t.ok(wait_for(lambda: get("pods", "-A")["items"] == [], 30), "both pods gone",
         diag=kubectl("get", "pods", "-A").stdout)

    # ---- everything stops and nothing stays mounted ----
    rc = {"gkm csi": csi.stop(), "gkm agent": agent.stop()}
    t.eq(rc, {"gkm csi": 0, "gkm agent": 0}, "gkm csi and gkm agent exit cleanly on SIGTERM")
    node.stop()
    kube.stop()
    left = [line for line in open("/proc/self/mountinfo") if tmp in line or node.dir in line]
    t.ok(not left, "node, control plane and plugin stopped: no mounts left behind", diag="".join(left))


# a run stopped from outside (SIGTERM, ^C) still cleans up
kube_e2e.run(t, main, cleanups)
