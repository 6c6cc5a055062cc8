"""A real Kubernetes node for tests: containerd and the kubelet from
GKM_KUBE_ASSETS, registering a Node with a KubeEnv control plane.

    from kubeenv import KubeEnv
    from kubenode import KubeNode, unavailable
    why = unavailable()                       # None, or why no node can run here
    with KubeEnv() as kube, KubeNode(kube, "node-1") as node:
        node.root_dir                         # the kubelet's --root-dir (a temp dir)
        node.plugin_dir("csi.example.io")     # ROOT/plugins/csi.example.io
        node.register_plugin("csi.example.io", sock)   # csi-node-driver-registrar

The node runs as root on loopback: containerd with its own root, state and
socket (cgroupfs, no systemd), a sandbox image and a busybox image built here
from busybox-static and imported as OCI archives (nothing is pulled), a
loopback-only CNI config so that the runtime reports its network ready, and
a kubelet with its root in the temporary directory, talking to the API
server with the admin token. Pods must use
hostNetwork, nodeName and automountServiceAccountToken: false, and the image
`KubeNode.BUSYBOX` with imagePullPolicy Never.

What a node like this can and cannot do: the kubelet registers the Node, runs
volume managers and CSI plugins for real (registration, NodePublishVolume with
the pod's identity, NodeUnpublishVolume after deletion, FailedMount events),
but runc cannot start the kubelet's pod sandboxes on these machines, so pods
stay ContainerCreating once their volumes are mounted.

stop() (also run at exit) stops every process it started, unmounts what is
left below its directory, and removes the directories that the kubelet and
containerd create at fixed places whatever their flags (FIXED_DIRS) when they
were not there before. Every process dies with the test (PR_SET_PDEATHSIG).
"""
import atexit
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile

from csi_client import unmount_below
from kubeenv import Processes, assets
from proc import free_port

BINARIES = ("containerd", "containerd-shim-runc-v2", "runc", "ctr")
CNI_BIN = "/usr/lib/cni"
BUSYBOX_BIN = "/bin/busybox"
# Directories a v1.26 kubelet creates at fixed places whatever its --root-dir.
FIXED_DIRS = ("/var/log/pods", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet",
              "/run/containerd")


def unavailable():
    """Why a node cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root (containerd, the kubelet and CSI mounts need root)"
    for b in BINARIES:
        if not shutil.which(b):
            return "%s is not installed (apt-get install containerd runc)" % b
    if not os.access(os.path.join(CNI_BIN, "loopback"), os.X_OK):
        return "no CNI plugins in %s (apt-get install containernetworking-plugins)" % CNI_BIN
    if not os.access(BUSYBOX_BIN, os.X_OK):
        return "busybox is not installed (apt-get install busybox-static)"
    for b in ("kubelet", "csi-node-driver-registrar"):
        if not os.access(os.path.join(assets(), b), os.X_OK):
            return "GKM_KUBE_ASSETS has no executable %s" % b
    return None


# ---------------------------------------------------------------- images
def _tar_bytes(entries):
    """An uncompressed tar of (name, data or None for a directory, link)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, link in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            if link:
                ti.type, ti.linkname = tarfile.SYMTYPE, link
            elif data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            else:
                ti.size, ti.mode = len(data), 0o755
            tar.addfile(ti, io.BytesIO(data) if data else None)
    return buf.getvalue()


def _sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(path, images):
    """Write an OCI image layout tar holding images {name: entrypoint}, all on
    one layer: busybox-static at /bin/busybox with /bin/sh and /bin/sleep."""
    with open(BUSYBOX_BIN, "rb") as fh:
        busybox = fh.read()
    layer = _tar_bytes([("bin", None, None), ("bin/busybox", busybox, None),
                        ("bin/sh", None, "busybox"), ("bin/sleep", None, "busybox"),
                        ("tmp", None, None)])
    layer_gz = gzip.compress(layer, mtime=0)
    blobs = {_sha(layer_gz): layer_gz}
    manifests = []
    for name, entrypoint in images.items():
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [_sha(layer)]}}).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": _sha(config), "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": _sha(layer_gz), "size": len(layer_gz)}]}).encode()
        blobs[_sha(config)] = config
        blobs[_sha(manifest)] = manifest
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                          "digest": _sha(manifest), "size": len(manifest),
                          "platform": {"architecture": "amd64", "os": "linux"},
                          "annotations": {"io.containerd.image.name": name,
                                          "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}})
    index = json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()
    entries = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', None), ("index.json", index, None),
               ("blobs", None, None), ("blobs/sha256", None, None)]
    entries += [("blobs/sha256/" + d[7:], b, None) for d, b in blobs.items()]
    with open(path, "wb") as fh:
        fh.write(_tar_bytes(entries))


# ----------------------------------------------------------------- configs
CONTAINERD_CONFIG = """version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{d}/cni"
"""

CNI_CONFIG = {"cniVersion": "0.4.0", "name": "gkm-test-loopback", "plugins": [{"type": "loopback"}]}


def _kubelet_config(port, healthz):
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False, "resolvConf": "", "serializeImagePulls": False,
        # a loaded build machine must not evict the test's pods
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "2s", "syncFrequency": "5s",
        "fileCheckFrequency": "60s", "httpCheckFrequency": "60s",
    }


class KubeNode(Processes):
    PAUSE = "gkm.test/pause:1"
    BUSYBOX = "gkm.test/busybox:1"

    def __init__(self, kube, name="node-1", workdir=None):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.kube = kube
        self.name = name
        self.bin = assets()
        self.own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="gkm-kubenode.")
        self.root_dir = os.path.join(self.dir, "kubelet")
        self.sock = os.path.join(self.dir, "containerd.sock")
        self.procs = {}
        self.before = {d: os.path.exists(d) for d in FIXED_DIRS}
        atexit.register(self.stop)

    def plugin_dir(self, driver):
        return os.path.join(self.root_dir, "plugins", driver)

    def registration_dir(self):
        return os.path.join(self.root_dir, "plugins_registry")

    # ------------------------------------------------------------ processes
    def ctr(self, *args):
        """ctr on this node's containerd, in the kubelet's namespace (k8s.io)."""
        return subprocess.run(["ctr", "--address", self.sock, "--namespace", "k8s.io"] + list(args),
                              capture_output=True, text=True, check=True).stdout

    def _start_containerd(self):
        d = self.dir
        os.makedirs(os.path.join(d, "cni"), exist_ok=True)
        with open(os.path.join(d, "cni", "10-loopback.conflist"), "w") as fh:
            json.dump(CNI_CONFIG, fh)
        conf = os.path.join(d, "containerd.toml")
        with open(conf, "w") as fh:
            fh.write(CONTAINERD_CONFIG.format(d=d, pause=self.PAUSE, cni=CNI_BIN))
        self._spawn("containerd", ["containerd", "--config", conf])

        def up():
            try:
                self.ctr("version")
                return True
            except subprocess.CalledProcessError:
                return False
        self._wait("containerd", up, 30)
        archive = os.path.join(d, "images.tar")
        oci_archive(archive, {self.PAUSE: ["/bin/sleep", "2147483647"], self.BUSYBOX: ["/bin/sh"]})
        self.ctr("images", "import", "--no-unpack", archive)

    def _start_kubelet(self):
        d = self.dir
        os.makedirs(self.root_dir, exist_ok=True)
        kubeconfig = self.kube.write_kubeconfig(os.path.join(d, "kubelet.kubeconfig"),
                                                self.kube.token)
        conf = os.path.join(d, "kubelet.yaml")
        with open(conf, "w") as fh:
            json.dump(_kubelet_config(free_port(), free_port()), fh)
        self._spawn("kubelet", [
            os.path.join(self.bin, "kubelet"), "--config=" + conf, "--kubeconfig=" + kubeconfig,
            "--container-runtime-endpoint=unix://" + self.sock,
            "--root-dir=" + self.root_dir, "--cert-dir=" + os.path.join(d, "kubelet-pki"),
            "--hostname-override=" + self.name, "--v=2"])
        self._wait("kubelet", self.ready, 60)

    def ready(self):
        """The Node exists and its Ready condition is True."""
        st, node = self.kube.request("GET", "/api/v1/nodes/" + self.name)
        if st != 200:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node.get("status", {}).get("conditions", []))

    def register_plugin(self, driver, sock, timeout=30):
        """csi-node-driver-registrar for the plugin listening on sock; waits
        until the Node's CSINode lists the driver."""
        name = "registrar-" + driver
        self._spawn(name, [
            os.path.join(self.bin, "csi-node-driver-registrar"), "--v=2",
            "--csi-address=" + sock, "--kubelet-registration-path=" + sock,
            "--plugin-registration-path=" + self.registration_dir()])

        def listed():
            st, o = self.kube.request("GET", "/apis/storage.k8s.io/v1/csinodes/" + self.name)
            return st == 200 and any(x["name"] == driver for x in o["spec"].get("drivers") or [])
        self._wait(name, listed, timeout)

    def start(self):
        try:
            self._start_containerd()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for name in [n for n in self.procs if n.startswith("registrar-")] + ["kubelet"]:
            self._stop(name)
        for name in list(self.procs):
            self._stop(name)
        unmount_below(self.dir)
        for d, existed in self.before.items():
            if not existed:
                shutil.rmtree(d, ignore_errors=True)
        if self.own_dir and not os.environ.get("KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.before = {}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
