#!/usr/bin/python3
"""Kernel caches in KServe's local model storage, against a real
kube-apiserver and kube-controller-manager (GKM_KUBE_ASSETS) with KServe's
CRDs (GKM_KSERVE_CRDS: a directory of KServe's own; else the subset in
spec/fixtures/kserve) and no KServe controller: LocalModelNodeGroups and
LocalModelCaches made by hand, `gkm operator --kserve true` and one
`gkm agent` on each of two Nodes, a signed cache in a real registry.

A LocalModelCache with the annotation gkm.io/kernel-cache-image gets a
ClusterGKMCache kserve-<name> owned by it; only the agent of the node
group's node pulls it (verified, GPU-checked, reported in its
ClusterGKMCacheNode), and copies the tree into the group's storage path
under kernel-caches/<name>/, next to the models, which stay untouched;
Events go to the LocalModelCache, whose status gkm never writes. A Node
relabelled into a node group later gets the cache (its agent reads its
labels again at resync). Deleting the LocalModelCache removes the copy. Bad input: a node group that does not exist (a
Warning Event, nothing pulled), a storage path that is a symlink and a
kernel-caches that is a symlink (the node's entry Failed with the reason,
nothing written where the links point)."""
import glob
import os
import shutil
import sys
import tempfile

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import kube_e2e  # noqa: E402
import kubeenv  # noqa: E402
from kubelet_csi import tree  # noqa: E402
from proc import Child, free_port, wait_for  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "cuda-sm75-vector-add")
T4 = os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "t4.json")
KSERVE = "serving.kserve.io/v1alpha1"

t = Tap()
cleanups = []


def node_group(name, path, pool):
    return {"apiVersion": KSERVE, "kind": "LocalModelNodeGroup", "metadata": {"name": name},
            "spec": {"storageLimit": "10Gi",
                     "persistentVolumeClaimSpec": {"accessModes": ["ReadWriteOnce"],
                                                   "resources": {"requests": {"storage": "10Gi"}}},
                     "persistentVolumeSpec": {
                         "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
                         "local": {"path": path},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "pool", "operator": "In", "values": [pool]}]}]}}}}}


def model_cache(name, groups, image):
    return {"apiVersion": KSERVE, "kind": "LocalModelCache",
            "metadata": {"name": name, "annotations": {"gkm.io/kernel-cache-image": image}},
            "spec": {"sourceModelUri": "hf://meta-llama/Llama-3.1-8B", "modelSize": "16Gi",
                     "nodeGroups": groups}}


def main():
    why = kubeenv.unavailable("kube-controller-manager")
    if why or not os.access("/usr/bin/docker-registry", os.X_OK):
        t.skip("kernel caches in KServe's local model storage", why or "/usr/bin/docker-registry missing")
        return
    tmp = tempfile.mkdtemp(prefix="gkm-kserve.")
    cleanups.append(lambda: shutil.rmtree(tmp, ignore_errors=True))

    def path(*p):
        return os.path.join(tmp, *p)

    reg, _, trust = kube_e2e.signed_caches(GKM, ROOT, tmp, cleanups, {FIXTURE: "caches/cuda:v1"})
    ref = reg + "/caches/cuda:v1"

    kube = kubeenv.KubeEnv(controller_manager=True)
    kubectl, get, apply = kube.kubectl, kube.get_json, kube.apply_obj
    cleanups.append(kube.stop)
    kube.start()
    kube.apply_crds()
    crds = os.environ.get("GKM_KSERVE_CRDS") or os.path.join(ROOT, "spec", "fixtures", "kserve")
    for f in sorted(glob.glob(os.path.join(crds, "*.yaml"))):
        kube.kubectl("apply", "--server-side", "-f", f, check=True)
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                 "crd/localmodelcaches.serving.kserve.io", "crd/localmodelnodegroups.serving.kserve.io",
                 check=True)
    print("# KServe CRDs from %s" % ("GKM_KSERVE_CRDS" if os.environ.get("GKM_KSERVE_CRDS")
                                     else "spec/fixtures/kserve"))
    kube.make_node("gpu-1", labels={"pool": "gpu"})
    kube.make_node("cpu-1", labels={"pool": "cpu"})

    # storage: a real directory with a model in it; a symlink to a
    # directory outside; a real directory whose kernel-caches is a symlink
    models = path("models-gpu")
    os.makedirs(os.path.join(models, "models", "llama"))
    with open(os.path.join(models, "models", "llama", "weights.safetensors"), "wb") as fh:
        fh.write(b"weights")
    os.makedirs(path("outside"))
    os.symlink(path("outside"), path("models-link"))
    os.makedirs(path("models-kc"))
    os.symlink(path("outside"), path("models-kc", "kernel-caches"))
    for ng in (node_group("gpu-group", models, "gpu"), node_group("link-group", path("models-link"), "gpu"),
               node_group("kc-link-group", path("models-kc"), "gpu")):
        p = apply(ng)
        t.ok(p.returncode == 0, "LocalModelNodeGroup %s made by hand" % ng["metadata"]["name"], diag=p.stderr)

    agents = {}
    for node in ("gpu-1", "cpu-1"):
        agents[node] = Child([GKM, "agent", "--node", node, "--kubeconfig", kube.kubeconfig, "--gpu-file", T4,
                              "--root", path(node, "state"), "--run-dir", path(node, "run"),
                              "--trust-dir", trust, "--health-listen", "127.0.0.1:%d" % free_port()],
                             path(node + ".log"))
        cleanups.append(agents[node].stop)
    operator = Child([GKM, "operator", "--kubeconfig", kube.kubeconfig, "--leader-elect", "false",
                      "--kserve", "true", "--resolve-digests", "true", "--trust-dir", trust,
                      "--health-listen", "127.0.0.1:%d" % free_port()], path("operator.log"))
    cleanups.append(operator.stop)

    # ---- a LocalModelCache with a kernel cache ----
    p = apply(model_cache("llama", ["gpu-group"], ref))
    t.ok(p.returncode == 0, "LocalModelCache llama with the annotation gkm.io/kernel-cache-image", diag=p.stderr)
    lmc = get("localmodelcache", "llama")
    cache = wait_for(lambda: get("clustergkmcache", "kserve-llama"), 30)
    owners = [(o["kind"], o["uid"]) for o in (cache or {}).get("metadata", {}).get("ownerReferences") or []]
    groups = (cache or {}).get("spec", {}).get("localModel", {}).get("nodeGroups")
    t.ok(cache and cache["spec"]["image"] == ref and owners == [("LocalModelCache", lmc["metadata"]["uid"])]
         and [(g["name"], g["path"]) for g in groups or []] == [("gpu-group", models)],
         "the operator makes ClusterGKMCache kserve-llama: the image, owned by the LocalModelCache, its node "
         "group with the storage path", diag=(cache, operator.tail()))

    def entry(node, name="kserve-llama"):
        o = get("cgkmcn", node)
        return ((o or {}).get("status") or {}).get("caches", {}).get(name)
    e = wait_for(lambda: (entry("gpu-1") or {}).get("state") == "Ready" and entry("gpu-1"), 60)
    t.ok(e and e.get("compatibleGPUs"), "the agent of gpu-1 (in the node group) makes it Ready: verified, "
         "compatible with its GPU (ClusterGKMCacheNode gpu-1)", diag=(entry("gpu-1"), agents["gpu-1"].tail()))
    placed = os.path.join(models, "kernel-caches", "llama")
    view = os.path.join(path("gpu-1", "state"), "caches", "_cluster", "kserve-llama", "data")
    want = tree(view)
    got = wait_for(lambda: tree(placed) == want and want and tree(placed), 30)
    t.ok(got, "the tree is copied into the node group's storage: <path>/kernel-caches/llama/, byte for byte "
         "(%d files)" % len(want), diag=(sorted(os.listdir(models)), agents["gpu-1"].tail()))
    t.ok(os.stat(placed).st_mode & 0o777 == 0o555 and all(
         os.stat(os.path.join(d, f)).st_mode & 0o222 == 0 for d, _, fs in os.walk(placed) for f in fs),
         "read-only: no write bit on the directory or any file (JIT output stays out)")
    with open(os.path.join(models, "models", "llama", "weights.safetensors"), "rb") as fh:
        t.eq(fh.read(), b"weights", "the model beside it is untouched")
    t.ok(entry("cpu-1") is None and not os.path.exists(path("cpu-1", "state", "caches", "_cluster", "kserve-llama")),
         "the agent of cpu-1 (not in the group) neither pulls nor reports it",
         diag=(get("cgkmcn", "cpu-1"), agents["cpu-1"].tail()))

    def events(name, kind="LocalModelCache"):
        ev = get("events", "-A", "--field-selector", "involvedObject.name=%s,involvedObject.kind=%s" % (name, kind))
        return [(x["type"], x["reason"], x["message"]) for x in (ev or {}).get("items", [])]
    ev = wait_for(lambda: [x for x in events("llama") if x[1] == "CacheReady"], 30)
    t.ok(ev, "a CacheReady Event on the LocalModelCache", diag=(events("llama"), events("kserve-llama", "ClusterGKMCache"),
                                                                 get("clustergkmcache", "kserve-llama").get("status")))
    lmc = get("localmodelcache", "llama", "--show-managed-fields")
    managers = {m["manager"] for m in lmc["metadata"].get("managedFields") or []}
    t.ok(not lmc.get("status") and not any(m.startswith("gkm") for m in managers),
         "gkm never writes the LocalModelCache (no status, no gkm field manager)", diag=lmc)

    # ---- bad input ----
    apply(model_cache("ghost", ["no-such-group"], ref))
    ev = wait_for(lambda: [x for x in events("ghost") if x[1] == "NodeGroupNotFound"], 30)
    t.ok(ev and ev[0][0] == "Warning" and "no-such-group" in ev[0][2],
         "a node group that does not exist: a NodeGroupNotFound Warning Event on the LocalModelCache", diag=events("ghost"))
    ghost = wait_for(lambda: get("clustergkmcache", "kserve-ghost"), 30)
    t.ok(ghost and ghost["spec"]["localModel"].get("nodeGroups", []) == [] and entry("gpu-1", "kserve-ghost") is None,
         "its ClusterGKMCache names no node group: no node pulls it", diag=ghost)

    for name, group, why in (("linked", "link-group", "is a symlink or passes through one"),
                             ("kc-linked", "kc-link-group", "kernel-caches is a symlink or not a directory")):
        apply(model_cache(name, [group], ref))
        e = wait_for(lambda: (entry("gpu-1", "kserve-" + name) or {}).get("reason") == "LocalModelPathUnusable"
                     and entry("gpu-1", "kserve-" + name), 60)
        t.ok(e and e["state"] == "Failed" and why in e.get("message", ""),
             "%s: the node's entry is Failed, LocalModelPathUnusable, saying why" % group,
             diag=(entry("gpu-1", "kserve-" + name), agents["gpu-1"].tail()))
    t.eq(os.listdir(path("outside")), [], "nothing is written where the symlinks point")

    # ---- a node that joins a group later (its labels are read again at resync) ----
    os.makedirs(path("models-late"))
    apply(node_group("late-group", path("models-late"), "late"))
    apply(model_cache("late", ["late-group"], ref))
    wait_for(lambda: get("clustergkmcache", "kserve-late"), 30)
    t.ok(entry("cpu-1", "kserve-late") is None and entry("gpu-1", "kserve-late") is None,
         "a node group no node is in: no agent takes its cache")
    kubectl("label", "node", "cpu-1", "pool=late", "--overwrite")
    late = os.path.join(path("models-late"), "kernel-caches", "late")
    got = wait_for(lambda: (entry("cpu-1", "kserve-late") or {}).get("state") == "Ready"
                   and tree(late) == want and tree(late), 120)
    t.ok(got, "cpu-1 relabelled into it: its agent reads the labels again, pulls and places the cache",
         diag=(entry("cpu-1", "kserve-late"), agents["cpu-1"].tail()))

    # ---- removal follows the LocalModelCache ----
    kubectl("delete", "localmodelcache", "llama")
    gone = wait_for(lambda: get("clustergkmcache", "kserve-llama") is None and not os.path.exists(placed), 60)
    t.ok(gone, "LocalModelCache deleted: its ClusterGKMCache, then the copy in the storage path, are removed",
         diag=(get("clustergkmcache", "kserve-llama"), os.listdir(os.path.join(models, "kernel-caches"))))
    t.ok(os.path.exists(os.path.join(models, "models", "llama", "weights.safetensors")),
         "the model files stay")
    p = kubectl("annotate", "localmodelcache", "ghost", "gkm.io/kernel-cache-image-")
    t.ok(p.returncode == 0 and wait_for(lambda: get("clustergkmcache", "kserve-ghost") is None, 30),
         "the annotation removed: the ClusterGKMCache is removed", diag=p.stderr)

    rc = {n: a.stop() for n, a in agents.items()}
    rc["operator"] = operator.stop()
    t.eq(rc, {"gpu-1": 0, "cpu-1": 0, "operator": 0}, "gkm exits cleanly on SIGTERM")


kube_e2e.run(t, main, cleanups)
