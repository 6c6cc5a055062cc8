#!/usr/bin/python3
"""The Helm chart (charts/gkm): every manifest it renders, under every switch.

Renders the chart with the test renderer (build/spec/gkm-chart-render, Helm's
template language on text/template + sprig) with the default values and with
each switch, then checks what a reviewer of a production chart would check:
every document is a Kubernetes object; only the node pod is privileged; probes
reach the health port each daemon is told to listen on; the CSI wiring
(sockets, registration, mount propagation) is what the kubelet needs; the
webhook fails closed, cannot lock the cluster, and its certificate really
verifies (OpenSSL); the RBAC allows exactly the calls listed in
spec/fixtures/rbac-calls.yaml; bad values fail with a clear message. Finally
everything is applied with the real kubectl (server-side apply) to a real
kube-apiserver (GKM_KUBE_ASSETS), CRDs included.
"""
import atexit
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from tap import Tap  # noqa: E402

import yaml  # noqa: E402

RENDER = os.path.join(BUILD, "spec", "gkm-chart-render")
# keyless trust as the README's example sets it (a GitHub Actions release workflow)
KEYLESS_ROOT = '{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}'
KEYLESS_RULES = [{"name": "release", "issuer": "https://token.actions.githubusercontent.com",
                  "subject": "https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main"}]
CHART = os.path.join(ROOT, "charts", "gkm")
GKM_BIN = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
RBAC_CALLS = os.path.join(ROOT, "spec", "fixtures", "rbac-calls.yaml")
GKM_SUBCOMMANDS = {"operator", "agent", "csi", "webhook"}
CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CSIDriver",
                 "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                 "CustomResourceDefinition"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}
DNS1123_SUB = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

t = Tap()
tmp = tempfile.mkdtemp(prefix="gkm-chart.")
atexit.register(shutil.rmtree, tmp, True)


# ------------------------------------------------------------------ helpers
def render(args=(), release="gkm", ns="gkm", chart=CHART, strict=True):
    cmd = [RENDER, "--release", release, "--namespace", ns] + list(args) + [chart]
    if strict:
        cmd.insert(1, "--strict")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def load_docs(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def write(name, text):
    p = os.path.join(tmp, name)
    with open(p, "w") as fh:
        fh.write(text)
    return p


def check(name, problems):
    """One TAP line for a list of problems (empty: ok)."""
    t.ok(not problems, name, diag="\n".join(problems[:40]))


def openssl(*args, data=None):
    return subprocess.run(["openssl"] + list(args), input=data, capture_output=True,
                          timeout=60)


def ident(d):
    m = d.get("metadata") or {}
    return "%s/%s %s/%s" % (d.get("apiVersion"), d.get("kind"), m.get("namespace", ""),
                            m.get("name"))


def pod_spec(d):
    return d["spec"]["template"]["spec"]


def containers(d):
    return pod_spec(d).get("containers", []) + pod_spec(d).get("initContainers", [])


def flag_value(args, flag):
    for a in args or []:
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def quantity(q):
    """A Kubernetes quantity as a float (cpu cores or bytes)."""
    s = str(q)
    units = {"m": 1e-3, "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            return float(s[:-len(u)]) * units[u]
    return float(s)


class Rendered:
    """One rendering of the chart and the indexes the checks use."""

    def __init__(self, name, docs, release, ns, opts):
        self.name, self.docs, self.release, self.ns, self.opts = name, docs, release, ns, opts
        self.by_kind = {}
        for d in docs:
            self.by_kind.setdefault(d.get("kind"), []).append(d)
        self.fullname = opts.get("fullname", release if "gkm" in release else release + "-gkm")

    def kind(self, k):
        return self.by_kind.get(k, [])

    def get(self, kind, name):
        for d in self.kind(kind):
            if d["metadata"]["name"] == name:
                return d
        return None

    def workloads(self):
        return [d for d in self.docs if d.get("kind") in WORKLOAD_KINDS]

    def container(self, cname):
        """(workload, container) of the container named cname."""
        for w in self.workloads():
            for c in containers(w):
                if c["name"] == cname:
                    return w, c
        return None, None

    def config(self):
        return (self.get("ConfigMap", "gkm-config") or {}).get("data") or {}


# ------------------------------------------------------------------ checks
def check_documents(r):
    probs, seen = [], set()
    for d in r.docs:
        if not isinstance(d, dict):
            probs.append("a document is not a mapping: %r" % (d,))
            continue
        m = d.get("metadata") or {}
        if not d.get("apiVersion") or not d.get("kind") or not m.get("name"):
            probs.append("missing apiVersion/kind/metadata.name: %s" % ident(d))
            continue
        if not DNS1123_SUB.match(m["name"]) or len(m["name"]) > 253:
            probs.append("%s: name is not a DNS subdomain" % ident(d))
        if d["kind"] in CLUSTER_KINDS:
            if "namespace" in m:
                probs.append("%s: cluster-scoped object with a namespace" % ident(d))
        elif m.get("namespace") != r.ns:
            probs.append("%s: not in the release namespace %s" % (ident(d), r.ns))
        if ident(d) in seen:
            probs.append("duplicate object %s" % ident(d))
        seen.add(ident(d))
    return probs


def check_labels(r):
    probs = []
    want = {"app.kubernetes.io/instance": r.release, "app.kubernetes.io/managed-by": "Helm",
            "app.kubernetes.io/part-of": "gkm"}
    for d in r.docs:
        labels = d["metadata"].get("labels") or {}
        for k, v in want.items():
            if labels.get(k) != v:
                probs.append("%s: label %s=%r, want %r" % (ident(d), k, labels.get(k), v))
        for k, v in labels.items():
            if len(str(v)) > 63:
                probs.append("%s: label %s longer than 63" % (ident(d), k))
    ws = r.workloads()
    for w in ws:
        sel = w["spec"]["selector"]["matchLabels"]
        pl = w["spec"]["template"]["metadata"]["labels"]
        if any(pl.get(k) != v for k, v in sel.items()):
            probs.append("%s: selector %s does not match its pod labels" % (ident(w), sel))
        for o in ws:
            if o is not w and all(o["spec"]["template"]["metadata"]["labels"].get(k) == v
                                  for k, v in sel.items()):
                probs.append("%s: selector also matches the pods of %s" % (ident(w), ident(o)))
    return probs


def check_security(r):
    probs = []
    node_ds = r.get("DaemonSet", r.fullname + "-node")
    privileged_ok = {"csi"} | ({"agent"} if r.opts.get("agent_privileged") else set())
    for w in r.workloads():
        ps = pod_spec(w)
        for k in ("hostNetwork", "hostPID", "hostIPC"):
            if ps.get(k):
                probs.append("%s: %s" % (ident(w), k))
        psc = ps.get("securityContext") or {}
        is_node = w is node_ds
        if not is_node:
            for v in ps.get("volumes", []):
                if "hostPath" in v:
                    probs.append("%s: hostPath volume %s outside the node pod" % (ident(w), v["name"]))
            if psc.get("runAsNonRoot") is not True:
                probs.append("%s: pod securityContext.runAsNonRoot is not true" % ident(w))
        for c in containers(w):
            sc = c.get("securityContext") or {}
            where = "%s container %s" % (ident(w), c["name"])
            priv = sc.get("privileged") is True
            seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if sc.get("readOnlyRootFilesystem") is not True:
                probs.append(where + ": readOnlyRootFilesystem is not true")
            if priv and not (is_node and c["name"] in privileged_ok):
                probs.append(where + ": privileged")
            if not priv:
                if sc.get("allowPrivilegeEscalation") is not False:
                    probs.append(where + ": allowPrivilegeEscalation is not false")
                if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                    probs.append(where + ": capabilities do not drop ALL")
                if (sc.get("capabilities") or {}).get("add"):
                    probs.append(where + ": adds capabilities")
                if seccomp != "RuntimeDefault":
                    probs.append(where + ": seccompProfile is not RuntimeDefault")
            if not is_node:
                if sc.get("runAsNonRoot") is not True or sc.get("runAsUser", 1) == 0:
                    probs.append(where + ": may run as root")
    if node_ds is None:
        probs.append("no node DaemonSet %s-node" % r.fullname)
    return probs


def check_resources(r):
    probs = []
    for w in r.workloads():
        for c in containers(w):
            res = c.get("resources") or {}
            for k in ("cpu", "memory"):
                req = (res.get("requests") or {}).get(k)
                lim = (res.get("limits") or {}).get(k)
                if req is None or lim is None:
                    probs.append("%s/%s: no %s request or limit" % (ident(w), c["name"], k))
                elif quantity(req) > quantity(lim):
                    probs.append("%s/%s: %s request above its limit" % (ident(w), c["name"], k))
            if not c.get("image") or ":" not in c["image"].rsplit("/", 1)[-1] and "@" not in c["image"]:
                probs.append("%s/%s: image %r has no tag or digest" % (ident(w), c["name"], c.get("image")))
    return probs


def port_of(c, ref):
    for p in c.get("ports", []):
        if p.get("name") == ref or p.get("containerPort") == ref:
            return p["containerPort"]
    return None


def check_probes(r):
    probs = []
    for w in r.workloads():
        seen = {}
        for c in containers(w):
            where = "%s/%s" % (ident(w), c["name"])
            for p in c.get("ports", []):
                if p["containerPort"] in seen:
                    probs.append("%s: port %d also used by %s" % (where, p["containerPort"],
                                                                  seen[p["containerPort"]]))
                seen[p["containerPort"]] = c["name"]
            args = c.get("args") or []
            if args and args[0] in GKM_SUBCOMMANDS:
                listen = flag_value(args, "--health-listen")
                if not listen or not re.match(r"^:\d+$", listen):
                    probs.append("%s: no --health-listen=:PORT" % where)
                    continue
                want = int(listen[1:])
                probes = [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]
            elif c["name"] == "node-driver-registrar":
                ep = flag_value(args, "--http-endpoint")
                want = int(ep.rsplit(":", 1)[1]) if ep else None
                probes = [("livenessProbe", "/healthz")]
            else:
                probs.append("%s: a container the checks do not know" % where)
                continue
            for kind, path in probes:
                hg = (c.get(kind) or {}).get("httpGet") or {}
                if hg.get("path") != path:
                    probs.append("%s: %s path %r, want %s" % (where, kind, hg.get("path"), path))
                got = port_of(c, hg.get("port"))
                if got != want:
                    probs.append("%s: %s port %r is %r, the daemon listens on %r" %
                                 (where, kind, hg.get("port"), got, want))
    return probs


def check_references(r):
    probs = []
    sas = {d["metadata"]["name"] for d in r.kind("ServiceAccount")}
    cms = {d["metadata"]["name"] for d in r.kind("ConfigMap")} | {"kube-root-ca.crt"}
    cms |= set(r.opts.get("external_configmaps", ()))
    secrets = {d["metadata"]["name"] for d in r.kind("Secret")}
    secrets |= {d["spec"]["secretName"] for d in r.kind("Certificate")}
    secrets |= set(r.opts.get("external_secrets", ()))
    for w in r.workloads():
        ps = pod_spec(w)
        if ps.get("serviceAccountName") not in sas:
            probs.append("%s: serviceAccountName %r not rendered" % (ident(w), ps.get("serviceAccountName")))
        vols = {}
        for v in ps.get("volumes", []):
            vols[v["name"]] = v
            srcs = [v] + [s for s in (v.get("projected") or {}).get("sources", [])]
            for s in srcs:
                if "configMap" in s and s["configMap"]["name"] not in cms:
                    probs.append("%s: volume %s names ConfigMap %s, not rendered" %
                                 (ident(w), v["name"], s["configMap"]["name"]))
                if "secret" in s and s["secret"]["secretName"] not in secrets:
                    probs.append("%s: volume %s names Secret %s, not rendered" %
                                 (ident(w), v["name"], s["secret"]["secretName"]))
        used = set()
        for c in containers(w):
            paths = set()
            for m in c.get("volumeMounts", []):
                used.add(m["name"])
                if m["name"] not in vols:
                    probs.append("%s/%s: mount of undefined volume %s" % (ident(w), c["name"], m["name"]))
                if m["mountPath"] in paths:
                    probs.append("%s/%s: two mounts at %s" % (ident(w), c["name"], m["mountPath"]))
                paths.add(m["mountPath"])
        for n in vols:
            if n not in used:
                probs.append("%s: volume %s is mounted nowhere" % (ident(w), n))
    return probs


def check_services(r):
    probs = []
    for s in r.kind("Service"):
        sel = s["spec"].get("selector") or {}
        match = [w for w in r.workloads()
                 if sel and all(w["spec"]["template"]["metadata"]["labels"].get(k) == v
                                for k, v in sel.items())]
        if len(match) != 1:
            probs.append("%s: selector matches %d workloads" % (ident(s), len(match)))
            continue
        names = {p.get("name") for c in containers(match[0]) for p in c.get("ports", [])}
        for p in s["spec"]["ports"]:
            if p.get("targetPort") not in names:
                probs.append("%s: targetPort %r is no container port of %s" %
                             (ident(s), p.get("targetPort"), ident(match[0])))
    return probs


def rbac_rules(r, sa):
    """[(rule, scope)] granted to ServiceAccount sa: scope None is cluster-wide
    (ClusterRoleBinding), else the namespace of the RoleBinding."""
    out = []
    subj = {"kind": "ServiceAccount", "name": sa, "namespace": r.ns}

    def has(b):
        return any(all(s.get(k) == v for k, v in subj.items()) for s in b.get("subjects", []))

    for b in r.kind("ClusterRoleBinding"):
        if has(b):
            role = r.get("ClusterRole", b["roleRef"]["name"])
            out += [(rule, None) for rule in (role or {}).get("rules", [])]
    for b in r.kind("RoleBinding"):
        if has(b):
            kind = b["roleRef"]["kind"]
            role = r.get(kind, b["roleRef"]["name"])
            if kind == "Role" and role and role["metadata"].get("namespace") != b["metadata"]["namespace"]:
                continue
            out += [(rule, b["metadata"]["namespace"]) for rule in (role or {}).get("rules", [])]
    return out


def allows(rule, verb, group, resource, name):
    return (verb in rule.get("verbs", []) and group in rule.get("apiGroups", []) and
            resource in rule.get("resources", []) and
            (not rule.get("resourceNames") or name in rule["resourceNames"]))


def load_calls(r):
    with open(RBAC_CALLS) as fh:
        calls = yaml.safe_load(fh)
    subst = {"fullname": r.fullname}
    if not r.opts.get("placement", True):
        calls["webhook"] = []  # without pod placement the webhook never calls the API
    for comp, lst in calls.items():
        for c in lst or []:
            if c.get("resourceName"):
                c["resourceName"] = c["resourceName"].format(**subst)
    return calls


def token_mounted(w, c):
    """Whether container c of workload w gets a ServiceAccount token."""
    ps = pod_spec(w)
    if ps.get("automountServiceAccountToken", True):
        return True
    vols = {v["name"]: v for v in ps.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        v = vols.get(m["name"]) or {}
        if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", [])):
            return True
    return False


def check_rbac_calls(r):
    """Each listed call allowed; nothing granted beyond the list."""
    probs = []
    calls = load_calls(r)
    user_ns = "some-user-namespace"
    for comp, lst in sorted(calls.items()):
        w, c = r.container(comp)
        if c is None:
            if comp == "webhook" and not r.opts.get("webhook", True):
                continue
            probs.append("component %s: no container of that name in the chart" % comp)
            continue
        if not lst:
            if token_mounted(w, c):
                probs.append("%s makes no API call but gets a ServiceAccount token" % comp)
            continue
        if not token_mounted(w, c):
            probs.append("%s makes API calls but gets no ServiceAccount token" % comp)
        sa = pod_spec(w)["serviceAccountName"]
        rules = rbac_rules(r, sa)
        for call in lst:
            if call.get("grantedBy"):  # allowed at run time, by what another component grants
                continue
            ns = {"cluster": None, "namespace": user_ns, "release": r.ns}[call["scope"]]
            ok = any(allows(rule, call["verb"], call["group"], call["resource"],
                            call.get("resourceName"))
                     and (scope is None or scope == ns)
                     for rule, scope in rules)
            if not ok:
                probs.append("%s: %s %s/%s%s (%s) is not allowed" % (
                    comp, call["verb"], call["group"] or "core", call["resource"],
                    " " + call["resourceName"] if call.get("resourceName") else "", call["scope"]))
        for rule, scope in rules:
            for key in ("apiGroups", "resources", "verbs"):
                if not rule.get(key):
                    probs.append("%s: rule without %s: %s" % (comp, key, rule))
            for verb in rule.get("verbs", []):
                for group in rule.get("apiGroups", []):
                    for res in rule.get("resources", []):
                        for name in rule.get("resourceNames") or [None]:
                            fits = [k for k in lst if not k.get("grantedBy") and k["verb"] == verb and
                                    k["group"] == group and
                                    k["resource"] == res and
                                    (k.get("resourceName") in (None, name))]
                            if scope is None:
                                fits = [k for k in fits if k["scope"] in ("cluster", "namespace")]
                            elif scope != r.ns:
                                fits = []
                            if not fits:
                                probs.append("%s: granted %s %s/%s%s %s, which is not in %s" % (
                                    comp, verb, group or "core", res,
                                    " " + name if name else "",
                                    "cluster-wide" if scope is None else "in " + scope,
                                    os.path.relpath(RBAC_CALLS, ROOT)))
    return probs


def check_rbac_structure(r):
    probs = []
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
             for d in r.kind("Role") + r.kind("ClusterRole")}
    sas = {d["metadata"]["name"] for d in r.kind("ServiceAccount")}
    for d in r.kind("Role") + r.kind("ClusterRole"):
        for rule in d.get("rules", []):
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                for v in rule.get(key) or []:
                    if "*" in v:
                        probs.append("%s: wildcard %r in %s" % (ident(d), v, key))
            if rule.get("nonResourceURLs"):
                probs.append("%s: nonResourceURLs" % ident(d))
            for v in rule.get("verbs", []):
                if v in ("escalate", "bind", "impersonate", "deletecollection"):
                    probs.append("%s: verb %s" % (ident(d), v))
            if rule.get("resourceNames") and "create" in rule.get("verbs", []):
                probs.append("%s: create cannot be limited by resourceNames" % ident(d))
    for b in r.kind("RoleBinding") + r.kind("ClusterRoleBinding"):
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if ref["kind"] == "Role" else None
        if (ref["kind"], ns, ref["name"]) not in roles:
            probs.append("%s: roleRef %s %s not rendered" % (ident(b), ref["kind"], ref["name"]))
        for s in b.get("subjects", []):
            if s.get("kind") != "ServiceAccount" or s.get("name") not in sas or s.get("namespace") != r.ns:
                probs.append("%s: subject %s is not a ServiceAccount of the release" % (ident(b), s))
    return probs


def mounts_by_path(c):
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def check_node(r):
    probs = []
    ds = r.get("DaemonSet", r.fullname + "-node")
    if ds is None:
        return ["no DaemonSet %s-node" % r.fullname]
    ps = pod_spec(ds)
    names = [c["name"] for c in ps["containers"]]
    if names != ["agent", "csi", "node-driver-registrar"]:
        probs.append("node pod containers %s, want agent, csi, node-driver-registrar" % names)
    cs = {c["name"]: c for c in ps["containers"]}
    vols = {v["name"]: v for v in ps.get("volumes", [])}
    kubelet = r.opts.get("kubelet", "/var/lib/kubelet")
    state = r.opts.get("state", "/var/lib/gkm")
    run = r.opts.get("run", "/run/gkm")
    plugin = kubelet + "/plugins/csi.gkm.io"

    def host(vname):
        return ((vols.get(vname) or {}).get("hostPath") or {}).get("path")

    agent, csi, reg = cs.get("agent", {}), cs.get("csi", {}), cs.get("node-driver-registrar", {})
    if (agent.get("args") or [None])[0] != "agent" or (csi.get("args") or [None])[0] != "csi":
        probs.append("agent/csi containers do not run `gkm agent` / `gkm csi`")
    if agent.get("image") != csi.get("image"):
        probs.append("agent and csi run different images")
    if "csi-node-driver-registrar" not in reg.get("image", ""):
        probs.append("registrar image %r" % reg.get("image"))
    # the CSI socket: the plugin serves it, the registrar tells the kubelet where it is
    endpoint = flag_value(csi.get("args"), "--endpoint") or ""
    sock_dir = os.path.dirname(endpoint[len("unix://"):]) if endpoint.startswith("unix://") else None
    m = mounts_by_path(csi).get(sock_dir)
    if not m or host(m["name"]) != plugin:
        probs.append("csi --endpoint %r is not in the host dir %s" % (endpoint, plugin))
    csi_addr = flag_value(reg.get("args"), "--csi-address") or ""
    m = mounts_by_path(reg).get(os.path.dirname(csi_addr))
    if not m or host(m["name"]) != plugin:
        probs.append("registrar --csi-address %r is not the plugin socket" % csi_addr)
    if flag_value(reg.get("args"), "--kubelet-registration-path") != plugin + "/csi.sock":
        probs.append("registrar --kubelet-registration-path is not %s/csi.sock" % plugin)
    m = mounts_by_path(reg).get("/registration")
    if not m or host(m["name"]) != kubelet + "/plugins_registry":
        probs.append("registrar /registration is not %s/plugins_registry" % kubelet)
    for c in (agent, csi):
        for flag, want in (("--root", state), ("--run-dir", run)):
            if flag_value(c.get("args"), flag) != want:
                probs.append("%s: %s=%r, want %s" % (c.get("name"), flag, flag_value(c.get("args"), flag), want))
    # mount propagation: Bidirectional only for the CSI plugin's pods dir
    for c in ps["containers"]:
        for mm in c.get("volumeMounts", []):
            prop = mm.get("mountPropagation")
            if prop == "Bidirectional" and not (c["name"] == "csi" and host(mm["name"]) == kubelet + "/pods"):
                probs.append("%s: Bidirectional propagation on %s" % (c["name"], mm["mountPath"]))
    m = mounts_by_path(csi).get(kubelet + "/pods")
    if not m or host(m["name"]) != kubelet + "/pods" or m.get("mountPropagation") != "Bidirectional":
        probs.append("csi: %s/pods is not mounted at the same path with Bidirectional propagation" % kubelet)
    # shared host paths, at the same path inside both containers
    for c, path, ro in ((agent, state, False), (csi, state, False), (csi, run, False), (agent, run, True)):
        m = mounts_by_path(c).get(path)
        if not m or host(m["name"]) != path:
            probs.append("%s: host path %s not mounted at %s" % (c.get("name"), path, path))
        elif bool(m.get("readOnly")) != ro:
            probs.append("%s: %s readOnly=%s, want %s" % (c.get("name"), path, m.get("readOnly"), ro))
        elif ro and m.get("mountPropagation") != "HostToContainer":
            probs.append("%s: read-only %s without HostToContainer" % (c.get("name"), path))
    # the GPU source, and the inventory file the file source reads
    gpu = r.opts.get("gpu", "nvml")
    if flag_value(agent.get("args"), "--gpu-source") != gpu:
        probs.append("agent --gpu-source=%s, want %s" % (flag_value(agent.get("args"), "--gpu-source"), gpu))
    gf = flag_value(agent.get("args"), "--gpu-file")
    if gpu == "file":
        vols_by_mount = {m["mountPath"]: vols.get(m["name"]) or {} for m in agent.get("volumeMounts", [])}
        src = vols_by_mount.get(gf) or vols_by_mount.get(os.path.dirname(gf or "")) or {}
        if "gpu_json" in r.opts:
            if src.get("configMap", {}).get("name") != "gkm-config" or os.path.basename(gf) != "gpus.json":
                probs.append("agent --gpu-file=%s is not gpus.json of gkm-config" % gf)
        elif (src.get("hostPath") or {}).get("type") != "File":
            probs.append("agent --gpu-file=%s is not a host file" % gf)
    elif gf:
        probs.append("agent --gpu-file with gpu.source=%s" % gpu)
    # only the agent talks to the API server
    for c in ps["containers"]:
        if token_mounted(ds, c) != (c["name"] == "agent"):
            probs.append("%s: ServiceAccount token mounted=%s" % (c["name"], token_mounted(ds, c)))
    for c, flag in ((agent, "--node"), (csi, "--node-id")):
        if flag_value(c.get("args"), flag) != "$(NODE_NAME)":
            probs.append("%s: %s is not the downward-API node name" % (c.get("name"), flag))
        env = {e["name"]: e for e in c.get("env", [])}
        if ((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
            probs.append("%s: NODE_NAME is not spec.nodeName" % c.get("name"))
    return probs


def check_csidriver(r):
    d = r.get("CSIDriver", "csi.gkm.io")
    if d is None:
        return ["no CSIDriver csi.gkm.io"]
    s, probs = d["spec"], []
    if s.get("attachRequired") is not False:
        probs.append("attachRequired is not false")
    if s.get("podInfoOnMount") is not True:
        probs.append("podInfoOnMount is not true")
    if s.get("volumeLifecycleModes") != ["Ephemeral", "Persistent"]:
        probs.append("volumeLifecycleModes %r" % s.get("volumeLifecycleModes"))
    return probs


def check_webhook(r):
    probs = []
    name = r.fullname + "-webhook"
    cfgs = r.kind("MutatingWebhookConfiguration") + r.kind("ValidatingWebhookConfiguration")
    if not r.opts.get("webhook", True):
        if cfgs or r.get("Deployment", name):
            probs.append("webhook.enabled=false still renders the webhook")
        return probs
    if len(cfgs) != 2:
        return ["%d webhook configurations, want 2" % len(cfgs)]
    dep, svc = r.get("Deployment", name), r.get("Service", name)
    if not dep or not svc:
        return ["webhook Deployment or Service %s missing" % name]
    wc = pod_spec(dep)["containers"][0]
    listen = int(flag_value(wc["args"], "--listen").lstrip(":"))
    wvols = {v["name"]: v for v in pod_spec(dep).get("volumes", [])}
    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        path = flag_value(wc["args"], flag) or ""
        m = mounts_by_path(wc).get(os.path.dirname(path))
        sec = ((wvols.get(m["name"]) if m else None) or {}).get("secret", {}).get("secretName")
        if sec != name + "-tls" or os.path.basename(path) != key:
            probs.append("webhook %s=%s is not %s of Secret %s-tls" % (flag, path, key, name))
    deadline = int(flag_value(wc["args"], "--deadline-ms") or 0)
    timeouts = {int(wh.get("timeoutSeconds", 0)) for cfg in cfgs for wh in cfg["webhooks"]}
    if not deadline or any(deadline >= 1000 * x for x in timeouts):
        probs.append("webhook --deadline-ms=%d is not below timeoutSeconds %s" % (deadline, timeouts))
    auth = flag_value(wc["args"], "--authfile")
    if r.opts.get("registry_auth"):
        m = mounts_by_path(wc).get(os.path.dirname(auth or ""))
        sec = ((wvols.get(m["name"]) if m else None) or {}).get("secret", {})
        if sec.get("secretName") != r.opts["registry_auth"] or \
                {"key": ".dockerconfigjson", "path": os.path.basename(auth)} not in sec.get("items", []):
            probs.append("webhook --authfile=%s is not .dockerconfigjson of Secret %s" %
                         (auth, r.opts["registry_auth"]))
    elif auth:
        probs.append("webhook --authfile without registry.authSecret")
    if flag_value(wc["args"], "--registry-plain-http") != r.opts.get("plain_http"):
        probs.append("webhook --registry-plain-http=%r" % flag_value(wc["args"], "--registry-plain-http"))
    cert_mgr = r.opts.get("cert_manager", False)
    ca_pem = None
    if not cert_mgr:
        sec = r.get("Secret", name + "-tls")
        if not sec:
            return ["no Secret %s-tls" % name]
        data = {k: base64.b64decode(v) for k, v in sec["data"].items()}
        ca_pem = data["ca.crt"]
        cafile, crtfile = write("ca.pem", ca_pem.decode()), write("tls.pem", data["tls.crt"].decode())
        host = "%s.%s.svc" % (name, r.ns)
        v = openssl("verify", "-CAfile", cafile, "-purpose", "sslserver", "-verify_hostname", host, crtfile)
        if v.returncode != 0:
            probs.append("serving certificate does not verify for %s: %s" % (host, v.stdout + v.stderr))
        k = openssl("pkey", "-pubout", data=data["tls.key"])
        x = openssl("x509", "-noout", "-pubkey", "-in", crtfile)
        if k.returncode != 0 or k.stdout != x.stdout:
            probs.append("tls.key is not the key of tls.crt")
    else:
        certs = r.kind("Certificate")
        if len(certs) != 1:
            return ["%d cert-manager Certificates, want 1" % len(certs)]
        cert = certs[0]
        if cert["spec"]["secretName"] != name + "-tls":
            probs.append("Certificate secretName %s" % cert["spec"]["secretName"])
        if "%s.%s.svc" % (name, r.ns) not in cert["spec"]["dnsNames"]:
            probs.append("Certificate does not cover the Service name")
        ref = cert["spec"]["issuerRef"]
        if r.opts.get("issuer"):
            if ref != r.opts["issuer"]:
                probs.append("issuerRef %r, want %r" % (ref, r.opts["issuer"]))
            if r.kind("Issuer"):
                probs.append("an Issuer is rendered although issuerRef names one")
        elif not r.get("Issuer", ref.get("name")) or ref.get("kind") != "Issuer":
            probs.append("issuerRef %r is no rendered Issuer" % ref)
        if r.kind("Secret"):
            probs.append("a self-signed Secret is rendered next to cert-manager")
    for cfg in cfgs:
        where = ident(cfg)
        ann = (cfg["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
        if cert_mgr and ann != "%s/%s" % (r.ns, r.kind("Certificate")[0]["metadata"]["name"]):
            probs.append("%s: inject-ca-from %r" % (where, ann))
        if not cert_mgr and ann:
            probs.append("%s: inject-ca-from without cert-manager" % where)
        pods = [wh for wh in cfg["webhooks"] if wh["name"].startswith("pods")]
        probs += check_pod_webhooks(r, cfg, pods)
        for wh in cfg["webhooks"]:
            if not 1 <= int(wh.get("timeoutSeconds", 0)) <= 30:
                probs.append("%s: timeoutSeconds %r" % (where, wh.get("timeoutSeconds")))
            if wh.get("admissionReviewVersions") != ["v1"]:
                probs.append("%s: admissionReviewVersions" % where)
            if wh not in pods:
                probs += check_cache_webhook(r, where, wh)
            s = wh["clientConfig"].get("service") or {}
            if (s.get("name"), s.get("namespace"), s.get("port")) != (name, r.ns, 443):
                probs.append("%s: clientConfig.service %r" % (where, s))
            sp = [p for p in svc["spec"]["ports"] if p["port"] == 443]
            if not sp or port_of(wc, sp[0]["targetPort"]) != listen:
                probs.append("%s: Service port 443 does not reach --listen :%d" % (where, listen))
            ca = wh["clientConfig"].get("caBundle")
            if cert_mgr and ca:
                probs.append("%s: caBundle set although cert-manager injects it" % where)
            if not cert_mgr and (not ca or base64.b64decode(ca) != ca_pem):
                probs.append("%s: caBundle is not the CA of the serving certificate" % where)
    return probs


def check_cache_webhook(r, where, wh):
    """A webhook of the caches: fails closed, no side effects, system and
    release namespaces excluded, gkm.io caches only."""
    probs = []
    if wh.get("failurePolicy") != "Fail":
        probs.append("%s: failurePolicy %r" % (where, wh.get("failurePolicy")))
    if wh.get("sideEffects") != "None":
        probs.append("%s: sideEffects %r" % (where, wh.get("sideEffects")))
    exprs = (wh.get("namespaceSelector") or {}).get("matchExpressions") or []
    excluded = set()
    for e in exprs:
        if e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn":
            excluded |= set(e.get("values", []))
    for ns in (r.ns, "kube-system"):
        if ns not in excluded:
            probs.append("%s: namespaceSelector does not exclude %s" % (where, ns))
    rules = wh.get("rules", [])
    covered = {(g, res, op) for rl in rules for g in rl["apiGroups"]
               for res in rl["resources"] for op in rl["operations"]}
    for res in ("gkmcaches", "clustergkmcaches"):
        for op in ("CREATE", "UPDATE"):
            if ("gkm.io", res, op) not in covered:
                probs.append("%s: does not review %s %s" % (where, op, res))
    for rl in rules:
        if rl["apiGroups"] != ["gkm.io"] or any("/" in x or "*" in x for x in rl["resources"]):
            probs.append("%s: a rule beyond gkm.io caches: %s" % (where, rl))
    return probs


def check_pod_webhooks(r, cfg, pods):
    """Pod placement: in the mutating configuration only, opt-in (namespace
    label, or pod label elsewhere, never both), system and release namespaces
    excluded, failing open; with matchConditions (Kubernetes 1.30+) only pods
    that mount a cache, and those with image volumes failing closed."""
    probs = []
    where = ident(cfg)
    mutating = cfg["kind"] == "MutatingWebhookConfiguration"
    cel = r.opts.get("kube_version", "1.28") >= "1.30"
    want = set()
    if mutating and r.opts.get("placement", True):
        want = {"pods.placement.gkm.io", "pods-optin.placement.gkm.io"}
        if cel:
            want |= {"pods.imagevolumes.gkm.io", "pods-optin.imagevolumes.gkm.io"}
    got = {wh["name"] for wh in pods}
    if got != want:
        probs.append("%s: pod webhooks %s, want %s" % (where, sorted(got), sorted(want)))
    scopes = set()
    for wh in pods:
        w = "%s %s" % (where, wh["name"])
        image = ".imagevolumes." in wh["name"]
        if wh.get("failurePolicy") != ("Fail" if image else "Ignore"):
            probs.append("%s: failurePolicy %r" % (w, wh.get("failurePolicy")))
        if wh.get("sideEffects") != "NoneOnDryRun":
            probs.append("%s: sideEffects %r (it records Events)" % (w, wh.get("sideEffects")))
        if wh.get("reinvocationPolicy") != "IfNeeded":
            probs.append("%s: not reinvoked after later webhooks" % w)
        if (wh["clientConfig"].get("service") or {}).get("path") != "/mutate-pods":
            probs.append("%s: path %r" % (w, wh["clientConfig"].get("service")))
        rules = [(tuple(rl["apiGroups"]), tuple(rl["resources"]), tuple(rl["operations"]))
                 for rl in wh.get("rules", [])]
        if rules != [(("",), ("pods",), ("CREATE",))]:
            probs.append("%s: rules %r, want pods CREATE only" % (w, rules))
        exprs = (wh.get("namespaceSelector") or {}).get("matchExpressions") or []
        excluded = {v for e in exprs if e.get("key") == "kubernetes.io/metadata.name"
                    and e.get("operator") == "NotIn" for v in e.get("values", [])}
        if not {r.ns, "kube-system"} <= excluded:
            probs.append("%s: does not exclude %s and kube-system" % (w, r.ns))
        opt = [(e["operator"], tuple(e["values"])) for e in exprs if e.get("key") == "gkm.io/placement"]
        scopes.add((wh["name"].split(".")[0], tuple(opt),
                    json.dumps(wh.get("objectSelector"), sort_keys=True)))
        conds = [c["expression"] for c in wh.get("matchConditions") or []]
        if cel and not any("has(v.image)" in c for c in conds):
            probs.append("%s: no matchConditions on image volumes" % w)
        if not cel and conds:
            probs.append("%s: matchConditions before Kubernetes 1.30" % w)
    if pods and scopes != {
            ("pods", (("In", ("enabled",)),),
             json.dumps({"matchExpressions": [{"key": "gkm.io/placement", "operator": "NotIn",
                                               "values": ["disabled"]}]}, sort_keys=True)),
            ("pods-optin", (("NotIn", ("enabled",)),),
             json.dumps({"matchLabels": {"gkm.io/placement": "enabled"}}, sort_keys=True))}:
        probs.append("%s: pod opt-in selectors %r" % (where, sorted(scopes)))
    return probs


def check_config(r):
    probs = []
    cfg = r.config()
    want = {"verify-enabled": str(r.opts.get("verify", True)).lower(),
            "allow-unsigned-images": "false"}
    if "gpu_json" in r.opts:
        want["gpus.json"] = r.opts["gpu_json"]
    got = dict(cfg)
    if "gpus.json" in got:
        got["gpus.json"] = json.loads(got["gpus.json"])
    if got != want:
        probs.append("gkm-config data %s, want %s" % (sorted(got), sorted(want)))
    # --verify-enabled: the agent checks on the node, the operator reports it;
    # the operator resolves digests itself when no webhook does
    verify = r.opts.get("verify", True)
    for comp, flag, want_v in (("agent", "--verify-enabled", verify),
                               ("operator", "--verify-enabled", verify),
                               ("operator", "--resolve-digests", not r.opts.get("webhook", True))):
        w, c = r.container(comp)
        if c is not None and flag_value(c.get("args"), flag) != str(want_v).lower():
            probs.append("%s %s=%s, want %s" % (
                comp, flag, flag_value(c.get("args"), flag), str(want_v).lower()))
    pol = (r.get("ConfigMap", "gkm-policies") or {}).get("data") or {}
    want_pol = {}
    for f in sorted(os.listdir(os.path.join(ROOT, "policies"))):
        if f.endswith(".lua"):
            with open(os.path.join(ROOT, "policies", f)) as fh:
                want_pol[f] = fh.read()
    want_pol.update(r.opts.get("policy_overrides", {}))
    if pol != want_pol:
        probs.append("gkm-policies keys %s, want exactly policies/*.lua %s (byte for byte)" %
                     (sorted(pol), sorted(want_pol)))
    keys = r.opts.get("trust_keys_data")
    tk = r.get("ConfigMap", r.opts.get("trust_keys", r.fullname + "-trust-keys"))
    if r.opts.get("external_configmaps"):
        if tk is not None:
            probs.append("a trust keys ConfigMap is rendered although existingConfigMap is set")
    elif keys is not None and (tk or {}).get("data") != keys:
        probs.append("trust keys ConfigMap data %r, want %r" % ((tk or {}).get("data"), keys))
    # settings, policies and keys reach the daemons as mounted ConfigMaps
    tk_name = r.opts.get("trust_keys", r.fullname + "-trust-keys")
    for comp, flags in (("operator", (("--policy-dir", "gkm-policies"), ("--trust-dir", tk_name))),
                        ("agent", (("--policy-dir", "gkm-policies"), ("--trust-dir", tk_name))),
                        ("webhook", (("--config", "gkm-config"), ("--policy-dir", "gkm-policies"),
                                     ("--trust-dir", tk_name)))):
        w, c = r.container(comp)
        if c is None:
            continue
        vols = {v["name"]: v for v in pod_spec(w).get("volumes", [])}
        for flag, cm in flags:
            path = flag_value(c.get("args"), flag)
            m = mounts_by_path(c).get(path)
            got = ((vols.get(m["name"]) if m else None) or {}).get("configMap", {}).get("name")
            if got != cm:
                probs.append("%s %s=%s: the mount there is ConfigMap %r, want %r" % (comp, flag, path, got, cm))
    return probs


def check_operator(r):
    probs = []
    name = r.fullname + "-operator"
    dep = r.get("Deployment", name)
    if not dep:
        return ["no Deployment %s" % name]
    if dep["spec"]["replicas"] != r.opts.get("replicas", 1):
        probs.append("replicas %r" % dep["spec"]["replicas"])
    args = pod_spec(dep)["containers"][0]["args"]
    if args[0] != "operator" or flag_value(args, "--leader-elect") != "true":
        probs.append("operator args %s lack --leader-elect=true" % args)
    if flag_value(args, "--identity") != "$(POD_NAME)":
        probs.append("operator --identity is not the pod name")
    lease = flag_value(args, "--lease-name")
    role = r.get("Role", name) or {}
    if not any(lease in (rule.get("resourceNames") or []) and "leases" in rule["resources"]
               for rule in role.get("rules", [])):
        probs.append("--lease-name=%s is not the Lease its Role allows" % lease)
    return probs


def check_servicemonitors(r):
    probs = []
    sms = r.kind("ServiceMonitor")
    if not r.opts.get("servicemonitor"):
        return ["ServiceMonitor rendered while disabled"] if sms else []
    want = {"operator", "node"} | ({"webhook"} if r.opts.get("webhook", True) else set())
    got = {sm["metadata"]["labels"].get("app.kubernetes.io/component") for sm in sms}
    if got != want:
        probs.append("ServiceMonitors for %s, want %s" % (sorted(got), sorted(want)))
    for sm in sms:
        if sm["metadata"]["labels"].get("release") != "prom":
            probs.append("%s: serviceMonitor.labels not applied" % ident(sm))
        sel = sm["spec"]["selector"]["matchLabels"]
        svcs = [s for s in r.kind("Service")
                if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        ports = {p.get("name") for s in svcs for p in s["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep.get("path") != "/metrics" or ep.get("port") not in ports:
                probs.append("%s: endpoint %s is no port of %s" % (ident(sm), ep, [ident(s) for s in svcs]))
    return probs


CHECKS = [
    ("every document is an object with apiVersion, kind, metadata.name, in the right namespace", check_documents),
    ("labels and selectors", check_labels),
    ("securityContexts: only the node pod privileged, everything else non-root and locked down", check_security),
    ("every container has requests and limits and a pinned image", check_resources),
    ("liveness /healthz and readiness /readyz on the port each daemon listens on", check_probes),
    ("every ServiceAccount, ConfigMap, Secret and volume referenced is there", check_references),
    ("Services reach named container ports", check_services),
    ("RBAC: no wildcards, bindings to rendered roles and the release's ServiceAccounts", check_rbac_structure),
    ("RBAC allows each call of spec/fixtures/rbac-calls.yaml and nothing more", check_rbac_calls),
    ("node DaemonSet: agent + csi + registrar, sockets, host paths, propagation, token", check_node),
    ("CSIDriver csi.gkm.io", check_csidriver),
    ("webhook: fails closed, excludes system and release namespaces, certificate verifies", check_webhook),
    ("gkm-config, gkm-policies and trust keys", check_config),
    ("operator: replicas and leader election", check_operator),
    ("ServiceMonitors", check_servicemonitors),
]


# ------------------------------------------------------------------ variants
def ec_public_key():
    k = openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout")
    p = openssl("ec", "-pubout", data=k.stdout)
    return p.stdout.decode()


def variants():
    with open(os.path.join(ROOT, "spec", "fixtures", "gpu", "inventory", "h100.json")) as fh:
        gpu_json = json.load(fh)
    pem = ec_public_key()
    return [
        ("default", [], {}),
        ("verification off", ["--set", "verification.enabled=false"], {"verify": False}),
        ("cert-manager", ["--set", "webhook.certManager.enabled=true"], {"cert_manager": True}),
        ("cert-manager with a ClusterIssuer",
         ["--set", "webhook.certManager.enabled=true", "--set",
          "webhook.certManager.issuerRef.kind=ClusterIssuer,webhook.certManager.issuerRef.name=corp-ca"],
         {"cert_manager": True, "issuer": {"kind": "ClusterIssuer", "name": "corp-ca"}}),
        ("GPU source file (JSON in values)",
         ["-f", write("gpufile.yaml", yaml.safe_dump(
             {"gpu": {"source": "file", "file": {"json": json.dumps(gpu_json)}}}))],
         {"gpu": "file", "gpu_json": gpu_json}),
        ("GPU source file (host path)", ["--set", "gpu.source=file"], {"gpu": "file"}),
        ("GPU source rocm", ["--set", "gpu.source=rocm"], {"gpu": "rocm"}),
        ("GPU source auto", ["--set", "gpu.source=auto"], {"gpu": "auto"}),
        ("2 operator replicas", ["--set", "operator.replicas=2"], {"replicas": 2}),
        ("ServiceMonitor", ["--set", "metrics.serviceMonitor.enabled=true",
                            "--set", "metrics.serviceMonitor.labels.release=prom"],
         {"servicemonitor": True}),
        ("ServiceMonitor, no webhook, no metrics Services",
         ["--set", "metrics.serviceMonitor.enabled=true,metrics.services=false",
          "--set", "metrics.serviceMonitor.labels.release=prom,webhook.enabled=false"],
         {"servicemonitor": True, "webhook": False}),
        ("webhook off", ["--set", "webhook.enabled=false"], {"webhook": False}),
        ("pod placement off", ["--set", "webhook.placement.enabled=false"], {"placement": False}),
        ("Kubernetes 1.33 (matchConditions, image volumes)", ["--kube-version", "v1.33.0"],
         {"kube_version": "1.33"}),
        ("trusted keys", ["-f", write("keys.yaml", yaml.safe_dump(
            {"verification": {"trustedKeys": {"release": pem}}}))],
         {"trust_keys_data": {"release.pem": pem.strip() + "\n"}}),
        ("existing trust keys ConfigMap", ["--set", "verification.existingConfigMap=corp-keys"],
         {"trust_keys": "corp-keys", "external_configmaps": ["corp-keys"]}),
        ("keyless trust beside a key", ["-f", write("keyless.yaml", yaml.safe_dump(
            {"verification": {"trustedKeys": {"release": pem},
                              "keyless": {"trustedRoot": KEYLESS_ROOT, "identities": KEYLESS_RULES}}}))],
         {"trust_keys_data": {"release.pem": pem.strip() + "\n",
                              "trusted_root.json": KEYLESS_ROOT.strip() + "\n",
                              "identities.yaml": yaml.safe_dump(KEYLESS_RULES)}}),
        ("keyless trust as PEM", ["-f", write("keyless-pem.yaml", yaml.safe_dump(
            {"verification": {"keyless": {"fulcioCertificates": pem, "rekorKeys": pem,
                                          "identities": KEYLESS_RULES}}}))],
         {"trust_keys_data": {"fulcio.pem": pem.strip() + "\n", "rekor.pub": pem.strip() + "\n",
                              "identities.yaml": yaml.safe_dump(KEYLESS_RULES)}}),
        ("registry credentials and plain-HTTP registries",
         ["--set", "registry.authSecret=regcred,registry.plainHTTP={registry.local:5000,10.0.0.5}"],
         {"registry_auth": "regcred", "plain_http": "registry.local:5000,10.0.0.5",
          "external_secrets": ["regcred"]}),
        ("trusted keys, verification off", ["-f", write("keys-off.yaml", yaml.safe_dump(
            {"verification": {"enabled": False, "trustedKeys": {"release": pem}}}))],
         {"verify": False, "trust_keys_data": {"release.pem": pem.strip() + "\n"}}),
        ("privileged agent", ["--set", "node.agent.privileged=true"], {"agent_privileged": True}),
        ("policy override", ["-f", write("override.yaml", yaml.safe_dump(
            {"policies": {"overrides": {"extra.lua": "return {}\n"}}}))],
         {"policy_overrides": {"extra.lua": "return {}\n"}}),
        ("other release, namespace, paths, digest, pull secret",
         ["--set", "paths.kubelet=/var/snap/microk8s/common/var/lib/kubelet,paths.state=/data/gkm",
          "--set", "image.digest=sha256:" + "ab" * 32, "--set", "imagePullSecrets={regcred}",
          "--set", "node.nodeSelector.gpu=true"],
         {"release": "prod", "ns": "gpu-system",
          "kubelet": "/var/snap/microk8s/common/var/lib/kubelet", "state": "/data/gkm"}),
    ]


# ------------------------------------------------------------------ tests
def test_policy_copies():
    src = os.path.join(ROOT, "policies")
    dst = os.path.join(CHART, "files", "policies")
    a = sorted(f for f in os.listdir(src) if f.endswith(".lua"))
    b = sorted(f for f in os.listdir(dst) if f.endswith(".lua")) if os.path.isdir(dst) else []
    diff = []
    if a != b:
        diff.append("policies/ has %s, the chart has %s" % (a, b))
    for f in set(a) & set(b):
        with open(os.path.join(src, f), "rb") as x, open(os.path.join(dst, f), "rb") as y:
            if x.read() != y.read():
                diff.append("%s differs" % f)
    check("charts/gkm/files/policies holds exactly the files of policies/", diff)


def test_values_documented():
    """Every value in values.yaml has a comment: on its own key or on a key
    above it (a documented key covers its whole subtree)."""
    with open(os.path.join(CHART, "values.yaml")) as fh:
        lines = fh.read().splitlines()
    keys = []  # (indent, name, has a comment right above, line number)
    prev = ""
    for n, line in enumerate(lines, 1):
        m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if m:
            keys.append((len(m.group(1)), m.group(2), prev.lstrip().startswith("#"), n))
        if line.strip():
            prev = line
    bad, stack = [], []  # stack: (indent, documented here or above)
    for i, (ind, name, doc, n) in enumerate(keys):
        while stack and stack[-1][0] >= ind:
            stack.pop()
        covered = bool(doc or (stack and stack[-1][1]))
        leaf = i + 1 == len(keys) or keys[i + 1][0] <= ind
        if leaf and not covered:
            bad.append("values.yaml:%d: %s has no comment" % (n, name))
        stack.append((ind, covered))
    check("values.yaml: every value is documented", sorted(set(bad)))
    p = render(["--set", "logLevel=debug"], strict=True)
    t.ok(p.returncode == 0, "values.yaml: the defaults render in --strict mode (no value name is misspelt)",
         diag=p.stderr)


def test_flags_contract(r):
    """Every flag the chart passes is one the daemon accepts (its --help)."""
    for w in r.workloads():
        for c in containers(w):
            args = c.get("args") or []
            if not args or args[0] not in GKM_SUBCOMMANDS:
                continue
            name = "gkm %s accepts every flag the chart passes" % args[0]
            h = subprocess.run([GKM_BIN, args[0], "--help"], capture_output=True, text=True, timeout=30)
            out = h.stdout + h.stderr
            missing = [a.split("=")[0] for a in args[1:]
                       if a.startswith("--") and not re.search(re.escape(a.split("=")[0]) + r"\b", out)]
            check(name, ["%s not in `gkm %s --help`" % (m, args[0]) for m in missing])


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def materialize(r, w, c, root):
    """Lay out what the kubelet would give container c of workload w under
    root: ConfigMap and Secret volumes as files, hostPath and emptyDir as
    empty directories. Returns {container path: host path}."""
    import base64 as b64
    vols = {v["name"]: v for v in pod_spec(w).get("volumes", [])}
    paths = {}
    for m in c.get("volumeMounts", []):
        v = vols[m["name"]]
        dst = os.path.join(root, m["mountPath"].lstrip("/"))
        os.makedirs(dst, exist_ok=True)
        paths[m["mountPath"]] = dst
        if "configMap" in v:
            cm = r.get("ConfigMap", v["configMap"]["name"]) or {}
            for k, val in (cm.get("data") or {}).items():
                with open(os.path.join(dst, k), "w") as fh:
                    fh.write(val)
        elif "secret" in v:
            sec = r.get("Secret", v["secret"]["secretName"]) or {}
            items = v["secret"].get("items")
            data = {k: b64.b64decode(x) for k, x in (sec.get("data") or {}).items()}
            for k, x in data.items():
                if items is None or any(i["key"] == k for i in items):
                    with open(os.path.join(dst, k), "wb") as fh:
                        fh.write(x)
    return paths


def container_command(r, w, c, root, env):
    """The container's args with $(VAR) expanded, mounted paths moved under
    root, and every listen address on a free loopback port. Returns
    (argv, {containerPort: real port})."""
    paths = materialize(r, w, c, root)
    ports, argv = {}, [GKM_BIN]
    for a in c.get("args", []):
        a = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
        m = re.match(r"^(--[\w-]*listen)=:(\d+)$", a)
        if m:
            ports[int(m.group(2))] = free_port()
            a = "%s=127.0.0.1:%d" % (m.group(1), ports[int(m.group(2))])
        elif "=" in a:
            flag, val = a.split("=", 1)
            for mp in sorted(paths, key=len, reverse=True):
                if val == mp or val.startswith(mp.rstrip("/") + "/"):
                    val = paths[mp] + val[len(mp):]
                    break
            else:
                if val.startswith("unix:///"):
                    sock = val[len("unix://"):]
                    for mp in paths:
                        if sock.startswith(mp.rstrip("/") + "/"):
                            val = "unix://" + paths[mp] + sock[len(mp):]
            a = flag + "=" + val
        argv.append(a)
    return argv, ports


def http_get(port, path):
    import http.client
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except OSError:
        return None


def wait_for(fn, seconds=20):
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    return fn()


def request_call(req, release_ns):
    """A request the API server's audit log recorded, as an rbac-calls.yaml call
    (verb, group, resource, scope, name); None for non-resource paths
    (discovery, OpenAPI, /version: allowed to every authenticated user)."""
    import urllib.parse
    parts = [p for p in req["path"].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    ns = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource += "/" + rest[2]
    q = urllib.parse.parse_qs(req.get("query", ""))
    method = req["method"]
    if method == "GET":
        verb = "get" if name else ("watch" if req.get("watch") or q.get("watch", [""])[0] in ("1", "true") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())
    if not name:
        for sel in q.get("fieldSelector", []):
            m = re.match(r"^metadata\.name=([^,]+)$", sel)
            if m:
                name = m.group(1)
    scope = "cluster" if ns is None else ("release" if ns == release_ns else "namespace")
    return {"verb": verb, "group": group, "resource": resource, "scope": scope, "name": name}


def call_listed(call, listed):
    """Whether a recorded call is one of the listed calls of a component."""
    ok_scopes = {"cluster": ("cluster",), "release": ("release", "namespace"),
                 "namespace": ("namespace",)}[call["scope"]]
    return any(k["verb"] == call["verb"] and k["group"] == call["group"] and
               k["resource"] == call["resource"] and k["scope"] in ok_scopes and
               (not k.get("resourceName") or k["resourceName"] == call["name"])
               for k in listed)


def test_daemons_run(renders):
    """Each built daemon starts with exactly the chart's args and mounts, and
    answers its liveness and readiness probes on the port the chart probes.
    Those that call the API server talk to a real one as their ServiceAccount,
    held to the chart's RBAC by the real authorizer: nothing they do may be
    refused, and every request they make must be a call of
    spec/fixtures/rbac-calls.yaml."""
    try:
        for r in renders:
            run_daemons(r, {"agent"} if r.opts.get("gpu") == "file" else {"operator", "webhook", "csi"})
    finally:
        for ks in API_SERVERS.values():
            ks.stop()


def run_daemons(r, which):
    env = {"NODE_NAME": "node-1", "POD_NAMESPACE": r.ns, "POD_NAME": "pod-1"}
    for w in r.workloads():
        for c in containers(w):
            args = c.get("args") or []
            if not args or args[0] not in GKM_SUBCOMMANDS or args[0] not in which:
                continue
            name = "gkm %s runs with the chart's args and mounts and passes its probes" % args[0]
            root = os.path.join(tmp, "run-" + c["name"])
            argv, ports = container_command(r, w, c, root, env)
            log = open(os.path.join(tmp, c["name"] + ".log"), "wb")
            penv = dict(os.environ, **env)
            penv.pop("KUBERNETES_SERVICE_HOST", None)
            ks = seen_from = None
            if token_mounted(w, c):
                ks, why = api_server_for(r)
                if ks is None:
                    t.skip(name, why)
                    log.close()
                    continue
                penv["KUBECONFIG"] = service_account_kubeconfig(ks, r, w, c["name"])
                seen_from = len(ks.audit_events())
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    env=penv, stdin=subprocess.DEVNULL)
            probs = []
            try:
                for kind in ("livenessProbe", "readinessProbe"):
                    hg = (c.get(kind) or {}).get("httpGet") or {}
                    port = ports.get(port_of(c, hg.get("port")))
                    if port is None:
                        probs.append("%s port %r is not a port the daemon was told to listen on" %
                                     (kind, hg.get("port")))
                        continue
                    st = wait_for(lambda: http_get(port, hg["path"]) == 200 or proc.poll() is not None)
                    if proc.poll() is not None:
                        probs.append("exited with %d before answering %s" % (proc.returncode, kind))
                        break
                    if http_get(port, hg["path"]) != 200:
                        probs.append("%s %s did not answer 200" % (kind, hg["path"]))
                if not probs and args[0] == "webhook":
                    probs += review_over_tls(r, w, ports)
                if not probs and ks is not None:
                    give_work(ks)
            finally:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.close()
            if ks is not None:
                calls = load_calls(r).get(c["name"]) or []
                seen = set()
                user = "system:serviceaccount:%s:%s" % (r.ns, pod_spec(w).get("serviceAccountName"))
                for ev in ks.audit_events()[seen_from:]:
                    if ev.get("user", {}).get("username") != user:
                        continue
                    req = audit_request(ev)
                    if ev.get("responseStatus", {}).get("code") == 403:
                        probs.append("the API server refused %s %s: the chart's RBAC does not grant it"
                                     % (req["method"], ev["requestURI"]))
                    call = request_call(req, r.ns)
                    if call is None:
                        continue
                    key = "%(verb)s %(group)s/%(resource)s %(scope)s %(name)s" % call
                    if key not in seen and not call_listed(call, calls):
                        probs.append("made %s (%s %s), not in spec/fixtures/rbac-calls.yaml" %
                                     (key, req["method"], req["path"]))
                    seen.add(key)
                if not seen:
                    probs.append("made no API request as %s: is it talking to the API server?" % user)
                if os.environ.get("GKM_CHART_SHOW_CALLS"):
                    print("# %s made: %s" % (c["name"], sorted(seen)))
            if probs:
                with open(os.path.join(tmp, c["name"] + ".log"), "rb") as fh:
                    probs.append("argv: %s\nlog:\n%s" % (" ".join(argv), fh.read()[-3000:].decode("utf-8", "replace")))
            check(name, probs)


API_SERVERS = {}


def api_server_for(r):
    """A real API server (one per release namespace, shared by the daemons
    of the renderings that use it) with the CRDs, the release namespace, the
    chart's own ServiceAccounts and RBAC, and the node the daemons run on.
    Returns (server, None), or (None, why) where none can run."""
    from kubeenv import KubeEnv, unavailable
    if r.ns in API_SERVERS:
        return API_SERVERS[r.ns], None
    why = unavailable()
    if why:
        return None, why
    ks = KubeEnv(audit="all").start()
    ks.apply_crds()
    ks.make_namespace(r.ns)
    ks.make_node("node-1")
    rbac = [d for d in r.docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                                "Role", "RoleBinding")]
    a = kubectl(ks, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    if a.returncode != 0:
        raise RuntimeError("applying the chart's RBAC: " + a.stderr)
    API_SERVERS[r.ns] = ks
    return ks, None


def service_account_kubeconfig(ks, r, w, name):
    """A kubeconfig with a token of the workload's ServiceAccount (TokenRequest),
    so that the real authorizer holds the daemon to the chart's RBAC."""
    sa = pod_spec(w).get("serviceAccountName")
    p = kubectl(ks, "create", "token", sa, "-n", r.ns, "--duration=1h")
    if p.returncode != 0:
        raise RuntimeError("kubectl create token %s: %s" % (sa, p.stderr))
    return ks.write_kubeconfig(os.path.join(tmp, name + ".kubeconfig"), p.stdout.strip())


def give_work(ks):
    """Caches for a running operator or agent to act on, so that the requests
    checked against rbac-calls.yaml include their real work (node reports,
    status writes, Events), not only the start-up lists and watches."""
    ks.make_namespace("team-a")
    image = "127.0.0.1:9/team-a/cache:v1"
    for path, kind, meta in (("/namespaces/team-a/gkmcaches", "GKMCache", {"namespace": "team-a"}),
                             ("/clustergkmcaches", "ClusterGKMCache", {})):
        ks.request("POST", "/apis/gkm.io/v1alpha1" + path, {
            "apiVersion": "gkm.io/v1alpha1", "kind": kind,
            "metadata": dict(meta, name="kernels" if meta else "shared"), "spec": {"image": image}})
    start = len(ks.audit_events())

    def wrote():
        return any(ev["verb"] in ("create", "update", "patch")
                   and ev.get("user", {}).get("username", "").startswith("system:serviceaccount:")
                   and ("/namespaces/team-a/" in ev["requestURI"] or "/status" in ev["requestURI"])
                   for ev in ks.audit_events()[start:])
    wait_for(wrote, 15)  # bounded; the check is on whatever was sent


def review_over_tls(r, w, ports):
    """POST an AdmissionReview to the webhook the way the API server would:
    TLS verified with the configuration's caBundle for the Service's name."""
    import http.client
    import ssl
    name = r.fullname + "-webhook"
    cfg = r.get("ValidatingWebhookConfiguration", name)
    wh = cfg["webhooks"][0]
    ca = base64.b64decode(wh["clientConfig"]["caBundle"]).decode()
    svc = wh["clientConfig"]["service"]
    ctx = ssl.create_default_context(cadata=ca)
    c = pod_spec(w)["containers"][0]
    port = ports[int(flag_value(c["args"], "--listen").lstrip(":"))]
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0b3c6d1e-chart-test", "operation": "CREATE", "namespace": "team-a",
        "kind": {"group": "gkm.io", "version": "v1alpha1", "kind": "GKMCache"},
        "resource": {"group": "gkm.io", "version": "v1alpha1", "resource": "gkmcaches"},
        "object": {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                   "metadata": {"name": "c", "namespace": "team-a"},
                   "spec": {"image": "Not A Valid Reference!"}}}}
    try:
        import socket
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        tls = ctx.wrap_socket(raw, server_hostname="%s.%s.svc" % (svc["name"], svc["namespace"]))
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10)
        conn.sock = tls
        conn.request("POST", svc["path"], body=json.dumps(review),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"null")
        conn.close()
    except (OSError, ValueError, ssl.SSLError) as e:
        return ["AdmissionReview over TLS (caBundle, %s.%s.svc): %r" % (svc["name"], svc["namespace"], e)]
    out = (body or {}).get("response") or {}
    if resp.status != 200 or out.get("uid") != review["request"]["uid"] or out.get("allowed") is not False:
        return ["AdmissionReview for a malformed image: HTTP %d %s" % (resp.status, body)]
    return []


def test_bad_values():
    cases = [
        ("unknown GPU source", ["--set", "gpu.source=cuda"], "gpu.source must be auto, nvml, rocm or file"),
        ("3 operator replicas", ["--set", "operator.replicas=3"], "operator.replicas must be 1 or 2"),
        ("2 operators without leader election",
         ["--set", "operator.replicas=2,operator.leaderElection.enabled=false"],
         "needs operator.leaderElection.enabled=true"),
        ("a trusted key that is not PEM", ["--set", "verification.trustedKeys.corp=hello"],
         "verification.trustedKeys.corp is not a PEM public key"),
        ("keyless identities without a trusted root",
         ["-f", write("kl-noroot.yaml", yaml.safe_dump(
             {"verification": {"keyless": {"identities": KEYLESS_RULES}}}))],
         "verification.keyless.identities needs a trusted root"),
        ("a keyless trusted root without identities",
         ["--set", "verification.keyless.trustedRoot=x"], "a trusted root without identities trusts nobody"),
        ("a keyless identity without a subject",
         ["-f", write("kl-nosubject.yaml", yaml.safe_dump(
             {"verification": {"keyless": {"trustedRoot": KEYLESS_ROOT,
                                           "identities": [{"issuer": "https://issuer.example"}]}}}))],
         "verification.keyless.identities[0]: wants issuer or issuerRegExp, and subject or subjectRegExp"),
        ("keyless values with an existing ConfigMap",
         ["-f", write("kl-existing.yaml", yaml.safe_dump(
             {"verification": {"existingConfigMap": "corp-keys",
                               "keyless": {"trustedRoot": KEYLESS_ROOT, "identities": KEYLESS_RULES}}}))],
         "put the keyless files"),
        ("a trusted key named fulcio", ["--set", "verification.trustedKeys.fulcio=-----BEGIN PUBLIC KEY-----"],
         "would render fulcio.pem"),
        ("a trusted key name with a slash",
         ["-f", write("badkeyname.yaml", "verification: {trustedKeys: {'../x': '-----BEGIN PUBLIC KEY-----'}}\n")],
         "is not a usable key name"),
        ("unknown log level", ["--set", "logLevel=verbose"], "log level must be debug, info, warn or error"),
        ("unknown CSI log level", ["--set", "node.csi.logLevel=loud"],
         "log level must be debug, info, warn or error"),
        ("unknown log format", ["--set", "logFormat=xml"], "logFormat must be json or text"),
        ("a store low threshold above the high one",
         ["--set", "node.agent.store.lowThresholdPercent=90"],
         "node.agent.store: lowThresholdPercent (90) must be at least 1 and below highThresholdPercent (85)"),
        ("webhook timeout above 30 s", ["--set", "webhook.timeoutSeconds=60"], "webhook.timeoutSeconds must be 1-30"),
        ("no webhook replicas", ["--set", "webhook.replicas=0"], "webhook.replicas must be at least 1"),
        ("a relative state path", ["--set", "paths.state=var/lib/gkm"], "paths.state must be an absolute path"),
        ("an image digest that is no digest", ["--set", "image.digest=latest"], "image.digest must look like sha256:"),
        ("GPU file JSON that does not parse",
         ["-f", write("badjson.yaml", "gpu: {source: file, file: {json: '{not json'}}\n")], "invalid character"),
        ("a policy override name with a slash",
         ["-f", write("badpolicy.yaml", "policies: {overrides: {'../evil.lua': 'x'}}\n")],
         "is not a policy file name"),
        ("--set without a value", ["--set", "novalue"], "key without a value"),
        ("--set with a bad index", ["--set", "a[x]=1"], "bad key"),
        ("a values file that does not exist", ["-f", os.path.join(tmp, "does-not-exist.yaml")], "no such file"),
    ]
    for label, args, want in cases:
        p = render(args)
        ok = p.returncode != 0 and want in p.stderr and p.stdout == ""
        t.ok(ok, "bad values (%s): refused with %r, nothing written" % (label, want),
             diag="rc=%d stderr=%s stdout=%d bytes" % (p.returncode, p.stderr.strip(), len(p.stdout)))


def copy_chart():
    d = os.path.join(tmp, "chart-copy")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(CHART, d)
    return d


def test_renderer():
    # Helm's value handling: -f then --set, null deletes, lists, indexes, escapes
    d = copy_chart()
    with open(os.path.join(d, "templates", "zz-probe.yaml"), "w") as fh:
        fh.write("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe, namespace: {{ .Release.Namespace }}}\n"
                 "data:\n  values: {{ pick .Values \"probe\" | toJson | quote }}\n"
                 "  has: {{ .Capabilities.APIVersions.Has \"apps/v1\" | quote }}\n"
                 "  hasmon: {{ .Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\" | quote }}\n"
                 "  chart: {{ printf \"%s-%s\" .Chart.Name .Chart.Version | quote }}\n"
                 "  tpl: {{ tpl \"{{ .Release.Name }}x\" . | quote }}\n"
                 "  lines: {{ len (.Files.Lines \"files/policies/admission.lua\") | quote }}\n"
                 "  lookup: {{ lookup \"v1\" \"Secret\" \"x\" \"y\" | len | quote }}\n")
    with open(os.path.join(d, "values.yaml"), "a") as fh:
        fh.write("probe: {keep: 1, drop: 2, list: [a], deep: {x: 1}}\n")
    f = write("probe.yaml", "probe: {deep: {y: 2}, list: [b, c]}\n")
    p = render(["-f", f, "--set", "probe.drop=null,probe.n=7,probe.s=007,probe.b=true",
                "--set", "probe.l={x,y},probe.i[1].k=v,probe.dot\\.key=1",
                "--set-string", "probe.str=12", "--api-versions", "monitoring.coreos.com/v1"],
               chart=d, release="rel")
    got = {}
    if p.returncode == 0:
        got = [x for x in load_docs(p.stdout) if x["metadata"]["name"] == "probe"][0]["data"]
    want_vals = {"probe": {"keep": 1, "list": ["b", "c"], "deep": {"x": 1, "y": 2}, "n": 7,
                           "s": "007", "b": True, "l": ["x", "y"], "i": [None, {"k": "v"}],
                           "dot.key": 1, "str": "12"}}
    t.eq(json.loads(got.get("values", "null")) if got else p.stderr, want_vals,
         "renderer: values.yaml, then -f, then --set/--set-string (null deletes, lists, indexes, escapes)")
    t.eq([got.get(k) for k in ("has", "hasmon", "chart", "tpl", "lookup")],
         ["true", "true", "gkm-0.1.0", "relx", "0"],
         "renderer: .Capabilities, .Chart, tpl, lookup (empty, as helm template)")
    t.ok(got and int(got.get("lines", 0)) > 10, "renderer: .Files.Lines reads chart files")

    # template errors name the file and line; strict mode catches typos of value names
    d = copy_chart()
    with open(os.path.join(d, "templates", "broken.yaml"), "w") as fh:
        fh.write("a: 1\nb: {{ .Values.logLevel | nosuchfunc }}\n")
    p = render([], chart=d)
    t.ok(p.returncode == 1 and "broken.yaml:2" in p.stderr and p.stdout == "",
         "renderer: a template syntax error names file and line", diag=p.stderr)
    d = copy_chart()
    with open(os.path.join(d, "templates", "typo.yaml"), "w") as fh:
        fh.write("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: t}\ndata: {x: {{ .Values.webhook.enabeld | quote }}}\n")
    p = render([], chart=d)
    t.ok(p.returncode == 1 and "typo.yaml:4" in p.stderr and "enabeld" in p.stderr,
         "renderer --strict: a misspelt value name is an error", diag=p.stderr)
    p = render([], chart=d, strict=False)
    t.ok(p.returncode == 0, "renderer without --strict: a missing value renders empty, as Helm", diag=p.stderr)
    d = copy_chart()
    with open(os.path.join(d, "templates", "nokind.yaml"), "w") as fh:
        fh.write("apiVersion: v1\nmetadata: {name: x}\n---\nkey: [unclosed\n")
    p = render([], chart=d)
    t.ok(p.returncode == 1 and "nokind.yaml" in p.stderr, "renderer: output that is not YAML or has no kind is an error",
         diag=p.stderr)
    p = render([], chart=os.path.join(tmp, "no-chart-here"))
    t.ok(p.returncode == 1 and "Chart.yaml" in p.stderr, "renderer: a directory without Chart.yaml is refused",
         diag=p.stderr)
    d = copy_chart()
    os.symlink("..", os.path.join(d, "files", "loop"))
    p = render([], chart=d)
    t.ok(p.returncode == 1 and "symbolic link cycle" in p.stderr,
         "renderer: follows links in the chart, but not round a cycle", diag=p.stderr)
    p = render([], release="Bad_Name")
    t.ok(p.returncode == 1 and "release name" in p.stderr, "renderer: an invalid release name is refused",
         diag=p.stderr)

    # --include-crds and --create-namespace (what `make manifests` writes)
    p = render(["--include-crds", "--create-namespace"])
    docs = load_docs(p.stdout) if p.returncode == 0 else []
    kinds = [x["kind"] for x in docs]
    crds = os.listdir(os.path.join(CHART, "crds")) if os.path.isdir(os.path.join(CHART, "crds")) else []
    t.ok(kinds[:1] == ["Namespace"] and kinds.count("CustomResourceDefinition") == len(crds)
         and kinds[1:1 + len(crds)] == ["CustomResourceDefinition"] * len(crds),
         "renderer --create-namespace --include-crds: the namespace, then the CRDs, then the chart",
         diag="%s %s" % (kinds[:8], p.stderr))
    order = {k: i for i, k in enumerate(kinds)}
    t.ok(order.get("ServiceAccount", 99) < order.get("ClusterRoleBinding", 0) < order.get("Deployment", 0)
         < order.get("ValidatingWebhookConfiguration", 0),
         "renderer: Helm's install order (accounts, RBAC, workloads, then webhook configurations)",
         diag=str(kinds))


# ------------------------------------------------------------------ apply
def discovery(ks):
    """{(apiVersion, kind): namespaced} of what the server serves."""
    served = {}
    st, body = ks.request("GET", "/api/v1")
    for res in (body or {}).get("resources", []) if st == 200 else []:
        if "/" not in res["name"]:
            served[("v1", res["kind"])] = res["namespaced"]
    st, body = ks.request("GET", "/apis")
    for g in (body or {}).get("groups", []) if st == 200 else []:
        for v in g["versions"]:
            st, gv = ks.request("GET", "/apis/" + v["groupVersion"])
            for res in (gv or {}).get("resources", []) if st == 200 else []:
                if "/" not in res["name"]:
                    served[(v["groupVersion"], res["kind"])] = res["namespaced"]
    return served


def kubectl(ks, *args, stdin=None):
    return subprocess.run(["kubectl", "--kubeconfig", ks.kubeconfig, "--request-timeout=30s"] + list(args),
                          input=stdin, capture_output=True, text=True, timeout=120)


AUDIT_METHODS = {"get": "GET", "list": "GET", "watch": "GET", "create": "POST", "update": "PUT",
                 "patch": "PATCH", "delete": "DELETE", "deletecollection": "DELETE"}


def audit_request(ev):
    """An event of the real API server's audit log as the request
    request_call() reads (method, path, query, watch)."""
    import urllib.parse
    u = urllib.parse.urlsplit(ev["requestURI"])
    return {"method": AUDIT_METHODS.get(ev["verb"], ev["verb"].upper()), "path": u.path,
            "query": u.query, "watch": ev["verb"] == "watch"}


def contains(stored, rendered):
    """Whether every value the chart rendered is in what the server stored
    (which adds defaults: protocols, pull policies, strategies...)."""
    if rendered == {}:
        return stored in (None, {})  # an empty map is not stored
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(contains(stored.get(k), v) for k, v in rendered.items())
    if isinstance(rendered, list):
        return (isinstance(stored, list) and len(stored) == len(rendered)
                and all(contains(a, b) for a, b in zip(stored, rendered)))
    if isinstance(rendered, (int, float)) and isinstance(stored, str):
        return str(rendered) == stored  # IntOrString
    return stored == rendered


def test_apply():
    if not shutil.which("kubectl"):
        t.skip("kubectl apply --server-side of the chart", "kubectl is not installed")
        return
    if not os.path.isdir(os.path.join(CHART, "crds")):
        t.skip("kubectl apply --server-side of the chart", "charts/gkm/crds is not there yet")
        return
    from kubeenv import KubeEnv, unavailable
    why = unavailable()
    if why:
        t.skip("kubectl apply --server-side of the chart to a real API server", why)
        return
    p = render(["--include-crds", "--create-namespace"])
    if not t.ok(p.returncode == 0, "render the plain-YAML install (as make manifests)", diag=p.stderr):
        return
    docs = load_docs(p.stdout)
    with KubeEnv(audit="all") as ks:
        first = [d for d in docs if d["kind"] in ("Namespace", "CustomResourceDefinition")]
        a = kubectl(ks, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(first))
        t.ok(a.returncode == 0 and a.stdout.count("serverside-applied") == len(first),
             "kubectl apply --server-side: the namespace and the %d CRDs" % (len(first) - 1),
             diag=a.stdout + a.stderr)
        # the API server sets Established a moment after it stores a CRD
        kubectl(ks, "wait", "--for=condition=Established", "crd", "--all", "--timeout=30s")
        g = kubectl(ks, "get", "crd", "-o", "json")
        est = []
        if g.returncode == 0:
            for crd in json.loads(g.stdout)["items"]:
                conds = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
                est.append((crd["metadata"]["name"], conds.get("Established"), conds.get("NamesAccepted")))
        t.ok(len(est) == len(first) - 1 and all(e[1] == "True" and e[2] == "True" for e in est),
             "the CRDs are accepted: Established and NamesAccepted", diag="%s %s" % (est, g.stderr))

        served = discovery(ks)
        rest, skipped = [], {}
        for d in docs:
            if d in first:
                continue
            if (d["apiVersion"], d["kind"]) in served:
                rest.append(d)
            else:
                skipped.setdefault("%s %s" % (d["apiVersion"], d["kind"]), []).append(d["metadata"]["name"])
        t.ok(not skipped, "the API server serves every kind the chart renders", diag=str(skipped))
        a = kubectl(ks, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(rest))
        t.ok(a.returncode == 0 and a.stdout.count("serverside-applied") == len(rest),
             "kubectl apply --server-side: the %d objects of kinds the server serves (%s)" %
             (len(rest), ", ".join(sorted({d["kind"] for d in rest}))), diag=a.stdout + a.stderr)
        probs = []
        for d in rest:
            m = d["metadata"]
            args = ["get", "%s.%s" % (d["kind"].lower(), d["apiVersion"].split("/")[0])
                    if "/" in d["apiVersion"] else d["kind"].lower(), m["name"], "-o", "json"]
            if m.get("namespace"):
                args += ["-n", m["namespace"]]
            g = kubectl(ks, *args)
            if g.returncode != 0:
                probs.append("%s: %s" % (ident(d), g.stderr.strip()))
                continue
            got = json.loads(g.stdout)
            for key in ("data", "spec", "rules", "roleRef", "subjects", "webhooks"):
                if key in d and not contains(got.get(key), d[key]):
                    probs.append("%s: %s stored as %s" % (ident(d), key, got.get(key)))
            if got["metadata"].get("labels") != m.get("labels"):
                probs.append("%s: labels stored as %s" % (ident(d), got["metadata"].get("labels")))
        check("kubectl get: every applied object is stored as rendered", probs)

        # the request-to-call mapping the daemon runs rely on, checked on what
        # kubectl just sent
        calls = [request_call(audit_request(ev), "gkm") for ev in ks.audit_events()]
        got = {(c["verb"], c["group"], c["resource"], c["scope"], c["name"]) for c in calls if c}
        want = {("patch", "", "configmaps", "release", "gkm-config"),
                ("patch", "storage.k8s.io", "csidrivers", "cluster", "csi.gkm.io"),
                ("patch", "apiextensions.k8s.io", "customresourcedefinitions", "cluster",
                 "gkmcaches.gkm.io"),
                ("patch", "", "namespaces", "cluster", "gkm")}
        agent = load_calls(Rendered("x", docs, "gkm", "gkm", {})).get("agent")
        t.ok(want <= got and None in calls
             and call_listed({"verb": "get", "group": "", "resource": "secrets", "scope": "namespace",
                              "name": "pull"}, agent)
             and not call_listed({"verb": "patch", "group": "", "resource": "configmaps",
                                  "scope": "release", "name": "gkm-config"}, agent)
             and not call_listed({"verb": "list", "group": "", "resource": "secrets", "scope": "namespace",
                                  "name": None}, agent),
             "recorded API requests map to rbac-calls.yaml calls (verb, group, resource, scope, name)",
             diag="missing %s from %s" % (want - got, sorted(got, key=str)))

        # an upgrade: switch verification off and apply again
        p2 = render(["--include-crds", "--create-namespace", "--set", "verification.enabled=false"])
        docs2 = [d for d in load_docs(p2.stdout) if (d["apiVersion"], d["kind"]) in served
                 and d["kind"] not in ("Namespace", "CustomResourceDefinition")]
        a = kubectl(ks, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs2))
        g = kubectl(ks, "get", "configmap", "gkm-config", "-n", "gkm", "-o", "jsonpath={.data.verify-enabled}")
        t.ok(a.returncode == 0 and g.stdout == "false",
             "kubectl apply --server-side again with verification off: an upgrade in place",
             diag=a.stdout + a.stderr + g.stdout + g.stderr)


def main():
    if not os.access(RENDER, os.X_OK):
        t.ok(False, "the chart renderer is built", diag="%s missing: run make spec-extra" % RENDER)
        return t.finish()
    test_policy_copies()
    test_values_documented()
    default, runnable = None, []
    for name, args, opts in variants():
        release, ns = opts.get("release", "gkm"), opts.get("ns", "gkm")
        p = render(args, release=release, ns=ns)
        if not t.ok(p.returncode == 0 and p.stderr == "", "%s: renders" % name, diag=p.stderr):
            continue
        try:
            docs = load_docs(p.stdout)
        except yaml.YAMLError as e:
            t.ok(False, "%s: the output parses as YAML" % name, diag=str(e))
            continue
        r = Rendered(name, docs, release, ns, opts)
        if default is None:
            default = r
            runnable.append(r)
        if opts.get("gpu_json"):
            runnable.append(r)
        for cname, fn in CHECKS:
            try:
                probs = fn(r)
            except Exception as e:  # noqa: BLE001 - a malformed manifest is a failure
                import traceback
                probs = ["check crashed on this rendering: %r\n%s" % (e, traceback.format_exc())]
            check("%s: %s" % (name, cname), probs)
    if default is not None:
        test_flags_contract(default)
        test_daemons_run(runnable)
    test_bad_values()
    test_renderer()
    test_apply()
    return t.finish()


if __name__ == "__main__":
    sys.exit(main())
