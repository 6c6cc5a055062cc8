#!/usr/bin/env bash
# An agent that cannot read its Node says so where a user looks. With
# `--node` naming no Node, the real operator deletes the agent's node objects
# as belonging to a node that is gone and the agent writes them back: the
# objects carry the condition NodeFound=False (NodeNotFound, with what to
# fix), each new object gets a Warning Event, gkm_agent_node_found is 0 and
# the rewrites are counted. When the Node appears, the agent finds it on its
# own: NodeFound=True and an ownerReference to the Node. A Node it may not
# read (RBAC without get on nodes: 403) is NodeForbidden until that is fixed.
# On a real kube-apiserver (GKM_KUBE_ASSETS; skipped with the reason where it
# is not set); the agent runs as a ServiceAccount with the chart's agent
# permissions, the get on nodes bound apart so that it can be taken away.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/loopback.sh"
. "$(dirname "$0")/../lib/daemon.sh"
cd "$GKM_ROOT"
. spec/lib/kubeenv.sh
G=$GKM_BIN
W=$(mktemp -d)
cleanup() {
	daemon_stop_all
	kubeenv_stop
	rm -rf "$W"
}
trap cleanup EXIT
if why=$(kubeenv_unavailable); then
	echo "# real kube-apiserver: skipped: $why"
	skip "agent without its Node" "$why"
	finish
	exit
fi
kubeenv_start || { ok 1 "the real control plane starts"; finish; exit; }
trap cleanup EXIT
# the agent's ServiceAccount: what the chart grants it (and the policies'
# ConfigMap, which the chart mounts as files); get on nodes bound apart
nodes_binding() {
	kubectl create clusterrolebinding gkm-agent-nodes --clusterrole gkm-agent-nodes \
		--serviceaccount gkm:gkm-agent >/dev/null
}
kubectl create namespace gkm >/dev/null && kubectl create serviceaccount gkm-agent -n gkm >/dev/null &&
	kubectl apply -f - >/dev/null <<'YAML' &&
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: gkm-agent}
rules:
- {apiGroups: [gkm.io], resources: [gkmcaches, clustergkmcaches], verbs: [get, list, watch]}
- {apiGroups: [gkm.io], resources: [gkmcachenodes, clustergkmcachenodes], verbs: [get, list, watch, create, patch]}
- {apiGroups: [gkm.io], resources: [gkmcachenodes/status, clustergkmcachenodes/status], verbs: [patch]}
- {apiGroups: [""], resources: [events], verbs: [create]}
- {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: gkm-agent-nodes}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get]}
YAML
	kubectl create clusterrolebinding gkm-agent --clusterrole gkm-agent \
		--serviceaccount gkm:gkm-agent >/dev/null && nodes_binding &&
	TOKEN=$(kubectl create token gkm-agent -n gkm --duration 1h) &&
	sed "s/$KUBEENV_TOKEN/$TOKEN/" "$KUBECONFIG" >"$W/agent.kubeconfig" &&
	kubectl create namespace team >/dev/null &&
	printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: c1, namespace: team}\nspec: {image: "registry.invalid/c@sha256:%064d"}\n' 1 |
	kubectl apply -f - >/dev/null
ok $? "the agent's ServiceAccount and permissions, a GKMCache, and no Node named n1"

PORT=$(free_port)
start_agent() {
	$G agent --node n1 --kubeconfig "$W/agent.kubeconfig" --gpu-file spec/fixtures/gpu/inventory/t4.json \
		--root "$W/root" --run-dir "$W/run" --verify-enabled false --health-listen "127.0.0.1:$PORT" >>"$W/agent.log" 2>&1 &
	PID[agent]=$!
}
start_agent
cond() { # kind [ns]: "status/reason" of the NodeFound condition of node object n1
	kubectl get "$1" n1 ${2:+-n "$2"} \
		-o jsonpath='{.status.conditions[?(@.type=="NodeFound")].status}/{.status.conditions[?(@.type=="NodeFound")].reason}' 2>/dev/null
}
wait_for 30 is False/NodeNotFound cond cgkmcn
ok $? "the ClusterGKMCacheNode says NodeFound=False, NodeNotFound" || tail -5 "$W/agent.log"
wait_for 30 is False/NodeNotFound cond gkmcn team
ok $? "so does the namespace's GKMCacheNode"
kubectl get cgkmcn n1 -o jsonpath='{.status.conditions[0].message}' | grep -q -- "--node"
ok $? "its message says what to fix (the agent's --node)"
events() { # how many NodeNotFound Events there are about n1
	kubectl get events -A -o json 2>/dev/null | /usr/bin/python3 -c 'import json,sys
print(sum(1 for e in json.load(sys.stdin)["items"]
          if e.get("reason") == "NodeNotFound" and e["involvedObject"]["name"] == "n1"))'
}
at_least_events() { [ "$(events)" -ge "$1" ]; }
wait_for 20 at_least_events 2
ok $? "a Warning Event NodeNotFound on each node object ($(events))"
[ "$(metric "$PORT" gkm_agent_node_found)" = 0 ] &&
	[ "$(metric "$PORT" 'gkm_agent_errors_total{kind="node_lookup"}')" -ge 1 ]
ok $? "metrics: gkm_agent_node_found 0, node lookups counted as errors"

$G operator --kubeconfig "$KUBECONFIG" --leader-elect false --health-listen "" >"$W/operator.log" 2>&1 &
PID[operator]=$!
rewritten() { [ "$(metric "$PORT" gkm_agent_node_objects_rewritten_total)" -ge 1 ]; }
wait_for 30 rewritten
ok $? "the operator deletes the objects of a node it cannot find; the agent writes them back, counted" ||
	tail -5 "$W/operator.log"
grep -q "this node's object was deleted (the operator deletes the objects of nodes it cannot find" "$W/agent.log"
ok $? "the agent's log says why its objects disappear"
wait_for 30 is False/NodeNotFound cond cgkmcn
ok $? "the written-back object says NodeFound=False again"
wait_for 20 at_least_events 3
ok $? "... with an Event of its own ($(events) in all)"
daemon_stop operator

printf 'apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n' | kubectl apply -f - >/dev/null
ok $? "the Node n1 is created"
wait_for 90 is True/Found cond cgkmcn
ok $? "the agent finds it by itself: NodeFound=True"
NODE_UID=$(kubectl get node n1 -o jsonpath='{.metadata.uid}')
owner() { kubectl get "$@" n1 -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].uid}'; }
wait_for 20 is "Node/$NODE_UID" owner cgkmcn && wait_for 20 is "Node/$NODE_UID" owner gkmcn -n team
ok $? "its node objects are owned by the Node now"
[ "$(metric "$PORT" gkm_agent_node_found)" = 1 ]
ok $? "metrics: gkm_agent_node_found 1"

# RBAC: the API server refuses the agent's reads of its Node
daemon_stop agent
kubectl delete clusterrolebinding gkm-agent-nodes >/dev/null
start_agent
wait_for 30 is Unknown/NodeForbidden cond cgkmcn
ok $? "a Node the agent may not read: NodeFound=Unknown, NodeForbidden" || cond cgkmcn
kubectl get cgkmcn n1 -o jsonpath='{.status.conditions[0].message}' | grep -q "get on nodes"
ok $? "its message names the permission the agent needs"
nodes_binding
wait_for 90 is True/Found cond cgkmcn
ok $? "permission given: found again without a restart"

daemon_stop agent
finish
