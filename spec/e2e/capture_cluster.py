#!/usr/bin/python3
"""Captures in the cluster (spec.capture), the loop end to end against the
real API server (GKM_KUBE_ASSETS), a real registry (docker-registry), the
real `gkm operator`, `gkm agent` and `gkm csi` with real overlay mounts (the
CSI calls are made through the real gRPC client, as the kubelet makes them):
a fake compiler writes kernels through pods' writable volumes of a cache
that captures; when the volumes are unpublished, the plugin hands their
upper layers to the agent, which pushes unsigned candidates and reports
them; the operator lists one candidate per digest with every pod and node
(two nodes, each with its agent and plugin) it came from, a path two pods
wrote differently as a conflict, a symlink escape, a 10 GiB sparse file and
a device node as refusals. The records survive an agent restart; a
ClusterGKMCache captures the same way; a new value of the gkm.io/capture
annotation captures live volumes. A cache that does not capture loses its volumes' upper layers as
before. `gkm cache promote --apply` with the trusted key makes the
candidate the cache, which becomes Ready on the node."""
import hashlib
import json
import socket
import os
import shutil
import subprocess
import sys
import threading

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import csi_client as cc  # noqa: E402
import kube_e2e  # noqa: E402
import kubeenv  # noqa: E402
from proc import Child, free_port, registry, regproxy, wait_for  # noqa: E402
from tap import Tap  # noqa: E402

import grpc  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "cuda-sm75-vector-add")
T4 = os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "t4.json")
NODE, NODE2, NS = "node-1", "node-2", "team-a"
HASH = "MULKERNELHASHAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
CUBIN = "io.triton.cache/%s/mul_kernel.cubin" % HASH

t = Tap()
cleanups = []


def gkm(*args):
    p = subprocess.run([GKM] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def compile_kernel(tgt, seed, hashdir=HASH):
    """The fake compiler: one Triton kernel for the T4 (sm_75) written
    through the pod's mount, its binary's bytes given by seed."""
    d = os.path.join(tgt, "io.triton.cache", hashdir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "mul_kernel.json"), "w") as f:
        json.dump({"hash": hashdir, "name": "mul_kernel", "num_warps": 4,
                   "target": {"backend": "cuda", "arch": 75, "warp_size": 32}}, f)
    with open(os.path.join(d, "mul_kernel.cubin"), "wb") as f:
        f.write(hashlib.sha256(seed.encode()).digest() * 512)


def main():
    why = kubeenv.unavailable()
    if not why and not os.access("/usr/bin/docker-registry", os.X_OK):
        why = "/usr/bin/docker-registry missing"
    if why:
        t.skip("captures in the cluster", why)
        return
    tmp, why = kube_e2e.mount_workdir("gkm-capture-cluster.", cleanups)
    if why:
        t.skip("captures in the cluster", why)
        return

    def path(*p):
        return os.path.join(tmp, *p)

    reg, digests, trust = kube_e2e.signed_caches(GKM, ROOT, tmp, cleanups, {FIXTURE: "caches/cuda:v1"})
    ref = reg + "/caches/cuda:v1"
    digest = digests[ref]
    repo = reg + "/caches/cuda-candidates"
    # candidates of a private repository: a registry that wants a login
    subprocess.run("htpasswd -Bbn dana p4ss > '%s'" % path("htpasswd"), shell=True, check=True)
    reg2, stop2 = registry(ROOT, "htpasswd", path("htpasswd"))
    cleanups.append(stop2)

    kube = kubeenv.KubeEnv()
    get = kube.get_json
    cleanups.append(kube.stop)
    kube.start()
    kube.apply_crds()
    kube.make_namespace(NS)
    kube.make_node(NODE)
    kube.make_node(NODE2)
    state, run = path("state"), path("run")
    agent_args = [GKM, "agent", "--node", NODE, "--kubeconfig", kube.kubeconfig, "--gpu-file", T4,
                  "--root", state, "--run-dir", run, "--trust-dir", trust,
                  "--health-listen", "127.0.0.1:%d" % free_port()]
    agent = Child(agent_args, path("agent.log"))
    cleanups.append(agent.stop)
    operator = Child([GKM, "operator", "--kubeconfig", kube.kubeconfig, "--leader-elect", "false",
                      "--trust-dir", trust, "--resolve-digests", "true",
                      "--health-listen", "127.0.0.1:%d" % free_port()],
                     path("operator.log"))
    cleanups.append(operator.stop)
    plugin = cc.Plugin(tmp, state, run, node_id=NODE)
    cleanups.append(plugin.stop)
    plugin.start()
    # a second node: its own agent, plugin, store and run directory
    state2, run2 = path("state2"), path("run2")
    agent2 = Child([GKM, "agent", "--node", NODE2, "--kubeconfig", kube.kubeconfig, "--gpu-file", T4,
                    "--root", state2, "--run-dir", run2, "--trust-dir", trust,
                    "--health-listen", "127.0.0.1:%d" % free_port()], path("agent-2.log"))
    cleanups.append(agent2.stop)
    plugin2 = cc.Plugin(tmp, state2, run2, node_id=NODE2, name="plugin2")
    cleanups.append(plugin2.stop)
    plugin2.start()
    pb, pbg = cc.load_stubs(path("py"))
    stubs = {NODE: pbg.NodeStub(grpc.insecure_channel(plugin.endpoint)),
             NODE2: pbg.NodeStub(grpc.insecure_channel(plugin2.endpoint))}
    where = {}

    def cache(name, capture=None):
        spec = {"image": ref}
        if capture:
            spec["capture"] = capture
        return {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                "metadata": {"name": name, "namespace": NS}, "spec": spec}

    # ---- the API: validation ----
    p = kube.apply_obj(cache("bad", {"onPodExit": True}))
    t.ok(p.returncode != 0 and "repository" in p.stderr,
         "spec.capture without a repository is refused by the CRD's schema", diag=p.stderr)
    p = kube.apply_obj(cache("bad", {"repository": repo + ":tag"}))
    t.ok(p.returncode != 0 and "repository" in p.stderr,
         "spec.capture.repository with a tag is refused", diag=p.stderr)

    shared = {"apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache", "metadata": {"name": "shared"},
              "spec": {"image": ref, "capture": {"repository": reg + "/caches/shared-candidates",
                                                 "namespaces": [NS]}}}
    p = kube.kubectl("create", "secret", "docker-registry", "push", "-n", NS, "--docker-server=" + reg2,
                     "--docker-username=dana", "--docker-password=p4ss")
    t.ok(p.returncode == 0, "a Secret with the private registry's credentials", diag=p.stderr)
    private = cache("private", {"repository": reg2 + "/team/candidates"})
    private["spec"]["pullSecrets"] = [{"name": "push"}]
    for obj in (cache("vector-add", {"repository": repo}), cache("plain"), shared, private,
                cache("nocreds", {"repository": reg2 + "/team/candidates"}),
                cache("ondemand", {"repository": repo, "onPodExit": False})):
        p = kube.apply_obj(obj)
        t.ok(p.returncode == 0, "%s %s applied" % (obj["kind"], obj["metadata"]["name"]), diag=p.stderr)

    def node_entry(name, on=NODE):
        o = get("gkmcachenode", on, "-n", NS) or {}
        return ((o.get("status") or {}).get("caches") or {}).get(name) or {}

    def ready(name, want, on=NODE):
        e = node_entry(name, on)
        return e if e.get("state") == "Ready" and e.get("digest") == want else None

    e = wait_for(lambda: ready("vector-add", digest) and ready("plain", digest) and ready("ondemand", digest)
                 and ready("vector-add", digest, NODE2), 90)
    t.ok(e, "both caches are Ready on %s, the capturing one on %s too" % (NODE, NODE2),
         diag=(node_entry("vector-add"), node_entry("vector-add", NODE2), agent.tail(), agent2.tail()))
    marker = os.path.join(state, "caches", NS, "vector-add", "capture")
    t.ok(wait_for(lambda: os.path.exists(marker), 10)
         and not os.path.exists(os.path.join(state, "caches", NS, "plain", "capture"))
         and not os.path.exists(os.path.join(state, "caches", NS, "ondemand", "capture")),
         "the agent marks the view of the cache that captures on pod exit, and only that one "
         "(not one without spec.capture, nor one with onPodExit false)")

    def handed_over():
        return [n for st in (state, state2) if os.path.isdir(os.path.join(st, "captures", NS, "vector-add"))
                for n in os.listdir(os.path.join(st, "captures", NS, "vector-add")) if n[0] != "."]

    def publish(pod, name="vector-add", on=NODE, ns=NS, pod_ns=NS):
        tgt = path("pods", pod, "mount")
        os.makedirs(os.path.dirname(tgt))
        where[pod] = on
        stubs[on].NodePublishVolume(cc.publish_request(pb, "v-" + pod, tgt, name, ns=ns, pod_ns=pod_ns, pod=pod,
                                                       uid="uid-" + pod, writable=True), timeout=30)
        return tgt

    def unpublish(pod):
        stubs[where[pod]].NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="v-" + pod,
                                                               target_path=path("pods", pod, "mount")),
                                 timeout=30)

    pods = {name: publish(name) for name in ("p1", "p3", "p4", "p7", "p8")}
    pods["p2"] = publish("p2", on=NODE2)
    plain = publish("p5", "plain")
    compile_kernel(pods["p1"], "one")
    compile_kernel(pods["p2"], "one")
    compile_kernel(pods["p3"], "other")
    compile_kernel(pods["p4"], "one")
    os.symlink("/etc/shadow", os.path.join(pods["p4"], "io.triton.cache", HASH, "escape.json"))
    compile_kernel(pods["p7"], "one")
    with open(os.path.join(pods["p7"], "io.triton.cache", HASH, "huge.bin"), "wb") as f:
        f.truncate(10 << 30)  # 10 GiB, sparse
    compile_kernel(pods["p8"], "one")
    os.mknod(os.path.join(pods["p8"], "io.triton.cache", "null"), 0o20644, os.makedev(1, 3))
    compile_kernel(plain, "one")
    for name in ("p1", "p2", "p3", "p4", "p7", "p8", "p5"):
        unpublish(name)
    t.ok(not os.path.exists(path(state, "csi", "volumes", "v-p5"))
         and not os.path.exists(os.path.join(state, "captures", NS, "plain")),
         "a cache that does not capture: the volume's upper layer is deleted at unpublish, as before")

    def status():
        return (get("gkmcache", "vector-add", "-n", NS) or {}).get("status") or {}

    def captured():
        s = status()
        pods = sum(len(c.get("pods") or []) for c in s.get("candidates") or [])
        return s if pods == 3 and len(s.get("captureRefusals") or []) == 3 else None

    s = wait_for(captured, 120) or status()
    cands = {tuple(sorted(p["name"] for p in c["pods"])): c for c in s.get("candidates") or []}
    c12, c3 = cands.get(("p1", "p2")), cands.get(("p3",))
    t.ok(c12 and c3 and c12["digest"] != c3["digest"] and c12["repository"] == repo
         and c12["files"] == 2 and sorted(p["node"] for p in c12["pods"]) == [NODE, NODE2]
         and c12.get("targets") == [{"backend": "cuda", "arch": 75, "warp_size": 32}],
         "the two pods (on two nodes) that compiled the same kernel give one candidate (one digest) "
         "listing both with their nodes; "
         "the third is another candidate", diag=(s, agent.tail()))
    t.ok((s.get("captureConflicts") or []) == [{"path": CUBIN, "digests": sorted([c12["digest"], c3["digest"]])}]
         if c12 and c3 else False,
         "the path the third pod wrote differently is a conflict naming both candidates",
         diag=s.get("captureConflicts"))
    refusals = {r["pod"]["name"]: r for r in s.get("captureRefusals") or []}
    r = refusals.get("p4") or {}
    t.ok(r.get("reason") == "Symlink" and "escape.json" in r.get("message", ""),
         "the volume with a symlink escape is refused, naming the path", diag=refusals)
    r = refusals.get("p7") or {}
    t.ok(r.get("reason") == "CapExceeded", "the volume with a 10 GiB sparse file is refused: over the byte cap",
         diag=refusals)
    r = refusals.get("p8") or {}
    t.ok(r.get("reason") == "DeviceNode" and "null" in r.get("message", ""),
         "the volume with a device node is refused, naming it", diag=refusals)
    rc, out, err = gkm("cache", "inspect", repo + ":candidate-v-p7", "--no-signatures")
    t.ok(rc != 0 and len(c12.get("pods") or []) == 2 if c12 else False,
         "nothing of a refused volume is pushed", diag=(out, err))
    p = kube.kubectl("get", "events", "-n", NS, "--field-selector", "involvedObject.name=vector-add", "-o", "json")
    evs = json.loads(p.stdout)["items"] if p.returncode == 0 else []
    reasons = sorted(e["reason"] for e in evs if e["reason"].startswith("Capture"))
    t.ok(reasons.count("CaptureCandidate") >= 2 and reasons.count("CaptureRefused") == 3
         and any("unsigned: gkm cache promote" in e["message"] for e in evs),
         "each capture is told in an Event on the cache (kubectl describe): candidates and refusals",
         diag=[(e["reason"], e["message"]) for e in evs])
    t.ok(wait_for(lambda: not handed_over(), 10) is not None,
         "the agent removes every handed-over upper layer once captured or refused",
         diag=handed_over())
    if not c12:
        return

    # ---- an agent restart keeps what was captured ----
    before = ((get("gkmcachenode", NODE, "-n", NS) or {}).get("status") or {}).get("lastUpdated")
    agent.stop()
    agent = Child(agent_args, path("agent2.log"))
    cleanups.append(agent.stop)

    def rewritten():
        st = (get("gkmcachenode", NODE, "-n", NS) or {}).get("status") or {}
        return st if st.get("lastUpdated") != before else None

    st = wait_for(rewritten, 60) or {}
    caps = ((st.get("caches") or {}).get("vector-add") or {}).get("captures") or []
    t.ok(len(caps) == 5 and len((status().get("candidates") or [])) == 2,
         "a restarted agent reports the captures again (kept on the node)", diag=(caps, agent.tail()))
    cand = repo + "@" + c12["digest"]
    rc, _, err = gkm("cache", "verify", cand, "--key", os.path.join(trust, "trusted.pub"))
    t.ok(rc != 0, "the candidate carries no signature: no pod mounts it", diag=err)
    t.ok(wait_for(lambda: ready("vector-add", digest), 5),
         "the cache itself is unchanged", diag=node_entry("vector-add"))

    # ---- a ClusterGKMCache captures the same way ----
    def cluster_entry():
        o = get("clustergkmcachenode", NODE) or {}
        return ((o.get("status") or {}).get("caches") or {}).get("shared") or {}

    ok = wait_for(lambda: cluster_entry().get("state") == "Ready", 60)
    tgt = publish("p9", "shared", ns=None)
    compile_kernel(tgt, "one")
    unpublish("p9")

    def shared_candidates():
        return ((get("clustergkmcache", "shared") or {}).get("status") or {}).get("candidates")

    cs = wait_for(shared_candidates, 60) or []
    t.ok(ok and len(cs) == 1 and cs[0]["digest"] == c12["digest"]
         and cs[0]["repository"] == reg + "/caches/shared-candidates"
         and [(p["name"], p["node"]) for p in cs[0]["pods"]] == [("p9", NODE)],
         "a ClusterGKMCache with spec.capture: the pod's kernel is a candidate in its status "
         "(the same files on the same image: the same digest)", diag=(cs, cluster_entry(), agent.tail()))
    # a pod of a namespace the ClusterGKMCache does not list: gkm's own
    # credentials push nothing for it
    tgt = publish("p15", "shared", ns=None, pod_ns="team-b")
    compile_kernel(tgt, "stranger", HASH.replace("MUL", "STR"))
    unpublish("p15")

    def stranger_refused():
        s = (get("clustergkmcache", "shared") or {}).get("status") or {}
        return [r for r in s.get("captureRefusals") or [] if r["pod"]["name"] == "p15"] or None

    r = (wait_for(stranger_refused, 60) or [{}])[0]
    rc, out, err = gkm("cache", "inspect", reg + "/caches/shared-candidates:candidate-v-p15", "--no-signatures")
    t.ok(r.get("reason") == "NamespaceNotAllowed" and "team-b" in r.get("message", "") and rc != 0
         and len(shared_candidates() or []) == 1,
         "a ClusterGKMCache captures only the namespaces spec.capture.namespaces lists: a volume of "
         "team-b is refused (NamespaceNotAllowed), nothing pushed", diag=(r, shared_candidates(), out))

    # ---- a private repository: the cache's pull Secret pushes ----
    ok = wait_for(lambda: ready("private", digest) and ready("nocreds", digest), 60)
    for pod, name in (("p10", "private"), ("p11", "nocreds")):
        compile_kernel(publish(pod, name), "one")
        unpublish(pod)

    def outcome(name):
        s = (get("gkmcache", name, "-n", NS) or {}).get("status") or {}
        return s.get("candidates") or s.get("captureRefusals")

    got = wait_for(lambda: outcome("private"), 60) or [{}]
    rc, _, err = gkm("cache", "inspect", "%s/team/candidates@%s" % (reg2, got[0].get("digest")),
                     "--no-signatures", "--creds", "dana:p4ss")
    t.ok(ok and got[0].get("digest") == c12["digest"] and rc == 0,
         "a cache that names a pull Secret for its capture repository pushes with it", diag=(got, err))
    got = wait_for(lambda: outcome("nocreds"), 60) or [{}]
    t.ok(got[0].get("reason") == "PushFailed" and got[0]["pod"]["name"] == "p11",
         "without credentials the push is refused, and the refusal says so", diag=got)

    # ---- promote: the trusted step ----
    rc, out, err = gkm("cache", "promote", cand, "--key", path("trusted.key"), "--cache", NS + "/vector-add",
                       "--apply", "--kubeconfig", kube.kubeconfig)
    t.ok(rc == 0, "gkm cache promote --apply signs the candidate and sets spec.image", diag=(out, err))
    e = wait_for(lambda: ready("vector-add", c12["digest"]), 90)
    t.ok(e, "the candidate becomes the cache: Ready on %s with its digest" % NODE,
         diag=(node_entry("vector-add"), agent.tail()))
    cond = wait_for(lambda: next((c for c in status().get("conditions") or []
                                  if c["type"] == "Ready" and c["status"] == "True"), None), 30)
    s = status()
    t.ok(cond and s.get("resolvedDigest") == c12["digest"] and not s.get("candidates"),
         "the cache's status: Ready on the promoted digest; the old base's candidates are gone", diag=s)
    tgt = publish("p6")
    t.ok(os.path.exists(os.path.join(tgt, CUBIN)), "the next pod mounts the kernel the first pods compiled")

    # ---- on demand: the live volumes, left in place ----
    compile_kernel(tgt, "fresh", HASH.replace("MUL", "NEW"))
    p = kube.kubectl("annotate", "gkmcache", "vector-add", "-n", NS, "gkm.io/capture=1")
    t.ok(p.returncode == 0, "annotation gkm.io/capture set", diag=p.stderr)

    def live():
        c = [c for c in status().get("candidates") or [] if [p["name"] for p in c["pods"]] == ["p6"]]
        return c[0] if c else None

    c6 = wait_for(live, 60)
    t.ok(c6 and c6["files"] == 2 and os.path.exists(os.path.join(tgt, "io.triton.cache", HASH.replace("MUL", "NEW"))),
         "a new value of gkm.io/capture captures the live volume (a candidate on the promoted cache, "
         "listing p6); the volume is left as it was", diag=(status(), agent.tail()))
    unpublish("p6")
    t.ok(wait_for(lambda: not handed_over(), 30) is not None
         and [c["digest"] for c in status().get("candidates") or []] == [c6["digest"]] if c6 else False,
         "captured again at exit: the same digest, p6 listed once", diag=status())

    # ---- on demand while a pod still writes: refused, nothing pushed ----
    tgt = publish("p12")
    compile_kernel(tgt, "busy", HASH.replace("MUL", "BSY"))
    stop = threading.Event()

    def writer():
        with open(os.path.join(tgt, "io.triton.cache", HASH.replace("MUL", "BSY"), "log.txt"), "a") as f:
            while not stop.wait(0.02):
                f.write("x" * 100)
                f.flush()

    w = threading.Thread(target=writer)
    w.start()
    try:
        kube.kubectl("annotate", "--overwrite", "gkmcache", "vector-add", "-n", NS, "gkm.io/capture=2")
        r = wait_for(lambda: next((r for r in status().get("captureRefusals") or []
                                   if r["pod"]["name"] == "p12"), None), 60)
    finally:
        stop.set()
        w.join()
    t.ok(r and r["reason"] == "StillWriting" and len(status().get("candidates") or []) == 1,
         "a capture on demand of a volume its pod is still writing is refused (StillWriting); "
         "no candidate from it", diag=(r, status().get("candidates")))
    unpublish("p12")

    # ---- a pod swaps its cache directory for a link while the capture waits ----
    # The tenant owns the registry of its cache's image, stalls the base pull
    # of a capture on demand, and meanwhile replaces io.triton.cache in its
    # live volume with a link to files of the node (a stand-in for the
    # agent's service-account token). Nothing is pushed; the refusal names it.
    proxy, control, stats, proxy_stop = regproxy(ROOT, reg, tmp)
    cleanups.append(proxy_stop)
    secret = path("node-secrets")
    os.makedirs(secret)
    with open(os.path.join(secret, "token"), "w") as f:
        f.write("SECRET-TOKEN")
    p = kube.apply_obj({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                        "metadata": {"name": "stall", "namespace": NS},
                        "spec": {"image": proxy + "/caches/cuda:v1", "capture": {"repository": repo}}})
    ok = p.returncode == 0 and wait_for(lambda: ready("stall", digest), 60)
    tgt = publish("p14", "stall")
    compile_kernel(tgt, "mine", HASH.replace("MUL", "OWN"))
    control({"hold": True, "match": "^(GET|HEAD) /v2/caches/cuda/"})
    kube.kubectl("annotate", "gkmcache", "stall", "-n", NS, "gkm.io/capture=1")
    held = wait_for(lambda: stats()["held"] > 0, 60)
    shutil.rmtree(os.path.join(tgt, "io.triton.cache"))
    os.symlink(secret, os.path.join(tgt, "io.triton.cache"))
    control({})

    def swap_refused():
        s = (get("gkmcache", "stall", "-n", NS) or {}).get("status") or {}
        return [r for r in s.get("captureRefusals") or [] if r["pod"]["name"] == "p14"] or None

    r = (wait_for(swap_refused, 60) or [{}])[0]
    s = (get("gkmcache", "stall", "-n", NS) or {}).get("status") or {}
    msg = r.get("message", "")
    t.ok(ok and held and r.get("reason") == "Symlink" and "io.triton.cache: a symlink (to '%s')" % secret in msg
         and "replaced it while it was captured" in msg and "/proc/self" not in msg and not s.get("candidates"),
         "a cache directory swapped for a link during a stalled base pull: refused (Symlink) naming the "
         "volume's path, no candidate", diag=(ok, held, r, s.get("candidates"), agent.tail()))
    rc, out, err = gkm("cache", "inspect", repo + ":candidate-v-p14", "--no-signatures")
    t.ok(rc != 0, "nothing of the swapped volume reached the registry", diag=(out, err))
    unpublish("p14")

    # ---- an agent stopped during a capture ends it and keeps the volume ----
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    cleanups.append(silent.close)
    wait_for(lambda: not handed_over(), 60)  # the capture of p12 at exit is done: none runs
    p = kube.apply_obj(cache("stuck", {"repository": "127.0.0.1:%d/x" % silent.getsockname()[1]}))
    ok = p.returncode == 0 and wait_for(lambda: ready("stuck", digest), 60)
    compile_kernel(publish("p13", "stuck"), "one")
    unpublish("p13")
    captures = os.path.join(state, "captures")
    started = wait_for(lambda: [n for n in os.listdir(captures) if n.startswith(".work-")], 60)
    rc = agent.stop()
    kept = os.listdir(os.path.join(captures, NS, "stuck"))
    t.ok(ok and started and rc == 0 and any(n.startswith("v-p13.") for n in kept)
         and not [n for n in os.listdir(captures) if n.startswith(".work-")],
         "an agent stopped while a capture waits on its registry ends it, exits cleanly and leaves the "
         "volume for the next run", diag=(ok, started, rc, kept, agent.tail()))


kube_e2e.run(t, main, cleanups)
