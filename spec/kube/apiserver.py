#!/usr/bin/python3
"""A Kubernetes API server for tests (the one stand-in the project allows).

Suites that need Kubernetes as it is run against a real kube-apiserver
(spec/lib/kubeenv.py, found through GKM_KUBE_ASSETS): the pipeline, kubectl
output, the webhook in the admission chain, garbage collection, leases, CSI
through a real kubelet. This stand-in stays only for what a real server cannot
be made to do on demand: 410 Gone on a chosen watch (/_test/compact), watch
streams cut, stalled or truncated (/_test/close-watches, faults), injected
409s and 5xx on chosen requests (/_test/fault), and a record of every request
a client sent (/_test/requests). Tests of those paths (kube_client.py,
kube_apiserver_semantics.py, agent_node_objects.sh, metrics.py) and the
replay of recorded real exchanges (kube_apiserver.py, which keeps the
stand-in honest) use it.

It serves, with the semantics of kube-apiserver: discovery and OpenAPI v3
documents, a few built-in kinds (Namespace, Node, Pod, ConfigMap, Secret,
Event in core/v1 and events.k8s.io/v1, Lease, CSIDriver,
CustomResourceDefinition) and every custom resource its CRDs define; CRUD with
resourceVersions, optimistic concurrency and preconditions; LIST with
pagination and label/field selectors; WATCH with bookmarks and 410 Gone;
server-side apply with managed fields; merge, JSON and strategic patches;
schema validation; status subresources; generation; owner references with
garbage collection; Table output for kubectl.

    apiserver.py --port 0 --port-file F --crds DIR [--tls-dir D] [--token T]
"""
import argparse
import base64
import bisect
import collections
import datetime
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kadmission  # noqa: E402
import kopenapi  # noqa: E402
import kproto  # noqa: E402
import kschema  # noqa: E402
import ksel  # noqa: E402
import kssa  # noqa: E402
import kstore  # noqa: E402
import ktypes  # noqa: E402

try:
    import yaml
    _YamlBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class _Loader(_YamlBase):
        """YAML like the API server reads it: timestamps stay strings."""

    _Loader.yaml_implicit_resolvers = {
        k: [r for r in v if r[0] != "tag:yaml.org,2002:timestamp"]
        for k, v in _YamlBase.yaml_implicit_resolvers.items()}
except ImportError:  # pragma: no cover - python3-yaml is a dependency
    yaml = None

VERSION_INFO = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-gkm-test",
    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23.0", "compiler": "gc",
    "platform": "linux/amd64",
}
MAX_BODY = 3 * 1024 * 1024          # the real server's request size limit
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
PATCH_TYPES_CR = ["application/json-patch+json", "application/merge-patch+json",
                  "application/apply-patch+yaml"]
PATCH_TYPES_BUILTIN = ["application/json-patch+json", "application/merge-patch+json",
                       "application/strategic-merge-patch+json", "application/apply-patch+yaml"]


def now_str():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class NeedsAdmission(Exception):
    """Raised with the store lock held when webhooks must review an object."""

    def __init__(self, hooks, rt, sub, op, obj, old, cur, name, ns):
        super().__init__("admission")
        self.hooks, self.rt, self.sub, self.op = hooks, rt, sub, op
        self.obj, self.old, self.cur, self.name, self.ns = obj, old, cur, name, ns


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None, headers=None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details
        self.headers = headers or []

    def status(self):
        st = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": self.message, "reason": self.reason}
        if self.details is not None:
            st["details"] = self.details
        st["code"] = self.code
        return st


def status_obj(code, reason, message, details=None):
    return ApiError(code, reason, message, details).status()


def _details(rt, name, kind=None):
    d = {"name": name}
    if rt.group:
        d["group"] = rt.group
    d["kind"] = kind or rt.plural
    return d


def not_found(rt, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (rt.qualified, name),
                    _details(rt, name))


def conflict(rt, name, msg):
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s'
                    % (rt.qualified, name, msg), _details(rt, name))


def invalid(rt, name, errs):
    gk_group = "" if rt.storage == "core/events" else rt.group
    gk = "%s.%s" % (rt.kind, gk_group) if gk_group else rt.kind
    d = {"name": name}
    if gk_group:
        d["group"] = gk_group
    d["kind"] = rt.kind
    d["causes"] = [{"reason": e.reason, "message": e.body(), "field": e.field} for e in errs]
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s' % (gk, name, kschema.aggregate(errs)),
                    d)


def bad_request(msg):
    return ApiError(400, "BadRequest", msg)


def copy_obj(v):
    return kssa._copy(v)


def json_error_text(data, exc):
    """Go's wording of a JSON syntax error."""
    if isinstance(exc, json.JSONDecodeError) and exc.pos >= len(exc.doc.rstrip()):
        return "unexpected end of JSON input"
    if isinstance(exc, json.JSONDecodeError) and exc.pos < len(exc.doc):
        return "invalid character %s looking for beginning of value" % json.dumps(exc.doc[exc.pos])
    return str(exc)


# ====================================================================== server

class Server:
    def __init__(self, args):
        self.args = args
        self.store = kstore.Store(history=args.watch_history)
        self.types = {}            # (group, version, plural) -> RType
        self.by_storage = {}       # storage -> [RType]
        self.gc_queue = __import__("queue").SimpleQueue()
        self.faults = []
        self.fault_lock = threading.Lock()
        self.watch_conns = set()
        self.token = args.token
        self.local = threading.local()
        self.admission = kadmission.Admission(self, args.service_endpoint)
        self.json_patch = json_patch
        self.request_count = 0
        self.requests = collections.deque(maxlen=100000)   # with --test-control
        self.request_seq = 0
        for rt in ktypes.builtin_types():
            self.register(rt)
        self.openapi = kopenapi.OpenAPI(self)
        with self.store.lock:
            for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
                self._create_internal(self.types[("", "v1", "namespaces")],
                                      {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns,
                                                    "labels": {"kubernetes.io/metadata.name": ns}}},
                                      "kube-apiserver")
        if args.state and os.path.exists(args.state):
            self.load_state(args.state)
        self.store.start_rv = self.store.rv
        self.store.history.clear()
        self.store.floor.clear()
        for d in args.crds or []:
            self.load_crds(d)
        threading.Thread(target=self.gc_loop, daemon=True, name="gc").start()

    def admit(self, rt, sub, op, obj, old, cur, name, ns):
        """Mutating and validating admission webhooks. They are called outside
        the store lock: the first time round this raises NeedsAdmission (the
        caller releases the lock, calls them and runs the request again);
        the second time the reviewed object is used if the stored object is
        still the one it was computed from. Lock held."""
        if not getattr(self.local, "in_run", False):
            return obj      # objects the server makes itself
        if not self.store.objs.get("admissionregistration.k8s.io/mutatingwebhookconfigurations") and \
                not self.store.objs.get("admissionregistration.k8s.io/validatingwebhookconfigurations"):
            return obj
        nsobj = self.store.get("core/namespaces", ns) if ns else None
        hooks = self.admission.hooks(rt, sub, op, obj, old,
                                     ((nsobj or {}).get("metadata") or {}).get("labels"))
        if not hooks:
            return obj
        st = self.local
        done = getattr(st, "admitted", None)
        if done is not None and done[0] is cur and done[1] == (rt.storage, op, name, ns):
            st.admitted = None
            return done[2]
        raise NeedsAdmission(hooks, rt, sub, op, obj, old, cur, name, ns)

    def run(self, fn, manager="", dry=False):
        """Run a write, with the admission round trips it needs."""
        st = self.local
        st.admitted = None
        st.warnings = []
        st.in_run = True
        try:
            return self._run(fn, manager, dry)
        finally:
            st.in_run = False
            st.admitted = None

    def _run(self, fn, manager, dry):
        st = self.local
        for _ in range(8):
            try:
                return fn()
            except NeedsAdmission as na:
                try:
                    obj, warns = self.admission.review(
                        na.hooks, na.rt, na.sub, na.op, na.obj, na.old, na.name, na.ns, dry,
                        manager, {"username": "gkm-test-admin",
                                  "groups": ["system:masters", "system:authenticated"]})
                except kadmission.Denied as d:
                    raise ApiError(d.code, d.reason, d.message, d.details)
                st.warnings += warns
                st.admitted = (na.cur, (na.rt.storage, na.op, na.name, na.ns), obj)
        raise ApiError(409, "Conflict", "the object kept changing while admission webhooks "
                                        "reviewed it; try again")

    def log_request(self, h):
        """Remember a request for /_test/requests (what clients really sent)."""
        url = urllib.parse.urlsplit(h.path)
        q = urllib.parse.parse_qs(url.query)
        with self.fault_lock:
            self.request_seq += 1
            self.requests.append({
                "seq": self.request_seq, "time": time.time(), "method": h.command,
                "path": url.path, "query": url.query,
                "contentType": h.headers.get("Content-Type", ""),
                "userAgent": h.headers.get("User-Agent", ""),
                "fieldManager": (q.get("fieldManager") or [""])[0],
                "watch": (q.get("watch") or [""])[0] in ("1", "true"), "status": h.status_sent})

    # ---------------------------------------------------------------- registry
    def register(self, rt):
        self.types[(rt.group, rt.version, rt.plural)] = rt
        lst = self.by_storage.setdefault(rt.storage, [])
        lst[:] = [x for x in lst if (x.group, x.version, x.plural) != (rt.group, rt.version, rt.plural)]
        lst.append(rt)

    def unregister_crd(self, crd):
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        storage = "%s/%s" % (spec.get("group"), names.get("plural"))
        for key in [k for k, rt in self.types.items() if rt.storage == storage]:
            del self.types[key]
        self.by_storage.pop(storage, None)

    def find_type(self, group, version, plural):
        return self.types.get((group, version, plural))

    def groups(self):
        """group -> ordered list of versions (preferred first)."""
        out = {}
        for (g, v, _p) in self.types:
            out.setdefault(g, [])
            if v not in out[g]:
                out[g].append(v)
        return out

    def storage_type(self, storage):
        """The RType a storage is kept in (its storage version)."""
        lst = self.by_storage.get(storage) or []
        for rt in lst:
            if getattr(rt, "is_storage", False) or rt.to_storage is None and rt.crd is None:
                return rt
        return lst[0] if lst else None

    def load_crds(self, path):
        files = []
        if os.path.isdir(path):
            for n in sorted(os.listdir(path)):
                if n.endswith((".yaml", ".yml", ".json")):
                    files.append(os.path.join(path, n))
        else:
            files.append(path)
        rt = self.types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        for f in files:
            with open(f) as fh:
                for doc in yaml.load_all(fh, Loader=_Loader):
                    if not doc or doc.get("kind") != "CustomResourceDefinition":
                        continue
                    with self.store.lock:
                        existing = self.store.get(rt.storage, doc["metadata"]["name"])
                        if existing is None:
                            self._create_internal(rt, doc, "kube-apiserver")

    # ------------------------------------------------------------------ state
    def save_state(self, path):
        with self.store.lock:
            data = {"rv": self.store.rv,
                    "objects": {s: list(objs.values()) for s, objs in self.store.objs.items() if objs}}
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)

    def load_state(self, path):
        with open(path) as fh:
            data = json.load(fh)
        with self.store.lock:
            crds = data["objects"].get("apiextensions.k8s.io/customresourcedefinitions", [])
            for crd in crds:
                for rt in ktypes.custom_type(crd):
                    self.register(rt)
            for storage, objs in data["objects"].items():
                for o in objs:
                    key = self.key_of(storage, o)
                    if key not in self.store.objs[storage]:
                        bisect.insort(self.store.keys[storage], key)
                    self.store.objs[storage][key] = o
                    self.store._index(storage, key, o)
            self.store.rv = max(self.store.rv, int(data["rv"]))

    def key_of(self, storage, obj):
        md = obj["metadata"]
        return "%s/%s" % (md["namespace"], md["name"]) if md.get("namespace") else md["name"]

    # ------------------------------------------------------------- internals
    def out(self, rt, obj):
        """An object as the client's version of it."""
        if rt.from_storage is not None:
            return rt.from_storage(obj)
        if rt.crd is not None and obj.get("apiVersion") != rt.gv:
            o = dict(obj)
            o["apiVersion"] = rt.gv
            return o
        return obj

    def encode(self, rt, obj):
        if rt.crd is not None:
            return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return json.dumps(order_builtin(obj), separators=(",", ":"), ensure_ascii=False)

    def _create_internal(self, rt, obj, manager):
        """Create without a request (start-up objects, CRD loading)."""
        return self.create(rt, obj.get("metadata", {}).get("namespace", ""), obj,
                           {"fieldManager": [manager]}, internal=True)

    # ================================================================ verbs
    def parse_body(self, raw, rt, content_type="application/json"):
        if raw is None or raw == b"":
            raise bad_request("the body of the request was empty")
        ct = (content_type or "").split(";")[0].strip()
        if ct == "application/vnd.kubernetes.protobuf":
            try:
                return kproto.decode(raw)
            except kproto.ProtoError as e:
                raise bad_request("the object provided is unrecognized (must be of type %s): %s"
                                  % (rt.kind, e))
        if ct not in ("", "application/json", "application/yaml", "application/apply-patch+yaml",
                      "*/*"):
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media "
                           "types include: application/json, application/yaml")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request("the object provided is unrecognized (must be of type %s): "
                              "invalid UTF-8" % rt.kind)
        if ct in ("application/yaml", "application/apply-patch+yaml"):
            try:
                return json.loads(text)
            except ValueError:
                pass
            try:
                v = yaml.load(text, Loader=_Loader)
            except yaml.YAMLError as e:
                raise bad_request("error decoding YAML: %s" % str(e).replace("\n", " "))
            return json.loads(json.dumps(v, default=str))
        try:
            return json.loads(text)
        except ValueError as e:
            snippet = text[:30]
            raise bad_request("the object provided is unrecognized (must be of type %s): "
                              "couldn't get version/kind; json parse error: %s (%s ...)"
                              % (rt.kind, json_error_text(text, e), snippet))

    def check_gvk(self, rt, obj):
        if not isinstance(obj, dict):
            raise bad_request("the object provided is unrecognized (must be of type %s): "
                              "couldn't get version/kind; json parse error: json: cannot "
                              "unmarshal %s into Go value of type struct { APIVersion string "
                              "\"json:\\\"apiVersion,omitempty\\\"\"; Kind string "
                              "\"json:\\\"kind,omitempty\\\"\" }" % (rt.kind, kschema.json_type(obj)))
        kind = obj.get("kind")
        av = obj.get("apiVersion")
        if kind and kind != rt.kind:
            raise bad_request("the object provided is unrecognized (must be of type %s): "
                              "no kind \"%s\" is registered for version \"%s\""
                              % (rt.kind, kind, av or rt.gv))
        if av and av != rt.gv:
            raise bad_request("the API version in the data (%s) does not match the expected "
                              "API version (%s)" % (av, rt.gv))
        md = obj.get("metadata")
        if md is not None and not isinstance(md, dict):
            raise bad_request("the object provided is unrecognized (must be of type %s): "
                              "metadata must be an object" % rt.kind)

    def to_storage(self, rt, obj):
        if rt.to_storage is not None:
            return rt.to_storage(obj)
        return obj

    def strict_fields(self, rt, obj, validation, apply=False):
        """Prune unknown fields of a custom resource; Strict fails on them."""
        warnings = []
        if rt.schema is None:
            return obj, warnings
        unknown = []
        out = kschema.prune(obj, rt.schema, "", unknown, root=True)
        md = obj.get("metadata")
        if isinstance(md, dict):
            out["metadata"] = kschema.prune(md, kschema.OBJECT_META_SCHEMA, "metadata", unknown)
        if unknown:
            if validation == "Strict":
                if apply:
                    raise bad_request("failed to create typed patch object (%s, Kind=%s): %s"
                                      % (rt.gv, rt.kind, "\n".join(
                                          ".%s: field not declared in schema" % u for u in unknown)))
                if len(unknown) == 1:
                    detail = 'unknown field "%s"' % unknown[0]
                else:
                    detail = ", ".join('unknown field "%s"' % u for u in unknown)
                raise bad_request('%s in version "%s" cannot be handled as a %s: strict decoding '
                                  'error: %s' % (rt.kind, rt.version, rt.kind, detail))
            if validation == "Warn":
                warnings = ['unknown field "%s"' % u for u in unknown]
        return out, warnings

    def validate(self, rt, obj, old, request_gv, known=None):
        md = obj.get("metadata") or {}
        errs = []
        name = md.get("name", "")
        if rt.storage != "core/events" or request_gv == "v1":
            if not name:
                errs.append(kschema.FieldError("required", "metadata.name", kschema.OMIT,
                                               "name or generateName is required"))
            elif rt.name_kind != "path" or rt.storage != "core/events":
                errs += kschema.check_name(name, rt.name_kind, "metadata.name")
            elif rt.name_kind == "path":
                errs += kschema.check_name(name, "path", "metadata.name")
        if rt.namespaced and not md.get("namespace"):
            errs.append(kschema.FieldError("required", "metadata.namespace"))
        if not rt.namespaced and md.get("namespace"):
            errs.append(kschema.FieldError("forbidden", "metadata.namespace", kschema.OMIT,
                                           "not allowed on this type"))
        errs += kschema.check_meta(md, rt.name_kind, rt.namespaced)
        if old is not None:
            omd = old["metadata"]
            if md.get("name") != omd.get("name"):
                errs.append(kschema.FieldError("invalid", "metadata.name", md.get("name"),
                                               "field is immutable"))
        if rt.schema is not None:
            body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
            sch = dict(rt.schema)
            props = dict(sch.get("properties") or {})
            for k in ("metadata", "apiVersion", "kind"):
                props.pop(k, None)
            sch["properties"] = props
            errs += kschema.validate(body, sch, "", known=known)
        if rt.extra_validate is not None:
            errs += rt.extra_validate(rt, obj, old, request_gv)
        if rt.plural == "customresourcedefinitions":
            errs += validate_crd(obj)
        if errs:
            raise invalid(rt, name or md.get("generateName", ""), errs)

    def ignored_for(self, rt, sub):
        if not rt.status:
            return ()
        if sub == "status":
            return [("f:" + k,) for k in ("spec", "data", "binaryData")]
        return [("f:status",)]

    def ns_check(self, rt, ns):
        if not rt.namespaced:
            return
        nsobj = self.store.get("core/namespaces", ns)
        if nsobj is None:
            nsrt = self.types[("", "v1", "namespaces")]
            raise not_found(nsrt, ns)
        if (nsobj.get("status") or {}).get("phase") == "Terminating":
            raise ApiError(403, "Forbidden",
                           '%s "%s" is forbidden: unable to create new content in namespace %s '
                           'because it is being terminated' % (rt.qualified,
                                                                "", ns),
                           {"name": "", "group": rt.group, "kind": rt.plural,
                            "causes": [{"reason": "NamespaceTerminating",
                                        "message": "namespace %s is being terminated" % ns,
                                        "field": "metadata.namespace"}]})

    def key(self, rt, ns, name):
        return "%s/%s" % (ns, name) if rt.namespaced else name

    def manager_name(self, params, headers):
        m = (params.get("fieldManager") or [""])[0]
        if m:
            if len(m) > 128:
                raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: '
                               'fieldManager: Too long: may not be longer than 128')
            return m
        ua = (headers or {}).get("User-Agent", "") if headers else ""
        return ua.split("/")[0][:128] if ua else "unknown"

    # ------------------------------------------------------------------ create
    def create(self, rt, ns, body, params, headers=None, internal=False):
        obj = copy_obj(body)
        self.check_gvk(rt, obj)
        validation = self.field_validation(params)
        obj, warnings = self.strict_fields(rt, obj, validation)
        obj["apiVersion"] = rt.gv
        obj["kind"] = rt.kind
        md = obj.setdefault("metadata", {})
        if rt.namespaced:
            if md.get("namespace") and md["namespace"] != ns:
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        if md.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if not md.get("name") and md.get("generateName"):
            prev = getattr(self.local, "admitted", None)
            if prev and prev[1][1] == "CREATE" and prev[1][2].startswith(md["generateName"]):
                md["name"] = prev[1][2]     # the name the webhooks saw
            else:
                md["name"] = md["generateName"] + "".join(random.choice(NAME_CHARS) for _ in range(5))
        request_gv = rt.gv
        manager = self.manager_name(params, headers)
        dry = "All" in params.get("dryRun", [])
        with self.store.lock:
            stored = self.prepare_create(rt, obj, ns, request_gv, manager, internal)
            key = self.key(rt, ns, stored["metadata"]["name"])
            if self.store.get(rt.storage, key) is not None:
                raise ApiError(409, "AlreadyExists", '%s "%s" already exists'
                               % (rt.qualified, stored["metadata"]["name"]),
                               _details(rt, stored["metadata"]["name"]))
            if dry:
                stored["metadata"]["resourceVersion"] = ""
                return self.out(rt, stored), warnings
            res = self.store.commit(rt.storage, key, stored)
            self.after_write(rt, res, None)
        return self.out(rt, res), warnings

    def prepare_create(self, rt, obj, ns, request_gv, manager, internal, managers=None,
                       apply_done=False):
        """Fill server fields, validate, record ownership; returns the storage
        form. Lock held."""
        md = obj["metadata"]
        mf_in = md.pop("managedFields", None)
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "selfLink", "generation"):
            md.pop(k, None)
        if rt.status and rt.crd is not None:
            obj.pop("status", None)
        if rt.plural == "namespaces":
            md.setdefault("labels", {})["kubernetes.io/metadata.name"] = md.get("name", "")
        if rt.plural == "customresourcedefinitions":
            obj.pop("status", None)
            obj.setdefault("spec", {}).setdefault("conversion", {"strategy": "None"})
        if rt.has_defaults:
            kschema.apply_defaults(obj, rt.schema)
        obj = self.admit(rt, "", "CREATE", obj, None, None, md.get("name", ""), ns)
        storage_form = self.to_storage(rt, obj)
        self.storage_skeleton(rt).apply_skeleton(storage_form)
        if not apply_done:
            if managers is None:
                try:
                    managers = kssa.Managers(mf_in if isinstance(mf_in, list) else [])
                except ValueError:
                    managers = kssa.Managers()
            kssa.update(managers, self.empty_object(rt), self.out(rt, storage_form), rt.ssa_schema,
                        manager, "", rt.gv, now_str())
        # what the create strategy sets comes after the field manager ran
        if rt.normalize is not None:
            rt.normalize(storage_form)
        if rt.plural == "pods":
            storage_form["status"] = {"phase": "Pending"}
        if rt.plural == "namespaces":
            storage_form["status"] = {"phase": "Active"}
            storage_form.setdefault("spec", {})["finalizers"] = ["kubernetes"]
        if rt.plural == "customresourcedefinitions":
            storage_form["status"]["storedVersions"] = [
                v["name"] for v in storage_form["spec"].get("versions") or [] if v.get("storage")]
        if not internal:
            self.ns_check(rt, ns)
        self.validate(rt, storage_form, None, request_gv)
        smd = storage_form["metadata"]
        smd["uid"] = str(uuid.uuid4())
        smd["creationTimestamp"] = now_str()
        if rt.generation:
            smd["generation"] = 1
        mf = managers.encode() if managers is not None else []
        if mf:
            smd["managedFields"] = mf
        else:
            smd.pop("managedFields", None)
        return storage_form

    def storage_skeleton(self, rt):
        srt = self.storage_type(rt.storage)
        return srt if srt is not None else rt

    def empty_object(self, rt):
        """What a new object of this kind looks like before the request."""
        e = {"apiVersion": rt.gv, "kind": rt.kind, "metadata": {}}
        srt = self.storage_skeleton(rt)
        if srt.skeleton:
            base = {"apiVersion": srt.gv, "kind": srt.kind, "metadata": {}}
            srt.apply_skeleton(base)
            e = self.out(rt, base)
            e = copy_obj(e)
            e["metadata"] = {}
        return e

    def field_validation(self, params):
        v = (params.get("fieldValidation") or ["Warn"])[0] or "Warn"
        if v not in ("Ignore", "Warn", "Strict"):
            raise bad_request("fieldValidation parameter unsupported: %s" % v)
        return v

    # ------------------------------------------------------------------ update
    def update(self, rt, ns, name, sub, body, params, headers=None):
        obj = body
        self.check_gvk(rt, obj)
        validation = self.field_validation(params)
        obj, warnings = self.strict_fields(rt, obj, validation)
        md = obj.setdefault("metadata", {})
        if md.get("name") and md["name"] != name:
            raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                              % (md["name"], name))
        if rt.namespaced and md.get("namespace") and md["namespace"] != ns:
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        manager = self.manager_name(params, headers)
        dry = "All" in params.get("dryRun", [])
        with self.store.lock:
            key = self.key(rt, ns, name)
            cur = self.store.get(rt.storage, key)
            if cur is None:
                if rt.create_on_update and not sub:
                    md["name"] = name
                    return self.create(rt, ns, obj, params, headers)
                raise not_found(rt, name)
            if md.get("uid") and md["uid"] != cur["metadata"]["uid"]:
                raise ApiError(409, "Conflict", "Precondition failed: UID in precondition: %s, "
                               "UID in object meta: %s" % (cur["metadata"]["uid"], md["uid"]),
                               _details(rt, name))
            if md.get("resourceVersion") and md["resourceVersion"] != cur["metadata"]["resourceVersion"]:
                raise conflict(rt, name, "the object has been modified; please apply your "
                                         "changes to the latest version and try again")
            obj["apiVersion"] = rt.gv
            obj["kind"] = rt.kind
            md["name"] = name
            mf_in = md.get("managedFields")
            res = self.finish_update(rt, cur, obj, sub, manager, mf_in, None, dry)
        return res, warnings

    def finish_update(self, rt, cur, new_req, sub, manager, mf_in, managers, dry,
                      apply_done=False):
        """Shared tail of PUT and PATCH: new_req is the client's version of the
        desired object. Lock held. Returns the object to answer with."""
        # objects are never modified in place once stored: copy what changes
        cur_out = self.out(rt, cur)
        new = dict(new_req)
        md = new["metadata"] = dict(new.get("metadata") or {})
        cmd = cur_out["metadata"]
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "namespace", "resourceVersion", "selfLink"):
            if k in cmd:
                md[k] = cmd[k]
            else:
                md.pop(k, None)
        if rt.status:
            if sub == "status":
                keep = dict(cur_out)
                if "status" in new:
                    keep["status"] = new["status"]
                else:
                    keep.pop("status", None)
                keep["metadata"] = dict(cmd)
                if "managedFields" in md:
                    keep["metadata"]["managedFields"] = md["managedFields"]
                new = keep
                md = new["metadata"]
            else:
                if "status" in cur_out:
                    new["status"] = cur_out["status"]
                else:
                    new.pop("status", None)
        if rt.has_defaults:
            new = kschema.apply_defaults(copy_obj(new), rt.schema)
        new = self.admit(rt, sub, "UPDATE", new, cur_out, cur, cmd.get("name", ""),
                         cmd.get("namespace", ""))
        storage_form = self.to_storage(rt, new)
        self.storage_skeleton(rt).apply_skeleton(storage_form)
        if rt.normalize is not None:
            rt.normalize(storage_form)
        self.validate(rt, storage_form, cur, rt.gv, known=cur)
        smd = storage_form["metadata"]
        if rt.generation and "generation" in cur["metadata"]:
            if self.spec_changed(rt, cur, storage_form):
                smd["generation"] = cur["metadata"]["generation"] + 1
        if not apply_done:
            if managers is None:
                mf = mf_in if isinstance(mf_in, list) else cur["metadata"].get("managedFields")
                if isinstance(mf_in, list) and not mf_in:
                    mf = []
                try:
                    managers = kssa.Managers(mf or [])
                except ValueError:
                    managers = kssa.Managers()
            new_out = self.out(rt, storage_form)
            kssa.update(managers, self.strip_mf(cur_out), self.strip_mf(new_out), rt.ssa_schema,
                        manager, sub, rt.gv, now_str(), self.ignored_for(rt, sub))
        mfl = managers.encode()
        if mfl:
            smd["managedFields"] = mfl
        else:
            smd.pop("managedFields", None)
        smd["resourceVersion"] = cur["metadata"]["resourceVersion"]
        if kssa.same(storage_form, cur):
            return self.out(rt, cur)
        if dry:
            return self.out(rt, storage_form)
        key = self.key_of(rt.storage, cur)
        if smd.get("deletionTimestamp") and not smd.get("finalizers"):
            res = self.store.commit(rt.storage, key, None)
            self.after_delete(rt, cur, "Background")
            return self.out(rt, res)
        res = self.store.commit(rt.storage, key, storage_form)
        self.after_write(rt, res, cur)
        return self.out(rt, res)

    @staticmethod
    def strip_mf(o):
        if "managedFields" in (o.get("metadata") or {}):
            o = dict(o)
            o["metadata"] = {k: v for k, v in o["metadata"].items() if k != "managedFields"}
        return o

    def spec_changed(self, rt, old, new):
        skip = {"metadata", "status"} if rt.status else {"metadata"}
        a = {k: v for k, v in old.items() if k not in skip}
        b = {k: v for k, v in new.items() if k not in skip}
        return not kssa.same(a, b)

    # ------------------------------------------------------------------- patch
    def patch(self, rt, ns, name, sub, raw, content_type, params, headers=None):
        ct = (content_type or "").split(";")[0].strip()
        allowed = PATCH_TYPES_CR if rt.crd is not None else PATCH_TYPES_BUILTIN
        if ct not in allowed:
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media "
                           "types include: " + ", ".join(allowed))
        if ct == "application/apply-patch+yaml":
            return self.apply(rt, ns, name, sub, raw, params, headers)
        try:
            patch = json.loads(raw.decode("utf-8") if raw else "")
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request("error decoding patch: %s" % json_error_text(raw, e))
        manager = self.manager_name(params, headers)
        dry = "All" in params.get("dryRun", [])
        validation = self.field_validation(params)
        with self.store.lock:
            key = self.key(rt, ns, name)
            cur = self.store.get(rt.storage, key)
            if cur is None:
                raise not_found(rt, name)
            cur_out = self.out(rt, cur)
            try:
                if ct == "application/json-patch+json":
                    new = json_patch(cur_out, patch)
                elif ct == "application/merge-patch+json":
                    if not isinstance(patch, dict):
                        raise bad_request("the body of the merge patch must be a JSON object")
                    new = merge_patch(cur_out, patch)
                else:
                    if not isinstance(patch, dict):
                        raise bad_request("the body of the strategic merge patch must be a "
                                          "JSON object")
                    new = strategic_patch(cur_out, patch, rt.ssa_schema)
            except PatchError as e:
                raise ApiError(422, "Invalid", str(e), {"causes": [
                    {"reason": "FieldValueInvalid", "message": str(e)}]})
            if not isinstance(new, dict):
                raise bad_request("the patched object is not a JSON object")
            pmd = patch.get("metadata") if isinstance(patch, dict) else None
            if isinstance(pmd, dict) and pmd.get("resourceVersion") and \
                    pmd["resourceVersion"] != cur["metadata"]["resourceVersion"]:
                raise conflict(rt, name, "the object has been modified; please apply your "
                                         "changes to the latest version and try again")
            if isinstance(pmd, dict) and pmd.get("uid") and pmd["uid"] != cur["metadata"]["uid"]:
                raise ApiError(409, "Conflict", "Precondition failed: UID in precondition: %s, "
                               "UID in object meta: %s" % (cur["metadata"]["uid"], pmd["uid"]),
                               _details(rt, name))
            self.check_gvk(rt, new)
            new, warnings = self.strict_fields(rt, new, validation)
            if (new.get("metadata") or {}).get("name") != name:
                raise ApiError(422, "Invalid", "metadata.name: Invalid value: field is immutable")
            mf_in = (patch.get("metadata") or {}).get("managedFields") if isinstance(patch, dict) \
                and isinstance(patch.get("metadata"), dict) else None
            res = self.finish_update(rt, cur, new, sub, manager, mf_in, None, dry)
        return res, warnings, 200

    def apply(self, rt, ns, name, sub, raw, params, headers):
        manager = (params.get("fieldManager") or [""])[0]
        if not manager:
            raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: '
                           'Required value: is required for apply patch',
                           {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [
                               {"reason": "FieldValueRequired",
                                "message": "Required value: is required for apply patch",
                                "field": "fieldManager"}]})
        force = (params.get("force") or ["false"])[0] in ("true", "1", "True")
        dry = "All" in params.get("dryRun", [])
        config = self.parse_body(raw, rt, "application/apply-patch+yaml")
        if not isinstance(config, dict):
            raise bad_request("error decoding YAML: the apply configuration must be an object")
        self.check_gvk(rt, config)
        if not config.get("apiVersion") or not config.get("kind"):
            raise bad_request("apiVersion and kind must be set in an apply configuration: "
                              "Object 'Kind' is missing in '%s'" % json.dumps(config)[:200])
        cmd = config.get("metadata") or {}
        if cmd.get("managedFields") is not None:
            raise bad_request("metadata.managedFields must be nil")
        if cmd.get("name") and cmd["name"] != name:
            raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                              % (cmd["name"], name))
        if rt.namespaced and cmd.get("namespace") and cmd["namespace"] != ns:
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        validation = self.field_validation(params)
        config, warnings = self.strict_fields(rt, config, validation, apply=True)
        config.setdefault("metadata", {})
        with self.store.lock:
            key = self.key(rt, ns, name)
            cur = self.store.get(rt.storage, key)
            now = now_str()
            if cur is None:
                if sub:
                    raise not_found(rt, name)
                managers = kssa.Managers()
                empty = self.empty_object(rt)
                try:
                    merged = kssa.apply(managers, empty, config, rt.ssa_schema, manager, "",
                                        rt.gv, now, force, self.ignored_for(rt, ""))
                except kssa.ApplyConflict as e:
                    raise self.conflict_error(e)
                merged["apiVersion"] = rt.gv
                merged["kind"] = rt.kind
                mmd = merged.setdefault("metadata", {})
                mmd["name"] = name
                if rt.namespaced:
                    mmd["namespace"] = ns
                stored = self.prepare_create(rt, merged, ns, rt.gv, manager, False,
                                             managers=managers, apply_done=True)
                if dry:
                    return self.out(rt, stored), warnings, 201
                res = self.store.commit(rt.storage, key, stored)
                self.after_write(rt, res, None)
                return self.out(rt, res), warnings, 201
            cur_out = self.strip_mf(self.out(rt, cur))
            try:
                managers = kssa.Managers(cur["metadata"].get("managedFields") or [])
            except ValueError:
                managers = kssa.Managers()
            cfg = config
            if rt.status:
                if sub == "status":
                    cfg = {k: v for k, v in config.items() if k in ("apiVersion", "kind", "metadata",
                                                                   "status")}
                    cfg["metadata"] = {k: v for k, v in cfg["metadata"].items()
                                       if k in ("name", "namespace")}
                else:
                    cfg = {k: v for k, v in config.items() if k != "status"}
            try:
                merged = kssa.apply(managers, cur_out, cfg, rt.ssa_schema, manager, sub,
                                    rt.gv, now, force, self.ignored_for(rt, sub))
            except kssa.ApplyConflict as e:
                raise self.conflict_error(e)
            res = self.finish_update(rt, cur, merged, sub, manager, None, managers, dry,
                                     apply_done=True)
        return res, warnings, 200

    def conflict_error(self, e):
        causes = [{"reason": "FieldManagerConflict",
                   "message": "conflict with %s" % kssa.manager_label(k),
                   "field": kssa.path_string(p)} for k, p in e.conflicts]
        return ApiError(409, "Conflict", kssa.conflict_message(e.conflicts), {"causes": causes})

    # ------------------------------------------------------------------ delete
    def delete(self, rt, ns, name, opts, params):
        pol = opts.get("propagationPolicy") or (params.get("propagationPolicy") or [None])[0]
        if opts.get("orphanDependents") is True and not pol:
            pol = "Orphan"
        if pol not in (None, "", "Background", "Foreground", "Orphan"):
            raise ApiError(422, "Invalid", 'DeleteOptions.meta.k8s.io "" is invalid: '
                           'propagationPolicy: Unsupported value: "%s": supported values: '
                           '"Foreground", "Background", "Orphan", "nil"' % pol)
        dry = "All" in (opts.get("dryRun") or []) or "All" in params.get("dryRun", [])
        pre = opts.get("preconditions") or {}
        with self.store.lock:
            key = self.key(rt, ns, name)
            cur = self.store.get(rt.storage, key)
            if cur is None:
                raise not_found(rt, name)
            cmd = cur["metadata"]
            if pre.get("uid") and pre["uid"] != cmd.get("uid"):
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the UID '
                               'in the precondition (%s) does not match the UID in record (%s). '
                               'The object might have been deleted and then recreated'
                               % (rt.group_kind, name, pre["uid"], cmd.get("uid")),
                               _details(rt, name, rt.kind))
            if pre.get("resourceVersion") and pre["resourceVersion"] != cmd.get("resourceVersion"):
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the '
                               'ResourceVersion in the precondition (%s) does not match the '
                               'ResourceVersion in record (%s). The object might have been '
                               'modified' % (rt.group_kind, name, pre["resourceVersion"],
                                             cmd.get("resourceVersion")),
                               _details(rt, name, rt.kind))
            if dry:
                return self.out(rt, cur), 200
            fins = list(cmd.get("finalizers") or [])
            if pol == "Foreground" and "foregroundDeletion" not in fins:
                fins.append("foregroundDeletion")
            if pol == "Orphan" and "orphan" not in fins:
                fins.append("orphan")
            if rt.plural == "namespaces":
                return self.delete_namespace(rt, cur), 200
            if rt.plural == "customresourcedefinitions":
                self.delete_crd_instances(cur)
            if fins:
                new = copy_obj(cur)
                md = new["metadata"]
                md["finalizers"] = fins
                if not md.get("deletionTimestamp"):
                    md["deletionTimestamp"] = now_str()
                    md["deletionGracePeriodSeconds"] = 0
                    if "generation" in md:
                        md["generation"] += 1
                if kssa.same(new, cur):
                    return self.out(rt, cur), 200
                res = self.store.commit(rt.storage, key, new)
                self.gc_queue.put(("finalize", rt.storage, key))
                return self.out(rt, res), 200
            res = self.store.commit(rt.storage, key, None)
            self.after_delete(rt, cur, pol or "Background")
        st = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
              "details": dict(_details(rt, name), uid=cmd.get("uid"))}
        if rt.plural == "pods":
            return self.out(rt, res), 200
        return st, 200

    def delete_namespace(self, rt, cur):
        new = copy_obj(cur)
        md = new["metadata"]
        if md.get("deletionTimestamp"):
            return self.out(rt, cur)
        md["deletionTimestamp"] = now_str()
        md["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        res = self.store.commit(rt.storage, md["name"], new)
        self.gc_queue.put(("namespace", md["name"]))
        return self.out(rt, res)

    def delete_crd_instances(self, crd):
        spec = crd.get("spec") or {}
        storage = "%s/%s" % (spec.get("group"), (spec.get("names") or {}).get("plural"))
        for key in list(self.store.objs.get(storage, {}).keys()):
            cur = self.store.get(storage, key)
            self.store.commit(storage, key, None)
            self.queue_dependents(cur, "Background")

    def after_write(self, rt, obj, old):
        """Side effects of a write (lock held)."""
        if rt.plural == "customresourcedefinitions":
            self.crd_changed(rt, obj, old)
        md = obj["metadata"]
        if md.get("ownerReferences"):
            self.gc_queue.put(("check", rt.storage, self.key_of(rt.storage, obj)))
        if md.get("deletionTimestamp"):
            self.gc_queue.put(("finalize", rt.storage, self.key_of(rt.storage, obj)))

    def after_delete(self, rt, obj, policy):
        if rt.plural == "customresourcedefinitions":
            self.unregister_crd(obj)
        self.queue_dependents(obj, policy)

    def queue_dependents(self, obj, policy):
        uid = obj["metadata"].get("uid")
        if uid and uid in self.store.dependents:
            self.gc_queue.put(("owner-gone", uid, policy))

    def crd_changed(self, rt, crd, old):
        """Register (or re-register) the served types and mark the CRD
        Established, as the apiextensions controllers do."""
        if old is not None:
            self.unregister_crd(old)
        if crd["metadata"].get("deletionTimestamp"):
            return
        for t in ktypes.custom_type(crd):
            self.register(t)
        st = crd.get("status") or {}
        conds = st.get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds) \
                and st.get("acceptedNames", {}).get("plural") == crd["spec"]["names"]["plural"]:
            return
        new = copy_obj(crd)
        names = crd["spec"]["names"]
        t = now_str()
        accepted = {"plural": names["plural"], "singular": names.get("singular", names["kind"].lower())}
        if names.get("shortNames"):
            accepted["shortNames"] = names["shortNames"]
        accepted["kind"] = names["kind"]
        accepted["listKind"] = names.get("listKind") or names["kind"] + "List"
        if names.get("categories"):
            accepted["categories"] = names["categories"]
        new["status"] = {
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "lastTransitionTime": t,
                 "reason": "NoConflicts", "message": "no conflicts found"},
                {"type": "Established", "status": "True", "lastTransitionTime": t,
                 "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}],
            "acceptedNames": accepted,
            "storedVersions": sorted(set((st.get("storedVersions") or []) + [
                v["name"] for v in crd["spec"].get("versions") or [] if v.get("storage")])),
        }
        try:
            managers = kssa.Managers(crd["metadata"].get("managedFields") or [])
        except ValueError:
            managers = kssa.Managers()
        kssa.update(managers, crd, new, rt.ssa_schema, "kube-apiserver", "status", rt.gv, t,
                    self.ignored_for(rt, "status"))
        new["metadata"]["managedFields"] = managers.encode()
        self.store.commit(rt.storage, crd["metadata"]["name"], new)

    # ---------------------------------------------------------- collection
    def delete_collection(self, rt, ns, params, opts):
        lsel, fsel = self.selectors(rt, params)
        deleted = []
        with self.store.lock:
            prefix = ns + "/" if (rt.namespaced and ns) else ""
            for key in list(self.store.range(rt.storage, prefix)):
                obj = self.store.get(rt.storage, key)
                if obj is None or not self.matches(rt, obj, lsel, fsel):
                    continue
                md = obj["metadata"]
                try:
                    res, _ = self.delete(rt, md.get("namespace", ""), md["name"], opts, params)
                except ApiError:
                    continue
                deleted.append(self.out(rt, obj) if res.get("kind") == "Status" else res)
            rv = self.store.rv
        return {"kind": rt.list_kind, "apiVersion": rt.gv,
                "metadata": {"resourceVersion": str(rv)}, "items": deleted}

    # ------------------------------------------------------------ garbage
    def gc_loop(self):
        while True:
            task = self.gc_queue.get()
            try:
                with self.store.lock:
                    self.gc_task(task)
            except Exception:  # noqa: BLE001 - the collector must keep running
                traceback.print_exc()

    def gc_task(self, task):
        kind = task[0]
        if kind == "owner-gone":
            uid, policy = task[1], task[2]
            for storage, key in list(self.store.dependents.get(uid, ())):
                obj = self.store.get(storage, key)
                if obj is None:
                    continue
                if policy == "Orphan":
                    self.drop_owner_refs(storage, key, obj, {uid})
                else:
                    self.collect(storage, key, obj)
        elif kind == "check":
            storage, key = task[1], task[2]
            obj = self.store.get(storage, key)
            if obj is not None and obj["metadata"].get("ownerReferences"):
                self.collect(storage, key, obj)
        elif kind == "finalize":
            storage, key = task[1], task[2]
            obj = self.store.get(storage, key)
            if obj is None or not obj["metadata"].get("deletionTimestamp"):
                return
            fins = obj["metadata"].get("finalizers") or []
            uid = obj["metadata"].get("uid")
            if "orphan" in fins:
                for s, k in list(self.store.dependents.get(uid, ())):
                    d = self.store.get(s, k)
                    if d is not None:
                        self.drop_owner_refs(s, k, d, {uid})
                self.remove_finalizer(storage, key, obj, "orphan")
            elif "foregroundDeletion" in fins:
                deps = list(self.store.dependents.get(uid, ()))
                for s, k in deps:
                    d = self.store.get(s, k)
                    if d is not None and not d["metadata"].get("deletionTimestamp"):
                        self.gc_delete(s, k, d, "Foreground")
                if not self.store.dependents.get(uid):
                    self.remove_finalizer(storage, key, obj, "foregroundDeletion")
                else:
                    threading.Timer(0.05, self.gc_queue.put, (task,)).start()
        elif kind == "namespace":
            ns = task[1]
            remaining = 0
            for storage in list(self.store.objs.keys()):
                if storage == "core/namespaces":
                    continue
                for key in list(self.store.range(storage, ns + "/")):
                    obj = self.store.get(storage, key)
                    if obj is None:
                        continue
                    remaining += 1
                    if not obj["metadata"].get("deletionTimestamp"):
                        self.gc_delete(storage, key, obj, "Background")
            nsobj = self.store.get("core/namespaces", ns)
            if nsobj is None:
                return
            left = sum(1 for s in self.store.objs if s != "core/namespaces"
                       for _ in self.store.range(s, ns + "/"))
            if left:
                threading.Timer(0.05, self.gc_queue.put, (task,)).start()
                return
            self.store.commit("core/namespaces", ns, None)
            self.queue_dependents(nsobj, "Background")

    def collect(self, storage, key, obj):
        """Delete obj when none of its owners exists any more; drop the
        references to owners that are gone."""
        refs = obj["metadata"].get("ownerReferences") or []
        alive, dangling = [], set()
        for r in refs:
            loc = self.store.uids.get(r.get("uid"))
            owner = self.store.get(*loc) if loc else None
            if owner is not None and owner.get("kind") == r.get("kind") and \
                    owner["metadata"].get("name") == r.get("name"):
                alive.append(r)
            else:
                dangling.add(r.get("uid"))
        if not dangling:
            return
        if not alive:
            if not obj["metadata"].get("deletionTimestamp"):
                self.gc_delete(storage, key, obj, "Background")
            return
        self.drop_owner_refs(storage, key, obj, dangling)

    def gc_delete(self, storage, key, obj, policy):
        rt = self.storage_type(storage)
        fins = list(obj["metadata"].get("finalizers") or [])
        if policy == "Foreground" and "foregroundDeletion" not in fins and \
                self.store.dependents.get(obj["metadata"].get("uid")):
            fins.append("foregroundDeletion")
        if fins:
            new = copy_obj(obj)
            new["metadata"]["finalizers"] = fins
            new["metadata"].setdefault("deletionTimestamp", now_str())
            new["metadata"].setdefault("deletionGracePeriodSeconds", 0)
            self.store.commit(storage, key, new)
            self.gc_queue.put(("finalize", storage, key))
            return
        self.store.commit(storage, key, None)
        if rt is not None:
            self.after_delete(rt, obj, "Background")

    def drop_owner_refs(self, storage, key, obj, uids):
        new = copy_obj(obj)
        refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") not in uids]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        rt = self.storage_type(storage)
        if rt is not None:
            try:
                managers = kssa.Managers(obj["metadata"].get("managedFields") or [])
                kssa.update(managers, self.strip_mf(obj), self.strip_mf(new), rt.ssa_schema,
                            "kube-controller-manager", "", rt.gv, now_str())
                mf = managers.encode()
                if mf:
                    new["metadata"]["managedFields"] = mf
                else:
                    new["metadata"].pop("managedFields", None)
            except ValueError:
                pass
        self.store.commit(storage, key, new)

    def remove_finalizer(self, storage, key, obj, fin):
        fins = [f for f in obj["metadata"].get("finalizers") or [] if f != fin]
        if fins:
            new = copy_obj(obj)
            new["metadata"]["finalizers"] = fins
            self.store.commit(storage, key, new)
            return
        self.store.commit(storage, key, None)
        rt = self.storage_type(storage)
        if rt is not None:
            self.after_delete(rt, obj, "Background")

    # ------------------------------------------------------------ reading
    def selectors(self, rt, params):
        try:
            lsel = ksel.parse_labels((params.get("labelSelector") or [""])[0])
        except ksel.SelectorError as e:
            raise bad_request(str(e))
        try:
            fsel = ksel.parse_fields((params.get("fieldSelector") or [""])[0])
        except ksel.SelectorError as e:
            raise bad_request(str(e))
        allowed = set(["metadata.name", "metadata.namespace"]) | set(rt.fields)
        for f, _op, _v in fsel:
            if f not in allowed:
                raise bad_request('field label not supported: %s' % f)
        return lsel, fsel

    def matches(self, rt, obj, lsel, fsel):
        if lsel and not ksel.match_labels(lsel, obj["metadata"].get("labels")):
            return False
        if fsel and not ksel.match_fields(fsel, rt.field_values(obj)):
            return False
        return True

    def get(self, rt, ns, name):
        obj = self.store.get(rt.storage, self.key(rt, ns, name))
        if obj is None:
            raise not_found(rt, name)
        return self.out(rt, obj)

    def list(self, rt, ns, params):
        lsel, fsel = self.selectors(rt, params)
        try:
            limit = int((params.get("limit") or ["0"])[0] or 0)
        except ValueError:
            raise bad_request("limit: Invalid value: must be an integer")
        cont = (params.get("continue") or [""])[0]
        rvp = (params.get("resourceVersion") or [""])[0]
        prefix = ns + "/" if (rt.namespaced and ns) else ""
        start = None
        list_rv = None
        if cont:
            try:
                pad = "=" * (-len(cont) % 4)
                tok = json.loads(base64.urlsafe_b64decode(cont + pad))
                if tok.get("v") != "meta.k8s.io/v1" or not isinstance(tok.get("start"), str):
                    raise ValueError("bad version")
                start = prefix + tok["start"]
                list_rv = int(tok.get("rv"))
            except (ValueError, TypeError, KeyError, json.JSONDecodeError) as e:
                raise bad_request("continue key is not valid: %s" % e)
            if list_rv < self.store.oldest(rt.storage) - 1 and list_rv < self.store.start_rv:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to "
                               "display a consistent list result. You can start a new list "
                               "without the continue parameter.")
        items = []
        remaining = 0
        next_key = None
        with self.store.lock:
            cur_rv = self.store.rv
            if rvp and rvp != "0" and not cont:
                try:
                    want = int(rvp)
                except ValueError:
                    raise bad_request("resourceVersion: Invalid value: %s: must be an integer" % rvp)
                if want > cur_rv:
                    raise ApiError(504, "Timeout", "Too large resource version: %d, current: %d"
                                   % (want, cur_rv),
                                   {"causes": [{"reason": "ResourceVersionTooLarge",
                                                "message": "Too large resource version"}],
                                    "retryAfterSeconds": 1})
            objs = self.store.objs[rt.storage]
            for key in self.store.range(rt.storage, prefix, start):
                obj = objs[key]
                if not self.matches(rt, obj, lsel, fsel):
                    continue
                if limit > 0 and len(items) >= limit:
                    remaining += 1
                    continue
                items.append(obj)
                next_key = key
            if limit <= 0 or remaining == 0:
                next_key = None
        meta = {}
        if rt.crd is not None:
            meta["continue"] = ""
        rv_out = list_rv if list_rv is not None else cur_rv
        if next_key is not None:
            tok = {"v": "meta.k8s.io/v1", "rv": rv_out, "start": next_key[len(prefix):] + "\u0000"}
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps(tok, separators=(",", ":")).encode()).decode().rstrip("=")
            if not lsel and not fsel:
                meta["remainingItemCount"] = remaining
        meta["resourceVersion"] = str(rv_out)
        return [self.out(rt, o) for o in items], meta

    def list_obj(self, rt, items, meta):
        if rt.crd is not None:
            return {"apiVersion": rt.gv, "items": items, "kind": rt.list_kind, "metadata": meta}
        return {"kind": rt.list_kind, "apiVersion": rt.gv, "metadata": meta, "items": items}

    def table(self, rt, objs, meta, include):
        rows = []
        for o in objs:
            row = {"cells": ktypes.table_cells(rt, o)}
            if include == "Object":
                row["object"] = o
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                 "metadata": order_meta(o.get("metadata") or {})}
            rows.append(row)
        tmeta = {"resourceVersion": meta.get("resourceVersion", "")}
        if meta.get("continue"):
            tmeta["continue"] = meta["continue"]
        if "remainingItemCount" in meta:
            tmeta["remainingItemCount"] = meta["remainingItemCount"]
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": tmeta,
                "columnDefinitions": ktypes.table_columns(rt), "rows": rows}

    # ------------------------------------------------------------- watch
    def start_watch(self, rt, ns, params, name=None):
        """Register a watcher; returns (watcher, initial events or an error
        Status to send, bookmark flag)."""
        lsel, fsel = self.selectors(rt, params)
        if name:
            fsel = fsel + [("metadata.name", "=", name)]
        rvp = (params.get("resourceVersion") or [""])[0]
        initial_flag = (params.get("sendInitialEvents") or [""])[0] == "true"
        prefix = ns + "/" if (rt.namespaced and ns) else ""

        def match(obj):
            md = obj["metadata"]
            if prefix and md.get("namespace") != ns:
                return False
            return self.matches(rt, obj, lsel, fsel)

        index = None
        for f, op, v in fsel:
            if f == "metadata.name" and op == "=":
                index = ("name", v)
        if index is None:
            for k, op, vals in lsel:
                if op == "=" or (op == "in" and len(vals) == 1):
                    index = ("label", k, vals[0])
                    break
        w = kstore.Watcher(rt.storage, match, index)
        initial = []
        error = None
        with self.store.lock:
            if rvp in ("", "0") or initial_flag:
                objs = self.store.objs[rt.storage]
                for key in self.store.range(rt.storage, prefix):
                    o = objs[key]
                    if match(o):
                        initial.append(("ADDED", o, None))
            else:
                try:
                    since = int(rvp)
                except ValueError:
                    raise bad_request("resourceVersion: Invalid value: %s: must be an integer" % rvp)
                evs = self.store.replay(rt.storage, since)
                if since > self.store.rv:
                    error = status_obj(504, "Timeout", "Too large resource version: %d, current: %d"
                                       % (since, self.store.rv),
                                       {"causes": [{"reason": "ResourceVersionTooLarge",
                                                    "message": "Too large resource version"}],
                                        "retryAfterSeconds": 1})
                elif evs is None:
                    error = status_obj(410, "Expired", "too old resource version: %d (%d)"
                                       % (since, self.store.oldest(rt.storage)))
                else:
                    for ev in evs:
                        w.offer(ev)
            if error is None:
                self.store.watchers[rt.storage].add(w)
        if initial_flag and error is None:
            initial.append(("BOOKMARK-INITIAL", None, None))
        return w, initial, error

    def stop_watch(self, w):
        with self.store.lock:
            self.store.watchers[w.storage].discard(w)

    def close_watches(self):
        with self.store.lock:
            for ws in self.store.watchers.values():
                for w in ws:
                    w.close()


def order_meta(md):
    order = ["name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
             "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
             "labels", "annotations", "ownerReferences", "finalizers", "managedFields"]
    out = {k: md[k] for k in order if k in md}
    for k, v in md.items():
        if k not in out:
            out[k] = v
    return out


def order_builtin(obj):
    out = {}
    for k in ("kind", "apiVersion"):
        if k in obj:
            out[k] = obj[k]
    if "metadata" in obj:
        out["metadata"] = order_meta(obj["metadata"])
    for k, v in obj.items():
        if k not in out:
            out[k] = v
    return out


def validate_crd(crd):
    FE = kschema.FieldError
    errs = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group") or ""
    if not group:
        errs.append(FE("required", "spec.group"))
    elif "." not in group:
        errs.append(FE("invalid", "spec.group", group, "should be a domain with at least one dot"))
    if not names.get("plural"):
        errs.append(FE("required", "spec.names.plural"))
    elif not kschema.DNS1123_LABEL.match(names["plural"]):
        errs.append(FE("invalid", "spec.names.plural", names["plural"], kschema.LABEL_MSG))
    if not names.get("kind"):
        errs.append(FE("required", "spec.names.kind"))
    errs += kschema.check_enum(spec.get("scope"), ("Cluster", "Namespaced"), "spec.scope")
    name = (crd.get("metadata") or {}).get("name", "")
    if names.get("plural") and group and name != "%s.%s" % (names["plural"], group):
        errs.append(FE("invalid", "metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    versions = spec.get("versions") or []
    if not versions:
        errs.append(FE("invalid", "spec.versions", versions, "must have exactly one version marked as storage version"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        errs.append(FE("invalid", "spec.versions", versions,
                       "must have exactly one version marked as storage version"))
    for i, v in enumerate(versions):
        sch = (v.get("schema") or {}).get("openAPIV3Schema")
        if sch is None:
            errs.append(FE("required", "spec.versions[%d].schema.openAPIV3Schema" % i, kschema.OMIT,
                           "schemas are required"))
    return errs


# ============================================================== patch helpers

class PatchError(Exception):
    pass


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy_obj(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError("invalid JSON pointer %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts):
    cur = doc
    for p in parts:
        if isinstance(cur, dict):
            if p not in cur:
                raise PatchError("jsonpatch: path not found: %s" % p)
            cur = cur[p]
        elif isinstance(cur, list):
            try:
                cur = cur[int(p)]
            except (ValueError, IndexError):
                raise PatchError("jsonpatch: index out of range: %s" % p)
        else:
            raise PatchError("jsonpatch: cannot traverse %s" % p)
    return cur


def json_patch(doc, ops):
    if not isinstance(ops, list):
        raise PatchError("json patch must be a list of operations")
    doc = copy_obj(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError("json patch operations must be objects with an op")
        o = op["op"]
        parts = _pointer(op.get("path", ""))
        if o == "test":
            got = _walk(doc, parts)
            if not kssa.same(got, op.get("value")):
                raise PatchError("testing value %s failed: test failed" % op.get("path"))
            continue
        if o in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            val = copy_obj(_walk(doc, src))
            if o == "move":
                doc = _json_remove(doc, src)
            doc = _json_add(doc, parts, val)
            continue
        if o == "add":
            doc = _json_add(doc, parts, copy_obj(op.get("value")))
        elif o == "remove":
            doc = _json_remove(doc, parts)
        elif o == "replace":
            _walk(doc, parts)
            doc = _json_remove(doc, parts)
            doc = _json_add(doc, parts, copy_obj(op.get("value")))
        else:
            raise PatchError("Unexpected kind: %s" % o)
    return doc


def _json_add(doc, parts, val):
    if not parts:
        return val
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = val
    elif isinstance(parent, list):
        if last == "-":
            parent.append(val)
        else:
            try:
                i = int(last)
            except ValueError:
                raise PatchError("jsonpatch: invalid index %s" % last)
            if i < 0 or i > len(parent):
                raise PatchError("jsonpatch: add operation does not apply: index out of range")
            parent.insert(i, val)
    else:
        raise PatchError("jsonpatch: cannot add to a scalar")
    return doc


def _json_remove(doc, parts):
    if not parts:
        raise PatchError("jsonpatch: cannot remove the root")
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError("jsonpatch remove operation does not apply: doc is missing key: %s"
                             % "/".join([""] + parts))
        del parent[last]
    elif isinstance(parent, list):
        try:
            del parent[int(last)]
        except (ValueError, IndexError):
            raise PatchError("jsonpatch remove operation does not apply: doc is missing path: %s"
                             % "/".join([""] + parts))
    return doc


def strategic_patch(target, patch, sch):
    """Strategic merge patch: a merge patch whose map-type lists merge by key,
    with the $patch: delete/replace directives."""
    if not isinstance(patch, dict):
        return copy_obj(patch)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        csch = kssa.child_schema(sch, k)[0]
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and isinstance(out.get(k), list) and kssa.list_type(csch) == "map":
            keys = csch.get("x-kubernetes-list-map-keys") or []
            merged = list(out[k])
            for item in v:
                if not isinstance(item, dict):
                    continue
                kv = [item.get(x) for x in keys]
                idx = next((i for i, e in enumerate(merged)
                            if isinstance(e, dict) and [e.get(x) for x in keys] == kv), None)
                if item.get("$patch") == "delete":
                    if idx is not None:
                        merged.pop(idx)
                    continue
                if idx is None:
                    merged.append({a: b for a, b in item.items() if not a.startswith("$")})
                else:
                    merged[idx] = strategic_patch(merged[idx], item, kssa.items_schema(csch))
            out[k] = merged
        elif isinstance(v, list) and isinstance(out.get(k), list) and kssa.list_type(csch) == "set":
            out[k] = out[k] + [x for x in v if x not in out[k]]
        elif isinstance(v, dict):
            out[k] = strategic_patch(out.get(k), v, csch)
        else:
            out[k] = copy_obj(v)
    return out


# ================================================================== HTTP layer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gkm-test-apiserver"
    sys_version = ""
    api = None  # Server, set on the class by main()

    def log_message(self, fmt, *args):  # noqa: D401 - quiet by default
        if self.api.args.verbose:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    # -- plumbing
    def send_json(self, code, obj, extra_headers=(), text=None):
        body = (text if text is not None else json.dumps(obj, separators=(",", ":"),
                                                          ensure_ascii=False)).encode("utf-8")
        fault = self.take_fault("response")
        if fault == "malformed":
            body = body[: max(1, len(body) // 2)] + b"}{"
        elif fault == "truncate":
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for h, v in extra_headers:
            self.send_header(h, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error_status(self, e):
        self.send_json(e.code, e.status(), e.headers)

    def read_body(self):
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            chunks = []
            total = 0
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > MAX_BODY:
                    raise ApiError(413, "RequestEntityTooLarge",
                                   "the server has received too large a request body")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(3)
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            if n <= 4 * MAX_BODY:
                while n > 0:    # drain it so that the client reads the answer
                    n -= len(self.rfile.read(min(n, 65536)) or b"x" * n)
            raise ApiError(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
        return self.rfile.read(n) if n > 0 else b""

    def take_fault(self, stage):
        api = self.api
        if not api.faults:
            return None
        with api.fault_lock:
            for f in api.faults:
                if f["stage"] != stage:
                    continue
                if f.get("method") and f["method"] != self.command:
                    continue
                if f.get("path") and f["path"] not in self.path:
                    continue
                f["count"] -= 1
                if f["count"] <= 0:
                    api.faults.remove(f)
                return f["action"]
        return None

    def authenticated(self):
        api = self.api
        tok = api.token
        if api.args.token_file:
            try:
                with open(api.args.token_file) as fh:
                    tok = fh.read().strip()
            except OSError:
                tok = None
        if not tok:
            if not api.args.client_ca:
                return True
        auth = self.headers.get("Authorization", "")
        if tok and auth == "Bearer " + tok:
            return True
        if api.args.client_ca and isinstance(self.connection, ssl.SSLSocket):
            try:
                if self.connection.getpeercert():
                    return True
            except (ValueError, ssl.SSLError):
                pass
        return False

    # -- verbs
    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_PATCH(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def do_HEAD(self):
        self.dispatch()

    record = False
    status_sent = 0

    def send_response(self, code, message=None):
        self.status_sent = code
        super().send_response(code, message)

    def dispatch(self):
        api = self.api
        api.request_count += 1
        self.status_sent = 0
        try:
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            params = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            body = b""
            if self.command in ("POST", "PUT", "PATCH", "DELETE"):
                body = self.read_body()
            if path not in ("/version", "/healthz", "/livez", "/readyz") and not self.authenticated():
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if path.startswith("/_test/"):
                if not api.args.test_control:
                    raise not_found_path(path)
                return self.test_control(path, body)
            self.record = api.args.test_control
            fault = self.take_fault("request")
            if fault:
                if fault.startswith("status:"):
                    code = int(fault.split(":")[1])
                    raise ApiError(code, {500: "InternalError", 503: "ServiceUnavailable",
                                          429: "TooManyRequests", 403: "Forbidden",
                                          404: "NotFound"}.get(code, "InternalError"),
                                   "injected failure", headers=[("Retry-After", "1")]
                                   if code in (429, 503) else [])
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault.startswith("delay:"):
                    time.sleep(int(fault.split(":")[1]) / 1000.0)
            self.route(path, params, body)
        except ApiError as e:
            self.send_error_status(e)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - answer 500 rather than die
            traceback.print_exc()
            try:
                self.send_error_status(ApiError(500, "InternalError",
                                                "Internal error occurred: %s" % e))
            except OSError:
                self.close_connection = True
        finally:
            if self.record:
                self.record = False
                api.log_request(self)

    def route(self, path, params, body):
        api = self.api
        segs = [s for s in path.split("/") if s]
        m = self.command
        if path == "/version" or path == "/version/":
            return self.send_json(200, VERSION_INFO)
        if path in ("/healthz", "/livez", "/readyz"):
            return self.send_plain(200, "ok")
        if path == "/api":
            return self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                        "serverAddressByClientCIDRs": [
                                            {"clientCIDR": "0.0.0.0/0",
                                             "serverAddress": "127.0.0.1:%d" % api.port}]})
        if path == "/apis":
            return self.send_json(200, self.group_list())
        if segs and segs[0] == "openapi":
            return self.openapi(segs, params)
        if not segs or segs[0] not in ("api", "apis"):
            raise not_found_path(path)
        if segs[0] == "api":
            if len(segs) == 1:
                raise not_found_path(path)
            group, version, rest = "", segs[1], segs[2:]
        else:
            if len(segs) == 2:
                return self.send_json(200, self.group_doc(segs[1]))
            group, version, rest = segs[1], segs[2], segs[3:]
        if not rest:
            if m != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                               "on the requested resource")
            return self.send_json(200, self.resource_list(group, version, path))
        watch_prefix = False
        if rest[0] == "watch":
            watch_prefix = True
            rest = rest[1:]
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces" and not (
                group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")):
            ns = rest[1]
            rest = rest[2:]
        if not rest:
            raise not_found_path(path)
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if len(rest) > 3:
            raise not_found_path(path)
        rt = api.find_type(group, version, plural)
        if rt is None or (ns and not rt.namespaced):
            raise not_found_path(path)
        if sub and not (sub == "status" and rt.status):
            if not (rt.plural == "namespaces" and sub == "finalize"):
                raise not_found_path(path)
        if ns and rt.namespaced and not kschema.DNS1123_LABEL.match(ns):
            raise not_found_path(path)
        watch = watch_prefix or (params.get("watch") or [""])[0] in ("1", "true", "True")
        accept = self.headers.get("Accept", "")
        if m in ("GET", "HEAD"):
            if watch:
                return self.serve_watch(rt, ns, params, name)
            if name:
                obj = api.get(rt, ns, name)
                if wants_table(accept):
                    return self.send_json(200, api.table(rt, [obj], {
                        "resourceVersion": obj["metadata"].get("resourceVersion", "")},
                        (params.get("includeObject") or [""])[0]))
                if wants_partial(accept):
                    return self.send_json(200, {"kind": "PartialObjectMetadata",
                                                "apiVersion": "meta.k8s.io/v1",
                                                "metadata": obj["metadata"]})
                return self.send_json(200, None, text=api.encode(rt, obj))
            items, meta = api.list(rt, ns, params)
            if wants_table(accept):
                return self.send_json(200, api.table(rt, items, meta,
                                                     (params.get("includeObject") or [""])[0]))
            if wants_partial(accept):
                return self.send_json(200, {"kind": "PartialObjectMetadataList",
                                            "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                                            "items": [{"kind": "PartialObjectMetadata",
                                                       "apiVersion": "meta.k8s.io/v1",
                                                       "metadata": o["metadata"]} for o in items]})
            return self.send_json(200, None, text=api.encode(rt, api.list_obj(rt, items, meta)))
        if m == "POST":
            if name:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                               "on the requested resource")
            obj = api.parse_body(body, rt, self.headers.get("Content-Type"))
            res, warnings = api.run(lambda: api.create(rt, ns, obj, params, self.headers),
                                    *self.write_opts(params))
            warnings = warnings + api.local.warnings
            return self.send_json(201, None, self.warning_headers(warnings), text=api.encode(rt, res))
        if m == "PUT":
            if not name:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                               "on the requested resource")
            obj = api.parse_body(body, rt, self.headers.get("Content-Type"))
            res, warnings = api.run(lambda: api.update(rt, ns, name, sub, obj, params, self.headers),
                                    *self.write_opts(params))
            warnings = warnings + api.local.warnings
            return self.send_json(200, None, self.warning_headers(warnings), text=api.encode(rt, res))
        if m == "PATCH":
            if not name:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                               "on the requested resource")
            res, warnings, code = api.run(lambda: api.patch(rt, ns, name, sub, body,
                                                            self.headers.get("Content-Type"),
                                                            params, self.headers),
                                          *self.write_opts(params))
            warnings = warnings + api.local.warnings
            return self.send_json(code, None, self.warning_headers(warnings), text=api.encode(rt, res))
        if m == "DELETE":
            opts = {}
            if body.strip():
                try:
                    opts = json.loads(body)
                except ValueError as e:
                    raise bad_request("the body of the request was in an unknown format: %s"
                                      % json_error_text(body, e))
                if not isinstance(opts, dict):
                    raise bad_request("DeleteOptions must be an object")
            if not name:
                return self.send_json(200, None, text=api.encode(rt, api.delete_collection(
                    rt, ns, params, opts)))
            if sub:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                               "on the requested resource")
            res, code = api.delete(rt, ns, name, opts, params)
            return self.send_json(code, None, text=api.encode(rt, res) if res.get("kind") != "Status"
                                  else json.dumps(res, separators=(",", ":")))
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the "
                       "requested resource")

    def write_opts(self, params):
        return ((params.get("fieldManager") or [""])[0] or
                self.headers.get("User-Agent", "").split("/")[0],
                "All" in params.get("dryRun", []))

    def warning_headers(self, warnings):
        return [("Warning", '299 - %s' % json.dumps(w)) for w in warnings]

    def send_plain(self, code, text):
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # -- discovery
    def group_list(self):
        groups = []
        for g, versions in self.api.groups().items():
            if not g:
                continue
            vs = [{"groupVersion": "%s/%s" % (g, v), "version": v} for v in sort_versions(versions)]
            groups.append({"name": g, "versions": vs, "preferredVersion": vs[0]})
        order = ["apiextensions.k8s.io", "coordination.k8s.io", "events.k8s.io", "storage.k8s.io"]
        groups.sort(key=lambda x: (order.index(x["name"]) if x["name"] in order else 99, x["name"]))
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def group_doc(self, group):
        versions = self.api.groups().get(group)
        if not versions:
            raise not_found_path("/apis/" + group)
        vs = [{"groupVersion": "%s/%s" % (group, v), "version": v} for v in sort_versions(versions)]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": vs,
                "preferredVersion": vs[0]}

    def resource_list(self, group, version, path):
        rts = [rt for (g, v, _p), rt in sorted(self.api.types.items()) if g == group and v == version]
        if not rts:
            raise not_found_path(path)
        res = []
        for rt in rts:
            res.append(rt.resource_entry())
            if rt.status:
                res.append({"name": rt.plural + "/status", "singularName": "",
                            "namespaced": rt.namespaced, "kind": rt.kind,
                            "verbs": ["get", "patch", "update"]})
        out = {"kind": "APIResourceList", "groupVersion": "%s/%s" % (group, version) if group else version,
               "resources": res}
        if group:
            out = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": out["groupVersion"],
                   "resources": res}
        return out

    def openapi(self, segs, params):
        if len(segs) == 1 or segs[1] != "v3":
            raise not_found_path("/" + "/".join(segs))
        if len(segs) == 2:
            return self.send_json(200, self.api.openapi.root(), extra_headers=())
        rel = "/".join(segs[2:])
        doc = self.api.openapi.document(rel)
        if doc is None:
            raise not_found_path("/" + "/".join(segs))
        return self.send_json(200, doc, extra_headers=(("X-Varied-Accept", "application/json"),))

    # -- watch
    def serve_watch(self, rt, ns, params, name):
        api = self.api
        try:
            timeout = float((params.get("timeoutSeconds") or ["0"])[0] or 0)
        except ValueError:
            raise bad_request("timeoutSeconds: Invalid value: must be an integer")
        if timeout <= 0:
            timeout = api.args.watch_timeout
        bookmarks = (params.get("allowWatchBookmarks") or [""])[0] in ("true", "1")
        as_table = wants_table(self.headers.get("Accept", ""))
        w, initial, error = api.start_watch(rt, ns, params, name)
        self.send_response(200)
        if self.record:
            self.record = False
            api.log_request(self)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.close_connection = False
        fault = [self.take_fault("watch")]
        sent = [0]

        def emit(typ, obj):
            """Send one event; False once an injected fault cut the stream."""
            if fault[0] and sent[0] >= 1:
                if fault[0] == "truncate":
                    data = json.dumps({"type": typ, "object": api.out(rt, obj)}).encode()
                    self.wfile.write(b"%x\r\n%s" % (len(data), data[: len(data) // 2]))
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return False
                if fault[0] == "malformed":
                    self.write_raw(b'{"type":"MODIFIED","object":{"kind"\n')
                    fault[0] = None
            self.write_event(rt, typ, obj, as_table)
            sent[0] += 1
            return True
        try:
            if error is not None:
                self.write_chunk({"type": "ERROR", "object": error})
                self.end_chunks()
                return
            deadline = time.monotonic() + timeout
            interval = api.args.bookmark_interval
            next_bookmark = time.monotonic() + interval
            for typ, obj, _ev in initial:
                if typ == "BOOKMARK-INITIAL":
                    if bookmarks:
                        self.write_chunk(self.bookmark(rt, initial_end=True))
                    continue
                if not emit(typ, obj):
                    return
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                try:
                    item = w.q.get(timeout=wait)
                except Exception:  # queue.Empty
                    item = False
                if item is None:
                    # the server closed this watch
                    self.close_connection = True
                    return
                if item is False:
                    if bookmarks and time.monotonic() >= next_bookmark:
                        bm = None
                        with api.store.lock:
                            if w.q.empty():
                                bm = self.bookmark(rt)
                        if bm is not None:
                            self.write_chunk(bm)
                        next_bookmark = time.monotonic() + interval
                    continue
                typ, obj, _ev = item
                if not emit(typ, obj):
                    return
            self.end_chunks()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            api.stop_watch(w)

    def bookmark(self, rt, initial_end=False):
        md = {"resourceVersion": str(self.api.store.rv)}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"apiVersion": rt.gv, "kind": rt.kind, "metadata": md}}

    def write_event(self, rt, typ, obj, as_table):
        api = self.api
        o = api.out(rt, obj)
        if as_table:
            o = api.table(rt, [o], {"resourceVersion": o["metadata"].get("resourceVersion", "")},
                          "Metadata")
            self.write_chunk({"type": typ, "object": o})
            return
        text = '{"type":%s,"object":%s}\n' % (json.dumps(typ), api.encode(rt, o))
        self.write_raw(text.encode("utf-8"))

    def write_chunk(self, obj):
        self.write_raw((json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8"))

    def write_raw(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- test control (only with --test-control)
    def test_control(self, path, body):
        api = self.api
        try:
            req = json.loads(body) if body.strip() else {}
        except ValueError:
            raise bad_request("test control bodies are JSON")
        if path == "/_test/compact":
            api.store.compact(req.get("storage"))
            return self.send_json(200, {"resourceVersion": str(api.store.rv)})
        if path == "/_test/close-watches":
            api.close_watches()
            return self.send_json(200, {})
        if path == "/_test/fault":
            f = {"stage": req.get("stage", "request"), "action": req["action"],
                 "path": req.get("path", ""), "method": req.get("method", ""),
                 "count": int(req.get("count", 1))}
            with api.fault_lock:
                api.faults.append(f)
            return self.send_json(200, f)
        if path == "/_test/clear-faults":
            with api.fault_lock:
                api.faults.clear()
            return self.send_json(200, {})
        if path == "/_test/service-endpoint":
            host, _, port = str(req.get("address", "")).rpartition(":")
            if not req.get("service") or not port.isdigit():
                raise bad_request('want {"service": "NS/NAME", "address": "HOST:PORT"}')
            api.admission.endpoints[req["service"]] = (host or "127.0.0.1", int(port))
            return self.send_json(200, req)
        if path == "/_test/requests":
            since = int(req.get("since", 0))
            sub = req.get("path", "")
            with api.fault_lock:
                out = [r for r in api.requests if r["seq"] > since and sub in r["path"]]
                nxt = api.request_seq
            return self.send_json(200, {"requests": out, "next": nxt})
        if path == "/_test/stats":
            with api.store.lock:
                watchers = sum(len(v) for v in api.store.watchers.values())
                return self.send_json(200, {"resourceVersion": str(api.store.rv),
                                            "requests": api.request_count,
                                            "watchers": watchers,
                                            "objects": {s: len(o) for s, o in api.store.objs.items()}})
        raise not_found_path(path)


def not_found_path(path):
    return ApiError(404, "NotFound", "the server could not find the requested resource",
                    {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]})


def wants_table(accept):
    first = accept.split(",")[0] if accept else ""
    return "as=Table" in first and "g=meta.k8s.io" in first


def wants_partial(accept):
    first = accept.split(",")[0] if accept else ""
    return "as=PartialObjectMetadata" in first


def sort_versions(versions):
    import re

    def key(v):
        m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", v)
        if not m:
            return (3, 0, 0, v)
        rank = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
        return (rank, -int(m.group(1)), -int(m.group(3) or 0), v)
    return sorted(versions, key=key)


# ========================================================================= TLS

def make_certs(d):
    """A CA, a server certificate for 127.0.0.1/localhost and an admin client
    certificate, all made by openssl at start."""
    os.makedirs(d, exist_ok=True)

    def run(*cmd):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    p = lambda n: os.path.join(d, n)  # noqa: E731
    if not os.path.exists(p("ca.crt")):
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", p("ca.key"), "-out", p("ca.crt"), "-subj", "/CN=gkm-test-ca")
    if not os.path.exists(p("server.crt")):
        with open(p("server.ext"), "w") as fh:
            fh.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                     "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", p("server.key"),
            "-out", p("server.csr"), "-subj", "/CN=127.0.0.1")
        run("openssl", "x509", "-req", "-in", p("server.csr"), "-CA", p("ca.crt"), "-CAkey",
            p("ca.key"), "-CAcreateserial", "-days", "2", "-out", p("server.crt"),
            "-extfile", p("server.ext"))
    if not os.path.exists(p("client.crt")):
        with open(p("client.ext"), "w") as fh:
            fh.write("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", p("client.key"),
            "-out", p("client.csr"), "-subj", "/O=system:masters/CN=gkm-test-admin")
        run("openssl", "x509", "-req", "-in", p("client.csr"), "-CA", p("ca.crt"), "-CAkey",
            p("ca.key"), "-CAcreateserial", "-days", "2", "-out", p("client.crt"),
            "-extfile", p("client.ext"))


def write_kubeconfig(path, server, tls_dir, token, use_client_cert):
    def b64(n):
        with open(os.path.join(tls_dir, n), "rb") as fh:
            return base64.b64encode(fh.read()).decode()
    cluster = {"server": server}
    if tls_dir:
        cluster["certificate-authority-data"] = b64("ca.crt")
    user = {}
    if token:
        user["token"] = token
    if use_client_cert and tls_dir:
        user["client-certificate-data"] = b64("client.crt")
        user["client-key-data"] = b64("client.key")
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "gkm-test",
           "clusters": [{"name": "gkm-test", "cluster": cluster}],
           "users": [{"name": "gkm-test", "user": user}],
           "contexts": [{"name": "gkm-test", "context": {"cluster": "gkm-test", "user": "gkm-test",
                                                         "namespace": "default"}}],
           "preferences": {}}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(cfg, fh, indent=1)
    os.replace(tmp, path)


class Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, addr, handler, ssl_ctx=None):
        self.ssl_ctx = ssl_ctx
        super().__init__(addr, handler)

    def get_request(self):
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_ctx is not None:
            sock = self.ssl_ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, OSError)):
            return
        super().handle_error(request, client_address)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--port-file", help="write the port here once listening")
    ap.add_argument("--crds", action="append", default=[],
                    help="directory or file of CustomResourceDefinitions to register")
    ap.add_argument("--tls-dir", help="serve HTTPS; certificates are made here with openssl")
    ap.add_argument("--token", help="require this bearer token")
    ap.add_argument("--token-file", help="require the bearer token in this file (re-read)")
    ap.add_argument("--client-ca", action="store_true",
                    help="with --tls-dir: also accept client certificates signed by the CA")
    ap.add_argument("--kubeconfig", help="write a kubeconfig for this server here")
    ap.add_argument("--watch-history", type=int, default=10000,
                    help="events kept per resource for watch resumption (older: 410 Gone)")
    ap.add_argument("--bookmark-interval", type=float, default=60.0,
                    help="seconds between BOOKMARK events")
    ap.add_argument("--watch-timeout", type=float, default=1800.0,
                    help="default watch duration when the client sets no timeoutSeconds")
    ap.add_argument("--state", help="load objects from this file at start, save them at exit")
    ap.add_argument("--service-endpoint", action="append", default=[], metavar="NS/NAME=HOST:PORT",
                    help="where the Service an admission webhook names listens")
    ap.add_argument("--test-control", action="store_true",
                    help="enable /_test/ endpoints (fault injection, compaction, closing watches)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    api = Server(args)
    ctx = None
    scheme = "http"
    if args.tls_dir:
        make_certs(args.tls_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(args.tls_dir, "server.crt"),
                            os.path.join(args.tls_dir, "server.key"))
        if args.client_ca:
            ctx.load_verify_locations(os.path.join(args.tls_dir, "ca.crt"))
            ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.set_alpn_protocols(["http/1.1"])
        scheme = "https"
    Handler.api = api
    httpd = Listener((args.address, args.port), Handler, ctx)
    api.port = httpd.server_address[1]
    url = "%s://%s:%d" % (scheme, args.address, api.port)
    if args.kubeconfig:
        write_kubeconfig(args.kubeconfig, url, args.tls_dir, args.token,
                         args.client_ca and not args.token)
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write("%d\n" % api.port)
        os.replace(tmp, args.port_file)
    print("listening on %s" % url, flush=True)

    def stop(_sig, _frm):
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        api.close_watches()
        if args.state:
            api.save_state(args.state)
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
