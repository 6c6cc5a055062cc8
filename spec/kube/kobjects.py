"""What the fault-injection API server does with objects: the resources it
serves (a few built-in kinds and the custom resources of the CRDs it is
given), create, update, merge patch, server-side apply, delete, and lists
with selectors and pages.

It is no model of kube-apiserver: nothing is validated against a schema, and
there is no admission, no conflict between field managers, no garbage
collection and no finalizer. Suites that need those run on the real control
plane."""
import base64
import datetime
import json
import os
import random
import re
import uuid

import yaml

NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


class YamlLoader(yaml.SafeLoader):
    """YAML as the API server reads it: timestamps stay strings."""


YamlLoader.yaml_implicit_resolvers = {
    k: [r for r in v if r[0] != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


class ApiError(Exception):
    """An answer with a Kubernetes Status body."""

    REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
               409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
               429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}

    def __init__(self, code, message, reason=None, headers=()):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or self.REASONS.get(code, "InternalError")
        self.headers = list(headers)

    def status(self):
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


class Resource:
    """One served resource: /api/v1/... or /apis/GROUP/VERSION/..."""

    def __init__(self, group, version, plural, kind, namespaced, status=False, short=()):
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced, self.status, self.short = namespaced, status, list(short)
        self.api_version = "%s/%s" % (group, version) if group else version
        self.storage = "%s/%s" % (group or "core", plural)

    def entry(self):
        """Its entry in the group-version's APIResourceList (discovery)."""
        return {"name": self.plural, "singularName": self.kind.lower(),
                "namespaced": self.namespaced, "kind": self.kind, "shortNames": self.short,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}

    def key(self, ns, name):
        return "%s/%s" % (ns, name) if self.namespaced else name

    def not_found(self, name):
        what = "%s.%s" % (self.plural, self.group) if self.group else self.plural
        return ApiError(404, '%s "%s" not found' % (what, name))


BUILTIN = [
    Resource("", "v1", "namespaces", "Namespace", False, True, ["ns"]),
    Resource("", "v1", "nodes", "Node", False, True, ["no"]),
    Resource("", "v1", "pods", "Pod", True, True, ["po"]),
    Resource("", "v1", "configmaps", "ConfigMap", True, short=["cm"]),
    Resource("", "v1", "secrets", "Secret", True),
    Resource("", "v1", "events", "Event", True, short=["ev"]),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
]


def crd_resources(path):
    """The served versions of every CustomResourceDefinition in a file or
    a directory of YAML files."""
    files = [path]
    if os.path.isdir(path):
        files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".yaml")]
    out = []
    for f in files:
        with open(f) as fh:
            for doc in yaml.safe_load_all(fh):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec, names = doc["spec"], doc["spec"]["names"]
                for v in spec["versions"]:
                    if v.get("served", True):
                        out.append(Resource(spec["group"], v["name"], names["plural"], names["kind"],
                                            spec["scope"] == "Namespaced",
                                            "status" in (v.get("subresources") or {}),
                                            names.get("shortNames") or ()))
    return out


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(raw, content_type):
    """A request body (JSON, or YAML for apply patches) as an object."""
    if "protobuf" in content_type:
        raise ApiError(415, "the body of the request was in an unknown format - accepted media "
                       "types include: application/json, application/yaml")
    try:
        if "yaml" in content_type:
            obj = yaml.load(raw, Loader=YamlLoader)
        else:
            obj = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, "the body of the request was in an unknown format: %s" % e)
    if not isinstance(obj, dict):
        raise ApiError(400, "the body of the request must be an object")
    return obj


# ------------------------------------------------------------------ selectors

def label_selector(text):
    """fn(labels) -> bool for an equality-based label selector: k=v, k==v,
    k!=v, k and !k, joined by commas (set-based ones are refused)."""
    tests = []
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        m = re.match(r"^(!?)([\w./-]+)(?:\s*(==|=|!=)\s*([\w.-]*))?$", term)
        if not m or (m.group(1) and m.group(3)):
            raise ApiError(400, "unable to parse requirement %r: this server takes k=v, k!=v, k and !k"
                           % term)
        neg, key, op, val = m.groups()
        if op:
            tests.append(lambda lb, k=key, v=val, eq=op != "!=": (lb.get(k) == v) == eq)
        else:
            tests.append(lambda lb, k=key, want=not neg: (k in lb) == want)
    return lambda labels: all(t(labels or {}) for t in tests)


def field_selector(text):
    """fn(obj) -> bool for a field selector: dotted.path=value or !=, joined
    by commas (any field, where the real server allows only some)."""
    tests = []
    for term in filter(None, (text or "").split(",")):
        m = re.match(r"^([\w.]+)\s*(==|=|!=)\s*(.*)$", term.strip())
        if not m:
            raise ApiError(400, "invalid field selector: %r" % term)
        path, op, val = m.groups()

        def value(obj, path=path):
            for p in path.split("."):
                obj = obj.get(p) if isinstance(obj, dict) else None
            return "" if obj is None else str(obj).lower() if isinstance(obj, bool) else str(obj)
        tests.append(lambda o, value=value, v=val, eq=op != "!=": (value(o) == v) == eq)
    return lambda obj: all(t(obj) for t in tests)


def selector(params):
    lsel = label_selector(params.get("labelSelector", ""))
    fsel = field_selector(params.get("fieldSelector", ""))
    return lambda o: lsel(o["metadata"].get("labels")) and fsel(o)


# ---------------------------------------------------------------- apply

def field_paths(v, prefix=()):
    """Every path (tuple of keys) of a configuration: maps are walked, any
    other value (lists too) is one field."""
    for k, x in v.items():
        yield prefix + (k,)
        if isinstance(x, dict) and x:
            yield from field_paths(x, prefix + (k,))


def fields_v1(paths):
    out = {}
    for p in sorted(paths):
        cur = out
        for k in p:
            cur = cur.setdefault("f:" + k, {})
    return out


def from_fields_v1(f, prefix=()):
    for k, x in f.items():
        if k.startswith("f:"):
            yield prefix + (k[2:],)
            yield from from_fields_v1(x, prefix + (k[2:],))


def merge(target, patch, none_deletes=True):
    """Merge patch (RFC 7386) of target in place: maps merge, None deletes."""
    for k, v in patch.items():
        if v is None and none_deletes:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v, none_deletes)
        else:
            target[k] = json.loads(json.dumps(v))
    return target


def remove(obj, path):
    for k in path[:-1]:
        obj = obj.get(k) if isinstance(obj, dict) else None
    if isinstance(obj, dict):
        obj.pop(path[-1], None)


def applied(cur, cfg, manager, sub):
    """Server-side apply of configuration cfg by manager to cur (a copy):
    the fields this manager applied before and applies no more are removed,
    unless another manager applied them too; then cfg is merged in. The
    fields each manager applies are kept in metadata.managedFields."""
    md = cfg.get("metadata") or {}
    mine = {k: v for k, v in cfg.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = {k: md[k] for k in ("labels", "annotations", "ownerReferences", "finalizers") if k in md}
    if meta:
        mine["metadata"] = meta
    new = set(field_paths(mine))
    entries = cur["metadata"].get("managedFields") or []
    old, others = set(), set()
    for e in entries:
        paths = set(from_fields_v1(e.get("fieldsV1") or {}))
        if (e.get("manager"), e.get("subresource", "")) == (manager, sub):
            old = paths
        else:
            others |= paths
    keep = new | others
    for p in sorted(old - keep, key=len, reverse=True):
        if not any(q[:len(p)] == p for q in keep):
            remove(cur, p)
    merge(cur, mine, none_deletes=False)
    entry = {"manager": manager, "operation": "Apply", "apiVersion": cfg.get("apiVersion", ""),
             "time": now(), "fieldsType": "FieldsV1", "fieldsV1": fields_v1(new)}
    if sub:
        entry["subresource"] = sub
    rest = []
    for e in entries:
        if (e.get("manager"), e.get("subresource", "")) != (manager, sub):
            rest.append(e)
        elif e.get("fieldsV1") == entry["fieldsV1"]:
            entry["time"] = e.get("time")   # the same fields: no change to record
    cur["metadata"]["managedFields"] = rest + [entry]
    return cur


# ---------------------------------------------------------------- verbs

class Objects:
    """The verbs on a Store's objects. Every method takes the store lock."""

    def __init__(self, store):
        self.store = store

    def get(self, rt, ns, name):
        obj = self.store.get(rt.storage, rt.key(ns, name))
        if obj is None:
            raise rt.not_found(name)
        return obj

    def create(self, rt, ns, obj):
        md = obj.setdefault("metadata", {})
        if not md.get("name") and md.get("generateName"):
            md["name"] = md["generateName"] + "".join(random.choice(NAME_CHARS) for _ in range(5))
        if not md.get("name"):
            raise ApiError(422, "%s.%s is invalid: metadata.name: Required value" % (rt.kind, rt.group))
        if rt.namespaced:
            md["namespace"] = ns or md.get("namespace") or "default"
        else:
            md.pop("namespace", None)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        md.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        if rt.status:   # a status is written through the status subresource
            obj.pop("status", None)
        if rt.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        with self.store.lock:
            key = rt.key(md.get("namespace"), md["name"])
            if self.store.get(rt.storage, key) is not None:
                what = "%s.%s" % (rt.plural, rt.group) if rt.group else rt.plural
                raise ApiError(409, '%s "%s" already exists' % (what, md["name"]), "AlreadyExists")
            return self.store.commit(rt.storage, key, obj)

    def update(self, rt, ns, name, sub, new, check_rv=True):
        """Store new in place of the object (PUT): the status subresource
        changes only the status (and managed fields), the object itself all
        but the status. A write that changes nothing is no write."""
        with self.store.lock:
            cur = self.get(rt, ns, name)
            nmd = new.setdefault("metadata", {})
            if check_rv and nmd.get("resourceVersion") not in (None, "", cur["metadata"]["resourceVersion"]):
                raise ApiError(409, "Operation cannot be fulfilled on %s \"%s\": the object has been "
                               "modified; please apply your changes to the latest version and try "
                               "again" % (rt.plural, name))
            out = json.loads(json.dumps(cur if sub == "status" else new))
            md = out["metadata"]
            if sub == "status":
                out["status"] = new.get("status")
                md["managedFields"] = nmd.get("managedFields") or md.get("managedFields")
            else:
                out.update(apiVersion=rt.api_version, kind=rt.kind)
                for k in ("uid", "creationTimestamp", "generation", "namespace", "name"):
                    if k in cur["metadata"]:
                        md[k] = cur["metadata"][k]
                if not md.get("managedFields") and cur["metadata"].get("managedFields"):
                    md["managedFields"] = cur["metadata"]["managedFields"]
                if rt.status:
                    out["status"] = cur.get("status")
                skip = ("metadata", "status", "apiVersion", "kind")
                if {k: v for k, v in cur.items() if k not in skip} != \
                        {k: v for k, v in out.items() if k not in skip}:
                    md["generation"] = cur["metadata"].get("generation", 1) + 1
            out = {k: v for k, v in out.items() if v is not None}
            md["resourceVersion"] = cur["metadata"]["resourceVersion"]
            if out == cur:
                return cur
            return self.store.commit(rt.storage, rt.key(ns, name), out)

    def patch(self, rt, ns, name, sub, raw, content_type, params):
        """Merge patches (strategic ones read as merge patches) and server-side
        apply; (object, HTTP status)."""
        ct = content_type.split(";")[0].strip()
        body = parse(raw, ct)
        with self.store.lock:
            cur = self.store.get(rt.storage, rt.key(ns, name))
            if ct == "application/apply-patch+yaml":
                if sub == "status":     # what else it holds is not applied
                    body = {k: v for k, v in body.items() if k in ("apiVersion", "status")}
                elif rt.status:
                    body.pop("status", None)
                manager = params.get("fieldManager")
                if not manager:
                    raise ApiError(422, "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: "
                                   "Required value: is required for apply patch")
                if cur is None and not sub:
                    obj = applied({"metadata": {}}, body, manager, sub)
                    obj["metadata"].update(name=name, namespace=ns)
                    return self.create(rt, ns, obj), 201
                if cur is None:
                    raise rt.not_found(name)
                new = applied(json.loads(json.dumps(cur)), body, manager, sub)
            elif ct in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if cur is None:
                    raise rt.not_found(name)
                new = merge(json.loads(json.dumps(cur)), body)
            else:
                raise ApiError(415, "the body of the request was in an unknown format - accepted "
                               "media types include: application/merge-patch+json, "
                               "application/strategic-merge-patch+json, application/apply-patch+yaml")
            return self.update(rt, ns, name, sub, new, check_rv=False), 200

    def delete(self, rt, ns, name):
        with self.store.lock:
            self.get(rt, ns, name)
            return self.store.commit(rt.storage, rt.key(ns, name), None)

    def list(self, rt, ns, params):
        """(items, list metadata): in key order, limit and continue as the
        real server pages them."""
        match = selector(params)
        limit = int(params.get("limit") or 0)
        start = ""
        if params.get("continue"):
            start = json.loads(base64.urlsafe_b64decode(params["continue"]))["start"]
        prefix = ns + "/" if ns and rt.namespaced else ""
        with self.store.lock:
            items = [o for k, o in self.store.items(rt.storage, prefix) if k > start and match(o)]
            meta = {"resourceVersion": str(self.store.rv)}
        if limit and len(items) > limit:
            last = rt.key(items[limit - 1]["metadata"].get("namespace"), items[limit - 1]["metadata"]["name"])
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"start": last}).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return items, meta
