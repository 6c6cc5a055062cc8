#!/usr/bin/env bash
# Node labels of ready caches on a real control plane (kube-apiserver, etcd,
# the controller manager and the real kube-scheduler from GKM_KUBE_ASSETS):
# three Nodes with different GPUs (node-1 a T4, node-2 two MI210s, node-3
# both), one `gkm agent` each and the operator, caches signed with
# `gkm cache sign` in a real registry. The operator labels each Node with the
# caches Ready on it, by server-side apply under gkm-operator/node-labels;
# the test reads what a user and the scheduler see: the labels, the Node's
# managedFields, status.nodeLabel, where the scheduler binds pods that
# require a label, and how the labels follow a failed cache, a policy change
# through the gkm-policies ConfigMap, a label removed by hand, a deleted
# cache, a node whose agent and reports went, an operator restarted (with
# nothing to do, and after a cache was deleted while it was down), and
# `gkm labels remove` at uninstall. Labels other managers own stay throughout.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/kubeenv.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/daemon.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
INV=spec/fixtures/gpu/inventory
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-labels-e2e.XXXXXX")
declare -A PORT
cleanup() {
	daemon_stop_all
	kubeenv_stop
	registry_stop_all
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }

if why=$(kubeenv_unavailable kube-scheduler); then
	skip "Node labels on a real control plane" "$why"
	finish
	exit
fi
if ! registry_available; then
	skip "Node labels on a real control plane" "docker-registry is not installed"
	finish
	exit
fi
registry_start labels || { ok 1 "registry starts"; finish; exit; }
R=$REG_labels_ADDR
kubeenv_start --controller-manager --scheduler || { ok 1 "the control plane starts"; finish; exit; }
trap cleanup EXIT # kubeenv_start installed its own; ours also stops it
K=$KUBECONFIG

$G cache keygen --output-key-prefix "$W/trusted" >/dev/null 2>&1 && mkdir -p "$W/trust" &&
	cp "$W/trusted.pub" "$W/trust/" &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/cuda:v1" >/dev/null 2>&1 &&
	$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/caches/rocm:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/cuda:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/rocm:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/unsigned:v1" --label variant=unsigned >/dev/null 2>&1
ok $? "cache images built, pushed and signed (one left unsigned)"

kubectl create namespace gkm >/dev/null &&
	for i in 1 2 3; do kubeenv_ctl node "node-$i" >/dev/null || exit 1; done &&
	kubectl label node node-1 team=ml >/dev/null &&
	kubectl label node node-2 default.gkmcache.gkm.io/by-hand=ready >/dev/null
ok $? "three schedulable Nodes; node-1 labelled team=ml, node-2 given a cache-like label by hand"

GPUS=([1]=t4 [2]=mi210 [3]=mixed)
start_agent() { # i
	local i=$1
	mkdir -p "$W/n$i/root" "$W/n$i/run"
	[ -n "${PORT[agent$i]:-}" ] || PORT[agent$i]=$(free_port)
	$G agent --node "node-$i" --kubeconfig "$K" --gpu-file "$INV/${GPUS[$i]}.json" \
		--root "$W/n$i/root" --run-dir "$W/n$i/run" --trust-dir "$W/trust" \
		--health-listen "127.0.0.1:${PORT[agent$i]}" >>"$W/agent$i.log" 2>&1 &
	PID[agent$i]=$!
}
start_operator() {
	[ -n "${PORT[op]:-}" ] || PORT[op]=$(free_port)
	$G operator --kubeconfig "$K" --leader-elect false --trust-dir "$W/trust" --resolve-digests true \
		--health-listen "127.0.0.1:${PORT[op]}" >>"$W/operator.log" 2>&1 &
	PID[op]=$!
	wait_for 20 curl -sf "http://127.0.0.1:${PORT[op]}/readyz"
}
for i in 1 2 3; do start_agent "$i"; done
start_operator
ok $? "three agents and the operator run"

LONG=kernels-for-a-long-model-name-llama-3-70b-instruct-fp8-sm75-vector-add
LONG_KEY=$(py "import hashlib; n='$LONG'; print('clustergkmcache.gkm.io/' + n[:46].rstrip('-.') + '-' + hashlib.sha256(n.encode()).hexdigest()[:16])")
VA=default.gkmcache.gkm.io/vector-add
RO=clustergkmcache.gkm.io/rocm
cache() { # kind name image [namespace]
	printf 'apiVersion: gkm.io/v1alpha1\nkind: %s\nmetadata: {name: %s%s}\nspec: {image: %s}\n' \
		"$1" "$2" "${4:+, namespace: $4}" "$3"
}
{ cache GKMCache vector-add "$R/caches/cuda:v1" default && echo --- &&
	cache ClusterGKMCache rocm "$R/caches/rocm:v1" && echo --- &&
	cache ClusterGKMCache "$LONG" "$R/caches/cuda:v1" && echo --- &&
	cache GKMCache rogue "$R/caches/unsigned:v1" default; } | kubectl apply -f - >/dev/null
ok $? "caches: vector-add (CUDA), rocm (HIP), a ${#LONG}-character name (CUDA), rogue (unsigned)"

# the labels of a Node that name caches, sorted, "key" when the value is ready
labels() {
	kubectl get node "$1" -o json | py "import json,sys,re
l = json.load(sys.stdin)['metadata'].get('labels', {})
print(','.join(sorted(k if v == 'ready' else k + '=' + v for k, v in l.items()
                      if re.search(r'(^|\.)gkmcache\.gkm\.io/|^clustergkmcache\.gkm\.io/', k))))"
}
all_labels() { echo "1:$(labels node-1) 2:$(labels node-2) 3:$(labels node-3)"; }
want() { # node-1 node-2 node-3 label sets (comma-separated, sorted)
	echo "1:$1 2:$2 3:$3"
}
sorted() { tr ' ' '\n' <<<"$*" | sort | paste -sd, -; }
BY_HAND=default.gkmcache.gkm.io/by-hand
W1=$(sorted $VA "$LONG_KEY") W2=$(sorted $BY_HAND $RO) W3=$(sorted $VA $RO "$LONG_KEY")
wait_for 60 is "$(want "$W1" "$W2" "$W3")" all_labels
ok $? "each Node carries the labels of the caches Ready on it, and only those" || echo "# $(all_labels)"

status_of() { kubectl get "$@" -o json | py "import json,sys; s=json.load(sys.stdin)['status']; print(s.get('nodeLabel'), s.get('readyNodes'), s.get('failedNodes'))"; }
[ "$(status_of gkmc vector-add)" = "$VA 2 0" ] && [ "$(status_of cgkmc rocm)" = "$RO 2 0" ] &&
	[ "$(status_of cgkmc "$LONG")" = "$LONG_KEY 2 0" ]
ok $? "status.nodeLabel names each cache's key (a long name cut to 46 characters and a sha256 prefix); readyNodes matches the labelled nodes"
kubectl describe gkmc vector-add >"$W/describe" 2>&1
grep -qE "^  Node Label: +$VA\$" "$W/describe"
ok $? "kubectl describe shows the Node Label" || sed 's/^/#   /' "$W/describe" | head -40
wait_for 30 is "2" eval "kubectl get gkmc rogue -o jsonpath='{.status.failedNodes}'" &&
	! kubectl get nodes -o name -l default.gkmcache.gkm.io/rogue | grep -q .
ok $? "a cache that failed (unsigned, refused by the nodes) labels no Node"

kubectl get node node-3 -o json --show-managed-fields | py "import json,sys
o = json.load(sys.stdin)
mine = [m for m in o['metadata']['managedFields'] if m['manager'] == 'gkm-operator/node-labels']
assert len(mine) == 1 and mine[0]['operation'] == 'Apply' and 'subresource' not in mine[0], mine
want = {'f:' + k: {} for k in '$W3'.split(',')}
assert mine[0]['fieldsV1'] == {'f:metadata': {'f:labels': want}}, mine[0]['fieldsV1']
others = [m for m in o['metadata']['managedFields'] if m['manager'] != 'gkm-operator/node-labels']
for m in others:
    owned = m.get('fieldsV1', {}).get('f:metadata', {}).get('f:labels', {})
    assert not set(owned) & set(want), m"
ok $? "node-3's managedFields: gkm-operator/node-labels applied exactly its cache labels, which no other manager owns"
[ "$(kubectl get node node-1 -o jsonpath='{.metadata.labels.team}')" = ml ]
ok $? "labels of other managers stay (team=ml)"

# ---- the real scheduler ----
pod() { # name key...: a pod that requires each key's label to be ready
	local name=$1 k
	shift
	printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: default}\nspec:\n' "$name"
	printf '  containers: [{name: c, image: registry.invalid/model-server:1}]\n'
	printf '  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: ['
	for k in "$@"; do printf '{key: "%s", operator: In, values: [ready]},' "$k"; done
	printf ']}]}}}\n'
}
{ for i in 1 2 3 4 5 6; do pod "va-$i" $VA && echo ---; done
	for i in 1 2 3 4; do pod "ro-$i" $RO && echo ---; done
	pod both $VA $RO && echo --- && pod rogue-user default.gkmcache.gkm.io/rogue; } | kubectl apply -f - >/dev/null
ok $? "pods that require the label of vector-add, rocm, both, or the failed cache"
node_of() { kubectl get pod "$1" -o jsonpath='{.spec.nodeName}'; }
bound() { # pod allowed-node...: bound, to one of them
	local n
	n=$(node_of "$1")
	[ -n "$n" ] && [[ " ${*:2} " == *" $n "* ]]
}
all_bound() {
	local i
	for i in 1 2 3 4 5 6; do bound "va-$i" node-1 node-3 || return 1; done
	for i in 1 2 3 4; do bound "ro-$i" node-2 node-3 || return 1; done
	bound both node-3
}
wait_for 30 all_bound
ok $? "the scheduler binds each pod only to a node where its caches are Ready (both: node-3 alone)" ||
	kubectl get pods -o wide | sed 's/^/#   /'
unschedulable() {
	[ -z "$(node_of "$1")" ] &&
		[ "$(kubectl get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}')" = Unschedulable ]
}
wait_for 20 unschedulable rogue-user
ok $? "a pod that requires the failed cache is not scheduled (Unschedulable)"

# ---- nothing to do, nothing written; a label removed by hand comes back ----
daemon_stop op
start_operator && sleep 2 &&
	[ -z "$(metric "${PORT[op]}" 'gkm_operator_node_label_applies_total{result="applied"}')" ] &&
	[ "$(all_labels)" = "$(want "$W1" "$W2" "$W3")" ]
ok $? "a restarted operator that finds every Node as it should be applies nothing"
kubectl label node node-2 "$RO-" >/dev/null && wait_for 20 is "$W2" labels node-2
ok $? "a label removed by hand is applied again"
[ "$(metric "${PORT[op]}" 'gkm_operator_node_label_applies_total{result="applied"}')" = 1 ]
ok $? "... with one apply"

# ---- labels follow a policy change through the gkm-policies ConfigMap ----
kubectl create configmap gkm-policies -n gkm --from-file=spec/fixtures/policy/deny-cuda/compat.lua >/dev/null
wait_for 30 is "$(want "" "$W2" "$RO")" all_labels
ok $? "a policy that makes the CUDA caches incompatible takes their labels away; rocm's stay" || echo "# $(all_labels)"
pod va-late $VA | kubectl apply -f - >/dev/null && wait_for 20 unschedulable va-late
ok $? "a new pod that requires vector-add is not scheduled while no node has it Ready"
kubectl delete configmap gkm-policies -n gkm >/dev/null
wait_for 30 is "$(want "$W1" "$W2" "$W3")" all_labels
ok $? "the built-in policy back: the labels come back" || echo "# $(all_labels)"
wait_for 30 bound va-late node-1 node-3
ok $? "... and the waiting pod is bound to a node where vector-add is Ready"

# ---- a deleted cache; a node whose reports went ----
kubectl delete gkmc vector-add >/dev/null
wait_for 30 is "$(want "$LONG_KEY" "$W2" "$(sorted $RO "$LONG_KEY")")" all_labels
ok $? "a deleted cache's label goes from every node" || echo "# $(all_labels)"
daemon_stop agent3
kubectl delete cgkmcn node-3 >/dev/null && kubectl delete gkmcn node-3 -n default --ignore-not-found >/dev/null
wait_for 30 is "$(want "$LONG_KEY" "$W2" "")" all_labels
ok $? "a node whose agent and reports are gone loses its labels (the Node stays)" || echo "# $(all_labels)"

# ---- a cache deleted while the operator was down ----
daemon_stop op
kubectl delete cgkmc rocm >/dev/null
sleep 1
[ "$(labels node-2)" = "$W2" ]
ok $? "with the operator down, the deleted cache's label is still there"
start_operator && wait_for 20 is "$(want "$LONG_KEY" "$BY_HAND" "")" all_labels
ok $? "the restarted operator removes it at start-up; the label set by hand stays" || echo "# $(all_labels)"

# ---- uninstall ----
daemon_stop op
$G labels remove --kubeconfig "$K" --dry-run >"$W/dry" 2>&1 &&
	grep -qx "node-1: would remove $LONG_KEY" "$W/dry" && grep -qx "would remove 1 label on 1 of 3 Nodes" "$W/dry" &&
	[ "$(labels node-1)" = "$LONG_KEY" ]
ok $? "gkm labels remove --dry-run says what it would remove and changes nothing" || sed 's/^/#   /' "$W/dry"
$G labels remove --kubeconfig "$K" >"$W/rm" 2>&1 && grep -qx "removed 1 label on 1 of 3 Nodes" "$W/rm" &&
	[ "$(all_labels)" = "$(want "" "$BY_HAND" "")" ] &&
	[ "$(kubectl get node node-1 -o jsonpath='{.metadata.labels.team}')" = ml ]
ok $? "gkm labels remove takes away every label the operator set, and nothing else" || sed 's/^/#   /' "$W/rm"
! kubectl get nodes -o json --show-managed-fields | grep -q 'gkm-operator/node-labels'
ok $? "no Node lists the field manager any more"
$G labels remove --kubeconfig "$K" >"$W/rm" 2>&1 && grep -qx "removed 0 labels on 0 of 3 Nodes" "$W/rm"
ok $? "run again, it has nothing to do" || sed 's/^/#   /' "$W/rm"
expect 2 "gkm labels with an unknown command is a usage error" "unknown command 'rm'" $G labels rm
sed "s#$KUBEENV_URL#https://127.0.0.1:$(free_port)#" "$K" >"$W/nowhere.kubeconfig"
expect 1 "gkm labels remove says why when the API server cannot be reached" "cannot list the Nodes: .+" \
	$G labels remove --kubeconfig "$W/nowhere.kubeconfig"

finish
