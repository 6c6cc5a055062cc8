#!/usr/bin/python3
"""gkm webhook end to end: real HTTPS (a test CA made with openssl, the client
verifies the server against it), a real registry (Debian's docker-registry),
images built, pushed and signed with `gkm cache`, and AdmissionReview v1
requests as the API server sends them."""
import base64
import hashlib
import http.client
import json
import os
import shutil
import ssl
import sys
import threading
import time
import urllib.request

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from tap import Tap  # noqa: E402
from webhook_env import (ANN, DEADLINE_MS, FIXTURE, GKM, Blackhole, Registry,  # noqa: E402
                         Webhook, available, cleanup, decide, init, make_ca, make_cert, path,
                         post, review, run, tls_context, write)

t = Tap()
init("gkm-webhook-e2e.")
ENV_ANN = "gkm.io/runtime-env"
TRITON_ENV = "TRITON_CACHE_DIR=io.triton.cache"
ID_ANN = "gkm.io/runtime-identity"  # "": the test images' kernels name no Triton version


def patch_of(resp):
    if "patch" not in resp:
        return None
    return json.loads(base64.b64decode(resp["patch"]))


def denial(resp):
    st = resp.get("status", {})
    return f"{st.get('reason')}: {st.get('message')}"


# ---- the test ----

def main():
    why = available()
    if why:
        t.skip("webhook end to end", why)
        return
    make_ca("ca")
    make_ca("otherca")
    make_cert("ca", "tls", "gkm-webhook")
    os.makedirs(path("trust"))
    os.makedirs(path("policies"))
    run(GKM, "cache", "keygen", "--output-key-prefix", path("trusted"))
    run(GKM, "cache", "keygen", "--output-key-prefix", path("stranger"))
    run("openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
        "-out", path("rsa.key"))
    run("openssl", "pkey", "-in", path("rsa.key"), "-pubout", "-out", path("rsa.pub"))
    shutil.copy(path("trusted.pub"), path("trust", "team.pub"))
    default_policy = os.path.join(ROOT, "policies", "admission.lua")
    shutil.copy(default_policy, path("policies", "admission.lua"))
    write(path("config.yaml"), "# gkm-config\nverify-enabled: true\nallow-unsigned-images: false\n")

    # start-up refuses what it cannot serve, saying why
    base = ["--tls-cert", path("tls.crt"), "--tls-key", path("tls.key"), "--listen", "127.0.0.1:0",
            "--health-listen", "127.0.0.1:0"]
    write(path("bad-policy.lua"), "return {")
    os.makedirs(path("badpolicies"))
    shutil.copy(path("bad-policy.lua"), path("badpolicies", "admission.lua"))
    os.makedirs(path("badtrust"))
    write(path("badtrust", "k.pub"), "hello\n")
    for flags, code, want, name in (
            ([], 2, "--tls-cert and --tls-key are required", "no certificate: usage error"),
            (["--tls-cert", path("tls.crt"), "--tls-key", path("ca.key")], 1,
             "HTTPS: the key does not belong to the certificate", "a key of another certificate"),
            (base + ["--listen", "127.0.0.1:70000"], 1, "port must be 0 to 65535", "a bad port"),
            (base + ["--policy-dir", path("badpolicies")], 1, "admission.lua:1:",
             "a broken policy at start-up names file and line"),
            (base + ["--trust-dir", path("badtrust")], 1, "badtrust/k.pub: no PEM public key",
             "a key file without a key"),
            (base + ["--allow-unsigned-images", "perhaps"], 2, "wants true or false",
             "a bad boolean flag")):
        p = run(GKM, "webhook", *flags, check=False, timeout=30)
        t.ok(p.returncode == code and want in p.stderr, "start-up refused: " + name,
             diag=f"exit {p.returncode}\n{p.stderr}")

    # the chart's spelling: gkm-config mounted as a directory names the keys' directory
    os.makedirs(path("gkm-config"))
    write(path("gkm-config", "verify-enabled"), "true")
    write(path("gkm-config", "allow-unsigned-images"), "true")
    write(path("gkm-config", "trust-keys-dir"), path("trust") + "\n")
    write(path("gkm-config", "gpu-source"), "nvml")
    chart = Webhook("--tls-cert-file", path("tls.crt"), "--tls-key-file", path("tls.key"),
                    "--config-dir", path("gkm-config"))
    line = chart.wait_log(lambda j: j.get("msg") == "webhook serving", 5)
    t.ok(line and line.get("keys") == "1" and line.get("verify_enabled") == "true"
         and line.get("allow_unsigned") == "true",
         "gkm-config as a directory: settings and trust-keys-dir read, other keys ignored", diag=line)
    t.eq(chart.stop(), 0, "that webhook stops cleanly")

    reg = Registry()
    R = reg.addr

    def build(name, label):
        run(GKM, "cache", "build", FIXTURE, "-t", f"{R}/caches/{name}:v1", "--label",
            f"test.variant={label}")
        return reg.digest(f"caches/{name}", "v1")

    def sign(name, key, *extra):
        run(GKM, "cache", "sign", f"{R}/caches/{name}:v1", "--key", path(key), *extra)

    digests = {n: build(n, n) for n in
               ("signed", "bundle", "rsa", "unsigned", "stranger", "tampered", "copied")}
    sign("signed", "trusted.key")
    sign("bundle", "trusted.key", "--bundle")
    sign("rsa", "rsa.key")
    sign("stranger", "stranger.key")
    sign("tampered", "trusted.key")
    # tamper: flip a byte of the signature in the .sig manifest's annotation
    sig_tag = "sha256-%s.sig" % digests["tampered"].split(":")[1]
    mt = "application/vnd.oci.image.manifest.v1+json"
    r, body = reg.request("GET", f"/v2/caches/tampered/manifests/{sig_tag}", headers={"Accept": mt})
    m = json.loads(body)
    ann = m["layers"][0]["annotations"]
    raw = bytearray(base64.b64decode(ann["dev.cosignproject.cosign/signature"]))
    raw[len(raw) // 2] ^= 0x01
    ann["dev.cosignproject.cosign/signature"] = base64.b64encode(bytes(raw)).decode()
    r, _ = reg.request("PUT", f"/v2/caches/tampered/manifests/{sig_tag}",
                       body=json.dumps(m).encode(), headers={"Content-Type": m.get("mediaType", mt)})
    t.eq(r.status, 201, "tampered signature manifest pushed to the registry")
    # a valid signature of another image, copied under this image's .sig tag
    src_tag = "sha256-%s.sig" % digests["signed"].split(":")[1]
    r, body = reg.request("GET", f"/v2/caches/signed/manifests/{src_tag}", headers={"Accept": mt})
    sm = json.loads(body)
    for d in [sm["config"]] + sm["layers"]:
        reg.request("POST", f"/v2/caches/copied/blobs/uploads/?mount={d['digest']}&from=caches/signed")
    dst_tag = "sha256-%s.sig" % digests["copied"].split(":")[1]
    r, _ = reg.request("PUT", f"/v2/caches/copied/manifests/{dst_tag}", body=body,
                       headers={"Content-Type": sm.get("mediaType", mt)})
    t.eq(r.status, 201, "another image's signature copied to this image's .sig tag")

    wh = Webhook("--tls-cert", path("tls.crt"), "--tls-key", path("tls.key"),
                 "--trust-dir", path("trust"), "--config", path("config.yaml"),
                 "--policy-dir", path("policies"), "--key", path("rsa.pub"),
                 "--plain-http", "--retries", "1")
    with urllib.request.urlopen(f"http://127.0.0.1:{wh.health}/readyz", timeout=5) as rz:
        t.eq(rz.status, 200, "ready on the plain health port")

    # TLS: the client verifies the server against the test CA
    status, doc, first_peer = post(wh, "/mutate", review(f"{R}/caches/signed:v1"))
    t.eq(status, 200, "HTTPS with a certificate the client verifies against the CA")
    try:
        post(wh, "/mutate", review(f"{R}/caches/signed:v1"), ca="otherca")
        t.ok(False, "a client trusting another CA refuses the server")
    except ssl.SSLError as e:
        t.ok("CERTIFICATE_VERIFY_FAILED" in str(e), "a client trusting another CA refuses the server",
             diag=str(e))

    # signed with a trusted key: allowed with the registry's digest in the patch
    resp = doc["response"]
    t.eq(resp.get("uid"), "4b5f8a9e-0001", "the answer carries the request's uid")
    t.ok(resp.get("allowed") is True and resp.get("patchType") == "JSONPatch",
         "signed with a trusted key: allowed with a JSONPatch", diag=resp)
    t.eq(patch_of(resp), [{"op": "add", "path": "/metadata/annotations",
                           "value": {ANN: digests["signed"], ENV_ANN: TRITON_ENV, ID_ANN: ""}}],
         "the patch sets gkm.io/resolvedDigest to the registry's digest, and gkm.io/runtime-env "
         "to the variable the image's labels call for")
    t.ok("warnings" not in resp, "no warning for a verified image", diag=resp)
    resp = decide(wh, f"{R}/caches/signed:v1", annotations={"team": "a"})
    t.eq(patch_of(resp), [{"op": "add", "path": "/metadata/annotations/gkm.io~1resolvedDigest",
                           "value": digests["signed"]},
                          {"op": "add", "path": "/metadata/annotations/gkm.io~1runtime-env",
                           "value": TRITON_ENV},
                          {"op": "add", "path": "/metadata/annotations/gkm.io~1runtime-identity",
                           "value": ""}],
         "with other annotations the patch adds one key each")
    resp = decide(wh, f"{R}/caches/signed@{digests['signed']}")
    t.eq(patch_of(resp)[0]["value"], {ANN: digests["signed"], ENV_ANN: TRITON_ENV, ID_ANN: ""},
         "a reference by digest is allowed as is")
    resp = decide(wh, f"{R}/caches/bundle:v1")
    t.ok(resp["allowed"] and patch_of(resp)[0]["value"] == {ANN: digests["bundle"], ENV_ANN: TRITON_ENV, ID_ANN: ""},
         "signed with a sigstore bundle (OCI referrer): allowed", diag=resp)
    resp = decide(wh, f"{R}/caches/rsa:v1")
    t.ok(resp["allowed"], "signed with an RSA key made by openssl (a --key file): allowed",
         diag=resp)

    # refusals, each with a reason the user can act on
    resp = decide(wh, f"{R}/caches/unsigned:v1")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "Unsigned"
         and "has no signature and unsigned images are not allowed" in resp["status"]["message"],
         "unsigned image: denied (Unsigned)", diag=resp)
    t.ok("patch" not in resp, "a denial carries no patch")
    resp = decide(wh, f"{R}/caches/stranger:v1")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "SignatureNotTrusted"
         and "no trusted key verifies" in resp["status"]["message"],
         "signed with an untrusted key: denied (SignatureNotTrusted)", diag=denial(resp))
    resp = decide(wh, f"{R}/caches/tampered:v1")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "SignatureNotTrusted",
         "tampered signature: denied", diag=denial(resp))
    resp = decide(wh, f"{R}/caches/copied:v1")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "SignatureNotTrusted"
         and "payload is for image " + digests["signed"] in resp["status"]["message"],
         "a signature of another image: denied", diag=denial(resp))
    resp = decide(wh, f"{R}/caches/unsigned:v1",
                  annotations={"kyverno.io/verify-images": json.dumps({R + "/caches/unsigned:v1": "pass"})})
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "Unsigned",
         "a kyverno.io/verify-images annotation is no proof: still denied", diag=resp)
    resp = decide(wh, f"{R}/caches/missing:v1")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "ImageNotFound",
         "an image that does not exist: denied (ImageNotFound)", diag=denial(resp))

    for bad, why in (("Quay.io/Org/Cache:v1", "must be lowercase"),
                     ("quay.io/org/cache:bad tag", "whitespace"),
                     ("quay.io/org/cache@sha256:1234", "invalid digest"),
                     ("https://quay.io/org/cache:v1", "URL scheme"),
                     ("oci:/tmp/layout:v1", "layout directory")):
        resp = decide(wh, bad)
        t.ok(not resp["allowed"] and resp["status"]["reason"] == "InvalidImageReference"
             and why in resp["status"]["message"],
             f"malformed reference {bad!r}: denied with the reason", diag=resp)
    resp = decide(wh, None, obj={"metadata": {"name": "x"}, "spec": {}})
    t.ok(not resp["allowed"] and "spec.image is required" in resp["status"]["message"],
         "no spec.image: denied (InvalidObject)", diag=resp)
    resp = decide(wh, "anything", kind="Pod", group="")
    t.ok(resp["allowed"] and "patch" not in resp, "a review of another kind is allowed unchanged")
    resp = decide(wh, f"{R}/caches/unsigned:v1", op="DELETE")
    t.ok(resp["allowed"], "DELETE is allowed unchanged")
    status, text, _ = post(wh, "/mutate", b'{"kind":"AdmissionReview","apiVersion":"v1"}')
    t.ok(status == 400 and "want admission.k8s.io/v1" in text, "a malformed review: HTTP 400 with the reason",
         diag=(status, text))
    status, text, _ = post(wh, "/elsewhere", review("x"))
    t.eq(status, 404, "unknown path: 404")

    # /validate: the annotation must be what the webhook resolved
    good = {ANN: digests["signed"]}
    resp = decide(wh, f"{R}/caches/signed:v1", "/validate", annotations=good)
    t.ok(resp["allowed"] and "patch" not in resp, "/validate: the resolved digest is accepted", diag=resp)
    forged = {ANN: digests["stranger"]}
    resp = decide(wh, f"{R}/caches/signed:v1", "/validate", annotations=forged)
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "ResolvedDigestMismatch"
         and digests["signed"] in resp["status"]["message"],
         "/validate: a hand-set resolvedDigest is denied", diag=denial(resp))
    resp = decide(wh, f"{R}/caches/signed:v1", "/validate")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "ResolvedDigestMissing",
         "/validate: a missing resolvedDigest is denied", diag=denial(resp))
    resp = decide(wh, f"{R}/caches/unsigned:v1", "/validate", annotations={ANN: digests["unsigned"]})
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "Unsigned",
         "/validate: refuses what policy forbids", diag=denial(resp))
    resp = decide(wh, "quay.io/Bad", "/validate", annotations=good)
    t.eq(resp["status"]["reason"], "InvalidImageReference", "/validate: refuses malformed references")
    # UPDATE with an unchanged image: the recorded digest stays
    old_obj = {"metadata": {"name": "llama", "annotations": dict(good)},
               "spec": {"image": f"{R}/caches/signed:v1"}}
    resp = decide(wh, f"{R}/caches/signed:v1", "/validate", op="UPDATE", annotations=forged, old=old_obj)
    t.ok(not resp["allowed"] and "unchanged" in resp["status"]["message"],
         "/validate: UPDATE may not change the annotation while spec.image is unchanged",
         diag=denial(resp))
    resp = decide(wh, f"{R}/caches/signed:v1", op="UPDATE", annotations=forged, old=old_obj)
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "ResolvedDigestMismatch",
         "/mutate: UPDATE changing the recorded digest by hand is refused", diag=denial(resp))
    resp = decide(wh, f"{R}/caches/signed:v1", op="UPDATE", annotations={"team": "b"}, old=old_obj)
    t.eq(patch_of(resp)[0], {"op": "add", "path": "/metadata/annotations/gkm.io~1resolvedDigest",
                             "value": digests["signed"]},
         "/mutate: UPDATE that dropped the annotation gets the recorded digest back")
    resp = decide(wh, f"{R}/caches/signed:v1", annotations=forged)
    t.ok(resp["allowed"] and patch_of(resp)[0]["value"] == digests["signed"]
         and "was replaced by" in resp.get("warnings", [""])[0],
         "/mutate: CREATE with a hand-set digest: replaced, with a warning", diag=resp)

    # settings from the config file, reloaded live
    m = wh.mark()
    write(path("config.yaml"), "verify-enabled: true\nallow-unsigned-images: true\n")
    ok = wh.wait_log(lambda j: j.get("msg") == "trust configuration reloaded"
                     and j.get("allow_unsigned") == "true", 10, after=m)
    resp = decide(wh, f"{R}/caches/unsigned:v1")
    t.ok(ok and resp["allowed"] and patch_of(resp)[0]["value"] == {ANN: digests["unsigned"], ENV_ANN: TRITON_ENV, ID_ANN: ""}
         and "unsigned images are allowed" in resp.get("warnings", [""])[0],
         "allow-unsigned-images: true in the config: unsigned allowed, with a warning", diag=resp)
    resp = decide(wh, f"{R}/caches/stranger:v1")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "SignatureNotTrusted",
         "allow-unsigned does not admit an image whose signatures do not verify", diag=resp)
    m = wh.mark()
    write(path("config.yaml"), "verify-enabled: maybe\n")
    ok = wh.wait_log(lambda j: j.get("msg", "").startswith("trust configuration refused")
                     and "want true or false, got 'maybe'" in j.get("error", ""), 10, after=m)
    resp = decide(wh, f"{R}/caches/unsigned:v1")
    t.ok(ok and resp["allowed"], "a config with a bad value is refused; the last good one stays",
         diag=resp)
    m = wh.mark()
    write(path("config.yaml"), "verify-enabled: true\nallow-unsigned-images: false\n")
    wh.wait_log(lambda j: j.get("msg") == "trust configuration reloaded"
                and j.get("allow_unsigned") == "false", 10, after=m)
    resp = decide(wh, f"{R}/caches/unsigned:v1")
    t.ok(not resp["allowed"], "allow-unsigned-images back to false: denied again")

    # trusted keys reloaded: the stranger's key becomes trusted
    m = wh.mark()
    shutil.copy(path("stranger.pub"), path("trust", "stranger.pub"))
    ok = wh.wait_log(lambda j: j.get("msg") == "trust configuration reloaded" and j.get("keys") == "3", 10, after=m)
    resp = decide(wh, f"{R}/caches/stranger:v1")
    t.ok(ok and resp["allowed"], "a key added to --trust-dir is trusted without a restart", diag=resp)
    m = wh.mark()
    write(path("trust", "broken.pub"), "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    ok = wh.wait_log(lambda j: j.get("msg", "").startswith("trust configuration refused")
                     and "broken.pub" in j.get("error", ""), 10, after=m)
    resp = decide(wh, f"{R}/caches/stranger:v1")
    t.ok(ok and resp["allowed"], "an unreadable key file is refused, naming the file; the last good keys stay",
         diag=resp)
    m = wh.mark()
    os.remove(path("trust", "broken.pub"))
    os.remove(path("trust", "stranger.pub"))
    wh.wait_log(lambda j: j.get("msg") == "trust configuration reloaded" and j.get("keys") == "2", 10, after=m)
    resp = decide(wh, f"{R}/caches/stranger:v1")
    t.ok(not resp["allowed"], "the key removed again: denied again", diag=resp)

    # policies: a valid change flips a verdict, a broken one is refused
    m = wh.mark()
    write(path("policies", "admission.lua"),
          open(default_policy).read().replace(
              "M.allowed_registries = {}", 'M.allowed_registries = { "registry.example.com" }'))
    ok = wh.wait_log(lambda j: j.get("msg") == "policy bundle applied" and j.get("generation") == "2", 10, after=m)
    resp = decide(wh, f"{R}/caches/signed:v1")
    t.ok(ok and not resp["allowed"] and resp["status"]["reason"] == "RegistryNotAllowed",
         "a policy change takes effect without a restart (registry not allowed)", diag=resp)
    m = wh.mark()
    write(path("policies", "admission.lua"), "local M = {}\nfunction M.evaluate(input)\n  return {\nend\nreturn M\n")
    ok = wh.wait_log(lambda j: j.get("msg", "").startswith("policy bundle refused")
                     and "admission.lua:4:" in j.get("error", ""), 10, after=m)
    resp = decide(wh, f"{R}/caches/signed:v1")
    t.ok(ok and not resp["allowed"] and resp["status"]["reason"] == "RegistryNotAllowed",
         "a broken policy is refused (file and line logged); the last good one keeps answering",
         diag=resp)
    t.eq(wh.metric("gkm_webhook_reload_refused", what="policy"), 1.0,
         "the refused policy shows in gkm_webhook_reload_refused")
    m = wh.mark()
    shutil.copy(default_policy, path("policies", "admission.lua"))
    ok = wh.wait_log(lambda j: j.get("msg") == "policy bundle applied" and j.get("generation") == "3", 10, after=m)
    resp = decide(wh, f"{R}/caches/signed:v1")
    t.ok(ok and resp["allowed"], "back to the default policy: allowed", diag=resp)

    # routes around the policy budget: a finalizer (run by the collector with
    # hooks off, after the budget) and a backtracking pattern over a long
    # annotation the user wrote. Each review is answered, in time, and the
    # next one too.
    def escape(source, annotations, name, want):
        m = wh.mark()
        write(path("policies", "admission.lua"), source)
        ok = wh.wait_log(lambda j: j.get("msg") == "policy bundle applied", 10, after=m)
        answers = []
        for _ in range(2):
            start = time.time()
            try:
                resp = decide(wh, f"{R}/caches/signed:v1", annotations=annotations)
            except (OSError, RuntimeError) as e:
                resp = {"error": str(e)}
            answers.append((time.time() - start, resp))
        t.ok(ok and all(s < 5 and not r.get("allowed") and want in r.get("status", {}).get("message", "")
                        for s, r in answers),
             name, diag=answers)

    escape("local M = {}\nfunction M.evaluate(input)\n"
           "  setmetatable({}, { __gc = function() while true do end end })\n"
           "  return { allowed = true }\nend\nreturn M\n", None,
           "a policy that sets a __gc finalizer is stopped (blocked), and the webhook answers the next review",
           "__gc")
    escape("local M = {}\nfunction M.evaluate(input)\n"
           "  for _, v in pairs(input.object.annotations or {}) do v:find('(.-)x(.-)y') end\n"
           "  return { allowed = true }\nend\nreturn M\n", {"team.example.com/notes": "a" * 100000},
           "a backtracking pattern over a 100 KB annotation is refused before it runs; the webhook answers",
           "matching steps")
    m = wh.mark()
    shutil.copy(default_policy, path("policies", "admission.lua"))
    wh.wait_log(lambda j: j.get("msg") == "policy bundle applied", 10, after=m)

    # the certificate replaced while serving; a kept-alive connection opened
    # before finishes its request on the old certificate and is told to close
    make_cert("ca", "tls2", "gkm-webhook-renewed")
    kept = http.client.HTTPSConnection("127.0.0.1", wh.port, context=tls_context("ca"), timeout=10)
    body = json.dumps(review(f"{R}/caches/signed:v1"))
    kept.request("POST", "/mutate", body=body)
    r1 = kept.getresponse()
    r1.read()
    m = wh.mark()
    shutil.copy(path("tls2.key"), path("tls.key"))
    shutil.copy(path("tls2.crt"), path("tls.crt"))
    ok = wh.wait_log(lambda j: j.get("msg") == "TLS certificate reloaded", 10, after=m)
    kept.request("POST", "/mutate", body=body)
    r2 = kept.getresponse()
    r2.read()
    old_peer = hashlib.sha256(kept.sock.getpeercert(binary_form=True)).hexdigest() if kept.sock else ""
    t.ok(ok and r1.getheader("Connection") != "close" and r2.status == 200
         and (r2.getheader("Connection") or "").lower() == "close",
         "a connection opened before the swap is answered, then closed (Connection: close)",
         diag=(r1.getheader("Connection"), r2.status, r2.getheader("Connection"), old_peer == first_peer))
    kept.close()
    _, _, peer = post(wh, "/mutate", review(f"{R}/caches/signed:v1"))
    with open(path("tls2.crt")) as f:
        want = hashlib.sha256(ssl.PEM_cert_to_DER_cert(f.read())).hexdigest()
    t.ok(ok and peer == want and peer != first_peer, "a replaced certificate is served to new connections",
         diag=(peer, want))
    m = wh.mark()
    write(path("tls.crt"), "not a certificate\n")
    ok = wh.wait_log(lambda j: j.get("msg", "").startswith("new TLS certificate refused"), 10, after=m)
    status, _, peer = post(wh, "/mutate", review(f"{R}/caches/signed:v1"))
    t.ok(ok and status == 200 and peer == want, "a broken certificate file is refused; the last good one serves")
    shutil.copy(path("tls2.crt"), path("tls.crt"))

    # registry trouble: denied within the deadline, with the reason
    reg.stop()
    resp = decide(wh, f"{R}/caches/signed:v1")
    t.ok(resp["allowed"], "registry down: a digest resolved and verified before is answered from the cache",
         diag=resp)
    resp = decide(wh, f"{R}/caches/signed:v2")
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "RegistryUnavailable",
         "registry down: an unchecked image is denied (RegistryUnavailable)", diag=denial(resp))
    hole = Blackhole()
    status, doc, _ = post(wh, "/mutate", review(f"{hole.addr}/caches/slow:v1"),
                          timeout=DEADLINE_MS / 1000 * 4)
    resp = doc["response"] if isinstance(doc, dict) else {}
    t.ok(status == 200 and not resp.get("allowed") and resp["status"]["reason"] == "RegistryTimeout",
         "a registry that never answers: denied (RegistryTimeout) before the client gives up",
         diag=doc)

    # metrics
    m = wh.metrics()
    t.ok('gkm_webhook_review_seconds_bucket{endpoint="mutate",le="0.005"}' in m,
         "review latency histogram by endpoint")
    t.ok(wh.metric("gkm_webhook_decisions_total", endpoint="mutate", result="denied",
                   reason="SignatureNotTrusted") >= 2, "decisions counted by result and reason")
    t.ok(wh.metric("gkm_webhook_cache_total", cache="verdict", result="hit") >= 1
         and wh.metric("gkm_webhook_cache_total", cache="resolve", result="hit") >= 1,
         "cache hits counted")

    # SIGTERM with a review waiting for a registry check: the check runs out,
    # the review is answered, then the process exits (the sanitizers check)
    late = {}

    def waiting_review():
        try:
            late["answer"] = post(wh, "/mutate", review(f"{hole.addr}/caches/late:v1"), timeout=30)
        except Exception as e:  # noqa: BLE001 - reported below
            late["error"] = repr(e)

    th = threading.Thread(target=waiting_review)
    th.start()
    seen = False
    for _ in range(100):  # until the webhook has taken the review to the registry
        if wh.metric("gkm_webhook_registry_checks_running") >= 1:
            seen = True
            break
        time.sleep(0.05)
    rc = wh.stop()
    th.join(30)
    hole.close()
    status, doc, _ = late.get("answer", (0, None, None))
    resp = doc["response"] if isinstance(doc, dict) else {}
    t.ok(seen and status == 200 and resp.get("allowed") is False
         and resp["status"]["reason"] in ("RegistryUnavailable", "RegistryTimeout", "ShuttingDown"),
         "SIGTERM: a review waiting on the registry is still answered", diag=(late, seen))
    t.eq(rc, 0, "SIGTERM: clean exit (sanitizers quiet)")
    if rc != 0:
        print("#" + wh.read_log()[-3000:].replace("\n", "\n#"))


try:
    t.run("webhook end to end", main)
finally:
    cleanup()
sys.exit(t.finish())
