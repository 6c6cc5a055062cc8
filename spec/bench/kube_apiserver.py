#!/usr/bin/python3
"""Benchmark of the test API server under N simulated agents (default 1000):
each agent holds a watch on its own GKMCacheNode (label selector
gkm.io/node=<node>) and server-side applies that object's status over a
keep-alive connection, as the gkm agent does. Reports apply throughput and
latency, how long a write takes to reach its watcher, and the server's peak
RSS. Figures only, nothing asserted.

    spec/bench/kube_apiserver.py [--agents 1000] [--rounds 3] [--threads 32]
"""
import argparse
import json
import os
import selectors
import socket
import sys
import threading
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeserver import KubeServer  # noqa: E402

NS = "/apis/gkm.io/v1alpha1/namespaces/default/gkmcachenodes"


def status_body(i, r):
    ts = "2026-01-01T00:%02d:%02dZ" % (r // 60 % 60, r % 60)
    return json.dumps({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode", "metadata": {"name": "node-%d" % i},
        "status": {"gpus": [{"ids": [0, 1, 2, 3, 4, 5, 6, 7], "gpuType": "NVIDIA H100 80GB HBM3",
                             "backend": "cuda", "arch": "90", "driverVersion": "550.54.15"}],
                   "caches": {"cache-%d" % k: {"digest": "sha256:" + "%064x" % k, "state": "Ready",
                                               "compatibleGPUs": [{"ids": [0, 1, 2, 3, 4, 5, 6, 7]}],
                                               "lastUpdated": ts} for k in range(3)},
                   "totalCaches": 3, "readyCaches": 3, "failedCaches": 0, "lastUpdated": ts}})


class Watchers:
    """All agents' watches on raw sockets in one selector thread; records when
    each MODIFIED event for node-i arrives."""

    def __init__(self, ks, n, rv):
        self.sel = selectors.DefaultSelector()
        self.arrived = {}
        self.lock = threading.Lock()
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", ks.port))
            path = "%s?watch=1&resourceVersion=%s&labelSelector=gkm.io%%2Fnode%%3Dnode-%d" % (NS, rv, i)
            s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n" % path).encode())
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, [i, b""])
        self.stop = False
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        while not self.stop:
            for key, _ in self.sel.select(timeout=0.2):
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    self.sel.unregister(key.fileobj)
                    continue
                i, buf = key.data
                buf += data
                now = time.monotonic()
                while b'"type":"MODIFIED"' in buf:
                    idx = buf.index(b'"type":"MODIFIED"')
                    buf = buf[idx + 17:]
                    with self.lock:
                        self.arrived.setdefault(i, []).append(now)
                key.data[1] = buf[-64:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=int(os.environ.get("GKM_BENCH_AGENTS", 1000)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=32)
    a = ap.parse_args()
    ks = KubeServer(tls=False, token=None).start()
    try:
        created = 0
        t0 = time.monotonic()
        conn = ks.connection()
        for i in range(a.agents):
            body = json.dumps({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
                               "metadata": {"name": "node-%d" % i, "labels": {"gkm.io/node": "node-%d" % i}},
                               "spec": {"nodeName": "node-%d" % i}})
            st, _h, _b = ks.request("PATCH", "%s/node-%d?fieldManager=gkm-agent/node-%d" % (NS, i, i), body,
                                    content_type="application/apply-patch+yaml", conn=conn)
            created += st == 201
        conn.close()
        t_create = time.monotonic() - t0
        rv = ks.request("GET", NS + "?limit=1")[2]["metadata"]["resourceVersion"]
        w = Watchers(ks, a.agents, rv)
        time.sleep(1)
        sent = {}
        lat = []
        lock = threading.Lock()

        def agent_pool(ids):
            conns = {}
            for r in range(1, a.rounds + 1):
                for i in ids:
                    c = conns.get(i) or ks.connection()
                    conns[i] = c
                    t = time.monotonic()
                    st, _h, _b = ks.request("PATCH", "%s/node-%d/status?fieldManager=gkm-agent/node-%d&force=true"
                                            % (NS, i, i), status_body(i, r),
                                            content_type="application/apply-patch+yaml", conn=c)
                    d = time.monotonic() - t
                    with lock:
                        lat.append(d)
                        sent.setdefault(i, []).append(t)
                    assert st == 200, st
            for c in conns.values():
                c.close()

        t0 = time.monotonic()
        ths = [threading.Thread(target=agent_pool, args=(list(range(k, a.agents, a.threads)),))
               for k in range(a.threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        t_apply = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(len(v) for v in w.arrived.values()) < len(lat):
            time.sleep(0.1)
        w.stop = True
        delivery = []
        for i, ts in sent.items():
            for s, r in zip(ts, w.arrived.get(i, [])):
                delivery.append(r - s)
        stats = ks.request("GET", "/_test/stats")[2]
        rss = 0
        with open("/proc/%d/status" % ks.proc.pid) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    rss = int(line.split()[1]) // 1024
        lat.sort()
        delivery.sort()

        def pct(v, p):
            return v[min(len(v) - 1, int(len(v) * p))] * 1000 if v else float("nan")
        print("agents: %d, rounds: %d, client threads: %d" % (a.agents, a.rounds, a.threads))
        print("create by apply:   %d objects in %.2f s (%.0f/s)" % (created, t_create, created / t_create))
        print("status apply:      %d in %.2f s = %.0f req/s; latency p50 %.1f ms, p99 %.1f ms"
              % (len(lat), t_apply, len(lat) / t_apply, pct(lat, .5), pct(lat, .99)))
        print("watch delivery:    %d/%d events; write-to-watcher p50 %.1f ms, p99 %.1f ms"
              % (len(delivery), len(lat), pct(delivery, .5), pct(delivery, .99)))
        print("server:            %d watchers open, peak RSS %d MiB, %s requests"
              % (stats["watchers"], rss, stats["requests"]))
    finally:
        ks.cleanup()


if __name__ == "__main__":
    main()
