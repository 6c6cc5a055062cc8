#!/usr/bin/python3
"""A forward HTTP proxy for tests of HTTPS_PROXY / NO_PROXY: CONNECT tunnels
(https) and absolute-URI requests (http), each logged as one line
"METHOD TARGET" to LOG_FILE.

    fwdproxy.py PORT_FILE LOG_FILE

It listens on a free loopback port, written to PORT_FILE."""
import select
import socket
import socketserver
import sys
import threading

PORT_FILE, LOG = sys.argv[1], sys.argv[2]
LOCK = threading.Lock()


def log(line):
    with LOCK, open(LOG, "a") as f:
        f.write(line + "\n")


def pump(a, b):
    socks = [a, b]
    while True:
        r, _, _ = select.select(socks, [], [], 60)
        if not r:
            return
        for s in r:
            data = s.recv(65536)
            if not data:
                return
            (b if s is a else a).sendall(data)


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        c = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = c.recv(65536)
            if not chunk:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, target, _ = line.split(" ", 2)
        log("%s %s" % (method, target))
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up = socket.create_connection((host, int(port)))
            c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
            if rest:
                up.sendall(rest)
        else:
            # http://host:port/path: forward the request as is, path only
            hostport, path = target[len("http://"):].split("/", 1)
            host, port = (hostport.rsplit(":", 1) + ["80"])[:2]
            up = socket.create_connection((host, int(port)))
            up.sendall(head.replace(target.encode(), b"/" + path.encode(), 1))
        try:
            pump(c, up)
        finally:
            up.close()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


srv = Server(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os  # noqa: E402
os.rename(PORT_FILE + ".tmp", PORT_FILE)
srv.serve_forever()
