#!/usr/bin/python3
"""What pods compiled into writable cache volumes, captured as a candidate:
the real `gkm csi` plugin mounts real overlays of a real store entry (made
by `gkm cache extract --store` from an image `gkm cache build` made of the
real CUDA Triton fixture), a fake compiler writes kernels through the pods'
mounts, and `gkm cache capture --from` packages the overlays' upper layers
as the image's layers plus one: identical captures from several pods give
one digest, a path two pods wrote differently is a conflict naming it, and
what a pod must not leave (a deleted base file, a device node, a symlink
out, a file still being written) is refused with nothing stored."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import csi_client as cc  # noqa: E402
from tap import Tap  # noqa: E402

import grpc  # noqa: E402

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
G = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
FX = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "cuda-sm75-vector-add")
T4 = os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "t4.json")
SDE = "1700000000"

t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-capture-volume.")
root, run, pods = os.path.join(tmp, "root"), os.path.join(tmp, "run"), os.path.join(tmp, "pods")
for d in (root, run, pods):
    os.makedirs(d)
os.environ["TMPDIR"] = tmp
plugin = None


def cleanup():
    if plugin:
        plugin.stop()
    cc.unmount_below(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


reason = cc.mount_permitted(tmp)
if reason:
    t.skip("capture from writable CSI volumes", reason)
    cleanup()
    sys.exit(t.finish())


def gkm(*args):
    p = subprocess.run([G] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


LAY = "oci:" + os.path.join(tmp, "lay")
rc, out, err = gkm("cache", "build", FX, "-t", LAY + ":base")
t.ok(rc == 0, "the cache image is built from the real CUDA fixture", diag=err)
rc, out, err = gkm("cache", "extract", LAY + ":base", "--store", os.path.join(root, "store"))
digest = out.split()[1] if rc == 0 else ""
t.ok(rc == 0 and digest.startswith("sha256:"), "gkm extracts it into the node's store", diag=err)
cc.Layout(root).view("team-a", "vector-add", digest)

pb, pbg = cc.load_stubs(os.path.join(tmp, "py"))
plugin = cc.Plugin(tmp, root, run)
plugin.start()
ch = grpc.insecure_channel(plugin.endpoint)
node = pbg.NodeStub(ch)


def upper_of(target):
    """The upper layer of the overlay mounted at target, from mountinfo."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            if left.split()[4] == target:
                opts = dict(o.split("=", 1) for o in right.split()[2].split(",") if "=" in o)
                return opts.get("upperdir")
    return None


def pod(name):
    """A pod with a writable volume of the cache: its mount and its upper layer."""
    tgt = os.path.join(pods, name, "mount")
    os.makedirs(os.path.dirname(tgt))
    node.NodePublishVolume(cc.publish_request(pb, "v-" + name, tgt, "vector-add", pod=name,
                                              uid="uid-" + name, writable=True), timeout=30)
    return tgt, upper_of(tgt)


def compile_kernel(tgt, name, seed, hashdir="MULKERNELHASHAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"):
    """The fake compiler: one Triton kernel for the T4 (sm_75) written through
    the pod's mount, its binary's bytes given by seed."""
    d = os.path.join(tgt, "io.triton.cache", hashdir)
    os.makedirs(d, exist_ok=True)
    meta = {"hash": hashdir, "name": name, "num_warps": 4,
            "target": {"backend": "cuda", "arch": 75, "warp_size": 32}}
    with open(os.path.join(d, name + ".json"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(d, name + ".cubin"), "wb") as f:
        f.write(hashlib.sha256(seed.encode()).digest() * 512)


def capture(tag, *froms, extra=()):
    args = ["cache", "capture", "--base", LAY + ":base", "-t", LAY + ":" + tag, "--gpu-file", T4,
            "--source-date-epoch", SDE, "-o", "json"] + list(extra)
    for fr in froms:
        args += ["--from", os.path.join(fr, "io.triton.cache")]
    rc, out, err = gkm(*args)
    return rc, (json.loads(out) if rc == 0 else {}), err


def tags():
    with open(os.path.join(tmp, "lay", "index.json")) as f:
        return sorted(m.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
                      for m in json.load(f)["manifests"])


p1, u1 = pod("p1")
p2, u2 = pod("p2")
p3, u3 = pod("p3")
t.ok(u1 and u2 and u3 and os.path.isdir(u1), "each pod's volume is an overlay with its own upper layer",
     diag=(u1, u2, u3))
compile_kernel(p1, "mul_kernel", "one")
compile_kernel(p2, "mul_kernel", "one")
compile_kernel(p3, "mul_kernel", "other")
t.ok(os.path.exists(os.path.join(u1, "io.triton.cache/MULKERNELHASHAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/mul_kernel.cubin")),
     "the compiled kernel lands in the pod's upper layer on the node")

rc, c1, err = capture("c1", u1)
t.ok(rc == 0 and c1["addedFiles"] == 2 and c1["layers"] == 2 and c1["entryCount"] == 2,
     "capture --from a pod's upper layer: the image's layer plus one with the 2 files it added",
     diag=(c1, err))
rc, out, err = gkm("cache", "inspect", LAY + ":c1", "-o", "json", "--no-signatures")
j = json.loads(out) if rc == 0 else {}
rc2, base, _ = gkm("cache", "inspect", LAY + ":base", "-o", "json", "--no-signatures")
base = json.loads(base) if rc2 == 0 else {}
t.ok(j and j["layers"][0]["digest"] == base["layers"][0]["digest"] and
     sorted(k["name"] for k in j["scan"]["kernels"]) == ["add_kernel", "mul_kernel"],
     "the candidate reuses the base layer and holds both kernels", diag=j.get("layers"))
rc, c2, err = capture("c2", u2)
t.ok(rc == 0 and c2["digest"] == c1["digest"],
     "the same files captured from another pod give the same digest (de-duplicated)",
     diag=(c1.get("digest"), c2.get("digest"), err))
rc, c12, err = capture("c12", u1, u2)
t.ok(rc == 0 and c12["digest"] == c1["digest"], "two pods with identical files unite into that digest",
     diag=err)
before = tags()
rc, _, err = capture("c13", u1, u3)
t.ok(rc == 1 and "conflict" in err and
     "MULKERNELHASHAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/mul_kernel.cubin has other contents" in err
     and tags() == before, "files that differ at one path are a conflict naming it; nothing stored",
     diag=err)

gkm("cache", "keygen", "--output-key-prefix", os.path.join(tmp, "ci"))
rc, out, err = gkm("cache", "verify", LAY + ":c1", "--key", os.path.join(tmp, "ci.pub"))
t.ok(rc == 1 and "not signed" in err, "the candidate is unsigned: no pod mounts it yet", diag=err)
rc, out, err = gkm("cache", "promote", LAY + ":c1", "--key", os.path.join(tmp, "ci.key"),
                   "--cache", "team-a/vector-add")
rc2, _, err2 = gkm("cache", "verify", LAY + ":c1", "--key", os.path.join(tmp, "ci.pub"))
t.ok(rc == 0 and rc2 == 0 and ("spec.image: %s@%s" % (LAY, c1["digest"])) in out,
     "promote signs it and names the spec.image", diag=(out, err, err2))


def refused(name, want, prepare):
    tgt, upper = pod(name)
    prepare(tgt)
    before = tags()
    rc, _, err = capture("bad-" + name, upper)
    t.ok(rc == 1 and want in err and tags() == before, "refused, nothing stored: " + want, diag=err)


refused("rm", "it was deleted from the base cache",
        lambda m: os.unlink(os.path.join(m, "io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.ttir")))
refused("dev", "a character device",
        lambda m: (compile_kernel(m, "k", "x"), os.mknod(os.path.join(m, "io.triton.cache/null"), 0o20644, os.makedev(1, 3))))
refused("link", "a symlink (to '/etc/shadow')",
        lambda m: (compile_kernel(m, "k", "x"), os.symlink("/etc/shadow", os.path.join(m, "io.triton.cache/shadow"))))

# a pod still writing while the capture runs
tgt, upper = pod("busy")
compile_kernel(tgt, "k", "x")
stop = threading.Event()


def writer():
    with open(os.path.join(tgt, "io.triton.cache/log.bin"), "ab", buffering=0) as f:
        while not stop.is_set():
            f.write(b"x" * 100)


th = threading.Thread(target=writer)
th.start()
before = tags()
rc, _, err = capture("bad-busy", upper)
stop.set()
th.join()
t.ok(rc == 1 and ("changed while it was captured" in err or "still writing" in err) and tags() == before,
     "a volume still being written is refused, nothing stored", diag=err)

for name in ("p1", "p2", "p3", "rm", "dev", "link", "busy"):
    tgt = os.path.join(pods, name, "mount")
    node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="v-" + name, target_path=tgt),
                             timeout=30)
t.ok(not [m for m in cc.mounts() if m.startswith(tmp)], "every volume unmounted, no capture mount left")
ch.close()
cleanup()
plugin = None
sys.exit(t.finish())
