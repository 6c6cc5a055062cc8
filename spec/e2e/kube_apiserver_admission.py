#!/usr/bin/python3
"""The test API server calls admission webhooks the way kube-apiserver does:
AdmissionReview v1 over TLS verified against caBundle, to a clientConfig.url
or to a Service (mapped with --service-endpoint), for the operations,
resources and namespaces the rules select; mutating webhooks' JSON patches
are applied, denials and failures follow the failure policy, warnings reach
the client, and the reviews run outside the store lock."""
import base64
import json
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeserver import KubeServer  # noqa: E402
from tap import Tap  # noqa: E402

t = Tap()
DIGEST = "sha256:" + "12" * 32
G = "/apis/gkm.io/v1alpha1/namespaces/default/gkmcaches"
reviews = []
entered = threading.Event()
release = threading.Event()


class Hook(BaseHTTPRequestHandler):
    def log_message(self, *_a):
        pass

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        req = review["request"]
        reviews.append((self.path, req))
        obj = req.get("object") or {}
        image = (obj.get("spec") or {}).get("image", "")
        resp = {"uid": req["uid"], "allowed": True}
        if self.path == "/mutate":
            if "slow" in image:
                entered.set()
                release.wait(10)
            if not (obj.get("metadata") or {}).get("annotations"):
                ops = [{"op": "add", "path": "/metadata/annotations",
                        "value": {"gkm.io/resolvedDigest": DIGEST}}]
                resp.update({"patchType": "JSONPatch",
                             "patch": base64.b64encode(json.dumps(ops).encode()).decode()})
        elif self.path == "/validate":
            if "forbidden" in image:
                resp = {"uid": req["uid"], "allowed": False,
                        "status": {"code": 403, "reason": "Forbidden", "message": "image forbidden by policy"}}
            elif "unsigned" in image:
                resp["warnings"] = ["the image is not signed"]
        out = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "response": resp}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def webhook_server(tls_dir):
    """An HTTPS webhook whose certificate names 127.0.0.1 and the Service."""
    d = os.path.join(tls_dir, "hook")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "ext"), "w") as fh:
        fh.write("subjectAltName=IP:127.0.0.1,DNS:gkm-webhook.gkm.svc\n")
    run = lambda *c: subprocess.run(c, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", os.path.join(d, "key"),
        "-out", os.path.join(d, "csr"), "-subj", "/CN=gkm-webhook")
    run("openssl", "x509", "-req", "-in", os.path.join(d, "csr"), "-CA", os.path.join(tls_dir, "ca.crt"),
        "-CAkey", os.path.join(tls_dir, "ca.key"), "-CAcreateserial", "-days", "1",
        "-out", os.path.join(d, "crt"), "-extfile", os.path.join(d, "ext"))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(d, "crt"), os.path.join(d, "key"))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def cache(name, image, ns="default"):
    return {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
            "metadata": {"name": name, "namespace": ns}, "spec": {"image": image}}


def main():
    ks = KubeServer(tls=True, token="adm").start()
    hook = webhook_server(ks.tls_dir)      # its certificate is signed by the server's CA
    port = hook.server_address[1]
    ks.control("service-endpoint", {"service": "gkm/gkm-webhook", "address": "127.0.0.1:%d" % port})
    req = ks.request
    with open(ks.ca, "rb") as fh:
        ca = base64.b64encode(fh.read()).decode()
    rules = [{"apiGroups": ["gkm.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["gkmcaches", "clustergkmcaches"]}]
    st, _h, b = req("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "gkm"},
        "webhooks": [{"name": "mutate.gkm.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "clientConfig": {"url": "https://127.0.0.1:%d/mutate" % port, "caBundle": ca},
                      "rules": rules, "timeoutSeconds": 15,
                      "namespaceSelector": {"matchExpressions": [
                          {"key": "gkm.io/skip", "operator": "DoesNotExist"}]}}]})
    t.eq(st, 201, "a MutatingWebhookConfiguration (clientConfig.url)")
    st, _h, b = req("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "gkm"},
        "webhooks": [{"name": "validate.gkm.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "clientConfig": {"service": {"namespace": "gkm", "name": "gkm-webhook",
                                                   "path": "/validate"}, "caBundle": ca},
                      "rules": rules, "failurePolicy": "Fail"}]})
    t.eq(st, 201, "a ValidatingWebhookConfiguration (clientConfig.service)")

    st, _h, b = req("POST", G, cache("c1", "quay.io/gkm/cache:v1"))
    t.ok(st == 201 and b["metadata"].get("annotations") == {"gkm.io/resolvedDigest": DIGEST},
         "create: the mutating webhook's patch is applied", diag=b)
    ops = [(p, r["operation"], r["name"], r["namespace"], r["kind"]["kind"]) for p, r in reviews]
    t.eq(ops, [("/mutate", "CREATE", "c1", "default", "GKMCache"), ("/validate", "CREATE", "c1", "default",
                                                                     "GKMCache")],
         "mutating first, then validating, each with the request's identity")
    t.ok(reviews[1][1]["object"]["metadata"]["annotations"] == {"gkm.io/resolvedDigest": DIGEST},
         "the validating webhook sees the mutated object")
    reviews.clear()
    st, _h, b = req("POST", G, cache("c2", "quay.io/gkm/forbidden:v1"))
    t.ok(st == 403 and b["message"] == 'admission webhook "validate.gkm.io" denied the request: '
         'image forbidden by policy' and b["reason"] == "Forbidden", "a denial keeps its code and message",
         diag=b)
    t.eq(req("GET", G + "/c2")[0], 404, "...and nothing was stored")
    st, h, b = req("POST", G, cache("c3", "quay.io/gkm/unsigned:v1"))
    t.ok(st == 201 and "the image is not signed" in h.get("warning", ""), "webhook warnings reach the client",
         diag=h)
    reviews.clear()
    st, _h, b = req("PATCH", G + "/c1", {"spec": {"image": "quay.io/gkm/cache:v2"}},
                    content_type="application/merge-patch+json")
    upd = [r for p, r in reviews if p == "/validate"]
    t.ok(st == 200 and upd and upd[0]["operation"] == "UPDATE" and
         upd[0]["oldObject"]["spec"]["image"] == "quay.io/gkm/cache:v1" and
         upd[0]["object"]["spec"]["image"] == "quay.io/gkm/cache:v2",
         "update: the review carries the old and the new object", diag=upd)
    st, _h, b = req("PATCH", G + "/c1", {"spec": {"image": "quay.io/gkm/forbidden:v2"}},
                    content_type="application/merge-patch+json")
    t.eq(st, 403, "an update the webhook denies")
    t.eq(req("GET", G + "/c1")[2]["spec"]["image"], "quay.io/gkm/cache:v2", "...leaves the object as it was")
    reviews.clear()
    st, _h, b = req("PATCH", G + "/c4?fieldManager=ci", json.dumps(cache("c4", "quay.io/gkm/cache:v1")),
                    content_type="application/apply-patch+yaml")
    t.ok(st == 201 and b["metadata"].get("annotations") and len(reviews) == 2,
         "server-side apply creating an object is reviewed and mutated", diag=b)
    reviews.clear()
    st, _h, b = req("POST", G, dict(cache("", "quay.io/gkm/cache:v1"), metadata={"generateName": "gen-"}))
    names = {r["name"] for _p, r in reviews}
    t.ok(st == 201 and names == {b["metadata"]["name"]}, "generateName: the webhooks see the stored name",
         diag=(names, b.get("metadata")))
    reviews.clear()
    req("POST", G + "?dryRun=All", cache("c5", "quay.io/gkm/cache:v1"))
    t.ok(reviews and all(r["dryRun"] for _p, r in reviews), "dryRun requests say so to the webhook")
    reviews.clear()
    req("POST", "/apis/gkm.io/v1alpha1/namespaces/default/gkmcachenodes", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode", "metadata": {"name": "n1"},
        "spec": {"nodeName": "n1"}})
    t.eq(reviews, [], "objects the rules do not name are not reviewed")
    req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": "quiet", "labels": {"gkm.io/skip": "1"}}})
    st, _h, b = req("POST", G.replace("default", "quiet"), cache("q1", "quay.io/gkm/cache:v1", ns="quiet"))
    t.ok(st == 201 and [p for p, _r in reviews] == ["/validate"],
         "namespaceSelector: the mutating webhook skips a namespace it excludes", diag=reviews)

    # the review runs outside the store lock: other requests go on meanwhile
    reviews.clear()
    res = {}
    th = threading.Thread(target=lambda: res.update(w=req("POST", G, cache("slow", "quay.io/gkm/slow:v1"))))
    th.start()
    entered.wait(10)
    try:
        st, _h, _b = req("GET", G + "/c1", conn=ks.connection(timeout=5))
        ok = st == 200
    except OSError:
        ok = False
    release.set()
    th.join(20)
    t.ok(ok and res.get("w", (0,))[0] == 201, "a slow webhook does not stall other requests")

    hook.shutdown()
    hook.server_close()
    st, _h, b = req("POST", G, cache("down", "quay.io/gkm/cache:v1"))
    t.ok(st == 500 and 'failed calling webhook "mutate.gkm.io"' in b["message"],
         "a webhook that cannot be reached with failurePolicy Fail: 500", diag=b)
    req("PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gkm",
        [{"op": "add", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}],
        content_type="application/json-patch+json")
    req("DELETE", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gkm")
    st, _h, b = req("POST", G, cache("down2", "quay.io/gkm/cache:v1"))
    t.ok(st == 201 and not b["metadata"].get("annotations"), "...with failurePolicy Ignore the request goes on",
         diag=b)
    ks.cleanup()


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        import traceback
        t.ok(False, "the spec ran to the end", diag=traceback.format_exc())
    sys.exit(t.finish())
