#!/usr/bin/python3
"""A Kubernetes API server that fails on demand, for tests.

Suites run on the real control plane (spec/lib/kubeenv.py, GKM_KUBE_ASSETS)
wherever they can. This server is for what a real one cannot be made to do
when a test wants it, over HTTP(S) with a bearer token:

    POST /_test/fault {"stage": "request", "action": "status:503",
                       "method": "GET", "path": "watch=1", "count": 3}
        the next count requests whose method is method and whose path and
        query contain path fail so; actions by stage:
          request:  status:CODE (a Status; 429 and 503 with Retry-After: 1),
                    delay:MS (answered that much later), drop (connection closed)
          response: malformed (half of the body, then junk), truncate (cut short)
          watch:    malformed (a broken line after the first event),
                    truncate (the second event cut in half, then the stream)
    POST /_test/clear-faults
    POST /_test/compact          watches from a version before now get 410 Gone
    POST /_test/close-watches    every open watch stream ends
    POST /_test/requests {"since": SEQ, "path": SUBSTRING}
        the requests clients sent: seq, time, method, path, query,
        contentType, userAgent, fieldManager, watch, status; and "next"

Otherwise it keeps objects the way a client sees them: the built-in kinds in
kobjects.BUILTIN and the custom resources of --crds; create, get, list
(selectors, pages), watch (resume from a version, 410 once the history is
gone), update, merge patch, server-side apply, delete; discovery for kubectl.
--state keeps the objects across a restart.

    apiserver.py --port 0 --port-file F --crds DIR [--tls-dir D] [--token T]
"""
import argparse
import base64
import collections
import json
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kobjects  # noqa: E402
import kstore  # noqa: E402
from kobjects import ApiError  # noqa: E402

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-gkm-test", "platform": "linux/amd64"}


class Server:
    """What the request handlers share."""

    def __init__(self, args):
        self.args = args
        self.store = kstore.Store(history=args.watch_history)
        self.objects = kobjects.Objects(self.store)
        self.types = {}     # (group, version, plural) -> Resource
        for rt in kobjects.BUILTIN + [r for d in args.crds for r in kobjects.crd_resources(d)]:
            self.types[(rt.group, rt.version, rt.plural)] = rt
        if args.state and os.path.exists(args.state):
            self.store.load(args.state)
        ns = self.types[("", "v1", "namespaces")]
        for name in ("default", "kube-system"):
            if self.store.get(ns.storage, name) is None:
                self.objects.create(ns, "", {"metadata": {"name": name}})
        self.lock = threading.Lock()    # faults and the request log
        self.faults = []
        self.requests = collections.deque(maxlen=100000)
        self.seq = 0

    def take_fault(self, stage, method, path):
        with self.lock:
            for f in self.faults:
                if f["stage"] == stage and f["method"] in ("", method) and f["path"] in path:
                    f["count"] -= 1
                    if f["count"] <= 0:
                        self.faults.remove(f)
                    return f["action"]
        return None

    def record(self, method, url, headers, status):
        q = urllib.parse.parse_qs(url.query)
        with self.lock:
            self.seq += 1
            self.requests.append({
                "seq": self.seq, "time": time.time(), "method": method, "path": url.path,
                "query": url.query, "contentType": headers.get("Content-Type", ""),
                "userAgent": headers.get("User-Agent", ""),
                "fieldManager": (q.get("fieldManager") or [""])[0],
                "watch": (q.get("watch") or [""])[0] in ("1", "true"), "status": status})

    def control(self, what, req):
        """A /_test/ request: the JSON answer."""
        if what == "fault":
            f = {"stage": req.get("stage", "request"), "action": req["action"],
                 "path": req.get("path", ""), "method": req.get("method", ""),
                 "count": int(req.get("count", 1))}
            with self.lock:
                self.faults.append(f)
            return f
        if what == "clear-faults":
            with self.lock:
                self.faults.clear()
        elif what == "compact":
            self.store.compact()
        elif what == "close-watches":
            self.store.close_watches()
        elif what == "requests":
            with self.lock:
                return {"next": self.seq, "requests": [
                    r for r in self.requests
                    if r["seq"] > int(req.get("since", 0)) and req.get("path", "") in r["path"]]}
        else:
            raise ApiError(404, "no test control " + what)
        return {}

    def resolve(self, segs):
        """(resource, namespace, name, subresource) of the path segments of
        /api/V/[namespaces/NS/]PLURAL[/NAME[/status]] or /apis/G/V/..."""
        if segs[:1] == ["api"]:
            group, version, rest = "", segs[1], segs[2:]
        elif segs[:1] == ["apis"]:
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2:] != ["status"]:
            ns, rest = rest[1], rest[2:]
        rt = self.types.get((group, version, rest[0]))
        name, sub = (rest + ["", ""])[1:3]
        if rt is None or len(rest) > 3 or (ns and not rt.namespaced) or sub not in ("", "status") \
                or (sub and not rt.status):
            raise ApiError(404, "the server could not find the requested resource")
        return rt, ns, name, sub

    # ---------------------------------------------------------- discovery
    def groups(self):
        out = {}
        for rt in self.types.values():
            if rt.group and rt.version not in out.setdefault(rt.group, []):
                out[rt.group].append(rt.version)
        return out

    def group(self, name, versions):
        vs = [{"groupVersion": "%s/%s" % (name, v), "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": vs,
                "preferredVersion": vs[0]}

    def discovery(self, segs):
        """The discovery document at /api, /apis, /apis/G, /api/V or /apis/G/V."""
        groups = self.groups()
        if segs == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if segs == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1",
                    "groups": [self.group(g, vs) for g, vs in sorted(groups.items())]}
        if len(segs) == 2 and segs[0] == "apis":
            if segs[1] not in groups:
                raise ApiError(404, "the server could not find the requested resource")
            return self.group(segs[1], groups[segs[1]])
        group, version = ("", segs[1]) if segs[0] == "api" else (segs[1], segs[2])
        res = []
        for rt in self.types.values():
            if (rt.group, rt.version) == (group, version):
                res.append(rt.entry())
                if rt.status:
                    res.append({"name": rt.plural + "/status", "singularName": "", "kind": rt.kind,
                                "namespaced": rt.namespaced, "verbs": ["get", "patch", "update"]})
        if not res:
            raise ApiError(404, "the server could not find the requested resource")
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "%s/%s" % (group, version) if group else version, "resources": res}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gkm-test-apiserver"
    api = None      # the Server, set by main()

    def log_message(self, fmt, *args):
        if self.api.args.verbose:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def send_response(self, code, message=None):
        self.status_sent = code
        super().send_response(code, message)

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def dispatch(self):
        api = self.api
        url = urllib.parse.urlsplit(self.path)
        self.status_sent, self.recorded = 0, False
        try:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            token = api.args.token
            if token and self.headers.get("Authorization") != "Bearer " + token and \
                    url.path not in ("/version", "/healthz", "/readyz", "/livez"):
                raise ApiError(401, "Unauthorized")
            if url.path.startswith("/_test/"):
                req = json.loads(body) if body.strip() else {}
                return self.send_json(200, api.control(url.path[len("/_test/"):], req))
            fault = api.take_fault("request", self.command, self.path)
            if fault and fault.startswith("status:"):
                code = int(fault.split(":")[1])
                raise ApiError(code, "injected failure",
                               headers=[("Retry-After", "1")] if code in (429, 503) else [])
            if fault == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault and fault.startswith("delay:"):
                time.sleep(int(fault.split(":")[1]) / 1000.0)
            params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
            self.route(url.path, params, body)
        except ApiError as e:
            self.send_json(e.code, e.status(), e.headers)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a 500 rather than a dead server
            traceback.print_exc()
            self.send_json(500, ApiError(500, "Internal error occurred: %s" % e).status())
        finally:
            if not url.path.startswith("/_test/") and not self.recorded:
                api.record(self.command, url, self.headers, self.status_sent)

    def route(self, path, params, body):
        api = self.api
        segs = [s for s in path.split("/") if s]
        if path == "/version":
            return self.send_json(200, VERSION)
        if path in ("/healthz", "/readyz", "/livez"):
            return self.send_json(200, None, text="ok")
        if segs[:1] == ["api"] and len(segs) <= 2 or segs[:1] == ["apis"] and len(segs) <= 3:
            if self.command != "GET":
                raise ApiError(405, "the server does not allow this method on the requested resource")
            return self.send_json(200, api.discovery(segs))
        rt, ns, name, sub = api.resolve(segs)
        ct = self.headers.get("Content-Type", "application/json")
        verb = self.command
        if verb == "GET" and params.get("watch") in ("1", "true"):
            if name:
                params["fieldSelector"] = ",".join(filter(None, [params.get("fieldSelector"),
                                                                 "metadata.name=" + name]))
            return self.watch(rt, ns, params)
        if verb == "GET" and name:
            return self.send_json(200, api.objects.get(rt, ns, name))
        if verb == "GET":
            items, meta = api.objects.list(rt, ns, params)
            return self.send_json(200, {"kind": rt.kind + "List", "apiVersion": rt.api_version,
                                        "metadata": meta, "items": items})
        if verb == "POST" and not name:
            return self.send_json(201, api.objects.create(rt, ns, kobjects.parse(body, ct)))
        if verb == "PUT" and name:
            return self.send_json(200, api.objects.update(rt, ns, name, sub, kobjects.parse(body, ct)))
        if verb == "PATCH" and name:
            obj, code = api.objects.patch(rt, ns, name, sub, body, ct, params)
            return self.send_json(code, obj)
        if verb == "DELETE" and name and not sub:
            return self.send_json(200, api.objects.delete(rt, ns, name))
        raise ApiError(405, "the server does not allow this method on the requested resource")

    # ------------------------------------------------------------ answers
    def send_json(self, code, obj, headers=(), text=None):
        body = (text if text is not None else json.dumps(obj, separators=(",", ":"))).encode()
        fault = self.api.take_fault("response", self.command, self.path)
        if fault == "malformed":
            body = body[: max(1, len(body) // 2)] + b"}{"
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if text is None else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for h, v in headers:
            self.send_header(h, v)
        self.end_headers()
        if fault == "truncate":
            self.wfile.write(body[: len(body) // 2])
            self.hang_up()
        else:
            self.wfile.write(body)

    def hang_up(self):
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def watch(self, rt, ns, params):
        """A watch stream: chunked JSON lines, one per event, until
        timeoutSeconds (or --watch-timeout), the client leaves or a test ends it."""
        api, store = self.api, self.api.store
        match = kobjects.selector(params)
        in_ns = lambda o: not ns or o["metadata"].get("namespace") == ns  # noqa: E731
        w = kstore.Watcher(lambda o: in_ns(o) and match(o))
        rv = params.get("resourceVersion", "")
        known = store.watch(rt.storage, w, rv)
        self.send_response(200)
        self.recorded = True
        api.record(self.command, urllib.parse.urlsplit(self.path), self.headers, 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not known:
            gone = ApiError(410, "too old resource version: %s (%d)" % (rv, store.floor))
            self.chunk(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        fault = api.take_fault("watch", self.command, self.path)
        deadline = time.monotonic() + float(params.get("timeoutSeconds") or api.args.watch_timeout)
        sent = 0
        try:
            while time.monotonic() < deadline:
                try:
                    item = w.q.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    continue
                if item is None:        # /_test/close-watches
                    return self.hang_up()
                line = json.dumps({"type": item[0], "object": item[1]}, separators=(",", ":")).encode()
                if sent and fault == "truncate":
                    self.wfile.write(b"%x\r\n%s" % (len(line) + 1, line[: len(line) // 2]))
                    return self.hang_up()
                if sent and fault == "malformed":
                    self.chunk(b'{"type":"MODIFIED","object":{"kind"\n')
                    fault = None
                self.chunk(line + b"\n")
                sent += 1
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            store.unwatch(rt.storage, w)


# ------------------------------------------------------------------ start

def make_certs(d):
    """A CA and a certificate for 127.0.0.1 and localhost it signed (openssl)."""
    os.makedirs(d, exist_ok=True)
    if os.path.exists(os.path.join(d, "server.crt")):
        return

    def run(*cmd):
        subprocess.run(cmd, cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(os.path.join(d, "server.ext"), "w") as fh:
        fh.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=gkm-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "server.ext")


def write_kubeconfig(path, server, tls_dir, token):
    cluster = {"server": server}
    if tls_dir:
        with open(os.path.join(tls_dir, "ca.crt"), "rb") as fh:
            cluster["certificate-authority-data"] = base64.b64encode(fh.read()).decode()
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "gkm-test",
           "clusters": [{"name": "gkm-test", "cluster": cluster}],
           "users": [{"name": "gkm-test", "user": {"token": token} if token else {}}],
           "contexts": [{"name": "gkm-test", "context": {"cluster": "gkm-test", "user": "gkm-test",
                                                         "namespace": "default"}}]}
    with open(path + ".tmp", "w") as fh:
        json.dump(cfg, fh, indent=1)
    os.replace(path + ".tmp", path)


class Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, addr, ssl_ctx):
        self.ssl_ctx = ssl_ctx
        super().__init__(addr, Handler)

    def get_request(self):
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_ctx is not None:
            sock = self.ssl_ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--port-file", help="write the port here once listening")
    ap.add_argument("--crds", action="append", default=[],
                    help="a file or directory of CustomResourceDefinitions to serve")
    ap.add_argument("--tls-dir", help="serve HTTPS; certificates are made here with openssl")
    ap.add_argument("--token", help="require this bearer token")
    ap.add_argument("--kubeconfig", help="write a kubeconfig for this server here")
    ap.add_argument("--watch-history", type=int, default=10000,
                    help="events kept per resource for watches to resume from (older: 410 Gone)")
    ap.add_argument("--watch-timeout", type=float, default=1800.0,
                    help="seconds a watch lasts when the client sets no timeoutSeconds")
    ap.add_argument("--state", help="load objects from this file at start, save them at exit")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    api = Server(args)
    ctx = None
    if args.tls_dir:
        make_certs(args.tls_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(args.tls_dir, "server.crt"),
                            os.path.join(args.tls_dir, "server.key"))
    Handler.api = api
    httpd = Listener((args.address, args.port), ctx)
    port = httpd.server_address[1]
    url = "%s://%s:%d" % ("https" if ctx else "http", args.address, port)
    if args.kubeconfig:
        write_kubeconfig(args.kubeconfig, url, args.tls_dir, args.token)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as fh:
            fh.write("%d\n" % port)
        os.replace(args.port_file + ".tmp", args.port_file)
    print("listening on %s" % url, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown).start())
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=httpd.shutdown).start())
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        api.store.close_watches()
        if args.state:
            api.store.save(args.state)
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
