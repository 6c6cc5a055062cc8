"""Decoding of Kubernetes protobuf request bodies (what kubectl's typed
clients send for `kubectl create namespace|configmap|secret ...`) into the
JSON form, for the few built-in kinds such requests carry.

The envelope is the 4 magic bytes "k8s\\0" and a runtime.Unknown message
(1: typeMeta {1: apiVersion, 2: kind}, 2: raw object bytes, 3:
contentEncoding, 4: contentType)."""
import base64
import datetime
import json

MAGIC = b"k8s\x00"


class ProtoError(ValueError):
    pass


def _varint(buf, i):
    shift = 0
    out = 0
    while True:
        if i >= len(buf):
            raise ProtoError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


def fields(buf):
    """Yield (number, wire type, value) of a message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ProtoError("truncated field %d" % num)
            v = buf[i:i + n]
            i += n
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ProtoError("unsupported wire type %d" % wt)
        yield num, wt, v


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _time(buf, micro=False):
    secs = nanos = 0
    for num, _wt, v in fields(buf):
        if num == 1:
            secs = _signed(v)
        elif num == 2:
            nanos = v
    t = datetime.datetime.fromtimestamp(secs, datetime.timezone.utc)
    if micro:
        return t.strftime("%Y-%m-%dT%H:%M:%S") + ".%06dZ" % (nanos // 1000)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# a schema maps field number -> (json name, kind); kinds: "s" string, "i"
# integer, "b" bool, "bytes" (base64), "time", "microtime", "rs" repeated
# string, "mss" map string->string, "msb" map string->bytes, "fields"
# (FieldsV1 raw JSON), a dict (message) or ("rep", dict) (repeated message).
OWNER = {1: ("kind", "s"), 3: ("name", "s"), 4: ("uid", "s"), 5: ("apiVersion", "s"),
         6: ("controller", "b"), 7: ("blockOwnerDeletion", "b")}
MANAGED = {1: ("manager", "s"), 2: ("operation", "s"), 3: ("apiVersion", "s"), 4: ("time", "time"),
           6: ("fieldsType", "s"), 7: ("fieldsV1", "fields"), 8: ("subresource", "s")}
META = {1: ("name", "s"), 2: ("generateName", "s"), 3: ("namespace", "s"), 4: ("selfLink", "s"),
        5: ("uid", "s"), 6: ("resourceVersion", "s"), 7: ("generation", "i"),
        8: ("creationTimestamp", "time"), 9: ("deletionTimestamp", "time"),
        10: ("deletionGracePeriodSeconds", "i"), 11: ("labels", "mss"), 12: ("annotations", "mss"),
        13: ("ownerReferences", ("rep", OWNER)), 14: ("finalizers", "rs"),
        17: ("managedFields", ("rep", MANAGED))}
OBJREF = {1: ("kind", "s"), 2: ("namespace", "s"), 3: ("name", "s"), 4: ("uid", "s"),
          5: ("apiVersion", "s"), 6: ("resourceVersion", "s"), 7: ("fieldPath", "s")}
KINDS = {
    ("v1", "Namespace"): {1: ("metadata", META), 2: ("spec", {1: ("finalizers", "rs")}),
                          3: ("status", {1: ("phase", "s")})},
    ("v1", "ConfigMap"): {1: ("metadata", META), 2: ("data", "mss"), 3: ("binaryData", "msb"),
                          4: ("immutable", "b")},
    ("v1", "Secret"): {1: ("metadata", META), 2: ("data", "msb"), 3: ("type", "s"),
                       4: ("stringData", "mss"), 5: ("immutable", "b")},
    ("v1", "Event"): {1: ("metadata", META), 2: ("involvedObject", OBJREF), 3: ("reason", "s"),
                      4: ("message", "s"), 5: ("source", {1: ("component", "s"), 2: ("host", "s")}),
                      6: ("firstTimestamp", "time"), 7: ("lastTimestamp", "time"), 8: ("count", "i"),
                      9: ("type", "s"), 10: ("eventTime", "microtime"), 12: ("action", "s"),
                      13: ("related", OBJREF), 14: ("reportingComponent", "s"),
                      15: ("reportingInstance", "s")},
    ("coordination.k8s.io/v1", "Lease"): {
        1: ("metadata", META),
        2: ("spec", {1: ("holderIdentity", "s"), 2: ("leaseDurationSeconds", "i"),
                     3: ("acquireTime", "microtime"), 4: ("renewTime", "microtime"),
                     5: ("leaseTransitions", "i")})},
}


def _message(buf, schema):
    out = {}
    for num, wt, v in fields(buf):
        spec = schema.get(num)
        if spec is None:
            continue
        name, kind = spec
        if isinstance(kind, dict):
            out[name] = _message(v, kind)
        elif isinstance(kind, tuple):
            out.setdefault(name, []).append(_message(v, kind[1]))
        elif kind == "s":
            if v:       # Go leaves empty strings out of the JSON form
                out[name] = v.decode("utf-8")
        elif kind == "i":
            out[name] = _signed(v) if wt == 0 else int.from_bytes(v, "little", signed=True)
        elif kind == "b":
            out[name] = bool(v)
        elif kind == "bytes":
            out[name] = base64.b64encode(v).decode()
        elif kind == "time":
            out[name] = _time(v)
        elif kind == "microtime":
            out[name] = _time(v, micro=True)
        elif kind == "rs":
            out.setdefault(name, []).append(v.decode("utf-8"))
        elif kind == "fields":
            raw = b""
            for n2, _w, v2 in fields(v):
                if n2 == 1:
                    raw = v2
            out[name] = json.loads(raw) if raw else {}
        elif kind in ("mss", "msb"):
            k = val = None
            for n2, _w, v2 in fields(v):
                if n2 == 1:
                    k = v2.decode("utf-8")
                elif n2 == 2:
                    val = v2
            val = val or b""
            out.setdefault(name, {})[k or ""] = (val.decode("utf-8") if kind == "mss"
                                                 else base64.b64encode(val).decode())
    return out


def decode(body):
    """A protobuf-encoded object as its JSON form; raises ProtoError."""
    if not body.startswith(MAGIC):
        raise ProtoError("the body does not start with the protobuf magic number")
    av = kind = ""
    raw = None
    for num, _wt, v in fields(body[len(MAGIC):]):
        if num == 1:
            for n2, _w, v2 in fields(v):
                if n2 == 1:
                    av = v2.decode("utf-8")
                elif n2 == 2:
                    kind = v2.decode("utf-8")
        elif num == 2:
            raw = v
    schema = KINDS.get((av, kind))
    if schema is None:
        raise ProtoError("no protobuf decoding for %s %s" % (av, kind))
    obj = {"apiVersion": av, "kind": kind}
    obj.update(_message(raw or b"", schema))
    return obj
