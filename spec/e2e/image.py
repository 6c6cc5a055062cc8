#!/usr/bin/python3
"""The container image recipe (Containerfile) against the binary it ships.

No container engine runs here, so the image itself is not built; what can be
checked without one is checked: every shared library the built gkm binary
needs (its ELF NEEDED entries) comes from a Debian package that the runtime
stage installs; every package named exists in Debian 12 (apt-cache); the
build stage installs only packages of the Makefile's DEPS; the image runs as
the uid the chart expects; and `make image` without buildah or podman says
what to install instead of failing obscurely.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
GKM_BIN = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from tap import Tap  # noqa: E402

# In every Debian image already (Priority: required), so never listed.
BASE = {"libc6", "libgcc-s1"}

t = Tap()


def stages(text):
    """[(FROM line, [packages apt-get installs])] per stage."""
    out = []
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("FROM "):
            out.append((s, []))
        elif s.startswith("RUN ") and "apt-get install" in s and out:
            cmd = s.split("apt-get install", 1)[1].split("&&")[0]
            out[-1][1].extend(w for w in cmd.split() if not w.startswith("-"))
    return out


def makefile_deps():
    with open(os.path.join(ROOT, "Makefile")) as fh:
        text = fh.read().replace("\\\n", " ")
    m = re.search(r"^DEPS\s*:=(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def needed_packages(binary):
    """Debian packages providing the binary's NEEDED libraries: {soname: pkg}."""
    rd = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, timeout=30)
    sonames = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", rd.stdout)
    ld = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ld.stdout, re.M))
    # the dynamic loader itself shows in ldd without "=>": take it from ldconfig
    lc = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=30)
    for so, path in re.findall(r"^\s*(\S+) \([^)]*\) => (\S+)", lc.stdout, re.M):
        paths.setdefault(so, path)
    out = {}
    for so in sonames:
        path = os.path.realpath(paths.get(so, so))
        q = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, timeout=30)
        if q.returncode != 0:  # usrmerge: dpkg knows /lib, the loader says /usr/lib
            q = subprocess.run(["dpkg", "-S", path.replace("/usr/lib/", "/lib/", 1)],
                               capture_output=True, text=True, timeout=30)
        out[so] = q.stdout.split(":")[0] if q.returncode == 0 else None
    return out


def main():
    cf = os.path.join(ROOT, "Containerfile")
    with open(cf) as fh:
        text = fh.read()
    st = stages(text)
    t.ok(len(st) == 2 and "AS build" in st[0][0] and "-slim" in st[1][0]
         and "debian" in st[0][0] and "COPY --from=build" in text,
         "Containerfile: two stages, a Debian 12 builder and a Debian 12 slim runtime",
         diag=[s[0] for s in st])
    t.ok(re.search(r"^ARG DEBIAN_RELEASE=bookworm$", text, re.M) is not None,
         "Containerfile: the base is Debian 12 (bookworm)")
    build_pkgs, run_pkgs = (st[0][1], st[1][1]) if len(st) == 2 else ([], [])
    deps = makefile_deps()
    extra = sorted(set(build_pkgs) - deps)
    t.ok(build_pkgs and not extra, "build stage installs only packages of the Makefile's DEPS",
         diag="not in DEPS: %s" % extra)
    t.ok(not [p for p in run_pkgs if p.endswith("-dev")] and "build-essential" not in run_pkgs,
         "runtime stage installs no -dev packages or compilers", diag=run_pkgs)
    names = sorted(set(build_pkgs) | set(run_pkgs))
    q = subprocess.run(["apt-cache", "policy"] + names, capture_output=True, text=True, timeout=120)
    known = set(re.findall(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (?!\(none\))", q.stdout, re.M))
    missing = [p for p in names if p not in known]
    t.ok(not missing, "every package the Containerfile names exists in Debian 12 (apt-cache)",
         diag="unknown: %s" % missing)

    module = os.path.join(os.path.dirname(GKM_BIN), "gkm-csi.so")
    if os.access(GKM_BIN, os.X_OK) and os.path.exists(module):
        need = needed_packages(GKM_BIN)
        need.update(needed_packages(module))
        unknown = sorted(so for so, p in need.items() if p is None)
        lacking = sorted("%s (%s)" % (so, p) for so, p in need.items()
                         if p and p.split(":")[0] not in set(run_pkgs) | BASE)
        t.ok(not unknown and not lacking,
             "runtime stage installs the package of every library gkm links",
             diag="needs %s; " % sorted(need) + "no package: %s; not installed: %s" % (unknown, lacking))
    else:
        t.ok(False, "runtime stage installs the package of every library gkm links",
             diag="%s is not built" % GKM_BIN)

    m = re.findall(r"^USER\s+(\S+)", text, re.M)
    t.ok(m and m[-1] == "65532:65532", "the image runs as uid 65532, the chart's runAsUser",
         diag=m)
    t.ok(re.search(r'^ENTRYPOINT \["/usr/bin/gkm"\]', text, re.M) is not None,
         "the entrypoint is the gkm binary (the chart passes the subcommand as args)")
    with open(os.path.join(ROOT, ".containerignore")) as fh:
        ign = fh.read().split()
    t.ok("build/" in ign, ".containerignore keeps host build output out of the context")

    if shutil.which("buildah") or shutil.which("podman"):
        t.skip("make image without a container engine explains itself",
               "buildah or podman is installed here")
    else:
        p = subprocess.run(["make", "--no-print-directory", "-C", ROOT, "image", "BUILD=" + BUILD],
                           capture_output=True, text=True, timeout=60)
        t.ok(p.returncode != 0 and "neither buildah nor podman" in p.stderr
             and "buildah bud -f Containerfile" in p.stderr,
             "make image without a container engine says what to install and the command to run",
             diag=p.stdout + p.stderr)
    return t.finish()


if __name__ == "__main__":
    sys.exit(main())
