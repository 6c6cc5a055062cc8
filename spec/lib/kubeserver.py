"""Start and stop the fault-injection API server (spec/kube/apiserver.py)
from a Python test.

    from kubeserver import KubeServer
    with KubeServer(tls=True, token="t0ken") as ks:
        status, headers, body = ks.request("GET", "/api/v1/namespaces")
        ks.kubeconfig            # path of a kubeconfig for kubectl or gkm
        ks.restart()             # same port, same objects (state file), watches cut
        ks.control("compact")    # next watch from an older version gets 410
        ks.control("fault", {"stage": "watch", "action": "truncate", "count": 1})
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
    def __init__(self, tls=True, token="gkm-test-token", watch_history=None, extra_args=()):
        self.tls, self.token = tls, token
        self.opts = ["--watch-history", str(watch_history)] if watch_history is not None else []
        self.opts += list(extra_args)
        self.dir = tempfile.mkdtemp(prefix="gkm-kubeserver.")
        self.tls_dir = os.path.join(self.dir, "tls")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        self.state = os.path.join(self.dir, "state.json")
        self.log = os.path.join(self.dir, "apiserver.log")
        self.ca = os.path.join(self.tls_dir, "ca.crt") if tls else None
        self.port = 0
        self.proc = None
        atexit.register(self.stop)

    def start(self, timeout=30):
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        cmd = [PYTHON, SERVER, "--port", str(self.port), "--port-file", port_file, "--crds", CRDS,
               "--kubeconfig", self.kubeconfig, "--state", self.state] + self.opts
        if self.tls:
            cmd += ["--tls-dir", self.tls_dir]
        if self.token:
            cmd += ["--token", self.token]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the test API server did not start: " + self.tail())
            time.sleep(0.05)
        with open(port_file) as fh:
            self.port = int(fh.read())
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

    def cleanup(self):
        self.stop()
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

    def request(self, method, path, body=None, content_type="application/json"):
        """One request; returns (status, headers dict, parsed JSON or text)."""
        if self.tls:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30,
                                               context=ssl.create_default_context(cafile=self.ca))
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            body = body if isinstance(body, (bytes, str)) else json.dumps(body)
            h["Content-Type"] = content_type
        try:
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            out = json.loads(data) if data else None
        except ValueError:
            out = data.decode("utf-8", "replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, out

    def control(self, what, body=None):
        st, _h, out = self.request("POST", "/_test/" + what, body or {})
        if st != 200:
            raise RuntimeError("test control %s failed: %s %s" % (what, st, out))
        return out
