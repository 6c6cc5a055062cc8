"""Start and stop the test Kubernetes API server from a Python test.

    from kubeserver import KubeServer
    with KubeServer(tls=True, token="t0ken") as ks:
        status, headers, body = ks.request("GET", "/api/v1/namespaces")
        ks.kubeconfig            # path of a kubeconfig for kubectl or gkm
        ks.restart()             # same port, same objects (state file), watches cut
        ks.control("compact")    # next watch from an older version gets 410
        ks.control("fault", {"action": "malformed", "path": "/widgets", "count": 1})
        ks.control("requests", {"since": 0, "path": "/gkmcaches"})  # what clients sent

Every server gets its own temporary directory and a free loopback port and
is stopped (SIGTERM, then SIGKILL) by stop() or at interpreter exit.
"""
import atexit
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SERVER = os.path.join(ROOT, "spec", "kube", "apiserver.py")
CRDS = os.path.join(ROOT, "charts", "gkm", "crds")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class KubeServer:
    def __init__(self, tls=True, token="gkm-test-token", crds=True, client_ca=False,
                 watch_history=None, bookmark_interval=None, watch_timeout=None,
                 test_control=True, persist=True, extra_args=(), workdir=None):
        self.tls = tls
        self.token = token
        self.crds = crds
        self.client_ca = client_ca
        self.opts = []
        if watch_history is not None:
            self.opts += ["--watch-history", str(watch_history)]
        if bookmark_interval is not None:
            self.opts += ["--bookmark-interval", str(bookmark_interval)]
        if watch_timeout is not None:
            self.opts += ["--watch-timeout", str(watch_timeout)]
        if test_control:
            self.opts.append("--test-control")
        self.opts += list(extra_args)
        self.persist = persist
        self.own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="gkm-kubeserver.")
        self.tls_dir = os.path.join(self.dir, "tls")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        self.state = os.path.join(self.dir, "state.json")
        self.log = os.path.join(self.dir, "apiserver.log")
        self.ca = os.path.join(self.tls_dir, "ca.crt") if tls else None
        self.port = 0
        self.proc = None
        atexit.register(self.stop)

    # -------------------------------------------------------------- lifecycle
    def start(self, timeout=30):
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        cmd = [PYTHON, SERVER, "--port", str(self.port), "--port-file", port_file,
               "--kubeconfig", self.kubeconfig] + self.opts
        if self.crds:
            cmd += ["--crds", CRDS]
        if self.tls:
            cmd += ["--tls-dir", self.tls_dir]
            if self.client_ca:
                cmd.append("--client-ca")
        if self.token:
            cmd += ["--token", self.token]
        if self.persist:
            cmd += ["--state", self.state]
        self.logfh = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.logfh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(port_file):
                with open(port_file) as fh:
                    self.port = int(fh.read().strip())
                break
            if self.proc.poll() is not None:
                raise RuntimeError("test API server exited (%d): %s" % (self.proc.returncode,
                                                                         self.tail()))
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("test API server did not start: " + self.tail())
        self.url = "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.port)
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self):
        """Stop and start again on the same port with the same objects."""
        self.stop()
        return self.start()

    def kill(self):
        """Stop abruptly (SIGKILL): nothing is saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()

    def tail(self, n=4000):
        try:
            with open(self.log, "rb") as fh:
                return fh.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    # ---------------------------------------------------------------- client
    def connection(self, timeout=30):
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.ca)
            if self.client_ca:
                ctx.load_cert_chain(os.path.join(self.tls_dir, "client.crt"),
                                    os.path.join(self.tls_dir, "client.key"))
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                               context=ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, content_type="application/json",
                raw=False, conn=None):
        """One request; returns (status, headers dict, parsed JSON or text)."""
        own = conn is None
        conn = conn or self.connection()
        h = {"Accept": "application/json", "User-Agent": "gkm-spec/1"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            if isinstance(body, str):
                body = body.encode()
            h["Content-Type"] = content_type
        h.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            if own:
                conn.close()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        if raw:
            return resp.status, hdrs, data
        try:
            return resp.status, hdrs, json.loads(data) if data else None
        except ValueError:
            return resp.status, hdrs, data.decode("utf-8", "replace")

    def watch(self, path, timeout=30):
        """Open a watch; returns an iterator of decoded events (None at end)."""
        conn = self.connection(timeout=timeout)
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        conn.request("GET", path, headers=h)
        resp = conn.getresponse()
        return WatchStream(conn, resp)

    def control(self, what, body=None):
        st, _h, out = self.request("POST", "/_test/" + what, body or {})
        if st != 200:
            raise RuntimeError("test control %s failed: %s %s" % (what, st, out))
        return out


class WatchStream:
    def __init__(self, conn, resp):
        self.conn, self.resp = conn, resp
        self.status = resp.status

    def next(self):
        """The next event, or None when the server ended the stream."""
        line = self.resp.readline()
        if not line:
            return None
        return json.loads(line)

    def close(self):
        self.conn.close()


def kubectl_env(ks):
    env = dict(os.environ)
    env["KUBECONFIG"] = ks.kubeconfig
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return env
