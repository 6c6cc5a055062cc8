#!/usr/bin/python3
"""Progress of the long gkm cache commands (build, push, extract, merge,
capture) against a real registry (Debian's docker-registry), as a user sees
it: with stderr on a terminal (a pseudo-terminal here) each stage draws a
meter redrawn in place with "\\r" (bytes, of the total with a percentage
where it is known in advance, files, rate) and ends with one final line; a
failure ends the meter before the error is said, on a line of its own; with
stderr on a pipe nothing of it shows; with --log-format json each stage is
one JSON log line (stage, result, bytes, files, seconds) and no meter, even
on a terminal. The counts the final lines and the JSON lines give are
checked against the tree packed and the files extracted."""
import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import termios

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
GKM = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from proc import registry  # noqa: E402
from tap import Tap  # noqa: E402

H100 = os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "h100.json")
SIZE = rb"\d+(?:\.\d)? (?:B|KiB|MiB|GiB|TiB)"
# one redraw: "\r" STAGE DONE[ / TOTAL PCT%][  N files]  RATE/s[  ETA T] ESC[K
REDRAW = re.compile(rb"\r([a-z]+) +(" + SIZE + rb")(?: / (" + SIZE + rb") +(\d+)%)?"
                    rb"(?:  (\d+) files)?  (" + SIZE + rb")/s(?:  ETA \w+)?\x1b\[K")
# the last line: "\r" ESC[K STAGE: done, BYTES[, N files] in S.s (RATE/s)[; ...] "\n"
FINAL = re.compile(rb"\r\x1b\[K([a-z]+): (done,|stopped after) (" + SIZE + rb")(?:, (\d+) files)?"
                   rb" in \d+\.\ds \((" + SIZE + rb")/s\)(?:; [^\n]*)?\n")

t = Tap()
W = tempfile.mkdtemp(prefix="gkm-progress.")


def under_tty(args, cols=150):
    """Run args with stderr on a pseudo-terminal of cols columns (output
    processing off, so its bytes are gkm's): (exit code, stdout, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    out = tempfile.TemporaryFile()
    env = dict(os.environ, TERM="xterm")
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=slave, env=env)
    os.close(slave)
    err = b""
    while True:
        r, _, _ = select.select([master], [], [], 120)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    rc = p.wait(60)
    out.seek(0)
    return rc, out.read(), err


def piped(args):
    p = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, timeout=300,
                       env=dict(os.environ, TERM="xterm"))
    return p.returncode, p.stdout, p.stderr


def meter(err):
    """(redraws, finals, what is left) of a terminal's stderr, in order."""
    redraws = [m.groups() for m in REDRAW.finditer(err)]
    finals = [m.groups() for m in FINAL.finditer(err)]
    rest = FINAL.sub(b"", REDRAW.sub(b"", err))
    return redraws, finals, rest


def check_meter(name, rc, out, err, stages):
    """The stages drew their meters, each ended by one final line, and
    nothing else reached the terminal. The finals, by stage."""
    redraws, finals, rest = meter(err)
    t.ok(rc == 0, f"{name}: exits 0 with its stderr on a terminal", diag=err[-2000:])
    t.eq([f[0].decode() for f in finals], stages, f"{name}: one final line per stage, in order")
    drawn = {r[0].decode() for r in redraws}
    t.ok(set(stages) <= drawn, f"{name}: every stage redraws its meter with \\r (bytes, rate)",
         diag=err[:1500])
    t.ok(all(f[1] == b"done," for f in finals), f"{name}: every final line says done")
    t.ok(rest == b"" and err.endswith(b"\n"),
         f"{name}: the terminal holds only meters and final lines, and ends with one",
         diag=repr(rest[:800]))
    t.ok(b"\r" not in out and b"\x1b" not in out, f"{name}: stdout has no meter")
    return {f[0].decode(): f for f in finals}, redraws


def with_total(redraws, stage):
    """A redraw of stage showed a total and a percentage."""
    return any(r[0] == stage.encode() and r[2] and r[3] for r in redraws)


def json_stages(err):
    """The "stage done" records of JSON logs (each line must parse)."""
    recs = []
    for line in err.decode().splitlines():
        rec = json.loads(line)
        if rec.get("msg") == "stage done":
            recs.append(rec)
    return recs


def check_json(name, rc, err, stages):
    t.ok(rc == 0, f"{name} --log-format json: exits 0", diag=err[-2000:])
    try:
        recs = json_stages(err)
    except ValueError as e:
        t.ok(False, f"{name} --log-format json: every stderr line is JSON", diag=f"{e}\n{err[:2000]!r}")
        return {}
    t.eq([r.get("stage") for r in recs], stages, f"{name} --log-format json: one line per stage")
    good = all(r.get("result") == "ok" and r.get("bytes", "").isdigit() and
               r.get("files", "").isdigit() and re.fullmatch(r"\d+\.\d{3}", r.get("seconds", ""))
               for r in recs)
    t.ok(good, f"{name} --log-format json: each line has result ok, bytes, files and seconds",
         diag=recs)
    t.ok(b"\r" not in err, f"{name} --log-format json: no meter")
    return {r["stage"]: r for r in recs}


def count_files(top):
    return sum(len(fs) for _, _, fs in os.walk(top))


def tree_bytes(top):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)


def mib(size):
    """A meter's "12.3 MiB" in bytes (roughly)."""
    n, unit = size.decode().split()
    return float(n) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit)


def make_trees():
    trees = []
    for seed in (1, 2):
        top = os.path.join(W, f"tree{seed}")
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "spec", "lib", "gen_cache_tree.py"),
                        top, "--scale", "0.02", "--seed", str(seed)], check=True,
                       stdout=subprocess.DEVNULL)
        trees.append(os.path.join(top, "io.triton.cache"))
    return trees


def build_and_push(reg, tree):
    rc, out, err = under_tty([GKM, "cache", "build", tree, "-t", f"oci:{W}/lay:v1"])
    finals, redraws = check_meter("build to a layout", rc, out, err, ["pack", "upload"])
    t.ok(with_total(redraws, "pack") and with_total(redraws, "upload"),
         "build: pack and upload know their totals (the tree's bytes, the layer's)", diag=redraws)
    files = count_files(tree)
    pack = finals.get("pack") or (None,) * 5
    t.ok(pack[3] == str(files).encode() and mib(pack[2] or b"0 B") >= tree_bytes(tree) * 0.99,
         f"build: the pack line counts the tree's {files} files and its bytes", diag=pack)
    rc, out, err = piped([GKM, "cache", "build", tree, "-t", f"oci:{W}/lay2:v1"])
    t.ok(rc == 0 and err == b"", "build with stderr on a pipe: nothing on stderr", diag=err[:500])
    rc, _, err = piped([GKM, "cache", "build", tree, "-t", f"oci:{W}/lay3:v1", "--log-format", "json"])
    recs = check_json("build", rc, err, ["pack", "upload"])
    t.ok(recs.get("pack", {}).get("files") == str(files) and
         int(recs.get("pack", {}).get("bytes", "0")) >= tree_bytes(tree),
         "build --log-format json: pack counts the tree's files and bytes", diag=recs)

    rc, out, err = under_tty([GKM, "cache", "push", f"oci:{W}/lay:v1", f"{reg}/prog/a:v1"])
    check_meter("push from a layout to a registry", rc, out, err, ["push"])
    rc, out, err = under_tty([GKM, "cache", "push", f"{reg}/prog/a:v1", f"{reg}/prog/copy:v1"])
    finals, _ = check_meter("push between registries", rc, out, err, ["push"])
    rc, out, err = piped([GKM, "cache", "push", f"{reg}/prog/a:v1", f"oci:{W}/back:v1"])
    t.ok(rc == 0 and err == b"", "push with stderr on a pipe: nothing on stderr", diag=err[:500])
    rc, _, err = piped([GKM, "cache", "push", f"oci:{W}/lay:v1", f"{reg}/prog/j:v1",
                        "--log-format", "json"])
    check_json("push", rc, err, ["push"])


def extract(reg, tree):
    dest = os.path.join(W, "x1")
    rc, out, err = under_tty([GKM, "cache", "extract", f"{reg}/prog/a:v1", dest])
    finals, redraws = check_meter("extract", rc, out, err, ["extract"])
    t.ok(with_total(redraws, "extract"), "extract: the layers' size is its total", diag=redraws)
    n = count_files(dest) if os.path.isdir(dest) else -1
    got = (finals.get("extract") or (None,) * 5)[3]
    t.ok(got == str(n).encode(), f"extract: its final line counts the {n} files written", diag=got)
    rc, out, err = piped([GKM, "cache", "extract", f"{reg}/prog/a:v1", os.path.join(W, "x2")])
    t.ok(rc == 0 and err == b"", "extract with stderr on a pipe: nothing on stderr", diag=err[:500])
    dest = os.path.join(W, "x3")
    rc, _, err = piped([GKM, "cache", "extract", f"{reg}/prog/a:v1", dest, "--log-format", "json"])
    recs = check_json("extract", rc, err, ["extract"])
    t.ok(recs.get("extract", {}).get("files") == str(count_files(dest) if os.path.isdir(dest) else -1),
         "extract --log-format json: files is the files written", diag=recs)


def merge_and_capture(reg, trees):
    rc, _, err = piped([GKM, "cache", "build", trees[1], "-t", f"{reg}/prog/b:v1"])
    t.ok(rc == 0, "a second image, from another tree", diag=err[-500:])
    rc, out, err = under_tty([GKM, "cache", "merge", f"{reg}/prog/a:v1", f"{reg}/prog/b:v1",
                              "-t", f"{reg}/prog/m:v1"])
    check_meter("merge", rc, out, err, ["extract", "extract", "pack", "upload"])
    rc, _, err = piped([GKM, "cache", "merge", f"{reg}/prog/a:v1", f"{reg}/prog/b:v1",
                        "-t", f"{reg}/prog/m2:v1", "--log-format", "json"])
    check_json("merge", rc, err, ["extract", "extract", "pack", "upload"])
    cap = [GKM, "cache", "capture", "--gpu-file", H100, "--settle-ms", "0", "--from", trees[0]]
    rc, out, err = under_tty(cap + ["-t", f"{reg}/prog/cap:v1"])
    finals, _ = check_meter("capture", rc, out, err, ["pack", "upload"])
    got = (finals.get("pack") or (None,) * 5)[3]
    t.ok(got == str(count_files(trees[0])).encode(), "capture: pack counts the files captured",
         diag=got)
    rc, _, err = piped(cap + ["-t", f"{reg}/prog/cap2:v1", "--log-format", "json"])
    check_json("capture", rc, err, ["pack", "upload"])


def failure(reg):
    rc, out, err = under_tty([GKM, "cache", "push", f"{reg}/prog/none:v1", f"oci:{W}/none:v1"])
    t.ok(rc == 1, "push of a missing image fails", diag=err[-500:])
    t.ok(re.search(rb"\r\x1b\[Kpush: stopped after 0 B in [^\n]*\ngkm cache push: " +
                   re.escape(f"{reg}/prog/none:v1".encode()) + rb": ", err) is not None,
         "a stage that fails ends its meter, then the error is said on a line of its own",
         diag=repr(err[-800:]))


def main():
    try:
        addr, stop = registry(ROOT)
    except (RuntimeError, FileNotFoundError) as e:
        t.skip("progress against a registry", f"no registry: {e}")
        return
    try:
        trees = make_trees()
        build_and_push(addr, trees[0])
        extract(addr, trees[0])
        merge_and_capture(addr, trees)
        failure(addr)
    finally:
        stop()


if __name__ == "__main__":
    t.run("progress", main)
    shutil.rmtree(W, ignore_errors=True)
    sys.exit(t.finish())
