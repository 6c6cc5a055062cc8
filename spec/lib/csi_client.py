"""Shared pieces of the CSI end-to-end test and benchmark: Python stubs
generated from csi/csi.proto at run time, a fabricated agent layout (store
entries, views with ready.json), and the `gkm csi` daemon in temp dirs.

Uses Debian's python3-grpcio and python3-grpc-tools (run with /usr/bin/python3).
"""
import hashlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")


def load_stubs(outdir):
    """Generate csi_pb2 / csi_pb2_grpc into outdir and import them."""
    os.makedirs(outdir, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I" + os.path.join(ROOT, "csi"), "-I/usr/include",
         "--python_out=" + outdir, "--grpc_python_out=" + outdir, os.path.join(ROOT, "csi", "csi.proto")],
        check=True)
    sys.path.insert(0, outdir)
    return importlib.import_module("csi_pb2"), importlib.import_module("csi_pb2_grpc")


def own_dir(state, key, sub):
    """A volume's own directory sub ("upper", "fallback") under the plugin's
    state directory: (its path, the root of the mount it is on as findmnt
    names a bind of it). With a size limit (the default) it lives on the
    volume's loop-mounted layer, ROOT/csi/volumes/<key>/layer."""
    vdir = os.path.join(state, "csi", "volumes", key)
    if os.path.isdir(os.path.join(vdir, "layer", sub)):
        return os.path.join(vdir, "layer", sub), "/" + sub
    return os.path.join(vdir, sub), os.path.join(vdir, sub)


def mounts():
    """{mount point: (per-mount options, fs type)} from /proc/self/mountinfo (last wins)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields = left.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out[point] = (fields[5], right.split()[0])
    return out


def mount_count(path):
    n = 0
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == path:
                n += 1
    return n


def unmount_below(top):
    """Best-effort clean-up of every mount under top, deepest first."""
    for point in sorted((p for p in mounts() if p == top or p.startswith(top + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], stderr=subprocess.DEVNULL)


def mount_permitted(tmp):
    """None when bind mounts work here, else the reason they do not."""
    src, dst = os.path.join(tmp, "probe-src"), os.path.join(tmp, "probe-dst")
    os.makedirs(src, exist_ok=True)
    os.makedirs(dst, exist_ok=True)
    r = subprocess.run(["mount", "--bind", src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        return "mount(2) not permitted here: " + (r.stderr.strip() or "exit %d" % r.returncode)
    subprocess.run(["umount", dst])
    os.rmdir(src)
    os.rmdir(dst)
    return None


class Layout:
    """The agent's on-node files, written the way core/cache/cache_view.h documents."""

    def __init__(self, root):
        self.root = root
        os.makedirs(os.path.join(root, "store", "sha256"), exist_ok=True)

    def store_entry(self, files):
        """Create a store entry holding files {relpath: bytes}; return its digest."""
        h = hashlib.sha256(json.dumps(sorted((k, v.hex()) for k, v in files.items())).encode()).hexdigest()
        entry = os.path.join(self.root, "store", "sha256", h)
        for rel, data in files.items():
            p = os.path.join(entry, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
        os.makedirs(entry, exist_ok=True)
        return "sha256:" + h

    def view(self, ns, name, digest, state="Ready", compatible=True, reason="", message="",
             link=None, ready_text=None, data=True):
        """A view as the agent leaves it: the record (ready.json) and, with
        data, the data link (to digest's store entry unless link says where).
        digest None: a record without one (a cache not resolved yet)."""
        d = os.path.join(self.root, "caches", ns or "_cluster", name)
        os.makedirs(d, exist_ok=True)
        data_link = os.path.join(d, "data")
        if os.path.lexists(data_link):
            os.unlink(data_link)
        if data:
            os.symlink(link or "../../../store/sha256/" + digest[7:], data_link)
        record = {"state": state, "compatible": compatible,
                  "compatibleGPUs": ["GPU-0"] if compatible and state == "Ready" else [],
                  "reason": reason, "message": message, "updated": "2024-05-01T12:00:00Z"}
        if digest:
            record["digest"] = digest
        text = ready_text if ready_text is not None else json.dumps(record)
        tmp = os.path.join(d, ".ready.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(d, "ready.json"))


class Plugin:
    """`gkm csi` running in temp dirs; stop() always leaves no process behind."""

    def __init__(self, tmp, root, run, node_id="node-1", threads=4, name="plugin", flags=None):
        """flags replaces --node-id/--root/--run-dir (to test other spellings)."""
        self.sock = os.path.join(tmp, name, "csi.sock")
        self.endpoint = "unix://" + self.sock
        self.log = os.path.join(tmp, name + ".log")
        place = flags if flags is not None else ["--node-id", node_id, "--root", root, "--run-dir", run]
        self.args = [BIN, "csi", "--endpoint", self.endpoint] + place + [
            "--health-listen", "127.0.0.1:0", "--threads", str(threads), "--drain-timeout", "20"]
        self.proc = None
        self.health_port = None

    def start(self, wait=True):
        self.logf = open(self.log, "a")
        self.log_start = self.logf.tell()
        self.proc = subprocess.Popen(self.args, stdout=self.logf, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=15):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("gkm csi exited with %d:\n%s" % (self.proc.returncode, self.tail()))
            with open(self.log) as f:
                f.seek(self.log_start)
                text = f.read()
            ports = re.findall(r"health endpoint listening port=(\d+)", text)
            if ports and "CSI node plugin ready" in text:
                self.health_port = int(ports[-1])
                return
            time.sleep(0.05)
        raise RuntimeError("gkm csi did not get ready:\n" + self.tail())

    def tail(self, n=30):
        with open(self.log) as f:
            f.seek(self.log_start)
            return "".join(f.readlines()[-n:])

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=30):
        try:
            return self.proc.wait(timeout)
        finally:
            self.logf.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.logf.close()
        return self.proc.returncode if self.proc else None


def capability(pb, mode=None):
    return pb.VolumeCapability(
        mount=pb.VolumeCapability.MountVolume(),
        access_mode=pb.VolumeCapability.AccessMode(
            mode=mode or pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))


def publish_request(pb, vid, target, cache, ns="team-a", pod_ns="team-a", pod="pod-1", uid="uid-1",
                    writable=False, extra=None, readonly=False, cap=True, mode=None):
    """An inline volume's request, as the kubelet sends it; with mode (an
    AccessMode) a PersistentVolume's (ephemeral "false")."""
    ctx = {"csi.storage.k8s.io/ephemeral": "false" if mode else "true"}
    if cache is not None:
        ctx["cacheName"] = cache
    if ns is not None:
        ctx["cacheNamespace"] = ns
    if writable is not None:
        ctx["readOnly"] = "false" if writable else "true"
    if pod_ns is not None:
        ctx["csi.storage.k8s.io/pod.namespace"] = pod_ns
    if pod is not None:
        ctx["csi.storage.k8s.io/pod.name"] = pod
        ctx["csi.storage.k8s.io/pod.uid"] = uid
    ctx.update(extra or {})
    return pb.NodePublishVolumeRequest(
        volume_id=vid, target_path=target, readonly=readonly,
        volume_capability=capability(pb, mode) if cap else None, volume_context=ctx)
