"""Convergence at scale: N simulated agents and the real `gkm operator`
against the test API server (run by spec/bench/convergence.sh).

    convergence_sim.py --nodes N [--threads 32] [--contrast-limit 60]

Three designs, each on a fresh server:

  sharded   what gkm does: every agent server-side applies the status of its
            own GKMCacheNode (field manager gkm-agent/<node>, the body the
            agent writes); the real gkm operator watches them and aggregates
            into the GKMCache status (debounced). Measured: from creating the
            GKMCache to the watch showing readyNodes == N.
  rmw       the contrast: every agent read-modify-writes ONE shared object
            (a ConfigMap, one key per node) with PUT + resourceVersion and
            retries on 409, from --threads writers.
  ssa-shared  every agent server-side applies its key of ONE shared object
            (its own field manager, no conflicts; the managedFields list grows
            with every writer).

The agents are simulated (threads over keep-alive connections reacting to one
watch on GKMCaches), the operator is the real one. The server's own cost is
measured too (CPU seconds per request), to tell its share from the
controller's. Figures only, nothing asserted.
"""
import argparse
import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeserver import KubeServer  # noqa: E402
from proc import cpu_s, free_port  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
GROUP = "/apis/gkm.io/v1alpha1"
NS = "default"
DIGEST = "sha256:" + "7c" * 32
APPLY = "application/apply-patch+yaml"


class Conn:
    """One keep-alive connection (one per thread)."""

    def __init__(self, port):
        self.port = port
        self.c = None

    def req(self, method, path, body=None, ctype="application/json"):
        for attempt in (0, 1):
            try:
                if self.c is None:
                    self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                h = {"Accept": "application/json"}
                if body is not None:
                    h["Content-Type"] = ctype
                    if not isinstance(body, bytes):
                        body = json.dumps(body).encode()
                self.c.request(method, path, body, h)
                r = self.c.getresponse()
                return r.status, r.read()
            except (OSError, http.client.HTTPException):
                self.c = None
                if attempt:
                    raise
        return 0, b""


def parallel(n_threads, items, fn):
    """Run fn(conn, item) for every item on n_threads threads; returns results."""
    q = queue.Queue()
    for it in items:
        q.put(it)
    out, lock = [], threading.Lock()

    def run():
        c = Conn(PORT)
        while True:
            try:
                it = q.get_nowait()
            except queue.Empty:
                return
            r = fn(c, it)
            with lock:
                out.append(r)

    ths = [threading.Thread(target=run) for _ in range(n_threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def node_entry(ts):
    return {"digest": DIGEST, "state": "Ready", "reason": "Ready",
            "message": "extracted and ready for 1 GPU group(s)", "compatibleGPUs": [{"ids": [0]}],
            "incompatibleGPUs": [], "pods": [], "lastUpdated": ts}


def agent_status(i, ts):
    """The status apply body of `gkm agent` for a node with one ready cache."""
    name = "node-%d" % i
    return {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
            "metadata": {"name": name, "namespace": NS, "labels": {"gkm.io/node": name}},
            "status": {"gpus": [{"ids": [0], "gpuType": "Tesla T4", "arch": "sm_75",
                                 "driverVersion": "470.82.01"}],
                       "caches": {"bench": node_entry(ts)},
                       "totalCaches": 1, "readyCaches": 1, "failedCaches": 0, "lastUpdated": ts}}


def requests_since(c, seq):
    st, body = c.req("POST", "/_test/requests", {"since": seq})
    return json.loads(body)


def request_seq(c):
    return requests_since(c, 1 << 62)["next"]


# ------------------------------------------------------------------ sharded

def setup_nodes(n, threads):
    """Nodes and the node objects the agents keep (as in a running cluster)."""
    def one(c, i):
        name = "node-%d" % i
        owner = {"gkm.io/node": name}
        c.req("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        for path, kind, ns in ((GROUP + "/clustergkmcachenodes/", "ClusterGKMCacheNode", None),
                               (GROUP + "/namespaces/%s/gkmcachenodes/" % NS, "GKMCacheNode", NS)):
            meta = {"name": name, "labels": owner}
            if ns:
                meta["namespace"] = ns
            st, _ = c.req("PATCH", path + name + "?fieldManager=gkm-agent%%2F%s&force=true" % name,
                          {"apiVersion": "gkm.io/v1alpha1", "kind": kind, "metadata": meta,
                           "spec": {"nodeName": name}}, APPLY)
            assert st in (200, 201), st
        return 0
    parallel(threads, range(n), one)


class CacheWatch(threading.Thread):
    """A watch on GKMCaches: when the cache appears (trigger) and when its
    status first says readyNodes == want (done); every status change kept."""

    def __init__(self, rv, want):
        super().__init__(daemon=True)
        self.rv, self.want = rv, want
        self.added = threading.Event()
        self.done = threading.Event()
        self.t_added = self.t_done = None
        self.curve = []

    def run(self):
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
        c.request("GET", GROUP + "/gkmcaches?watch=1&resourceVersion=%s" % self.rv,
                  headers={"Accept": "application/json"})
        r = c.getresponse()
        while not self.done.is_set():
            line = r.readline()
            if not line:
                return
            ev = json.loads(line)
            o = ev.get("object", {})
            if o.get("metadata", {}).get("name") != "bench":
                continue
            now = time.monotonic()
            if not self.added.is_set():
                self.t_added = now
                self.added.set()
            ready = (o.get("status") or {}).get("readyNodes")
            if ready is not None and (not self.curve or self.curve[-1][1] != ready):
                self.curve.append((now, ready))
            if ready == self.want:
                self.t_done = now
                self.done.set()


def run_sharded(ks, n, threads, timeout):
    c = Conn(PORT)
    c.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": "gkm-system"}})
    t = time.monotonic()
    setup_nodes(n, threads)
    t_setup = time.monotonic() - t
    hport = free_port()
    log = open(os.path.join(ks.dir, "operator.log"), "wb")
    op = subprocess.Popen([GKM, "operator", "--kubeconfig", ks.kubeconfig, "--namespace", "gkm-system",
                           "--leader-elect", "false", "--health-listen", "127.0.0.1:%d" % hport,
                           "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                h = http.client.HTTPConnection("127.0.0.1", hport, timeout=2)
                h.request("GET", "/readyz")
                if h.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("the operator did not become ready")
        st, body = c.req("GET", GROUP + "/gkmcaches?limit=1")
        w = CacheWatch(json.loads(body)["metadata"]["resourceVersion"], n)
        w.start()
        time.sleep(0.3)
        seq0 = request_seq(c)
        srv0, op0, me0 = cpu_s(ks.proc.pid), cpu_s(op.pid), time.process_time()
        writes = {}

        def agent(conn, i):
            ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            st, _ = conn.req("PATCH", GROUP + "/namespaces/%s/gkmcachenodes/node-%d/status"
                             "?fieldManager=gkm-agent%%2Fnode-%d&force=true" % (NS, i, i),
                             agent_status(i, ts), APPLY)
            return st, time.monotonic()

        t0 = time.monotonic()
        st, _ = c.req("POST", GROUP + "/namespaces/%s/gkmcaches" % NS, {
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
            "metadata": {"name": "bench", "namespace": NS,
                         "annotations": {"gkm.io/resolvedDigest": DIGEST}},
            "spec": {"image": "registry.example/caches/bench:v1"}})
        assert st == 201, st
        w.added.wait(timeout)
        res = parallel(threads, range(n), agent)
        t_agents = max(t for _, t in res)
        w.done.wait(max(1.0, timeout - (time.monotonic() - t0)))
        t_end = time.monotonic()
        srv1, op1, me1 = cpu_s(ks.proc.pid), cpu_s(op.pid), time.process_time()
        time.sleep(0.5)  # a late write after done would still be counted
        reqs = requests_since(c, seq0)["requests"]
        op_writes = [r for r in reqs if r["method"] == "PATCH" and r["path"].endswith("/gkmcaches/bench/status")]
        for code, _ in res:
            writes[code] = writes.get(code, 0) + 1
        return {
            "design": "sharded SSA + gkm operator", "n": n, "setup_s": t_setup,
            "seconds": (w.t_done or t_end) - t0, "converged": w.t_done is not None,
            "agent_writes": len(res), "agent_codes": writes,
            "agents_done_s": t_agents - t0,
            "operator_writes": len(op_writes),
            "conflicts": sum(1 for r in reqs if r["status"] == 409),
            "requests": len(reqs),
            "server_cpu_s": srv1 - srv0, "operator_cpu_s": op1 - op0, "client_cpu_s": me1 - me0,
            "curve": [(round(t - t0, 3), r) for t, r in w.curve],
        }
    finally:
        op.terminate()
        op.wait(20)
        log.close()


# ----------------------------------------------------------------- contrast

def run_shared(ks, n, threads, limit, ssa):
    c = Conn(PORT)
    cm = "shared-status"
    base = "/api/v1/namespaces/%s/configmaps" % NS
    st, _ = c.req("POST", base, {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": cm, "namespace": NS}, "data": {}})
    assert st == 201, st
    seq0 = request_seq(c)
    srv0 = cpu_s(ks.proc.pid)
    t0 = time.monotonic()
    stop = t0 + limit

    def rmw(conn, i):
        name = "node-%d" % i
        entry = json.dumps(node_entry("2026-01-01T00:00:00Z"))
        tries = 0
        while time.monotonic() < stop:
            tries += 1
            st, body = conn.req("GET", "%s/%s" % (base, cm))
            o = json.loads(body)
            o.setdefault("data", {})[name] = entry
            st, _ = conn.req("PUT", "%s/%s" % (base, cm), o)
            if st == 200:
                return tries, True
            assert st == 409, st
        return tries, False

    def apply(conn, i):
        name = "node-%d" % i
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm, "namespace": NS},
                "data": {name: json.dumps(node_entry("2026-01-01T00:00:00Z"))}}
        if time.monotonic() >= stop:
            return 0, False
        st, _ = conn.req("PATCH", "%s/%s?fieldManager=gkm-agent%%2F%s" % (base, cm, name), body, APPLY)
        return 1, st == 200

    res = parallel(threads, range(n), apply if ssa else rmw)
    t1 = time.monotonic()
    srv1 = cpu_s(ks.proc.pid)
    reqs = requests_since(c, seq0)["requests"]
    done = sum(1 for _, ok in res if ok)
    return {"design": "shared object, " + ("SSA per writer" if ssa else "read-modify-write"),
            "n": n, "seconds": t1 - t0, "converged": done == n, "done": done,
            "agent_writes": sum(1 for r in reqs if r["method"] in ("PUT", "PATCH") and r["status"] == 200),
            "conflicts": sum(1 for r in reqs if r["status"] == 409),
            "requests": len(reqs), "server_cpu_s": srv1 - srv0}


def main():
    global PORT
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--design", choices=("sharded", "rmw", "ssa-shared"), default="sharded")
    ap.add_argument("--contrast-limit", type=float, default=60.0,
                    help="stop a shared-object run after this many seconds")
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    ks = KubeServer(tls=False, token=None).start()
    PORT = ks.port
    try:
        if a.design == "sharded":
            r = run_sharded(ks, a.nodes, a.threads, a.timeout)
        else:
            r = run_shared(ks, a.nodes, a.threads, a.contrast_limit, a.design == "ssa-shared")
        print(json.dumps(r))
    finally:
        ks.cleanup()


PORT = 0
if __name__ == "__main__":
    main()
