#!/usr/bin/python3
"""Each behaviour the test API server promises, beyond the recorded
exchanges: authentication, optimistic concurrency, validation against the gkm
CRDs, unknown fields, status separation and generation, every patch type,
server-side apply (field removal, map merge, map-type lists, conflicts, no-op
applies), pagination, selectors, watches (resume, selection changes, timeouts,
bookmarks, 410 Gone), garbage collection and finalizers, namespaces, CRD
registration, the two Event APIs, restarts and fault injection."""
import json
import os
import socket
import sys
import time

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from kubeserver import KubeServer  # noqa: E402
from tap import Tap  # noqa: E402

t = Tap()
G = "/apis/gkm.io/v1alpha1"
CM = "/api/v1/namespaces/default/configmaps"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
DIGEST = "sha256:" + "ab" * 32


def cache(name, image="quay.io/gkm/cache:v1", ns="default", **extra):
    o = {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
         "metadata": {"name": name, "namespace": ns}, "spec": {"image": image}}
    o.update(extra)
    return o


def node_report(name, node, ns="default", labels=None, owner=None):
    md = {"name": name, "namespace": ns, "labels": labels or {"gkm.io/node": node}}
    if owner:
        md["ownerReferences"] = [owner]
    return {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode", "metadata": md,
            "spec": {"nodeName": node}}


def causes(body):
    return [(c.get("field"), c.get("reason")) for c in (body.get("details") or {}).get("causes", [])]


def wait_for(fn, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    return fn()


def events_until(w, n, timeout=10):
    out = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        ev = w.next()
        if ev is None:
            break
        out.append(ev)
    return out


def main(ks):
    req = ks.request

    def apply(path, obj, manager, force=False, sub=""):
        p = path + ("/" + sub if sub else "") + "?fieldManager=" + manager + ("&force=true" if force else "")
        return req("PATCH", p, json.dumps(obj), content_type=APPLY)

    def get(path):
        return req("GET", path)[2]

    # ------------------------------------------------------------ auth
    st, _h, b = req("GET", "/api/v1/namespaces", headers={"Authorization": "Bearer wrong"})
    t.ok(st == 401 and b["reason"] == "Unauthorized", "a wrong bearer token: 401 Unauthorized", diag=b)
    st, _h, b = req("GET", "/version", headers={"Authorization": ""})
    t.eq(st, 200, "/version needs no credentials")

    # ------------------------------------------------- create, get, update
    st, _h, cm = req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "c1"}, "data": {"a": "1"}})
    t.eq(st, 201, "create a ConfigMap: 201")
    st, _h, b = req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}})
    t.ok(st == 409 and b["reason"] == "AlreadyExists" and b["message"] == 'configmaps "c1" already exists',
         "create it again: 409 AlreadyExists", diag=b)
    rv1 = int(cm["metadata"]["resourceVersion"])
    upd = dict(cm, data={"a": "2"})
    st, _h, u = req("PUT", CM + "/c1", upd)
    rv2 = int(u["metadata"]["resourceVersion"])
    t.ok(st == 200 and rv2 > rv1, "PUT with the current resourceVersion: a higher one", diag=(rv1, rv2))
    st, _h, b = req("PUT", CM + "/c1", upd)
    t.ok(st == 409 and b["reason"] == "Conflict" and "the object has been modified" in b["message"],
         "PUT with the old resourceVersion: 409 Conflict", diag=b)
    nov = dict(u, data={"a": "3"})
    nov["metadata"] = {k: v for k, v in u["metadata"].items() if k != "resourceVersion"}
    st, _h, u3 = req("PUT", CM + "/c1", nov)
    t.ok(st == 200 and u3["data"] == {"a": "3"}, "PUT without a resourceVersion is unconditional")
    st, _h, u4 = req("PUT", CM + "/c1", u3)
    t.eq(u4["metadata"]["resourceVersion"], u3["metadata"]["resourceVersion"],
         "a PUT that changes nothing keeps the resourceVersion")
    st, _h, b = req("PUT", CM + "/c2", dict(u3, metadata={"name": "c1"}))
    t.ok(st == 400 and "does not match the name on the URL" in b["message"], "PUT: name mismatch is 400",
         diag=b)
    st, _h, b = req("POST", "/api/v1/namespaces/nope/configmaps",
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    t.ok(st == 404 and b["message"] == 'namespaces "nope" not found', "create in a missing namespace: 404",
         diag=b)
    st, _h, b = req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}})
    t.ok(st == 422 and ("metadata.name", "FieldValueInvalid") in causes(b), "an invalid name: 422",
         diag=b)
    st, _h, b = req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"generateName": "gen-"}})
    t.ok(st == 201 and b["metadata"]["name"].startswith("gen-") and len(b["metadata"]["name"]) == 9,
         "generateName: prefix and five random characters", diag=b.get("metadata"))
    st, _h, b = req("POST", CM, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}})
    t.eq(st, 400, "a body of another kind: 400")

    # ---------------------------------------------- validation (our CRDs)
    NSG = G + "/namespaces/default/gkmcaches"
    st, _h, b = req("POST", NSG, {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                                  "metadata": {"name": "v1"}, "spec": {}})
    t.ok(st == 422 and causes(b) == [("spec.image", "FieldValueRequired")],
         "GKMCache without spec.image: 422 Required", diag=b)
    st, _h, b = req("POST", NSG, cache("v2", image="Not An Image!"))
    t.ok(st == 422 and causes(b) == [("spec.image", "FieldValueInvalid")] and "should match" in b["message"],
         "an image reference that is no reference: 422 pattern", diag=b)
    st, _h, b = req("POST", NSG, cache("v3", image="quay.io/" + "a" * 520))
    t.ok(st == 422 and ("spec.image", "FieldValueTooLong") in causes(b)
         and "Too long: may not be longer than 525" in b["message"], "an image over 525 characters: 422",
         diag=b)
    for img in ("127.0.0.1:5000/gkm/cache:v1", "localhost:5000/a/b@" + DIGEST, "quay.io/x/y:v1@" + DIGEST,
                "registry.example.com/team/vllm-cache", "ubuntu"):
        st, _h, b = req("POST", NSG + "?dryRun=All", cache("ok", image=img))
        t.ok(st == 201, "image reference accepted: " + img, diag=b)
    st, _h, b = req("POST", G + "/namespaces/default/gkmcachenodes", node_report("n-bad", "Not_A_Node"))
    t.ok(st == 422 and ("spec.nodeName", "FieldValueInvalid") in causes(b), "GKMCacheNode with a bad node name",
         diag=b)
    req("POST", G + "/namespaces/default/gkmcachenodes", node_report("n1", "node-1"))
    st, _h, b = req("PATCH", G + "/namespaces/default/gkmcachenodes/n1/status",
                    {"status": {"caches": {"c": {"state": "Bogus"}}, "readyCaches": "x",
                                "gpus": [{"gpuType": "H100"}]}}, content_type=MERGE)
    cs = causes(b)
    t.ok(st == 422 and ("status.caches.c.state", "FieldValueNotSupported") in cs
         and ("status.readyCaches", "FieldValueTypeInvalid") in cs and ("status.gpus[0].ids", "FieldValueRequired") in cs
         and 'Unsupported value: "Bogus": supported values: "Pending", "Pulling"' in b["message"],
         "node status: enum, type and required violations, all reported", diag=b)
    st, _h, b = req("PATCH", NSG + "/v9/status", {"status": {}}, content_type=MERGE)
    t.eq(st, 404, "status patch of a missing object: 404")
    req("POST", NSG, cache("c1"))
    st, _h, b = req("PATCH", NSG + "/c1/status", {"status": {"conditions": [
        {"type": "Ready", "status": "Maybe", "reason": "x y", "message": "", "lastTransitionTime": "yesterday"}]}},
        content_type=MERGE)
    cs = causes(b)
    t.ok(st == 422 and ("status.conditions[0].status", "FieldValueNotSupported") in cs
         and ("status.conditions[0].reason", "FieldValueInvalid") in cs
         and ("status.conditions[0].lastTransitionTime", "FieldValueInvalid") in cs,
         "conditions follow the Kubernetes conventions", diag=b)

    # --------------------------------------------------- unknown fields
    st, _h, b = req("POST", NSG + "?fieldValidation=Strict", cache("u1", spec_extra=1) if False else
                    dict(cache("u1"), spec={"image": "quay.io/a/b:v1", "foo": 1}))
    t.ok(st == 400 and 'unknown field "spec.foo"' in b["message"], "Strict: an unknown field is 400", diag=b)
    st, h, b = req("POST", NSG, dict(cache("u2"), spec={"image": "quay.io/a/b:v1", "foo": 1}))
    t.ok(st == 201 and "foo" not in b["spec"] and 'unknown field \\"spec.foo\\"' in h.get("warning", ""),
         "Warn (the default): pruned, with a Warning header", diag=(h.get("warning"), b))
    st, _h, b = req("PATCH", NSG + "/u3?fieldManager=m&fieldValidation=Strict",
                    json.dumps(dict(cache("u3"), spec={"image": "quay.io/a/b:v1", "foo": 1})), content_type=APPLY)
    t.ok(st == 400 and ".spec.foo: field not declared in schema" in b["message"],
         "Strict apply: field not declared in schema", diag=b)

    # ------------------------------------- status separation, generation
    c1 = get(NSG + "/c1")
    s1 = dict(c1, spec={"image": "quay.io/gkm/cache:v2"}, status={"resolvedDigest": DIGEST})
    st, _h, b = req("PUT", NSG + "/c1/status", s1)
    t.ok(st == 200 and b["spec"]["image"] == "quay.io/gkm/cache:v1" and b["status"]["resolvedDigest"] == DIGEST
         and b["metadata"]["generation"] == 1, "PUT /status changes status only, not the generation", diag=b)
    s2 = dict(b, spec={"image": "quay.io/gkm/cache:v2"}, status={"resolvedDigest": "sha256:" + "cd" * 32})
    st, _h, b = req("PUT", NSG + "/c1", s2)
    t.ok(st == 200 and b["spec"]["image"] == "quay.io/gkm/cache:v2" and b["status"]["resolvedDigest"] == DIGEST
         and b["metadata"]["generation"] == 2, "PUT of the main resource changes spec, ignores status, bumps generation",
         diag=b)
    st, _h, b = req("PATCH", NSG + "/c1", {"metadata": {"labels": {"x": "y"}}}, content_type=MERGE)
    t.ok(st == 200 and b["metadata"]["generation"] == 2, "a label change leaves generation alone", diag=b)

    # -------------------------------------------------------- patches
    st, _h, b = req("PATCH", CM + "/c1", {"data": {"a": None, "b": "2"}}, content_type=MERGE)
    t.ok(st == 200 and b["data"] == {"b": "2"}, "merge patch: null deletes, values add", diag=b)
    st, _h, b = req("PATCH", CM + "/c1", [{"op": "add", "path": "/data/c", "value": "3"},
                                         {"op": "replace", "path": "/data/b", "value": "22"},
                                         {"op": "remove", "path": "/data/c"}],
                    content_type="application/json-patch+json")
    t.ok(st == 200 and b["data"] == {"b": "22"}, "JSON patch: add, replace, remove", diag=b)
    st, _h, b = req("PATCH", CM + "/c1", [{"op": "test", "path": "/data/b", "value": "nope"}],
                    content_type="application/json-patch+json")
    t.ok(st == 422 and "test failed" in b["message"], "JSON patch: a failed test is 422", diag=b)
    st, _h, b = req("PATCH", CM + "/c1", {"data": {"s": "1"}},
                    content_type="application/strategic-merge-patch+json")
    t.ok(st == 200 and b["data"] == {"b": "22", "s": "1"}, "strategic merge patch on a built-in", diag=b)
    st, _h, b = req("PATCH", NSG + "/c1", {"spec": {}}, content_type="application/strategic-merge-patch+json")
    t.ok(st == 415 and "application/apply-patch+yaml" in b["message"],
         "strategic merge patch on a custom resource: 415", diag=b)
    st, _h, b = req("PATCH", CM + "/c1", "{not json", content_type=MERGE)
    t.ok(st == 400 and b["reason"] == "BadRequest", "a malformed patch: 400", diag=b)
    st, _h, b = req("PATCH", CM + "/c1", {"metadata": {"resourceVersion": "1"}, "data": {"z": "1"}},
                    content_type=MERGE)
    t.eq(st, 409, "a patch carrying a stale resourceVersion: 409")

    # ------------------------------------------------ server-side apply
    base = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}}
    st, _h, b = apply(CM + "/ssa", dict(base, data={"a": "1", "b": "2"}), "alice")
    t.eq(st, 201, "apply creates")
    st, _h, b = apply(CM + "/ssa", dict(base, data={"a": "1"}), "alice")
    t.ok(st == 200 and b["data"] == {"a": "1"}, "a field the manager stops applying is removed", diag=b)
    apply(CM + "/ssa", dict(base, data={"a": "1", "b": "2"}), "alice")
    apply(CM + "/ssa", dict(base, data={"b": "2"}), "bob")
    st, _h, b = apply(CM + "/ssa", dict(base, data={"a": "1"}), "alice")
    t.ok(b["data"] == {"a": "1", "b": "2"}, "...unless another manager owns it too", diag=b)
    st, _h, b = apply(CM + "/ssa", dict(base, data={"a": "x", "b": "y"}), "carol")
    t.ok(st == 409 and b["message"] == 'Apply failed with 2 conflicts: conflicts with "alice":\n- .data.a\n'
         'conflicts with "bob":\n- .data.b' and sorted(causes(b)) == [(".data.a", "FieldManagerConflict"),
                                                                       (".data.b", "FieldManagerConflict")],
         "two conflicts, grouped by manager", diag=b)
    rv = get(CM + "/ssa")["metadata"]["resourceVersion"]
    st, _h, b = apply(CM + "/ssa", dict(base, data={"a": "1"}), "alice")
    t.ok(st == 200 and b["metadata"]["resourceVersion"] == rv, "a no-op apply keeps the resourceVersion",
         diag=(rv, b["metadata"]["resourceVersion"]))
    req("PATCH", CM + "/ssa?fieldManager=editor", {"data": {"a": "2"}}, content_type=MERGE)
    st, _h, b = apply(CM + "/ssa", dict(base, data={"a": "3"}), "alice")
    t.ok(st == 409 and 'conflict with "editor" using v1: .data.a' in b["message"],
         "an updater's field conflicts too, named with its API version", diag=b)
    st, _h, b = req("PATCH", CM + "/ssa2", json.dumps(dict(base, metadata={"name": "ssa2"})), content_type=APPLY)
    t.ok(st == 422 and "fieldManager: Required value" in b["message"], "apply without fieldManager: 422", diag=b)
    st, _h, b = apply(CM + "/ssa3", dict(base, metadata={"name": "ssa3", "managedFields": [{}]}), "x")
    t.eq(st, 400, "apply with managedFields: 400")
    st, _h, b = req("PATCH", CM + "/ssa4?fieldManager=y", "a: [unclosed", content_type=APPLY)
    t.ok(st == 400 and "error decoding YAML" in b["message"], "apply of broken YAML: 400", diag=b)
    st, _h, b = apply(NSG + "/a1", dict(cache("a1"), status={"resolvedDigest": DIGEST}), "op")
    t.ok(st == 201 and "status" not in b, "apply creating a custom resource drops its status", diag=b)
    st, _h, b = apply(NSG + "/missing", cache("missing"), "op", sub="status")
    t.eq(st, 404, "apply to the status of a missing object: 404")

    # caches map: two agents, each owning its key
    path = G + "/namespaces/default/gkmcachenodes/n1"

    def report(keys, manager):
        return apply(path, {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
                            "metadata": {"name": "n1"},
                            "status": {"caches": {k: {"state": "Ready", "digest": DIGEST} for k in keys}}},
                     manager, force=True, sub="status")
    report(["x", "y"], "gkm-agent/node-1")
    report(["z"], "gkm-operator")
    st, _h, b = report(["x"], "gkm-agent/node-1")
    t.ok(st == 200 and sorted(b["status"]["caches"]) == ["x", "z"],
         "a map entry the agent stops reporting goes; the other manager's stays", diag=b.get("status"))
    mf = {e["manager"]: e for e in b["metadata"]["managedFields"]}
    t.ok(mf["gkm-agent/node-1"]["fieldsV1"] == {"f:status": {"f:caches": {"f:x": {".": {}, "f:digest": {}, "f:state": {}}}}}
         and mf["gkm-agent/node-1"]["subresource"] == "status",
         "managed fields of a map entry: the key itself, and per field", diag=mf)

    # conditions: a map-type list keyed by type, one owner per condition
    now = "2026-01-01T00:00:00Z"

    def cond(typ, status, manager, force=False):
        return apply(NSG + "/c1", {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache", "metadata": {"name": "c1"},
                                   "status": {"conditions": [{"type": typ, "status": status, "reason": "R",
                                                              "message": "", "lastTransitionTime": now}]}},
                     manager, force=force, sub="status")
    cond("Ready", "True", "op-a")
    st, _h, b = cond("Verified", "True", "op-b")
    t.ok(st == 200 and [c["type"] for c in b["status"]["conditions"]] == ["Ready", "Verified"],
         "two managers, one condition each: both kept", diag=b.get("status"))
    st, _h, b = cond("Ready", "False", "op-b")
    t.ok(st == 409 and '.status.conditions[type="Ready"].status' in b["message"],
         "changing another manager's condition: 409 naming the list entry", diag=b)
    st, _h, b = cond("Ready", "False", "op-b", force=True)
    ready = [c for c in b["status"]["conditions"] if c["type"] == "Ready"]
    t.ok(st == 200 and ready and ready[0]["status"] == "False", "force takes the entry's fields over", diag=b)
    t.ok("Verified" not in [c["type"] for c in b["status"]["conditions"]],
         "...and the condition op-b no longer applies is gone", diag=b.get("status"))
    cond("Verified", "True", "op-c")

    # a set-type list: each manager owns its own values
    def failed(nodes, manager):
        return apply(NSG + "/c1", {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache", "metadata": {"name": "c1"},
                                   "status": {"failedNodeConditions": {"Incompatible": nodes}}},
                     manager, sub="status")
    failed(["node-1", "node-3"], "shard-a")
    st, _h, b = failed(["node-2"], "shard-b")
    t.ok(st == 200 and b["status"]["failedNodeConditions"]["Incompatible"] == ["node-1", "node-3", "node-2"],
         "listType=set: two managers' values are merged", diag=b.get("status"))
    mf = {e["manager"]: e["fieldsV1"] for e in b["metadata"]["managedFields"]}
    t.eq(mf.get("shard-b"), {"f:status": {"f:failedNodeConditions": {"f:Incompatible": {".": {}, 'v:"node-2"': {}}}}},
         "...each value owned as v:<value>")
    st, _h, b = failed(["node-1"], "shard-a")
    t.eq(b["status"]["failedNodeConditions"]["Incompatible"], ["node-1", "node-2"],
         "...a value its manager stops applying goes")
    # Empty containers, as kube-apiserver v1.26 answers them (kubernetes#117447):
    # a map, struct or map key the configuration names but whose every member
    # the removal of the manager's old fields takes is left null, and the null
    # fails validation; a container the configuration leaves out goes.
    def status_apply(name, status, manager="op"):
        return apply(NSG + "/" + name, {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                                        "metadata": {"name": name}, "status": status},
                     manager, force=True, sub="status")
    for n in ("e1", "e2", "e3", "e4", "e5", "e6"):
        req("POST", NSG, cache(n))
    st, _h, b = status_apply("e1", {"failedNodeConditions": {}})
    t.ok(st == 200 and b["status"] == {"failedNodeConditions": {}},
         "an empty map applied where there was none: kept empty", diag=b)
    status_apply("e2", {"totalNodes": 1, "failedNodeConditions": {"PullFailed": ["n1"]}})
    st, _h, b = status_apply("e2", {"totalNodes": 1, "failedNodeConditions": {}})
    want = ('GKMCache.gkm.io "e2" is invalid: status.failedNodeConditions: Invalid value: "null": '
            'status.failedNodeConditions in body must be of type object: "null"')
    t.ok(st == 422 and b["message"] == want
         and causes(b) == [("status.failedNodeConditions", "FieldValueTypeInvalid")],
         "an empty map applied over the manager's own entries: 422, the map became null", diag=b)
    t.eq(get(NSG + "/e2")["status"]["failedNodeConditions"], {"PullFailed": ["n1"]},
         "...and the stored status is unchanged")
    st, _h, b = status_apply("e2", {"totalNodes": 1})
    t.ok(st == 200 and b["status"] == {"totalNodes": 1},
         "the map left out instead: its entries and the map go", diag=b)
    status_apply("e3", {"failedNodeConditions": {"A": ["n1", "n2"]}})
    st, _h, b = status_apply("e3", {"failedNodeConditions": {"A": []}})
    t.ok(st == 422 and "status.failedNodeConditions.A in body must be of type array: \"null\"" in b["message"],
         "a map key applied with an empty list over its values: 422", diag=b)
    status_apply("e4", {"failedNodeConditions": {"A": ["n1"]}})
    st, _h, b = status_apply("e4", {})
    t.ok(st == 422 and 'status: Invalid value: "null": status in body must be of type object' in b["message"],
         "an empty status over the manager's fields: 422", diag=b)
    status_apply("e5", {"failedNodeConditions": {}}, manager="other")
    status_apply("e5", {"failedNodeConditions": {"A": ["n1"]}})
    st, _h, b = status_apply("e5", {"totalNodes": 1})
    t.ok(st == 422 and "status.failedNodeConditions in body must be of type object" in b["message"],
         "a map another manager applied empty, emptied by this one leaving out its keys: 422", diag=b)
    status_apply("e6", {"conditions": [{"type": "Ready", "status": "True", "reason": "R", "message": "",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    st, _h, b = status_apply("e6", {"conditions": []})
    t.ok(st == 200 and "status" not in b, "an empty map-type list owns nothing: the conditions go", diag=b)
    for n in ("e1", "e2", "e3", "e4", "e5", "e6"):
        req("DELETE", NSG + "/" + n)

    # labels shared by two managers
    lab = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "lab", "labels": {"a": "1", "b": "2"}}}
    apply(CM + "/lab", lab, "m1")
    apply(CM + "/lab", dict(lab, metadata={"name": "lab", "labels": {"b": "2", "c": "3"}}), "m2")
    st, _h, b = apply(CM + "/lab", dict(lab, metadata={"name": "lab"}), "m1")
    t.eq(b["metadata"].get("labels"), {"b": "2", "c": "3"}, "labels: m1's own label goes, the shared one stays")

    # ------------------------------------------------------- lists
    req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    for i in range(12):
        req("POST", NSG.replace("default", "default" if i % 2 else "other"),
            dict(cache("p%02d" % i, ns="default" if i % 2 else "other"),
                 metadata={"name": "p%02d" % i, "namespace": "default" if i % 2 else "other",
                           "labels": {"tier": ["gold", "silver", "bronze"][i % 3], "idx": str(i)}}))
    names, cont, pages = [], "", 0
    while True:
        b = get(G + "/gkmcaches?limit=5&labelSelector=idx" + ("&continue=" + cont if cont else ""))
        pages += 1
        names += ["%s/%s" % (x["metadata"]["namespace"], x["metadata"]["name"]) for x in b["items"]]
        cont = b["metadata"].get("continue")
        if not cont or pages > 10:
            break
    t.ok(pages == 3 and names == sorted(names) and len(names) == 12,
         "list across namespaces in pages of 5, in key order", diag=(pages, names))
    total = len(get(G + "/gkmcaches")["items"])
    b = get(G + "/gkmcaches?limit=5")
    t.ok(total > 5 and b["metadata"].get("remainingItemCount") == total - 5,
         "remainingItemCount without selectors", diag=(total, b["metadata"]))
    b = get(G + "/gkmcaches?limit=5&labelSelector=idx")
    t.ok("remainingItemCount" not in b["metadata"] and b["metadata"].get("continue"),
         "...and none with a selector", diag=b["metadata"])
    st, _h, b = req("GET", G + "/gkmcaches?limit=5&continue=garbage")
    t.eq(st, 400, "an invalid continue token: 400")

    def sel(s):
        return sorted(x["metadata"]["name"] for x in get(G + "/gkmcaches?labelSelector=" + s)["items"])
    t.eq(sel("tier%20in%20(gold,bronze),idx%20notin%20(0,3)"), ["p02", "p05", "p06", "p08", "p09", "p11"],
         "label selector: in, notin")
    t.eq(sel("tier!=gold,idx"), ["p01", "p02", "p04", "p05", "p07", "p08", "p10", "p11"],
         "label selector: != and exists")
    t.eq(sel("!idx"), ["a1", "c1", "u2"], "label selector: does not exist")
    st, _h, b = req("GET", G + "/gkmcaches?labelSelector=tier%20in%20gold")
    t.ok(st == 400 and "unable to parse requirement" in b["message"], "a broken label selector: 400", diag=b)
    st, _h, b = req("GET", G + "/gkmcaches?fieldSelector=spec.image%3Dx")
    t.ok(st == 400 and "field label not supported: spec.image" in b["message"],
         "a field the type does not index: 400", diag=b)
    b = get(G + "/gkmcaches?fieldSelector=metadata.namespace%3Dother,metadata.name!%3Dp00")
    t.eq(sorted(x["metadata"]["name"] for x in b["items"]), ["p02", "p04", "p06", "p08", "p10"],
         "field selector: metadata.namespace and metadata.name !=")
    req("POST", G + "/namespaces/default/gkmcachenodes", node_report("n2", "node-2"))
    # our CRDs declare no selectableFields (clusters before 1.31 refuse them):
    # spec.nodeName is not a field label, exactly as a real server answers
    st, _h, b = req("GET", G + "/gkmcachenodes?fieldSelector=spec.nodeName%3Dnode-2")
    t.ok(st == 400 and "field label not supported: spec.nodeName" in b["message"],
         "field selector spec.nodeName without selectableFields: 400", diag=b)
    b = get(G + "/namespaces/default/gkmcachenodes?labelSelector=gkm.io/node%3Dnode-1")
    t.eq([x["metadata"]["name"] for x in b["items"]], ["n1"], "label selector gkm.io/node")

    # ------------------------------------------------------ tables
    tb = ks.request("GET", CM + "?limit=2", headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})[2]
    t.ok(tb["kind"] == "Table" and [c["name"] for c in tb["columnDefinitions"]] == ["Name", "Data", "Age"]
         and tb["metadata"].get("continue") and len(tb["rows"]) == 2
         and tb["rows"][0]["object"]["kind"] == "PartialObjectMetadata",
         "ConfigMap list as a Table, paginated", diag=tb)
    tb = ks.request("GET", NSG + "/c1?includeObject=None", headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})[2]
    cols = [c["name"] for c in tb["columnDefinitions"]]
    t.ok(cols[:9] == ["Name", "Digest", "Verified", "Ready-Nodes", "Total-Nodes", "Failed-Nodes",
                      "Incompatible-Nodes", "Status", "Age"]
         and "object" not in tb["rows"][0] and tb["rows"][0]["cells"][1] == DIGEST
         and tb["rows"][0]["cells"][2] == "True" and tb["rows"][0]["cells"][7] == "R"
         and tb["rows"][0]["cells"][3] is None,
         "GKMCache as a Table: printer columns, includeObject=None", diag=tb)

    # ------------------------------------------------------ watches
    lst = get(CM)
    rv0 = lst["metadata"]["resourceVersion"]
    w = ks.watch(CM + "?watch=1&resourceVersion=%s&labelSelector=app%%3Dweb" % rv0)
    req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w1", "labels": {"app": "web"}}})
    req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w2", "labels": {"app": "db"}}})
    req("PATCH", CM + "/w1", {"data": {"k": "v"}}, content_type=MERGE)
    req("PATCH", CM + "/w1", {"metadata": {"labels": {"app": "db"}}}, content_type=MERGE)
    req("PATCH", CM + "/w2", {"metadata": {"labels": {"app": "web"}}}, content_type=MERGE)
    req("DELETE", CM + "/w2")
    evs = events_until(w, 5)
    w.close()
    t.eq([(e["type"], e["object"]["metadata"]["name"]) for e in evs],
         [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1"), ("ADDED", "w2"), ("DELETED", "w2")],
         "watch with a selector: objects entering and leaving it are ADDED and DELETED")
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
    t.ok(rvs == sorted(rvs) and len(set(rvs)) == len(rvs), "watch events carry increasing versions", diag=rvs)
    w = ks.watch(CM + "?watch=1&resourceVersion=%d" % rvs[2])
    evs2 = events_until(w, 2, timeout=3)
    w.close()
    t.eq([(e["type"], e["object"]["metadata"]["name"]) for e in evs2], [("MODIFIED", "w2"), ("DELETED", "w2")],
         "resuming from a version replays only what came after it")
    w = ks.watch(CM + "?watch=1&fieldSelector=metadata.name%3Dc1")
    ev = events_until(w, 1)
    w.close()
    t.ok(len(ev) == 1 and ev[0]["type"] == "ADDED" and ev[0]["object"]["metadata"]["name"] == "c1",
         "a watch without a version starts with ADDED for what exists", diag=ev)
    start = time.monotonic()
    w = ks.watch(CM + "?watch=1&resourceVersion=%s&timeoutSeconds=1" % get(CM)["metadata"]["resourceVersion"])
    end = w.next()
    w.close()
    t.ok(end is None and time.monotonic() - start < 10, "timeoutSeconds ends the stream")
    w = ks.watch(CM + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
                      "&fieldSelector=metadata.name%3Dc1")
    evs = events_until(w, 2)
    w.close()
    t.ok([e["type"] for e in evs] == ["ADDED", "BOOKMARK"] and
         evs[1]["object"]["metadata"].get("annotations", {}).get("k8s.io/initial-events-end") == "true",
         "sendInitialEvents: the initial objects, then a bookmark marking their end", diag=evs)
    cur = get(CM)["metadata"]["resourceVersion"]
    w = ks.watch(CM + "?watch=1&allowWatchBookmarks=true&resourceVersion=%s" % cur)
    req("PATCH", CM + "/c1", {"data": {"bm": "1"}}, content_type=MERGE)
    evs = []
    while len(evs) < 2:
        e = w.next()
        if e is None:
            break
        evs.append(e)
    w.close()
    t.ok([e["type"] for e in evs] == ["MODIFIED", "BOOKMARK"] and
         int(evs[1]["object"]["metadata"]["resourceVersion"]) >= int(evs[0]["object"]["metadata"]["resourceVersion"])
         and set(evs[1]["object"]) == {"apiVersion", "kind", "metadata"},
         "BOOKMARK: only kind, apiVersion and a resourceVersion past the last event", diag=evs)
    st, _h, out = req("GET", CM + "?watch=1&resourceVersion=%d" % (int(cur) + 1000))
    t.ok(st == 200 and isinstance(out, dict) and out["type"] == "ERROR" and out["object"]["code"] == 504
         and out["object"]["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge",
         "a watch from a version the server has not reached: ERROR ResourceVersionTooLarge", diag=out)
    ks.control("compact")
    st, _h, out = req("GET", CM + "?watch=1&resourceVersion=%s" % cur)
    t.ok(st == 200 and isinstance(out, dict) and out["type"] == "ERROR" and out["object"]["code"] == 410,
         "after compaction a watch from an old version gets a 410 ERROR event", diag=out)

    # --------------------------------------------- garbage collection
    node = req("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gc-node"}})[2]
    owner = {"apiVersion": "v1", "kind": "Node", "name": "gc-node", "uid": node["metadata"]["uid"]}
    req("POST", G + "/namespaces/default/gkmcachenodes", node_report("gc-node", "gc-node", owner=owner))
    req("POST", G + "/clustergkmcachenodes", dict(node_report("gc-node", "gc-node", owner=owner),
                                                  kind="ClusterGKMCacheNode",
                                                  metadata={"name": "gc-node", "ownerReferences": [owner]}))
    st, _h, b = req("DELETE", "/api/v1/nodes/gc-node")
    t.ok(st == 200 and b["status"] == "Success", "delete a Node", diag=b)
    gone = wait_for(lambda: req("GET", G + "/namespaces/default/gkmcachenodes/gc-node")[0] == 404 and
                    req("GET", G + "/clustergkmcachenodes/gc-node")[0] == 404)
    t.ok(gone, "its GKMCacheNode and ClusterGKMCacheNode are collected")

    node = req("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gc2"}})[2]
    owner = {"apiVersion": "v1", "kind": "Node", "name": "gc2", "uid": node["metadata"]["uid"]}
    req("POST", G + "/namespaces/default/gkmcachenodes", node_report("gc2", "gc2", owner=owner))
    req("DELETE", "/api/v1/nodes/gc2", {"propagationPolicy": "Orphan"})
    kept = wait_for(lambda: req("GET", "/api/v1/nodes/gc2")[0] == 404 and
                    "ownerReferences" not in get(G + "/namespaces/default/gkmcachenodes/gc2")["metadata"])
    t.ok(kept, "propagationPolicy Orphan: the dependent stays, without the owner reference")

    node = req("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gc3"}})[2]
    owner = {"apiVersion": "v1", "kind": "Node", "name": "gc3", "uid": node["metadata"]["uid"],
             "blockOwnerDeletion": True}
    req("POST", G + "/namespaces/default/gkmcachenodes",
        dict(node_report("gc3", "gc3", owner=owner), metadata={
            "name": "gc3", "namespace": "default", "ownerReferences": [owner], "finalizers": ["gkm.io/hold"]}))
    st, _h, b = req("DELETE", "/api/v1/nodes/gc3", {"propagationPolicy": "Foreground"})
    t.ok(st == 200 and b["metadata"].get("deletionTimestamp") and "foregroundDeletion" in b["metadata"]["finalizers"],
         "Foreground: the owner is marked and waits", diag=b)
    dep = wait_for(lambda: get(G + "/namespaces/default/gkmcachenodes/gc3")["metadata"].get("deletionTimestamp"))
    t.ok(dep and req("GET", "/api/v1/nodes/gc3")[0] == 200,
         "...while its dependent (held by a finalizer) is being deleted")
    req("PATCH", G + "/namespaces/default/gkmcachenodes/gc3", {"metadata": {"finalizers": None}}, content_type=MERGE)
    t.ok(wait_for(lambda: req("GET", "/api/v1/nodes/gc3")[0] == 404 and
                  req("GET", G + "/namespaces/default/gkmcachenodes/gc3")[0] == 404),
         "once the finalizer is removed, dependent and owner are gone")
    dangling = {"apiVersion": "v1", "kind": "Node", "name": "ghost", "uid": "00000000-0000-0000-0000-000000000001"}
    req("POST", G + "/namespaces/default/gkmcachenodes", node_report("orphan", "ghost", owner=dangling))
    t.ok(wait_for(lambda: req("GET", G + "/namespaces/default/gkmcachenodes/orphan")[0] == 404),
         "an object whose owner does not exist is collected")

    # ---------------------------------------------- delete semantics
    c = get(CM + "/c1")
    st, _h, b = req("DELETE", CM + "/c1", {"preconditions": {"resourceVersion": "1"}})
    t.ok(st == 409 and "the ResourceVersion in the precondition (1) does not match" in b["message"],
         "delete with a stale resourceVersion precondition: 409", diag=b)
    req("PATCH", CM + "/c1", {"metadata": {"finalizers": ["gkm.io/keep"]}}, content_type=MERGE)
    st, _h, b = req("DELETE", CM + "/c1")
    t.ok(st == 200 and b.get("kind") == "ConfigMap" and b["metadata"].get("deletionTimestamp"),
         "delete with a finalizer answers the object, marked for deletion", diag=b)
    t.eq(req("GET", CM + "/c1")[0], 200, "it stays until the finalizer goes")
    req("PATCH", CM + "/c1", {"metadata": {"finalizers": None}}, content_type=MERGE)
    t.eq(req("GET", CM + "/c1")[0], 404, "removing the finalizer deletes it")
    st, _h, b = req("DELETE", G + "/namespaces/other/gkmcaches?labelSelector=tier%3Dgold")
    t.ok(st == 200 and sorted(x["metadata"]["name"] for x in b["items"]) == ["p00", "p06"],
         "deletecollection with a label selector", diag=b)
    del c

    # ------------------------------------------------------ namespaces
    st, _h, b = req("DELETE", "/api/v1/namespaces/other")
    t.ok(st == 200 and b["status"]["phase"] == "Terminating", "deleting a namespace: Terminating", diag=b)
    st, _h, b = req("POST", G + "/namespaces/other/gkmcaches", dict(cache("late", ns="other")))
    t.ok(st in (403, 404), "nothing new is created in a terminating namespace", diag=b)
    t.ok(wait_for(lambda: req("GET", "/api/v1/namespaces/other")[0] == 404),
         "the namespace goes once its objects are deleted")
    t.eq(get(G + "/gkmcaches?fieldSelector=metadata.namespace%3Dother")["items"], [],
         "...and took its objects with it")

    # ------------------------------------------------------- CRDs
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "gadgets.example.com"},
           "spec": {"group": "example.com", "scope": "Cluster",
                    "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {
                                          "size": {"type": "integer", "default": 3}}}}}}}]}}
    st, _h, b = req("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    t.eq(st, 201, "register a CRD")
    est = wait_for(lambda: any(c["type"] == "Established" and c["status"] == "True" for c in
                               get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.example.com")
                               ["status"].get("conditions") or []))
    t.ok(est, "it becomes Established")
    st, _h, b = req("POST", "/apis/example.com/v1/gadgets", {"apiVersion": "example.com/v1", "kind": "Gadget",
                                                              "metadata": {"name": "g1"}, "spec": {}})
    t.ok(st == 201 and b["spec"] == {"size": 3}, "its objects are served, with schema defaults", diag=b)
    bad = dict(crd, metadata={"name": "wrong.example.com"})
    st, _h, b = req("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", bad)
    t.ok(st == 422 and "metadata.name" in [f for f, _r in causes(b)], "a CRD whose name is not plural.group: 422",
         diag=b)
    req("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.example.com")
    t.ok(wait_for(lambda: req("GET", "/apis/example.com/v1/gadgets/g1")[0] == 404 and
                  req("GET", "/apis/example.com/v1")[0] == 404),
         "deleting the CRD removes its objects and its group")

    # ----------------------------------------------- the two Event APIs
    c1 = get(NSG + "/c1")
    ref = {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache", "namespace": "default", "name": "c1",
           "uid": c1["metadata"]["uid"]}
    st, _h, b = req("POST", "/apis/events.k8s.io/v1/namespaces/default/events", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"generateName": "c1-"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "gkm.io/agent",
        "reportingInstance": "node-1", "action": "Pull", "reason": "Pulled", "note": "pulled", "type": "Normal",
        "regarding": ref})
    t.eq(st, 201, "events.k8s.io/v1 Event created")
    b = get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.uid%3D" + c1["metadata"]["uid"])
    t.ok(len(b["items"]) == 1 and b["items"][0]["message"] == "pulled" and
         b["items"][0]["involvedObject"] == ref and b["items"][0]["reportingComponent"] == "gkm.io/agent",
         "...listed as a core/v1 Event by involvedObject.uid (what kubectl describe asks)", diag=b)
    st, _h, b = req("POST", "/apis/events.k8s.io/v1/namespaces/default/events", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e2"}, "regarding": ref})
    t.ok(st == 422 and {"eventTime", "reportingController", "action", "reason"} <= {f for f, _r in causes(b)},
         "events.k8s.io/v1 requires eventTime, reportingController, action, reason", diag=b)

    # ---------------------------------------------- request recording
    seq = ks.control("requests", {"since": 0})["next"]
    apply(CM + "/rec", dict(base, metadata={"name": "rec"}), "gkm-agent/node-9")
    w = ks.watch(CM + "?watch=1&timeoutSeconds=1&labelSelector=x%3Dy")
    w.next()
    w.close()
    got = ks.control("requests", {"since": seq, "path": "/configmaps"})["requests"]
    t.ok([(r["method"], r["fieldManager"], r["contentType"], r["status"], r["watch"]) for r in got] ==
         [("PATCH", "gkm-agent/node-9", APPLY, 201, False), ("GET", "", "", 200, True)],
         "/_test/requests: what clients sent, with field manager, content type and status", diag=got)

    # --------------------------------------------------- HTTP details
    conn = ks.connection()
    rvs = []
    for _ in range(3):
        st, _h, b = req("GET", CM, conn=conn)
        rvs.append(st)
    conn.close()
    t.eq(rvs, [200, 200, 200], "several requests on one keep-alive connection")
    conn = ks.connection()
    conn.putrequest("POST", CM)
    conn.putheader("Authorization", "Bearer " + ks.token)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chunked"}}).encode()
    conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    st = conn.getresponse().status
    conn.close()
    t.eq(st, 201, "a chunked request body")
    st, _h, b = req("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                                 "data": {"x": "y" * (3 * 1024 * 1024 + 10)}})
    t.eq(st, 413, "a body over 3 MiB: 413")
    ks.control("fault", {"action": "malformed", "path": "/configmaps/chunked", "stage": "response"})
    st, _h, raw = req("GET", CM + "/chunked", raw=True)
    try:
        json.loads(raw)
        broken = False
    except ValueError:
        broken = True
    t.ok(st == 200 and broken, "fault injection: a malformed answer once")
    t.eq(req("GET", CM + "/chunked")[0], 200, "...then normal answers again")
    ks.control("fault", {"action": "status:503", "path": "/configmaps", "method": "GET"})
    st, h, b = req("GET", CM)
    t.ok(st == 503 and h.get("retry-after") == "1", "fault injection: a 503 with Retry-After", diag=(st, h))
    ks.control("fault", {"action": "truncate", "stage": "watch", "path": "watch=1"})
    w = ks.watch(CM + "?watch=1", timeout=10)
    evs, cut = [], False
    try:
        while True:
            e = w.next()
            if e is None:
                break
            evs.append(e)
    except Exception:  # noqa: BLE001 - http.client raises on a chunk cut short
        cut = True
    w.close()
    t.ok(cut and len(evs) == 1, "fault injection: a watch stream cut in the middle of its second event",
         diag=(cut, evs))


def auth_and_restart():
    # client certificates, then a restart that keeps objects and versions
    with KubeServer(tls=True, token=None, client_ca=True) as ks:
        st, _h, _b = ks.request("GET", "/api/v1/namespaces")
        t.eq(st, 200, "a client certificate signed by the server's CA authenticates")
        import http.client
        import ssl
        ctx = ssl.create_default_context(cafile=ks.ca)
        c = http.client.HTTPSConnection("127.0.0.1", ks.port, context=ctx)
        c.request("GET", "/api/v1/namespaces")
        st = c.getresponse().status
        c.close()
        t.eq(st, 401, "without one (and no token): 401")

    with KubeServer(tls=False, token="tok", watch_history=3) as ks:
        ns = "/api/v1/namespaces/default/configmaps"
        first = ks.request("POST", ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})[2]
        for i in range(4):
            ks.request("PATCH", ns + "/a", {"data": {"i": str(i)}}, content_type=MERGE)
        st, _h, out = ks.request("GET", ns + "?watch=1&resourceVersion=" + first["metadata"]["resourceVersion"])
        t.ok(isinstance(out, dict) and out.get("type") == "ERROR" and out["object"]["code"] == 410,
             "a bounded history (--watch-history 3): older versions are 410 Gone", diag=out)
        before = ks.request("GET", ns + "/a")[2]
        ks.restart()
        after = ks.request("GET", ns + "/a")[2]
        t.ok(after["metadata"]["uid"] == before["metadata"]["uid"] and after["data"] == before["data"],
             "a restart keeps the objects (--state)")
        new = ks.request("POST", ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}})[2]
        t.ok(int(new["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"]),
             "...and resourceVersions keep increasing")
        st, _h, out = ks.request("GET", ns + "?watch=1&timeoutSeconds=2&resourceVersion="
                                 + first["metadata"]["resourceVersion"])
        t.ok(isinstance(out, dict) and out.get("type") == "ERROR" and out["object"]["code"] == 410,
             "a watch from before the restart is 410 Gone (the cache starts empty)", diag=out)
        # a watch is cut by a restart
        w = ks.watch(ns + "?watch=1&resourceVersion=" + new["metadata"]["resourceVersion"])
        ks.restart()
        try:
            ended = w.next() is None
        except (OSError, ValueError, Exception):  # noqa: BLE001
            ended = True
        t.ok(ended, "a restart ends open watches")
        w.close()
        s = socket.create_connection(("127.0.0.1", ks.port))
        s.close()


if __name__ == "__main__":
    ks = KubeServer(tls=True, token="sem-token", bookmark_interval=0.5).start()
    try:
        main(ks)
        auth_and_restart()
    except Exception:  # noqa: BLE001
        import traceback
        t.ok(False, "the spec ran to the end", diag=traceback.format_exc() + "\n" + ks.tail())
    finally:
        ks.cleanup()
    sys.exit(t.finish())
