#!/usr/bin/python3
"""gkm webhook as users meet it: registered with a real kube-apiserver
(GKM_KUBE_ASSETS) through
a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration (TLS
verified against caBundle), GKMCache and ClusterGKMCache objects applied with
kubectl, images in a real registry signed with `gkm cache sign`. Asserts
what kubectl prints and what gets stored."""
import base64
import os
import subprocess
import sys

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeenv import KubeEnv, unavailable  # noqa: E402
from tap import Tap  # noqa: E402
from webhook_env import (ANN, FIXTURE, GKM, Registry, Webhook, available, cleanup,  # noqa: E402
                         init, make_cert, path, run)

t = Tap()
init("gkm-webhook-kubectl.")


def kubectl(kube, *args, stdin=None):
    return subprocess.run(["kubectl", "--kubeconfig", kube.kubeconfig, *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def manifest(kind, name, image, annotations=None):
    meta = f"  name: {name}\n"
    if kind == "GKMCache":
        meta += "  namespace: default\n"
    if annotations:
        meta += "  annotations:\n" + "".join(f"    {k}: \"{v}\"\n" for k, v in annotations.items())
    return (f"apiVersion: gkm.io/v1alpha1\nkind: {kind}\nmetadata:\n{meta}"
            f"spec:\n  image: \"{image}\"\n")


def configure(kube, port):
    with open(kube.ca, "rb") as f:
        ca = base64.b64encode(f.read()).decode()
    rules = [{"apiGroups": ["gkm.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["gkmcaches", "clustergkmcaches"]}]
    for kind, name, hook in (("MutatingWebhookConfiguration", "mutate.gkm.io", "/mutate"),
                             ("ValidatingWebhookConfiguration", "validate.gkm.io", "/validate")):
        st, body = kube.request("POST", "/apis/admissionregistration.k8s.io/v1/" + kind.lower() + "s", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "gkm"},
            "webhooks": [{"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "failurePolicy": "Fail", "timeoutSeconds": 10, "rules": rules,
                          "clientConfig": {"url": f"https://127.0.0.1:{port}{hook}", "caBundle": ca}}]})
        t.eq(st, 201, f"{kind} registered")


def main():
    why = available() or unavailable()
    if why:
        t.skip("webhook behind the API server", why)
        return
    kube = KubeEnv().start()
    kube.apply_crds()
    # the API server verifies the webhook against its own CA
    make_cert(None, "tls", "gkm-webhook", ca_cert=kube.ca, ca_key=kube.ca_key)
    os.makedirs(path("trust"))
    run(GKM, "cache", "keygen", "--output-key-prefix", path("trust", "team"))
    os.rename(path("trust", "team.key"), path("team.key"))
    reg = Registry()
    R = reg.addr
    for name in ("signed", "unsigned"):
        run(GKM, "cache", "build", FIXTURE, "-t", f"{R}/caches/{name}:v1", "--label", f"variant={name}")
    run(GKM, "cache", "sign", f"{R}/caches/signed:v1", "--key", path("team.key"))
    signed = reg.digest("caches/signed", "v1")
    wh = Webhook("--tls-cert", path("tls.crt"), "--tls-key", path("tls.key"),
                 "--trust-dir", path("trust"), "--plain-http")
    configure(kube, wh.port)

    p = kubectl(kube, "apply", "-f", "-", stdin=manifest("GKMCache", "llama", f"{R}/caches/signed:v1"))
    t.ok(p.returncode == 0 and "created" in p.stdout, "kubectl apply: a signed cache is created",
         diag=p.stdout + p.stderr)
    p = kubectl(kube, "get", "gkmc", "llama", "-o", "jsonpath={.metadata.annotations.gkm\\.io/resolvedDigest}")
    t.eq(p.stdout, signed, "the stored object carries the digest the registry serves")

    p = kubectl(kube, "apply", "-f", "-", stdin=manifest("GKMCache", "rogue", f"{R}/caches/unsigned:v1"))
    t.ok(p.returncode != 0 and 'admission webhook "mutate.gkm.io" denied the request: Unsigned: image '
         f'{R}/caches/unsigned:v1 has no signature and unsigned images are not allowed' in p.stderr,
         "kubectl apply: an unsigned cache is refused with the reason", diag=p.stderr)
    p = kubectl(kube, "get", "gkmc", "rogue")
    t.ok(p.returncode != 0 and "NotFound" in p.stderr, "...and nothing was stored", diag=p.stderr)

    p = kubectl(kube, "apply", "-f", "-", stdin=manifest("GKMCache", "typo", "Quay.io/Org/Cache:v1"))
    t.ok(p.returncode != 0 and "InvalidImageReference: spec.image: repository name" in p.stderr
         and "must be lowercase" in p.stderr,
         "kubectl apply: a malformed reference is refused with the parser's reason", diag=p.stderr)

    p = kubectl(kube, "annotate", "gkmc", "llama", "--overwrite", f"{ANN}=sha256:" + "0" * 64)
    t.ok(p.returncode != 0 and "ResolvedDigestMismatch" in p.stderr and signed in p.stderr,
         "kubectl annotate: changing the resolved digest by hand is refused", diag=p.stderr)
    p = kubectl(kube, "get", "gkmc", "llama", "-o", "jsonpath={.metadata.annotations.gkm\\.io/resolvedDigest}")
    t.eq(p.stdout, signed, "...and the stored digest is unchanged")
    p = kubectl(kube, "annotate", "gkmc", "llama", "team=a")
    t.ok(p.returncode == 0, "other annotations can still be changed", diag=p.stderr)

    p = kubectl(kube, "apply", "-f", "-", stdin=manifest(
        "GKMCache", "copied", f"{R}/caches/signed:v1", {ANN: "sha256:" + "1" * 64,
                                                          "kyverno.io/verify-images": "pass"}))
    t.ok(p.returncode == 0 and "was replaced by " + signed in p.stderr,
         "a digest written by hand at creation is replaced, and kubectl shows the warning",
         diag=p.stdout + p.stderr)
    p = kubectl(kube, "apply", "-f", "-", stdin=manifest(
        "GKMCache", "forged", f"{R}/caches/unsigned:v1", {"kyverno.io/verify-images": "pass"}))
    t.ok(p.returncode != 0 and "Unsigned" in p.stderr,
         "a kyverno.io/verify-images annotation does not get an unsigned image in", diag=p.stderr)

    p = kubectl(kube, "apply", "-f", "-", stdin=manifest("ClusterGKMCache", "shared", f"{R}/caches/signed:v1"))
    t.ok(p.returncode == 0, "kubectl apply: a signed ClusterGKMCache is created", diag=p.stderr)
    p = kubectl(kube, "get", "cgkmc", "shared", "-o", "jsonpath={.metadata.annotations.gkm\\.io/resolvedDigest}")
    t.eq(p.stdout, signed, "...with the resolved digest")

    t.eq(wh.stop(), 0, "the webhook stops cleanly")
    reg.stop()
    kube.stop()


try:
    t.run("webhook behind the API server", main)
finally:
    cleanup()
sys.exit(t.finish())
