#!/usr/bin/python3
"""/healthz, /readyz and /metrics of every daemon, end to end.

Starts `gkm up` (standalone) against a real registry with signed and unsigned
cache images, `gkm csi` on the very store and views `gkm up` wrote, `gkm
webhook` over real TLS, and `gkm agent` and `gkm operator` against a real
kube-apiserver (GKM_KUBE_ASSETS; their Kubernetes metrics are skipped with the
reason where it is not set); drives work through each (pulls, a cache hit,
compatibility verdicts, CSI publishes that succeed and fail, admission
reviews allowed and denied, policy reloads applied and refused, a policy that
fails at run time), then scrapes every daemon and checks the exposition with
a strict parser (spec/lib/promtext.py) and the values against what was done.

Every metric the C sources register must show up in some scrape, so a new
metric needs a line of work here. With GKM_METRICS_DUMP=FILE the scraped
families (name, type, help, labels, daemons) are written to FILE as JSON:
spec/lib/refdocs.py turns that into the metrics reference.
"""
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import promtext  # noqa: E402
from proc import Child, free_port, registry, sh, wait_for  # noqa: E402
import refdocs  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
FIXTURES = os.path.join(ROOT, "spec", "fixtures")
CUDA_CACHE = os.path.join(FIXTURES, "caches", "triton", "cuda-sm75-vector-add")
HIP_CACHE = os.path.join(FIXTURES, "caches", "triton", "hip-gfx90a-vector-add")
KERNEL = "io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin"

t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-metrics-e2e.")
cleanups = []
scrapes = {}  # daemon -> {family name: promtext.Family}
skipped = set()  # daemons that could not run here (their metrics are not required)


def path(*p):
    return os.path.join(tmp, *p)


def http_get(port, urlpath):
    """(status, content type, body) of GET http://127.0.0.1:port/urlpath."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", urlpath)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read().decode()
    finally:
        c.close()


class Health:
    """The health endpoint of a daemon called name, on a loopback port."""

    def __init__(self, name, port):
        self.name, self.port = name, port

    def get(self, urlpath):
        return http_get(self.port, urlpath)

    def ready(self):
        return self.get("/readyz")[0] == 200

    def scrape(self):
        status, ctype, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError("GET /metrics: HTTP %d" % status)
        return ctype, body

    def family(self, name, sample=None, **labels):
        """One value from a fresh scrape (None if absent)."""
        return v(promtext.parse(self.scrape()[1]), name, sample, **labels)


class Daemon(Health):
    """A gkm daemon with its log in tmp; its health port is given (port) or
    found in its log (a regex whose group 1 is the port)."""

    def __init__(self, name, args, port=None, port_re=None):
        super().__init__(name, port)
        self.port_re = port_re
        self.child = Child([GKM] + args, path(name + ".log"))
        self.logpath = self.child.logpath
        cleanups.append(self.stop)
        if port is None:
            self.port = wait_for(self._port_from_log, 30)
            if not self.port:
                raise RuntimeError("%s did not say its health port:\n%s" % (name, self.tail()))

    def _port_from_log(self):
        m = re.search(self.port_re, open(self.logpath).read())
        return int(m.group(1)) if m else None

    def tail(self, n=25):
        return self.child.tail(n)

    def stop(self):
        return self.child.stop()


# ---- the checks every daemon gets ----

def check_daemon(d, expect):
    """Health endpoints, a strict parse, naming conventions, then expect(fams)
    -> [(ok, name, diag)]. Keeps the families for the code-coverage check."""
    status, _, body = d.get("/healthz")
    t.ok(status == 200 and body == "ok\n", "%s: /healthz answers 200" % d.name, diag=(status, body))
    t.ok(d.ready(), "%s: /readyz answers 200" % d.name, diag=d.get("/readyz"))
    ctype, text = d.scrape()
    t.ok(ctype.startswith("text/plain") and "version=0.0.4" in ctype,
         "%s: /metrics is text/plain; version=0.0.4" % d.name, diag=ctype)
    try:
        fams = promtext.parse(text)
    except promtext.Error as e:
        t.ok(False, "%s: the exposition parses strictly" % d.name, diag="%s\n%s" % (e, text))
        return
    t.ok(fams, "%s: the exposition parses strictly, every family with HELP and TYPE (%d families)"
         % (d.name, len(fams)))
    bad = [n for n, f in fams.items() if not convention_ok(f)]
    t.ok(not bad, "%s: names follow the conventions (gkm_ prefix, counters _total, "
         "histograms in base units)" % d.name, diag=bad)
    scrapes[d.name] = fams
    for cond, name, diag in expect(fams):
        t.ok(cond, "%s: %s" % (d.name, name), diag=diag)


def convention_ok(f):
    if not f.name.startswith("gkm_") or not f.help.strip():
        return False
    if f.type == "counter":
        return f.name.endswith("_total")
    if f.type == "histogram":
        return f.name.endswith(("_seconds", "_bytes"))
    return not f.name.endswith("_total")


def v(fams, name, sample=None, **labels):
    return promtext.value(fams, name, sample, **labels)


def series(fams, name):
    f = fams.get(name)
    return [(s, ls, val) for s, ls, val in f.samples] if f else None


# ---- the parser itself must be able to fail ----

def test_parser_refuses():
    good = ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n"
            "# HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 1\n"
            "h_seconds_bucket{le=\"+Inf\"} 2\nh_seconds_sum 3.5\nh_seconds_count 2\n")
    fams = promtext.parse(good)
    t.ok(promtext.value(fams, "a_total", x=1) == 2 and
         promtext.value(fams, "h_seconds", "h_seconds_count") == 2,
         "promtext: a well-formed exposition parses")
    bad = {
        "a family without HELP": "# TYPE a_total counter\na_total 1\n",
        "a family without TYPE": "# HELP a_total A.\na_total 1\n",
        "a sample before TYPE": "# HELP a_total A.\na_total 1\n# TYPE a_total counter\n",
        "TYPE twice": "# HELP a A.\n# TYPE a gauge\n# TYPE a gauge\na 1\n",
        "a family split in two": "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\n# HELP b B.\n# TYPE b gauge\n"
                                 "b 1\na{x=\"2\"} 1\n",
        "the same series twice": "# HELP a A.\n# TYPE a gauge\na 1\na 2\n",
        "a bad label escape": "# HELP a A.\n# TYPE a gauge\na{x=\"\\t\"} 1\n",
        "an unquoted label value": "# HELP a A.\n# TYPE a gauge\na{x=1} 1\n",
        "a value that is not a number": "# HELP a A.\n# TYPE a gauge\na one\n",
        "a negative counter": "# HELP a_total A.\n# TYPE a_total counter\na_total -1\n",
        "buckets that are not cumulative": "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                           "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "+Inf bucket unlike _count": "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\n"
                                     "h_sum 1\nh_count 3\n",
        "a histogram without +Inf": "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\n"
                                    "h_count 1\n",
        "a missing final newline": "# HELP a A.\n# TYPE a gauge\na 1",
        "an unknown type": "# HELP a A.\n# TYPE a meter\na 1\n",
    }
    for name, text in bad.items():
        try:
            promtext.parse(text)
            t.ok(False, "promtext refuses %s" % name)
        except promtext.Error:
            t.ok(True, "promtext refuses %s" % name)


# ---- standalone: gkm up ----

def write_policies(d, **override):
    os.makedirs(d, exist_ok=True)
    for f in ("admission.lua", "compat.lua", "aggregate.lua"):
        text = override.get(f[:-4]) or open(os.path.join(ROOT, "policies", f)).read()
        with open(os.path.join(d, f + ".tmp"), "w") as out:
            out.write(text)
        os.replace(os.path.join(d, f + ".tmp"), os.path.join(d, f))


def gkm_get(state, kind, name, ns=None):
    out = sh(GKM, "get", "--state", state, kind, name, *(["-n", ns] if ns else []), "-o", "json")
    return json.loads(out)


def test_up(reg):
    state, pol = path("state"), path("up-policies")
    write_policies(pol)
    with open(path("caches.yaml"), "w") as f:
        f.write("""apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: vector-add, namespace: team-a}
spec: {image: %(r)s/caches/cuda:v1}
---
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata: {name: rocm-unsigned}
spec: {image: %(r)s/caches/rocm:v1}
""" % {"r": reg})
    sh(GKM, "apply", "--state", state, "-f", path("caches.yaml"))
    port = free_port()
    up = Daemon("up", ["up", "--state", state, "--node", "node-1", "--poll-ms", "100",
                       "--gpu-file", os.path.join(FIXTURES, "gpu", "inventory", "mixed.json"),
                       "--key", path("trusted.pub"), "--policy-dir", pol,
                       "--health-listen", "127.0.0.1:%d" % port], port=port)
    t.ok(wait_for(up.ready, 30), "gkm up becomes ready", diag=up.tail())

    def node_cache(name, ns):
        o = gkm_get(state, "gkmcn" if ns else "cgkmcn", "node-1", ns)
        return o["status"]["caches"][name]

    t.ok(wait_for(lambda: node_cache("vector-add", "team-a")["state"] == "Ready", 40),
         "the signed cache is Ready on the node", diag=up.tail())
    # the same image under another name, once the first is in the store: a hit
    with open(path("again.yaml"), "w") as f:
        f.write("apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: vector-add-again, "
                "namespace: team-a}\nspec: {image: %s/caches/cuda:v1}\n" % reg)
    sh(GKM, "apply", "--state", state, "-f", path("again.yaml"))
    t.ok(wait_for(lambda: node_cache("vector-add-again", "team-a")["state"] == "Ready", 30),
         "a second cache of the same image is Ready", diag=up.tail())
    refused = wait_for(lambda: node_cache("rocm-unsigned", None)["reason"] == "Unsigned", 30)
    t.ok(refused, "the unsigned image is refused (Unsigned)", diag=up.tail())
    # the operator aggregates after a debounce: wait for its status write
    wait_for(lambda: gkm_get(state, "gkmc", "vector-add", "team-a")["status"].get("readyNodes") == 1, 20)

    # policies: a valid change is applied, a syntax error refused
    first = up.family("gkm_policy_generation")
    with open(os.path.join(pol, "compat.lua"), "a") as f:
        f.write("-- edited: a comment changes the bundle digest\n")
    t.ok(wait_for(lambda: up.family("gkm_policy_generation") == first + 1, 20),
         "an edited policy is applied live (generation + 1)", diag=up.tail())
    write_policies(pol, aggregate="local M = {}\nfunction M.evaluate(input\n")
    t.ok(wait_for(lambda: up.family("gkm_policy_reloads_total",
                            result="refused"), 20),
         "a policy with a syntax error is refused", diag=up.tail())
    # a policy that loads but fails when it runs
    write_policies(pol, aggregate="local M = {}\nfunction M.evaluate(input)\n"
                                  "  error('site rule: no aggregation today')\nend\nreturn M\n")
    t.ok(wait_for(lambda: up.family("gkm_operator_errors_total", kind="policy"), 20),
         "a policy that raises fails the operator's aggregation", diag=up.tail())
    write_policies(pol)

    def expect(f):
        verdicts = {ls["reason"]: val for _, ls, val in series(f, "gkm_compat_verdicts_total") or []}
        return [
            (v(f, "gkm_pulls_total", result="pulled") == 1, "one pull extracted the signed image",
             series(f, "gkm_pulls_total")),
            ((v(f, "gkm_pulls_total", result="failed") or 0) >= 1, "the unsigned image's pull failed",
             series(f, "gkm_pulls_total")),
            ((v(f, "gkm_pull_bytes_total") or 0) > 1000, "pull bytes counted",
             v(f, "gkm_pull_bytes_total")),
            (v(f, "gkm_extraction_seconds", "gkm_extraction_seconds_count") == 1 and
             v(f, "gkm_extraction_seconds", "gkm_extraction_seconds_sum") is not None,
             "the extraction histogram has one observation", series(f, "gkm_extraction_seconds")),
            (v(f, "gkm_cache_hits_total") == 1, "the second cache of the same digest is a cache hit",
             v(f, "gkm_cache_hits_total")),
            (v(f, "gkm_agent_source_checks_total", result="shared") == 1 and
             (v(f, "gkm_agent_source_checks_total", result="checked") or 0) >= 2,
             "source checks: the signed and the unsigned image checked, the second cache of the "
             "same image served by the first one's check", series(f, "gkm_agent_source_checks_total")),
            (verdicts.get("Compatible", 0) > 0 and verdicts.get("BackendMismatch", 0) > 0,
             "compat verdicts by reason (Compatible, BackendMismatch)", verdicts),
            ((v(f, "gkm_agent_reconciles_total", result="ok") or 0) > 0, "agent reconciles counted",
             series(f, "gkm_agent_reconciles_total")),
            ((v(f, "gkm_agent_errors_total", kind="pull") or 0) >= 1, "agent errors by kind (pull)",
             series(f, "gkm_agent_errors_total")),
            ((v(f, "gkm_operator_reconciles_total", result="ok") or 0) > 0, "operator reconciles counted",
             series(f, "gkm_operator_reconciles_total")),
            ((v(f, "gkm_operator_status_writes_total", result="written") or 0) > 0,
             "operator status writes counted", series(f, "gkm_operator_status_writes_total")),
            ((v(f, "gkm_operator_errors_total", kind="policy") or 0) >= 1,
             "the failing aggregate policy is an operator error (policy)",
             series(f, "gkm_operator_errors_total")),
            ((v(f, "gkm_policy_reloads_total", result="applied") or 0) >= 3 and
             (v(f, "gkm_policy_reloads_total", result="refused") or 0) >= 1,
             "policy reloads: applied and refused", series(f, "gkm_policy_reloads_total")),
            ((v(f, "gkm_lua_errors_total", kind="error") or 0) >= 1, "Lua errors by kind",
             series(f, "gkm_lua_errors_total")),
        ]

    check_daemon(up, expect)
    return up, state


# ---- gkm csi on what gkm up extracted ----

def test_csi(state):
    import csi_client as cc
    import grpc
    reason = cc.mount_permitted(tmp)
    if reason:
        t.skip("gkm csi metrics", reason)
        skipped.add("csi")
        return
    cleanups.append(lambda: cc.unmount_below(tmp))
    pb, pbg = cc.load_stubs(path("py"))
    plugin = cc.Plugin(tmp, state, os.path.join(state, "run"), node_id="node-1", name="csi")
    plugin.start()
    cleanups.append(plugin.stop)
    d = Health("csi", plugin.health_port)
    pods = path("pods")

    def call(fn, req):
        try:
            fn(req, timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    tgt = os.path.join(pods, "p1", "mount")
    os.makedirs(os.path.dirname(tgt))
    with grpc.insecure_channel(plugin.endpoint) as ch:
        node = pbg.NodeStub(ch)
        C = grpc.StatusCode
        t.eq(call(node.NodeGetInfo, pb.NodeGetInfoRequest()), C.OK, "csi: NodeGetInfo")
        t.eq(call(node.NodePublishVolume, cc.publish_request(pb, "vol-1", tgt, "vector-add")), C.OK,
             "csi: the cache gkm up made ready is published")
        same = open(os.path.join(tgt, KERNEL), "rb").read() == open(os.path.join(CUDA_CACHE, KERNEL[16:]), "rb").read()
        t.ok(same, "csi: the pod sees the kernel binary gkm up extracted")
        vol_up = d.family("gkm_csi_volumes_published")
        t.eq(call(node.NodePublishVolume, cc.publish_request(pb, "vol-2", tgt + "2", "nosuch")),
             C.FAILED_PRECONDITION, "csi: a cache not on this node is FAILED_PRECONDITION")
        t.eq(call(node.NodePublishVolume, cc.publish_request(pb, "vol-3", tgt + "3", "vector-add",
                                                            pod_ns="team-b")),
             C.PERMISSION_DENIED, "csi: another namespace's cache is PERMISSION_DENIED")
        t.eq(call(node.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="vol-1", target_path=tgt)),
             C.OK, "csi: unpublished")
        t.eq(call(node.NodePublishVolume, cc.publish_request(pb, "vol-4", tgt + "4", "nosuch",
                                                            extra={"onMiss": "empty"})),
             C.OK, 'csi: a cache not on this node with onMiss: "empty" is published empty')
        t.eq(call(node.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="vol-4", target_path=tgt + "4")),
             C.OK, "csi: and unpublished")

    def expect(f):
        calls = {(ls["method"], ls["code"]): val for _, ls, val in series(f, "gkm_csi_calls_total") or []}
        return [
            (calls.get(("NodePublishVolume", "OK")) == 2 and
             calls.get(("NodePublishVolume", "FAILED_PRECONDITION")) == 1 and
             calls.get(("NodePublishVolume", "PERMISSION_DENIED")) == 1 and
             calls.get(("NodeUnpublishVolume", "OK")) == 2 and calls.get(("NodeGetInfo", "OK")) == 1,
             "calls by method and code", calls),
            (v(f, "gkm_csi_call_duration_seconds", "gkm_csi_call_duration_seconds_count",
               method="NodePublishVolume") == 4, "the latency histogram counts the four publishes",
             series(f, "gkm_csi_call_duration_seconds")),
            ({tuple(ls.items()): val for _, ls, val in series(f, "gkm_csi_fallback_total") or []}
             == {(("reason", "NotOnNode"),): 1}, "fallbacks by reason: the one NotOnNode",
             series(f, "gkm_csi_fallback_total")),
            (vol_up == 1 and v(f, "gkm_csi_volumes_published") == 0,
             "volumes published: 1 while mounted, 0 after", (vol_up, v(f, "gkm_csi_volumes_published"))),
        ]

    check_daemon(d, expect)


# ---- gkm webhook ----

def test_webhook(reg):
    import ssl
    for args in (["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                  "-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "2", "-subj", "/CN=test-ca"],
                 ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                  path("tls.key"), "-out", path("tls.csr"), "-subj", "/CN=gkm-webhook"],
                 ["x509", "-req", "-in", path("tls.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                  "-CAcreateserial", "-out", path("tls.crt"), "-days", "2", "-extfile", path("san.ext")]):
        if args[0] == "x509":
            with open(path("san.ext"), "w") as f:
                f.write("subjectAltName=IP:127.0.0.1\n")
        sh("openssl", *args)
    os.makedirs(path("trust"))
    shutil.copy(path("trusted.pub"), path("trust", "team.pub"))
    pol = path("webhook-policies")
    write_policies(pol)
    wh = Daemon("webhook", ["webhook", "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0",
                            "--log-format", "json", "--tls-cert", path("tls.crt"), "--tls-key",
                            path("tls.key"), "--trust-dir", path("trust"), "--policy-dir", pol,
                            "--reload-interval-ms", "200"],
                port_re=r'"msg":"webhook serving".*?"health_port":"?(\d+)')
    https = int(re.search(r'"https_port":"?(\d+)', open(wh.logpath).read()).group(1))
    ctx = ssl.create_default_context(cafile=path("ca.pem"))

    def review(image, uid):
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": uid, "kind": {"group": "gkm.io", "version": "v1alpha1", "kind": "GKMCache"},
            "resource": {"group": "gkm.io", "version": "v1alpha1", "resource": "gkmcaches"},
            "namespace": "team-a", "name": "c", "operation": "CREATE", "dryRun": False,
            "object": {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                       "metadata": {"name": "c", "namespace": "team-a"}, "spec": {"image": image}}}}
        c = http.client.HTTPSConnection("127.0.0.1", https, context=ctx, timeout=20)
        c.request("POST", "/mutate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        doc = json.loads(c.getresponse().read())
        c.close()
        return doc["response"]

    t.ok(review(reg + "/caches/cuda:v1", "u1").get("allowed") is True, "webhook: the signed image is allowed")
    t.ok(review(reg + "/caches/rocm:v1", "u2").get("allowed") is False, "webhook: the unsigned image is denied")
    with open(os.path.join(pol, "admission.lua"), "a") as f:
        f.write("-- edited\n")
    t.ok(wait_for(lambda: wh.family("gkm_policy_reloads_total", result="applied") >= 2,
                  20), "webhook: an edited admission policy is reloaded", diag=wh.tail())

    def expect(f):
        dec = [(ls["endpoint"], ls["result"], ls["reason"], val)
               for _, ls, val in series(f, "gkm_webhook_decisions_total") or []]
        return [
            (any(e == "mutate" and r == "allowed" for e, r, _, _ in dec) and
             any(e == "mutate" and r == "denied" for e, r, _, _ in dec),
             "decisions by endpoint, result and reason (allowed, denied)", dec),
            (v(f, "gkm_webhook_review_seconds", "gkm_webhook_review_seconds_count", endpoint="mutate") == 2,
             "the review latency histogram counts both reviews", series(f, "gkm_webhook_review_seconds")),
            ((v(f, "gkm_webhook_certificate_expiry_timestamp_seconds") or 0) > time.time(),
             "the certificate's expiry is in the future", v(f, "gkm_webhook_certificate_expiry_timestamp_seconds")),
        ]

    check_daemon(wh, expect)


# ---- gkm agent and gkm operator on a real kube-apiserver ----

def test_kube(reg):
    from kubeenv import KubeEnv, unavailable
    why = unavailable()
    if why:
        print("# real kube-apiserver: skipped: %s" % why)
        t.skip("gkm agent and gkm operator on a real kube-apiserver", why)
        skipped.update(("agent", "operator"))
        return
    ks = KubeEnv()
    cleanups.append(ks.stop)
    ks.start()
    ks.apply_crds()
    ks.make_namespace("gkm-system")
    kc = ["--kubeconfig", ks.kubeconfig, "--namespace", "gkm-system"]
    ports = free_port(), free_port()
    op = Daemon("operator", ["operator", "--leader-elect", "false", "--verify-enabled", "false",
                             "--health-listen", "127.0.0.1:%d" % ports[0]]
                + kc, port=ports[0])
    ag = Daemon("agent", ["agent", "--node", "node-1", "--gpu-source", "file", "--gpu-file",
                          os.path.join(FIXTURES, "gpu", "inventory", "t4.json"), "--root", path("agent-root"),
                          "--run-dir", path("agent-run"), "--verify-enabled", "false",
                          "--health-listen", "127.0.0.1:%d" % ports[1]] + kc, port=ports[1])
    for d in (op, ag):
        t.ok(wait_for(d.ready, 30), "%s becomes ready on the API server" % d.name, diag=d.tail())
    ks.request("POST", "/api/v1/namespaces",
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    # the agent's Node, which the operator labels once the cache is Ready there
    ks.request("POST", "/api/v1/nodes",
               {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
    status, body = ks.request("POST", "/apis/gkm.io/v1alpha1/namespaces/team-a/gkmcaches",
                                 {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                                  "metadata": {"name": "vector-add"},
                                  "spec": {"image": reg + "/caches/cuda:v1"}})
    t.ok(status == 201, "a GKMCache is created on the API server", diag=(status, body))

    # the agent checks and pulls it; the operator aggregates the node report
    t.ok(wait_for(lambda: ag.family("gkm_pulls_total", result="pulled") == 1, 40),
         "the agent pulls the cache", diag=ag.tail())
    t.ok(wait_for(lambda: op.family("gkm_operator_reconciles_total", result="ok"), 20),
         "the operator aggregates it", diag=op.tail())
    t.ok(wait_for(lambda: op.family("gkm_operator_node_label_applies_total", result="applied"), 20),
         "the operator labels node-1 with the cache", diag=op.tail())
    # watch streams are counted when they end: end them by restarting the
    # API server (the daemons watch again once it is back)
    ks.stop_apiserver()
    ks.start_apiserver()
    for d in (op, ag):
        wait_for(lambda: d.family("gkm_kube_watch_streams_total", code=200), 10)
        wait_for(d.ready, 30)

    def kube_expect(f):
        verbs = {(ls["verb"], ls["code"]) for _, ls, _ in series(f, "gkm_kube_requests_total") or []}
        return [
            (("GET", "200") in verbs and (("PATCH", "200") in verbs or ("PATCH", "201") in verbs),
             "Kubernetes API requests by verb and code", sorted(verbs)),
            ((v(f, "gkm_kube_watch_streams_total", code=200) or 0) > 0, "watch streams counted",
             series(f, "gkm_kube_watch_streams_total")),
            ((v(f, "gkm_kube_request_seconds", "gkm_kube_request_seconds_count", verb="GET") or 0) > 0,
             "API request latency histogram", None),
        ]

    check_daemon(op, lambda f: kube_expect(f) + [
        ((v(f, "gkm_operator_reconciles_total", result="ok") or 0) > 0, "operator reconciles counted",
         series(f, "gkm_operator_reconciles_total")),
        ((v(f, "gkm_operator_node_label_applies_total", result="applied") or 0) > 0,
         "Node label applies counted", series(f, "gkm_operator_node_label_applies_total"))])
    check_daemon(ag, lambda f: kube_expect(f) + [
        (v(f, "gkm_pulls_total", result="pulled") == 1, "the agent pulled once", series(f, "gkm_pulls_total"))])


def test_code_coverage():
    """Every metric the sources register was seen in some scrape."""
    seen = set()
    for fams in scrapes.values():
        seen.update(fams)
    missing = sorted(m["name"] for m in refdocs.code_metrics(ROOT)
                     if m["name"] not in seen and set(refdocs.served_by(m)) - skipped)
    t.ok(scrapes and not missing, "every metric registered in core/, webhook/ and csi/ was scraped",
         diag="not exercised by this test: %s" % missing)
    dump = os.environ.get("GKM_METRICS_DUMP")
    if dump:
        out = {}
        for daemon, fams in scrapes.items():
            for name, f in fams.items():
                e = out.setdefault(name, {"name": name, "type": f.type, "help": f.help,
                                          "labels": set(), "daemons": []})
                e["labels"].update(f.labels())
                e["daemons"].append(daemon)
        with open(dump, "w") as f:
            json.dump([dict(e, labels=sorted(e["labels"])) for _, e in sorted(out.items())], f, indent=1)


def main():
    test_parser_refuses()
    if not os.access("/usr/bin/docker-registry", os.X_OK):
        t.skip("daemons' metrics end to end", "/usr/bin/docker-registry missing")
        return
    reg, stop_registry = registry(ROOT)
    cleanups.append(stop_registry)
    sh(GKM, "cache", "keygen", "--output-key-prefix", path("trusted"))
    sh(GKM, "cache", "build", CUDA_CACHE, "-t", reg + "/caches/cuda:v1")
    sh(GKM, "cache", "build", HIP_CACHE, "-t", reg + "/caches/rocm:v1")
    sh(GKM, "cache", "sign", reg + "/caches/cuda:v1", "--key", path("trusted.key"))
    _, state = test_up(reg)
    t.run("csi", lambda: test_csi(state))
    t.run("webhook", lambda: test_webhook(reg))
    t.run("kube", lambda: test_kube(reg))
    test_code_coverage()


if __name__ == "__main__":
    try:
        t.run("metrics end to end", main)
    finally:
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception:  # noqa: BLE001 - clean up the rest anyway
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(t.finish())
