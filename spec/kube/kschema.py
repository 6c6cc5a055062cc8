"""OpenAPI v3 schema handling for the test API server: pruning of unknown
fields, defaulting, and validation with the error shapes of the real server
(field.Error: type, field, bad value, detail)."""
import datetime
import json
import re

OMIT = object()

# field.ErrorType -> (cause reason, text)
ERROR_TYPES = {
    "required": ("FieldValueRequired", "Required value"),
    "invalid": ("FieldValueInvalid", "Invalid value"),
    "typeinvalid": ("FieldValueTypeInvalid", "Invalid value"),
    "toolong": ("FieldValueTooLong", "Too long"),
    "toomany": ("FieldValueTooMany", "Too many"),
    "notsupported": ("FieldValueNotSupported", "Unsupported value"),
    "duplicate": ("FieldValueDuplicate", "Duplicate value"),
    "forbidden": ("FieldValueForbidden", "Forbidden"),
    "notfound": ("FieldValueNotFound", "Not found"),
}


class FieldError:
    __slots__ = ("type", "field", "bad", "detail")

    def __init__(self, typ, field, bad=OMIT, detail=""):
        self.type, self.field, self.bad, self.detail = typ, field, bad, detail

    @property
    def reason(self):
        return ERROR_TYPES[self.type][0]

    def body(self):
        text = ERROR_TYPES[self.type][1]
        if self.type in ("required", "forbidden", "toolong") or self.bad is OMIT:
            s = text
        else:
            s = "%s: %s" % (text, go_value(self.bad))
        if self.detail:
            s += ": " + self.detail
        return s

    def __str__(self):
        return "%s: %s" % (self.field, self.body())


def go_value(v):
    """A bad value the way Go's field errors print it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return go_number(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "map[string]interface {}{" + ", ".join(
            "%s:%s" % (json.dumps(k), go_literal(x)) for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[]interface {}{" + ", ".join(go_literal(x) for x in v) + "}"
    return str(v)


def go_literal(v):
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (dict, list)):
        return go_value(v)
    return go_value(v)


def go_number(v):
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e21:
            return str(int(v))
        return repr(v)
    return str(v)


def aggregate(errors):
    """errs.ToAggregate().Error()"""
    msgs = []
    for e in errors:
        s = str(e)
        if s not in msgs:
            msgs.append(s)
    if len(msgs) == 1:
        return msgs[0]
    return "[" + ", ".join(msgs) + "]"


# --------------------------------------------------------------- primitives

_re_cache = {}


def _regex(p):
    r = _re_cache.get(p)
    if r is None:
        r = re.compile(p)
        _re_cache[p] = r
    return r


_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def is_datetime(s):
    if not isinstance(s, str) or not _RFC3339.match(s):
        return False
    try:
        datetime.datetime.fromisoformat(s.replace("z", "Z").replace("Z", "+00:00")
                                        .replace("t", "T"))
    except ValueError:
        return False
    return True


def json_type(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _type_ok(v, t, sch):
    if sch.get("x-kubernetes-int-or-string"):
        return isinstance(v, (int, str)) and not isinstance(v, bool)
    if t is None:
        return True
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or \
            (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return True


def _join(path, name):
    return name if not path else path + "." + name


# --------------------------------------------------------- prune and default

def prune(value, sch, path="", unknown=None, root=False):
    """Drop fields the schema does not declare (and nulls it does not allow),
    recording the dropped paths in `unknown`. Returns the pruned value."""
    if sch is None:
        return value
    if isinstance(value, dict):
        if sch.get("x-kubernetes-preserve-unknown-fields"):
            props = sch.get("properties") or {}
            out = {}
            for k, v in value.items():
                out[k] = prune(v, props.get(k), _join(path, k), unknown) if k in props else v
            return out
        props = sch.get("properties")
        ap = sch.get("additionalProperties")
        if props is None and ap is None:
            if sch.get("type") == "object" or root:
                out = {}
                for k, v in value.items():
                    if root and k in ("apiVersion", "kind", "metadata"):
                        out[k] = v
                    elif unknown is not None:
                        unknown.append(_join(path, k))
                return out if not root else out
            return value
        out = {}
        for k, v in value.items():
            if root and k in ("apiVersion", "kind", "metadata"):
                out[k] = v
                continue
            if props is not None and k in props:
                cs = props[k]
            elif isinstance(ap, dict):
                cs = ap
            elif ap is True:
                out[k] = v
                continue
            else:
                if unknown is not None:
                    unknown.append(_join(path, k))
                continue
            if v is None and not cs.get("nullable") and "default" not in cs:
                continue
            out[k] = prune(v, cs, _join(path, k), unknown)
        return out
    if isinstance(value, list):
        isch = sch.get("items")
        if isinstance(isch, dict):
            return [prune(v, isch, "%s[%d]" % (path, i), unknown) for i, v in enumerate(value)]
    return value


def apply_defaults(value, sch):
    """Fill `default` values of absent (or null, non-nullable) fields."""
    if sch is None:
        return value
    if isinstance(value, dict):
        props = sch.get("properties") or {}
        for k, cs in props.items():
            if "default" in cs and (k not in value or (value[k] is None and not cs.get("nullable"))):
                value[k] = json.loads(json.dumps(cs["default"]))
        for k, v in list(value.items()):
            if k in props:
                value[k] = apply_defaults(v, props[k])
            elif isinstance(sch.get("additionalProperties"), dict):
                value[k] = apply_defaults(v, sch["additionalProperties"])
    elif isinstance(value, list) and isinstance(sch.get("items"), dict):
        for i, v in enumerate(value):
            value[i] = apply_defaults(v, sch["items"])
    return value


# ---------------------------------------------------------------- validation

def validate(value, sch, path="", errors=None, known=None):
    """Validate value against an OpenAPI v3 schema; returns FieldErrors.
    Subtrees identical (the same object) to `known`, a value validated
    before, are skipped."""
    if errors is None:
        errors = []
    if sch is None or (known is not None and value is known):
        return errors
    if value is None:
        if sch.get("nullable"):
            return errors
        t = sch.get("type")
        if t:
            # the real server names the bad value as the string "null"
            errors.append(FieldError("typeinvalid", path, "null",
                                     "%s in body must be of type %s: \"null\"" % (path, t)))
        return errors
    t = sch.get("type")
    if not _type_ok(value, t, sch):
        errors.append(FieldError("typeinvalid", path, value,
                                 "%s in body must be of type %s: %s" % (
                                     path, t, json.dumps(json_type(value)))))
        return errors
    if "enum" in sch and not any(_enum_eq(value, e) for e in sch["enum"]):
        errors.append(FieldError("notsupported", path, value,
                                 "supported values: " + ", ".join(
                                     go_literal(e) for e in sch["enum"])))
    if isinstance(value, str):
        _validate_string(value, sch, path, errors)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _validate_number(value, sch, path, errors)
    elif isinstance(value, list):
        _validate_array(value, sch, path, errors, known if isinstance(known, list) else None)
    elif isinstance(value, dict):
        _validate_object(value, sch, path, errors, known if isinstance(known, dict) else None)
    for sub in sch.get("allOf") or []:
        validate(value, sub, path, errors)
    return errors


def _enum_eq(a, b):
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _validate_string(v, sch, path, errors):
    if "maxLength" in sch and len(v) > sch["maxLength"]:
        errors.append(FieldError("toolong", path, v,
                                 "may not be longer than %d" % sch["maxLength"]))
    if "minLength" in sch and len(v) < sch["minLength"]:
        errors.append(FieldError("invalid", path, v, "%s in body should be at least %d chars long"
                                 % (path, sch["minLength"])))
    if "pattern" in sch and not _regex(sch["pattern"]).search(v):
        errors.append(FieldError("invalid", path, v, "%s in body should match '%s'"
                                 % (path, sch["pattern"])))
    fmt = sch.get("format")
    if fmt == "date-time" and not is_datetime(v):
        errors.append(FieldError("invalid", path, v, "%s in body must be of type date-time: %s"
                                 % (path, json.dumps(v))))


def _validate_number(v, sch, path, errors):
    if "minimum" in sch:
        lo = sch["minimum"]
        if (v <= lo) if sch.get("exclusiveMinimum") else (v < lo):
            errors.append(FieldError("invalid", path, v,
                                     "%s in body should be greater than %s%s" % (
                                         path, "" if sch.get("exclusiveMinimum") else "or equal to ",
                                         go_number(lo))))
    if "maximum" in sch:
        hi = sch["maximum"]
        if (v >= hi) if sch.get("exclusiveMaximum") else (v > hi):
            errors.append(FieldError("invalid", path, v,
                                     "%s in body should be less than %s%s" % (
                                         path, "" if sch.get("exclusiveMaximum") else "or equal to ",
                                         go_number(hi))))
    fmt = sch.get("format")
    if fmt == "int32" and not -2**31 <= v < 2**31:
        errors.append(FieldError("invalid", path, v, "%s in body must be of type int32: %s"
                                 % (path, json.dumps(go_number(v)))))


def _validate_array(v, sch, path, errors, known=None):
    if "maxItems" in sch and len(v) > sch["maxItems"]:
        errors.append(FieldError("toomany", path, len(v),
                                 "must have at most %d items" % sch["maxItems"]))
    if "minItems" in sch and len(v) < sch["minItems"]:
        errors.append(FieldError("invalid", path, len(v), "%s in body should have at least %d items"
                                 % (path, sch["minItems"])))
    isch = sch.get("items")
    for i, it in enumerate(v):
        validate(it, isch, "%s[%d]" % (path, i), errors,
                 known[i] if known is not None and i < len(known) else None)
    lt = sch.get("x-kubernetes-list-type")
    if lt == "map":
        keys = sch.get("x-kubernetes-list-map-keys") or []
        seen = set()
        for i, it in enumerate(v):
            if not isinstance(it, dict):
                continue
            k = json.dumps([it.get(x) for x in keys])
            if k in seen:
                errors.append(FieldError("duplicate", "%s[%d]" % (path, i),
                                         {x: it.get(x) for x in keys if x in it}))
            seen.add(k)
    elif lt == "set" or sch.get("uniqueItems"):
        seen = set()
        for i, it in enumerate(v):
            k = json.dumps(it, sort_keys=True)
            if k in seen:
                errors.append(FieldError("duplicate", "%s[%d]" % (path, i), it))
            seen.add(k)


def _validate_object(v, sch, path, errors, known=None):
    props = sch.get("properties") or {}
    ap = sch.get("additionalProperties")
    for k, x in v.items():
        kn = known.get(k) if known is not None else None
        if k in props:
            validate(x, props[k], _join(path, k), errors, kn)
        elif isinstance(ap, dict):
            validate(x, ap, _join(path, k), errors, kn)
    for r in sch.get("required") or []:
        if r not in v:
            errors.append(FieldError("required", _join(path, r)))
    if "maxProperties" in sch and len(v) > sch["maxProperties"]:
        errors.append(FieldError("toomany", path, len(v),
                                 "must have at most %d items" % sch["maxProperties"]))
    if "minProperties" in sch and len(v) < sch["minProperties"]:
        errors.append(FieldError("invalid", path, len(v),
                                 "%s in body should have at least %d properties"
                                 % (path, sch["minProperties"])))


def check_enum(value, allowed, field):
    """A required field limited to `allowed` values."""
    if value in allowed:
        return []
    if not value:
        return [FieldError("required", field)]
    return [FieldError("notsupported", field, value,
                       "supported values: " + ", ".join(json.dumps(a) for a in allowed))]


# ------------------------------------------------------ object meta rules

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                 "characters, '-' or '.', and must start and end with an alphanumeric "
                 "character (e.g. 'example.com', regex used for validation is "
                 "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
             "or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  "
             "or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
QNAME_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must "
             "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
             "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LVALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, "
              "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
              "'MyValue',  or 'my_value',  or '12345', regex used for validation is "
              "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def check_name(name, kind, field, prefix=False):
    """Name checks: kind is 'subdomain', 'label' or 'path'. Returns errors."""
    errs = []
    v = name
    if prefix and v.endswith("-"):
        v = v[:-1] + "a"
    if kind == "path":
        for bad in (".", ".."):
            if name == bad:
                errs.append(FieldError("invalid", field, name, "may not be '%s'" % bad))
        for ch in ("/", "%"):
            if ch in name:
                errs.append(FieldError("invalid", field, name, "may not contain '%s'" % ch))
        return errs
    if kind == "label":
        if len(v) > 63:
            errs.append(FieldError("invalid", field, name, "must be no more than 63 characters"))
        if not DNS1123_LABEL.match(v):
            errs.append(FieldError("invalid", field, name, LABEL_MSG))
        return errs
    if len(v) > 253:
        errs.append(FieldError("invalid", field, name, "must be no more than 253 characters"))
    if not DNS1123_SUBDOMAIN.match(v):
        errs.append(FieldError("invalid", field, name, SUBDOMAIN_MSG))
    return errs


def check_qualified_key(key, field):
    errs = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        pfx, name = parts
        if not pfx:
            errs.append(FieldError("invalid", field, key, "prefix part must be non-empty"))
        elif len(pfx) > 253 or not DNS1123_SUBDOMAIN.match(pfx):
            errs.append(FieldError("invalid", field, key, "prefix part " + SUBDOMAIN_MSG))
    else:
        return [FieldError("invalid", field, key,
                           "a qualified name must consist of alphanumeric characters, '-', '_' "
                           "or '.', and must start and end with an alphanumeric character (e.g. "
                           "'MyName',  or 'my.name',  or '123-abc', regex used for validation "
                           "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS "
                           "subdomain prefix and '/' (e.g. 'example.com/MyName')")]
    if not name:
        errs.append(FieldError("invalid", field, key, "name part must be non-empty"))
    elif len(name) > 63:
        errs.append(FieldError("invalid", field, key, "name part must be no more than 63 characters"))
    elif not QUALIFIED_NAME.match(name):
        errs.append(FieldError("invalid", field, key, QNAME_MSG))
    return errs


def check_meta(meta, name_kind, namespaced):
    """ObjectMeta validation shared by every kind (labels, annotations, owner
    references, finalizers). Returns FieldErrors."""
    errs = []
    labels = meta.get("labels")
    if labels is not None:
        if not isinstance(labels, dict):
            errs.append(FieldError("typeinvalid", "metadata.labels", labels, "must be an object"))
        else:
            for k, v in labels.items():
                errs += check_qualified_key(k, "metadata.labels")
                if not isinstance(v, str):
                    errs.append(FieldError("typeinvalid", "metadata.labels", v,
                                           "label values must be strings"))
                elif len(v) > 63:
                    errs.append(FieldError("invalid", "metadata.labels", v,
                                           "must be no more than 63 characters"))
                elif not LABEL_VALUE.match(v):
                    errs.append(FieldError("invalid", "metadata.labels", v, LVALUE_MSG))
    ann = meta.get("annotations")
    if ann is not None:
        if not isinstance(ann, dict):
            errs.append(FieldError("typeinvalid", "metadata.annotations", ann, "must be an object"))
        else:
            total = 0
            for k, v in ann.items():
                errs += check_qualified_key(k.lower(), "metadata.annotations")
                if not isinstance(v, str):
                    errs.append(FieldError("typeinvalid", "metadata.annotations", v,
                                           "annotation values must be strings"))
                else:
                    total += len(k) + len(v)
            if total > 256 * 1024:
                errs.append(FieldError("toolong", "metadata.annotations", OMIT,
                                       "may not be longer than %d" % (256 * 1024)))
    refs = meta.get("ownerReferences")
    if refs is not None:
        if not isinstance(refs, list):
            errs.append(FieldError("typeinvalid", "metadata.ownerReferences", refs, "must be a list"))
        else:
            controllers = 0
            for i, r in enumerate(refs):
                f = "metadata.ownerReferences[%d]" % i
                if not isinstance(r, dict):
                    errs.append(FieldError("typeinvalid", f, r, "must be an object"))
                    continue
                for req in ("apiVersion", "kind", "name", "uid"):
                    if not r.get(req):
                        if req == "uid":
                            errs.append(FieldError("invalid", f + ".uid", r.get("uid", ""), "uid must not be empty"))
                        elif req == "apiVersion":
                            errs.append(FieldError("invalid", f + ".apiVersion", r.get(req, ""), "version must not be empty"))
                        elif req == "kind":
                            errs.append(FieldError("invalid", f + ".kind", r.get(req, ""), "kind must not be empty"))
                        else:
                            errs.append(FieldError("invalid", f + ".name", r.get(req, ""), "name must not be empty"))
                if r.get("controller"):
                    controllers += 1
            if controllers > 1:
                errs.append(FieldError("invalid", "metadata.ownerReferences", refs,
                                       "Only one reference can have Controller set to true. "
                                       "Found \"true\" in references for multiple owners"))
    fins = meta.get("finalizers")
    if fins is not None:
        if not isinstance(fins, list) or not all(isinstance(x, str) for x in fins):
            errs.append(FieldError("typeinvalid", "metadata.finalizers", fins,
                                   "must be a list of strings"))
        else:
            for i, fz in enumerate(fins):
                errs += check_qualified_key(fz, "metadata.finalizers[%d]" % i) \
                    if "/" in fz or fz in ("orphan", "foregroundDeletion") else []
    return errs


OBJECT_META_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "selfLink": {"type": "string"},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer", "format": "int64"},
        "creationTimestamp": {"type": "string", "format": "date-time", "nullable": True},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "ownerReferences": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uid"],
            "items": {
                "type": "object",
                "required": ["apiVersion", "kind", "name", "uid"],
                "x-kubernetes-map-type": "atomic",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "name": {"type": "string"},
                    "uid": {"type": "string"},
                    "controller": {"type": "boolean"},
                    "blockOwnerDeletion": {"type": "boolean"},
                },
            },
        },
        "finalizers": {"type": "array", "x-kubernetes-list-type": "set",
                       "items": {"type": "string"}},
        "managedFields": {"type": "array", "items": {"type": "object",
                                                      "x-kubernetes-preserve-unknown-fields": True}},
    },
}
