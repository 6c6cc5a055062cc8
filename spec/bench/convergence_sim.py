"""Convergence at scale: N simulated agents and the real `gkm operator`
against a real kube-apiserver with etcd (run by spec/bench/convergence.sh).

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
measured too (CPU seconds per write), to tell its share from the
controller's. Writes are counted by verb, resource and writer (field manager,
else user agent) with their status codes from the server's JSON audit log
(responseStatus.code). The server (found through GKM_KUBE_ASSETS, see
spec/lib/kubeenv.py) serves HTTPS with a token; its CPU is kube-apiserver's
plus etcd's. Figures only, nothing asserted.
"""
import argparse
import calendar
import ctypes
import http.client
import json
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeenv import KubeEnv, unavailable  # noqa: E402
from proc import cpu_s, free_port, memory  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
GROUP = "/apis/gkm.io/v1alpha1"
NS = "default"
DIGEST = "sha256:" + "7c" * 32
APPLY = "application/apply-patch+yaml"
AGENT = "gkm-bench-agent"  # the simulated agents' user agent
BASELINE = False  # --baseline: the operator is an earlier build
VERBS = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE",
         "deletecollection": "DELETE"}


class RealServer:
    """kube-apiserver with etcd (spec/lib/kubeenv.py), the gkm CRDs applied,
    writes counted from its JSON audit log."""

    name = "real"

    def __init__(self):
        self.kube = KubeEnv(audit=True)
        try:
            self.kube.start()
            self.kube.apply_crds()
        except BaseException:
            self.kube.stop()
            raise
        self.port, self.kubeconfig, self.dir = self.kube.port, self.kube.kubeconfig, self.kube.dir
        self.ssl = ssl.create_default_context(cafile=self.kube.ca)
        self.headers = {"Authorization": "Bearer " + self.kube.token}

    def pids(self):
        return {"server": self.kube.procs["kube-apiserver"].pid, "etcd": self.kube.procs["etcd"].pid}

    def mark(self):
        return os.path.getsize(self.kube.audit_log)

    def writes_since(self, mark):
        return self.read_writes(mark)[0]

    def read_writes(self, mark):
        """The writes logged from byte mark on, and the mark after the last
        whole line (a line still being written is read next time)."""
        out = []
        with open(self.kube.audit_log, "rb") as fh:
            fh.seek(mark)
            data = fh.read()
        data = data[:data.rfind(b"\n") + 1]
        for line in data.splitlines():
            ev = json.loads(line)
            if ev.get("stage") != "ResponseComplete":
                continue
            u = urllib.parse.urlsplit(ev["requestURI"])
            q = urllib.parse.parse_qs(u.query)
            out.append({"method": VERBS.get(ev["verb"], ev["verb"].upper()), "path": u.path,
                        "status": (ev.get("responseStatus") or {}).get("code", 0),
                        "userAgent": ev.get("userAgent", ""), "at": stamp(ev.get("stageTimestamp")),
                        "fieldManager": (q.get("fieldManager") or [""])[0]})
        return out, mark + len(data)

    def stop(self):
        self.kube.stop()


def stamp(ts):
    """An audit event's stageTimestamp (RFC 3339, microseconds) as epoch seconds."""
    if not ts:
        return 0.0
    whole, _, frac = ts.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


def die_with_parent():
    """In a child before exec: SIGKILL when this process dies, however it dies."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def writer(r):
    """Who wrote: the field manager (one per agent, folded), else the user agent."""
    if r["fieldManager"]:
        return re.sub(r"/node-\d+$", "/*", r["fieldManager"])
    return r["userAgent"].split("/")[0] or "-"


def resource(path):
    """apis/gkm.io/v1alpha1/namespaces/default/gkmcachenodes/node-1/status ->
    gkmcachenodes/status"""
    parts = path.strip("/").split("/")
    if "namespaces" in parts[:-1]:
        i = parts.index("namespaces")
        parts = parts[:i] + parts[i + 2:] if len(parts) > i + 2 else parts[:i + 1]
    base = 2 if parts[0] == "api" else 3
    rest = parts[base:]
    return rest[0] + ("/" + rest[2] if len(rest) > 2 else "")


def tally(writes):
    """Writes by 'METHOD resource writer' -> {status code: count}; codes summed."""
    by, codes = {}, {}
    for r in writes:
        k = "%s %s %s" % (r["method"], resource(r["path"]), writer(r))
        c = str(r["status"])
        by.setdefault(k, {})
        by[k][c] = by[k].get(c, 0) + 1
        codes[c] = codes.get(c, 0) + 1
    return by, codes


class Conn:
    """One keep-alive connection (one per thread)."""

    def __init__(self, srv, timeout=120):
        self.srv = srv
        self.timeout = timeout
        self.c = None

    def open(self):
        if self.srv.ssl:
            return http.client.HTTPSConnection("127.0.0.1", self.srv.port, timeout=self.timeout,
                                               context=self.srv.ssl)
        return http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=self.timeout)

    def req(self, method, path, body=None, ctype="application/json"):
        for attempt in (0, 1):
            try:
                if self.c is None:
                    self.c = self.open()
                h = dict(self.srv.headers, Accept="application/json")
                h["User-Agent"] = AGENT
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
        c = Conn(SRV)
        while True:
            try:
                it = q.get_nowait()
            except queue.Empty:
                return
            try:
                r = fn(c, it)
            except Exception:
                if STOPPING.is_set():
                    return  # the run was stopped and the server went away
                raise
            with lock:
                out.append(r)

    ths = [threading.Thread(target=run, daemon=True) for _ in range(n_threads)]
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
        c = Conn(SRV, timeout=600).open()
        c.request("GET", GROUP + "/gkmcaches?watch=1&resourceVersion=%s" % self.rv,
                  headers=dict(SRV.headers, Accept="application/json"))
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


def server_cpu(srv):
    """CPU seconds of the server's processes, by name."""
    return {k: cpu_s(p) for k, p in srv.pids().items()}


def cpu_delta(a, b):
    return {k: b[k] - a[k] for k in a}


def server_peak_mib(srv):
    """Peak RSS (VmHWM) of the server's processes together, MiB."""
    return sum(memory(p)["VmHWM"] for p in srv.pids().values()) / 1024


def counted(r, writes):
    """Add the writes' tally, 409s, 422s and other refusals to the result r."""
    by, codes = tally(writes)
    r.update(writes_by=by, writes=len(writes), codes=codes,
             conflicts=codes.get("409", 0), invalid=codes.get("422", 0),
             other_errors=sum(v for c, v in codes.items() if not c.startswith("2") and c not in ("409", "422")))
    return r


def run_sharded(srv, n, threads, timeout):
    c = Conn(srv)
    c.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": "gkm-system"}})
    t = time.monotonic()
    setup_nodes(n, threads)
    t_setup = time.monotonic() - t
    hport = free_port()
    log = open(os.path.join(srv.dir, "operator.log"), "wb")
    op = subprocess.Popen([GKM, "operator", "--kubeconfig", srv.kubeconfig, "--namespace", "gkm-system",
                           "--leader-elect", "false", "--health-listen", "127.0.0.1:%d" % hport,
                           "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT,
                          preexec_fn=die_with_parent)
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
        mark = srv.mark()
        srv0, op0, me0 = server_cpu(srv), cpu_s(op.pid), time.process_time()
        writes = {}

        def agent(conn, i):
            ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            st, _ = conn.req("PATCH", GROUP + "/namespaces/%s/gkmcachenodes/node-%d/status"
                             "?fieldManager=gkm-agent%%2Fnode-%d&force=true" % (NS, i, i),
                             agent_status(i, ts), APPLY)
            return st, time.monotonic()

        t0, wall0 = time.monotonic(), time.time()
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
        srv1, op1, me1 = server_cpu(srv), cpu_s(op.pid), time.process_time()
        time.sleep(0.5)  # a late write after done would still be counted
        # the Node labels follow: until every node has one, or none came for 5 s
        wr, pos, labels, quiet_since = [], mark, [], time.monotonic()
        while True:
            new, pos = srv.read_writes(pos)
            wr += new
            got = [r["at"] for r in new if r["path"].startswith("/api/v1/nodes/") and r["status"] == 200
                   and r["fieldManager"] == "gkm-operator/node-labels"]
            if got:
                labels += got
                quiet_since = time.monotonic()
            if len(labels) >= n or time.monotonic() - quiet_since > 5:
                break
            time.sleep(0.25)
        op_writes = [r for r in wr if r["method"] == "PATCH" and r["path"].endswith("/gkmcaches/bench/status")]
        for code, _ in res:
            writes[code] = writes.get(code, 0) + 1
        cpu = cpu_delta(srv0, srv1)
        return counted({
            "design": "sharded SSA + %s operator" % ("baseline" if BASELINE else "gkm"), "server": srv.name, "n": n, "setup_s": t_setup,
            "seconds": (w.t_done or t_end) - t0, "converged": w.t_done is not None,
            "agent_writes": len(res), "agent_codes": writes,
            "agents_done_s": t_agents - t0,
            "labels_done_s": max(labels) - wall0 if len(labels) >= n else None,
            "operator_writes": len(op_writes),
            "server_cpu_s": sum(cpu.values()), "etcd_cpu_s": cpu.get("etcd"),
            "server_peak_mib": server_peak_mib(srv), "operator_cpu_s": op1 - op0, "client_cpu_s": me1 - me0,
            "curve": [(round(t - t0, 3), r) for t, r in w.curve],
        }, wr)
    finally:
        op.terminate()
        op.wait(20)
        log.close()


# ----------------------------------------------------------------- contrast

def run_shared(srv, n, threads, limit, ssa):
    c = Conn(srv)
    cm = "shared-status"
    base = "/api/v1/namespaces/%s/configmaps" % NS
    st, _ = c.req("POST", base, {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": cm, "namespace": NS}, "data": {}})
    assert st == 201, st
    mark = srv.mark()
    srv0 = server_cpu(srv)
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
    cpu = cpu_delta(srv0, server_cpu(srv))
    wr = srv.writes_since(mark)
    done = sum(1 for _, ok in res if ok)
    return counted({"design": "shared object, " + ("SSA per writer" if ssa else "read-modify-write"),
                    "server": srv.name, "n": n, "seconds": t1 - t0, "converged": done == n, "done": done,
                    "agent_writes": sum(1 for r in wr if r["status"] == 200 and r["userAgent"] == AGENT),
                    "server_cpu_s": sum(cpu.values()), "etcd_cpu_s": cpu.get("etcd"),
                    "server_peak_mib": server_peak_mib(srv)}, wr)


def stop(*_):
    STOPPING.set()
    sys.exit(143)


def main():
    global SRV, BASELINE
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--design", choices=("sharded", "rmw", "ssa-shared"), default="sharded")
    ap.add_argument("--contrast-limit", type=float, default=60.0,
                    help="stop a shared-object run after this many seconds")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--baseline", action="store_true",
                    help="GKM_BIN is an earlier build: name the design so")
    a = ap.parse_args()
    BASELINE = a.baseline
    if unavailable():
        print("convergence: no real API server: %s" % unavailable(), file=sys.stderr)
        return 2
    # SIGTERM (the bench's time limit) unwinds: the operator and the servers stop
    signal.signal(signal.SIGTERM, stop)
    t = time.monotonic()
    SRV = RealServer()
    start_s = time.monotonic() - t
    try:
        if a.design == "sharded":
            r = run_sharded(SRV, a.nodes, a.threads, a.timeout)
        else:
            r = run_shared(SRV, a.nodes, a.threads, a.contrast_limit, a.design == "ssa-shared")
        r["server_start_s"] = start_s
        print(json.dumps(r))
    finally:
        SRV.stop()
    return 0


SRV = None
STOPPING = threading.Event()
if __name__ == "__main__":
    sys.exit(main())
