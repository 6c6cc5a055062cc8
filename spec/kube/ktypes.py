"""Resource types of the test API server: the built-in kinds it serves, the
custom resources registered from CRDs, their server-side table printing,
field selectors, and the events.k8s.io <-> core/v1 Event conversion."""
import base64
import copy
import datetime
import hashlib
import json
import re

import kbuiltin
import kschema

CR_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
NAME_COLUMN = {
    "name": "Name", "type": "string", "format": "name",
    "description": "Name must be unique within a namespace. Is required when creating "
                   "resources, although some resources may allow a client to request the "
                   "generation of an appropriate name automatically. Name is primarily "
                   "intended for creation idempotence and configuration definition. Cannot "
                   "be updated. More info: http://kubernetes.io/docs/user-guide/identifiers#names",
    "priority": 0,
}


def parse_time(s):
    if not isinstance(s, str) or not s:
        return None
    try:
        return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


def human_duration(seconds):
    """duration.HumanDuration"""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return "%ds" % s
    minutes = s // 60
    if minutes < 10:
        sec = s % 60
        return "%dm" % minutes if sec == 0 else "%dm%ds" % (minutes, sec)
    if minutes < 180:
        return "%dm" % minutes
    hours = s // 3600
    if hours < 8:
        m = minutes % 60
        return "%dh" % hours if m == 0 else "%dh%dm" % (hours, m)
    if hours < 48:
        return "%dh" % hours
    if hours < 24 * 8:
        h = hours % 24
        return "%dd" % (hours // 24) if h == 0 else "%dd%dh" % (hours // 24, h)
    if hours < 24 * 365 * 2:
        return "%dd" % (hours // 24)
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return "%dy" % (hours // 24 // 365) if dy == 0 else "%dy%dd" % (hours // 24 // 365, dy)
    return "%dy" % (hours // 24 // 365)


def age(ts, now=None):
    t = parse_time(ts)
    if t is None:
        return "<unknown>"
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return human_duration((now - t).total_seconds())


class RType:
    """One served resource (group, version, plural)."""

    def __init__(self, group, version, plural, kind, namespaced, singular="", short=(),
                 status=False, verbs=None, storage=None, name_kind="subdomain",
                 generation=False, create_on_update=False, categories=()):
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced = namespaced
        self.singular = singular
        self.short = list(short)
        self.status = status
        self.verbs = verbs or ALL_VERBS
        self.storage = storage or "%s/%s" % (group or "core", plural)
        self.name_kind = name_kind
        self.generation = generation
        self.create_on_update = create_on_update
        self.categories = list(categories)
        self.crd = None            # the CRD object for custom resources
        self.schema = None         # validation schema (custom resources)
        self.ssa_schema = None     # structural schema guiding managed fields
        self.columns = None        # CRD additionalPrinterColumns
        self.table = None          # fn(rtype, obj) -> cells, for built-ins
        self.table_columns = None  # column definitions for built-ins
        self.fields = {}           # field selector label -> fn(obj) -> str
        self.skeleton = None       # defaulted fields of a built-in
        self.extra_validate = None  # fn(rtype, obj, old) -> [FieldError]
        self.to_storage = None     # conversion for a second version of a storage
        self.from_storage = None
        self.selectable = []       # CRD selectableFields json paths
        self.normalize = None      # fn(obj): what the kind's strategy rewrites
        self.has_defaults = False  # the schema has default values

    @property
    def gv(self):
        return "%s/%s" % (self.group, self.version) if self.group else self.version

    @property
    def list_kind(self):
        if self.crd is not None:
            return self.crd["spec"]["names"].get("listKind") or self.kind + "List"
        return self.kind + "List"

    @property
    def qualified(self):
        """widgets.example.com, or configmaps for the core group."""
        return "%s.%s" % (self.plural, self.group) if self.group else self.plural

    @property
    def group_kind(self):
        return "%s.%s" % (self.kind, self.group) if self.group else self.kind

    def field_values(self, obj):
        md = obj.get("metadata") or {}
        vals = {"metadata.name": md.get("name", ""), "metadata.namespace": md.get("namespace", "")}
        for k, fn in self.fields.items():
            try:
                v = fn(obj)
            except (KeyError, TypeError, AttributeError):
                v = ""
            vals[k] = "" if v is None else (v if isinstance(v, str) else json.dumps(v)
                                            if not isinstance(v, (bool, int, float))
                                            else str(v).lower() if isinstance(v, bool) else str(v))
        return vals

    def resource_entry(self):
        e = {"name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
             "kind": self.kind, "verbs": list(self.verbs)}
        if self.short:
            e["shortNames"] = list(self.short)
        if self.categories:
            e["categories"] = list(self.categories)
        return e

    def apply_skeleton(self, obj):
        """Add the fields a built-in kind always serializes (copy on write)."""
        if self.skeleton:
            for k, v in self.skeleton.items():
                if k not in obj:
                    obj[k] = copy.deepcopy(v)
                elif isinstance(v, dict) and isinstance(obj[k], dict):
                    missing = [k2 for k2 in v if k2 not in obj[k]]
                    if missing:
                        obj[k] = dict(obj[k])
                        for k2 in missing:
                            obj[k][k2] = copy.deepcopy(v[k2])
        return obj


# --------------------------------------------------------------- JSONPath

_JP_TOKEN = re.compile(r"\.([A-Za-z0-9_\-$]+)|\[(\d+|\*)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*"
                       r"(?:\"([^\"]*)\"|'([^']*)')\)\]|\.?\[['\"]([^'\"]+)['\"]\]")


def jsonpath(obj, path):
    """Evaluate the JSONPath subset printer columns use; returns all matches."""
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1]
    if p.startswith("$"):
        p = p[1:]
    cur = [obj]
    pos = 0
    while pos < len(p):
        m = _JP_TOKEN.match(p, pos)
        if not m:
            return []
        pos = m.end()
        nxt = []
        if m.group(1) is not None or m.group(6) is not None:
            name = m.group(1) if m.group(1) is not None else m.group(6)
            for c in cur:
                if isinstance(c, dict) and name in c:
                    nxt.append(c[name])
        elif m.group(2) is not None:
            idx = m.group(2)
            for c in cur:
                if isinstance(c, list):
                    if idx == "*":
                        nxt.extend(c)
                    elif int(idx) < len(c):
                        nxt.append(c[int(idx)])
        else:
            fld = m.group(3).split(".")
            want = m.group(4) if m.group(4) is not None else m.group(5)
            for c in cur:
                if isinstance(c, list):
                    for it in c:
                        v = it
                        for f in fld:
                            v = v.get(f) if isinstance(v, dict) else None
                        if v is not None and _jp_text(v) == want:
                            nxt.append(it)
        cur = nxt
    return cur


def _jp_text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return kschema.go_number(v)
    return json.dumps(v, separators=(",", ":"))


def crd_cell(column, obj):
    res = jsonpath(obj, column.get("jsonPath", ""))
    if not res:
        return None
    v = res[0]
    t = column.get("type", "string")
    if v is None:
        return None
    if t == "string":
        return _jp_text(v)
    if t == "integer":
        if isinstance(v, bool):
            return None
        if isinstance(v, (int, float)):
            return int(v)
        return None
    if t == "number":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        return None
    if t == "boolean":
        return v if isinstance(v, bool) else None
    if t == "date":
        if isinstance(v, str):
            if parse_time(v) is None:
                return "<invalid>"
            return age(v)
        return None
    return None


def crd_column_defs(rt):
    defs = [dict(NAME_COLUMN)]
    for c in rt.columns or []:
        defs.append({"name": c["name"], "type": c.get("type", "string"),
                     "format": c.get("format", ""),
                     "description": c.get("description") or
                     "Custom resource definition column (in JSONPath format): %s" % c.get("jsonPath", ""),
                     "priority": c.get("priority", 0)})
    return defs


def table_columns(rt):
    if rt.columns is not None:
        return crd_column_defs(rt)
    if rt.table_columns:
        return [dict(NAME_COLUMN) if c == "Name" else c for c in rt.table_columns]
    return [dict(NAME_COLUMN),
            {"name": "Created At", "type": "date", "format": "",
             "description": "CreationTimestamp is a timestamp representing the server time when "
                            "this object was created.", "priority": 0}]


def table_cells(rt, obj):
    md = obj.get("metadata") or {}
    if rt.columns is not None:
        return [md.get("name")] + [crd_cell(c, obj) for c in rt.columns]
    if rt.table:
        return rt.table(obj)
    return [md.get("name"), md.get("creationTimestamp")]


def _col(name, typ="string", desc="", priority=0, fmt=""):
    return {"name": name, "type": typ, "format": fmt, "description": desc, "priority": priority}


# ------------------------------------------------------------------ built-ins

def _age(obj):
    return age((obj.get("metadata") or {}).get("creationTimestamp"))


def _node_cells(obj):
    md = obj.get("metadata") or {}
    st = obj.get("status") or {}
    status = "Unknown"
    for c in st.get("conditions") or []:
        if c.get("type") == "Ready":
            status = "Ready" if c.get("status") == "True" else "NotReady"
    if not st.get("conditions"):
        status = "Unknown"
    if (obj.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (md.get("labels") or {})
                   if k.startswith("node-role.kubernetes.io/") and k.split("/", 1)[1])
    role = (md.get("labels") or {}).get("kubernetes.io/role")
    if role:
        roles.append(role)
    info = st.get("nodeInfo") or {}
    internal = external = "<none>"
    for a in st.get("addresses") or []:
        if a.get("type") == "InternalIP" and internal == "<none>":
            internal = a.get("address")
        if a.get("type") == "ExternalIP" and external == "<none>":
            external = a.get("address")
    return [md.get("name"), status, ",".join(roles) or "<none>", _age(obj),
            info.get("kubeletVersion", ""), internal, external,
            info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


def _event_cells(obj):
    md = obj.get("metadata") or {}
    inv = obj.get("involvedObject") or {}
    first = obj.get("firstTimestamp") or obj.get("eventTime")
    last = obj.get("lastTimestamp") or obj.get("eventTime") or first
    series = obj.get("series") or {}
    if series.get("lastObservedTime"):
        last = series["lastObservedTime"]
    src = obj.get("source") or {}
    source = src.get("component") or obj.get("reportingComponent") or ""
    if src.get("host"):
        source += ", " + src["host"]
    count = obj.get("count") or (series.get("count") if series else 0) or 1
    return [age(last) if last else "<unknown>", obj.get("type", ""), obj.get("reason", ""),
            "%s/%s" % ((inv.get("kind") or "").lower(), inv.get("name", "")),
            inv.get("fieldPath", ""), source, (obj.get("message") or "").strip(),
            age(first) if first else "<unknown>", count, md.get("name")]


def _pod_cells(obj):
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    st = obj.get("status") or {}
    total = len(spec.get("containers") or [])
    ready = sum(1 for c in st.get("containerStatuses") or [] if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in st.get("containerStatuses") or [])
    phase = st.get("reason") or st.get("phase") or "Pending"
    if md.get("deletionTimestamp"):
        phase = "Terminating"
    return [md.get("name"), "%d/%d" % (ready, total), phase, restarts, _age(obj),
            st.get("podIP") or "<none>", spec.get("nodeName") or "<none>",
            st.get("nominatedNodeName") or "<none>", "<none>"]


def _secret_string_data(obj):
    """stringData is write-only: merged into data, base64 encoded."""
    sd = obj.pop("stringData", None)
    if isinstance(sd, dict) and sd:
        data = dict(obj["data"]) if isinstance(obj.get("data"), dict) else {}
        for k, v in sd.items():
            if isinstance(v, str):
                data[k] = base64.b64encode(v.encode()).decode()
        obj["data"] = data


def _mk(group, version, plural, kind, namespaced, **kw):
    return RType(group, version, plural, kind, namespaced, **kw)




def _root(props):
    return {"type": "object", "properties": dict(props, metadata=kschema.OBJECT_META_SCHEMA)}


def event_v1_to_core(obj):
    """events.k8s.io/v1 Event -> core/v1 storage form."""
    out = {"kind": "Event", "apiVersion": "v1", "metadata": obj.get("metadata") or {}}
    pairs = [("regarding", "involvedObject"), ("note", "message"), ("deprecatedSource", "source"),
             ("deprecatedFirstTimestamp", "firstTimestamp"),
             ("deprecatedLastTimestamp", "lastTimestamp"), ("deprecatedCount", "count"),
             ("reportingController", "reportingComponent"),
             ("reportingInstance", "reportingInstance"), ("eventTime", "eventTime"),
             ("series", "series"), ("action", "action"), ("reason", "reason"),
             ("related", "related"), ("type", "type")]
    for a, b in pairs:
        if a in obj:
            v = obj[a]
            if a == "series" and isinstance(v, dict):
                v = {"count": v.get("count"), "lastObservedTime": v.get("lastObservedTime")}
            out[b] = v
    return out


def event_core_to_v1(obj):
    out = {"kind": "Event", "apiVersion": "events.k8s.io/v1", "metadata": obj.get("metadata") or {}}
    out["eventTime"] = obj.get("eventTime")
    for a, b in [("series", "series"), ("reportingComponent", "reportingController"),
                 ("reportingInstance", "reportingInstance"), ("action", "action"),
                 ("reason", "reason")]:
        if obj.get(a):
            out[b] = obj[a]
    out["regarding"] = obj.get("involvedObject") or {}
    if obj.get("related"):
        out["related"] = obj["related"]
    if obj.get("message"):
        out["note"] = obj["message"]
    if obj.get("type"):
        out["type"] = obj["type"]
    out["deprecatedSource"] = obj.get("source") or {}
    out["deprecatedFirstTimestamp"] = obj.get("firstTimestamp")
    out["deprecatedLastTimestamp"] = obj.get("lastTimestamp")
    if obj.get("count"):
        out["deprecatedCount"] = obj["count"]
    return out


_QNAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _validate_event(rt, obj, old, request_gv):
    """ValidateEventCreate/Update: legacy rules for v1, strict for events.k8s.io."""
    FE = kschema.FieldError
    errs = []
    md = obj.get("metadata") or {}
    inv = obj.get("involvedObject") or {}
    ns = md.get("namespace", "")
    if inv.get("namespace") and ns and inv.get("namespace") != ns and inv.get("kind") != "Namespace":
        errs.append(FE("invalid", "involvedObject.namespace", inv.get("namespace"),
                       "does not match event.namespace"))
    if request_gv == "v1":
        return errs
    name = md.get("name", "")
    if md.get("generateName"):
        errs += kschema.check_name(md["generateName"], "subdomain", "metadata.generateName", True)
    if name:
        errs += [e for e in kschema.check_name(name, "subdomain", "metadata.name")
                 if not md.get("generateName")]
    if not obj.get("eventTime"):
        errs.append(FE("required", "eventTime"))
    errs += kschema.check_enum(obj.get("type"), ("Normal", "Warning"), "type")
    rc = obj.get("reportingComponent") or ""
    if not rc:
        errs.append(FE("required", "reportingController"))
    elif not _QNAME.match(rc):
        errs.append(FE("invalid", "reportingController", rc, kschema.QNAME_MSG))
    ri = obj.get("reportingInstance") or ""
    if not ri:
        errs.append(FE("required", "reportingInstance"))
    elif len(ri) > 128:
        errs.append(FE("invalid", "reportingInstance", "", "can have at most 128 characters"))
    if not obj.get("action"):
        errs.append(FE("required", "action"))
    elif len(obj["action"]) > 128:
        errs.append(FE("invalid", "action", "", "can have at most 128 characters"))
    if not obj.get("reason"):
        errs.append(FE("required", "reason"))
    elif len(obj["reason"]) > 128:
        errs.append(FE("invalid", "reason", "", "can have at most 128 characters"))
    if len(obj.get("message") or "") > 1024:
        errs.append(FE("invalid", "note", "", "can have at most 1024 characters"))
    return errs


def builtin_types():
    """Every built-in resource this server serves, with its quirks."""
    out = []

    ns = _mk("", "v1", "namespaces", "Namespace", False, short=["ns"], status=True,
             name_kind="label", verbs=["create", "delete", "get", "list", "patch", "update", "watch"])
    ns.skeleton = {"spec": {}, "status": {"phase": "Active"}}
    ns.fields = {"status.phase": lambda o: o["status"]["phase"]}
    ns.table_columns = ["Name", _col("Status", desc="The status of the namespace"),
                        _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                         "server time when this object was created.")]
    ns.table = lambda o: [o["metadata"]["name"], (o.get("status") or {}).get("phase", ""), _age(o)]
    ns.ssa_schema = _root(kbuiltin.KINDS["Namespace"])
    out.append(ns)

    node = _mk("", "v1", "nodes", "Node", False, short=["no"], status=True)
    node.skeleton = {"spec": {}, "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                                            "nodeInfo": {"machineID": "", "systemUUID": "",
                                                         "bootID": "", "kernelVersion": "",
                                                         "osImage": "",
                                                         "containerRuntimeVersion": "",
                                                         "kubeletVersion": "",
                                                         "kubeProxyVersion": "",
                                                         "operatingSystem": "",
                                                         "architecture": ""}}}
    node.fields = {"spec.unschedulable": lambda o: bool((o.get("spec") or {}).get("unschedulable"))}
    node.table_columns = ["Name", _col("Status", desc="The status of the node"),
                          _col("Roles", desc="The roles of the node"),
                          _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                           "server time when this object was created."),
                          _col("Version", desc="Kubelet Version reported by the node."),
                          _col("Internal-IP", desc="List of internal IPs in the node.", priority=1),
                          _col("External-IP", desc="List of external IPs in the node.", priority=1),
                          _col("OS-Image", desc="OS Image reported by the node.", priority=1),
                          _col("Kernel-Version", desc="Kernel Version reported by the node.",
                               priority=1),
                          _col("Container-Runtime", desc="Container Runtime Version reported by "
                                                         "the node.", priority=1)]
    node.table = _node_cells
    node.ssa_schema = _root(kbuiltin.KINDS["Node"])
    out.append(node)

    cm = _mk("", "v1", "configmaps", "ConfigMap", True, short=["cm"])
    cm.table_columns = ["Name", _col("Data", "integer", "Data contains the configuration data."),
                        _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                         "server time when this object was created.")]
    cm.ssa_schema = _root(kbuiltin.KINDS["ConfigMap"])
    cm.table = lambda o: [o["metadata"]["name"],
                          len(o.get("data") or {}) + len(o.get("binaryData") or {}), _age(o)]
    out.append(cm)

    sec = _mk("", "v1", "secrets", "Secret", True)
    sec.skeleton = {"type": "Opaque"}
    sec.fields = {"type": lambda o: o.get("type", "")}
    sec.table_columns = ["Name", _col("Type", desc="Used to facilitate programmatic handling of "
                                                    "secret data."),
                         _col("Data", "integer", "Data contains the secret data."),
                         _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                          "server time when this object was created.")]
    sec.table = lambda o: [o["metadata"]["name"], o.get("type", ""), len(o.get("data") or {}),
                           _age(o)]
    sec.normalize = _secret_string_data
    sec.ssa_schema = _root(kbuiltin.KINDS["Secret"])
    out.append(sec)

    ev = _mk("", "v1", "events", "Event", True, short=["ev"], storage="core/events",
             name_kind="path", create_on_update=True)
    ev.skeleton = {"involvedObject": {}, "source": {}, "firstTimestamp": None,
                   "lastTimestamp": None, "eventTime": None, "reportingComponent": "",
                   "reportingInstance": ""}
    ev.fields = {
        "involvedObject.kind": lambda o: o["involvedObject"].get("kind", ""),
        "involvedObject.namespace": lambda o: o["involvedObject"].get("namespace", ""),
        "involvedObject.name": lambda o: o["involvedObject"].get("name", ""),
        "involvedObject.uid": lambda o: o["involvedObject"].get("uid", ""),
        "involvedObject.apiVersion": lambda o: o["involvedObject"].get("apiVersion", ""),
        "involvedObject.resourceVersion": lambda o: o["involvedObject"].get("resourceVersion", ""),
        "involvedObject.fieldPath": lambda o: o["involvedObject"].get("fieldPath", ""),
        "reason": lambda o: o.get("reason", ""),
        "reportingComponent": lambda o: o.get("reportingComponent", ""),
        "source": lambda o: (o.get("source") or {}).get("component", ""),
        "type": lambda o: o.get("type", ""),
    }
    ev_cols = [_col("Last Seen", desc="Time when this Event was last observed."),
               _col("Type", desc="Type of this event (Normal, Warning), new types could be "
                                 "added in the future."),
               _col("Reason", desc="This should be a short, machine understandable string that "
                                   "gives the reason for the transition into the object's "
                                   "current status."),
               _col("Object", desc="The object that this event is about."),
               _col("Subobject", desc="The subobject this event is about.", priority=1),
               _col("Source", desc="The component reporting this event.", priority=1),
               _col("Message", desc="A human-readable description of the status of this "
                                    "operation."),
               _col("First Seen", desc="The time at which the event was first recorded.",
                    priority=1),
               _col("Count", desc="The number of times this event has occurred.", priority=1),
               dict(NAME_COLUMN, priority=1)]
    ev.table_columns = ev_cols
    ev.table = _event_cells
    ev.ssa_schema = _root(kbuiltin.KINDS["Event"])
    ev.extra_validate = _validate_event
    out.append(ev)

    ev2 = _mk("events.k8s.io", "v1", "events", "Event", True, short=["ev"], storage="core/events",
              create_on_update=True)
    ev2.fields = dict(ev.fields)
    ev2.table_columns = ev_cols
    ev2.table = _event_cells
    ev2.ssa_schema = _root(kbuiltin.KINDS["events.k8s.io/Event"])
    ev2.to_storage = event_v1_to_core
    ev2.from_storage = event_core_to_v1
    ev2.skeleton = ev.skeleton
    ev2.extra_validate = _validate_event
    out.append(ev2)

    pod = _mk("", "v1", "pods", "Pod", True, short=["po"], status=True, categories=["all"])
    pod.skeleton = {"spec": {}, "status": {"phase": "Pending"}}
    pod.fields = {
        "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName", ""),
        "spec.restartPolicy": lambda o: (o.get("spec") or {}).get("restartPolicy", ""),
        "spec.schedulerName": lambda o: (o.get("spec") or {}).get("schedulerName", ""),
        "spec.serviceAccountName": lambda o: (o.get("spec") or {}).get("serviceAccountName", ""),
        "spec.hostNetwork": lambda o: bool((o.get("spec") or {}).get("hostNetwork")),
        "status.phase": lambda o: (o.get("status") or {}).get("phase", ""),
        "status.podIP": lambda o: (o.get("status") or {}).get("podIP", ""),
        "status.nominatedNodeName": lambda o: (o.get("status") or {}).get("nominatedNodeName", ""),
    }
    pod.table_columns = ["Name",
                         _col("Ready", desc="The aggregate readiness state of this pod for "
                                            "accepting traffic."),
                         _col("Status", desc="The aggregate status of the containers in this pod."),
                         _col("Restarts", desc="The number of times the containers in this pod "
                                               "have been restarted and when the last container "
                                               "in this pod has restarted."),
                         _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                          "server time when this object was created."),
                         _col("IP", desc="IP address allocated to the pod. Routable at least "
                                         "within the cluster. Empty if not yet allocated.",
                              priority=1),
                         _col("Node", desc="NodeName is a request to schedule this pod onto a "
                                           "specific node.", priority=1),
                         _col("Nominated Node", desc="nominatedNodeName is set when this pod "
                                                     "preempts other pods on the node.",
                              priority=1),
                         _col("Readiness Gates", desc="If specified, all readiness gates will "
                                                      "be evaluated for pod readiness.",
                              priority=1)]
    pod.table = _pod_cells
    pod.ssa_schema = _root(kbuiltin.KINDS["Pod"])
    out.append(pod)

    lease = _mk("coordination.k8s.io", "v1", "leases", "Lease", True)
    lease.skeleton = {"spec": {}}
    lease.table_columns = ["Name", _col("Holder", desc="HolderIdentity contains the identity of "
                                                        "the holder of a current lease."),
                           _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                            "server time when this object was created.")]
    lease.ssa_schema = _root(kbuiltin.KINDS["Lease"])
    lease.table = lambda o: [o["metadata"]["name"],
                             (o.get("spec") or {}).get("holderIdentity", ""), _age(o)]
    out.append(lease)

    # what gkm makes for a cache with spec.claim (no binder runs here)
    for plural, kind, namespaced, short in (("persistentvolumes", "PersistentVolume", False, "pv"),
                                            ("persistentvolumeclaims", "PersistentVolumeClaim", True,
                                             "pvc")):
        vol = _mk("", "v1", plural, kind, namespaced, short=[short], status=True)
        vol.skeleton = {"spec": {}, "status": {"phase": "Pending"}}
        vol.table_columns = ["Name", _col("Age", desc="CreationTimestamp is a timestamp representing "
                                                      "the server time when this object was created.")]
        vol.table = lambda o: [o["metadata"]["name"], _age(o)]
        vol.ssa_schema = _root({"spec": kbuiltin.ANY, "status": kbuiltin.ANY})
        out.append(vol)

    csi = _mk("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False)
    csi.skeleton = {"spec": {}}
    csi.table_columns = ["Name", _col("AttachRequired", "boolean", "Indicates this CSI volume "
                                                                   "driver requires an attach "
                                                                   "operation"),
                         _col("PodInfoOnMount", "boolean", "Indicates this CSI volume driver "
                                                           "requires additional pod information"),
                         _col("StorageCapacity", "boolean", "Indicates this CSI volume driver "
                                                            "supports storage capacity"),
                         _col("TokenRequests", desc="Indicates this CSI volume driver requires "
                                                    "tokens for the audiences."),
                         _col("RequiresRepublish", "boolean", "Indicates this CSI volume driver "
                                                              "requires republish."),
                         _col("Modes", desc="Indicates volume lifecycle modes this CSI volume "
                                            "driver supports."),
                         _col("Age", desc="CreationTimestamp is a timestamp representing the "
                                          "server time when this object was created.")]

    def csi_cells(o):
        s = o.get("spec") or {}
        return [o["metadata"]["name"], s.get("attachRequired", True),
                bool(s.get("podInfoOnMount")), bool(s.get("storageCapacity")),
                ",".join(t.get("audience", "") for t in s.get("tokenRequests") or []) or "<unset>",
                bool(s.get("requiresRepublish")),
                ",".join(s.get("volumeLifecycleModes") or ["Persistent"]), _age(o)]
    csi.table = csi_cells
    csi.ssa_schema = _root(kbuiltin.KINDS["CSIDriver"])
    out.append(csi)

    crd = _mk("apiextensions.k8s.io", "v1", "customresourcedefinitions",
              "CustomResourceDefinition", False, short=["crd", "crds"], status=True,
              generation=True, categories=["api-extensions"])
    crd.skeleton = {"spec": {"group": "", "names": {"plural": "", "kind": ""}, "scope": "",
                             "versions": None},
                    "status": {"conditions": None,
                                           "acceptedNames": {"plural": "", "kind": ""},
                                           "storedVersions": []}}
    crd.table = lambda o: [o["metadata"]["name"], o["metadata"].get("creationTimestamp")]
    crd.table_columns = ["Name", _col("Created At", "date",
                                      "CreationTimestamp is a timestamp representing the server "
                                      "time when this object was created.")]
    crd.ssa_schema = _root(kbuiltin.KINDS["CustomResourceDefinition"])
    out.append(crd)
    out += workload_types()

    for rt in out:
        if rt.ssa_schema is None:
            rt.ssa_schema = _root({})
    return out


AGE_COL = _col("Age", desc="CreationTimestamp is a timestamp representing the server time when "
                          "this object was created.")
CREATED_COL = _col("Created At", "date", "CreationTimestamp is a timestamp representing the "
                                         "server time when this object was created.")


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _deploy_cells(o):
    s, st = o.get("spec") or {}, o.get("status") or {}
    return [o["metadata"]["name"], "%d/%d" % (_int(st.get("readyReplicas")), _int(s.get("replicas", 1))),
            _int(st.get("updatedReplicas")), _int(st.get("availableReplicas")), _age(o)]


def _ds_cells(o):
    st = o.get("status") or {}
    sel = ((o.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
    return [o["metadata"]["name"]] + [_int(st.get(k)) for k in (
        "desiredNumberScheduled", "currentNumberScheduled", "numberReady", "updatedNumberScheduled",
        "numberAvailable")] + [",".join("%s=%s" % kv for kv in sorted(sel.items())) or "<none>", _age(o)]


def _svc_cells(o):
    s = o.get("spec") or {}
    ports = ",".join("%s/%s" % (p.get("port"), p.get("protocol", "TCP")) for p in s.get("ports") or [])
    return [o["metadata"]["name"], s.get("type", "ClusterIP"), s.get("clusterIP") or "<none>",
            ",".join(s.get("externalIPs") or []) or "<none>", ports or "<none>", _age(o)]


def _service_ip(obj):
    """A Service gets a cluster IP unless it asks for none."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and not spec.get("clusterIP"):
        n = int.from_bytes(hashlib.sha256(obj["metadata"].get("name", "").encode()).digest()[:2], "big")
        spec = dict(spec, clusterIP="10.96.%d.%d" % (n >> 8, (n & 255) or 1))
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("type", "ClusterIP")
        obj["spec"] = spec


def workload_types():
    """The other kinds the chart installs: served with the common semantics
    (no controller acts on them)."""
    out = []
    dep = _mk("apps", "v1", "deployments", "Deployment", True, short=["deploy"], status=True,
              generation=True, categories=["all"])
    dep.table_columns = ["Name", _col("Ready", desc="Number of the pod with ready state"),
                         _col("Up-to-date", "integer", "Total number of non-terminated pods "
                                                       "targeted by this deployment that have the "
                                                       "desired template spec."),
                         _col("Available", "integer", "Total number of available pods (ready for "
                                                      "at least minReadySeconds) targeted by this "
                                                      "deployment."), AGE_COL]
    dep.table = _deploy_cells
    ds = _mk("apps", "v1", "daemonsets", "DaemonSet", True, short=["ds"], status=True,
             generation=True, categories=["all"])
    ds.table_columns = ["Name"] + [_col(n, "integer", n) for n in (
        "Desired", "Current", "Ready", "Up-to-date", "Available")] + [
        _col("Node Selector", desc="The node selector of the pods."), AGE_COL]
    ds.table = _ds_cells
    svc = _mk("", "v1", "services", "Service", True, short=["svc"], status=True, categories=["all"])
    svc.table_columns = ["Name", _col("Type", desc="The type of the service."),
                         _col("Cluster-IP", desc="The IP address of the service."),
                         _col("External-IP", desc="The external IPs of the service."),
                         _col("Port(s)", desc="The ports of the service."), AGE_COL]
    svc.table = _svc_cells
    svc.normalize = _service_ip
    sa = _mk("", "v1", "serviceaccounts", "ServiceAccount", True, short=["sa"])
    sa.table_columns = ["Name", _col("Secrets", "integer", "Secrets of the service account."), AGE_COL]
    sa.table = lambda o: [o["metadata"]["name"], len(o.get("secrets") or []), _age(o)]
    out += [dep, ds, svc, sa]
    for plural, kind, ns in (("clusterroles", "ClusterRole", False), ("roles", "Role", True)):
        r = _mk("rbac.authorization.k8s.io", "v1", plural, kind, ns)
        r.table_columns = ["Name", CREATED_COL]
        out.append(r)
    for plural, kind, ns in (("clusterrolebindings", "ClusterRoleBinding", False),
                             ("rolebindings", "RoleBinding", True)):
        r = _mk("rbac.authorization.k8s.io", "v1", plural, kind, ns)
        r.table_columns = ["Name", _col("Role", desc="The role of the binding."), AGE_COL]
        r.table = lambda o: [o["metadata"]["name"], "%s/%s" % (
            (o.get("roleRef") or {}).get("kind", ""), (o.get("roleRef") or {}).get("name", "")), _age(o)]
        out.append(r)
    pdb = _mk("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, short=["pdb"],
              status=True, generation=True)
    pdb.table_columns = ["Name", _col("Min Available", desc="The minimum number of pods."),
                         _col("Max Unavailable", desc="The maximum number of unavailable pods."),
                         _col("Allowed Disruptions", "integer", "Disruptions allowed now."), AGE_COL]
    pdb.table = lambda o: [o["metadata"]["name"], str((o.get("spec") or {}).get("minAvailable", "N/A")),
                           str((o.get("spec") or {}).get("maxUnavailable", "N/A")),
                           _int((o.get("status") or {}).get("disruptionsAllowed")), _age(o)]
    out.append(pdb)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        w = _mk("admissionregistration.k8s.io", "v1", kind.lower() + "s", kind, False,
                generation=True, categories=["api-extensions"])
        w.table_columns = ["Name", _col("Webhooks", "integer", "Webhooks of the configuration."),
                           AGE_COL]
        w.table = lambda o: [o["metadata"]["name"], len(o.get("webhooks") or []), _age(o)]
        out.append(w)
    for rt in out:
        rt.ssa_schema = _root(kbuiltin.KINDS.get(rt.kind, {}))
        if rt.table is None:
            rt.table = lambda o: [o["metadata"]["name"], o["metadata"].get("creationTimestamp")]
    return out


def custom_type(crd):
    """The RType a CustomResourceDefinition registers (its storage version)."""
    spec = crd["spec"]
    names = spec["names"]
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    storage = None
    for v in versions:
        if v.get("storage"):
            storage = v
    out = []
    for v in versions:
        rt = RType(spec["group"], v["name"], names["plural"], names["kind"],
                   spec.get("scope", "Namespaced") == "Namespaced",
                   singular=names.get("singular") or names["kind"].lower(),
                   short=names.get("shortNames") or [],
                   status="status" in (v.get("subresources") or {}),
                   storage="%s/%s" % (spec["group"], names["plural"]),
                   generation=True, categories=names.get("categories") or [],
                   verbs=CR_VERBS)
        rt.crd = crd
        sch = (v.get("schema") or {}).get("openAPIV3Schema") or {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}
        rt.schema = sch
        rt.has_defaults = '"default"' in json.dumps(sch)
        root = copy.deepcopy(sch)
        root.setdefault("properties", {})
        root["properties"]["metadata"] = kschema.OBJECT_META_SCHEMA
        root["properties"].setdefault("apiVersion", {"type": "string"})
        root["properties"].setdefault("kind", {"type": "string"})
        rt.ssa_schema = root
        rt.columns = v.get("additionalPrinterColumns") or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        rt.selectable = [f.get("jsonPath", "") for f in v.get("selectableFields") or []]
        for jp in rt.selectable:
            label = jp.lstrip(".")
            rt.fields[label] = (lambda p: lambda o: (jsonpath(o, p) or [""])[0])(jp)
        rt.is_storage = v is storage
        out.append(rt)
    return out
