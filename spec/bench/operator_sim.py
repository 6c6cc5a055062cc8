"""The operator at scale: memory and time of the real `gkm operator` with
--nodes node objects of each kind and --caches GKMCaches (run by
spec/bench/operator.sh).

    operator_sim.py [--nodes 1000] [--caches 100] [--rest 5]

On a real kube-apiserver with etcd (GKM_KUBE_ASSETS, see spec/lib/kubeenv.py;
the reason is printed and nothing run where it is not set). The objects are
written before the operator starts (as a cluster that already runs gkm looks
then): Nodes, one ClusterGKMCacheNode and one GKMCacheNode per node applied
exactly as `gkm agent` applies them (labels, ownerReference, spec.nodeName,
then the status gpus/caches/counts, field manager gkm-agent/<node>), and the
GKMCaches with the digest the webhook resolved. Most nodes
are 8-GPU H100 nodes with every cache Ready; some are A100 nodes on which the
sm_90 caches are Incompatible, a few failed to pull some caches, a few are
still pulling, and some caches are mounted by pods.

Then: start the operator; time until every cache's status shows the expected
readyNodes/totalNodes; memory at rest (VmRSS, VmHWM, PSS, private dirty) and
CPU; then a full re-aggregation (a policy ConfigMap whose aggregate policy
words the Ready message differently, so every cache's status changes), timed
until every cache shows it, with the operator's CPU for it. Figures only,
printed as one JSON line.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import uuid

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeenv import KubeEnv, unavailable  # noqa: E402
from proc import cpu_s, free_port, memory  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
GROUP = "/apis/gkm.io/v1alpha1"
AV = "gkm.io/v1alpha1"
APPLY = "application/apply-patch+yaml"
NS = "ml-serving"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def ts(sec):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1795000000 + sec))


def digest(j):
    return "sha256:" + ("%064x" % (0x9e3779b97f4a7c15 * (j + 1) * 0x1000193))[-64:]


def node_kind(i):
    """h100 (most), a100 (every 20th), failed (every 97th), pulling (every 151st)."""
    if i % 151 == 7:
        return "pulling"
    if i % 97 == 3:
        return "failed"
    if i % 20 == 11:
        return "a100"
    return "h100"


def gpus(kind):
    if kind == "a100":
        return [{"ids": [0, 1, 2, 3], "gpuType": A100, "arch": "sm_80", "driverVersion": "550.90.07",
                 "cudaVersion": "12.4"}]
    return [{"ids": list(range(8)), "gpuType": H100, "arch": "sm_90", "driverVersion": "550.90.07",
             "cudaVersion": "12.4", "fabricClique": "4f6c2e1a-8d3b-4c2a-9e7f-1b2c3d4e5f60.%d" % 1}]


def entry(i, j, kind):
    """The entry gkm agent writes for cache j on node i (lua/gkm/agent.lua)."""
    d = digest(j)
    sm90_only = j % 4 != 0   # three caches in four were built for sm_90 only
    e = {"digest": d, "pods": [], "compatibleGPUs": [], "incompatibleGPUs": [],
         "lastUpdated": ts(i % 600 + j % 7)}
    if kind == "a100" and sm90_only:
        e.update(state="Incompatible", reason="ArchMismatch",
                 message="the cache was built for sm_90; this GPU is sm_80",
                 incompatibleGPUs=[{"ids": [0, 1, 2, 3], "gpuType": A100, "reason": "ArchMismatch",
                                    "message": "the cache was built for sm_90; this GPU is sm_80"}])
    elif kind == "failed" and j % 3 == 0:
        e.update(state="Failed", reason="PullFailed",
                 message="GET https://registry.example.com/v2/ml/kernels/blobs/%s: 503 Service Unavailable"
                 % d, compatibleGPUs=[{"ids": list(range(8)), "gpuType": H100}])
    elif kind == "pulling" and j % 2 == 0:
        e.update(state="Pulling", reason="Pulling", message="pulling and extracting the image",
                 compatibleGPUs=[{"ids": list(range(8)), "gpuType": H100}])
    else:
        ids = [0, 1, 2, 3] if kind == "a100" else list(range(8))
        e.update(state="Ready", reason="Ready", message="extracted and ready for 1 GPU group(s)",
                 compatibleGPUs=[{"ids": ids, "gpuType": A100 if kind == "a100" else H100}])
        if (i + j) % 50 == 0:
            e["pods"] = [{"podName": "vllm-%d-%d-7f9c" % (j, i), "podNamespace": NS,
                          "podUID": str(uuid.UUID(int=(i << 32) | j)),
                          "volumeId": "csi-%032x" % ((i << 40) | (j << 8) | 1)}]
    return e


def expected(n, caches):
    """readyNodes per cache as the default aggregate policy counts them."""
    return [sum(1 for i in range(n) if entry(i, j, node_kind(i))["state"] == "Ready") for j in range(caches)]


def node_objects(i, caches):
    """Node i as its kubelet reports it, then its two node objects as its
    agent applies them: [(path of the object, the object, its status)]."""
    name = "gpu-node-%04d" % i
    kind = node_kind(i)
    g = gpus(kind)
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64",
                                    "nvidia.com/gpu.product": g[0]["gpuType"].replace(" ", "-"),
                                    "topology.kubernetes.io/zone": "zone-%d" % (i % 3)}},
            "spec": {"podCIDR": "10.%d.%d.0/24" % (i // 256, i % 256), "providerID": "gce://proj/zone/" + name}}
    node_status = {
        "capacity": {"cpu": "192", "memory": "2113445Mi", "nvidia.com/gpu": str(len(g[0]["ids"])), "pods": "110"},
        "allocatable": {"cpu": "191", "memory": "2100000Mi", "nvidia.com/gpu": str(len(g[0]["ids"])),
                        "pods": "110"},
        "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                        "lastHeartbeatTime": ts(i), "lastTransitionTime": ts(0),
                        "reason": "Kubelet" + t, "message": "kubelet reports " + t}
                       for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
        "addresses": [{"type": "InternalIP", "address": "10.1.%d.%d" % (i // 256, i % 256)},
                      {"type": "Hostname", "address": name}],
        "nodeInfo": {"kernelVersion": "6.1.0-18-amd64", "osImage": "Debian GNU/Linux 12",
                     "containerRuntimeVersion": "containerd://1.7.13", "kubeletVersion": "v1.29.4",
                     "architecture": "amd64", "operatingSystem": "linux", "machineID": "%032x" % i,
                     "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), "bootID": "%032x" % i}}
    out = [("/api/v1/nodes/" + name, node, node_status)]
    for kname, ns, names in (("ClusterGKMCacheNode", None, []), ("GKMCacheNode", NS, range(caches))):
        cs = {"c-%03d" % j: entry(i, j, kind) for j in names}
        st = {"gpus": g, "caches": cs, "totalCaches": len(cs),
              "readyCaches": sum(1 for e in cs.values() if e["state"] == "Ready"),
              "failedCaches": sum(1 for e in cs.values() if e["state"] in ("Failed", "Incompatible")),
              "lastUpdated": ts(i % 600 + 7)}
        meta = {"name": name, "labels": {"gkm.io/node": name}}
        path = GROUP + "/%s/%s" % (kname.lower() + "s", name)
        if ns:
            meta["namespace"] = ns
            path = GROUP + "/namespaces/%s/%s/%s" % (ns, kname.lower() + "s", name)
        out.append((path, {"apiVersion": AV, "kind": kname, "metadata": meta, "spec": {"nodeName": name}}, st))
    return out


def cache_object(j):
    return {"apiVersion": AV, "kind": "GKMCache",
            "metadata": {"name": "c-%03d" % j, "namespace": NS,
                         "annotations": {"gkm.io/resolvedDigest": digest(j)}},
            "spec": {"image": "registry.example.com/ml/kernels/model-%d:v1" % j}}


def populate(kube, n, caches, threads=16):
    """Every object through the API server, NODES at a time; returns the
    bytes of JSON written."""
    def must(st_body, want=(200, 201)):
        if st_body[0] not in want:
            raise RuntimeError("%s %s" % st_body)
        return st_body[1]

    def one_node(i):
        size = 0
        (npath, node, nstatus), *reports = node_objects(i, caches)
        created = must(kube.request("POST", "/api/v1/nodes", node))
        must(kube.request("PATCH", npath + "/status", {"status": nstatus}, "application/merge-patch+json"))
        owner = [{"apiVersion": "v1", "kind": "Node", "name": node["metadata"]["name"],
                  "uid": created["metadata"]["uid"]}]
        for path, obj, status in reports:
            obj["metadata"]["ownerReferences"] = owner
            q = "?fieldManager=gkm-agent%2F" + node["metadata"]["name"] + "&force=true"
            must(kube.request("PATCH", path + q, json.dumps(obj), APPLY))
            st = dict(obj, status=status)
            must(kube.request("PATCH", path + "/status" + q, json.dumps(st), APPLY))
            size += len(json.dumps(st))
        return size + len(json.dumps(node)) + len(json.dumps(nstatus))

    kube.make_namespace(NS)
    kube.make_namespace("gkm-system")
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        size = sum(pool.map(one_node, range(n)))
        for j in range(caches):
            must(kube.request("POST", GROUP + "/namespaces/%s/gkmcaches" % NS, cache_object(j)))
            size += len(json.dumps(cache_object(j)))
    return size


def wait_caches(ks, want, check, timeout):
    """Poll the GKMCaches until check(status, want_ready) holds for all."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, lst = ks.request("GET", GROUP + "/namespaces/%s/gkmcaches" % NS)
        done = 0
        for o in (lst or {}).get("items", []):
            j = int(o["metadata"]["name"][2:])
            if check(o.get("status") or {}, want[j]):
                done += 1
        if done == len(want):
            return time.monotonic(), done
        time.sleep(0.1)
    return None, done


def converged(st, ready):
    return st.get("readyNodes") == ready and st.get("totalNodes") == NODES


def reworded(st, ready):
    return converged(st, ready) and any(
        c.get("type") == "Ready" and "[reworded]" in c.get("message", "") for c in st.get("conditions") or [])


def main():
    global NODES
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--caches", type=int, default=100)
    ap.add_argument("--rest", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    NODES = a.nodes
    why = unavailable()
    if why:
        print("operator: skipped: %s" % why, file=sys.stderr)
        return 2
    ks = KubeEnv().start()
    try:
        ks.apply_crds()
        t = time.monotonic()
        state_bytes = populate(ks, a.nodes, a.caches)
        populate_s = time.monotonic() - t
        want = expected(a.nodes, a.caches)
        hport = free_port()
        log = open(os.path.join(ks.dir, "operator.log"), "wb")
        t0 = time.monotonic()
        op = subprocess.Popen([GKM, "operator", "--kubeconfig", ks.kubeconfig, "--namespace", "gkm-system",
                               "--leader-elect", "false", "--health-listen", "127.0.0.1:%d" % hport,
                               "--log-level", os.environ.get("GKM_BENCH_LOG", "warn")], stdout=log, stderr=subprocess.STDOUT)
        r = {"nodes": a.nodes, "caches": a.caches, "state_mb": state_bytes / 1e6, "populate_s": populate_s}
        try:
            t1, done = wait_caches(ks, want, converged, a.timeout)
            r["converged"] = t1 is not None
            r["ready_s"] = (t1 or time.monotonic()) - t0
            r["ready_caches"] = done
            r["cpu_to_ready_s"] = cpu_s(op.pid)
            time.sleep(a.rest)
            r["rest"] = memory(op.pid)
            r["cpu_at_rest_s"] = cpu_s(op.pid)
            time.sleep(2)
            r["idle_cpu_2s"] = cpu_s(op.pid) - r["cpu_at_rest_s"]
            # full re-aggregation: a policy change that rewords every Ready message
            with open(os.path.join(ROOT, "policies", "aggregate.lua")) as fh:
                src = fh.read()
            src2 = src.replace('ready_msg = string.format("ready on %d of %d nodes", ready, total)',
                               'ready_msg = string.format("ready on %d of %d nodes [reworded]", ready, total)')
            src2 = src2.replace('ready_msg = string.format("ready on %d of %d nodes", ready, usable)',
                                'ready_msg = string.format("ready on %d of %d nodes [reworded]", ready, usable)')
            src2 = src2.replace('string.format("ready on %d of %d nodes; failed on %d", ready, usable, failed)',
                                'string.format("ready on %d of %d nodes; failed on %d [reworded]", ready, usable, failed)')
            assert src2 != src
            c0 = cpu_s(op.pid)
            t2 = time.monotonic()
            st, body = ks.request("POST", "/api/v1/namespaces/gkm-system/configmaps", {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "gkm-policies", "namespace": "gkm-system"},
                "data": {"aggregate.lua": src2}})
            assert st == 201, (st, body)
            t3, done = wait_caches(ks, want, reworded, a.timeout)
            r["reaggregate_s"] = (t3 or time.monotonic()) - t2
            r["reaggregated_caches"] = done
            r["reaggregate_cpu_s"] = cpu_s(op.pid) - c0
            time.sleep(1)
            r["after"] = memory(op.pid)
            r["cpu_total_s"] = cpu_s(op.pid)
            r["server_cpu_s"] = cpu_s(ks.procs["kube-apiserver"].pid) + cpu_s(ks.procs["etcd"].pid)
        finally:
            op.terminate()
            op.wait(20)
            log.close()
            if not r.get("converged") or os.environ.get("GKM_BENCH_LOG"):
                with open(os.path.join(ks.dir, "operator.log"), "rb") as fh:
                    sys.stderr.write(fh.read()[-3000:].decode("utf-8", "replace"))
        print(json.dumps(r))
    finally:
        ks.stop()
    return 0


NODES = 0
if __name__ == "__main__":
    sys.exit(main())
