#!/usr/bin/python3
"""Keyless signatures as CI makes them (cosign with a Fulcio certificate and a
Rekor entry), against a sigstore of the test's own (spec/lib/fake_sigstore.c:
a Fulcio-like CA issuing 10-minute certificates with the OIDC extensions, a
Rekor-like log signing entry timestamps and checkpoints), stored in a real
registry (Debian's docker-registry) as cosign lays them out: the
simple-signing layer with its certificate, chain and bundle annotations on the
sha256-<hex>.sig tag, and sigstore bundles as referrers. One image per case;
gkm must accept the good ones and refuse each bad one naming its cause,
through `gkm cache verify`, the admission webhook and the node agent (`gkm
up`), with a trust directory holding a trusted root, identity rules and a key
beside them. sigstore-js (npm, offline) verifies a bundle gkm accepts with
the same root, and gkm accepts a bundle sigstore-js made."""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from tap import Tap  # noqa: E402
from webhook_env import (FIXTURE, GKM, Registry, Webhook, agent_entries, available,  # noqa: E402
                         cleanup, decide, init, make_ca, make_cert, path, run, write)

t = Tap()
init("gkm-keyless-sig.")
BUILD = os.environ.get("GKM_BUILD", os.path.join(ROOT, "build"))
FAKE = os.path.join(BUILD, "spec", "fake-sigstore")
JS = os.path.join(ROOT, "spec", "sigstore-js")
GITHUB = "https://token.actions.githubusercontent.com"
WORKFLOW = "https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main"
GITLAB = "https://gitlab.example"
IDENTITIES = f"""- name: release
  issuer: {GITHUB}
  subject: {WORKFLOW}
- name: gitlab-tags
  issuerRegExp: ^https://gitlab\\.example$
  subjectRegExp: ^https://gitlab\\.example/team/[a-z-]+//\\.gitlab-ci\\.yml@refs/tags/v\\d+$
"""

# name: (form, case, more fake-sigstore flags, None when accepted, else what the refusal says)
CASES = {
    "valid": ("simple", "valid", [], None),
    "bundle": ("bundle-0.3", "valid", [], None),
    "bundle-v01": ("bundle-0.1", "valid", [], None),
    "regexp": ("simple", "valid", ["--issuer", GITLAB, "--subject",
                                   GITLAB + "/team/kernels//.gitlab-ci.yml@refs/tags/v3"], None),
    "wrong-issuer": ("simple", "valid", ["--issuer", "https://accounts.evil.example"],
                     "issuer: the certificate's OIDC issuer 'https://accounts.evil.example'"),
    "wrong-subject": ("simple", "valid", ["--subject", WORKFLOW.replace("/repo/", "/fork/")],
                      "subject: the certificate's identity 'https://github.com/org/fork/"),
    "untrusted-ca": ("simple", "untrusted-ca", [], "untrusted root"),
    "expired": ("simple", "expired", [], "expired at integration"),
    "tampered-time": ("simple", "tampered-time", [],
                      "signed entry timestamp of log entry 31337 does not verify"),
    "other-payload": ("simple", "other-payload", [], "the log entry is for another payload"),
    "other-digest": ("simple", "other-digest", [], "payload: payload is for image sha256:0000"),
    "no-entry": ("simple", "no-entry", [], "no log entry"),
    "bundle-no-set": ("bundle-0.3", "proof-no-set", [], "no signed entry timestamp"),
    "bundle-other-payload": ("bundle-0.2", "other-payload", [],
                             "the log entry is for another payload"),
}


def js_available():
    return shutil.which("node") and os.path.isdir(os.path.join(JS, "node_modules", "@sigstore"))


def node(script, *args):
    return subprocess.run(["node", os.path.join(JS, script), *args], capture_output=True,
                          text=True, cwd=JS)


def sign(reg, name, digest, form, case, flags):
    out = path("sig", name)
    run(FAKE, "sign", path("root"), out, "--digest", digest, "--ref", f"{reg.addr}/keyless/{name}",
        "--form", form, "--case", case, *flags)
    repo = f"keyless/{name}"
    if form == "simple":
        ann = {"dev.cosignproject.cosign/signature": open(os.path.join(out, "signature.b64")).read(),
               "dev.sigstore.cosign/certificate": open(os.path.join(out, "cert.pem")).read(),
               "dev.sigstore.cosign/chain": open(os.path.join(out, "chain.pem")).read()}
        if os.path.exists(os.path.join(out, "rekor-bundle.json")):
            ann["dev.sigstore.cosign/bundle"] = open(os.path.join(out, "rekor-bundle.json")).read()
        reg.attach_simple(repo, digest, open(os.path.join(out, "payload.json"), "rb").read(), ann)
    else:
        reg.attach_bundle(repo, digest, open(os.path.join(out, "bundle.json"), "rb").read())


def sign_with_sigstore_js(reg, digest):
    """sigstore-js signs the image keyless (certificate from the test's CA)."""
    run(FAKE, "cert", path("root"), path("js"))
    p = node("sign_keyless.js", "--cert", path("js", "leaf.pem"), "--key", path("js", "leaf.key"),
             "--log-key", path("root", "rekor.key"), "--image", f"{reg.addr}/keyless/js",
             "--digest", digest, "--out", path("js", "bundle.json"))
    t.ok(p.returncode == 0, "sigstore-js signs an image keyless (offline)", diag=p.stderr)
    reg.attach_bundle("keyless/js", digest, open(path("js", "bundle.json"), "rb").read())


def check_cli(reg, cases):
    trust = ["--trust-dir", path("trust")]
    for name, want in cases.items():
        p = run(GKM, "cache", "verify", f"{reg.addr}/keyless/{name}:v1", *trust, check=False)
        out = p.stdout + p.stderr
        if want is None and name == "keyed":
            t.ok(p.returncode == 0 and "verified with key sha256:" in out,
                 "gkm cache verify accepts the image signed by the key beside them", diag=out)
        elif want is None:
            t.ok(p.returncode == 0 and "verified keyless: identity" in out and "rule '" in out,
                 f"gkm cache verify accepts {name}, naming the identity and the rule", diag=out)
        else:
            t.ok(p.returncode == 1 and want in out,
                 f"gkm cache verify refuses {name}: {want}", diag=out)
    image = f"{reg.addr}/keyless/valid:v1"
    p = run(GKM, "cache", "verify", image, "--trusted-root", path("root", "trusted_root.json"),
            "--certificate-identity", WORKFLOW, "--certificate-oidc-issuer", GITHUB, "-o", "json",
            check=False)
    doc = json.loads(p.stdout or "{}")
    t.ok(p.returncode == 0 and doc.get("identity") == WORKFLOW and doc.get("issuer") == GITHUB
         and doc.get("rule") == "command line" and doc.get("integratedTime", 0) > 0,
         "cosign's flags: --trusted-root, --certificate-identity, --certificate-oidc-issuer "
         "(JSON names identity, issuer, rule and time)", diag=p.stdout + p.stderr)
    p = run(GKM, "cache", "verify", image, "--trusted-root", path("root", "trusted_root.json"),
            "--certificate-identity-regexp", "^https://github\\.com/org/",
            "--certificate-oidc-issuer", GITHUB, check=False)
    t.ok(p.returncode == 0, "--certificate-identity-regexp", diag=p.stderr)
    p = run(GKM, "cache", "verify", image, "--trusted-root", path("root", "trusted_root.json"),
            "--certificate-identity", WORKFLOW, "--certificate-oidc-issuer",
            "https://gitlab.example", check=False)
    t.ok(p.returncode == 1 and "issuer:" in p.stderr, "the wrong issuer flag refuses it",
         diag=p.stderr)
    p = run(GKM, "cache", "verify", image, "--fulcio-ca", path("root", "fulcio.pem"),
            "--rekor-key", path("root", "rekor.pub"), "--identities", path("trust",
                                                                            "identities.yaml"),
            check=False)
    t.ok(p.returncode == 0, "plain PEM trust (--fulcio-ca, --rekor-key) and --identities",
         diag=p.stderr)
    p = run(GKM, "cache", "verify", image, "--trusted-root", path("root", "trusted_root.json"),
            check=False)
    t.ok(p.returncode != 0 and "no identity rule" in p.stderr,
         "a trusted root without an identity is refused as incomplete", diag=p.stderr)
    # inspect: who signed, before any trust is given, and verified with it
    p = run(GKM, "cache", "inspect", f"{reg.addr}/keyless/wrong-issuer:v1", check=False)
    t.ok(p.returncode == 0 and "Signed by:    " + WORKFLOW +
         " (issuer https://accounts.evil.example; " in p.stdout,
         "gkm cache inspect shows the identity and issuer a certificate names", diag=p.stdout)
    p = run(GKM, "cache", "inspect", f"{reg.addr}/keyless/bundle:v1", "--trust-dir",
            path("trust"), "-o", "json", check=False)
    sg = json.loads(p.stdout or "{}").get("signatures", {})
    t.ok(p.returncode == 0 and sg.get("verified") is True and sg.get("identity") == WORKFLOW
         and sg.get("issuer") == GITHUB and sg.get("rule") == "release"
         and sg.get("keyless", [{}])[0].get("identity") == WORKFLOW,
         "inspect -o json with the trust: verified, naming identity, issuer and rule", diag=p.stdout)
    for name, ok in (("valid", True), ("expired", False)):
        p = run(GKM, "cache", "extract", f"{reg.addr}/keyless/{name}:v1", path("x-" + name),
                "--trust-dir", path("trust"), check=False)
        t.ok((p.returncode == 0) == ok and os.path.isdir(path("x-" + name)) == ok,
             f"gkm cache extract {'extracts' if ok else 'refuses'} {name}", diag=p.stderr)


def check_webhook(reg, cases):
    make_ca("ca")
    make_cert("ca", "tls", "gkm-webhook")
    write(path("config.yaml"), "verify-enabled: true\nallow-unsigned-images: false\n")
    wh = Webhook("--tls-cert", path("tls.crt"), "--tls-key", path("tls.key"),
                 "--config", path("config.yaml"), "--trust-dir", path("trust"), "--plain-http",
                 "--retries", "1")
    for name, want in cases.items():
        resp = decide(wh, f"{reg.addr}/keyless/{name}:v1")
        msg = resp.get("status", {}).get("message", "")
        if want is None:
            t.ok(resp.get("allowed") is True, f"the webhook admits {name}", diag=resp)
        else:
            t.ok(resp.get("allowed") is False and want in msg,
                 f"the webhook refuses {name}: {want}", diag=resp)
    t.eq(wh.stop(), 0, "the webhook stops cleanly")


def check_agent(reg, cases):
    want = {n: "Ready" if w is None else "Failed" for n, w in cases.items()}
    got = agent_entries({n: f"{reg.addr}/keyless/{n}:v1" for n in cases},
                        ["--trust-dir", path("trust")], want)
    for name, words in cases.items():
        e = got[name]
        if words is None:
            t.eq(e.get("state"), "Ready", f"the agent verifies {name}: Ready")
        else:
            t.ok(e.get("state") == "Failed" and e.get("reason") == "SignatureNotTrusted"
                 and words in e.get("message", ""),
                 f"the agent refuses {name}: SignatureNotTrusted, {words}", diag=e)


def main():
    why = available()
    if why or not os.access(FAKE, os.X_OK):
        t.skip("keyless signatures", why or f"{FAKE} is not built (make spec-extra)")
        return
    reg = Registry()
    stops.append(reg.stop)
    run(FAKE, "init", path("root"))
    os.makedirs(path("trust"))
    os.makedirs(path("sig"))
    shutil.copy(path("root", "trusted_root.json"), path("trust", "trusted_root.json"))
    write(path("trust", "identities.yaml"), IDENTITIES)
    # a key beside the keyless trust: what it signs is accepted too
    run(GKM, "cache", "keygen", "--output-key-prefix", path("team"))
    shutil.copy(path("team.pub"), path("trust", "team.pem"))
    expect = {name: want for name, (_, _, _, want) in CASES.items()}
    expect["keyed"] = None
    for name in list(CASES) + ["keyed"] + (["js"] if js_available() else []):
        run(GKM, "cache", "build", FIXTURE, "-t", f"{reg.addr}/keyless/{name}:v1", "--label",
            f"test={name}")
    digests = {n: reg.digest(f"keyless/{n}", "v1") for n in list(CASES) + ["keyed"]}
    for name, (form, case, flags, _) in CASES.items():
        sign(reg, name, digests[name], form, case, flags)
    run(GKM, "cache", "sign", f"{reg.addr}/keyless/keyed:v1", "--key", path("team.key"))
    if js_available():
        sign_with_sigstore_js(reg, reg.digest("keyless/js", "v1"))
        expect["js"] = None
        p = node("verify_keyless.js", "--root", path("root", "trusted_root.json"), "--bundle",
                 path("sig", "bundle", "bundle.json"), "--digest", digests["bundle"],
                 "--issuer", GITHUB, "--subject", WORKFLOW)
        t.ok(p.returncode == 0, "sigstore-js verifies the bundle gkm accepts, with the same root",
             diag=p.stderr)
        p = node("verify_keyless.js", "--root", path("root", "trusted_root.json"), "--bundle",
                 path("sig", "bundle-no-set", "bundle.json"), "--digest",
                 digests["bundle-no-set"], "--issuer", GITHUB, "--subject", WORKFLOW)
        t.ok(p.returncode == 1, "and refuses, as gkm does, an entry without a signed time",
             diag=p.stdout)
    else:
        t.skip("sigstore-js cross-checks", "node or spec/sigstore-js/node_modules missing "
               "(make sigstore-js)")
    check_cli(reg, expect)
    check_webhook(reg, expect)
    check_agent(reg, expect)


stops = []
try:
    t.run("keyless signatures", main)
finally:
    for stop in stops:
        stop()
    cleanup()
sys.exit(t.finish())
