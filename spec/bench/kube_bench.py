#!/usr/bin/python3
"""Benchmark of the Kubernetes client's informer (driven by build/spec/kubetool-opt):

1. list: 10,000 GKMCacheNode-sized objects (8 GPUs, 3 caches with pods) in
   a real kube-apiserver with etcd (TLS, token; GKM_KUBE_ASSETS, see
   spec/lib/kubeenv.py: 1 and 2 are skipped with the reason where it is not
   set); an informer lists them into its cache. Reports seconds, objects/s
   and heap bytes per cached object (mallinfo2 before/after, managedFields
   dropped as the informer does).
2. watch via kube-apiserver: N status updates of those objects while the
   informer watches; events/s decoded into the cache end to end (bounded by
   the server, not by the client).
3. firehose: the client's own ceiling. A loopback HTTP server answers the
   list in one page and then streams pre-encoded watch events of the same
   objects as fast as the socket takes them; objects/s and events/s decoded
   into the cache.

Medians of RUNS runs with min and max (BENCHMARKING.md). Prints a table."""
import copy
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeenv import KubeEnv, unavailable  # noqa: E402

KT = os.path.join(BUILD, "spec", "kubetool-opt")
N = int(os.environ.get("KUBE_BENCH_OBJECTS", "10000"))
RUNS = int(os.environ.get("KUBE_BENCH_RUNS", "5"))
WATCH_UPDATES = int(os.environ.get("KUBE_BENCH_UPDATES", "2000"))
FIREHOSE = int(os.environ.get("KUBE_BENCH_FIREHOSE", "100000"))
GV = "gkm.io/v1alpha1"
DIGEST = "sha256:" + "ab" * 32


def node_obj(i):
    name = "node-%05d" % i
    return {
        "apiVersion": GV, "kind": "GKMCacheNode",
        "metadata": {"name": name, "namespace": "default", "labels": {"gkm.io/node": name}},
        "spec": {"nodeName": name},
    }


def node_status(i, gen=0):
    name = "node-%05d" % i
    pods = [{"podName": "vllm-%d-%d" % (i, k), "podNamespace": "default",
             "podUID": "00000000-0000-0000-0000-%012d" % (i * 10 + k), "volumeId": "csi-%d-%d" % (i, k)}
            for k in range(2)]
    caches = {}
    for c in range(3):
        caches["llama-cache-%d" % c] = {
            "digest": DIGEST, "state": "Ready", "compatibleGPUs": [{"ids": list(range(8))}],
            "incompatibleGPUs": [], "pods": pods if c == 0 else [],
            # distinct for every gen: each update is a real change (an apply
            # that changes nothing sends no watch event)
            "lastUpdated": "2026-11-21T%02d:%02d:%02dZ" % (gen // 3600 % 24, gen // 60 % 60, gen % 60),
        }
    return {
        "apiVersion": GV, "kind": "GKMCacheNode",
        "metadata": {"name": name, "namespace": "default"},
        "status": {
            "gpus": [{"ids": list(range(8)), "gpuType": "NVIDIA H100 80GB HBM3", "backend": "cuda",
                      "arch": "90", "warpSize": 32, "driverVersion": "550.54.15", "cudaVersion": "12.4",
                      "memoryBytes": 85899345920, "fabricClique": "4f0e1c2a-0000-4000-8000-00000000beef.%d" % (i % 4)}],
            "caches": caches,
        },
    }


class Client:
    """Requests to kube-apiserver over one keep-alive connection."""

    def __init__(self, ks):
        self.token = ks.token
        self.conn = http.client.HTTPSConnection("127.0.0.1", ks.port, timeout=60,
                                                context=ssl.create_default_context(cafile=ks.ca))

    def req(self, method, path, body, ctype="application/json"):
        self.conn.request(method, path, json.dumps(body), {
            "Authorization": "Bearer " + self.token, "Content-Type": ctype, "Accept": "application/json"})
        r = self.conn.getresponse()
        out = r.read()
        if r.status >= 300:
            raise RuntimeError("%s %s: %s %s" % (method, path, r.status, out[:500]))
        return json.loads(out)


def load(ks, n):
    base = "/apis/gkm.io/v1alpha1/namespaces/default/gkmcachenodes"

    def worker(lo, hi):
        c = Client(ks)
        for i in range(lo, hi):
            c.req("POST", base, node_obj(i))
            c.req("PATCH", "%s/node-%05d/status?fieldManager=gkm-agent%%2Fnode-%05d&force=true" % (base, i, i),
                  node_status(i), "application/apply-patch+yaml")

    threads = [threading.Thread(target=worker, args=(k * n // 2, (k + 1) * n // 2)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def run_kt(env, *args, feeder=None, one_arena=False):
    if one_arena:
        # one malloc arena, so that mallinfo2() sees what every thread
        # allocated (memory runs only: it slows threads down)
        env = dict(env, MALLOC_ARENA_MAX="1")
    errf = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen([KT] + list(args), env=env, stdout=subprocess.PIPE, stderr=errf, text=True)
    results = {}
    for line in p.stdout:
        j = json.loads(line)
        results.update(j)
        if j.get("ready") and feeder:
            threading.Thread(target=feeder, daemon=True).start()
    p.wait(600)
    errf.seek(0)
    err = errf.read()
    if p.returncode != 0:
        raise RuntimeError("kubetool failed: " + err[-2000:])
    if err.strip():
        sys.stderr.write("# kubetool said:\n" + "".join("#   " + ln + "\n" for ln in err.splitlines()[-10:]))
    return results


def summary(vals):
    return statistics.median(vals), min(vals), max(vals)


def fmt(name, vals, unit, digits=0):
    med, lo, hi = summary(vals)
    f = "%%.%df" % digits
    return "| %-44s | %12s | %12s | %12s | %s |" % (name, f % med, f % lo, f % hi, unit)


# ---- firehose: a loopback server streaming pre-encoded events ----

class Firehose:
    def __init__(self, n_objects, n_events):
        items = []
        for i in range(n_objects):
            o = node_obj(i)
            o["status"] = node_status(i)["status"]
            o["metadata"].update({"resourceVersion": str(1000 + i), "uid": "uid-%d" % i,
                                  "creationTimestamp": "2026-11-21T10:00:00Z", "generation": 1})
            items.append(o)
        self.list_body = json.dumps({"apiVersion": GV, "kind": "GKMCacheNodeList",
                                     "metadata": {"resourceVersion": str(1000 + n_objects)},
                                     "items": items}, separators=(",", ":")).encode()
        lines = []
        rv = 1000 + n_objects
        for e in range(n_events):
            i = e % n_objects
            rv += 1
            o = copy.deepcopy(items[i])
            o["metadata"]["resourceVersion"] = str(rv)
            o["status"]["caches"]["llama-cache-0"]["lastUpdated"] = "2026-11-21T11:%02d:%02dZ" % ((e // 60) % 60, e % 60)
            lines.append(json.dumps({"type": "MODIFIED", "object": o}, separators=(",", ":")))
        self.stream = ("\n".join(lines) + "\n").encode()
        self.event_bytes = len(self.stream) / max(1, n_events)
        self.go = threading.Event()  # set when the client has listed: then stream
        fh = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                if "watch=1" not in self.path:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(fh.list_body)))
                    self.end_headers()
                    self.wfile.write(fh.list_body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    fh.go.wait(120)
                    self.wfile.write(fh.stream)
                    self.wfile.flush()
                    time.sleep(30)  # keep the stream open; the client stops first
                except OSError:
                    pass
                self.close_connection = True

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def kubeconfig(self, path):
        with open(path, "w") as fh:
            fh.write("current-context: f\nclusters: [{name: f, cluster: {server: 'http://127.0.0.1:%d'}}]\n"
                     "contexts: [{name: f, context: {cluster: f, user: u}}]\nusers: [{name: u, user: {}}]\n"
                     % self.port)


def server_runs(rows):
    """List and watch runs through a real kube-apiserver: (bytes of one object
    as served, without managedFields); rows appended."""
    with KubeEnv() as ks:
        ks.apply_crds()
        t0 = time.monotonic()
        load(ks, N)
        print("# loaded %d GKMCacheNode objects (create + status apply) in %.1f s" % (N, time.monotonic() - t0),
              flush=True)
        env = dict(os.environ, KUBECONFIG=ks.kubeconfig)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        st, one = ks.request("GET", "/apis/gkm.io/v1alpha1/namespaces/default/gkmcachenodes/node-00001")
        full = len(json.dumps(one, separators=(",", ":")))
        one["metadata"].pop("managedFields", None)
        stripped = len(json.dumps(one, separators=(",", ":")))
        list_s, per_obj, rate = [], [], []
        for _ in range(RUNS):
            r = run_kt(env, "bench", GV, "GKMCacheNode", "default", "--expect", str(N))
            list_s.append(r["list_seconds"])
            rate.append(r["objects"] / r["list_seconds"])
            r = run_kt(env, "bench", GV, "GKMCacheNode", "default", "--expect", str(N), one_arena=True)
            per_obj.append(r["bytes_per_object"])
        rows.append(fmt("list %d objects into the cache (s)" % N, list_s, "s", 3))
        rows.append(fmt("list decode rate", rate, "objects/s"))
        rows.append(fmt("heap per cached object", per_obj, "bytes"))

        wrates = []
        for run in range(RUNS):
            def feeder(run=run):
                c = Client(ks)
                base = "/apis/gkm.io/v1alpha1/namespaces/default/gkmcachenodes"
                for k in range(WATCH_UPDATES):
                    i = k % N
                    c.req("PATCH", "%s/node-%05d/status?fieldManager=gkm-agent%%2Fnode-%05d&force=true"
                          % (base, i, i), node_status(i, gen=run * WATCH_UPDATES + k + 1),
                          "application/apply-patch+yaml")
            r = run_kt(env, "bench", GV, "GKMCacheNode", "default", "--expect", str(N),
                       "--then-events", str(WATCH_UPDATES), feeder=feeder)
            wrates.append(r["watch_events"] / r["watch_seconds"])
        rows.append(fmt("watch via kube-apiserver (%d updates)" % WATCH_UPDATES, wrates,
                        "events/s (server-bound)"))
    return full, stripped


def main():
    if not os.access(KT, os.X_OK):
        print("kube bench: %s not built (make spec-extra)" % KT)
        return 1
    rows = []
    full = stripped = None
    why = unavailable()
    if why:
        print("# list and watch through kube-apiserver: skipped: %s" % why, flush=True)
    else:
        full, stripped = server_runs(rows)

    fh = Firehose(N, FIREHOSE)
    kc = os.path.join(os.environ.get("TMPDIR", "/tmp"), "gkm-kube-bench-%d.kubeconfig" % os.getpid())
    fh.kubeconfig(kc)
    env = dict(os.environ, KUBECONFIG=kc)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    frates, flist = [], []
    for _ in range(RUNS):
        fh.go.clear()
        r = run_kt(env, "bench", GV, "GKMCacheNode", "default", "--expect", str(N),
                   "--then-events", str(FIREHOSE), feeder=fh.go.set)
        frates.append(r["watch_events"] / r["watch_seconds"])
        flist.append(r["objects"] / r["list_seconds"])
    os.unlink(kc)
    rows.append(fmt("list from the loopback server (one page)", flist, "objects/s (client-bound)"))
    rows.append(fmt("watch firehose (%d events, loopback)" % FIREHOSE, frates, "events/s (client-bound)"))

    print("\nkube client benchmark: %d GKMCacheNode objects, %d runs each (median, min, max)" % (N, RUNS))
    if full:
        print("object JSON: %d bytes as served, %d bytes without managedFields" % (full, stripped))
    print("firehose event: %.0f bytes" % fh.event_bytes)
    print("| %-44s | %12s | %12s | %12s | unit |" % ("what", "median", "min", "max"))
    print("|%s|%s|%s|%s|------|" % ("-" * 46, "-" * 14, "-" * 14, "-" * 14))
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
