#!/usr/bin/python3
"""NodePublishVolume / NodeUnpublishVolume latency of `gkm csi`, measured by a
real gRPC client over the unix socket with real mounts (root needed).

Each run publishes and unpublishes 1,000 volumes one after the other (after
20 warm-up pairs) and takes p50/p99 of the client-side call time; the figures
are the median over GKM_BENCH_RUNS runs (default 5) with min..max, for a
read-only bind mount, for a writable overlay on its 10Gi size-limited layer
(the default: a sparse ext4 image on a loop device per volume) and for one
without a limit (sizeLimit "0"), with the run directory on a
tmpfs (as /run is on a node), and for a persistent volume (the PersistentVolume
of a cache's claim: one volume id, MULTI_NODE_READER_ONLY, a target per pod)
while 50 other pods of the node hold the same volume. One more run puts the run directory on the
temp dir's disk file system instead, where the fsyncs of the state and usage
files dominate. A last run fires 1,000 publishes and then 1,000 unpublishes
from 16 client threads for throughput. Nothing is asserted."""
import concurrent.futures
import os
import shutil
import subprocess
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import csi_client as cc  # noqa: E402
import triton_standin  # noqa: E402

import grpc  # noqa: E402

CALLS = int(os.environ.get("GKM_BENCH_CALLS", "1000"))
RUNS = int(os.environ.get("GKM_BENCH_RUNS", "5"))
WARMUP = 20


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def first_writes(node, request, unpublish, seq, plain, n=100):
    """Triton's first and second miss, and the rewrite of a 4 KiB file of
    the cache, in N fresh mounts of each kind and N fresh plain copies."""
    kernel = os.urandom(65536)

    def writes(where, fresh, done):
        got = {"first miss": [], "second miss": [], "4 KiB rewrite": []}
        for i in range(n):
            mount = fresh(i)
            for what in ("first miss", "second miss"):
                t0 = time.perf_counter()
                res = triton_standin.lookup(mount, uuid.uuid4().hex, "k.cubin", kernel)
                got[what].append((time.perf_counter() - t0) * 1000)
                if res[0] != "stored":
                    raise RuntimeError("%s in %s: %r" % (what, where, res))
            t0 = time.perf_counter()
            with open(os.path.join(mount, "io.triton.cache", "07", "k007.json"), "r+b") as fh:
                fh.write(b"x")
            got["4 KiB rewrite"].append((time.perf_counter() - t0) * 1000)
            done(i)
        for what, vals in got.items():
            print("  first writes  %-14s %-34s p50 %6.3f  p99 %6.3f ms" % (what, where, pct(vals, 50), pct(vals, 99)))

    def volume(writable):
        reqs = {}

        def fresh(i):
            seq[0] += 1
            reqs[i] = request(seq[0], writable, False)
            node.NodePublishVolume(reqs[i], timeout=60)
            return reqs[i].target_path

        return fresh, lambda i: unpublish(node, reqs.pop(i))

    print("a pod's first writes, %d fresh mounts each (Triton's FileCacheManager path)" % n)
    seq[0] += 1
    src = request(seq[0], False, False)
    node.NodePublishVolume(src, timeout=60)

    def plain_copy(i):
        shutil.copytree(src.target_path, os.path.join(plain, str(i)))
        return os.path.join(plain, str(i))

    writes("plain directory (temp dir's fs)", plain_copy, lambda i: shutil.rmtree(os.path.join(plain, str(i))))
    unpublish(node, src)
    for writable, where in ((True, "overlay, 10Gi layer (default)"), ("unlimited", "overlay, no size limit")):
        writes(where, *volume(writable))


def main():
    tmp = tempfile.mkdtemp(prefix="gkm-csi-bench.")
    plugin = None
    try:
        reason = cc.mount_permitted(tmp)
        if reason:
            print("skipped: " + reason)
            return 0
        root, run, disk_run, pods = (os.path.join(tmp, d) for d in ("root", "run", "disk-run", "pods"))
        for d in (root, run, disk_run, pods):
            os.makedirs(d)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0755", "tmpfs", run], check=True)
        pb, pbg = cc.load_stubs(os.path.join(tmp, "py"))
        lay = cc.Layout(root)
        # A cache shaped like a small Triton cache: 200 kernels in 50 hash dirs.
        files = {"io.triton.cache/%02d/k%03d.%s" % (i % 50, i, ext): os.urandom(4096)
                 for i in range(200) for ext in ("json", "cubin")}
        lay.view("bench", "cache", lay.store_entry(files))
        seq = [0]

        rox = pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY

        def request(i, writable, persistent):
            """Pod i's publish request: its own inline volume, or its target
            of the one persistent volume; writable "unlimited": sizeLimit 0."""
            os.makedirs(os.path.join(pods, "p%d" % i), exist_ok=True)
            return cc.publish_request(pb, "gkm-pv" if persistent else "vol-%d" % i,
                                      os.path.join(pods, "p%d" % i, "mount"), "cache", ns="bench",
                                      pod_ns="bench", pod="pod-%d" % i, uid="u%d" % i, writable=bool(writable),
                                      mode=rox if persistent else None,
                                      extra={"sizeLimit": "0"} if writable == "unlimited" else None)

        def unpublish(node, req):
            node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=req.volume_id,
                                                                   target_path=req.target_path), timeout=60)

        def pair(node, writable, persistent=False):
            i = seq[0]
            seq[0] += 1
            req = request(i, writable, persistent)
            t0 = time.perf_counter()
            node.NodePublishVolume(req, timeout=60)
            t1 = time.perf_counter()
            unpublish(node, req)
            t2 = time.perf_counter()
            return (t1 - t0) * 1000, (t2 - t1) * 1000

        def measure(node, writable, runs, results, where, persistent=False):
            mode = {False: "read-only bind", True: "writable, 10Gi layer",
                    "unlimited": "writable, no size limit"}[writable] + ", run dir on " + where
            if persistent:
                mode = "persistent, 50 held; " + mode
            for _ in range(runs):
                for _ in range(WARMUP):
                    pair(node, writable, persistent)
                pub, unpub = [], []
                for _ in range(CALLS):
                    a, b = pair(node, writable, persistent)
                    pub.append(a)
                    unpub.append(b)
                for name, vals in (("NodePublishVolume", pub), ("NodeUnpublishVolume", unpub)):
                    results.setdefault((name, mode), []).append((pct(vals, 50), pct(vals, 99)))

        results = {}
        plugin = cc.Plugin(tmp, root, disk_run, threads=4).start()
        with grpc.insecure_channel(plugin.endpoint) as ch:
            measure(pbg.NodeStub(ch), False, 1, results, "disk")
        plugin.stop()
        plugin = cc.Plugin(tmp, root, run, threads=4).start()
        ch = grpc.insecure_channel(plugin.endpoint)
        node = pbg.NodeStub(ch)
        for writable in (False, True, "unlimited"):
            measure(node, writable, RUNS, results, "tmpfs")
        held = [request(10 ** 6 + i, False, True) for i in range(50)]
        for req in held:
            node.NodePublishVolume(req, timeout=60)
        measure(node, False, RUNS, results, "tmpfs", persistent=True)
        for req in held:
            unpublish(node, req)

        print("gkm csi: %d sequential calls per run, client-side latency in ms "
              "(median of runs, min..max)" % CALLS)
        for (name, mode), runs in results.items():
            p50 = [x[0] for x in runs]
            p99 = [x[1] for x in runs]
            print("  %-20s %-53s %d run%s  p50 %6.2f (%.2f..%.2f)   p99 %6.2f (%.2f..%.2f)" % (
                name, mode, len(runs), "s" if len(runs) > 1 else " ", statistics.median(p50), min(p50),
                max(p50), statistics.median(p99), min(p99), max(p99)))

        first_writes(node, request, unpublish, seq, os.path.join(tmp, "plain"))

        # Throughput with concurrent clients (one run).
        targets = []
        for i in range(CALLS):
            os.makedirs(os.path.join(pods, "c%d" % i), exist_ok=True)
            targets.append(("cvol-%d" % i, os.path.join(pods, "c%d" % i, "mount")))

        def pub(vt):
            return node.NodePublishVolume(cc.publish_request(pb, vt[0], vt[1], "cache", ns="bench",
                                                             pod_ns="bench", pod="c", uid="c"), timeout=60)

        def unpub(vt):
            return node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vt[0], target_path=vt[1]),
                                            timeout=60)

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            t0 = time.perf_counter()
            list(ex.map(pub, targets))
            t1 = time.perf_counter()
            list(ex.map(unpub, targets))
            t2 = time.perf_counter()
        print("  %d publishes of default volumes from 16 clients (run dir on tmpfs): %.2f s (%.0f/s); %d unpublishes: %.2f s (%.0f/s)" % (
            CALLS, t1 - t0, CALLS / (t1 - t0), CALLS, t2 - t1, CALLS / (t2 - t1)))
        ch.close()
        return 0
    finally:
        if plugin:
            plugin.stop()
        cc.unmount_below(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
