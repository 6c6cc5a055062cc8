#!/usr/bin/python3
"""The store's budget, end to end: `gkm up` with its state (and store) on a
128 MiB tmpfs, a real registry, real signatures, and the real `gkm csi` on
the same node answering NodePublishVolume through a real gRPC client.

A pull the room check refuses evicts the cache no pod uses (least recently
used first) and goes through; the store's file system above the high
threshold evicts down to the low one; a cache a pod mounts is never evicted,
even when nothing else can go. Each eviction is reported: the node status
entry says Evicted with the MiB freed, the cache gets an Event, and
gkm_store_evictions_total counts it by reason. An evicted cache stays
evicted (also across a restart of the agent) until a pod on the node asks
for it: the publish is refused saying so, the node pulls it again, and the
kubelet's next try mounts it."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import csi_client as cc  # noqa: E402
import promtext  # noqa: E402
from proc import Child, free_port, registry, sh, wait_for  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
FIXTURES = os.path.join(ROOT, "spec", "fixtures")
CUDA_CACHE = os.path.join(FIXTURES, "caches", "triton", "cuda-sm75-vector-add")
KERNEL = "io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin"
NS = "default"
MiB = 1 << 20

t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-store-budget.")
small = os.path.join(tmp, "small")
cleanups = []


def path(*p):
    return os.path.join(tmp, *p)


def fill(name, mib):
    """A file of mib MiB on the small file system (None removes it)."""
    p = os.path.join(small, name)
    if mib is None:
        os.unlink(p)
        return
    with open(p, "wb") as f:
        f.write(b"\0" * (mib * MiB))


def build_image(reg, key, name):
    """A signed Triton cache of about 24 MiB: the fixture and a blob of random bytes."""
    src = path("src-" + name)
    shutil.copytree(CUDA_CACHE, src)
    first = sorted(os.listdir(src))[0]
    with open(os.path.join(src, first, "blob-%s.bin" % name), "wb") as f:
        f.write(os.urandom(24 * MiB))
    ref = "%s/caches/%s:v1" % (reg, name)
    sh(GKM, "cache", "build", src, "-t", ref)
    sh(GKM, "cache", "sign", ref, "--key", key)
    return ref


def main():
    if not os.access("/usr/bin/docker-registry", os.X_OK):
        t.skip("the store's budget", "/usr/bin/docker-registry missing")
        return
    reason = cc.mount_permitted(tmp)
    os.makedirs(small)
    if not reason and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", small]).returncode:
        reason = "mounting a small tmpfs for the store needs root"
    if reason:
        t.skip("the store's budget", reason)
        return
    cleanups.append(lambda: subprocess.run(["umount", "-l", small]))
    cleanups.append(lambda: cc.unmount_below(path("pods")))
    import grpc
    pb, pbg = cc.load_stubs(path("py"))
    C = grpc.StatusCode

    reg, stop_registry = registry(ROOT)
    cleanups.append(stop_registry)
    sh(GKM, "cache", "keygen", "--output-key-prefix", path("k"))
    images = {name: build_image(reg, path("k.key"), name) for name in ("a", "b", "c", "d")}

    state, run = os.path.join(small, "state"), os.path.join(small, "state", "run")
    port = free_port()

    def apply(*names):
        with open(path("caches.yaml"), "w") as f:
            f.write("---\n".join("apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: %s}\n"
                                 "spec: {image: %s}\n" % (n, NS, images[n]) for n in names))
        sh(GKM, "apply", "--state", state, "-f", path("caches.yaml"))

    def start_up():
        up = Child([GKM, "up", "--state", state, "--node", "node-1", "--poll-ms", "100",
                    "--gpu-file", os.path.join(FIXTURES, "gpu", "inventory", "t4.json"),
                    "--key", path("k.pub"), "--store-min-age", "0",
                    "--health-listen", "127.0.0.1:%d" % port], path("up-%d.log" % time.time_ns()))
        cleanups.append(up.stop)
        return up

    apply("a", "b")
    up = start_up()
    plugin = cc.Plugin(tmp, state, run, node_id="node-1", name="csi").start()
    cleanups.append(plugin.stop)

    def entry(name):
        o = json.loads(sh(GKM, "get", "--state", state, "gkmcn", "node-1", "-n", NS, "-o", "json"))
        return o["status"]["caches"].get(name)

    def state_of(name):
        e = entry(name) or {}
        return "%s/%s" % (e.get("state"), e.get("reason"))

    def wait_state(name, want, timeout=60):
        return wait_for(lambda: state_of(name) == want and entry(name), timeout)

    def sample(name, want, n=10):
        """n readings of name's state, 0.2 s apart, each want (a state that flickers is a bug)."""
        got = []
        for _ in range(n):
            got.append(state_of(name))
            time.sleep(0.2)
        return [g for g in got if g != want]

    def metric(name, **labels):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            return promtext.value(promtext.parse(r.read().decode()), name, **labels) or 0.0

    def events(name):
        p = os.path.join(state, "events.jsonl")
        lines = open(p).read().splitlines() if os.path.exists(p) else []
        return [e for e in map(json.loads, lines)
                if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "GKMCache"
                and e["reason"] == "Evicted"]

    n = [0]

    def publish(cache):
        n[0] += 1
        tgt = path("pods", "p%d" % n[0], "mount")
        os.makedirs(os.path.dirname(tgt))
        try:
            with grpc.insecure_channel(plugin.endpoint) as ch:
                pbg.NodeStub(ch).NodePublishVolume(
                    cc.publish_request(pb, "vol-%d" % n[0], tgt, cache, ns=NS, pod_ns=NS, pod="pod-%d" % n[0],
                                       uid="uid-%d" % n[0]), timeout=30)
            return C.OK, "", tgt
        except grpc.RpcError as e:
            return e.code(), e.details(), tgt

    def reads_kernel(tgt):
        try:
            return open(os.path.join(tgt, KERNEL), "rb").read() == \
                open(os.path.join(CUDA_CACHE, KERNEL[len("io.triton.cache/"):]), "rb").read()
        except OSError:
            return False

    def store_entry(name):
        e = entry(name) or {}
        d = e.get("digest", "")
        return os.path.isdir(os.path.join(state, "store", "sha256", d[len("sha256:"):])) if d else False

    t.ok(wait_state("a", "Ready/Ready") and wait_state("b", "Ready/Ready"), "two caches of 24 MiB are Ready",
         diag=up.tail())
    code, details, tgt_a = publish("a")
    t.ok(code == C.OK and reads_kernel(tgt_a), "a pod mounts a; nothing mounts b", diag=(code, details))

    # 45 MiB more: 128 MiB with about 95 used, less free than c needs (24 MiB,
    # an eighth more and 16 MiB), though under the high threshold (85%)
    fill("filler", 45)
    apply("a", "b", "c")
    t.ok(wait_state("c", "Ready/Ready"), "a pull the room check refused goes through: c is Ready",
         diag=(entry("c"), up.tail()))
    e = entry("b") or {}
    t.eq(state_of("b"), "Evicted/PullNeedsSpace", "b, which no pod mounts, was evicted to make room for it")
    t.ok("MiB freed" in e.get("message", "") and "a pull of GKMCache default/c needs" in e.get("message", "")
         and "pulled again when a pod on this node mounts it" in e.get("message", ""),
         "its node status message names the MiB freed, why, and what brings it back", diag=e.get("message"))
    t.ok(not store_entry("b") and store_entry("a") and store_entry("c"), "b's image left the store, a's stayed")
    rec = json.load(open(os.path.join(state, "caches", NS, "b", "ready.json")))
    t.ok(rec["state"] == "Evicted" and not os.path.lexists(os.path.join(state, "caches", NS, "b", "data")),
         "b's node record says Evicted and links no data", diag=rec)
    ev = wait_for(lambda: events("b"), 20) or []
    t.ok(len(ev) == 1 and ev[0]["type"] == "Normal" and "MiB freed" in ev[0]["message"],
         "an Event Evicted on GKMCache b says so", diag=ev)
    t.eq(metric("gkm_store_evictions_total", reason="PullNeedsSpace"), 1.0,
         'gkm_store_evictions_total{reason="PullNeedsSpace"} counts it')
    t.ok(metric("gkm_store_evicted_bytes_total", reason="PullNeedsSpace") >= 24 * MiB,
         "gkm_store_evicted_bytes_total counts its bytes")
    t.eq(sample("b", "Evicted/PullNeedsSpace"), [], "b stays Evicted: nothing pulls it again by itself")
    t.ok(reads_kernel(tgt_a) and state_of("a") == "Ready/Ready", "a, mounted, was not touched")

    # 20 MiB more: about 90% used, above the high threshold: down to 80%,
    # which c (unused) frees; a is mounted
    fill("filler2", 20)
    t.ok(wait_state("c", "Evicted/HighThreshold", 90), "above the high threshold, c (unused) is evicted",
         diag=(entry("c"), up.tail()))
    # its image goes once a mount that read its record just before has had time to record its use
    t.ok(wait_for(lambda: metric("gkm_store_evictions_total", reason="HighThreshold") == 1.0, 30),
         'gkm_store_evictions_total{reason="HighThreshold"} counts it', diag=up.tail())
    used = os.statvfs(small)
    t.ok(100 - used.f_bavail * 100 // used.f_blocks <= 80, "the store's file system is at the low threshold or below")
    t.ok(reads_kernel(tgt_a) and state_of("a") == "Ready/Ready" and store_entry("a"), "a, mounted, still is not touched")
    fill("filler2", None)

    # a restart: the node's records tell what was evicted
    up.stop()
    up = start_up()
    t.ok(wait_for(lambda: metric("gkm_store_evictions_total") is not None, 30), "gkm up starts again")
    time.sleep(2)
    t.eq(sample("b", "Evicted/PullNeedsSpace") + sample("c", "Evicted/HighThreshold"), [],
         "after a restart the evicted caches stay evicted")

    # a pod asks for b: refused, saying why; the node pulls it again
    code, details, _ = publish("b")
    t.ok(code == C.FAILED_PRECONDITION and "GKMCache default/b was evicted from this node's store" in details,
         "a publish of the evicted b is refused, saying it was evicted and is pulled again", diag=(code, details))
    t.ok(wait_state("b", "Ready/Ready"), "the node pulls b again: Ready", diag=(entry("b"), up.tail()))
    code, details, tgt_b = publish("b")
    t.ok(code == C.OK and reads_kernel(tgt_b), "the kubelet's next try mounts it", diag=(code, details))

    # both a and b mounted, nothing else in the store: a pull that needs
    # room gets none, and nothing mounted goes
    before = metric("gkm_store_evictions_total")
    apply("a", "b", "c", "d")
    t.ok(wait_state("d", "Failed/InsufficientStorage"), "d cannot be made room for: Failed/InsufficientStorage",
         diag=(entry("d"), up.tail()))
    t.eq(sample("a", "Ready/Ready") + sample("b", "Ready/Ready"), [], "the mounted caches stay Ready")
    t.ok(store_entry("a") and store_entry("b") and reads_kernel(tgt_a) and reads_kernel(tgt_b)
         and metric("gkm_store_evictions_total") == before, "and nothing mounted was evicted")


if __name__ == "__main__":
    try:
        t.run("the store's budget", main)
    finally:
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception:  # noqa: BLE001 - clean up the rest anyway
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(t.finish())
