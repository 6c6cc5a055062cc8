#!/usr/bin/python3
"""An HTTP proxy in front of a real registry, for tests that need a registry
to misbehave on cue, or to speak the OCI 1.1 referrers API (which Debian's
docker-registry 2.8 does not).

    regproxy.py UPSTREAM_HOST:PORT PORT_FILE [CERT KEY]

(with CERT and KEY it speaks HTTPS; the upstream is plain HTTP)

It listens on a free loopback port (written to PORT_FILE) and forwards
everything to UPSTREAM. Faults are set with POST /_control (JSON body);
each applies to requests whose "METHOD PATH" matches "match" (a regex):

    {"fail": N, "status": 500}     the next N matching requests get status
    {"fail": N, "body": "..."}     ... with this body (default: a distribution
                                   error document)
    {"redirect": "http://H:P"}     answer 307, Location the same path on H:P
    {"truncate": K, "times": N}    matching answers stop after K body bytes
                                   (Content-Length still says the full size)
    {"hang": true}                 read the request, never answer
    {"hold": true}                 hold the request until the fault changes
                                   (a stalled registry the test releases)
    {"lie_digest": true}           send a wrong Docker-Content-Digest
    {"big_manifest": BYTES}        answer with a JSON document of BYTES bytes
    {"referrers": false}           answer the referrers API with 404
    {}                             no faults

GET /_stats returns {"requests": [["METHOD", "PATH"], ...], "held": N,
"authorized": [["METHOD", "PATH"], ...]} (N: requests the current hold
fault has held; authorized: the requests that carried an Authorization
header).

Referrers: a manifest PUT whose body has a "subject" is recorded and
answered with OCI-Subject; GET /v2/<name>/referrers/<digest> returns them
as an OCI index, filtered by ?artifactType= (with OCI-Filters-Applied).
"""
import hashlib
import http.client
import http.server
import json
import re
import socketserver
import sys
import threading
import time
import urllib.parse

UPSTREAM = sys.argv[1]
LOCK = threading.Lock()
STATE = {"fault": {}, "requests": [], "authorized": [], "referrers": {}}
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-authorization", "proxy-authenticate"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send_plain(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def fault_for(self):
        f = STATE["fault"]
        if not f:
            return None
        if not re.search(f.get("match", "."), f"{self.command} {self.path}"):
            return None
        return f

    def handle_any(self):
        body = self.read_body()
        with LOCK:
            STATE["requests"].append([self.command, self.path])
            if self.headers.get("Authorization"):
                STATE["authorized"].append([self.command, self.path])
        if self.path == "/_control":
            with LOCK:
                STATE["fault"] = json.loads(body or b"{}")
            return self.send_plain(200, b"{}")
        if self.path == "/_stats":
            with LOCK:
                data = json.dumps({"requests": STATE["requests"], "authorized": STATE["authorized"],
                                   "held": STATE["fault"].get("held", 0)}).encode()
            return self.send_plain(200, data, {"Content-Type": "application/json"})
        with LOCK:
            f = self.fault_for()
            if f and f.get("fail", 0) > 0:
                f["fail"] -= 1
                status = f.get("status", 500)
                body = f["body"].encode("latin-1") if "body" in f else \
                    b'{"errors":[{"code":"UNAVAILABLE","message":"injected failure"}]}'
                return self.send_plain(status, body, {"Content-Type": "application/json"})
            if f and f.get("redirect"):
                return self.send_plain(307, b"", {"Location": f["redirect"] + self.path})
        if f and f.get("hang"):
            time.sleep(3600)
            return None
        if f and f.get("hold"):
            with LOCK:
                f["held"] = f.get("held", 0) + 1
            while True:
                with LOCK:
                    if STATE["fault"] is not f:
                        break
                time.sleep(0.02)
        m = re.match(r"^/v2/(.+)/referrers/(sha256:[0-9a-f]{64})(\?.*)?$", self.path)
        if m and self.command == "GET":
            return self.referrers(m.group(1), m.group(2), m.group(3), f)
        if f and "big_manifest" in f:
            pad = b" " * max(0, f["big_manifest"] - 64)
            data = b'{"schemaVersion":2,"manifests":[],"x":"' + pad + b'"}'
            return self.send_plain(200, data, {"Content-Type": "application/vnd.oci.image.index.v1+json"})
        return self.forward(body, f)

    def referrers(self, name, digest, query, f):
        if f and f.get("referrers") is False:
            return self.send_plain(404, b'{"errors":[{"code":"NOT_FOUND"}]}')
        want = None
        if query:
            q = urllib.parse.parse_qs(query[1:])
            want = q.get("artifactType", [None])[0]
        with LOCK:
            items = list(STATE["referrers"].get(name, {}).get(digest, []))
        headers = {"Content-Type": "application/vnd.oci.image.index.v1+json"}
        if want:
            items = [d for d in items if d.get("artifactType") == want]
            headers["OCI-Filters-Applied"] = "artifactType"
        doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
               "manifests": items}
        return self.send_plain(200, json.dumps(doc).encode(), headers)

    def forward(self, body, f):
        conn = http.client.HTTPConnection(UPSTREAM, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP]
        m = re.match(r"^/v2/(.+)/manifests/([^/]+)$", self.path)
        if m and self.command == "PUT" and resp.status == 201:
            try:
                doc = json.loads(body)
            except ValueError:
                doc = {}
            if isinstance(doc, dict) and isinstance(doc.get("subject"), dict):
                desc = {"mediaType": doc.get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
                        "digest": "sha256:" + hashlib.sha256(body).hexdigest(), "size": len(body)}
                if doc.get("artifactType"):
                    desc["artifactType"] = doc["artifactType"]
                if doc.get("annotations"):
                    desc["annotations"] = doc["annotations"]
                with LOCK:
                    STATE["referrers"].setdefault(m.group(1), {}).setdefault(
                        doc["subject"]["digest"], []).append(desc)
                out_headers.append(("OCI-Subject", doc["subject"]["digest"]))
        if f and f.get("lie_digest"):
            out_headers = [(k, v) for k, v in out_headers if k.lower() != "docker-content-digest"]
            out_headers.append(("Docker-Content-Digest", "sha256:" + "0" * 64))
        cut = None
        if f and "truncate" in f and f.get("times", 1) > 0 and self.command == "GET":
            with LOCK:
                f["times"] = f.get("times", 1) - 1
            cut = f["truncate"]
        self.send_response(resp.status)
        length = resp.getheader("Content-Length")
        for k, v in out_headers:
            if k.lower() != "content-length":
                self.send_header(k, v)
        if self.command == "HEAD" or resp.status in (204, 304):
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            conn.close()
            return None
        if length is None:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()
            return None
        self.send_header("Content-Length", length)
        self.end_headers()
        sent = 0
        while True:
            chunk = resp.read(65536)
            if not chunk:
                break
            if cut is not None and sent + len(chunk) > cut:
                self.wfile.write(chunk[: cut - sent])
                self.wfile.flush()
                self.close_connection = True
                conn.close()
                return None
            self.wfile.write(chunk)
            sent += len(chunk)
        conn.close()
        return None

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = handle_any


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    if len(sys.argv) > 4:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    with open(sys.argv[2] + ".tmp", "w") as fh:
        fh.write(str(srv.server_address[1]))
    import os
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    srv.serve_forever()


if __name__ == "__main__":
    main()
