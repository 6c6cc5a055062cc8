"""OpenAPI v3 documents of the test API server: /openapi/v3 (the index with
hashed server-relative URLs) and one document per group-version, enough for
`kubectl apply --server-side` (which checks that the PATCH operation of the
kind takes fieldValidation) and `kubectl explain`."""
import hashlib
import json

import kschema

META = "io.k8s.apimachinery.pkg.apis.meta.v1."


def _param(name, where="query", typ="string", desc=""):
    return {"name": name, "in": where, "description": desc or name,
            "schema": {"type": typ, "uniqueItems": True}}


LIST_PARAMS = [_param(n, typ="boolean" if n in ("allowWatchBookmarks", "watch") else
                      "integer" if n in ("limit", "timeoutSeconds") else "string")
               for n in ("allowWatchBookmarks", "continue", "fieldSelector", "labelSelector",
                         "limit", "resourceVersion", "resourceVersionMatch",
                         "sendInitialEvents", "timeoutSeconds", "watch")]
WRITE_PARAMS = [_param("dryRun"), _param("fieldManager"), _param("fieldValidation")]
PATCH_PARAMS = WRITE_PARAMS + [_param("force", typ="boolean")]


def _meta_schemas():
    s = {}
    s[META + "ObjectMeta"] = {
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "properties": {k: _strip_ext(v) for k, v in kschema.OBJECT_META_SCHEMA["properties"].items()},
    }
    s[META + "ObjectMeta"]["properties"]["managedFields"] = {
        "type": "array", "items": {"$ref": "#/components/schemas/" + META + "ManagedFieldsEntry"}}
    s[META + "ManagedFieldsEntry"] = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "fieldsType": {"type": "string"},
        "fieldsV1": {"$ref": "#/components/schemas/" + META + "FieldsV1"},
        "manager": {"type": "string"}, "operation": {"type": "string"},
        "subresource": {"type": "string"}, "time": {"type": "string", "format": "date-time"}}}
    s[META + "FieldsV1"] = {"type": "object"}
    s[META + "ListMeta"] = {"type": "object", "properties": {
        "continue": {"type": "string"}, "remainingItemCount": {"type": "integer"},
        "resourceVersion": {"type": "string"}, "selfLink": {"type": "string"}}}
    s[META + "Status"] = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "code": {"type": "integer"},
        "details": {"type": "object"}, "kind": {"type": "string"},
        "message": {"type": "string"}, "metadata": {"$ref": "#/components/schemas/" + META + "ListMeta"},
        "reason": {"type": "string"}, "status": {"type": "string"}},
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}]}
    s[META + "Patch"] = {"type": "object", "description": "Patch is provided to give a concrete "
                                                          "name and type to the request body."}
    s[META + "DeleteOptions"] = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "dryRun": {"type": "array", "items": {"type": "string"}},
        "gracePeriodSeconds": {"type": "integer"}, "kind": {"type": "string"},
        "orphanDependents": {"type": "boolean"},
        "preconditions": {"type": "object", "properties": {
            "resourceVersion": {"type": "string"}, "uid": {"type": "string"}}},
        "propagationPolicy": {"type": "string"}}}
    return s


def _strip_ext(v):
    return {k: x for k, x in v.items() if not k.startswith("x-kubernetes-list")}


def _schema_name(rt):
    if rt.crd is not None:
        parts = rt.group.split(".")
        return ".".join(reversed(parts)) + "." + rt.version + "." + rt.kind
    grp = rt.group.split(".")[0] if rt.group else "core"
    return "io.k8s.api.%s.%s.%s" % (grp, rt.version, rt.kind)


def _object_schema(rt):
    if rt.schema is not None:
        body = json.loads(json.dumps(rt.schema))
    else:
        body = {"type": "object", "properties": {}}
        for k, v in (rt.ssa_schema.get("properties") or {}).items():
            if k != "metadata":
                body["properties"][k] = v
    body.setdefault("properties", {})
    body["properties"]["apiVersion"] = {"type": "string", "description": "APIVersion defines the "
                                        "versioned schema of this representation of an object."}
    body["properties"]["kind"] = {"type": "string", "description": "Kind is a string value "
                                  "representing the REST resource this object represents."}
    body["properties"]["metadata"] = {"allOf": [{"$ref": "#/components/schemas/" + META + "ObjectMeta"}],
                                      "description": "Standard object's metadata."}
    body["x-kubernetes-group-version-kind"] = [{"group": rt.group, "kind": rt.kind,
                                                "version": rt.version}]
    return body


def _op(rt, action, desc, params, ref, body_types=None):
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    op = {"description": desc, "operationId": action + rt.kind, "parameters": params,
          "responses": {"200": {"description": "OK", "content": {
              "application/json": {"schema": {"$ref": ref}}}},
              "401": {"description": "Unauthorized"}},
          "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk}
    if body_types:
        op["requestBody"] = {"content": {t: {"schema": {"$ref": s}} for t, s in body_types}}
    return op


class OpenAPI:
    def __init__(self, server):
        self.server = server

    def _gvs(self):
        out = {}
        for (g, v, _p), rt in self.server.types.items():
            key = "api/v1" if not g else "apis/%s/%s" % (g, v)
            out.setdefault(key, []).append(rt)
        return out

    def document(self, rel):
        gvs = self._gvs()
        rts = gvs.get(rel)
        if not rts:
            return None
        schemas = _meta_schemas()
        paths = {}
        for rt in sorted(rts, key=lambda r: r.plural):
            name = _schema_name(rt)
            ref = "#/components/schemas/" + name
            schemas[name] = _object_schema(rt)
            schemas[name + "List"] = {"type": "object", "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": ref}},
                "metadata": {"$ref": "#/components/schemas/" + META + "ListMeta"}},
                "required": ["items"],
                "x-kubernetes-group-version-kind": [{"group": rt.group, "kind": rt.list_kind,
                                                     "version": rt.version}]}
            base = "/" + rel + ("/namespaces/{namespace}" if rt.namespaced else "") + "/" + rt.plural
            patch_ref = "#/components/schemas/" + META + "Patch"
            paths[base] = {
                "get": _op(rt, "list", "list or watch objects of kind " + rt.kind, LIST_PARAMS,
                           ref + "List"),
                "post": _op(rt, "post", "create a " + rt.kind, WRITE_PARAMS, ref, [("*/*", ref)]),
                "delete": _op(rt, "deletecollection", "delete collection of " + rt.kind,
                              LIST_PARAMS, "#/components/schemas/" + META + "Status"),
            }
            patch_types = ["application/apply-patch+yaml", "application/json-patch+json",
                           "application/merge-patch+json"]
            if rt.crd is None:
                patch_types.append("application/strategic-merge-patch+json")
            item = {
                "get": _op(rt, "get", "read the specified " + rt.kind, [_param("resourceVersion")], ref),
                "put": _op(rt, "put", "replace the specified " + rt.kind, WRITE_PARAMS, ref,
                           [("*/*", ref)]),
                "patch": _op(rt, "patch", "partially update the specified " + rt.kind,
                             PATCH_PARAMS, ref,
                             [(t, patch_ref) for t in patch_types]),
                "delete": _op(rt, "delete", "delete a " + rt.kind,
                              [_param("dryRun"), _param("gracePeriodSeconds", typ="integer"),
                               _param("propagationPolicy")],
                              "#/components/schemas/" + META + "Status"),
                "parameters": [_param("name", "path")] + (
                    [_param("namespace", "path")] if rt.namespaced else []),
            }
            paths[base + "/{name}"] = item
            if rt.status:
                paths[base + "/{name}/status"] = {
                    "get": item["get"], "put": item["put"], "patch": item["patch"],
                    "parameters": item["parameters"]}
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
                "paths": paths, "components": {"schemas": schemas}}

    def root(self):
        paths = {}
        for rel in sorted(self._gvs()):
            doc = self.document(rel)
            h = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()
            paths[rel] = {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (rel, h)}
        return {"paths": paths}
