#!/usr/bin/python3
"""A token server for docker-registry's token authentication, for tests.

    tokenserver.py PORT_FILE KEY.pem CERT.pem ISSUER SERVICE USER:PASS

GET /token?service=S&scope=repository:NAME:ACTIONS[&scope=...] answers
{"token": JWT, "access_token": JWT, "expires_in": 300}: an RS256 JWT
signed with KEY (by the openssl command line), its certificate in the x5c
header (the registry trusts CERT as rootcertbundle), granting what was
asked for. Requests must carry Basic USER:PASS; others get 401.
GET /stats answers {"tokens": N, "refused": N, "scopes": [...]}.
"""
import base64
import http.server
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse

PORT_FILE, KEY, CERT, ISSUER, SERVICE, CREDS = sys.argv[1:7]
LOCK = threading.Lock()
STATS = {"tokens": 0, "refused": 0, "scopes": []}


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def cert_der_b64():
    lines = open(CERT).read().splitlines()
    body = [ln for ln in lines if ln and not ln.startswith("-----")]
    return "".join(body)


X5C = cert_der_b64()


def sign(data):
    p = subprocess.run(["openssl", "dgst", "-sha256", "-sign", KEY], input=data,
                       capture_output=True, check=True)
    return p.stdout


def make_token(user, scopes):
    access = []
    for s in scopes:
        parts = s.split(":")
        if len(parts) >= 3:
            access.append({"type": parts[0], "name": ":".join(parts[1:-1]),
                           "actions": parts[-1].split(",")})
    now = int(time.time())
    header = {"typ": "JWT", "alg": "RS256", "x5c": [X5C]}
    claims = {"iss": ISSUER, "sub": user, "aud": SERVICE, "exp": now + 300,
              "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(), "access": access}
    signing_input = (b64url(json.dumps(header).encode()) + "." +
                     b64url(json.dumps(claims).encode())).encode()
    return signing_input.decode() + "." + b64url(sign(signing_input))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, doc):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/stats":
            with LOCK:
                return self.reply(200, STATS)
        if url.path != "/token":
            return self.reply(404, {})
        auth = self.headers.get("Authorization", "")
        ok = auth.startswith("Basic ") and base64.b64decode(auth[6:]).decode() == CREDS
        if not ok:
            with LOCK:
                STATS["refused"] += 1
            return self.reply(401, {"details": "bad or missing credentials"})
        q = urllib.parse.parse_qs(url.query)
        scopes = q.get("scope", [])
        tok = make_token(CREDS.split(":")[0], scopes)
        with LOCK:
            STATS["tokens"] += 1
            STATS["scopes"].extend(scopes)
        return self.reply(200, {"token": tok, "access_token": tok, "expires_in": 300})


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    with open(PORT_FILE + ".tmp", "w") as fh:
        fh.write(str(srv.server_address[1]))
    os.rename(PORT_FILE + ".tmp", PORT_FILE)
    srv.serve_forever()


if __name__ == "__main__":
    main()
