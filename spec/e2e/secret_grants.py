#!/usr/bin/python3
"""The node agents read only the pull Secrets caches name, on the real API
server (GKM_KUBE_ASSETS) with RBAC and an audit log: the agents'
ServiceAccount is granted nothing on Secrets by its ClusterRole; the real
`gkm operator` keeps in each namespace a Role that may get exactly the
Secrets caches there name (gkm's namespace for a ClusterGKMCache), bound to
that ServiceAccount, follows every change of the caches, puts right a Role
edited by hand, and removes the Role with the last cache that needs it, also
one left behind while it was down. Requests are made with the agents' own
token, as a compromised node would make them: a Secret no cache names is
refused (403 in the audit log)."""
import json
import os
import sys

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import kube_e2e  # noqa: E402
import kubeenv  # noqa: E402
from proc import Child, free_port, wait_for  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(BUILD, "gkm")
AGENT = "system:serviceaccount:gkm:gkm-node"
AGENT_TOKEN = "agent-token-0123456789"
DIGEST = "sha256:" + "ab" * 32
ROLE = "gkm-agent-pull-secrets"

t = Tap()
cleanups = []


def main():
    why = kubeenv.unavailable()
    if why:
        t.skip("pull Secrets granted to the node agents", why)
        return
    kube = kubeenv.KubeEnv(audit="all", tokens=[(AGENT_TOKEN, AGENT, "agent-uid",
                                                 ["system:serviceaccounts", "system:serviceaccounts:gkm",
                                                  "system:authenticated"])])
    cleanups.append(kube.stop)
    kube.start()
    kube.apply_crds()
    for ns in ("gkm", "team-a", "team-b"):
        kube.make_namespace(ns)
    for ns, name in (("team-a", "named"), ("team-a", "other"), ("team-a", "second"), ("team-b", "x"),
                     ("gkm", "clustercred"), ("gkm", "unnamed")):
        kube.request("POST", "/api/v1/namespaces/%s/secrets" % ns,
                     {"metadata": {"name": name}, "type": "Opaque", "data": {"k": "c2VjcmV0"}})

    def agent_get(ns, name):
        return kube.request("GET", "/api/v1/namespaces/%s/secrets/%s" % (ns, name), token=AGENT_TOKEN)[0]

    def cache(name, ns, secrets, kind="GKMCache"):
        md = {"name": name, "annotations": {"gkm.io/resolvedDigest": DIGEST}}
        if ns:
            md["namespace"] = ns
        return kube.apply_obj({"apiVersion": "gkm.io/v1alpha1", "kind": kind, "metadata": md,
                               "spec": {"image": "registry.example/team/cache:v1",
                                        "pullSecrets": [{"name": s} for s in secrets]}})

    def role_names(ns):
        r = kube.get_json("role", ROLE, "-n", ns) or {}
        rules = r.get("rules") or [{}]
        return sorted(rules[0].get("resourceNames") or []) if r else None

    def operator(log):
        return Child([GKM, "operator", "--kubeconfig", kube.kubeconfig, "--namespace", "gkm",
                      "--leader-elect", "false", "--verify-enabled", "false", "--resolve-digests", "false",
                      "--agent-service-account", "gkm/gkm-node",
                      "--health-listen", "127.0.0.1:%d" % free_port()], os.path.join(kube.dir, log))

    t.ok(agent_get("team-a", "named") == 403, "before any cache, the agents' token reads no Secret")
    op = operator("operator.log")
    cleanups.append(op.stop)
    p = cache("c1", "team-a", ["named"])
    t.ok(p.returncode == 0 and wait_for(lambda: role_names("team-a") == ["named"], 30),
         "a GKMCache naming Secret 'named': the operator makes Role %s in team-a allowing that name only" % ROLE,
         diag=(p.stderr, role_names("team-a"), op.tail()))
    b = kube.get_json("rolebinding", ROLE, "-n", "team-a") or {}
    t.ok(b.get("roleRef", {}).get("name") == ROLE
         and b.get("subjects") == [{"kind": "ServiceAccount", "name": "gkm-node", "namespace": "gkm"}],
         "bound to the agents' ServiceAccount", diag=b)
    t.ok(wait_for(lambda: agent_get("team-a", "named") == 200, 10),
         "the agents' token reads the Secret a cache names")
    t.ok(agent_get("team-a", "other") == 403 and agent_get("team-b", "x") == 403
         and agent_get("gkm", "unnamed") == 403,
         "... and no other Secret: not in the same namespace, not in another")
    refused = [e for e in kube.audit_events()
               if e.get("user", {}).get("username") == AGENT and e.get("stage") == "ResponseComplete"
               and e.get("objectRef", {}).get("resource") == "secrets"
               and e.get("objectRef", {}).get("name") == "other"
               and e.get("responseStatus", {}).get("code") == 403]
    t.ok(refused, "the audit log shows the API server refusing the agents' get of Secret team-a/other (403)")
    r = kube.request("GET", "/api/v1/namespaces/team-a/secrets", token=AGENT_TOKEN)[0]
    t.ok(r == 403, "the agents may not list Secrets")

    cache("c2", "team-a", ["second", "named"])
    t.ok(wait_for(lambda: role_names("team-a") == ["named", "second"], 30),
         "a second cache naming another Secret: the Role allows both names", diag=role_names("team-a"))
    kube.kubectl("delete", "gkmc", "c2", "-n", "team-a")
    t.ok(wait_for(lambda: role_names("team-a") == ["named"], 30) and
         wait_for(lambda: agent_get("team-a", "second") == 403, 10),
         "that cache deleted: its Secret is readable no more", diag=role_names("team-a"))

    kube.kubectl("patch", "role", ROLE, "-n", "team-a", "--type", "json", "-p",
                 json.dumps([{"op": "add", "path": "/rules/0/resourceNames/-", "value": "other"}]))
    t.ok(wait_for(lambda: role_names("team-a") == ["named"], 30),
         "a name added to the Role by hand is taken out again", diag=role_names("team-a"))

    cache("shared", None, ["clustercred"], kind="ClusterGKMCache")
    t.ok(wait_for(lambda: role_names("gkm") == ["clustercred"], 30)
         and wait_for(lambda: agent_get("gkm", "clustercred") == 200, 10)
         and agent_get("gkm", "unnamed") == 403,
         "a ClusterGKMCache: its Secret in gkm's namespace, and only that one", diag=role_names("gkm"))

    kube.kubectl("delete", "gkmc", "c1", "-n", "team-a")
    t.ok(wait_for(lambda: role_names("team-a") is None and not kube.get_json("rolebinding", ROLE, "-n", "team-a"), 30)
         and agent_get("team-a", "named") == 403,
         "the last cache of team-a deleted: Role and RoleBinding gone, nothing readable there")

    # a cache deleted while the operator is down: its Role goes after the restart
    op.stop()
    kube.kubectl("delete", "cgkmc", "shared")
    op2 = operator("operator2.log")
    cleanups.append(op2.stop)
    t.ok(wait_for(lambda: role_names("gkm") is None, 30) and agent_get("gkm", "clustercred") == 403,
         "a Role left behind while the operator was down is removed once it has seen every cache",
         diag=(role_names("gkm"), op2.tail()))
    t.ok(op2.stop() == 0, "the operator stops cleanly")


kube_e2e.run(t, main, cleanups)
