#!/usr/bin/python3
"""The layout core/README.md promises: each folder of core/ includes only
the headers of the folders it may use (a lower layer never an upper one),
core/ never includes webhook/ or csi/, and every header is where one folder
owns it."""
import os
import re
import sys

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from tap import Tap  # noqa: E402

# what each folder may use (core/README.md)
MAY_USE = {
    "base": set(),
    "store": {"base"},
    "oci": {"base", "store"},
    "kube": {"base"},
    "gpu": {"base"},
    "cache": {"base", "store", "oci", "kube"},
    "lua": {"base", "store", "oci", "kube", "gpu", "cache"},
    "node": {"base", "store", "oci", "kube", "gpu", "cache", "lua"},
    "cmd": {"base", "store", "oci", "kube", "gpu", "cache", "lua", "node"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

t = Tap()


def sources(top):
    for sub, _, names in os.walk(os.path.join(ROOT, top)):
        for n in sorted(names):
            if n.endswith((".c", ".h")):
                yield os.path.join(sub, n)


def main():
    core = os.path.join(ROOT, "core")
    folders = sorted(d for d in os.listdir(core) if os.path.isdir(os.path.join(core, d)))
    t.ok(folders == sorted(MAY_USE), "core/ has the folders core/README.md names", diag=folders)
    owner = {}
    loose = [f for f in os.listdir(core) if f.endswith((".c", ".h"))]
    t.ok(not loose, "no C file is loose in core/ itself", diag=loose)
    for f in sources("core"):
        name = os.path.basename(f)
        if name.endswith(".h"):
            owner.setdefault(name, []).append(os.path.relpath(f, ROOT))
    twice = {k: v for k, v in owner.items() if len(v) > 1}
    t.ok(not twice, "each header name is in one folder only", diag=twice)
    for d in ("webhook", "csi"):
        for f in sources(d):
            if f.endswith(".h"):
                owner.setdefault(os.path.basename(f), []).append(os.path.relpath(f, ROOT))
    wrong = []
    for f in sources("core"):
        me = os.path.relpath(f, core).split(os.sep)[0]
        for inc in INCLUDE.findall(open(f).read()):
            where = owner.get(os.path.basename(inc))
            if not where:
                continue  # generated (build/gen) or a system header in quotes
            other = where[0].split("/")[1] if where[0].startswith("core/") else where[0].split("/")[0]
            if other != me and other not in MAY_USE.get(me, set()):
                wrong.append("%s includes %s (%s may not use %s)" % (os.path.relpath(f, ROOT), inc, me, other))
    t.ok(not wrong, "every folder of core/ includes only what core/README.md lets it use", diag=wrong)


t.run("layout", main)
sys.exit(t.finish())
