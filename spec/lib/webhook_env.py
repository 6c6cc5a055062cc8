"""Shared pieces of the webhook end-to-end tests: a temporary directory,
certificates made with the openssl CLI, Debian's docker-registry (through
spec/lib/registry.sh), a registry that never answers, the gkm webhook daemon
with its JSON log and metrics, and AdmissionReview documents.

    import webhook_env as env
    env.init("gkm-webhook-e2e.")
    ...
    env.cleanup()          # kills what is left, removes the directory
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GKM = os.environ.get("GKM_BIN", os.path.join(ROOT, "build", "gkm"))
# the daemon under test runs in the sanitizer build when there is one
GKM_DAEMON = os.environ.get("GKM_BIN_SAN") or GKM
if not os.access(GKM_DAEMON, os.X_OK):
    GKM_DAEMON = GKM
REGISTRY_SH = os.path.join(ROOT, "spec", "lib", "registry.sh")
FIXTURE = os.path.join(ROOT, "spec", "fixtures", "caches", "triton", "cuda-sm75-vector-add")
DEADLINE_MS = 1500
ANN = "gkm.io/resolvedDigest"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
tmp = None


def init(prefix):
    global tmp
    tmp = tempfile.mkdtemp(prefix=prefix)
    return tmp


def available():
    """Why the registry tests cannot run here, or None."""
    if not os.path.exists(REGISTRY_SH) or not os.path.isdir(FIXTURE) \
            or not os.access("/usr/bin/docker-registry", os.X_OK):
        return "needs spec/lib/registry.sh, the Triton fixture cache and /usr/bin/docker-registry"
    return None


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


procs = []


def run(*args, check=True, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def path(*p):
    return os.path.join(tmp, *p)


def write(p, data, mode="w"):
    with open(p + ".tmp", mode) as f:
        f.write(data)
    os.replace(p + ".tmp", p)


# ---- the node agent ----

def agent_entries(images, flags, want, timeout=90):
    """Run `gkm up` (standalone: a state directory, one node, a GPU file)
    with GKMCaches named for images ({name: image}) and more flags (its
    trust), until each cache's entry on the node's GKMCacheNode has the state
    want names ({name: state}) or timeout passes; the entries ({name: {...}})."""
    from proc import free_port
    state = path("agent-state")
    docs = "".join(f"---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata:\n"
                   f"  name: {name}\n  namespace: default\nspec:\n  image: {image}\n"
                   for name, image in images.items())
    write(path("agent-caches.yaml"), docs)
    run(GKM, "apply", "--state", state, "-f", path("agent-caches.yaml"))
    log = open(path("agent.log"), "w")
    up = subprocess.Popen([GKM, "up", "--state", state, "--node", "node-1", "--gpu-file",
                           os.path.join(ROOT, "spec/fixtures/gpu/inventory/mixed.json"),
                           *flags, "--poll-ms", "100", "--health-listen",
                           f"127.0.0.1:{free_port()}"], stdout=log, stderr=subprocess.STDOUT)

    def entries():
        p = run(GKM, "get", "--state", state, "gkmcn", "node-1", "-n", "default", "-o", "json",
                check=False)
        try:
            return json.loads(p.stdout)["status"]["caches"]
        except (ValueError, KeyError, TypeError):
            return {}
    try:
        end = time.time() + timeout
        got = entries()
        while time.time() < end and any(got.get(n, {}).get("state") != s for n, s in want.items()):
            time.sleep(0.3)
            got = entries()
        return {n: got.get(n, {}) for n in images}
    finally:
        up.terminate()
        up.wait(timeout=30)
        log.close()


# ---- certificates ----

def make_ca(name):
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", path(name + ".key"), "-out", path(name + ".pem"), "-days", "2",
        "-subj", "/CN=" + name)


def make_cert(ca, name, cn, ca_cert=None, ca_key=None):
    """A server certificate for 127.0.0.1 signed by CA ca (made by make_ca),
    or by the CA in the files ca_cert and ca_key."""
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", path(name + ".key"), "-out", path(name + ".csr"), "-subj", "/CN=" + cn)
    write(path("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", path(name + ".csr"), "-CA", ca_cert or path(ca + ".pem"),
        "-CAkey", ca_key or path(ca + ".key"), "-CAcreateserial", "-out", path(name + ".crt"),
        "-days", "2", "-extfile", path("san.ext"))


# ---- the registry (spec/lib/registry.sh in a shell that lives as long as its stdin) ----

class Registry:
    def __init__(self):
        script = '. "$1"; trap registry_stop_all EXIT; registry_start r || exit 1; ' \
                 'echo "$REG_r_ADDR"; read -r _'
        self.p = subprocess.Popen(["bash", "-c", script, "registry", REGISTRY_SH],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addr = self.p.stdout.readline().strip()
        if not self.addr:
            raise RuntimeError("the registry did not start")

    def stop(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=30)

    def request(self, method, url, body=None, headers=None):
        c = http.client.HTTPConnection(self.addr, timeout=10)
        c.request(method, url, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def push_blob(self, repo, data):
        """Upload data as a blob of repo (monolithic); its descriptor's digest and size."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r, _ = self.request("POST", f"/v2/{repo}/blobs/uploads/")
        loc = r.getheader("Location")
        if r.status != 202 or not loc:
            raise RuntimeError(f"blob upload not started: HTTP {r.status}")
        loc = loc.split(self.addr, 1)[-1]
        sep = "&" if "?" in loc else "?"
        r, _ = self.request("PUT", f"{loc}{sep}digest={digest}", body=data,
                            headers={"Content-Type": "application/octet-stream"})
        if r.status != 201:
            raise RuntimeError(f"blob upload: HTTP {r.status}")
        return {"digest": digest, "size": len(data)}

    def put_manifest(self, repo, ref, manifest, media_type):
        """Store manifest (a dict) under ref (a tag or its digest); its descriptor."""
        body = json.dumps(manifest).encode()
        r, _ = self.request("PUT", f"/v2/{repo}/manifests/{ref}", body=body,
                            headers={"Content-Type": media_type})
        if r.status != 201:
            raise RuntimeError(f"manifest {ref}: HTTP {r.status}")
        return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
                "size": len(body)}

    def attach_simple(self, repo, image_digest, payload, annotations):
        """A cosign simple-signing signature as cosign stores it: one layer
        (the payload) with its annotations on the sha256-<hex>.sig tag."""
        layer = self.push_blob(repo, payload)
        config = json.dumps({
            "architecture": "", "os": "", "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode()
        cfg = self.push_blob(repo, config)
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
            "layers": [{"mediaType": SIMPLE_SIGNING, **layer, "annotations": annotations}]}
        return self.put_manifest(repo, image_digest.replace(":", "-") + ".sig", manifest,
                                 OCI_MANIFEST)

    def attach_bundle(self, repo, image_digest, bundle):
        """A sigstore bundle as an OCI 1.1 referrer of the image, listed in
        the sha256-<hex> fallback index (for registries without the
        referrers API)."""
        r, _ = self.request("HEAD", f"/v2/{repo}/manifests/{image_digest}",
                            headers={"Accept": OCI_MANIFEST})
        size = int(r.getheader("Content-Length") or 0)
        mt = r.getheader("Content-Type") or OCI_MANIFEST
        layer = self.push_blob(repo, bundle)
        empty = self.push_blob(repo, b"{}")
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SIGSTORE_BUNDLE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", **empty},
            "layers": [{"mediaType": SIGSTORE_BUNDLE, **layer}],
            "subject": {"mediaType": mt, "digest": image_digest, "size": size}}
        d = self.put_manifest(repo, "sha256:" + hashlib.sha256(
            json.dumps(manifest).encode()).hexdigest(), manifest, OCI_MANIFEST)
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
                 "manifests": [{**d, "artifactType": SIGSTORE_BUNDLE}]}
        return self.put_manifest(repo, image_digest.replace(":", "-"), index, OCI_INDEX)

    def digest(self, repo, tag):
        r, _ = self.request("HEAD", f"/v2/{repo}/manifests/{tag}", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
                      "application/vnd.docker.distribution.manifest.v2+json"})
        return r.getheader("Docker-Content-Digest")


class Blackhole:
    """A 'registry' that accepts connections and never answers."""

    def __init__(self):
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(16)
        self.addr = "127.0.0.1:%d" % self.s.getsockname()[1]
        self.conns = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.s.close()
        for c in self.conns:
            c.close()


# ---- the webhook ----

class Webhook:
    def __init__(self, *flags):
        self.log = open(path("webhook.log"), "w+")
        args = [GKM_DAEMON, "webhook", "--listen", "127.0.0.1:0", "--health-listen",
                "127.0.0.1:0", "--log-format", "json", "--reload-interval-ms", "200",
                "--deadline-ms", str(DEADLINE_MS), *flags]
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:exitcode=99")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        procs.append(self.p)
        self.port = self.health = None
        line = self.wait_log(lambda j: j.get("msg") == "webhook serving", 30)
        if not line:
            raise RuntimeError("webhook did not start:\n" + self.read_log())
        self.port, self.health = int(line["https_port"]), int(line["health_port"])

    def read_log(self):
        with open(path("webhook.log")) as f:
            return f.read()

    def log_lines(self):
        out = []
        for line in self.read_log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out

    def mark(self):
        """The log position; wait_log(after=mark) looks only at later lines."""
        return len(self.log_lines())

    def wait_log(self, pred, timeout, after=0):
        end = time.time() + timeout
        while time.time() < end:
            for j in self.log_lines()[after:]:
                if pred(j):
                    return j
            if self.p.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name, **labels):
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pat = re.compile(re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "")
                         + r" ([0-9.e+-]+)$", re.M)
        m = pat.search(self.metrics())
        return float(m.group(1)) if m else 0.0

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout=30)


def tls_context(ca):
    ctx = ssl.create_default_context(cafile=path(ca + ".pem"))
    ctx.check_hostname = True
    return ctx


def review(image, op="CREATE", kind="GKMCache", group="gkm.io", annotations=None, old=None,
           uid="4b5f8a9e-0001", obj=None, namespace="team-a"):
    """An AdmissionReview of a cache (namespace "" for a ClusterGKMCache)."""
    meta = {"name": "llama"}
    if namespace:
        meta["namespace"] = namespace
    if annotations is not None:
        meta["annotations"] = annotations
    if obj is None:
        obj = {"apiVersion": "gkm.io/v1alpha1", "kind": kind, "metadata": meta,
               "spec": {"image": image}}
    req = {"uid": uid, "kind": {"group": group, "version": "v1alpha1", "kind": kind},
           "resource": {"group": group, "version": "v1alpha1",
                        "resource": "gkmcaches" if namespace else "clustergkmcaches"},
           "name": "llama", "operation": op, "object": obj, "oldObject": old, "dryRun": False}
    if namespace:
        req["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def post(wh, urlpath, body, ca="ca", timeout=10):
    """POST over a fresh verified TLS connection: (status, decoded JSON or text, peer cert sha256)."""
    c = http.client.HTTPSConnection("127.0.0.1", wh.port, context=tls_context(ca), timeout=timeout)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    c.request("POST", urlpath, body=data, headers={"Content-Type": "application/json"})
    peer = hashlib.sha256(c.sock.getpeercert(binary_form=True)).hexdigest()
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(raw), peer
    except ValueError:
        return r.status, raw, peer


def decide(wh, image, endpoint="/mutate", **kw):
    status, doc, _ = post(wh, endpoint, review(image, **kw))
    if status != 200 or not isinstance(doc, dict):
        raise RuntimeError(f"HTTP {status}: {doc}")
    return doc["response"]
