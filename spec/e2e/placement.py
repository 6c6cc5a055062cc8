#!/usr/bin/python3
"""Pod placement end to end, on a real control plane: kube-apiserver with etcd
and the real kube-scheduler (GKM_KUBE_ASSETS), gkm's CRDs, the gkm webhook
(sanitizer build) in the API server's admission chain by URL with caBundle,
for caches and for Pods, watching the caches through the API server; a real
registry with cache images built and signed by `gkm cache`; Node objects made
through the API (the Node labels of the cache scheme are set by hand here,
where the operator sets them in a cluster).

Shows: pods that mount a cache bound only to nodes carrying its label (and a
pod waiting Pending until a node gets it, with an admission warning), pods
without a cache or outside the opted-in namespaces untouched, the decision in
the pod's gkm.io/placement annotation and in Events on the cache, placement
failing open when the webhook is down, the placement policy reloaded live.
kube-apiserver v1.26 has no image volumes (KEP-4639 came in v1.31), so image
volumes and malformed pods are posted to /mutate-pods as AdmissionReviews the
way the API server sends them: an image volume naming a cache image is
verified (unsigned or untrusted refused) and pinned to the digest, one naming
no cache is left alone, and no malformed pod crashes the webhook."""
import base64
import http.client
import json
import os
import shutil
import ssl
import sys
import time
import urllib.request

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import webhook_env as env  # noqa: E402
from kubeenv import KubeEnv, free_port, unavailable  # noqa: E402
from tap import Tap  # noqa: E402

t = Tap()
GKM = env.GKM
LABEL = "team-a.gkmcache.gkm.io/llama"
API = "/apis/gkm.io/v1alpha1"


def wait(pred, timeout=30, step=0.2):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


class Placement:
    def __init__(self):
        self.kube = KubeEnv(scheduler=True)
        self.kube.start()
        self.kube.apply_crds()
        self.reg = env.Registry()
        self.wh = None
        self.port = free_port()

    # ---- the webhook and its registration ----
    def start_webhook(self):
        crt, key = self.kube.sign_cert("webhook", ["127.0.0.1"])
        self.wh = env.Webhook("--listen", "127.0.0.1:%d" % self.port, "--tls-cert", crt,
                              "--tls-key", key, "--trust-dir", env.path("trust"),
                              "--policy-dir", env.path("policies"),
                              "--plain-http",
                              "--pod-placement", "true", "--kubeconfig", self.kube.kubeconfig,
                              "--event-interval-ms", "300", "--deadline-ms", "8000")
        return wait(lambda: self.ready(), 30)

    def ready(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % self.wh.health,
                                        timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def register(self):
        ca = base64.b64encode(open(self.kube.ca, "rb").read()).decode()
        url = "https://127.0.0.1:%d" % self.port

        def hook(name, path, rules, failure, **sel):
            return dict({"name": name, "admissionReviewVersions": ["v1"],
                         "sideEffects": "NoneOnDryRun", "failurePolicy": failure,
                         "timeoutSeconds": 10, "rules": rules,
                         "clientConfig": {"url": url + path, "caBundle": ca}}, **sel)
        caches = [{"apiGroups": ["gkm.io"], "apiVersions": ["v1alpha1"],
                   "operations": ["CREATE", "UPDATE"],
                   "resources": ["gkmcaches", "clustergkmcaches"]}]
        pods = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                 "resources": ["pods"]}]
        skip = {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", "gkm-system"]}
        # as the chart: opted-in namespaces (pods may opt out), or a pod that opts in
        # elsewhere; the two never both match one pod
        by_ns = hook("pods.placement.gkm.io", "/mutate-pods", pods, "Ignore",
                     namespaceSelector={"matchExpressions": [
                         skip, {"key": "gkm.io/placement", "operator": "In",
                                "values": ["enabled"]}]},
                     objectSelector={"matchExpressions": [
                         {"key": "gkm.io/placement", "operator": "NotIn",
                          "values": ["disabled"]}]})
        by_pod = hook("pods-optin.placement.gkm.io", "/mutate-pods", pods, "Ignore",
                      namespaceSelector={"matchExpressions": [
                          skip, {"key": "gkm.io/placement", "operator": "NotIn",
                                 "values": ["enabled"]}]},
                      objectSelector={"matchLabels": {"gkm.io/placement": "enabled"}})
        mutating = {"apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "MutatingWebhookConfiguration", "metadata": {"name": "gkm"},
                    "webhooks": [hook("gkmcaches.mutate.gkm.io", "/mutate", caches, "Fail"),
                                 by_ns, by_pod]}
        validating = {"apiVersion": "admissionregistration.k8s.io/v1",
                      "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gkm"},
                      "webhooks": [hook("gkmcaches.validate.gkm.io", "/validate", caches,
                                        "Fail")]}
        for doc in (mutating, validating):
            r = self.kube.kubectl("apply", "-f", "-", input=json.dumps(doc))
            if r.returncode != 0:
                raise RuntimeError(r.stderr)

    # ---- objects ----
    def create(self, path, obj):
        return self.kube.request("POST", path, obj)

    def pod(self, ns, name, volumes=(), labels=None, affinity=None, kubectl=False):
        spec = {"containers": [{"name": "c", "image": "registry.example/model-server:1"}],
                "volumes": list(volumes)}
        if affinity:
            spec["affinity"] = affinity
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
               "spec": spec}
        if kubectl:  # what a user sees, warnings included
            return self.kube.kubectl("create", "-f", "-", input=json.dumps(obj))
        return self.create("/api/v1/namespaces/%s/pods" % ns, obj)

    def get(self, path):
        st, obj = self.kube.request("GET", path)
        return obj if st == 200 else None

    def node_of(self, ns, name, timeout=30):
        def bound():
            p = self.get("/api/v1/namespaces/%s/pods/%s" % (ns, name))
            return p and p.get("spec", {}).get("nodeName")
        return wait(bound, timeout)

    def unschedulable(self, ns, name, timeout=20):
        def cond():
            p = self.get("/api/v1/namespaces/%s/pods/%s" % (ns, name)) or {}
            for c in p.get("status", {}).get("conditions", []):
                if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return c.get("message") or True
            return None
        return wait(cond, timeout)

    def label_node(self, node, key, value):
        return self.kube.request("PATCH", "/api/v1/nodes/" + node,
                                 {"metadata": {"labels": {key: value}}},
                                 "application/merge-patch+json")

    def set_status(self, ns, name, ready, total):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        st = {"readyNodes": ready, "totalNodes": total, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False",
             "reason": "Ready" if ready else "NoReadyNode", "message": "set by the test",
             "lastTransitionTime": now}]}
        return self.kube.request("PATCH", "%s/namespaces/%s/gkmcaches/%s/status" % (API, ns, name),
                                 {"status": st}, "application/merge-patch+json")

    # ---- direct AdmissionReviews ----
    def review(self, ns, pod, uid="pod-review-1", raw=None):
        doc = raw if raw is not None else json.dumps({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": ns, "operation": "CREATE", "object": pod,
                        "dryRun": False}})
        ctx = ssl.create_default_context(cafile=self.kube.ca)
        c = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=30)
        c.request("POST", "/mutate-pods", body=doc, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(body).get("response")
        except ValueError:
            return r.status, body

    def stop(self):
        if self.wh and self.wh.p.poll() is None:
            self.wh.stop()
        self.reg.stop()
        self.kube.stop()


def patch_of(resp):
    return json.loads(base64.b64decode(resp["patch"])) if resp and "patch" in resp else []


def csi(name, cache, ns=None):
    attrs = {"cacheName": cache}
    if ns:
        attrs["cacheNamespace"] = ns
    return {"name": name, "csi": {"driver": "csi.gkm.io", "volumeAttributes": attrs}}


def image_pod(ref, name="img"):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vllm-img", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": "vllm"}],
                     "volumes": [{"name": name, "image": {"reference": ref}}]}}


def placement_of(pod):
    ann = (pod or {}).get("metadata", {}).get("annotations", {}) or {}
    return json.loads(ann["gkm.io/placement"]) if "gkm.io/placement" in ann else None


def required_keys(pod):
    na = (pod or {}).get("spec", {}).get("affinity", {}).get("nodeAffinity", {})
    terms = na.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", [])
    return [[e["key"] for e in term.get("matchExpressions", [])] for term in terms]


def env_of(pod, container=0):
    c = (pod or {}).get("spec", {}).get("containers", [{}] * (container + 1))[container]
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def mounting(name, volumes, containers):
    """A pod whose containers (name, mountPath, env) mount volume "kernels"."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"containers": [
                {"name": c, "image": "registry.example/model-server:1", "env": env or [],
                 "volumeMounts": [{"name": "kernels", "mountPath": mp}] if mp else []}
                for c, mp, env in containers], "volumes": volumes}}


def runtime_env(pl, events):
    """The runtime is pointed at the cache: the variable its image's labels
    call for, at each container's own mountPath, through the API server."""
    kube, R = pl.kube, pl.reg.addr
    cache = pl.get(API + "/namespaces/team-a/gkmcaches/llama")
    ann = (cache or {}).get("metadata", {}).get("annotations", {})
    t.eq(ann.get("gkm.io/runtime-env"), "TRITON_CACHE_DIR=io.triton.cache",
         "the webhook recorded the variable the cache image's labels call for "
         "(annotation gkm.io/runtime-env)")
    obj = mounting("server", [csi("kernels", "llama", "team-a")],
                   [("server", "/root/.triton", None), ("sidecar", None, None)])
    st, _ = pl.create("/api/v1/namespaces/team-a/pods", obj)
    pod = pl.get("/api/v1/namespaces/team-a/pods/server")
    t.eq((st, env_of(pod, 0), env_of(pod, 1)),
         (201, {"TRITON_CACHE_DIR": "/root/.triton/io.triton.cache"}, {}),
         "a container mounting the cache gets TRITON_CACHE_DIR at its mountPath; one that does "
         "not mount it gets nothing")
    obj = mounting("own", [csi("kernels", "llama", "team-a")],
                   [("server", "/cache", [{"name": "TRITON_CACHE_DIR", "value": "/tmp/mine"}])])
    r = kube.kubectl("create", "-f", "-", input=json.dumps(obj))
    pod = pl.get("/api/v1/namespaces/team-a/pods/own")
    t.ok(r.returncode == 0 and "container server sets TRITON_CACHE_DIR to /tmp/mine, so the "
         "cache mounted at /cache/io.triton.cache will never be read" in r.stderr
         and env_of(pod) == {"TRITON_CACHE_DIR": "/tmp/mine"},
         "a container that sets the variable itself keeps it; kubectl shows the warning",
         diag=(r.stderr, env_of(pod)))
    evs = wait(lambda: events("llama", "CacheNotRead"), 10)
    t.ok(evs and evs[0]["type"] == "Warning" and "/tmp/mine" in evs[0]["message"],
         "and a Warning Event CacheNotRead on the cache says why", diag=evs)
    # the cache says which variables and which containers (its own image
    # repository, so that image volumes of llama's still name llama)
    env.run(GKM, "cache", "build", env.FIXTURE, "-t", "%s/caches/custom:v1" % R)
    env.run(GKM, "cache", "sign", "%s/caches/custom:v1" % R, "--key", env.path("trusted.key"))
    st, _ = pl.create(API + "/namespaces/team-a/gkmcaches", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "custom", "namespace": "team-a"},
        "spec": {"image": "%s/caches/custom:v1" % R,
                 "runtimeEnv": {"containers": ["server"],
                                "variables": [{"name": "MY_KERNELS", "subPath": "io.triton.cache"}]}}})
    ok = wait(lambda: "MY_KERNELS" in json.dumps(patch_of(pl.review("team-a", mounting(
        "probe", [csi("kernels", "custom", "team-a")], [("server", "/k", None)]))[1])), 20)
    obj = mounting("custom", [csi("kernels", "custom", "team-a")],
                   [("server", "/k", None), ("warmup", "/w", None)])
    st2, _ = pl.create("/api/v1/namespaces/team-a/pods", obj)
    pod = pl.get("/api/v1/namespaces/team-a/pods/custom")
    t.eq((st, bool(ok), env_of(pod, 0), env_of(pod, 1)),
         (201, True, {"MY_KERNELS": "/k/io.triton.cache"}, {}),
         "spec.runtimeEnv names the variables and the containers that get them")
    # a pod that names only the cache's claim gets the variable too (no affinity:
    # the claim's volume carries it)
    st, _ = pl.create(API + "/namespaces/team-a/gkmcaches", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "claimed", "namespace": "team-a"},
        "spec": {"image": "%s/caches/custom:v1" % R, "claim": {"name": "kernels-claim"}}})
    vol = {"name": "kernels", "persistentVolumeClaim": {"claimName": "kernels-claim"}}
    wait(lambda: "TRITON_CACHE_DIR" in json.dumps(patch_of(pl.review("team-a", mounting(
        "probe", [vol], [("server", "/c", None)]))[1])), 20)
    st2, _ = pl.create("/api/v1/namespaces/team-a/pods", mounting("by-claim", [vol], [("server", "/c", None)]))
    pod = pl.get("/api/v1/namespaces/team-a/pods/by-claim")
    t.eq((st, st2, env_of(pod), required_keys(pod)),
         (201, 201, {"TRITON_CACHE_DIR": "/c/io.triton.cache"}, []),
         "a pod mounting the cache's claim gets the variable, and no affinity from the webhook")
    other = {"name": "data", "persistentVolumeClaim": {"claimName": "someone-elses"}}
    st, resp = pl.review("team-a", mounting("plain-pvc", [other], [("server", "/d", None)]))
    t.ok(st == 200 and resp["allowed"] and "patch" not in resp and "warnings" not in resp,
         "a claim of no cache is left alone", diag=resp)

    # will it hit here? the identity the image records, against the pod's runtime
    hip = os.path.join(os.path.dirname(env.FIXTURE), "hip-gfx90a-vector-add")
    env.run(GKM, "cache", "build", hip, "-t", "%s/caches/hip:v1" % R)
    env.run(GKM, "cache", "sign", "%s/caches/hip:v1" % R, "--key", env.path("trusted.key"))
    st, c = pl.create(API + "/namespaces/team-a/gkmcaches", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "hip", "namespace": "team-a"},
        "spec": {"image": "%s/caches/hip:v1" % R}})
    t.eq((st, json.loads((c.get("metadata", {}).get("annotations") or {}).get(
        "gkm.io/runtime-identity") or "null")), (201, {"triton": ["3.2.0"]}),
        "the webhook records what compiled the cache (annotation gkm.io/runtime-identity)")
    wait(lambda: "compiled by" in json.dumps(pl.review("team-a", dict(mounting(
        "probe", [csi("kernels", "hip", "team-a")], [("server", "/k", None)]),
        metadata={"name": "probe", "annotations": {"gkm.io/runtime": "triton=3.3.0"}}))[1]), 20)
    for name, version in (("newer", "3.3.0"), ("same", "3.2.0")):
        obj = mounting(name, [csi("kernels", "hip", "team-a")], [("server", "/k", None)])
        obj["metadata"]["annotations"] = {"gkm.io/runtime": "triton=" + version}
        r = kube.kubectl("create", "-f", "-", input=json.dumps(obj))
        warned = "the pod runs triton=3.3.0, but GKMCache team-a/hip was compiled by triton 3.2.0: " \
                 "its kernels will not hit" in r.stderr
        t.ok(r.returncode == 0 and warned == (version == "3.3.0"),
             "a pod declaring triton=%s: %s" % (version, "admitted with a warning that its kernels "
                                                 "will not hit" if warned else "no warning"),
             diag=r.stderr)
    evs = wait(lambda: events("hip", "RuntimeMismatch"), 10)
    t.ok(evs and evs[0]["type"] == "Warning" and "triton=3.3.0" in evs[0]["message"],
         "and a Warning Event RuntimeMismatch on the cache", diag=evs)

    # an image volume: the labels come with its check
    img = image_pod("%s/caches/llama:v1" % R)
    img["spec"]["containers"][0]["volumeMounts"] = [{"name": "img", "mountPath": "/triton"}]
    st, resp = pl.review("team-a", img)
    ops = {o["path"]: o.get("value") for o in patch_of(resp)}
    t.eq(ops.get("/spec/containers/0/env"),
         [{"name": "TRITON_CACHE_DIR", "value": "/triton/io.triton.cache"}],
         "an image volume of the cache's image sets the variable too")


def main():
    env.init("gkm-placement-e2e.")
    why = unavailable("kube-scheduler") or env.available()
    if why:
        t.skip("pod placement end to end", why)
        return
    os.makedirs(env.path("trust"))
    os.makedirs(env.path("policies"))
    shutil.copy(os.path.join(ROOT, "policies", "placement.lua"),
                env.path("policies", "placement.lua"))
    env.run(GKM, "cache", "keygen", "--output-key-prefix", env.path("trusted"))
    env.run(GKM, "cache", "keygen", "--output-key-prefix", env.path("stranger"))
    shutil.copy(env.path("trusted.pub"), env.path("trust", "team.pub"))

    pl = Placement()
    try:
        run(pl)
    finally:
        pl.stop()


def run(pl):
    kube, R = pl.kube, pl.reg.addr
    # images: the cache's (signed), another tag of its repository unsigned, one
    # signed by a key nobody trusts, and an image that is no cache at all
    fx = env.FIXTURE
    for tag, args in (("v1", []), ("v2", ["--label", "variant=unsigned"]),
                      ("v3", ["--label", "variant=stranger"])):
        env.run(GKM, "cache", "build", fx, "-t", "%s/caches/llama:%s" % (R, tag), *args)
    env.run(GKM, "cache", "build", fx, "-t", "%s/other/tool:v1" % R, "--label", "x=y")
    env.run(GKM, "cache", "sign", "%s/caches/llama:v1" % R, "--key", env.path("trusted.key"))
    env.run(GKM, "cache", "sign", "%s/caches/llama:v3" % R, "--key", env.path("stranger.key"))
    digest = pl.reg.digest("caches/llama", "v1")

    t.ok(pl.start_webhook(), "the webhook with --pod-placement is ready once it has listed "
         "the caches", diag=pl.wh.read_log()[-2000:])
    pl.register()
    t.ok(True, "registered in kube-apiserver's admission chain (caches: Fail; pods: Ignore)")

    for ns, opted in (("team-a", True), ("team-b", False)):
        kube.make_namespace(ns)
        if opted:
            kube.request("PATCH", "/api/v1/namespaces/" + ns,
                         {"metadata": {"labels": {"gkm.io/placement": "enabled"}}},
                         "application/merge-patch+json")
    for n in ("node-1", "node-2", "node-3"):
        kube.make_node(n)
    pl.label_node("node-1", LABEL, "ready")
    pl.label_node("node-1", "team-b.gkmcache.gkm.io/llama", "ready")

    st, c = pl.create(API + "/namespaces/team-a/gkmcaches", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {"image": "%s/caches/llama:v1" % R}})
    t.eq((st, c.get("metadata", {}).get("annotations", {}).get("gkm.io/resolvedDigest")),
         (201, digest), "GKMCache admitted by the webhook with its digest")
    pl.create(API + "/namespaces/team-b/gkmcaches", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "llama", "namespace": "team-b"},
        "spec": {"image": "%s/caches/llama:v1" % R}})
    pl.create(API + "/namespaces/team-a/gkmcaches", {
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "pending", "namespace": "team-a"},
        "spec": {"image": "%s/caches/llama:v1" % R}})
    st, _ = pl.set_status("team-a", "llama", 1, 3)
    t.eq(st, 200, "the cache's status says Ready on 1 of 3 nodes (as the operator would)")
    # the webhook learns it from its watch
    seen = wait(lambda: "ready on 1 of 3" in json.dumps(patch_of(pl.review(
        "team-a", {"metadata": {"name": "probe"}, "spec": {"volumes": [
            csi("k", "llama", "team-a")]}})[1])), 20)
    t.ok(seen, "the webhook sees the status through its watch")

    # ---- CSI volumes and the real scheduler ----
    names = ["vllm-%d" % i for i in range(4)]
    for n in names:
        pl.pod("team-a", n, [csi("kernels", "llama", "team-a")])
    nodes = [pl.node_of("team-a", n) for n in names]
    t.eq(nodes, ["node-1"] * 4, "pods mounting the cache are bound only to the node with "
         "its label (real kube-scheduler, 3 schedulable nodes)")
    pod = pl.get("/api/v1/namespaces/team-a/pods/vllm-0")
    t.eq(required_keys(pod), [[LABEL]], "required node affinity on the cache's label")
    ann = placement_of(pod)
    t.ok(ann and ann[0]["volume"] == "kernels" and ann[0]["mode"] == "required"
         and ann[0]["label"] == LABEL and ann[0]["cache"] == "GKMCache team-a/llama"
         and ann[0]["reason"] == "ready on 1 of 3 nodes",
         "annotation gkm.io/placement says what was added for which cache, and why", diag=ann)

    # onMiss: "empty" makes a miss a slow start: preferred, never required, so
    # the pod is bound even where its cache is Ready nowhere
    fallback = csi("kernels", "pending", "team-a")
    fallback["csi"]["volumeAttributes"]["onMiss"] = "empty"
    pl.pod("team-a", "fallback", [fallback])
    pod = pl.get("/api/v1/namespaces/team-a/pods/fallback")
    ann = placement_of(pod) or [{}]
    t.ok(pl.node_of("team-a", "fallback") in ("node-1", "node-2", "node-3")
         and required_keys(pod) == [] and ann[0].get("mode") == "preferred",
         "a pod whose volume says onMiss: \"empty\" is bound although no node has its cache "
         "(preferred affinity only)", diag=pod and (pod["spec"].get("affinity"), ann))

    pl.pod("team-a", "plain", [{"name": "scratch", "emptyDir": {}}])
    pod = pl.get("/api/v1/namespaces/team-a/pods/plain")
    t.ok(pod and placement_of(pod) is None and "affinity" not in pod["spec"],
         "a pod with no cache is untouched", diag=pod and pod["spec"])
    t.ok(pl.node_of("team-a", "plain"), "and scheduled as usual")

    pl.pod("team-b", "outside", [csi("kernels", "llama", "team-b")])
    pod = pl.get("/api/v1/namespaces/team-b/pods/outside")
    t.ok(pod and placement_of(pod) is None and "affinity" not in pod["spec"],
         "a pod in a namespace that did not opt in is untouched")
    pl.pod("team-b", "opted", [csi("kernels", "llama", "team-b")],
           labels={"gkm.io/placement": "enabled"})
    pod = pl.get("/api/v1/namespaces/team-b/pods/opted")
    t.eq(required_keys(pod), [["team-b.gkmcache.gkm.io/llama"]],
         "a pod that opts in with its own label gets placement there")
    pl.pod("team-a", "optout", [csi("kernels", "llama", "team-a")],
           labels={"gkm.io/placement": "disabled"})
    t.ok(placement_of(pl.get("/api/v1/namespaces/team-a/pods/optout")) is None,
         "a pod may opt out in an opted-in namespace")

    # an existing required term is ANDed with the cache
    pl.pod("team-a", "anded", [csi("kernels", "llama", "team-a")], affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": ["node-2"]}]}]}}})
    pod = pl.get("/api/v1/namespaces/team-a/pods/anded")
    t.eq(required_keys(pod), [["kubernetes.io/hostname", LABEL]],
         "the cache is ANDed into the pod's own required term")
    t.ok(pl.unschedulable("team-a", "anded"),
         "so a pod pinned to a node without the cache is not scheduled there")

    # a cache Ready nowhere: admitted with a warning, Pending until a node has it
    r = pl.pod("team-a", "waits", [csi("kernels", "pending", "team-a")], kubectl=True)
    t.ok(r.returncode == 0 and "no node has GKMCache team-a/pending (volume kernels) Ready "
         "yet; the pod stays Pending until a node has it Ready" in r.stderr,
         "a cache Ready nowhere: the pod is admitted, and kubectl shows the warning",
         diag=r.stdout + r.stderr)
    t.ok(pl.unschedulable("team-a", "waits"), "it waits Pending (Unschedulable), not "
         "in ContainerCreating on a node that will never have the cache")
    pl.label_node("node-3", "team-a.gkmcache.gkm.io/pending", "ready")
    t.eq(pl.node_of("team-a", "waits", 60), "node-3",
         "once a node carries the label, the scheduler binds the pod there")

    # Events on the cache (the pod had no uid at admission)
    def events(name, reason):
        st, ev = kube.request("GET", "/api/v1/namespaces/team-a/events?fieldSelector="
                              "involvedObject.name=%s,reason=%s" % (name, reason))
        return [e for e in ev.get("items", [])] if st == 200 else []
    evs = wait(lambda: events("llama", "PodPlaced"), 10)
    msgs = " | ".join(e["message"] for e in evs or [])
    t.ok(evs and evs[0]["involvedObject"]["kind"] == "GKMCache" and "team-a/vllm-" in msgs
         and "required node affinity " + LABEL + "=ready" in msgs,
         "an Event PodPlaced on the GKMCache names the pods and the affinity", diag=msgs)
    t.ok(wait(lambda: events("pending", "NoReadyNode"), 10),
         "a Warning Event NoReadyNode on a cache no node has Ready")
    d = kube.kubectl("describe", "gkmc", "llama", "-n", "team-a")
    t.ok("PodPlaced" in d.stdout, "kubectl describe gkmc shows them", diag=d.stdout[-1500:])

    runtime_env(pl, events)

    # ---- image volumes (posted as the API server would; v1.26 has no image volumes) ----
    st, resp = pl.review("team-a", image_pod("%s/caches/llama:v1" % R))
    ops = {o["path"]: o.get("value") for o in patch_of(resp)}
    t.ok(st == 200 and resp["allowed"] and ops.get("/spec/volumes/0/image/reference") ==
         "%s/caches/llama:v1@%s" % (R, digest),
         "an image volume naming the cache's image is verified and pinned to its digest",
         diag=resp)
    aff = json.dumps(ops.get("/spec/affinity"))
    t.ok(LABEL in aff and "required" in aff, "and placed like the cache", diag=aff)
    st, resp = pl.review("team-a", image_pod("%s/caches/llama:v2" % R))
    msg = resp.get("status", {}).get("message", "")
    t.ok(st == 200 and not resp["allowed"] and resp["status"]["reason"] == "Unsigned"
         and "volume 'img' mounts image" in msg and "GKMCache team-a/llama" in msg,
         "an unsigned image of a cache's repository is refused, with the reason", diag=resp)
    st, resp = pl.review("team-a", image_pod("%s/caches/llama:v3" % R))
    t.ok(not resp["allowed"] and resp["status"]["reason"] == "SignatureNotTrusted",
         "one signed by an untrusted key is refused", diag=resp)
    t.ok(wait(lambda: events("llama", "PodRefused"), 10),
         "a refusal is recorded as an Event on the cache")
    st, resp = pl.review("team-a", image_pod("%s/other/tool:v1" % R))
    t.ok(resp["allowed"] and "patch" not in resp,
         "an image volume naming no cache image is left alone", diag=resp)
    st, resp = pl.review("team-b", image_pod("%s/caches/llama:v1" % R) | {
        "metadata": {"name": "x", "namespace": "team-b"}})
    t.ok(resp["allowed"] and "team-b.gkmcache.gkm.io/llama" in json.dumps(patch_of(resp)),
         "another namespace's pod gets its own namespace's cache")

    # ---- malformed and excluded pods ----
    cases = [
        ("no volumes", {"metadata": {"name": "a"}, "spec": {}}, True),
        ("unknown volume types", {"metadata": {"name": "a"}, "spec": {"volumes": [
            {"name": "x", "futureVolume": {"size": 3}}, {"name": "y", "csi": {
                "driver": "other.csi"}}]}}, True),
        ("volumes not a list", {"spec": {"volumes": {"a": 1}}}, False),
        ("csi.gkm.io without cacheName", {"spec": {"volumes": [
            {"name": "k", "csi": {"driver": "csi.gkm.io"}}]}}, False),
        ("attribute of the wrong type", {"spec": {"volumes": [
            {"name": "k", "csi": {"driver": "csi.gkm.io",
                                  "volumeAttributes": {"cacheName": ["x"]}}}]}}, False),
        ("a cache of another namespace", {"spec": {"volumes": [
            csi("k", "llama", "team-b")]}}, False),
        ("affinity of the wrong shape", {"spec": {"affinity": {"nodeAffinity": []},
                                                  "volumes": [csi("k", "llama")]}}, False),
    ]
    for name, pod, allowed in cases:
        st, resp = pl.review("team-a", pod)
        good = st == 200 and isinstance(resp, dict) and resp["allowed"] == allowed and (
            allowed or (resp["status"]["reason"] == "InvalidPod" and resp["status"]["message"]))
        t.ok(good, "malformed pod, %s: %s" % (name, "allowed unchanged" if allowed else
                                              "refused with a message"), diag=resp)
    big = {"metadata": {"name": "big", "annotations": {"pad": "x" * (2 << 20)}},
           "spec": {"volumes": [{"name": "v%d" % i, "emptyDir": {}} for i in range(1000)]}}
    st, resp = pl.review("team-a", big)
    t.ok(st == 200 and resp["allowed"] and "patch" not in resp,
         "a 2 MiB pod with 1,000 volumes is answered (allowed, unchanged)")
    st, _ = pl.review("team-a", None, raw="{" * 7_000_000)
    t.eq(st, 413, "a body over the limit is refused with 413")
    st, resp = pl.review("kube-system", {"spec": {"volumes": [csi("k", "llama")]}})
    t.ok(resp["allowed"] and "patch" not in resp, "a pod of kube-system is never changed")
    t.ok(pl.ready(), "the webhook is alive and ready after all of that")

    # ---- the placement policy: checked as the daemons run it, then reloaded live ----
    r = env.run(GKM, "policy", "test", os.path.join(ROOT, "policies"),
                os.path.join(ROOT, "spec", "fixtures", "policy", "placement-cases.json"),
                check=False)
    t.ok(r.returncode == 0 and "2 passed, 0 failed" in r.stdout,
         "gkm policy test runs placement cases against the shipped policy", diag=r.stdout + r.stderr)
    env.write(env.path("policies", "placement.lua"), open(os.path.join(
        ROOT, "policies", "placement.lua")).read().replace(
        'placements[c.volume] = p\n',
        'placements[c.volume] = { mode = "preferred", weight = 7, reason = "test policy" }\n'))
    got = wait(lambda: "test policy" in json.dumps(patch_of(pl.review("team-a", {"spec": {
        "volumes": [csi("k", "llama")]}})[1])), 15)
    t.ok(got, "placement.lua edited in --policy-dir applies without a restart")
    pl.pod("team-a", "preferred", [csi("kernels", "llama", "team-a")])
    pod = pl.get("/api/v1/namespaces/team-a/pods/preferred")
    pref = pod["spec"].get("affinity", {}).get("nodeAffinity", {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution", [])
    t.ok(pref and pref[0]["weight"] == 7 and required_keys(pod) == [],
         "the policy's preferred placement and weight reach the pod", diag=pod["spec"])
    env.write(env.path("policies", "placement.lua"), "return {")
    time.sleep(1)
    st, resp = pl.review("team-a", {"spec": {"volumes": [csi("k", "llama")]}})
    t.ok(resp["allowed"] and "test policy" in json.dumps(patch_of(resp)),
         "a broken placement.lua is refused; the last good one keeps deciding")

    # ---- the webhook down: placement fails open ----
    rc = pl.wh.stop()
    t.eq(rc, 0, "SIGTERM: clean exit (sanitizers quiet)")
    st, _ = pl.pod("team-a", "while-down", [csi("kernels", "llama", "team-a")])
    pod = pl.get("/api/v1/namespaces/team-a/pods/while-down")
    t.ok(st == 201 and placement_of(pod) is None,
         "with the webhook down a pod is admitted unchanged (failurePolicy Ignore)")


if __name__ == "__main__":
    t.run("placement", main)
    env.cleanup()
    sys.exit(t.finish())
