#!/usr/bin/python3
"""Signatures made by other tools, as they write them: a cosign simple-signing
signature made by the openssl command line tool, its base64 wrapped the way
base64(1) (76 columns) and `openssl base64` (64 columns, here with CRLF) print
it and `cosign attach signature` stores it, attached in a real registry
(Debian's docker-registry) under the sha256-<hex>.sig tag as cosign lays it
out. OpenSSL verifies each; gkm must accept them through `gkm cache verify`,
the admission webhook and the node agent (`gkm up`), and refuse the same
signature separated by spaces, as Go's decoder (cosign's) does, saying where."""
import base64
import hashlib
import http.client
import json
import os
import subprocess
import sys
import time

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from proc import free_port  # noqa: E402
from tap import Tap  # noqa: E402
from webhook_env import (FIXTURE, GKM, Registry, Webhook, available, cleanup, init,  # noqa: E402
                         make_ca, make_cert, path, review, run, tls_context, write)

t = Tap()
init("gkm-foreign-sig.")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SIMPLE = "application/vnd.dev.cosign.simplesigning.v1+json"
ANNOTATION = "dev.cosignproject.cosign/signature"

# How each image's signature text is written: (shell command over sig.bin, accepted?)
FORMS = {
    "wrap76": ("base64 sig.bin", True),
    "wrap64crlf": ("openssl base64 -in sig.bin | sed 's/$/\\r/'", True),
    "spaces": ("base64 sig.bin | tr '\\n' ' '", False),
}


def sh(cmd):
    return subprocess.run(["bash", "-c", cmd], cwd=path(), capture_output=True, check=True)


def push_blob(reg, repo, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r, _ = reg.request("POST", f"/v2/{repo}/blobs/uploads/")
    loc = r.getheader("Location")
    if r.status != 202 or not loc:
        raise RuntimeError(f"blob upload not started: HTTP {r.status}")
    loc = loc.split(reg.addr, 1)[-1]
    sep = "&" if "?" in loc else "?"
    r, _ = reg.request("PUT", f"{loc}{sep}digest={digest}", body=data,
                       headers={"Content-Type": "application/octet-stream"})
    if r.status != 201:
        raise RuntimeError(f"blob upload: HTTP {r.status}")
    return {"digest": digest, "size": len(data)}


def attach(reg, repo, image_digest, payload, sig_text):
    """What `cosign attach signature --payload P --signature S` writes: one
    simple-signing layer, the signature text in its annotation as given."""
    layer = push_blob(reg, repo, payload)
    config = json.dumps({
        "architecture": "", "os": "", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode()
    cfg = push_blob(reg, repo, config)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [{"mediaType": SIMPLE, **layer, "annotations": {ANNOTATION: sig_text}}]}
    tag = image_digest.replace(":", "-") + ".sig"
    r, _ = reg.request("PUT", f"/v2/{repo}/manifests/{tag}", body=json.dumps(manifest).encode(),
                       headers={"Content-Type": OCI_MANIFEST})
    if r.status != 201:
        raise RuntimeError(f"signature manifest: HTTP {r.status}")


def post_review(wh, image):
    c = http.client.HTTPSConnection("127.0.0.1", wh.port, context=tls_context("ca"), timeout=15)
    c.request("POST", "/mutate", body=json.dumps(review(image)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    doc = json.loads(r.read())
    c.close()
    return doc["response"]


def main():
    why = available()
    if why:
        t.skip("signatures made by other tools", why)
        return
    reg = Registry()
    stops.append(reg.stop)
    R = reg.addr
    run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path("ec.pem"))
    run("openssl", "ec", "-in", path("ec.pem"), "-pubout", "-out", path("ec.pub"))

    digests, texts = {}, {}
    for name, (encode, _) in FORMS.items():
        repo = f"foreign/{name}"
        run(GKM, "cache", "build", FIXTURE, "-t", f"{R}/{repo}:v1", "--label", f"test={name}")
        d = reg.digest(repo, "v1")
        digests[name] = d
        # the payload as cosign writes it, signed by openssl (cosign's own algorithm:
        # ECDSA P-256 over SHA-256, DER)
        payload = json.dumps({
            "critical": {"identity": {"docker-reference": f"{R}/{repo}"},
                         "image": {"docker-manifest-digest": d},
                         "type": "cosign container image signature"},
            "optional": None}, separators=(",", ":")).encode()
        write(path("payload.json"), payload, "wb")
        sh("openssl dgst -sha256 -sign ec.pem -out sig.bin payload.json")
        ctl = sh("openssl dgst -sha256 -verify ec.pub -signature sig.bin payload.json")
        text = sh(encode).stdout.decode()
        texts[name] = text
        again = base64.b64decode("".join(text.split()))
        t.ok(b"Verified OK" in ctl.stdout and again == open(path("sig.bin"), "rb").read(),
             f"{name}: OpenSSL verifies the signature the text holds", diag=ctl)
        attach(reg, repo, d, payload, text)
    lines = texts["wrap76"].split("\n")
    t.ok(len(lines) >= 3 and len(lines[0]) == 76,
         "the signature text is wrapped at 76 columns, as base64(1) prints it", diag=lines)
    t.ok("\r\n" in texts["wrap64crlf"] and len(texts["wrap64crlf"].split("\r\n")[0]) == 64,
         "the second is wrapped at 64 columns with CRLF line ends", diag=texts["wrap64crlf"])

    # gkm cache verify
    for name, (_, accepted) in FORMS.items():
        p = run(GKM, "cache", "verify", f"{R}/foreign/{name}:v1", "--key", path("ec.pub"),
                check=False)
        out = p.stdout + p.stderr
        if accepted:
            t.ok(p.returncode == 0 and "Verified" in out and digests[name] in out,
                 f"gkm cache verify accepts {name}", diag=out)
        else:
            t.ok(p.returncode == 1 and "not valid base64 (illegal base64 data at input byte 76)"
                 in out, f"gkm cache verify refuses {name}, at the byte Go's decoder names",
                 diag=out)

    # the admission webhook
    make_ca("ca")
    make_cert("ca", "tls", "gkm-webhook")
    write(path("config.yaml"), "verify-enabled: true\nallow-unsigned-images: false\n")
    wh = Webhook("--tls-cert", path("tls.crt"), "--tls-key", path("tls.key"),
                 "--config", path("config.yaml"), "--key", path("ec.pub"), "--plain-http",
                 "--retries", "1")
    for name, (_, accepted) in FORMS.items():
        resp = post_review(wh, f"{R}/foreign/{name}:v1")
        msg = resp.get("status", {}).get("message", "")
        if accepted:
            t.ok(resp.get("allowed") is True, f"the webhook admits {name}", diag=resp)
        else:
            t.ok(resp.get("allowed") is False and "illegal base64 data at input byte 76" in msg,
                 f"the webhook refuses {name}, saying where the text is bad", diag=resp)
    t.eq(wh.stop(), 0, "the webhook stops cleanly")

    # the node agent (standalone mode)
    port = free_port()
    state = path("state")
    docs = "".join(f"---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata:\n"
                   f"  name: {name}\n  namespace: default\nspec:\n"
                   f"  image: {R}/foreign/{name}:v1\n" for name in FORMS)
    write(path("caches.yaml"), docs)
    run(GKM, "apply", "--state", state, "-f", path("caches.yaml"))
    log = open(path("up.log"), "w")
    up = subprocess.Popen([GKM, "up", "--state", state, "--node", "node-1", "--gpu-file",
                           os.path.join(ROOT, "spec/fixtures/gpu/inventory/mixed.json"),
                           "--key", path("ec.pub"), "--poll-ms", "100", "--health-listen",
                           f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def entry(name):
            p = run(GKM, "get", "--state", state, "gkmcn", "node-1", "-n", "default", "-o",
                    "json", check=False)
            try:
                return json.loads(p.stdout)["status"]["caches"][name]
            except (ValueError, KeyError, TypeError):
                return {}

        want = {n: "Ready" if acc else "Failed" for n, (_, acc) in FORMS.items()}
        end = time.time() + 60
        while time.time() < end and any(entry(n).get("state") != s for n, s in want.items()):
            time.sleep(0.3)
        for name, (_, accepted) in FORMS.items():
            e = entry(name)
            if accepted:
                t.eq(e.get("state"), "Ready", f"the agent verifies {name} and the cache is Ready")
            else:
                t.ok(e.get("state") == "Failed" and e.get("reason") == "SignatureNotTrusted"
                     and "illegal base64 data at input byte 76" in e.get("message", ""),
                     f"the agent refuses {name}: SignatureNotTrusted, saying where", diag=e)
    finally:
        up.terminate()
        up.wait(timeout=30)
        log.close()


stops = []
try:
    t.run("signatures made by other tools", main)
finally:
    for stop in stops:
        stop()
    cleanup()
sys.exit(t.finish())
