"""Process figures and loopback ports for the test and benchmark scripts."""
import os
import socket

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
