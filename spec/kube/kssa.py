"""Field ownership for the test API server: managed fields and server-side apply.

Implements the structured-merge semantics the real API server uses, on plain
JSON values guided by an OpenAPI v3 (structural) schema:

  * a field set is a Python set of paths; a path is a tuple of path elements
    written the way FieldsV1 writes them: "f:<field>", 'k:{"name":"x"}' (an
    item of a map-type list), 'v:"x"' (an item of a set-type list), "i:<n>";
  * maps are granular unless x-kubernetes-map-type is atomic, lists are atomic
    unless x-kubernetes-list-type is map or set (no schema: maps granular,
    lists atomic);
  * an Update takes the fields it added or changed from every other manager;
  * an Apply owns exactly the fields of its configuration, fails with a
    conflict when it would change a field another manager owns (unless
    forced), and removes the fields it applied last time and no longer applies
    when no other manager owns them.
"""
import json

MISSING = object()

# Fields no manager ever owns (the API server strips them from every set).
STRIP = frozenset([
    ("f:apiVersion",), ("f:kind",), ("f:metadata",),
    ("f:metadata", "f:name"), ("f:metadata", "f:namespace"),
    ("f:metadata", "f:creationTimestamp"), ("f:metadata", "f:selfLink"),
    ("f:metadata", "f:uid"), ("f:metadata", "f:clusterName"),
    ("f:metadata", "f:generation"), ("f:metadata", "f:managedFields"),
    ("f:metadata", "f:resourceVersion"),
])


class ApplyConflict(Exception):
    """Raised by apply(); conflicts is a sorted list of (manager key, path)."""

    def __init__(self, conflicts):
        super().__init__("apply conflict")
        self.conflicts = conflicts


# ---------------------------------------------------------------- schema view

def child_schema(sch, name):
    """Schema of field `name` of an object schema: (schema or None, named)."""
    if not sch:
        return None, False
    props = sch.get("properties")
    if props is not None and name in props:
        return props[name], True
    ap = sch.get("additionalProperties")
    if isinstance(ap, dict):
        return ap, False
    return None, False


def items_schema(sch):
    return sch.get("items") if sch else None


def list_type(sch):
    if not sch:
        return "atomic"
    return sch.get("x-kubernetes-list-type") or "atomic"


def map_is_atomic(sch):
    return bool(sch) and sch.get("x-kubernetes-map-type") == "atomic"


def _dumps(v):
    return json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def item_element(sch, item, index):
    """Path element of one item of a list whose schema is `sch`."""
    lt = list_type(sch)
    if lt == "map" and isinstance(item, dict):
        keys = sch.get("x-kubernetes-list-map-keys") or []
        return "k:" + _dumps({k: item[k] for k in keys if k in item})
    if lt == "set":
        return "v:" + _dumps(item)
    return "i:%d" % index


def same(a, b):
    """Deep equality that tells true from 1 and 1 from 1.0, as JSON does."""
    if a is b:
        return True
    if type(a) is not type(b):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and not isinstance(a, bool) and not isinstance(b, bool):
            return a == b
        return False
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return False
        return all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


# ------------------------------------------------------------- FieldsV1 codec

def _trie(paths, mark=None, value=True):
    """Nested dicts keyed by path element; `mark` flags a member path."""
    root = {}
    for p in paths:
        node = root
        for pe in p:
            node = node.setdefault(pe, {})
        node[mark] = value
    return root


def set_to_fields(paths):
    """Encode a set of paths as a FieldsV1 tree."""
    return _compact(_trie(paths, ".", {}))


def _compact(node):
    out = {}
    for k in sorted(node):
        if k == ".":
            continue
        out[k] = _compact(node[k])
    if "." in node and out:
        out = dict([(".", {})] + sorted(out.items()))
    return out


def fields_to_set(tree, prefix=(), out=None):
    """Decode a FieldsV1 tree into a set of paths; raises ValueError."""
    if out is None:
        out = set()
    if not isinstance(tree, dict):
        raise ValueError("FieldsV1 must be an object")
    for k, v in tree.items():
        if k == ".":
            out.add(prefix)
            continue
        if not isinstance(k, str) or len(k) < 2 or k[1] != ":" or k[0] not in "fkvi":
            raise ValueError("invalid path element %r" % (k,))
        p = prefix + (k,)
        if v == {}:
            out.add(p)
        else:
            fields_to_set(v, p, out)
    return out


def path_string(path):
    """A path the way conflict messages print it: .spec.nodes[name="a"].state"""
    s = []
    for pe in path:
        kind, rest = pe[0], pe[2:]
        if kind == "f":
            s.append("." + rest)
        elif kind == "k":
            kv = json.loads(rest)
            s.append("[" + ",".join("%s=%s" % (k, _dumps(kv[k])) for k in sorted(kv)) + "]")
        elif kind == "v":
            s.append("[=%s]" % rest)
        else:
            s.append("[%s]" % rest)
    return "".join(s)


# ---------------------------------------------------------------- field sets

def to_set(value, sch, path=(), out=None):
    """The fields an applied configuration sets (ToFieldSet)."""
    if out is None:
        out = set()
    if isinstance(value, dict):
        if not value or map_is_atomic(sch):
            if path:
                out.add(path)
            return out
        for k, v in value.items():
            csch, named = child_schema(sch, k)
            if csch is not None and not named:  # a map key is a member itself
                out.add(path + ("f:" + k,))
            to_set(v, csch, path + ("f:" + k,), out)
    elif isinstance(value, list):
        lt = list_type(sch)
        if lt == "atomic":
            out.add(path)
            return out
        isch = items_schema(sch)
        for i, it in enumerate(value):
            p = path + (item_element(sch, it, i),)
            out.add(p)
            if lt == "map" and isinstance(it, dict):
                for k, v in it.items():
                    to_set(v, child_schema(isch, k)[0], p + ("f:" + k,), out)
    else:
        out.add(path)
    return out


def _index_items(lst, sch):
    out = {}
    order = []
    if not isinstance(lst, list):
        return out, order
    for i, it in enumerate(lst):
        pe = item_element(sch, it, i)
        if pe not in out:
            order.append(pe)
        out[pe] = it
    return out, order


def compare(old, new, sch, path=(), added=None, modified=None, removed=None):
    """Paths added, modified and removed going from old to new (Compare)."""
    if added is None:
        added, modified, removed = set(), set(), set()
    if old is new and old is not MISSING:
        return added, modified, removed
    v = new if new is not MISSING else old
    # a null container compares like an empty one (its items are added)
    if isinstance(v, dict) and not map_is_atomic(sch) \
            and (old is MISSING or old is None or isinstance(old, dict)) \
            and (new is MISSING or isinstance(new, dict)):
        o = old if isinstance(old, dict) else {}
        n = new if isinstance(new, dict) else {}
        for k in list(o.keys()) + [k for k in n if k not in o]:
            compare(o.get(k, MISSING), n.get(k, MISSING), child_schema(sch, k)[0],
                    path + ("f:" + k,), added, modified, removed)
        if path:
            if old is MISSING:
                added.add(path)
            elif new is MISSING:
                removed.add(path)
        return added, modified, removed
    if isinstance(v, list) and list_type(sch) != "atomic" \
            and (old is MISSING or old is None or isinstance(old, list)) \
            and (new is MISSING or isinstance(new, list)):
        oi, oorder = _index_items(old, sch)
        ni, norder = _index_items(new, sch)
        isch = items_schema(sch) if list_type(sch) == "map" else None
        for pe in oorder + [pe for pe in norder if pe not in oi]:
            compare(oi.get(pe, MISSING), ni.get(pe, MISSING), isch,
                    path + (pe,), added, modified, removed)
        if path:
            if old is MISSING:
                added.add(path)
            elif new is MISSING:
                removed.add(path)
        return added, modified, removed
    if old is MISSING:
        added.add(path)
    elif new is MISSING:
        removed.add(path)
    elif not same(old, new):
        modified.add(path)
    return added, modified, removed


def subtract_recursive(paths, prefixes):
    """paths minus every path that equals or lies under one of prefixes."""
    if not prefixes:
        return paths
    pre = set(prefixes)
    out = set()
    for p in paths:
        if any(p[:i] in pre for i in range(1, len(p) + 1)):
            continue
        out.add(p)
    return out


def expand_named(paths, sch):
    """Add every ancestor that is a named field of a struct (so that owning a
    leaf also holds the struct fields above it)."""
    out = set(paths)
    for p in paths:
        s = sch
        for i, pe in enumerate(p[:-1]):
            if pe[0] == "f":
                csch, named = child_schema(s, pe[2:])
                if named:
                    out.add(p[:i + 1])
                s = csch
            else:
                s = items_schema(s)
    return out


# ------------------------------------------------------------------- merging

def merge(live, config, sch):
    """Merge an applied configuration into the live value (Merge). What the
    configuration does not change stays the very same object as in live."""
    if config is MISSING:
        return live
    if live is MISSING:
        return _copy(config)
    if isinstance(live, dict) and isinstance(config, dict) and not map_is_atomic(sch):
        out = None
        for k, v in config.items():
            old = live.get(k, MISSING)
            m = merge(old, v, child_schema(sch, k)[0])
            if m is not old:
                if out is None:
                    out = dict(live)
                out[k] = m
        return live if out is None else out
    if isinstance(live, list) and isinstance(config, list) and list_type(sch) in ("map", "set"):
        out = _merge_list(live, config, sch)
        if len(out) == len(live) and all(a is b for a, b in zip(out, live)):
            return live
        return out
    if same(live, config):
        return live
    return _copy(config)


def _copy(v):
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


def _merge_list(lhs, rhs, sch):
    """Associative list merge: keeps the applier's order for the items it
    names and slots the live-only items in where they were."""
    isch = items_schema(sch) if list_type(sch) == "map" else None
    lpe = [item_element(sch, it, i) for i, it in enumerate(lhs)]
    rpe = [item_element(sch, it, i) for i, it in enumerate(rhs)]
    lmap = dict(zip(lpe, lhs))
    rmap = dict(zip(rpe, rhs))
    shared = [pe for pe in rpe if pe in lmap]
    si = 0
    next_shared = shared[si] if shared else None
    done = set()
    out = []
    li = ri = 0
    while li < len(lpe) or ri < len(rpe):
        if li < len(lpe) and ri < len(rpe):
            pe = lpe[li]
            if pe == rpe[ri]:
                done.add(pe)
                out.append(merge(lmap[pe], rmap[pe], isch))
                li += 1
                ri += 1
                si += 1
                next_shared = shared[si] if si < len(shared) else None
                continue
            if pe in rmap and next_shared is not None and next_shared != pe:
                li += 1
                continue
        if li < len(lpe):
            pe = lpe[li]
            if pe not in rmap:
                out.append(lhs[li])
                li += 1
                continue
            if pe in done:
                li += 1
                continue
        if ri < len(rpe):
            pe = rpe[ri]
            done.add(pe)
            out.append(merge(lmap.get(pe, MISSING), rmap[pe], isch))
            ri += 1
            if next_shared is not None and next_shared == pe:
                si += 1
                next_shared = shared[si] if si < len(shared) else None
    return out


def remove_items(value, paths, sch, owned=frozenset()):
    """value without the given paths. A container emptied by the removal goes
    away with them, unless a manager owns the container itself (a map key, or
    a map or struct some configuration applied empty, {}): that one is left
    null, as kube-apiserver leaves it (kubernetes#117447), and validation then
    refuses the null where the schema wants a map or a list."""
    if not paths:
        return value
    r = _remove(value, _trie(paths), sch, (), owned)
    return r if r is not MISSING else {}


def _remove(v, trie, sch, path, owned):
    emptied = None if path in owned else MISSING
    if isinstance(v, dict) and v and not map_is_atomic(sch):
        out = {}
        for k, cv in v.items():
            node = trie.get("f:" + k)
            if node is None:
                out[k] = cv
                continue
            if node.get(None):
                continue
            r = _remove(cv, node, child_schema(sch, k)[0], path + ("f:" + k,), owned)
            if r is not MISSING:
                out[k] = r
        return out if out else emptied
    if isinstance(v, list) and v and list_type(sch) != "atomic":
        isch = items_schema(sch) if list_type(sch) == "map" else None
        out = []
        for i, it in enumerate(v):
            pe = item_element(sch, it, i)
            node = trie.get(pe)
            if node is None:
                out.append(it)
                continue
            if node.get(None):
                continue
            r = _remove(it, node, isch, path + (pe,), owned)
            if r is not MISSING:
                out.append(r)
        return out if out else emptied
    return MISSING if isinstance(v, (dict, list)) else v


# ------------------------------------------------------------ managed fields

class Managers:
    """Decoded metadata.managedFields: key -> entry dict plus its field set.

    A key is (manager, operation, subresource, apiVersion-for-Update) as the
    API server identifies managers: appliers keep their identity across API
    versions, updaters do not."""

    def __init__(self, entries=None):
        self.entries = {}
        for e in entries or []:
            if not isinstance(e, dict):
                raise ValueError("managedFields entries must be objects")
            fv1 = e.get("fieldsV1") or {}
            if e.get("fieldsType", "FieldsV1") != "FieldsV1":
                raise ValueError("unsupported fieldsType %r" % (e.get("fieldsType"),))
            key = self.key(e.get("manager", ""), e.get("operation", ""),
                           e.get("subresource", ""), e.get("apiVersion", ""))
            self.entries[key] = {"meta": e, "set": fields_to_set(fv1)}

    @staticmethod
    def key(manager, operation, subresource, api_version):
        return (manager, operation, subresource or "",
                api_version if operation == "Update" else "")

    def sets(self):
        return {k: v["set"] for k, v in self.entries.items()}

    def encode(self):
        out = []
        for key, v in self.entries.items():
            if not v["set"]:
                continue
            m = v["meta"]
            e = {"manager": key[0], "operation": key[1],
                 "apiVersion": m.get("apiVersion", ""), }
            if m.get("time"):
                e["time"] = m["time"]
            e["fieldsType"] = "FieldsV1"
            e["fieldsV1"] = set_to_fields(v["set"])
            if key[2]:
                e["subresource"] = key[2]
            out.append(e)
        out.sort(key=lambda e: (e["operation"], e.get("time", ""), e["manager"],
                                e["apiVersion"], e.get("subresource", "")))
        return out


def manager_label(key):
    """How a conflict message names a manager."""
    s = json.dumps(key[0])
    if key[2]:
        s += " with subresource %s" % json.dumps(key[2])
    if key[1] == "Update":
        s += " using %s" % key[3]
    return s


def _strip(paths, ignored):
    return subtract_recursive(paths - STRIP, ignored)


def update(managers, live, new, sch, manager, subresource, api_version, now, ignored=()):
    """Record an Update (create, PUT, non-apply PATCH) by `manager`."""
    old = live if live is not None else {}
    a, m, r = compare(old, new, sch)
    changed = _strip(a | m, ignored)
    r = _strip(r, ignored)
    key = Managers.key(manager, "Update", subresource, api_version)
    for k, ent in list(managers.entries.items()):
        if k == key:
            continue
        ent["set"] = ent["set"] - changed - r
        if not ent["set"]:
            del managers.entries[k]
    ent = managers.entries.get(key)
    prev = ent["set"] if ent else set()
    newset = (prev - r) | changed
    if not newset:
        managers.entries.pop(key, None)
        return
    meta = {"apiVersion": api_version}
    if changed or not ent:
        meta["time"] = now
    elif ent:
        meta["time"] = ent["meta"].get("time")
    managers.entries[key] = {"meta": meta, "set": newset}


def apply(managers, live, config, sch, manager, subresource, api_version, now,
          force, ignored=()):
    """Server-side apply of `config` onto `live` (None when creating).

    Returns the new object (without managedFields handling); updates
    `managers` in place; raises ApplyConflict."""
    base = live if live is not None else {}
    merged = merge(base, config, sch)
    key = Managers.key(manager, "Apply", subresource, api_version)
    last = managers.entries.get(key)
    last_set = last["set"] if last else None
    new_set = _strip(to_set(config, sch), ignored)
    if last_set and not last_set <= new_set:
        owned = set(new_set)
        for k, ent in managers.entries.items():
            if k != key:
                owned |= ent["set"]
        owned_e = expand_named(owned, sch)
        last_e = expand_named(last_set, sch)
        merged_e = expand_named(to_set(merged, sch), sch)
        gone = (merged_e & last_e) - owned_e
        merged = remove_items(merged, gone, sch, owned)
    a, m, r = compare(base, merged, sch)
    touched = subtract_recursive(a | m, ignored)
    r = subtract_recursive(r, ignored)
    conflicts = []
    for k, ent in managers.entries.items():
        if k == key:
            continue
        for p in ent["set"] & touched:
            conflicts.append((k, p))
    if conflicts and not force:
        conflicts.sort(key=lambda c: (c[0][0], path_string(c[1])))
        raise ApplyConflict(conflicts)
    for k, ent in list(managers.entries.items()):
        if k == key:
            continue
        ent["set"] = ent["set"] - touched - r
        if not ent["set"]:
            del managers.entries[k]
    if new_set:
        # the time moves only when the object changes
        if last is None or not same(base, merged):
            t = now
        else:
            t = last["meta"].get("time", now)
        managers.entries[key] = {"meta": {"apiVersion": api_version, "time": t},
                                 "set": new_set}
    else:
        managers.entries.pop(key, None)
    return merged


def conflict_message(conflicts):
    if len(conflicts) == 1:
        k, p = conflicts[0]
        return "Apply failed with 1 conflict: conflict with %s: %s" % (
            manager_label(k), path_string(p))
    by = {}
    for k, p in conflicts:
        by.setdefault(k, []).append(p)
    msgs = []
    for k in sorted(by, key=lambda k: json.dumps(list(k))):
        msgs.append("conflicts with %s:" % manager_label(k))
        for p in by[k]:
            msgs.append("- %s" % path_string(p))
    return "Apply failed with %d conflicts: %s" % (len(conflicts), "\n".join(msgs))
