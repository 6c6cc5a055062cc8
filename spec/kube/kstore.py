"""Object storage of the test API server: one lock, monotonically increasing
resource versions, per-resource bounded event histories (the watch cache)
and watchers with their own queues."""
import bisect
import collections
import queue
import threading


class Event:
    __slots__ = ("rv", "type", "obj", "prev", "cache")

    def __init__(self, rv, typ, obj, prev):
        self.rv, self.type, self.obj, self.prev = rv, typ, obj, prev
        self.cache = {}


class Watcher:
    """One watch stream: a filter and a queue of (type, obj, event).

    index: ("name", name) or ("label", key, value) when the filter requires
    that exact name or label (the store then offers it only the events of
    objects that have it), None otherwise."""

    def __init__(self, storage, match, index=None):
        self.storage = storage
        self.match = match          # fn(obj) -> bool
        self.index = index
        self.q = queue.SimpleQueue()
        self.closed = False

    def offer(self, ev):
        new_ok = ev.type != "DELETED" and self.match(ev.obj)
        old_ok = ev.prev is not None and self.match(ev.prev)
        if ev.type == "DELETED":
            if self.match(ev.obj):
                self.q.put(("DELETED", ev.obj, ev))
            return
        if new_ok and old_ok:
            self.q.put(("MODIFIED", ev.obj, ev))
        elif new_ok:
            self.q.put(("ADDED", ev.obj, ev))
        elif old_ok:
            # the object left the selection: a DELETED carrying the last state
            # it matched with, at the new resource version
            prev = dict(ev.prev)
            prev["metadata"] = dict(prev.get("metadata") or {}, resourceVersion=str(ev.rv))
            self.q.put(("DELETED", prev, ev))

    def close(self):
        self.closed = True
        self.q.put(None)


class WatchIndex:
    """The watchers of one storage, indexed so that a write is offered only to
    the watchers that may want it (not to every agent's watch)."""

    def __init__(self):
        self.general = set()
        self.keyed = collections.defaultdict(set)

    def add(self, w):
        (self.keyed[w.index] if w.index else self.general).add(w)

    def discard(self, w):
        if w.index:
            s = self.keyed.get(w.index)
            if s is not None:
                s.discard(w)
                if not s:
                    del self.keyed[w.index]
        else:
            self.general.discard(w)

    def __len__(self):
        return len(self.general) + sum(len(s) for s in self.keyed.values())

    def __iter__(self):
        yield from list(self.general)
        for s in list(self.keyed.values()):
            yield from list(s)

    def candidates(self, *objs):
        out = set(self.general)
        if not self.keyed:
            return out
        for o in objs:
            if o is None:
                continue
            md = o.get("metadata") or {}
            s = self.keyed.get(("name", md.get("name")))
            if s:
                out |= s
            for k, v in (md.get("labels") or {}).items():
                s = self.keyed.get(("label", k, v))
                if s:
                    out |= s
        return out


class Store:
    def __init__(self, history=10000, start_rv=1):
        self.lock = threading.RLock()
        self.rv = start_rv
        self.history_size = history
        self.objs = collections.defaultdict(dict)      # storage -> key -> obj
        self.keys = collections.defaultdict(list)      # storage -> sorted keys
        self.history = collections.defaultdict(collections.deque)
        self.start_rv = start_rv
        self.floor = {}    # storage -> every event after this version is kept
        self.watchers = collections.defaultdict(WatchIndex)
        self.uids = {}                                 # uid -> (storage, key)
        self.dependents = collections.defaultdict(set)  # owner uid -> {(storage, key)}

    # -- reads (call with the lock held or accept a racy snapshot)
    def get(self, storage, key):
        return self.objs[storage].get(key)

    def range(self, storage, prefix="", start=None):
        """Keys of a storage in key order, beginning with prefix, > start."""
        keys = self.keys[storage]
        lo = bisect.bisect_left(keys, start if start is not None and start > prefix else prefix)
        if start is not None and lo < len(keys) and keys[lo] == start:
            lo += 1
        for i in range(lo, len(keys)):
            k = keys[i]
            if not k.startswith(prefix):
                break
            yield k

    # -- writes (lock held)
    def commit(self, storage, key, obj, typ=None):
        """Store obj (or delete with obj None) at the next resource version."""
        self.rv += 1
        rv = self.rv
        objs = self.objs[storage]
        prev = objs.get(key)
        if obj is None:
            if prev is None:
                return None
            del objs[key]
            i = bisect.bisect_left(self.keys[storage], key)
            if i < len(self.keys[storage]) and self.keys[storage][i] == key:
                del self.keys[storage][i]
            md = dict(prev["metadata"], resourceVersion=str(rv))
            out = dict(prev, metadata=md)
            self._unindex(storage, key, prev)
            ev = Event(rv, "DELETED", out, prev)
        else:
            obj["metadata"]["resourceVersion"] = str(rv)
            if prev is None:
                bisect.insort(self.keys[storage], key)
            else:
                self._unindex(storage, key, prev)
            objs[key] = obj
            self._index(storage, key, obj)
            out = obj
            ev = Event(rv, typ or ("MODIFIED" if prev is not None else "ADDED"), obj, prev)
        h = self.history[storage]
        h.append(ev)
        while len(h) > self.history_size:
            old = h.popleft()
            self.floor[storage] = old.rv
        ws = self.watchers.get(storage)
        if ws:
            for w in ws.candidates(ev.obj, prev):
                if not w.closed:
                    w.offer(ev)
        return out

    def _index(self, storage, key, obj):
        md = obj["metadata"]
        if md.get("uid"):
            self.uids[md["uid"]] = (storage, key)
        for r in md.get("ownerReferences") or []:
            if isinstance(r, dict) and r.get("uid"):
                self.dependents[r["uid"]].add((storage, key))

    def _unindex(self, storage, key, obj):
        md = obj["metadata"]
        if md.get("uid") and self.uids.get(md["uid"]) == (storage, key):
            del self.uids[md["uid"]]
        for r in md.get("ownerReferences") or []:
            if isinstance(r, dict) and r.get("uid"):
                s = self.dependents.get(r["uid"])
                if s is not None:
                    s.discard((storage, key))
                    if not s:
                        del self.dependents[r["uid"]]

    def compact(self, storage=None):
        """Forget the event history (watches from older versions get 410)."""
        with self.lock:
            if storage is None:
                self.start_rv = self.rv
                for h in self.history.values():
                    h.clear()
            else:
                self.history[storage].clear()
                self.floor[storage] = self.rv

    def replay(self, storage, since):
        """Events after resource version `since`, or None if too old."""
        floor = max(self.floor.get(storage, 0), self.start_rv)
        if since < floor:
            return None
        return [ev for ev in self.history[storage] if ev.rv > since]

    def oldest(self, storage):
        return max(self.floor.get(storage, 0), self.start_rv) + 1
