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
import http.client
import json
import os
import subprocess
import sys

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from tap import Tap  # noqa: E402
from webhook_env import (FIXTURE, GKM, Registry, Webhook, agent_entries, available,  # noqa: E402
                         cleanup, init, make_ca, make_cert, path, review, run, tls_context,
                         write)

t = Tap()
init("gkm-foreign-sig.")
ANNOTATION = "dev.cosignproject.cosign/signature"

# How each image's signature text is written: (shell command over sig.bin, accepted?)
FORMS = {
    "wrap76": ("base64 sig.bin", True),
    "wrap64crlf": ("openssl base64 -in sig.bin | sed 's/$/\\r/'", True),
    "spaces": ("base64 sig.bin | tr '\\n' ' '", False),
}


def sh(cmd):
    return subprocess.run(["bash", "-c", cmd], cwd=path(), capture_output=True, check=True)


def attach(reg, repo, image_digest, payload, sig_text):
    """What `cosign attach signature --payload P --signature S` writes: one
    simple-signing layer, the signature text in its annotation as given."""
    reg.attach_simple(repo, image_digest, payload, {ANNOTATION: sig_text})


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
    want = {n: "Ready" if acc else "Failed" for n, (_, acc) in FORMS.items()}
    got = agent_entries({n: f"{R}/foreign/{n}:v1" for n in FORMS}, ["--key", path("ec.pub")],
                        want, timeout=60)
    for name, (_, accepted) in FORMS.items():
        e = got[name]
        if accepted:
            t.eq(e.get("state"), "Ready", f"the agent verifies {name} and the cache is Ready")
        else:
            t.ok(e.get("state") == "Failed" and e.get("reason") == "SignatureNotTrusted"
                 and "illegal base64 data at input byte 76" in e.get("message", ""),
                 f"the agent refuses {name}: SignatureNotTrusted, saying where", diag=e)


stops = []
try:
    t.run("signatures made by other tools", main)
finally:
    for stop in stops:
        stop()
    cleanup()
sys.exit(t.finish())
