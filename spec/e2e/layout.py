#!/usr/bin/python3
"""The layout core/README.md promises: each folder of core/ includes only
the headers of the folders it may use (a lower layer never an upper one),
core/ never includes webhook/ or csi/, and every header is where one folder
owns it; no C file is over MAX_FILE lines, and no function over MAX_FUNC
unless the comment above it says why ("Long: ...")."""
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
MAX_FILE = 1200
MAX_FUNC = 120
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


def functions(path):
    """(name, first line, lines, the comment above) of each function
    definition: a signature at column 0 and its body from a "{" line to a
    "}" line at column 0."""
    lines = open(path).read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i] == "{":
            sig = i - 1
            while sig > 0 and lines[sig - 1].strip() and not lines[sig - 1].startswith(("}", "/*", " *", "#")) and not lines[sig].startswith(("static", "struct", "const", "void", "int", "bool", "char", "size_t", "double", "uint", "enum", "cJSON", "ssize_t", "pid_t", "unsigned", "long")):
                sig -= 1
            names = re.findall(r"(\w+)\s*\(", " ".join(lines[sig:i]))
            end = i + 1
            while end < len(lines) and lines[end] != "}":
                end += 1
            above = []
            j = sig - 1
            while j >= 0 and lines[j].startswith(("/*", " *")):
                above.insert(0, lines[j])
                j -= 1
            yield (names[0] if names else "?"), sig + 1, end - sig + 1, "\n".join(above)
            i = end
        i += 1


def sizes():
    big, long_ = [], []
    for top in ("core", "webhook", "csi"):
        for f in sources(top):
            if not f.endswith(".c"):
                continue
            rel = os.path.relpath(f, ROOT)
            n = open(f).read().count("\n")
            if n > MAX_FILE:
                big.append("%s: %d lines" % (rel, n))
            for name, line, count, above in functions(f):
                if count > MAX_FUNC and "Long:" not in above:
                    long_.append("%s:%d %s: %d lines" % (rel, line, name, count))
    t.ok(not big, "no C file is over %d lines" % MAX_FILE, diag=big)
    t.ok(not long_, "no function is over %d lines without a reason (Long: ...) above it" % MAX_FUNC, diag=long_)


t.run("layout", main)
t.run("sizes", sizes)
sys.exit(t.finish())
