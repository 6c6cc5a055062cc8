#!/usr/bin/python3
"""Node labels: the time from a cache becoming Ready on a node to that node's
label being visible, on a real kube-apiserver with etcd (GKM_KUBE_ASSETS;
skipped with the reason where it is not given).

    node_labels.py [--nodes 24] [--caches 2] [--gap-ms 250]

The real `gkm operator` (default debounce) watches --nodes Nodes, each with
a ClusterGKMCacheNode written the way `gkm agent` writes it (server-side
apply under gkm-agent/<node>, the status subresource), and --caches
ClusterGKMCaches pinned to a digest, every entry Pending. Then:

  one by one  each (node, cache) entry turns Ready, --gap-ms apart;
  burst       one more cache turns Ready on every node in the same instant;
  deletion    that cache is deleted.

Two watches in this process, one on the node objects and one on the Nodes,
timestamp the first event in which the entry is Ready and the first in which
the Node carries the label (for the deletion: the delete event of the cache
and the first Node event without the label). Prints the median, p99 and max
of each phase and the operator's Node applies. Nothing is asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeenv import KubeEnv, unavailable  # noqa: E402
from proc import free_port, wait_for  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
GROUP = "/apis/gkm.io/v1alpha1"
DIGEST = "sha256:" + "c0" * 32


def key(cache):
    return "clustergkmcache.gkm.io/" + cache


class Watch(threading.Thread):
    """A watch stream; on_event(type, object, monotonic time) per event."""

    def __init__(self, kube, path, on_event):
        super().__init__(daemon=True)
        self.kube, self.path, self.on_event = kube, path, on_event
        self.started = threading.Event()

    def run(self):
        req = urllib.request.Request(self.kube.url + self.path + "?watch=1&allowWatchBookmarks=false")
        req.add_header("Authorization", "Bearer " + self.kube.token)
        with urllib.request.urlopen(req, context=self.kube._context(), timeout=600) as r:
            self.started.set()
            for line in r:
                ev = json.loads(line)
                self.on_event(ev["type"], ev["object"], time.monotonic())


def apply(kube, path, obj, manager, sub=""):
    st, body = kube.request("PATCH", "%s%s?fieldManager=%s&force=true" % (path, sub, manager), obj,
                            "application/apply-patch+yaml")
    if st not in (200, 201):
        raise RuntimeError("apply %s: %s %s" % (path, st, body))


def report(kube, node, states):
    """The node's ClusterGKMCacheNode status, as gkm agent applies it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    caches = {}
    for c, state in states.items():
        e = {"digest": DIGEST, "state": state, "pods": [], "incompatibleGPUs": [], "lastUpdated": now,
             "compatibleGPUs": [{"ids": [0], "gpuType": "Tesla T4"}]}
        if state == "Ready":
            e.update(reason="Ready", message="extracted and ready for 1 GPU group(s)")
        else:
            e.update(reason="Pulling", message="pulling and extracting the image")
        caches[c] = e
    apply(kube, "%s/clustergkmcachenodes/%s" % (GROUP, node),
          {"apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCacheNode", "metadata": {"name": node},
           "status": {"caches": caches}}, "gkm-agent/" + node, "/status")


def figures(name, samples):
    if not samples:
        print("  %-11s no samples" % name)
        return
    v = sorted(samples)
    p99 = v[min(len(v) - 1, int(round(0.99 * (len(v) - 1))))]
    print("  %-11s n=%-3d median %6.0f ms   p99 %6.0f ms   max %6.0f ms"
          % (name, len(v), statistics.median(v) * 1000, p99 * 1000, v[-1] * 1000))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--caches", type=int, default=2)
    ap.add_argument("--gap-ms", type=int, default=250)
    a = ap.parse_args()
    why = unavailable()
    if why:
        print("node_labels: skipped: " + why)
        return 0
    nodes = ["node-%02d" % i for i in range(a.nodes)]
    caches = ["cache-%02d" % j for j in range(a.caches)]
    burst = "burst"
    ready_at, label_at, unlabel_at, deleted_at = {}, {}, {}, {}
    lock = threading.Lock()

    def on_report(t, o, at):
        node = o["metadata"]["name"]
        for c, e in (o.get("status") or {}).get("caches", {}).items():
            if e.get("state") == "Ready":
                with lock:
                    ready_at.setdefault((node, c), at)

    def on_node(t, o, at):
        node, labels = o["metadata"]["name"], o["metadata"].get("labels") or {}
        with lock:
            for c in caches + [burst]:
                if labels.get(key(c)) == "ready":
                    label_at.setdefault((node, c), at)
                elif (node, c) in label_at:
                    unlabel_at.setdefault((node, c), at)

    def on_cache(t, o, at):
        if t == "DELETED":
            with lock:
                deleted_at.setdefault(o["metadata"]["name"], at)

    with KubeEnv() as kube:
        kube.apply_crds()
        kube.make_namespace("gkm")
        for n in nodes:
            kube.make_node(n)
        for c in caches + [burst]:
            st, body = kube.request("POST", GROUP + "/clustergkmcaches", {
                "apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache", "metadata": {"name": c},
                "spec": {"image": "registry.invalid/kernels/%s@%s" % (c, DIGEST)}})
            if st != 201:
                raise RuntimeError("create cache %s: %s %s" % (c, st, body))
        pending = {c: "Pending" for c in caches + [burst]}
        for n in nodes:
            apply(kube, "%s/clustergkmcachenodes/%s" % (GROUP, n),
                  {"apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCacheNode",
                   "metadata": {"name": n, "labels": {"gkm.io/node": n}}, "spec": {"nodeName": n}},
                  "gkm-agent/" + n)
            report(kube, n, pending)
        port = free_port()
        log = open(os.path.join(kube.dir, "operator.log"), "w")
        op = subprocess.Popen([GKM, "operator", "--kubeconfig", kube.kubeconfig, "--leader-elect", "false",
                               "--verify-enabled", "false", "--health-listen", "127.0.0.1:%d" % port],
                              stdout=log, stderr=subprocess.STDOUT)
        try:
            def ready():
                try:
                    return urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port, timeout=2).status == 200
                except OSError:
                    return False
            if not wait_for(ready, 30):
                raise RuntimeError("the operator did not become ready")
            watches = [Watch(kube, GROUP + "/clustergkmcachenodes", on_report),
                       Watch(kube, "/api/v1/nodes", on_node),
                       Watch(kube, GROUP + "/clustergkmcaches", on_cache)]
            for w in watches:
                w.start()
                w.started.wait(10)
            time.sleep(2)  # the operator settles on the Pending picture

            states = {n: dict(pending) for n in nodes}
            pairs = [(n, c) for c in caches for n in nodes]
            for n, c in pairs:
                states[n][c] = "Ready"
                report(kube, n, states[n])
                time.sleep(a.gap_ms / 1000.0)
            wait_for(lambda: all(p in label_at for p in pairs), 30)

            for n in nodes:  # as close to one instant as one client gets
                states[n][burst] = "Ready"
            threads = [threading.Thread(target=report, args=(kube, n, states[n])) for n in nodes]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wait_for(lambda: all((n, burst) in label_at for n in nodes), 30)

            kube.request("DELETE", GROUP + "/clustergkmcaches/" + burst)
            wait_for(lambda: all((n, burst) in unlabel_at for n in nodes), 30)

            metrics = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
            applies = [line.split()[-1] for line in metrics.splitlines()
                       if line.startswith('gkm_operator_node_label_applies_total{result="applied"}')]
        finally:
            op.terminate()
            op.wait(10)
            log.close()

    with lock:
        one = [label_at[p] - ready_at[p] for p in pairs if p in label_at and p in ready_at]
        lost = [p for p in pairs if p not in label_at]
        many = [label_at[(n, burst)] - ready_at[(n, burst)] for n in nodes
                if (n, burst) in label_at and (n, burst) in ready_at]
        gone = [unlabel_at[(n, burst)] - deleted_at[burst] for n in nodes
                if (n, burst) in unlabel_at and burst in deleted_at]
    print("Node labels on kube-apiserver + etcd: %d Nodes, %d caches, the operator's default debounce (250 ms); "
          "%d CPUs, load %s" % (a.nodes, a.caches + 1, os.cpu_count(), open("/proc/loadavg").read().split()[0]))
    print("time from the node report showing Ready (watch) to the Node's label (watch):")
    figures("one by one", one)
    figures("burst", many)
    print("time from the cache's deletion (watch) to the label gone from each Node (watch):")
    figures("deletion", gone)
    print("  Node applies by the operator: %s; labels never seen: %d"
          % (applies[0] if applies else "0", len(lost)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
