"""What the tests of gkm csi behind a real kubelet share: where the chart
puts the plugin and its registrar on a node, and what the host sees of a
mount (findmnt) and of a tree of files."""
import json
import os
import subprocess

from proc import sh


def chart_node_paths(render, chart_dir, kubelet_dir, state, run):
    """What the chart's DaemonSet gives `gkm csi` and the registrar, rendered
    with paths.kubelet/state/run set to this node's directories: the host
    path of the plugin's socket (its --endpoint, through the plugin-dir
    volume), the socket the registrar hands the kubelet, the registration
    directory, the plugin's --root and --run-dir, and the CSIDriver object."""
    import yaml
    out = sh(render, "--release", "gkm", "--namespace", "gkm-system",
             "--set", "paths.kubelet=" + kubelet_dir, "--set", "paths.state=" + state,
             "--set", "paths.run=" + run, chart_dir)
    docs = [d for d in yaml.safe_load_all(out) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    ctrs = {c["name"]: c for c in spec["containers"]}

    def arg(ctr, flag):
        return next(a.split("=", 1)[1] for a in ctrs[ctr]["args"] if a.startswith(flag + "="))

    def on_host(ctr, path):
        """A container path as the host sees it, through the container's hostPath mounts."""
        for m in ctrs[ctr]["volumeMounts"]:
            mp = m["mountPath"].rstrip("/")
            if m["name"] in host and (path == mp or path.startswith(mp + "/")):
                return host[m["name"]] + path[len(mp):]
        raise KeyError("%s: %s is on no hostPath volume" % (ctr, path))
    endpoint = arg("csi", "--endpoint")
    return {
        "socket": on_host("csi", endpoint[len("unix://"):]),
        "registration_path": arg("node-driver-registrar", "--kubelet-registration-path"),
        "registration_dir": host["registration-dir"],
        "root": arg("csi", "--root"), "run": arg("csi", "--run-dir"),
        "csidriver": next(d for d in docs if d["kind"] == "CSIDriver"),
    }


def findmnt(target):
    """The mount at exactly target: {target, source, fstype, options}, or None."""
    p = subprocess.run(["findmnt", "-J", "-o", "TARGET,SOURCE,FSTYPE,OPTIONS", "--mountpoint", target],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    fs = json.loads(p.stdout)["filesystems"]
    return fs[-1] if fs else None


def tree(top):
    """{relative path: bytes} of every file below top."""
    out = {}
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, top)] = fh.read()
    return out
