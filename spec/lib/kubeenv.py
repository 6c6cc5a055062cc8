"""A real Kubernetes control plane for tests, found the way envtest finds one.

GKM_KUBE_ASSETS names a directory holding kube-apiserver (required),
kube-controller-manager, kube-scheduler and kubelet; etcd is Debian's
etcd-server (/usr/bin/etcd, or ETCD=path); kubectl is on PATH. Where one is
missing, `unavailable()` says why and the test skips with that reason.

    from kubeenv import KubeEnv, unavailable
    why = unavailable()
    if why: tap.skip(...); sys.exit(0)
    with KubeEnv(controller_manager=True) as kube:
        kube.kubectl("get", "ns")                 # CompletedProcess, text
        kube.request("GET", "/api/v1/nodes")      # (status, body as JSON or text)
        kube.apply_crds(); kube.make_node("node-1")
        kube.stop_apiserver(); kube.start_apiserver()   # same etcd, same port
        kube.sign_cert("webhook", ["127.0.0.1"])  # a serving cert from the API server's CA

Everything lives in one temporary directory (etcd's data on tmpfs where
there is one); every process is started with PR_SET_PDEATHSIG so it dies with
this one, and stop() (also run at exit) stops exactly what was started.

spec/lib/kubenode.py adds a real node to it (containerd and the kubelet).

From a shell test, `python3 kubeenv.py serve DIR [--controller-manager]
[--scheduler] [--audit]` runs the same control plane in the foreground: it
writes DIR/env (shell assignments) once ready, answers one-line commands on the
unix socket DIR/ctl (see `serve`), stops everything on SIGTERM and exits by
itself when the shell that started it goes away. spec/lib/kubeenv.sh wraps it.
"""
import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from proc import free_port

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CRDS = os.path.join(ROOT, "charts", "gkm", "crds")
ETCD = os.environ.get("ETCD", "/usr/bin/etcd")
TOKEN = "gkm-admin-token"
AUDIT_WRITES = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
"""
AUDIT_ALL = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""


def assets():
    return os.environ.get("GKM_KUBE_ASSETS", "")


def unavailable(*binaries):
    """Why the real control plane cannot run here, or None."""
    d = assets()
    if not d:
        return "GKM_KUBE_ASSETS is not set (a directory holding kube-apiserver and friends)"
    for b in ("kube-apiserver",) + binaries:
        if not os.access(os.path.join(d, b), os.X_OK):
            return "GKM_KUBE_ASSETS has no executable %s" % b
    if not os.access(ETCD, os.X_OK):
        return "etcd is not installed (apt-get install etcd-server)"
    if not shutil.which("openssl"):
        return "openssl is not installed"
    if not shutil.which("kubectl"):
        return "kubectl is not installed (Debian 12 has no current one)"
    return None


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setpgid(0, 0)


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Processes:
    """Named child processes of a test environment: each logs to DIR/NAME.log
    and dies with this process (PR_SET_PDEATHSIG). Subclasses set self.dir
    and self.procs = {}."""

    def _spawn(self, name, cmd):
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                            preexec_fn=_die_with_parent)
        log.close()

    def _log_tail(self, name, n=20):
        try:
            with open(os.path.join(self.dir, name + ".log"), errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    def _wait(self, name, probe, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                raise RuntimeError("%s exited:\n%s" % (name, self._log_tail(name)))
            if probe():
                return
            time.sleep(0.2)
        raise RuntimeError("%s not ready after %ds:\n%s" % (name, timeout, self._log_tail(name)))

    def _stop(self, name, sig=signal.SIGTERM):
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class KubeEnv(Processes):
    def __init__(self, controller_manager=False, scheduler=False, audit=False,  # True | "all"
                 tokens=(), workdir=None, cm_controllers=None):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.bin = assets()
        self.want_cm = controller_manager
        self.want_scheduler = scheduler
        self.audit = audit
        self.cm_controllers = cm_controllers or [
            "garbagecollector", "namespace", "serviceaccount", "serviceaccount-token"]
        self.own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="gkm-kubeenv.")
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.etcd_dir = tempfile.mkdtemp(prefix="gkm-etcd.", dir=shm)
        self.pki = os.path.join(self.dir, "pki")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        self.ca = os.path.join(self.pki, "ca.crt")
        self.ca_key = os.path.join(self.pki, "ca.key")
        self.token = TOKEN
        self.extra_tokens = list(tokens)  # (token, user, uid, groups)
        self.audit_log = os.path.join(self.dir, "audit.log") if audit else None
        self.procs = {}
        self.port = free_port()
        self.url = "https://127.0.0.1:%d" % self.port
        self._ssl = None
        atexit.register(self.stop)

    # ------------------------------------------------------------------ PKI
    def _make_pki(self):
        os.makedirs(self.pki, exist_ok=True)
        p = self.pki
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                 "ca.crt", "-days", "2", "-subj", "/CN=gkm-test-ca", cwd=p)
        self.sign_cert("apiserver", ["127.0.0.1", "localhost"])
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=p)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=p)
        with open(os.path.join(p, "tokens.csv"), "w") as fh:
            fh.write('%s,admin,admin-uid,"system:masters"\n' % TOKEN)
            for tok, user, uid, groups in self.extra_tokens:
                fh.write('%s,%s,%s,"%s"\n' % (tok, user, uid, ",".join(groups)))
        self.write_kubeconfig(self.kubeconfig, TOKEN)

    def sign_cert(self, name, hosts):
        """A serving certificate for hosts (IPs or DNS names) signed by the
        API server's CA: PKI/name.crt and PKI/name.key. Returns (crt, key)."""
        p = self.pki
        san = ",".join(("IP:" if h.replace(".", "").isdigit() else "DNS:") + h for h in hosts)
        ext = os.path.join(p, name + ".ext")
        with open(ext, "w") as fh:
            fh.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % san)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".csr", "-subj", "/CN=" + hosts[0], cwd=p)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", name + ".crt", cwd=p)
        return os.path.join(p, name + ".crt"), os.path.join(p, name + ".key")

    def write_kubeconfig(self, path, token):
        with open(path, "w") as fh:
            json.dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "test",
                "clusters": [{"name": "test", "cluster": {
                    "server": self.url, "certificate-authority": self.ca}}],
                "users": [{"name": "test", "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            }, fh)
        return path

    def _start_etcd(self):
        self.etcd_port, peer, metrics = free_port(), free_port(), free_port()
        c = "http://127.0.0.1:%d" % self.etcd_port
        pu = "http://127.0.0.1:%d" % peer
        self._spawn("etcd", [ETCD, "--name", "t", "--data-dir", self.etcd_dir,
                             "--listen-client-urls", c, "--advertise-client-urls", c,
                             "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
                             "--initial-cluster", "t=" + pu,
                             "--listen-metrics-urls", "http://127.0.0.1:%d" % metrics])

        def healthy():
            try:
                with urllib.request.urlopen(c + "/health", timeout=1) as r:
                    return b'"true"' in r.read()
            except OSError:
                return False
        self._wait("etcd", healthy, 30)

    def start_apiserver(self, timeout=90):
        cmd = [os.path.join(self.bin, "kube-apiserver"),
               "--etcd-servers=http://127.0.0.1:%d" % self.etcd_port,
               "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
               "--secure-port=%d" % self.port,
               "--tls-cert-file=%s/apiserver.crt" % self.pki,
               "--tls-private-key-file=%s/apiserver.key" % self.pki,
               "--client-ca-file=%s/ca.crt" % self.pki,
               "--token-auth-file=%s/tokens.csv" % self.pki,
               "--authorization-mode=RBAC,Node",
               "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
               "--service-account-key-file=%s/sa.pub" % self.pki,
               "--service-account-signing-key-file=%s/sa.key" % self.pki,
               "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
               "--profiling=false", "--endpoint-reconciler-type=none"]
        if self.audit_log:
            pol = os.path.join(self.dir, "audit-policy.yaml")
            with open(pol, "w") as fh:
                fh.write(AUDIT_ALL if self.audit == "all" else AUDIT_WRITES)
            cmd += ["--audit-policy-file=" + pol, "--audit-log-path=" + self.audit_log,
                    "--audit-log-format=json", "--audit-log-mode=blocking"]
        self._spawn("kube-apiserver", cmd)
        self._wait("kube-apiserver", lambda: self._get_ok("/readyz"), timeout)

    def stop_apiserver(self, sig=signal.SIGTERM):
        self._stop("kube-apiserver", sig)

    def _start_component(self, name, extra):
        self._spawn(name, [os.path.join(self.bin, name), "--kubeconfig=" + self.kubeconfig,
                           "--bind-address=127.0.0.1", "--secure-port=%d" % free_port(),
                           "--leader-elect=false"] + extra)

    def start_controller_manager(self):
        self._start_component("kube-controller-manager", [
            "--service-account-private-key-file=%s/sa.key" % self.pki,
            "--root-ca-file=%s/ca.crt" % self.pki,
            "--use-service-account-credentials=false",
            "--controllers=" + ",".join(self.cm_controllers)])

    def start_scheduler(self):
        self._start_component("kube-scheduler", [])

    def start(self):
        try:
            self._make_pki()
            self._start_etcd()
            self.start_apiserver()
            if self.want_cm:
                self.start_controller_manager()
            if self.want_scheduler:
                self.start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop(name)
        for name in list(self.procs):
            self._stop(name)
        shutil.rmtree(self.etcd_dir, ignore_errors=True)
        if self.own_dir and not os.environ.get("KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------- clients
    def _context(self):
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self.ca)
        return self._ssl

    def request(self, method, path, body=None, content_type="application/json", token=None):
        """(status, body): body parsed as JSON where it is JSON."""
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            data = data.encode() if isinstance(data, str) else data
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + (token or self.token))
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._context(), timeout=30) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def audit_events(self):
        """The audit log's events so far (one per request, ResponseComplete
        stage; with audit="all" reads too, otherwise writes only)."""
        out = []
        with open(self.audit_log) as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
        return out

    def _get_ok(self, path):
        try:
            return self.request("GET", path)[0] == 200
        except OSError:
            return False

    def kubectl(self, *args, check=False, input=None):
        return subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig] + list(args),
                              capture_output=True, text=True, check=check, input=input)

    def get_json(self, *args):
        """`kubectl get ... -o json` as an object, None when it fails."""
        p = self.kubectl("get", *args, "-o", "json")
        return json.loads(p.stdout) if p.returncode == 0 else None

    def apply_obj(self, obj):
        """`kubectl apply` of one object."""
        return self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def apply_crds(self, path=CRDS):
        self.kubectl("apply", "--server-side", "-f", path, check=True)
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", path,
                     check=True)

    def make_namespace(self, name):
        """A namespace with the default ServiceAccount pods need (the
        controller manager makes it too, when it runs)."""
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        self.request("POST", "/api/v1/namespaces/%s/serviceaccounts" % name,
                     {"metadata": {"name": "default"}})

    def make_node(self, name, labels=None, cpu="8", memory="32Gi", pods="110"):
        """A schedulable Node with no kubelet: created, marked Ready, untainted."""
        st, node = self.request("POST", "/api/v1/nodes", {
            "metadata": {"name": name, "labels": dict({"kubernetes.io/hostname": name},
                                                       **(labels or {}))},
            "spec": {}})
        if st != 201:
            raise RuntimeError("create node %s: %s %s" % (name, st, node))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        res = {"cpu": cpu, "memory": memory, "pods": pods}
        st, node = self.request("PATCH", "/api/v1/nodes/%s/status" % name, {"status": {
            "capacity": res, "allocatable": res,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "test node", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}},
            "application/merge-patch+json")
        if st != 200:
            raise RuntimeError("node %s status: %s %s" % (name, st, node))
        taints = [t for t in node.get("spec", {}).get("taints", [])
                  if t.get("key") != "node.kubernetes.io/not-ready"]
        st, node = self.request("PATCH", "/api/v1/nodes/" + name,
                                {"spec": {"taints": taints or None}},
                                "application/merge-patch+json")
        if st != 200:
            raise RuntimeError("node %s taints: %s %s" % (name, st, node))
        return node

    def env(self):
        """Shell assignments a test sources: where the server is and how to reach it."""
        kv = {"KUBEENV_DIR": self.dir, "KUBEENV_URL": self.url, "KUBEENV_PORT": self.port,
              "KUBEENV_CA": self.ca, "KUBEENV_CA_KEY": self.ca_key, "KUBEENV_TOKEN": self.token,
              "KUBECONFIG": self.kubeconfig, "KUBEENV_AUDIT_LOG": self.audit_log or ""}
        return "".join("%s=%s\n" % (k, _shquote(str(v))) for k, v in kv.items())


def _shquote(s):
    return "'" + s.replace("'", "'\\''") + "'"


# ------------------------------------------------------------------ serve
def serve(argv):
    """Run a control plane for a shell test until SIGTERM or the parent exits.

    Commands on DIR/ctl, one per connection, answered "ok" or "error: ...":
      stop NAME | kill NAME | start NAME   (NAME: kube-apiserver, kube-controller-manager,
                                            kube-scheduler; start waits for readiness)
      node NAME [k=v,...]                  a schedulable Node with no kubelet
      namespace NAME                       a namespace with its default ServiceAccount
      cert NAME HOST...                    a serving cert signed by the CA (PKI/NAME.crt|key)
    """
    import argparse
    ap = argparse.ArgumentParser(prog="kubeenv.py serve")
    ap.add_argument("dir")
    ap.add_argument("--controller-manager", action="store_true")
    ap.add_argument("--scheduler", action="store_true")
    ap.add_argument("--audit", action="store_true")
    ap.add_argument("--no-crds", action="store_true")
    a = ap.parse_args(argv)
    parent = os.getppid()
    os.makedirs(a.dir, exist_ok=True)
    kube = KubeEnv(controller_manager=a.controller_manager, scheduler=a.scheduler,
                   audit=a.audit, workdir=a.dir)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    ctl_path = os.path.join(a.dir, "ctl")
    try:
        kube.start()
        if not a.no_crds:
            kube.apply_crds()
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(ctl_path)
        srv.listen(4)
        srv.settimeout(0.5)
        with open(os.path.join(a.dir, "env.tmp"), "w") as fh:
            fh.write(kube.env())
        os.rename(os.path.join(a.dir, "env.tmp"), os.path.join(a.dir, "env"))
        while not stopping and os.getppid() == parent:
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            except InterruptedError:
                continue
            with conn:
                line = conn.makefile().readline().split()
                conn.sendall((_command(kube, line) + "\n").encode())
    except Exception as e:  # noqa: BLE001 - reported to the shell test, then stop
        with open(os.path.join(a.dir, "error"), "w") as fh:
            fh.write(str(e))
    finally:
        kube.stop()


def _command(kube, words):
    starters = {"kube-apiserver": kube.start_apiserver,
                "kube-controller-manager": kube.start_controller_manager,
                "kube-scheduler": kube.start_scheduler}
    try:
        cmd, args = words[0], words[1:]
        if cmd in ("stop", "kill"):
            kube._stop(args[0], signal.SIGTERM if cmd == "stop" else signal.SIGKILL)
        elif cmd == "start":
            starters[args[0]]()
        elif cmd == "node":
            labels = dict(kv.split("=", 1) for kv in args[1].split(",")) if len(args) > 1 else {}
            kube.make_node(args[0], labels)
        elif cmd == "namespace":
            kube.make_namespace(args[0])
        elif cmd == "cert":
            kube.sign_cert(args[0], args[1:])
        else:
            return "error: unknown command " + cmd
        return "ok"
    except Exception as e:  # noqa: BLE001 - the shell test prints it
        return "error: %s" % str(e).replace("\n", " ")


def ctl(argv):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(argv[0], "ctl"))
    s.sendall((" ".join(argv[1:]) + "\n").encode())
    reply = s.makefile().readline().strip()
    print(reply)
    return 0 if reply == "ok" else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "ctl":
        sys.exit(ctl(sys.argv[2:]))
    elif len(sys.argv) > 1 and sys.argv[1] == "unavailable":
        why = unavailable(*sys.argv[2:])
        print(why or "")
        sys.exit(1 if why else 0)
    else:
        sys.exit("usage: kubeenv.py serve DIR [...] | ctl DIR COMMAND... | unavailable [BINARY...]")
