#!/usr/bin/env bash
# The Kubernetes mode end to end on a real control plane (kube-apiserver,
# etcd and the controller manager from GKM_KUBE_ASSETS): gkm's CRDs, the gkm
# webhook in the API server's admission chain (a URL webhook with caBundle), a
# real registry with images built and signed by `gkm cache`, three nodes with
# different GPUs (node-1 a T4, node-2 two MI210s, node-3 a T4 and two MI210s),
# one `gkm agent` per node and two leader-elected `gkm operator` replicas on a
# real Lease. Asserts what a user sees: node objects, aggregated status,
# `kubectl get` and `kubectl describe` output, Events, the files of the cache
# views; then the API server killed and restarted under the running daemons, a
# policy flip through the gkm-policies ConfigMap, a broken policy, an agent
# killed during extraction, a cache deleted while a pod uses it, and nodes
# deleted (the operator up, down, and the garbage collector alone).
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/kubeenv.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/daemon.sh"
. "$(dirname "$0")/../lib/kubewebhook.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
INV=spec/fixtures/gpu/inventory
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-kube-e2e.XXXXXX")
declare -A PORT
cleanup() {
	daemon_stop_all
	[ -n "${BIG_PID:-}" ] && kill "$BIG_PID" 2>/dev/null
	kubeenv_stop
	registry_stop_all
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }
# the node's record of a cache: "state reason" from its ready.json
record() { py "import json; r=json.load(open('$1/ready.json')); print(r['state'], r['reason'])" 2>/dev/null; }

if why=$(kubeenv_unavailable); then
	skip "Kubernetes mode end to end" "$why"
	finish
	exit
fi
if ! registry_available; then
	skip "Kubernetes mode end to end" "docker-registry is not installed"
	finish
	exit
fi
registry_start kube || { ok 1 "registry starts"; finish; exit; }
R=$REG_kube_ADDR

$G cache keygen --output-key-prefix "$W/trusted" >/dev/null 2>&1 &&
	mkdir -p "$W/trust" && cp "$W/trusted.pub" "$W/trust/"
ok $? "a signing key pair; the agents trust its public key"

# the larger image for the kill test is generated while the rest starts:
# about 55 MB in 1,000 files, its kernels retargeted to the T4 (sm_75)
(/usr/bin/python3 spec/lib/gen_cache_tree.py "$W/big" --scale 0.05 &&
	py "
import json, pathlib
for p in pathlib.Path('$W/big/io.triton.cache').glob('*/*.json'):
    m = json.loads(p.read_text())
    m['target']['arch'] = 75
    m['ptx_version'] = None
    p.write_text(json.dumps(m))" &&
	$G cache build "$W/big/io.triton.cache" -t "$R/caches/big:v1" >"$W/big.log" 2>&1 &&
	$G cache sign "$R/caches/big:v1" --key "$W/trusted.key" >>"$W/big.log" 2>&1) &
BIG_PID=$!

kubeenv_start --controller-manager || { ok 1 "the control plane starts"; finish; exit; }
trap cleanup EXIT # kubeenv_start installed its own; ours also stops it
K=$KUBECONFIG
$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/cuda:v1" >/dev/null 2>&1 &&
	$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/caches/rocm:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/cuda:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/rocm:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/unsigned:v1" --label variant=unsigned >/dev/null 2>&1
ok $? "cache images built, pushed and signed with gkm cache (one left unsigned)"

digest_of() { registry_digest "$R" "$1"; } # repo:tag -> the registry's manifest digest
CUDA_DIGEST=$(digest_of caches/cuda:v1)

# ---- the webhook, called by the API server for namespaced caches ----
# (ClusterGKMCaches are left out of its rules, so that one cache shows what
# happens without a webhook.)
kubewebhook_start "$G" "$W/webhook.log" --trust-dir "$W/trust" --plain-http
ok $? "gkm webhook registered by URL with caBundle (its certificate signed by the cluster CA)"

# ---- cluster objects and daemons ----
kubectl create namespace gkm >/dev/null && kubectl create namespace team-b >/dev/null
for i in 1 2 3; do
	printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: node-%s\n  labels: {kubernetes.io/hostname: node-%s}\n' \
		"$i" "$i" | kubectl apply -f - >/dev/null || break
done
ok $? "three Node objects"

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
start_operator() { # identity [flags...]
	local id=$1
	shift
	[ -n "${PORT[$id]:-}" ] || PORT[$id]=$(free_port)
	$G operator --kubeconfig "$K" --identity "$id" --trust-dir "$W/trust" \
		--health-listen "127.0.0.1:${PORT[$id]}" "$@" >>"$W/$id.log" 2>&1 &
	PID[$id]=$!
}
for i in 1 2 3; do start_agent "$i"; done
start_operator op-a
start_operator op-b
agents_ready() { curl -sf "http://127.0.0.1:${PORT[agent1]}/readyz" && curl -sf "http://127.0.0.1:${PORT[agent2]}/readyz" &&
	curl -sf "http://127.0.0.1:${PORT[agent3]}/readyz"; }
wait_for 30 agents_ready
ok $? "three agents are up and ready"

holder() { kubectl get lease gkm-operator -n gkm -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
leads() { grep -q "became the leader" "$W/$1.log"; }
leads_one() { [ -n "$(holder)" ] && { leads op-a || leads op-b; }; }
wait_for 20 leads_one
LEADER=$(holder)
case $LEADER in op-a) FOLLOWER=op-b ;; op-b) FOLLOWER=op-a ;; *) FOLLOWER="" ;; esac
[ -n "$FOLLOWER" ] && leads "$LEADER" && ! leads "$FOLLOWER"
ok $? "two operator replicas, one leader ($LEADER holds the Lease; the other waits)"

# ---- a namespaced cache, its digest set the way the webhook sets it ----
cat >"$W/vector-add.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: vector-add
  namespace: default
spec:
  image: $R/caches/cuda:v1
EOF
cat >"$W/rocm.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata:
  name: rocm
spec:
  image: $R/caches/rocm:v1
EOF
kubectl apply -f "$W/vector-add.yaml" -f "$W/rocm.yaml" >"$W/out" 2>&1
ok $? "a GKMCache and a ClusterGKMCache applied"
[ "$(kubectl get gkmc vector-add -o jsonpath='{.metadata.annotations.gkm\.io/resolvedDigest}')" = "$CUDA_DIGEST" ]
ok $? "the API server's admission chain called the webhook: the GKMCache carries the verified digest"
printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: rogue, namespace: default}\nspec: {image: %s}\n' \
	"$R/caches/unsigned:v1" | kubectl apply -f - >"$W/out" 2>&1
[ $? != 0 ] && grep -q 'admission webhook "mutate.gkm.io" denied the request: Unsigned' "$W/out" &&
	! kubectl get gkmc rogue >/dev/null 2>&1
ok $? "an unsigned image is refused by the API server with the webhook's reason" || sed 's/^/#   /' "$W/out"

json() { # kubectl get args... : the object as JSON
	kubectl get "$@" -o json 2>/dev/null
}
field() { # python expression on o; then kubectl get args
	local expr=$1
	shift
	json "$@" | py "import json,sys; o=json.load(sys.stdin); print($expr)" 2>/dev/null
}
cond() { # type kubectl-get-args... : "status reason" of a condition
	local t=$1
	shift
	field "' '.join([c['status'] + ' ' + c['reason'] for c in o['status']['conditions'] if c['type'] == '$t'])" "$@"
}
wait_for 40 is 2 field "o['status']['readyNodes']" gkmc vector-add
ok $? "vector-add becomes ready on the two nodes with a T4"
# the nodes may report Ready (VerifiedOnNodes) before the operator's own
# signature check has answered; the condition then moves on to that verdict
wait_for 30 is "True SignatureVerified" cond Verified gkmc vector-add
ok $? "the operator's own check of the signature: Verified True, SignatureVerified"

S=$(json gkmc vector-add)
pyo() { printf '%s' "$S" | py "import json,sys; o=json.load(sys.stdin); $1"; }
pyo "s=o['status']; assert (s['totalNodes'], s['readyNodes'], s['failedNodes'], s['incompatibleNodes']) == (3, 2, 0, 1), s"
ok $? "status: totalNodes 3, readyNodes 2, failedNodes 0, incompatibleNodes 1"
pyo "s=o['status']; assert s['incompatibleNodeConditions'] == {'BackendMismatch': ['node-2']} and 'failedNodeConditions' not in s, s"
ok $? "status: incompatibleNodeConditions groups node-2 under BackendMismatch; no failedNodeConditions"
pyo "
c = {c['type']: c for c in o['status']['conditions']}
assert c['Verified']['status'] == 'True' and c['Verified']['reason'] == 'SignatureVerified', c['Verified']
assert c['Verified']['message'].startswith('the operator verified the signature of $CUDA_DIGEST'), c['Verified']
assert c['Ready']['status'] == 'True' and 'ready on 2 of 3 nodes; 1 without a compatible GPU' in c['Ready']['message'], c['Ready']
assert c['Progressing']['status'] == 'False' and c['Error']['status'] == 'False'
assert all(x['observedGeneration'] == o['metadata']['generation'] for x in c.values())
assert o['status']['resolvedDigest'] == '$CUDA_DIGEST'"
ok $? "status: Verified (the operator checked the signature itself), Ready, not Progressing, no Error, digest copied"
json gkmc vector-add --show-managed-fields | py "import json,sys
m = json.load(sys.stdin)['metadata']['managedFields']
st = [f for f in m if f.get('subresource') == 'status']
assert [(f['manager'], f['operation']) for f in st] == [('gkm-operator', 'Apply')], st
assert 'f:readyNodes' in st[0]['fieldsV1']['f:status'], st[0]"
ok $? "the cache's status has one field manager, gkm-operator, by server-side apply"

# node objects: one GKMCacheNode per node in the cache's namespace
node_obj() { # kind ns node python-assertions on o
	json "$1" "$3" ${2:+-n "$2"} --show-managed-fields | py "import json,sys; o=json.load(sys.stdin); $4"
}
meta_ok=0
for i in 1 2 3; do
	NODE_UID=$(kubectl get node "node-$i" -o jsonpath='{.metadata.uid}')
	for kind in gkmcn:default cgkmcn:; do
		node_obj "${kind%%:*}" "${kind#*:}" "node-$i" "NODE_UID='$NODE_UID'
m = o['metadata']
assert m['labels']['gkm.io/node'] == 'node-$i', m
ref = m['ownerReferences'][0]
assert (ref['kind'], ref['name'], ref['uid']) == ('Node', 'node-$i', NODE_UID), ref
assert o['spec']['nodeName'] == 'node-$i'
mgrs = set(f['manager'] for f in m['managedFields'])
assert mgrs == {'gkm-agent/node-$i'}, mgrs
assert any(f.get('subresource') == 'status' for f in m['managedFields'])" || meta_ok=1
	done
done
ok $meta_ok "node objects: a GKMCacheNode and a ClusterGKMCacheNode per node, label gkm.io/node, owned by the Node, written only by gkm-agent/<node> (spec and status)"

entry() { # ns ("" for cluster scope) node cache python-assertions on e
	if [ -n "$1" ]; then json gkmcn "$2" -n "$1"; else json cgkmcn "$2"; fi | py "import json,sys; o=json.load(sys.stdin); e=o['status']['caches']['$3']; $4"
}
entry default node-1 vector-add "
assert e['state'] == 'Ready' and e['digest'] == '$CUDA_DIGEST', e
assert [s['ids'] for s in e['compatibleGPUs']] == [[0]] and e['incompatibleGPUs'] == [], e"
ok $? "node-1 (T4): Ready, GPU 0 compatible"
entry default node-2 vector-add "
assert e['state'] == 'Incompatible' and e['reason'] == 'BackendMismatch', e
assert e['compatibleGPUs'] == [] and [(s['ids'], s['reason']) for s in e['incompatibleGPUs']] == [([0, 1], 'BackendMismatch')], e
assert 'cuda' in e['incompatibleGPUs'][0]['message'], e"
ok $? "node-2 (two MI210s): Incompatible, GPUs 0 and 1 one set with reason and message"
entry default node-3 vector-add "
assert e['state'] == 'Ready', e
assert [s['ids'] for s in e['compatibleGPUs']] == [[0]], e
assert [(s['ids'], s['reason']) for s in e['incompatibleGPUs']] == [([1, 2], 'BackendMismatch')], e"
ok $? "node-3 (mixed): Ready for GPU 0, GPUs 1 and 2 incompatible (BackendMismatch)"
node_obj cgkmcn "" node-3 "
g = o['status']['gpus']
assert [(x['ids'], x['gpuType']) for x in g] == [([0], 'Tesla T4'), ([1, 2], 'AMD Instinct MI210')], g"
ok $? "ClusterGKMCacheNode lists node-3's GPUs as two id sets"

V1=$W/n1/root/caches/default/vector-add
cmp -s "$V1/data/io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin" \
	"$FX/cuda-sm75-vector-add/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin" &&
	[ "$(py "import json; print(json.load(open('$V1/ready.json'))['state'])")" = Ready ] &&
	[ ! -e "$W/n2/root/caches/default/vector-add/data" ] && [ -z "$(ls -A "$W/n2/root/store/sha256" 2>/dev/null)" ]
ok $? "node-1's view holds the packaged kernel byte for byte; node-2 pulled nothing"

kubectl get gkmc >"$W/get" 2>&1
grep -qE "^vector-add +${CUDA_DIGEST} +True +2 +3 +0 +1 +Ready +[0-9]+s" "$W/get" &&
	head -1 "$W/get" | grep -qE '^NAME +DIGEST +VERIFIED +READY-NODES +TOTAL-NODES +FAILED-NODES +INCOMPATIBLE-NODES +STATUS +AGE$'
ok $? "kubectl get gkmc: digest, Verified True, 2 ready of 3, none failed, 1 incompatible, Ready" || sed 's/^/#   /' "$W/get"
kubectl get gkmcn -n default >"$W/get" 2>&1
grep -qE '^node-1 +node-1 +Tesla T4 +1 +1 +0 +0 ' "$W/get" && grep -qE '^node-2 +node-2 +AMD Instinct MI210 +0 +1 +0 +1 ' "$W/get"
ok $? "kubectl get gkmcn: GPU, caches ready / total / failed / incompatible per node" || sed 's/^/#   /' "$W/get"
described() { kubectl describe "$@" 2>&1 | grep -q "$DESCRIBED"; }
DESCRIBED=CacheReady wait_for 10 described gkmc vector-add
kubectl describe gkmc vector-add >"$W/describe" 2>&1
grep -qE '^ +Type: +Ready$' "$W/describe" && grep -qE 'Message: +ready on 2 of 3 nodes' "$W/describe" &&
	grep -qE '^Events:' "$W/describe" && grep -qE 'Normal +CacheReady +.* gkm-operator +ready on 2 of 3 nodes' "$W/describe"
ok $? "kubectl describe gkmc: conditions and the CacheReady Event from gkm-operator" || sed 's/^/#   /' "$W/describe"

# no webhook and verification on: nothing resolves the cluster cache's tag
wait_for 20 is "False DigestNotResolved" cond Ready cgkmc rocm
ok $? "ClusterGKMCache without a digest: Ready False, DigestNotResolved"
entry "" node-2 rocm "assert e['state'] == 'Pending' and e['reason'] == 'DigestNotResolved' and 'digest' not in e, e"
ok $? "... and the nodes wait for it (Pending, DigestNotResolved), pulling nothing"

# ---- leader failover ----
daemon_stop "$LEADER"
wait_for 20 leads "$FOLLOWER"
ok $? "the leader stops, the other replica takes over ($FOLLOWER)"
[ "$(holder)" = "$FOLLOWER" ]
ok $? "the Lease names the new leader"
[ "$(grep -c 'info became the leader' "$W/$FOLLOWER.log")" = 1 ]
ok $? "the new leader took over once"

# ---- no webhook, verification off: the operator resolves digests ----
daemon_stop "$FOLLOWER"
start_operator op-c --verify-enabled false
wait_for 30 is 2 field "o['status']['readyNodes']" cgkmc rocm
ok $? "with --verify-enabled false the operator resolves the cluster cache; ready on node-2 and node-3"
S=$(json cgkmc rocm)
pyo "
s = o['status']
assert s['resolvedDigest'] == '$(digest_of caches/rocm:v1)', s
assert (s['totalNodes'], s['readyNodes'], s['failedNodes'], s['incompatibleNodes']) == (3, 2, 0, 1), s
assert s['incompatibleNodeConditions'] == {'BackendMismatch': ['node-1']}, s
c = {c['type']: c for c in s['conditions']}
assert (c['Verified']['status'], c['Verified']['reason']) == ('False', 'VerificationDisabled'), c
assert c['Ready']['status'] == 'True'"
ok $? "cluster cache status: digest, 2 of 3 ready, node-1 BackendMismatch, Verified False (VerificationDisabled)"
entry "" node-3 rocm "
assert e['state'] == 'Ready', e
assert [s['ids'] for s in e['compatibleGPUs']] == [[1, 2]] and [s['ids'] for s in e['incompatibleGPUs']] == [[0]], e"
ok $? "ClusterGKMCacheNode node-3: the MI210s (1, 2) compatible, the T4 (0) not"
[ -e "$W/n2/root/caches/_cluster/rocm/data" ] && [ ! -e "$W/n1/root/caches/_cluster/rocm/data" ] &&
	is "Incompatible BackendMismatch" record "$W/n1/root/caches/_cluster/rocm"
ok $? "cluster-scoped views under caches/_cluster on the nodes that can use them; node-1's record says why not"
kubectl get cgkmc >"$W/get" 2>&1
grep -qE '^rocm +sha256:[0-9a-f]{64} +False +2 +3 +0 +1 +Ready ' "$W/get"
ok $? "kubectl get cgkmc: Verified False, 2 ready of 3" || sed 's/^/#   /' "$W/get"
kubectl describe cgkmc rocm >"$W/describe" 2>&1
grep -qE 'Warning +VerificationDisabled +.* gkm-operator' "$W/describe"
ok $? "kubectl describe cgkmc: a Warning Event says verification is off" || sed 's/^/#   /' "$W/describe"

# ---- the API server killed and restarted under the running daemons ----
usage_json() { # pod-name: a usage record of vector-add for one pod
	cat <<EOF
{"namespace": "default", "name": "vector-add",
 "pods": [{"name": "$1", "namespace": "default", "uid": "4c3f7a36-2f1e-4f47-9d8e-0a1b2c3d4e5f",
           "volumeId": "csi-0123456789abcdef", "targetPath": "/var/lib/kubelet/pods/4c3f7a36/volumes/kubernetes.io~csi/cache/mount",
           "digest": "$CUDA_DIGEST", "readOnly": true, "started": "2026-01-01T00:00:00Z"}],
 "updated": "2026-01-01T00:00:00Z"}
EOF
}
U=$W/n1/run/usage/default/vector-add
kubeenv_ctl kill kube-apiserver >/dev/null &&
	mkdir -p "$U" && usage_json during-outage >"$U/usage.json" && sleep 3 &&
	kubeenv_ctl start kube-apiserver >/dev/null
ok $? "the API server killed (SIGKILL) while a pod starts using a cache on node-1, then started again"
wait_for 30 entry default node-1 vector-add "assert [p['podName'] for p in e.get('pods', [])] == ['during-outage'], e"
ok $? "what node-1's agent saw during the outage reaches its node object once the server is back"
printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: after-restart, namespace: default}\nspec: {image: %s}\n' \
	"$R/caches/cuda:v1" | kubectl apply -f - >/dev/null &&
	wait_for 30 is 2 field "o['status']['readyNodes']" gkmc after-restart
ok $? "a cache created after the restart is admitted by the webhook, pulled by the agents, aggregated by the operator"
alive=0
for n in agent1 agent2 agent3 op-c webhook; do kill -0 "${PID[$n]}" 2>/dev/null || { alive=1 && echo "# $n is gone"; }; done
ok $alive "no daemon exited or was restarted"
[ "$(field "o['status']['readyNodes']" gkmc vector-add)" = 2 ] && [ "$(field "o['status']['readyNodes']" cgkmc rocm)" = 2 ] &&
	[ "$(kubectl get gkmcn -n default -o name | wc -l)" = 3 ]
ok $? "no status was lost: vector-add and rocm still ready on two nodes, three node objects"
rm -f "$U/usage.json" && kubectl delete gkmc after-restart >/dev/null &&
	wait_for 20 entry default node-1 vector-add "assert not e.get('pods'), e"
ok $? "the pod's usage released and the extra cache deleted"

# ---- policies from the gkm-policies ConfigMap ----
policy_cm() { # compat.lua source file
	kubectl create configmap gkm-policies -n gkm --from-file=compat.lua="$1" \
		--dry-run=client -o yaml | kubectl apply -f - >/dev/null
}
# CUDA GPUs refused by site policy; others match on backend
policy_cm spec/fixtures/policy/deny-cuda/compat.lua
ok $? "kubectl apply of the gkm-policies ConfigMap"
wait_for 20 is 0 field "o['status']['readyNodes']" gkmc vector-add
ok $? "a policy change flips the verdict: vector-add is ready nowhere"
entry default node-1 vector-add "assert e['state'] == 'Incompatible' and e['reason'] == 'DeniedByPolicy', e"
ok $? "node-1 reports DeniedByPolicy"
wait_for 10 test ! -e "$V1/data" && is "Incompatible DeniedByPolicy" record "$V1"
ok $? "node-1 withdraws the view; its record says DeniedByPolicy"
[ "$(field "o['status']['readyNodes']" cgkmc rocm)" = 2 ]
ok $? "the cluster cache (hip) is still ready under the new policy"

printf 'local M = {}\nfunction M.evaluate(input\nreturn M\n' >"$W/broken.lua"
policy_cm "$W/broken.lua"
refused() { grep -q 'policy change refused.*compat.lua:3' "$W/$1.log"; }
wait_for 20 refused agent1 && wait_for 10 refused agent3 && wait_for 10 refused op-c
ok $? "a broken policy is refused by the agents and the operator, the log names compat.lua:3"
refusals() {
	json events -n gkm --field-selector involvedObject.name=gkm-policies | py "import json,sys
print(len([e for e in json.load(sys.stdin)['items'] if e['reason'] == 'PoliciesRefused' and 'compat.lua:3' in e['message']]))"
}
wait_for 10 is 1 refusals
ok $? "the operator records one PoliciesRefused Event on the ConfigMap, naming file and line"
kubectl describe configmap gkm-policies -n gkm >"$W/describe" 2>&1
grep -qE 'Warning +PoliciesRefused .*gkm-operator .*compat.lua:3' "$W/describe"
ok $? "kubectl describe configmap shows it" || sed 's/^/#   /' "$W/describe"
field "o['metadata']['annotations']['gkm.io/policy-status'] + ' ' + o['metadata']['annotations']['gkm.io/policy-error']" \
	configmap gkm-policies -n gkm | grep -q '^Refused .*compat.lua:3'
ok $? "the ConfigMap's gkm.io/policy-status annotation says Refused, with the error"
[ "$(metric "${PORT[agent1]}" 'gkm_policy_reloads_total{result="refused"}')" -ge 1 ] 2>/dev/null
ok $? "metrics count the refused reload"
kubectl annotate gkmc vector-add gkm.io/poke=1 >/dev/null # any event: a fresh decision
sleep 1
entry default node-1 vector-add "assert e['reason'] == 'DeniedByPolicy', e" &&
	[ "$(field "o['status']['readyNodes']" gkmc vector-add)" = 0 ]
ok $? "the last good policies stay in force"

kubectl delete configmap gkm-policies -n gkm >/dev/null
wait_for 30 is 2 field "o['status']['readyNodes']" gkmc vector-add
ok $? "deleting the ConfigMap restores the built-in policies: ready on two nodes again"
[ "$(metric "${PORT[agent1]}" 'gkm_pulls_total{result="pulled"}')" = 1 ]
ok $? "... from the store, without pulling again"

# ---- an agent killed during extraction ----
wait "$BIG_PID"
ok $? "a larger image generated and pushed (55 MB, 1,000 files)"
BIG_PID=""
BIG_DIGEST=$(digest_of caches/big:v1)
BIG_HEX=${BIG_DIGEST#sha256:}
cat >"$W/big.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: big
  namespace: team-b
spec:
  image: $R/caches/big:v1
EOF
daemon_stop agent3 # keep the machine for node-1's extraction
kubectl apply -f "$W/big.yaml" >/dev/null
S1=$W/n1/root/store
py "
import os, signal, sys, time, glob
end = time.time() + 60
while time.time() < end:
    for d in glob.glob('$S1/tmp/sha256-$BIG_HEX.*'):
        if sum(len(f) for _, _, f in os.walk(d)) >= 20:
            os.kill(${PID[agent1]}, signal.SIGKILL)
            sys.exit(0)
    time.sleep(0.003)
sys.exit(1)"
ok $? "agent on node-1 killed with SIGKILL while extracting"
wait "${PID[agent1]}" 2>/dev/null
PID[agent1]=""
[ -n "$(ls "$S1/tmp/" | grep "sha256-$BIG_HEX")" ] && [ ! -e "$S1/sha256/$BIG_HEX" ] &&
	[ ! -e "$W/n1/root/caches/team-b/big/data" ] && is "Pulling Pulling" record "$W/n1/root/caches/team-b/big"
ok $? "the half-extracted tree stays in the store's tmp/: no store entry, no view; the record says Pulling"
start_agent 1
start_agent 3
wait_for 60 entry team-b node-1 big "assert e['state'] == 'Ready', e"
ok $? "restarted, the agent pulls again and the cache becomes ready"
[ -z "$(ls "$S1/tmp/")" ] && [ "$(metric "${PORT[agent1]}" 'gkm_pulls_total{result="pulled"}')" = 1 ]
ok $? "the leftovers are cleaned up; one pull"
(cd "$W/big" && find io.triton.cache -type f | sort) >"$W/want" &&
	(cd "$W/n1/root/caches/team-b/big/data/" && find io.triton.cache -type f | sort) >"$W/have" &&
	cmp -s "$W/want" "$W/have" && [ "$(wc -l <"$W/want")" -ge 1000 ] &&
	cmp -s "$W/big/$(grep -m1 cubin "$W/want")" "$W/n1/root/caches/team-b/big/data/$(grep -m1 cubin "$W/want")"
ok $? "the view holds every file of the image, a kernel binary byte for byte"
daemon_stop -KILL agent1
start_agent 1
has_metric() { [ -n "$(metric "$@")" ]; }
wait_for 30 has_metric "${PORT[agent1]}" 'gkm_agent_reconciles_total{result="ok"}'
entry team-b node-1 big "assert e['state'] == 'Ready', e" && [ -z "$(metric "${PORT[agent1]}" 'gkm_pulls_total{result="pulled"}')" ] &&
	[ -e "$W/n1/root/caches/team-b/big/ready.json" ]
ok $? "killed again once complete, it recovers from the store without pulling"
wait_for 20 is 3 eval "kubectl get gkmcn -n team-b -o name | wc -l"
ok $? "a GKMCacheNode per node in the second namespace too"

# ---- a cache deleted while a pod uses it ----
mkdir -p "$U" && usage_json model-server-0 >"$U/usage.json"
kubectl delete gkmc vector-add >/dev/null
wait_for 20 entry default node-1 vector-add "assert e['state'] == 'Deleting' and e['reason'] == 'InUse', e"
ok $? "deleted while in use: node-1 reports Deleting (InUse)"
entry default node-1 vector-add "assert [p['podName'] for p in e['pods']] == ['model-server-0'] and e['pods'][0]['volumeId'] == 'csi-0123456789abcdef', e"
ok $? "... listing the pod that uses it"
[ -e "$V1/data/io.triton.cache" ] && is "Deleting InUse" record "$V1"
ok $? "... and the view stays, its record saying Deleting (InUse)"
wait_for 20 node_obj gkmcn default node-3 "assert 'vector-add' not in o['status'].get('caches', {}), o['status']"
ok $? "node-3, where nothing uses it, drops it at once"
CUDA_HEX=${CUDA_DIGEST#sha256:}
wait_for 10 test ! -e "$W/n3/root/store/sha256/$CUDA_HEX"
ok $? "... view and extracted image"
[ -e "$W/n1/root/store/sha256/$CUDA_HEX" ]
ok $? "node-1 keeps the extracted image while the pod uses it"
rm -f "$U/usage.json"
wait_for 20 test ! -e "$V1/ready.json"
ok $? "the usage released, the view goes"
wait_for 10 node_obj gkmcn default node-1 "assert 'vector-add' not in o['status'].get('caches', {}), o['status']"
ok $? "... and the entry leaves node-1's status"
wait_for 10 test ! -e "$W/n1/root/store/sha256/$CUDA_HEX"
ok $? "... and its extracted image leaves the store"

# ---- nodes deleted ----
# Does this API server collect dependents (ownerReferences)? A probe object says.
kubectl create configmap gc-probe -n default >/dev/null
PROBE_UID=$(kubectl get node node-1 -o jsonpath='{.metadata.uid}')
py "
import json, subprocess
subprocess.run(['kubectl', 'patch', 'configmap', 'gc-probe', '-n', 'default', '--type=merge', '-p',
    json.dumps({'metadata': {'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Node', 'name': 'node-1', 'uid': '$PROBE_UID'}]}})],
    check=True, capture_output=True)"
daemon_stop agent2
kubectl delete node node-2 --cascade=orphan >/dev/null
wait_for 20 eval "! kubectl get cgkmcn node-2 >/dev/null 2>&1 && ! kubectl get gkmcn node-2 -n default >/dev/null 2>&1 && ! kubectl get gkmcn node-2 -n team-b >/dev/null 2>&1"
ok $? "node-2 deleted (its dependents orphaned): its node objects are removed"
grep -q 'deleted the node object of a node that is gone.*node=node-2' "$W/op-c.log"
ok $? "... by the operator"
wait_for 20 is 2 field "o['status']['totalNodes']" cgkmc rocm
ok $? "the cluster cache now counts two nodes"

daemon_stop op-c agent3
kubectl delete node node-3 --cascade=orphan >/dev/null
sleep 1
kubectl get cgkmcn node-3 >/dev/null 2>&1
ok $? "node-3 deleted while no operator runs: its node objects are still there"
start_operator op-c --verify-enabled false
wait_for 30 eval "! kubectl get cgkmcn node-3 >/dev/null 2>&1 && ! kubectl get gkmcn node-3 -n team-b >/dev/null 2>&1"
ok $? "the operator removes them when it starts"
wait_for 20 is 1 field "o['status']['totalNodes']" gkmc big -n team-b
ok $? "team-b/big now counts one node"

daemon_stop agent1 op-c
kubectl delete node node-1 >/dev/null
wait_for 30 eval "! kubectl get configmap gc-probe -n default >/dev/null 2>&1"
ok $? "the garbage collector removes a ConfigMap owned by the deleted node-1"
wait_for 30 eval "! kubectl get cgkmcn node-1 >/dev/null 2>&1 && ! kubectl get gkmcn node-1 -n team-b >/dev/null 2>&1"
ok $? "node-1 deleted with no operator running: the garbage collector removes its node objects (ownerReferences)"

daemon_stop webhook
[ -z "$DAEMON_UNCLEAN" ]
ok $? "every daemon stopped with SIGTERM exited cleanly" || echo "# unclean:$DAEMON_UNCLEAN"
finish
