#!/usr/bin/python3
"""A controller written in Lua (spec/e2e/kube_controller/node_counter.lua,
gkm.kube + core/lua/kube_controller.c, run by build/spec/kubetool) against a
real kube-apiserver (GKM_KUBE_ASSETS): informer caches read from Lua, status applied, Events,
secondary watches mapped to primary keys with a debounce, failing and
misbehaving reconciles retried with backoff without writing anything."""
import json
import os
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kube_client as kc  # noqa: E402  (helpers: Proc, kt, doc, ...)
from kubeenv import KubeEnv, unavailable  # noqa: E402

t = kc.t
GV = kc.GV


def cache(name, annotations=None):
    ann = ""
    if annotations:
        ann = "  annotations:\n" + "".join("    %s: \"%s\"\n" % kv for kv in annotations.items())
    return kc.doc(name + ".yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: %s\n"
                  "  namespace: default\n%sspec:\n  image: quay.io/gkm/cache-examples:v1\n" % (GV, name, ann))


def node(ks, name, caches):
    spec = kc.doc(name + ".yaml", "apiVersion: %s\nkind: GKMCacheNode\nmetadata:\n  name: %s\n"
                  "  namespace: default\n  labels:\n    gkm.io/test: \"yes\"\nspec:\n  nodeName: %s\n"
                  % (GV, name, name))
    rc, out = kc.kt(ks, "apply", spec, "--manager", "test")
    st = {"apiVersion": GV, "kind": "GKMCacheNode", "metadata": {"name": name, "namespace": "default"},
          "status": {"caches": {c: {"state": s} for c, s in caches.items()}}}
    rc2, out2 = kc.kt(ks, "apply", kc.doc(name + ".status.json", json.dumps(st)), "--manager",
                      "gkm-agent/" + name, "--status", "--force")
    return rc == 0 and rc2 == 0, (out, out2)


def status_of(ks, name):
    rc, out = kc.kt(ks, "get", GV, "GKMCache", "default", name)
    return out.get("status", {}) if rc == 0 else {}


def wait_status(ks, name, want, timeout=30):
    deadline = time.monotonic() + timeout
    st = {}
    while time.monotonic() < deadline:
        st = status_of(ks, name)
        if all(st.get(k) == v for k, v in want.items()):
            return True, st
        time.sleep(0.2)
    return False, st


def controller(ks):
    for n in ("c-a", "c-b"):
        kc.kt(ks, "create", cache(n))
    kc.kt(ks, "create", cache("c-fail", {"test/fail": "yes"}))
    kc.kt(ks, "create", cache("c-bad", {"test/bad-return": "yes"}))
    kc.kt(ks, "create", cache("c-badapply", {"test/bad-apply": "yes"}))
    for n, caches in (("n1", {"c-a": "Ready"}), ("n2", {"c-a": "Ready"}),
                      ("n3", {"c-a": "Failed", "c-b": "Ready", "c-fail": "Ready", "c-bad": "Ready",
                              "c-badapply": "Ready"})):
        ok, out = node(ks, n, caches)
        t.ok(ok, "node report %s" % n, diag=out)
    ctl = kc.Proc(ks, "controller", os.path.join(HERE, "kube_controller"), "node_counter",
                  "--manager", "gkm-test-operator", "--config", json.dumps({"namespace": "default"}))
    t.ok(ctl.wait_for(lambda p: any("started" in j for j in p.json_lines()), 30),
         "the Lua controller starts (watches() accepted)", diag=ctl.stderr_tail())
    ok, st = wait_status(ks, "c-a", {"totalNodes": 3, "readyNodes": 2})
    t.ok(ok, "reconcile counts from the informer caches and applies the status", diag=st)
    ok, st = wait_status(ks, "c-b", {"totalNodes": 1, "readyNodes": 1})
    t.ok(ok, "each cache gets its own counts", diag=st)
    rc, obj = kc.kt(ks, "get", GV, "GKMCache", "default", "c-a")
    mgrs = [m["manager"] for m in obj.get("metadata", {}).get("managedFields", [])
            if m.get("subresource") == "status"]
    t.ok("gkm-test-operator" in mgrs, "status written by the controller's field manager", diag=mgrs)

    # a node report changes: the map function enqueues the cache again
    ok, out = node(ks, "n3", {"c-a": "Ready", "c-b": "Ready", "c-fail": "Ready", "c-bad": "Ready",
                              "c-badapply": "Ready"})
    ok, st = wait_status(ks, "c-a", {"totalNodes": 3, "readyNodes": 3})
    t.ok(ok, "a changed node report reaches the cache through map()", diag=st)

    if not shutil.which("kubectl"):
        t.skip("Events queued by the reconcile show in kubectl describe", "kubectl is not installed")
    else:
        d = kc.subprocess.run(["kubectl", "--kubeconfig", ks.kubeconfig, "describe", "gkmc", "c-a"],
                              capture_output=True, text=True, timeout=60)
        t.ok("Counted" in d.stdout and "3 of 3 nodes ready" in d.stdout,
             "Events queued by the reconcile show in kubectl describe", diag=d.stdout)

    time.sleep(3)  # failing keys are retried with backoff meanwhile
    t.eq(status_of(ks, "c-fail"), {}, "a reconcile that raises writes nothing")
    t.eq(status_of(ks, "c-bad"), {},
         "a reconcile returning a bad value writes nothing, not even what it queued")
    t.eq(status_of(ks, "c-badapply"), {},
         "a reconcile queueing an invalid write writes nothing (checked before any runs)")
    rc = ctl.stop(signal.SIGTERM)
    stats = ctl.stats()
    t.ok(rc == 0, "controller exits cleanly on SIGTERM (no leak)", diag=ctl.stderr_tail())
    # c-fail and c-bad fail each time: retried, but with backoff, not in a loop
    errors = stats.get("reconcile_errors", 0)
    t.ok(3 <= errors <= 90, "failing reconciles are retried with backoff", diag=stats)
    log = "\n".join(ctl.err)
    t.ok("asked to fail" in log and "requeue_after must be a number" in log
         and "gkm.kube.apply: the object needs metadata.name" in log,
         "the errors are logged with the policy's message", diag=log[-3000:])


def main():
    if not os.access(kc.KT, os.X_OK):
        t.skip("kube controller end-to-end", "build/spec/kubetool not built (make spec-extra)")
        return t.finish()
    why = unavailable()
    if why:
        t.skip("kube controller end-to-end", why)
        return t.finish()
    with KubeEnv() as ks:
        ks.apply_crds()
        t.run("controller", lambda: controller(ks))
    return t.finish()


if __name__ == "__main__":
    sys.exit(main())
