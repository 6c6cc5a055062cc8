"""Child processes, process figures and loopback ports for the test and
benchmark scripts."""
import os
import signal
import socket
import subprocess
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + system CPU seconds of a process."""
    with open("/proc/%d/stat" % pid) as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def memory(pid):
    """VmRSS (RssAnon: the process's own, RssFile: mapped files, mostly
    shared libraries), VmHWM, PSS and private dirty in KiB."""
    out = {}
    with open("/proc/%d/status" % pid) as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])
    with open("/proc/%d/smaps_rollup" % pid) as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("Pss", "Private_Dirty"):
                out[k] = int(v.split()[0])
    return out


def free_port():
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*args):
    """Run a command; its stdout, or RuntimeError with its output."""
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p.stdout


def wait_for(fn, timeout):
    """Poll fn until it returns something true; that value, or None."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = fn()
        except Exception:  # noqa: BLE001 - not there yet
            v = None
        if v:
            return v
        time.sleep(0.1)
    return None


class Child:
    """A child process whose output goes to the file logpath."""

    def __init__(self, args, logpath):
        self.logpath = logpath
        self.log = open(logpath, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def tail(self, n=25):
        return "".join(open(self.logpath).readlines()[-n:])

    def stop(self):
        """SIGTERM (a graceful shutdown), SIGKILL after 30 s; the exit status."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    continue
        self.log.close()
        return self.proc.returncode


def registry(root, *mode):
    """Debian's docker-registry started through ROOT/spec/lib/registry.sh
    (mode: its registry_start arguments, e.g. "htpasswd", FILE): (its
    address host:port, a function that stops it)."""
    script = ('. "$0"; registry_start r "$@" >/dev/null || exit 1; echo "$REG_r_ADDR"; '
              'trap registry_stop_all EXIT; cat >/dev/null')
    p = subprocess.Popen(["bash", "-c", script, os.path.join(root, "spec", "lib", "registry.sh")] + list(mode),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    addr = p.stdout.readline().strip()

    def stop():
        p.stdin.close()
        p.wait(30)
    if not addr:
        stop()
        raise RuntimeError("the registry did not start")
    return addr, stop


def regproxy(root, upstream, workdir):
    """ROOT/spec/lib/regproxy.py in front of the registry upstream (its
    port file and log in workdir): (its address, control(fault): set the
    fault, stats(): its /_stats, stop())."""
    import json
    import urllib.request
    port_file = os.path.join(workdir, "regproxy.port")
    proc = Child(["/usr/bin/python3", os.path.join(root, "spec", "lib", "regproxy.py"), upstream, port_file],
                 os.path.join(workdir, "regproxy.log"))
    port = wait_for(lambda: open(port_file).read().strip(), 10)
    if not port:
        proc.stop()
        raise RuntimeError("regproxy did not start")
    addr = "127.0.0.1:" + port

    def control(fault):
        req = urllib.request.Request("http://%s/_control" % addr, data=json.dumps(fault).encode(), method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def stats():
        return json.loads(urllib.request.urlopen("http://%s/_stats" % addr, timeout=10).read())
    return addr, control, stats, proc.stop
