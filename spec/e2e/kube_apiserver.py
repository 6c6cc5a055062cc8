#!/usr/bin/python3
"""The test API server answers the recorded requests of a real kube-apiserver
(spec/fixtures/kube-apiserver) the way it did: status codes, Status objects
with reason and causes, managedFields, resourceVersion and generation
behaviour, Table output, watch events, discovery and OpenAPI documents.

Each fixture is replayed in order against a fresh server; uids and
resourceVersions the real server chose are mapped to ours (resourceVersions
must keep their order), timestamps are compared by format."""
import base64
import glob
import json
import os
import re
import sys
import threading
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeserver import KubeServer  # noqa: E402
from tap import Tap  # noqa: E402

FIX = os.path.join(ROOT, "spec", "fixtures", "kube-apiserver")
TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
AGE = re.compile(r"^\d+s$")
TIME_KEYS = {"creationTimestamp", "time", "lastTransitionTime", "deletionTimestamp"}


def fixture(n):
    path = glob.glob(os.path.join(FIX, "%02d-*.json" % n))[0]
    with open(path) as fh:
        return json.load(fh)


def diff(a, b, path="$"):
    """First difference between two JSON values, or None."""
    if type(a) is not type(b):
        return "%s: %r != %r" % (path, a, b)
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                return "%s.%s: missing here, expected %r" % (path, k, b[k])
            if k not in b:
                return "%s.%s: unexpected %r" % (path, k, a[k])
            d = diff(a[k], b[k], "%s.%s" % (path, k))
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return "%s: length %d != %d (%r vs %r)" % (path, len(a), len(b), a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, "%s[%d]" % (path, i))
            if d:
                return d
        return None
    return None if a == b else "%s: %r != %r" % (path, a, b)


class Mapper:
    """Learns which of our uids / resourceVersions stand for the recorded ones."""

    def __init__(self):
        self.uids = {}
        self.rvs = {}
        self.errors = []

    def learn(self, exp, got):
        if isinstance(exp, dict) and isinstance(got, dict):
            for k, v in exp.items():
                if k not in got:
                    continue
                if k == "uid" and isinstance(v, str) and isinstance(got[k], str):
                    self.uids.setdefault(v, got[k])
                elif k == "resourceVersion" and isinstance(v, str) and v.isdigit() \
                        and isinstance(got[k], str) and got[k].isdigit():
                    self.learn_rv(int(v), int(got[k]))
                else:
                    self.learn(v, got[k])
        elif isinstance(exp, list) and isinstance(got, list):
            for x, y in zip(exp, got):
                self.learn(x, y)

    def learn_rv(self, rec, ours):
        if rec in self.rvs:
            if self.rvs[rec] != ours:
                self.errors.append("recorded resourceVersion %d maps to %d and %d"
                                   % (rec, self.rvs[rec], ours))
            return
        for r, o in self.rvs.items():
            if (r < rec) != (o < ours) or (r == rec) != (o == ours):
                self.errors.append("resourceVersion order differs: recorded %d<->%d, ours %d<->%d"
                                   % (r, rec, o, ours))
        self.rvs[rec] = ours

    def text(self, s):
        for a, b in self.uids.items():
            s = s.replace(a, b)
        return s

    def expected(self, v, key=None):
        """The recorded value in our terms (uids, versions, times)."""
        if isinstance(v, dict):
            return {k: self.expected(x, k) for k, x in v.items()}
        if isinstance(v, list):
            if key == "managedFields":
                v = sort_managed(v)
            return [self.expected(x) for x in v]
        if isinstance(v, str):
            if key in TIME_KEYS and TS.match(v):
                return "<time>"
            if key == "resourceVersion" and v.isdigit() and int(v) in self.rvs:
                return str(self.rvs[int(v)])
            return self.text(v)
        return v


def sort_managed(entries):
    """Entries the real server sorted by time within one second; times are
    not comparable across servers, so compare them in a fixed order."""
    return sorted(entries, key=lambda e: (e.get("operation", ""), e.get("manager", ""),
                                          e.get("subresource", "")))


def ours(v, key=None):
    if isinstance(v, dict):
        return {k: ours(x, k) for k, x in v.items()}
    if isinstance(v, list):
        if key == "managedFields":
            v = sort_managed(v)
        return [ours(x) for x in v]
    if isinstance(v, str) and key in TIME_KEYS and TS.match(v):
        return "<time>"
    return v


def table_ages(tbl):
    """Replace date cells (ages) by a marker once they look like ages."""
    cols = tbl.get("columnDefinitions") or []
    for row in tbl.get("rows") or []:
        for i, c in enumerate(cols):
            if c.get("type") == "date" and isinstance(row["cells"][i], str) and AGE.match(row["cells"][i]):
                row["cells"][i] = "<age>"
    return tbl


DISCOVERY = re.compile(r"^/(api|apis|api/v1|apis/[^/]+/[^/]+|openapi/v3.*)$")
LOG_REQ = re.compile(r"round_trippers\.go:\d+\] (GET|POST|PUT|PATCH|DELETE) https?://[^/]+(\S*)")
LOG_HDR = re.compile(r"round_trippers\.go:480\]\s+([A-Za-z-]+): (.*)$")
LOG_STATUS = re.compile(r"Response Status: (\d+)")
LOG_BODY = re.compile(r'"(Request|Response) Body" body=(<|"(.*)")$')


def kubectl_exchanges(path):
    """The non-discovery requests a kubectl -v=8 log shows, in order:
    method, path, headers, request body, response status and body."""
    with open(path) as fh:
        lines = fh.read().splitlines()
    out, pending, cur = [], None, None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = LOG_BODY.search(line)
        if m:
            body = m.group(3) if m.group(2) != "<" else lines[i + 1].strip()
            if m.group(2) == "<":
                i += 1
            if m.group(2) != "<":
                body = body.encode().decode("unicode_escape")
            if m.group(1) == "Request":
                pending = body
            elif cur is not None and "body" not in cur:
                cur["body"] = body
            i += 1
            continue
        m = LOG_REQ.search(line)
        if m:
            p = m.group(2).replace("?timeout=32s", "").replace("&timeout=32s", "")
            cur = {"method": m.group(1), "path": p, "headers": {}, "request": pending or None}
            pending = None
            if not DISCOVERY.match(p.split("?")[0]):
                out.append(cur)
            i += 1
            continue
        m = LOG_HDR.search(line)
        if m and cur is not None and "status" not in cur:
            cur["headers"][m.group(1)] = m.group(2)
        m = LOG_STATUS.search(line)
        if m and cur is not None and "status" not in cur:
            cur["status"] = int(m.group(1))
        i += 1
    return out


def main():
    t = Tap()
    ks = KubeServer(tls=True, token="replay-token", crds=False, bookmark_interval=1).start()
    m = Mapper()
    got = {}

    def send(n, path=None, body=None, headers=None):
        fx = fixture(n)
        r = fx["request"]
        b = r["body"] if body is None else body
        if isinstance(b, (dict, list)):
            b = json.loads(m.text(json.dumps(b)))
            b = rv_in_body(b)
        h = dict(r["headers"])
        h.update(headers or {})
        st, hdrs, out = ks.request(r["method"], path or r["path"], b, headers=h,
                                   content_type=h.get("Content-Type", "application/json"))
        got[n] = out
        return fx, st, out

    def rv_in_body(b):
        md = b.get("metadata") if isinstance(b, dict) else None
        if isinstance(md, dict) and str(md.get("resourceVersion", "")).isdigit():
            rec = int(md["resourceVersion"])
            if rec in m.rvs:
                md["resourceVersion"] = str(m.rvs[rec])
        return b

    def check(n, name, path=None, body=None, learn=True, exact=True, adjust=None):
        fx, st, out = send(n, path, body)
        exp = fx["response"]
        ok = t.eq(st, exp["status"], "%02d %s: status %d" % (n, name, exp["status"]))
        if learn:
            m.learn(exp["body"], out)
        if exact:
            e, o = m.expected(exp["body"]), ours(out)
            if adjust:
                e, o = adjust(e, o)
            d = diff(o, e)
            t.ok(d is None, "%02d %s: body as recorded" % (n, name), diag=d)
        return ok, out

    try:
        # ---- discovery and CRD registration
        _, st, out = send(1)
        t.ok(st == 200 and set(out) == set(fixture(1)["response"]["body"]),
             "01 /version: same fields", diag=out)
        _, st, out = send(2)
        t.ok(st == 200 and out["kind"] == "APIVersions" and out["versions"] == ["v1"],
             "02 /api: APIVersions v1", diag=out)
        check(3, "CRD create", adjust=lambda e, o: (drop(e, "metadata.uid"), drop(o, "metadata.uid")))
        time.sleep(0.2)
        check(4, "CRD Established")
        _, st, out = send(5)
        names = [g["name"] for g in out.get("groups", [])]
        rec = {g["name"]: g for g in fixture(5)["response"]["body"]["groups"]}
        t.ok(st == 200 and "example.com" in names and all(
            g["name"] in rec and g["preferredVersion"] == rec[g["name"]]["preferredVersion"] and
            all(v in rec[g["name"]]["versions"] for v in g["versions"]) for g in out["groups"]),
            "05 /apis: every group we serve appears as recorded, the new CRD group too",
            diag=json.dumps(out)[:600])
        check(6, "group/version resource list", adjust=lambda e, o: (strip_hash(e), o))

        # ---- create, get, table
        check(7, "create")
        check(8, "get")
        check(9, "get as Table", adjust=lambda e, o: (table_ages(e), table_ages(o)))

        # ---- server-side apply, conflicts, force, status managers
        check(10, "apply creates (201) with the applier's fields")
        check(11, "apply conflict 409 names field and manager")
        check(12, "forced apply takes the field over")
        check(13, "status apply by agent/node-1 (map-type list entry)")
        check(14, "second manager's entry kept beside the first")
        check(15, "withdrawn entry removed, the other kept")
        check(16, "get after apply")

        # ---- optimistic concurrency, status separation, generation
        check(17, "PUT with stale resourceVersion: 409")
        check(18, "get w1")
        check(19, "status on main resource ignored, generation bumped")
        check(20, "merge patch on /status keeps generation")
        check(21, "create w3")
        check(22, "create w4")
        check(23, "create w5")

        # ---- lists
        _, l1 = check(24, "list limit=2 with continue and remainingItemCount",
                      adjust=lambda e, o: (drop(e, "metadata.continue"), drop(o, "metadata.continue")))
        cont = l1.get("metadata", {}).get("continue", "")
        tok = json.loads(base64.urlsafe_b64decode(cont + "=" * (-len(cont) % 4))) if cont else {}
        t.ok(tok.get("v") == "meta.k8s.io/v1" and tok.get("start") == "w2\u0000"
             and tok.get("rv") == m.rvs.get(332),
             "24 continue token names the next key and the list version", diag=tok)
        check(25, "list continue", path="/apis/example.com/v1/namespaces/default/widgets?limit=2&continue="
              + cont, adjust=lambda e, o: (drop(e, "metadata.continue"), drop(o, "metadata.continue")))
        check(26, "label selector")
        check(27, "field selector metadata.name")
        check(28, "list as Table", adjust=lambda e, o: (table_ages(e), table_ages(o)))
        _, lst = check(29, "list for a watch")

        # ---- watch with bookmarks: MODIFIED (w3 status apply), DELETED (w4), BOOKMARKs
        list_rv = lst["metadata"]["resourceVersion"]
        w = ks.watch("/apis/example.com/v1/namespaces/default/widgets?watch=1&allowWatchBookmarks=true"
                     "&resourceVersion=%s" % list_rv)

        def actions():
            time.sleep(0.2)
            ks.request("PATCH", "/apis/example.com/v1/namespaces/default/widgets/w3/status"
                       "?fieldManager=agent/node-3&force=true",
                       "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w3\n"
                       "status:\n  ready: \"yes\"\n", content_type="application/apply-patch+yaml")
            ks.request("DELETE", "/apis/example.com/v1/namespaces/default/widgets/w4")
        th = threading.Thread(target=actions)
        th.start()
        events = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sum(e["type"] == "BOOKMARK" for e in events) < 2:
            ev = w.next()
            if ev is None:
                break
            events.append(ev)
        w.close()
        th.join()
        rec = fixture(30)["response"]["body"]
        t.eq([e["type"] for e in events], [e["type"] for e in rec],
             "30 watch: MODIFIED, DELETED, then BOOKMARKs")
        if len(events) == len(rec):
            for i in (0, 1):
                m.learn(rec[i], events[i])
            for i, (e, r) in enumerate(zip(events, rec)):
                d = diff(ours(e), m.expected(r))
                t.ok(d is None, "30 watch event %d (%s) as recorded" % (i, r["type"]), diag=d)

        # ---- 410 for a version the server no longer has
        fx, st, out = send(31)
        t.eq(st, 200, "31 watch from a forgotten version: HTTP 200")
        lines = [json.loads(x) for x in out.strip().splitlines()] if isinstance(out, str) else [out]
        ok = len(lines) == 1 and lines[0]["type"] == "ERROR" and lines[0]["object"]["code"] == 410 \
            and lines[0]["object"]["reason"] == "Expired" \
            and re.match(r"^too old resource version: 1 \(\d+\)$", lines[0]["object"]["message"])
        t.ok(ok, "31 one ERROR event carrying a 410 Expired Status", diag=out)
        exp_obj = dict(fx["response"]["body"][0]["object"])
        got_obj = dict(lines[0]["object"]) if lines else {}
        exp_obj.pop("message", None)
        got_obj.pop("message", None)
        t.ok(diff(got_obj, exp_obj) is None, "31 the Status fields as recorded",
             diag=diff(got_obj, exp_obj))

        # ---- errors
        check(32, "get missing: 404 NotFound")
        check(33, "schema validation: 422 with causes")
        check(34, "malformed JSON: 400")
        check(35, "unknown patch type: 415")
        check(36, "get w5")
        check(37, "delete with a wrong uid precondition: 409")
        check(38, "delete with the right uid")

        # ---- leases
        check(39, "lease create")
        check(40, "lease renew")
        check(41, "lease steal with stale resourceVersion: 409")

        # ---- events
        fx, st, out = send(42)
        t.eq(st, 422, "42 events.k8s.io refuses generateName with a trailing dot")
        gen = (out.get("details") or {}).get("name", "") if isinstance(out, dict) else ""
        t.ok(re.match(r"^w1\.[bcdfghjklmnpqrstvwxz2456789]{5}$", gen),
             "42 the name generated before validation is reported", diag=gen)
        e = json.loads(json.dumps(fx["response"]["body"]).replace("w1.gzvv5", gen))
        t.ok(diff(out, e) is None, "42 body as recorded", diag=diff(out, e))

        def genname(e, o):
            for x in (e, o):
                x["metadata"]["name"] = x["metadata"]["name"][:-5] + "<gen>"
            return e, o
        check(43, "events.k8s.io event created", adjust=genname)
        check(44, "core v1 event created", adjust=genname)

        # ---- OpenAPI and the built-in resource lists
        _, st, root = send(45)
        paths = (root or {}).get("paths", {})
        t.ok(st == 200 and "apis/example.com/v1" in paths and "api/v1" in paths and all(
            re.match(r"^/openapi/v3/%s\?hash=[0-9A-F]{128}$" % re.escape(k), v["serverRelativeURL"])
            for k, v in paths.items()), "45 /openapi/v3 lists every group-version with a hash",
            diag=json.dumps(paths)[:400])
        url = paths.get("apis/example.com/v1", {}).get("serverRelativeURL", "/openapi/v3/x")
        st, _h, doc = ks.request("GET", url)
        rec = fixture(46)["response"]["body"]
        sch = (doc or {}).get("components", {}).get("schemas", {}).get("com.example.v1.Widget", {})
        t.ok(st == 200 and sch.get("x-kubernetes-group-version-kind") ==
             rec["components"]["schemas"]["com.example.v1.Widget"]["x-kubernetes-group-version-kind"]
             and sch["properties"]["spec"] == rec["components"]["schemas"]["com.example.v1.Widget"]
             ["properties"]["spec"], "46 the group document carries the CRD schema and its GVK")
        patch = (doc or {}).get("paths", {}).get(
            "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}", {}).get("patch", {})
        t.ok("fieldValidation" in [p["name"] for p in patch.get("parameters", [])] and
             "application/apply-patch+yaml" in patch.get("requestBody", {}).get("content", {}),
             "46 PATCH takes fieldValidation and apply patches (kubectl apply --server-side checks)")
        _, st, out = send(47)
        rec = {r["name"]: r for r in fixture(47)["response"]["body"]["resources"]}
        bad = [r["name"] for r in out.get("resources", [])
               if r["name"] not in rec or diff(r, strip_hash(rec[r["name"]])) is not None]
        t.ok(st == 200 and not bad and {"nodes", "configmaps", "secrets", "events", "namespaces"}
             <= {r["name"] for r in out["resources"]},
             "47 /api/v1 entries equal the recorded ones (Nodes, ConfigMaps, Secrets, Events...)",
             diag="differ: %s %s" % (bad, [diff(r, strip_hash(rec.get(r["name"], {})))
                                           for r in out.get("resources", []) if r["name"] in bad][:2]))
        check(48, "coordination.k8s.io resource list", adjust=lambda e, o: (strip_hash(e), o))

        # ---- what kubectl sent and got (kubectl/*.log), in the order it ran
        for log in ("apply-server-side", "get-short", "get-yaml", "describe", "delete"):
            for ex in kubectl_exchanges(os.path.join(FIX, "kubectl", "kubectl-%s.log" % log)):
                hdrs = {k: v for k, v in ex["headers"].items() if k in ("Accept", "Content-Type")}
                st, _h, out = ks.request(ex["method"], m.text(ex["path"]), ex["request"], headers=hdrs,
                                         content_type=hdrs.get("Content-Type", "application/json"))
                name = "kubectl %s: %s %s" % (log, ex["method"], ex["path"][:70])
                t.eq(st, ex["status"], name + ": status")
                try:
                    want = json.loads(ex.get("body") or "")
                except ValueError:
                    want = None     # truncated in the log, or protobuf
                if want is None or not isinstance(out, dict):
                    if "as=Table" in hdrs.get("Accept", ""):
                        t.ok(out.get("kind") == "Table" and [c["name"] for c in out["columnDefinitions"]]
                             == ["Name", "Image", "Ready", "Age"] and
                             [r["cells"][:3] for r in out["rows"]] ==
                             [["w1", "quay.io/x/y:v1", "1/1"], ["w2", "quay.io/x/y:v2", None],
                              ["w3", "quay.io/x/y:v1", "yes"], ["w9", "quay.io/x/y:v9", None]],
                             name + ": the rows kubectl printed", diag=out)
                    elif ex["path"].startswith("/api/v1/namespaces/default/events"):
                        t.ok(out.get("kind") == "EventList" and out["items"] == [],
                             name + ": an empty EventList (the Event about w1 has no uid)", diag=out)
                    continue
                m.learn(want, out)
                d = diff(ours(out), m.expected(want))
                t.ok(d is None, name + ": body as logged", diag=d)

        t.ok(not m.errors, "resourceVersions of all answers keep the recorded order",
             diag="\n".join(m.errors))
    except Exception:  # noqa: BLE001
        import traceback
        t.ok(False, "replay ran to the end", diag=traceback.format_exc() + "\n" + ks.tail())
    finally:
        ks.cleanup()
    sys.exit(t.finish())


def drop(v, dotted):
    cur = v
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.get(p) if isinstance(cur, dict) else None
    if isinstance(cur, dict):
        cur.pop(parts[-1], None)
    return v


def strip_hash(v):
    if isinstance(v, dict):
        return {k: strip_hash(x) for k, x in v.items() if k != "storageVersionHash"}
    if isinstance(v, list):
        return [strip_hash(x) for x in v]
    return v


if __name__ == "__main__":
    main()
