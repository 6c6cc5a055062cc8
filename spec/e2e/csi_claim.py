#!/usr/bin/python3
"""A cache as a PersistentVolumeClaim, through the real control plane and a
real kubelet: etcd, kube-apiserver and kube-controller-manager (the volume
binder, pvc- and pv-protection, the garbage collector) and a node
(containerd, kubelet) from GKM_KUBE_ASSETS; `gkm operator`, `gkm agent` and
`gkm csi` for that node, the chart's CSIDriver, a signed cache from a real
registry.

A GKMCache with spec.claim gets a PersistentVolume of csi.gkm.io and a
claim bound to it, made by the operator; pods that only name the claim are
mounted by the kubelet (what it sends is checked in the plugin's records:
the PV's volume handle, pod identity, one record per target, no staging),
several pods at once, a writable claim with a private overlay per pod, a
claim in another namespace for a ClusterGKMCache. Bad input: a claim name
taken by a claim gkm did not make (left untouched, ClaimConflict), a
ClusterGKMCache claim without a namespace (InvalidClaim), a hand-made
volume naming a cache of another namespace (refused like an inline one),
the volume edited and deleted by hand (applied again), the cache deleted
while a pod holds its claim (kept until the pod is gone)."""
import json
import os
import shutil
import sys
import urllib.request

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import kube_e2e  # noqa: E402
import kubeenv  # noqa: E402
import kubenode  # noqa: E402
from kubelet_csi import chart_node_paths, findmnt, tree  # noqa: E402
from proc import Child, free_port, wait_for  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
RENDER = os.path.join(BUILD, "spec", "gkm-chart-render")
FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "cuda-sm75-vector-add")
HIP_FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "hip-gfx90a-vector-add")
T4 = os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "t4.json")
DRIVER = "csi.gkm.io"
NODE = "node-1"
NS, OTHER = "team-a", "team-b"
GV = "gkm.io/v1alpha1"
CONTROLLERS = ["garbagecollector", "namespace", "serviceaccount", "serviceaccount-token",
               "persistentvolume-binder", "pvc-protection", "pv-protection"]

t = Tap()
cleanups = []


def unavailable():
    why = kubeenv.unavailable("kubelet", "csi-node-driver-registrar", "kube-controller-manager") \
        or kubenode.unavailable()
    if why:
        return why
    if not os.access("/usr/bin/docker-registry", os.X_OK):
        return "/usr/bin/docker-registry missing"
    if not os.access(RENDER, os.X_OK):
        return "no chart renderer (make spec-extra builds %s)" % os.path.relpath(RENDER, ROOT)
    if not shutil.which("findmnt"):
        return "findmnt missing (util-linux)"
    return None


def pod(name, ns, claim, read_only=False):
    vol = {"claimName": claim}
    if read_only:
        vol["readOnly"] = True
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": NODE, "hostNetwork": True, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "model", "image": kubenode.KubeNode.BUSYBOX,
                                     "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                                     "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                     "volumes": [{"name": "cache", "persistentVolumeClaim": vol}]}}


def cache(name, ref, digest, claim, ns=NS, kind="GKMCache"):
    meta = {"name": name, "annotations": {"gkm.io/resolvedDigest": digest}}
    if ns:
        meta["namespace"] = ns
    return {"apiVersion": GV, "kind": kind, "metadata": meta, "spec": {"image": ref, "claim": claim}}


def main():
    why = unavailable()
    if why:
        t.skip("caches as PersistentVolumeClaims through a real kubelet", why)
        return
    tmp, why = kube_e2e.mount_workdir("gkm-csi-claim.", cleanups)
    if why:
        t.skip("caches as PersistentVolumeClaims through a real kubelet", why)
        return

    def path(*p):
        return os.path.join(tmp, *p)

    # ---- a signed cache in a real registry ----
    reg, digests, trust = kube_e2e.signed_caches(GKM, ROOT, tmp, cleanups,
                                                 {FIXTURE: "caches/cuda:v1", HIP_FIXTURE: "caches/rocm:v1"})
    ref = reg + "/caches/cuda:v1"
    digest = digests[ref]

    # ---- control plane, node, gkm ----
    kube = kubeenv.KubeEnv(controller_manager=True, cm_controllers=CONTROLLERS)
    kubectl, get, apply = kube.kubectl, kube.get_json, kube.apply_obj
    cleanups.append(kube.stop)
    kube.start()
    kube.apply_crds()
    node = kubenode.KubeNode(kube, NODE)
    cleanups.append(node.stop)
    node.start()
    state, run = path("state"), path("run")
    chart = chart_node_paths(RENDER, os.path.join(ROOT, "charts", "gkm"), node.root_dir, state, run)
    p = apply(chart["csidriver"])
    t.ok(p.returncode == 0 and chart["csidriver"]["spec"]["volumeLifecycleModes"] == ["Ephemeral", "Persistent"],
         "the chart's CSIDriver (lifecycle modes Ephemeral and Persistent) applied", diag=p.stderr)
    for ns in (NS, OTHER):
        kube.make_namespace(ns)
    agent = Child([GKM, "agent", "--node", NODE, "--kubeconfig", kube.kubeconfig, "--gpu-file", T4,
                   "--root", state, "--run-dir", run, "--trust-dir", trust,
                   "--health-listen", "127.0.0.1:%d" % free_port()], path("agent.log"))
    cleanups.append(agent.stop)
    operator = Child([GKM, "operator", "--kubeconfig", kube.kubeconfig, "--leader-elect", "false",
                      "--trust-dir", trust, "--health-listen", "127.0.0.1:%d" % free_port()],
                     path("operator.log"))
    cleanups.append(operator.stop)
    os.makedirs(os.path.dirname(chart["socket"]), exist_ok=True)
    csi_port = free_port()
    csi = Child([GKM, "csi", "--endpoint", "unix://" + chart["socket"], "--node-id", NODE,
                 "--root", state, "--run-dir", run,
                 "--health-listen", "127.0.0.1:%d" % csi_port], path("csi.log"))
    cleanups.append(csi.stop)
    wait_for(lambda: os.path.exists(chart["socket"]), 15)
    node.register_plugin(DRIVER, chart["registration_path"])

    # ---- a cache with a claim ----
    for obj in (cache("vector-add", ref, digest, {"name": "kernels", "readOnly": True}),
                cache("vector-add-rw", ref, digest, {"name": "kernels-rw", "readOnly": False}),
                cache("shared-add", ref, digest, {"namespace": OTHER}, ns=None, kind="ClusterGKMCache")):
        p = apply(obj)
        t.ok(p.returncode == 0, "%s %s with spec.claim created" % (obj["kind"], obj["metadata"]["name"]),
             diag=p.stderr)
    uid = get("gkmcache", "vector-add", "-n", NS)["metadata"]["uid"]
    pv_name = "gkm-" + uid

    def condition(kind, name, ns=NS, type_="Claim"):
        o = get(kind, name, "-n", ns) if ns else get(kind, name)
        conds = ((o or {}).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == type_), None)

    cond = wait_for(lambda: (condition("gkmcache", "vector-add") or {}).get("reason") == "Bound"
                    and condition("gkmcache", "vector-add"), 60)
    t.ok(cond and cond["status"] == "True" and pv_name in cond["message"],
         "the operator makes the claim; the binder binds it: condition Claim True, Bound",
         diag=(condition("gkmcache", "vector-add"), operator.tail()))

    def bound_claim():
        c = get("pvc", "kernels", "-n", NS, "--show-managed-fields") or {}
        return c if (c.get("status") or {}).get("phase") == "Bound" else None

    # the binder writes the volume's phase, then the claim's: wait for both
    pvc = wait_for(bound_claim, 30) or get("pvc", "kernels", "-n", NS, "--show-managed-fields") or {}
    pv = get("pv", pv_name) or {}
    spec = pv.get("spec", {})
    t.ok(spec.get("csi", {}).get("driver") == DRIVER and spec["csi"].get("volumeHandle") == pv_name
         and spec["csi"].get("volumeAttributes") == {"cacheName": "vector-add", "cacheNamespace": NS,
                                                          "readOnly": "true"}
         and spec.get("accessModes") == ["ReadOnlyMany"] and spec.get("storageClassName", "") == ""
         and spec.get("claimRef", {}).get("name") == "kernels"
         and spec["claimRef"].get("uid") == pvc.get("metadata", {}).get("uid"),
         "the PersistentVolume: csi.gkm.io, volume handle %s, attributes naming the cache, ReadOnlyMany, "
         "claimRef to the claim (with its uid)" % pv_name, diag=spec)
    owners = pvc.get("metadata", {}).get("ownerReferences") or []
    managers = {m["manager"] for m in pvc.get("metadata", {}).get("managedFields") or []}
    t.ok([(o["kind"], o["uid"]) for o in owners] == [("GKMCache", uid)] and "gkm-operator" in managers
         and pvc.get("status", {}).get("phase") == "Bound" and pvc["spec"].get("volumeName") == pv_name,
         "the claim: owned by the cache, applied by gkm-operator, Bound to the volume",
         diag=pvc.get("metadata"))

    # the agent makes the cache Ready on the node
    def entry(name="vector-add", ns=NS):
        o = get("gkmcn" if ns else "cgkmcn", NODE, *(["-n", ns] if ns else []))
        return ((o or {}).get("status") or {}).get("caches", {}).get(name)
    e = wait_for(lambda: (entry() or {}).get("state") == "Ready" and (entry("vector-add-rw") or {}).get(
        "state") == "Ready" and (entry("shared-add", None) or {}).get("state") == "Ready", 60)
    t.ok(e, "the agent makes the caches Ready on %s" % NODE, diag=(entry(), agent.tail()))
    view = os.path.join(state, "caches", NS, "vector-add", "data")
    want = tree(view)

    # ---- pods that only name the claim ----
    pods = {"p1": pod("p1", NS, "kernels"), "p2": pod("p2", NS, "kernels"),
            "w1": pod("w1", NS, "kernels-rw"), "w2": pod("w2", NS, "kernels-rw"),
            "c1": pod("c1", OTHER, "shared-add")}
    p = apply({"apiVersion": "v1", "kind": "List", "items": list(pods.values())})
    t.ok(p.returncode == 0, "five pods that name only a claim", diag=p.stderr)
    puid = {n: get("pod", n, "-n", m["metadata"]["namespace"])["metadata"]["uid"] for n, m in pods.items()}
    pvs = {"p1": pv_name, "p2": pv_name,
           "w1": "gkm-" + get("gkmcache", "vector-add-rw", "-n", NS)["metadata"]["uid"],
           "c1": "gkm-" + get("clustergkmcache", "shared-add")["metadata"]["uid"]}
    pvs["w2"] = pvs["w1"]

    def target(name):
        return os.path.join(node.root_dir, "pods", puid[name], "volumes", "kubernetes.io~csi", pvs[name], "mount")

    mounted = wait_for(lambda: all(findmnt(target(n)) for n in pods), 60)
    t.ok(mounted, "the kubelet mounts all five volumes", diag=(
         {n: findmnt(target(n)) for n in pods}, csi.tail(),
         kubectl("get", "events", "-A").stdout[-2000:]))
    src = os.path.realpath(view)
    ro = {n: findmnt(target(n)) for n in ("p1", "p2")}
    t.ok(all(m and m["options"].split(",")[0] == "ro" and m["fstype"] != "overlay"
             and m["source"].endswith("[%s]" % src) for m in ro.values()),
         "both pods of the read-only claim: a read-only bind of the one shared copy at their own target",
         diag=ro)
    t.ok(tree(target("p1")) == want and tree(target("p2")) == want and want,
         "each pod's volume holds the cache byte for byte", diag=len(want))

    # what the kubelet sent: the plugin's records
    records = {}
    for f in os.listdir(os.path.join(run, "volumes")):
        with open(os.path.join(run, "volumes", f)) as fh:
            r = json.load(fh)
        records[r["pod"]["name"]] = (f, r)
    p1, p2 = records.get("p1", (None, {})), records.get("p2", (None, {}))
    t.ok(p1[1].get("volumeId") == pv_name == p2[1].get("volumeId") and p1[1].get("shared") and p2[1].get("shared")
         and p1[0] != p2[0] and p1[0].startswith(pv_name + "@")
         and (p1[1]["pod"]["uid"], p2[1]["pod"]["uid"]) == (puid["p1"], puid["p2"])
         and p1[1]["targetPath"] == target("p1"),
         "the kubelet publishes the PV's volume handle once per pod (MULTI_NODE_READER_ONLY), with the pod's "
         "identity (podInfoOnMount): one record per target", diag=records)
    scrape = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % csi_port, timeout=10).read().decode()
    calls = [line for line in scrape.splitlines() if line.startswith("gkm_csi_calls_total")]
    t.ok(not any("NodeStage" in line for line in calls)
         and any('method="NodePublishVolume",code="OK"' in line for line in calls),
         "no NodeStageVolume (the plugin does not offer STAGE_UNSTAGE_VOLUME): NodePublishVolume only",
         diag=calls)

    # a writable claim: a private overlay per pod
    rw = {n: findmnt(target(n)) for n in ("w1", "w2")}
    t.ok(all(m and m["fstype"] == "overlay" and m["options"].split(",")[0] == "rw" for m in rw.values()),
         'readOnly: false on the claim: each pod its own overlay', diag=rw)
    if all(rw.values()):
        with open(os.path.join(target("w1"), "io.triton.cache", "jit-output"), "w") as fh:
            fh.write("compiled by w1")
    t.ok(os.path.exists(os.path.join(target("w1"), "io.triton.cache", "jit-output"))
         and not os.path.exists(os.path.join(target("w2"), "io.triton.cache", "jit-output"))
         and not os.path.exists(os.path.join(state, "caches", NS, "vector-add-rw", "data", "io.triton.cache",
                                             "jit-output")),
         "what one pod writes stays in its overlay: not in the other pod's, not in the shared copy")
    t.ok(findmnt(target("c1")) and tree(target("c1")) == want,
         "a ClusterGKMCache's claim in namespace %s: its pod mounts the cache" % OTHER)

    # ---- one pod goes, the other keeps its mount ----
    kubectl("delete", "pod", "p1", "-n", NS, "--wait=false")
    gone = wait_for(lambda: findmnt(target("p1")) is None and not os.path.exists(target("p1")), 40)
    t.ok(gone and findmnt(target("p2")) and tree(target("p2")) == want,
         "p1 deleted: its target is unpublished; p2's mount of the same volume stays", diag=csi.tail())
    usage = json.load(open(os.path.join(run, "usage", NS, "vector-add", "usage.json")))["pods"]
    t.eq([u["name"] for u in usage], ["p2"], "the usage record lists p2 only")

    def failed_mount(name, ns):
        ev = get("events", "-n", ns, "--field-selector", "involvedObject.name=%s,reason=FailedMount" % name)
        return [x["message"] for x in (ev or {}).get("items", [])]

    # ---- the same checks as inline volumes: a cache not Ready here (built for HIP, the node has a T4) ----
    hip = reg + "/caches/rocm:v1"
    for obj in (cache("hip-add", hip, digests[hip], {"name": "hip-kernels", "onMiss": "empty"}),
                cache("hip-strict", hip, digests[hip], {"name": "hip-strict"})):
        apply(obj)
    wait_for(lambda: (entry("hip-add") or {}).get("state") == "Incompatible"
             and get("pvc", "hip-kernels", "-n", NS)["status"]["phase"] == "Bound"
             and get("pvc", "hip-strict", "-n", NS)["status"]["phase"] == "Bound", 60)
    apply({"apiVersion": "v1", "kind": "List", "items": [pod("fb", NS, "hip-kernels"), pod("stuck", NS, "hip-strict")]})
    puid.update({n: get("pod", n, "-n", NS)["metadata"]["uid"] for n in ("fb", "stuck")})
    pvs.update({n: "gkm-" + get("gkmcache", c, "-n", NS)["metadata"]["uid"]
                for n, c in (("fb", "hip-add"), ("stuck", "hip-strict"))})
    fb = wait_for(lambda: findmnt(target("fb")), 60)
    t.ok(fb and fb["fstype"] != "overlay" and fb["options"].split(",")[0] == "rw" and os.listdir(target("fb")) == [],
         'a claim with onMiss: "empty" of a cache Incompatible here: the pod gets an empty, writable directory',
         diag=(fb, entry("hip-add"), csi.tail()))
    why_not = "GKMCache %s/hip-strict is incompatible with this node's GPUs (BackendMismatch" % NS
    msgs = wait_for(lambda: [m for m in failed_mount("stuck", NS) if why_not in m], 60)
    t.ok(msgs and not findmnt(target("stuck")),
         "a claim without onMiss: FailedMount with the cache's reason on this node, nothing mounted",
         diag=failed_mount("stuck", NS))
    kubectl("delete", "pod", "fb", "-n", NS, "--wait=false")
    kubectl("delete", "pod", "stuck", "-n", NS, "--grace-period=0", "--force")

    # ---- placement: the volume's node affinity on the cache's Node label ----
    for obj in (cache("placed", ref, digest, {"name": "placed", "placement": True}),
                cache("hip-placed", hip, digests[hip], {"name": "hip-placed", "placement": True})):
        apply(obj)

    def affinity(claim):
        pvc = get("pvc", claim, "-n", NS) or {}
        pv = get("pv", pvc.get("spec", {}).get("volumeName", "-")) or {}
        terms = pv.get("spec", {}).get("nodeAffinity", {}).get("required", {}).get("nodeSelectorTerms")
        return pvc.get("status", {}).get("phase") == "Bound" and terms
    label = wait_for(lambda: get("gkmcache", "placed", "-n", NS)["status"]["nodeLabel"], 60)
    terms = wait_for(lambda: affinity("placed"), 60)
    t.ok(label and terms == [{"matchExpressions": [{"key": label, "operator": "In", "values": ["ready"]}]}],
         "placement: true: the volume requires the cache's Node label (%s=ready)" % label, diag=terms)
    t.ok(wait_for(lambda: (get("node", NODE)["metadata"].get("labels") or {}).get(label) == "ready", 60),
         "the operator labels %s where the cache is Ready" % NODE)
    apply({"apiVersion": "v1", "kind": "List", "items": [pod("pl", NS, "placed"), pod("hp", NS, "hip-placed")]})
    puid.update({n: get("pod", n, "-n", NS)["metadata"]["uid"] for n in ("pl", "hp")})
    pvs.update({n: "gkm-" + get("gkmcache", c, "-n", NS)["metadata"]["uid"]
                for n, c in (("pl", "placed"), ("hp", "hip-placed"))})
    t.ok(wait_for(lambda: findmnt(target("pl")), 60) and tree(target("pl")) == want,
         "a pod of the placed claim on a labelled node: mounted", diag=csi.tail())
    msgs = wait_for(lambda: [m for m in failed_mount("hp", NS) if "affinity" in m.lower()], 60)
    t.ok(msgs and not findmnt(target("hp")),
         "the claim of a cache Ready on no node: the kubelet refuses the volume's node affinity "
         "(the scheduler would not place the pod here)", diag=failed_mount("hp", NS))
    kubectl("delete", "pod", "pl", "-n", NS, "--wait=false")
    kubectl("delete", "pod", "hp", "-n", NS, "--grace-period=0", "--force")
    t.ok(wait_for(lambda: findmnt(target("fb")) is None, 40), "the fallback volume is unpublished with its pod")

    # ---- the same checks: a hand-made volume for a cache of another namespace ----
    apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "by-hand"},
           "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                    "claimRef": {"namespace": OTHER, "name": "stolen"},
                    "csi": {"driver": DRIVER, "volumeHandle": "by-hand",
                            "volumeAttributes": {"cacheName": "vector-add", "cacheNamespace": NS}}}})
    apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "stolen", "namespace": OTHER},
           "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": "by-hand",
                    "resources": {"requests": {"storage": "1Mi"}}}})
    apply(pod("thief", OTHER, "stolen"))

    why_not = "a pod in namespace %s may not mount GKMCache %s/vector-add" % (OTHER, NS)
    msgs = wait_for(lambda: [m for m in failed_mount("thief", OTHER) if why_not in m], 60)
    t.ok(msgs, "a hand-made volume naming a GKMCache of another namespace: FailedMount, PermissionDenied",
         diag=failed_mount("thief", OTHER))
    kubectl("delete", "pod", "thief", "-n", OTHER, "--grace-period=0", "--force")

    # ---- bad input ----
    apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "taken", "namespace": NS},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                    "resources": {"requests": {"storage": "1Gi"}}}})
    before = get("pvc", "taken", "-n", NS)
    apply(cache("clash", ref, digest, {"name": "taken"}))
    cond = wait_for(lambda: (condition("gkmcache", "clash") or {}).get("status") == "False"
                    and condition("gkmcache", "clash"), 30)
    after = get("pvc", "taken", "-n", NS)
    clash_uid = get("gkmcache", "clash", "-n", NS)["metadata"]["uid"]
    t.ok(cond and cond["status"] == "False" and cond["reason"] == "ClaimConflict"
         and "team-a/taken" in cond["message"] and "not made by gkm" in cond["message"],
         "a claim name taken by a claim gkm did not make: Claim False, ClaimConflict, saying which", diag=cond)
    t.ok(after and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
         and not after["metadata"].get("ownerReferences") and get("pv", "gkm-" + clash_uid) is None,
         "the foreign claim is untouched (same resourceVersion, no owner) and no volume is made", diag=after)

    apply(cache("no-ns", ref, digest, {}, ns=None, kind="ClusterGKMCache"))
    cond = wait_for(lambda: (condition("clustergkmcache", "no-ns", ns=None) or {}).get("status") == "False"
                    and condition("clustergkmcache", "no-ns", ns=None), 30)
    t.ok(cond and cond["status"] == "False" and cond["reason"] == "InvalidClaim"
         and "spec.claim.namespace is required" in cond["message"],
         "a ClusterGKMCache claim without a namespace: Claim False, InvalidClaim", diag=cond)

    # a hand edit of the volume is undone; a deleted volume is not made again while bound (see below)
    p = kubectl("patch", "pv", pv_name, "--type=merge", "-p", json.dumps({"spec": {"accessModes": ["ReadWriteOnce"]}}))
    restored = wait_for(lambda: (get("pv", pv_name) or {}).get("spec", {}).get("accessModes") == ["ReadOnlyMany"]
                        and get("pv", pv_name)["metadata"]["resourceVersion"], 30)
    t.ok(p.returncode == 0 and restored, "the volume edited by hand (accessModes): the operator applies it again",
         diag=(p.stderr, get("pv", pv_name), operator.tail()))
    t.ok(findmnt(target("p2")), "p2's mount is unaffected")

    # ---- the claim, then the volume, deleted by hand ----
    apply(cache("handled", ref, digest, {"name": "handled"}))
    h_pv = "gkm-" + wait_for(lambda: get("gkmcache", "handled", "-n", NS)["metadata"]["uid"], 30)

    def bound():
        pvc, pv = get("pvc", "handled", "-n", NS), get("pv", h_pv)
        ok = pvc and pv and pvc["status"].get("phase") == "Bound" and pv["status"].get("phase") == "Bound" \
            and (condition("gkmcache", "handled") or {}).get("reason") == "Bound"
        return ok and (pvc["metadata"]["uid"], pv["metadata"]["uid"])
    first = wait_for(bound, 60)
    kubectl("delete", "pvc", "handled", "-n", NS)
    again = wait_for(lambda: (bound() or (None,))[0] not in (None, first and first[0]) and bound(), 60)
    t.ok(first and again and again[1] == first[1],
         "the claim deleted by hand: the operator makes it again and the same volume is bound to it",
         diag=(first, again, get("pv", h_pv), operator.tail()))
    kubectl("delete", "pv", h_pv, "--wait=false")
    cond = wait_for(lambda: (condition("gkmcache", "handled") or {}).get("reason") == "VolumeDeleting"
                    and condition("gkmcache", "handled"), 30)
    t.ok(cond and cond["status"] == "False" and "delete the claim too" in cond["message"],
         "the volume deleted by hand (kept by pv-protection while bound): Claim False, VolumeDeleting, "
         "saying what to do", diag=condition("gkmcache", "handled"))
    kubectl("delete", "pvc", "handled", "-n", NS, "--wait=false")
    fresh = wait_for(lambda: (bound() or (None, None))[1] not in (None, again and again[1]) and bound(), 60)
    t.ok(fresh, "the claim deleted too: both are made again and bound", diag=(get("pv", h_pv), operator.tail()))

    # ---- the cache deleted while a pod holds its claim ----
    kubectl("delete", "gkmcache", "vector-add", "-n", NS, "--wait=false")
    held = wait_for(lambda: (get("pvc", "kernels", "-n", NS) or {}).get("metadata", {}).get("deletionTimestamp")
                    and get("pvc", "kernels", "-n", NS), 30)
    t.ok(held and "kubernetes.io/pvc-protection" in held["metadata"].get("finalizers", [])
         and get("pv", pv_name) and findmnt(target("p2")) and tree(target("p2")) == want,
         "cache deleted while p2 uses the claim: the claim is being deleted but kept (pvc-protection), "
         "the volume stays, p2's mount and files stay", diag=(held, get("pv", pv_name)))
    kubectl("delete", "pod", "p2", "-n", NS, "--wait=false")
    gone = wait_for(lambda: get("pvc", "kernels", "-n", NS) is None and get("pv", pv_name) is None
                    and findmnt(target("p2")) is None, 60)
    t.ok(gone, "p2 deleted: its mount, then the claim and the volume are gone",
         diag=(get("pvc", "kernels", "-n", NS), get("pv", pv_name), operator.tail()))

    # ---- spec.claim removed: the claim goes, the cache stays ----
    c1_pv = pvs["c1"]
    kubectl("delete", "pod", "c1", "-n", OTHER, "--wait=false")
    wait_for(lambda: findmnt(target("c1")) is None, 40)
    p = kubectl("patch", "clustergkmcache", "shared-add", "--type=json",
                "-p", json.dumps([{"op": "remove", "path": "/spec/claim"}]))
    gone = wait_for(lambda: get("pvc", "shared-add", "-n", OTHER) is None and get("pv", c1_pv) is None, 60)
    t.ok(p.returncode == 0 and gone and condition("clustergkmcache", "shared-add", ns=None) is None
         and get("clustergkmcache", "shared-add"),
         "spec.claim removed from a ClusterGKMCache: its claim and volume are removed, the Claim condition "
         "goes, the cache stays", diag=(p.stderr, get("pvc", "shared-add", "-n", OTHER), get("pv", c1_pv)))

    for n in ("w1", "w2"):
        kubectl("delete", "pod", n, "-n", NS, "--wait=false")
    t.ok(wait_for(lambda: not [x for x in get("pods", "-A")["items"]], 60),
         "every pod gone", diag=kubectl("get", "pods", "-A").stdout)
    t.eq(os.listdir(os.path.join(run, "volumes")), [], "the plugin keeps no volume record")
    rc = {"gkm csi": csi.stop(), "gkm agent": agent.stop(), "gkm operator": operator.stop()}
    t.eq(rc, {"gkm csi": 0, "gkm agent": 0, "gkm operator": 0}, "gkm exits cleanly on SIGTERM")
    node.stop()
    kube.stop()
    left = [line for line in open("/proc/self/mountinfo") if tmp in line or node.dir in line]
    t.ok(not left, "nothing stays mounted", diag="".join(left))


kube_e2e.run(t, main, cleanups)
