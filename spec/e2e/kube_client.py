#!/usr/bin/python3
"""The Kubernetes client (core/kube/kube_*.c, driven by build/spec/kubetool, a
sanitizer build) over TLS with a bearer token. On a real kube-apiserver
(GKM_KUBE_ASSETS; skipped with the reason where it is not set): every verb,
apply by two field managers, leader election with the leader killed. On the
fault-injection server (spec/kube): watches that survive a server restart
and a server that is down, a 410 and broken streams."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))

from kubeenv import KubeEnv, unavailable  # noqa: E402
from kubeserver import KubeServer  # noqa: E402
from tap import Tap  # noqa: E402

KT = os.path.join(BUILD, "spec", "kubetool")
GV = "gkm.io/v1alpha1"
t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-kube-client.")


def env_for(ks):
    """The environment of kubetool and kubectl for server ks (its kubeconfig)."""
    e = dict(os.environ, KUBECONFIG=ks.kubeconfig, KUBETOOL_LOG="warn")
    e.pop("KUBERNETES_SERVICE_HOST", None)
    return e


def kt(ks, *args):
    """Run one kubetool verb: (exit code, JSON of its last stdout line)."""
    p = subprocess.run([KT] + list(args), env=env_for(ks), capture_output=True, text=True,
                       timeout=60)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = lines[-1]
    if p.returncode not in (0, 1):
        sys.stderr.write(p.stderr)
    return p.returncode, out


def doc(name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as fh:
        fh.write(text)
    return path


def cache(name, image="quay.io/gkm/cache-examples:vector-add-cache-rocm", labels=None,
          extra=""):
    lab = ""
    if labels:
        lab = "  labels:\n" + "".join("    %s: %s\n" % kv for kv in labels.items())
    return doc(name + ".yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: %s\n"
               "  namespace: default\n%sspec:\n  image: %s\n%s" % (GV, name, lab, image, extra))


def err_of(out):
    return out.get("error", {}) if isinstance(out, dict) else {}


class Proc:
    """A long-running kubetool (watch, lease) whose stdout lines are collected."""

    def __init__(self, ks, *args):
        self.p = subprocess.Popen([KT] + list(args), env=env_for(ks), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.err = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, args=(self.p.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.p.stderr, self.err), daemon=True).start()

    def _read(self, fh, into):
        for ln in fh:
            with self.lock:
                into.append(ln.rstrip("\n"))

    def json_lines(self):
        out = []
        with self.lock:
            for ln in self.lines:
                try:
                    out.append(json.loads(ln))
                except ValueError:
                    pass
        return out

    def wait_for(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self):
                return True
            time.sleep(0.05)
        return pred(self)

    def saw(self, typ, name):
        return any(j.get("type") == typ and j.get("name") == name for j in self.json_lines())

    def has_line(self, text):
        with self.lock:
            return text in self.lines

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        time.sleep(0.1)
        return self.p.returncode

    def stats(self):
        for j in reversed(self.json_lines()):
            if "stats" in j:
                return j["stats"]
        return {}

    def stderr_tail(self):
        with self.lock:
            return "\n".join(self.err[-30:])


def verbs(ks):
    for n, lab in (("c1", "demo"), ("c2", "demo"), ("c3", "other")):
        rc, out = kt(ks, "create", cache(n, labels={"app": lab}))
        t.ok(rc == 0 and out["metadata"]["name"] == n, "create %s" % n, diag=out)
    rc, out = kt(ks, "create", cache("c1"))
    t.ok(rc == 1 and err_of(out).get("reason") == "AlreadyExists" and err_of(out).get("code") == 409,
         "create of an existing name: AlreadyExists 409", diag=out)

    rc, c1 = kt(ks, "get", GV, "GKMCache", "default", "c1")
    t.ok(rc == 0 and c1["spec"]["image"].endswith("vector-add-cache-rocm"), "get", diag=c1)
    rc, out = kt(ks, "get", GV, "GKMCache", "default", "nope")
    t.ok(rc == 1 and err_of(out).get("reason") == "NotFound" and err_of(out).get("code") == 404
         and "nope" in err_of(out).get("message", ""), "get of a missing object: NotFound", diag=out)

    rc, out = kt(ks, "list", GV, "GKMCache", "default", "--limit", "1")
    t.eq(out.get("names") if rc == 0 else out, ["c1", "c2", "c3"], "list in pages of one (limit/continue)")
    rc, out = kt(ks, "list", GV, "GKMCache", "default", "--selector", "app=demo")
    t.eq(out.get("names") if rc == 0 else out, ["c1", "c2"], "list with a label selector")
    rc, out = kt(ks, "list", GV, "GKMCache", "default", "--selector", "app in (other,x),!gone")
    t.eq(out.get("names") if rc == 0 else out, ["c3"], "list with a set-based label selector")
    rc, out = kt(ks, "list", GV, "GKMCache", "default", "--field", "metadata.name=c2")
    t.eq(out.get("names") if rc == 0 else out, ["c2"], "list with a field selector")
    rc, out = kt(ks, "list", GV, "GKMCache", "-")
    t.eq(out.get("names") if rc == 0 else out, ["c1", "c2", "c3"], "list across namespaces")

    stale = dict(c1)
    stale["metadata"] = dict(c1["metadata"], resourceVersion="1")
    stale["spec"] = {"image": "quay.io/gkm/cache-examples:other"}
    rc, out = kt(ks, "replace", doc("stale.json", json.dumps(stale)))
    t.ok(rc == 1 and err_of(out).get("reason") == "Conflict" and err_of(out).get("code") == 409,
         "replace with a stale resourceVersion: Conflict 409", diag=out)
    fresh = dict(stale)
    fresh["metadata"] = dict(c1["metadata"])
    rc, out = kt(ks, "replace", doc("fresh.json", json.dumps(fresh)))
    t.ok(rc == 0 and out["spec"]["image"].endswith(":other")
         and out["metadata"]["generation"] == c1["metadata"]["generation"] + 1,
         "replace with the current resourceVersion bumps generation", diag=out)

    rc, out = kt(ks, "create", doc("bad.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n"
                                   "  name: bad\n  namespace: default\nspec: {}\n" % GV))
    causes = err_of(out).get("causes", [])
    t.ok(rc == 1 and err_of(out).get("reason") == "Invalid" and err_of(out).get("code") == 422
         and any(c.get("field") == "spec.image" for c in causes),
         "create without spec.image: Invalid 422 naming spec.image", diag=out)

    rc, c2 = kt(ks, "get", GV, "GKMCache", "default", "c2")
    rc, out = kt(ks, "delete", GV, "GKMCache", "default", "c2", "--uid",
                 "00000000-0000-0000-0000-000000000000")
    t.ok(rc == 1 and err_of(out).get("reason") == "Conflict", "delete with a wrong uid precondition: Conflict",
         diag=out)
    rc, out = kt(ks, "event", GV, "GKMCache", "default", "c2", "Verified", "signature verified by kubetool")
    t.ok(rc == 0, "event on an object", diag=out)
    if not shutil.which("kubectl"):
        t.skip("kubectl describe lists the Event (involvedObject.uid)", "kubectl is not installed")
    else:
        d = subprocess.run(["kubectl", "describe", "gkmc", "c2"], env=env_for(ks), capture_output=True,
                           text=True, timeout=60)
        t.ok(d.returncode == 0 and "Verified" in d.stdout and "signature verified by kubetool" in d.stdout,
             "kubectl describe lists the Event (involvedObject.uid)", diag=d.stdout + d.stderr)
    rc, out = kt(ks, "delete", GV, "GKMCache", "default", "c2", "--uid", c2["metadata"]["uid"])
    t.ok(rc == 0, "delete with the right uid precondition", diag=out)
    rc, out = kt(ks, "get", GV, "GKMCache", "default", "c2")
    t.ok(rc == 1 and err_of(out).get("reason") == "NotFound", "deleted object is gone", diag=out)
    rc, out = kt(ks, "delete", GV, "GKMCache", "default", "c2")
    t.ok(rc == 1 and err_of(out).get("reason") == "NotFound", "delete of a missing object: NotFound", diag=out)


def managers(ks):
    """Server-side apply by two field managers on one object."""
    a1 = doc("alice1.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: shared\n"
             "  namespace: default\n  labels:\n    owner-a: \"yes\"\nspec:\n"
             "  image: quay.io/gkm/cache-examples:a\n" % GV)
    rc, out = kt(ks, "apply", a1, "--manager", "alice")
    t.ok(rc == 0 and out["metadata"]["labels"] == {"owner-a": "yes"}, "apply by alice creates the object",
         diag=out)
    b1 = doc("bob1.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: shared\n"
             "  namespace: default\n  labels:\n    owner-b: \"yes\"\n" % GV)
    rc, out = kt(ks, "apply", b1, "--manager", "bob")
    t.ok(rc == 0 and out["metadata"]["labels"] == {"owner-a": "yes", "owner-b": "yes"},
         "apply by bob of another field keeps alice's", diag=out)
    b2 = doc("bob2.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: shared\n"
             "  namespace: default\n  labels:\n    owner-b: \"yes\"\nspec:\n"
             "  image: quay.io/gkm/cache-examples:b\n" % GV)
    rc, out = kt(ks, "apply", b2, "--manager", "bob")
    causes = err_of(out).get("causes", [])
    t.ok(rc == 1 and err_of(out).get("code") == 409
         and any(c.get("reason") == "FieldManagerConflict" and c.get("field") == ".spec.image" for c in causes),
         "bob changing alice's field: 409 FieldManagerConflict on .spec.image", diag=out)
    rc, out = kt(ks, "apply", b2, "--manager", "bob", "--force")
    owners = {m["manager"]: json.dumps(m.get("fieldsV1", {})) for m in out.get("metadata", {}).get("managedFields", [])} if rc == 0 else {}
    t.ok(rc == 0 and out["spec"]["image"].endswith(":b") and "f:image" in owners.get("bob", "")
         and "f:image" not in owners.get("alice", ""),
         "force moves the field to bob", diag=out)
    a2 = doc("alice2.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: shared\n"
             "  namespace: default\n" % GV)
    rc, out = kt(ks, "apply", a2, "--manager", "alice")
    t.ok(rc == 0 and out["metadata"].get("labels") == {"owner-b": "yes"} and out["spec"]["image"].endswith(":b"),
         "alice no longer applying her label removes only it", diag=out)
    s1 = doc("st1.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: shared\n"
             "  namespace: default\nstatus:\n  totalNodes: 2\n" % GV)
    s2 = doc("st2.yaml", "apiVersion: %s\nkind: GKMCache\nmetadata:\n  name: shared\n"
             "  namespace: default\nstatus:\n  readyNodes: 1\n" % GV)
    rc1, o1 = kt(ks, "apply", s1, "--manager", "gkm-agent/node-1", "--status", "--force")
    rc2, o2 = kt(ks, "apply", s2, "--manager", "gkm-agent/node-2", "--status", "--force")
    st = o2.get("status", {}) if rc2 == 0 else {}
    t.ok(rc1 == 0 and rc2 == 0 and st.get("totalNodes") == 2 and st.get("readyNodes") == 1
         and o2["spec"]["image"].endswith(":b"),
         "status applied by two managers: both fields kept, spec untouched", diag=(o1, o2))


def watch_resilience(ks):
    w = Proc(ks, "watch", GV, "GKMCache", "default", "--timeout-s", "30", "--stall-ms", "3000")
    t.ok(w.wait_for(lambda p: any("synced" in j for j in p.json_lines())), "watch: initial list",
         diag=w.stderr_tail())
    kt(ks, "create", cache("w1"))
    t.ok(w.wait_for(lambda p: p.saw("ADDED", "w1")), "watch: ADDED w1")

    ks.restart()
    kt(ks, "create", cache("w2"))
    t.ok(w.wait_for(lambda p: p.saw("ADDED", "w2")), "watch survives an API server restart",
         diag=w.stderr_tail())

    # keep the client out (503 on watches) while w1 is deleted, w3 created and
    # history compacted: its resume must get 410 and relist
    ks.control("fault", {"stage": "request", "action": "status:503", "path": "watch=1", "count": 100000})
    ks.control("close-watches")
    time.sleep(0.5)
    kt(ks, "delete", GV, "GKMCache", "default", "w1")
    kt(ks, "create", cache("w3"))
    ks.control("compact")
    ks.control("clear-faults")
    t.ok(w.wait_for(lambda p: p.saw("DELETED", "w1") and p.saw("ADDED", "w3")),
         "after 410 Gone the relist reports what changed unseen", diag=w.stderr_tail())

    # a malformed line in the stream, then a stream cut mid-event
    for action, first, second in (("malformed", "w4", "w5"), ("truncate", "w6", "w7")):
        ks.control("fault", {"stage": "watch", "action": action, "count": 1})
        ks.control("close-watches")
        time.sleep(1.0)
        kt(ks, "create", cache(first))
        kt(ks, "create", cache(second))
        t.ok(w.wait_for(lambda p: p.saw("ADDED", first) and p.saw("ADDED", second)),
             "watch: %s stream: reconnect from the last resourceVersion, nothing lost" % action,
             diag=w.stderr_tail())

    # the server down for a while: backoff, no busy loop, then resume
    ks.stop()
    time.sleep(3)
    ks.start()
    kt(ks, "create", cache("w8"))
    t.ok(w.wait_for(lambda p: p.saw("ADDED", "w8")), "watch resumes after the server was down",
         diag=w.stderr_tail())
    rc, lst = kt(ks, "list", GV, "GKMCache", "default")
    final = w.json_lines()[-1].get("cached") if w.json_lines() else None
    rc2 = w.stop()
    st = w.stats()
    t.ok(rc2 == 0, "watch process exits cleanly on SIGTERM (no leak, no error)", diag=w.stderr_tail())
    t.eq(final, len(lst["names"]), "the cache holds exactly what the server lists")
    t.ok(st.get("relists_gone", 0) >= 1 and st.get("malformed", 0) >= 1,
         "stats count the 410 relist and the malformed stream", diag=st)
    # 3 s down with 200 ms .. 2 s backoff is a handful of attempts; a busy
    # loop would make thousands
    t.ok(st.get("failures", 0) <= 40, "no busy loop while the server is down", diag=st)


def leader_election(ks):
    args = ["default", "gkm-e2e-lease"]
    timing = ["--duration-ms", "3000", "--renew-ms", "2000", "--retry-ms", "300"]
    a = Proc(ks, "lease", *args, "pod-a", *timing)
    t.ok(a.wait_for(lambda p: p.has_line("leading"), 20), "contender a becomes the leader",
         diag=a.stderr_tail())
    b = Proc(ks, "lease", *args, "pod-b", *timing)
    time.sleep(4)  # longer than the lease: a renews, so b must not lead
    t.ok(not b.has_line("leading") and b.has_line("holder pod-a"),
         "b sees a as the holder and does not lead while a renews", diag=b.lines)
    a.stop(signal.SIGKILL)
    t.ok(b.wait_for(lambda p: p.has_line("leading"), 30), "after a is killed, b takes over once the lease expires",
         diag=b.stderr_tail())
    st, lease = ks.request("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/gkm-e2e-lease")
    spec = lease.get("spec", {}) if st == 200 else {}
    t.ok(spec.get("holderIdentity") == "pod-b" and spec.get("leaseTransitions", 0) >= 1,
         "the Lease names b, with a transition counted", diag=lease)
    rc = b.stop(signal.SIGTERM)
    st, lease = ks.request("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/gkm-e2e-lease")
    t.ok(rc == 0 and b.has_line("stopped") and lease.get("spec", {}).get("holderIdentity") == "",
         "b releases the Lease on SIGTERM", diag=(rc, lease, b.stderr_tail()))


def main():
    if not os.access(KT, os.X_OK):
        t.skip("kube client end-to-end", "build/spec/kubetool not built (make spec-extra)")
        return t.finish()
    why = unavailable()
    if why:
        print("# real kube-apiserver: skipped: %s" % why)
        t.skip("kube client verbs, apply and leases on a real kube-apiserver", why)
    else:
        with KubeEnv() as ks:
            ks.apply_crds()
            for name, fn in (("verbs", verbs), ("managers", managers), ("lease", leader_election)):
                t.run(name, lambda fn=fn: fn(ks))
    with KubeServer(tls=True, token="gkm-e2e-token") as ks:
        t.run("watch", lambda: watch_resilience(ks))
    return t.finish()


if __name__ == "__main__":
    sys.exit(main())
