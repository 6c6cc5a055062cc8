"""Objects of the fault-injection API server: one lock, one resource version
counter, and per storage the objects, a bounded history of events (what a
watch resumes from; older versions are 410 Gone) and the open watches."""
import collections
import json
import os
import queue
import threading


class Watcher:
    """One watch stream: a filter (fn(obj) -> bool) and a queue of
    (type, object); None in the queue ends the stream."""

    def __init__(self, match):
        self.match = match
        self.q = queue.SimpleQueue()

    def offer(self, typ, obj, prev):
        now, before = self.match(obj), prev is not None and self.match(prev)
        if typ == "DELETED":
            if now:
                self.q.put(("DELETED", obj))
        elif now:
            self.q.put(("MODIFIED" if before else "ADDED", obj))
        elif before:
            # it left the selection: DELETED with the state it matched in
            md = dict(prev["metadata"], resourceVersion=obj["metadata"]["resourceVersion"])
            self.q.put(("DELETED", dict(prev, metadata=md)))

    def close(self):
        self.q.put(None)


class Store:
    def __init__(self, history=10000):
        self.lock = threading.RLock()
        self.rv = 1
        self.history_size = history
        self.objs = collections.defaultdict(dict)      # storage -> key -> object
        self.history = collections.defaultdict(collections.deque)  # (rv, type, obj, prev)
        self.floor = 1      # watches from versions before this one get 410
        self.watchers = collections.defaultdict(set)

    def get(self, storage, key):
        return self.objs[storage].get(key)

    def items(self, storage, prefix=""):
        """(key, object) in key order, keys beginning with prefix."""
        objs = self.objs[storage]
        return [(k, objs[k]) for k in sorted(objs) if k.startswith(prefix)]

    def commit(self, storage, key, obj):
        """Store obj, or delete the object at key when obj is None, at the
        next resource version; tell the watches. Lock held."""
        self.rv += 1
        prev = self.objs[storage].get(key)
        if obj is None:
            del self.objs[storage][key]
            obj = dict(prev, metadata=dict(prev["metadata"], resourceVersion=str(self.rv)))
            typ = "DELETED"
        else:
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objs[storage][key] = obj
            typ = "MODIFIED" if prev is not None else "ADDED"
        h = self.history[storage]
        h.append((self.rv, typ, obj, prev))
        if len(h) > self.history_size:
            self.floor = max(self.floor, h.popleft()[0])
        for w in self.watchers[storage]:
            w.offer(typ, obj, prev)
        return obj

    def watch(self, storage, w, rv):
        """Start Watcher w from resource version rv ("" or "0": with ADDED
        for every object there is now). False when the events after rv are
        no longer known (410 Gone)."""
        with self.lock:
            if rv in ("", "0"):
                for _k, o in self.items(storage):
                    if w.match(o):
                        w.q.put(("ADDED", o))
            elif int(rv) < self.floor:
                return False
            else:
                for e_rv, typ, obj, prev in self.history[storage]:
                    if e_rv > int(rv):
                        w.offer(typ, obj, prev)
            self.watchers[storage].add(w)
            return True

    def unwatch(self, storage, w):
        with self.lock:
            self.watchers[storage].discard(w)

    def compact(self):
        """Forget every event so far: watches from older versions get 410."""
        with self.lock:
            self.floor = self.rv
            self.history.clear()

    def close_watches(self):
        with self.lock:
            for ws in self.watchers.values():
                for w in ws:
                    w.close()
                ws.clear()

    def save(self, path):
        with self.lock:
            data = {"rv": self.rv, "objects": {s: o for s, o in self.objs.items() if o}}
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)

    def load(self, path):
        """Objects saved by a previous run; their history is not kept, so a
        watch from before the restart gets 410, as from a fresh watch cache."""
        with open(path) as fh:
            data = json.load(fh)
        with self.lock:
            for storage, objs in data["objects"].items():
                self.objs[storage].update(objs)
            self.rv = self.floor = max(self.rv, int(data["rv"]))
