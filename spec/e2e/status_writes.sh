#!/usr/bin/env bash
# Status writes that must never freeze, on the test API server and then on a
# real kube-apiserver (GKM_KUBE_ASSETS; skipped with the reason where it is
# not given). A real one turns an applied empty map over entries the manager
# owned into null and refuses the write (422): the operator's
# failedNodeConditions after every node recovered, the agent's caches after
# the last cache of a namespace was deleted. Both must apply without the map,
# and a status the server does refuse must say so in its conditions while the
# operator backs off. The operator runs leader-elected in its default
# namespace (gkm) and must not claim to have lost the lead when SIGTERM
# makes it release the Lease.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/loopback.sh"
. "$(dirname "$0")/../lib/daemon.sh"
cd "$GKM_ROOT"
. spec/lib/kubeserver.sh
. spec/lib/kubeenv.sh
. spec/lib/apiservers.sh
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-status-writes.XXXXXX")
D=sha256:$(printf 'cache' | sha256sum | cut -d' ' -f1)
cleanup() {
	daemon_stop_all
	kubeserver_cleanup
	kubeenv_stop
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }
status_of() { # kind name ns python-expression on s (the status)
	kubectl get "$1" "$2" -n "$3" -o json 2>/dev/null |
		py "import json,sys; s=json.load(sys.stdin).get('status') or {}; print($4)"
}

gkmcache() { # ns name [digest]: a GKMCache, its digest annotated as the webhook does
	local ann=""
	[ -n "${3:-}" ] && ann=", annotations: {gkm.io/resolvedDigest: \"$3\"}"
	kubectl apply -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: $2, namespace: $1$ann}
spec: {image: "registry.invalid/$1/$2:v1"}
EOF
}
node_objects() { # node: its two node objects, as its agent creates them
	kubectl apply --server-side --field-manager "gkm-agent/$1" -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCacheNode
metadata: {name: $1, labels: {gkm.io/node: $1}}
spec: {nodeName: $1}
---
apiVersion: gkm.io/v1alpha1
kind: GKMCacheNode
metadata: {name: $1, namespace: team, labels: {gkm.io/node: $1}}
spec: {nodeName: $1}
EOF
}
report() { # node state reason: the node's entry for team/c1, as its agent applies it
	kubectl apply --server-side --force-conflicts --field-manager "gkm-agent/$1" \
		--subresource=status -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCacheNode
metadata: {name: $1, namespace: team}
status:
  caches:
    c1: {digest: "$D", state: $2, reason: $3, message: "$3 on $1"}
EOF
}

scenario() { # label (see on_both_servers); make_node NAME makes a Node
	local on=$1 port
	kubectl create namespace gkm >/dev/null && kubectl create namespace team >/dev/null &&
		kubectl create namespace solo >/dev/null &&
		make_node node-1 && make_node node-2 && make_node node-a &&
		node_objects node-1 && node_objects node-2 &&
		gkmcache team c1 "$D"
	ok $? "$on: two Nodes, their node objects and a cache with its digest"

	port=$(free_port)
	# leader-elected, on a Lease in namespace gkm (its --namespace default)
	$G operator --kubeconfig "$KUBECONFIG" --identity op-1 \
		--health-listen "127.0.0.1:$port" >"$W/operator-$on.log" 2>&1 &
	PID[op]=$!
	report node-1 Failed PullFailed && report node-2 Failed PullFailed &&
		wait_for 30 is "2 {'PullFailed': ['node-1', 'node-2']}" \
			status_of gkmc c1 team "s.get('failedNodes'), s.get('failedNodeConditions')"
	ok $? "$on: both nodes fail: failedNodes 2, failedNodeConditions lists them under PullFailed"

	# the registry came back: the map empties, and must leave the status
	report node-1 Ready Ready && report node-2 Ready Ready &&
		wait_for 30 is "2 0 None" \
			status_of gkmc c1 team "s.get('readyNodes'), s.get('failedNodes'), s.get('failedNodeConditions')"
	ok $? "$on: both recover: readyNodes 2, failedNodes 0, no failedNodeConditions" ||
		{ status_of gkmc c1 team s | sed 's/^/#   /'; tail -5 "$W/operator-$on.log" | sed 's/^/#   /'; }
	[ "$(status_of gkmc c1 team "[c['status'] for c in s['conditions'] if c['type'] in ('Ready', 'Error')]")" = "['True', 'False']" ]
	ok $? "$on: Ready True, Error False"
	report node-1 Failed PullFailed &&
		wait_for 30 is "1 {'PullFailed': ['node-1']}" \
			status_of gkmc c1 team "s.get('failedNodes'), s.get('failedNodeConditions')"
	ok $? "$on: node-1 fails again: failedNodeConditions is filled again"
	! grep -q 'refused the cache status' "$W/operator-$on.log"
	ok $? "$on: the API server refused none of these writes" || grep refused "$W/operator-$on.log" | sed 's/^/#   /'

	# a status the API server does refuse (a digest set by hand that is none)
	gkmcache team c2 sha256:nope
	wait_for 30 is "Unknown StatusRefused True StatusRefused" status_of gkmc c2 team \
		"' '.join(c['status'] + ' ' + c['reason'] for c in s.get('conditions', []) if c['type'] in ('Ready', 'Error'))"
	ok $? "$on: a status the server refuses: Ready Unknown and Error True, reason StatusRefused" ||
		tail -5 "$W/operator-$on.log" | sed 's/^/#   /'
	status_of gkmc c2 team "[c['message'] for c in s['conditions'] if c['type'] == 'Error'][0]" >"$W/msg"
	grep -q 'refused this cache.s status: .*status.resolvedDigest.*next try is in [0-9]*s' "$W/msg"
	ok $? "$on: ...the message quotes the server (status.resolvedDigest) and says when the next try is" ||
		sed 's/^/#   /' "$W/msg"
	kubectl get events -n team --field-selector involvedObject.name=c2 -o json |
		py "import json,sys; sys.exit(0 if [e for e in json.load(sys.stdin)['items'] if e['reason'] == 'StatusRefused' and e['type'] == 'Warning'] else 1)"
	ok $? "$on: ...and a Warning Event StatusRefused"
	grep -q 'the API server refused the cache status; will retry.*in=' "$W/operator-$on.log"
	ok $? "$on: the operator logs the refusal and when it tries again"
	if [ "$KUBE_SERVER" = test ]; then
		# backoff: the refused write of c2 is tried again later and later
		refused_writes() {
			kubeserver_control requests '{"path": "/namespaces/team/gkmcaches/c2/status"}' >"$W/requests.json" &&
				py "import json; print(len([r for r in json.load(open('$W/requests.json'))['requests'] if r['method'] == 'PATCH' and r['status'] == 422]))"
		}
		wait_for 30 eval '[ "$(refused_writes)" -ge 4 ]'
		/usr/bin/python3 - "$W/requests.json" >"$W/gaps" 2>&1 <<'PY'
import json, sys
times = [r["time"] for r in json.load(open(sys.argv[1]))["requests"]
         if r["method"] == "PATCH" and r["status"] == 422]
gaps = [b - a for a, b in zip(times, times[1:])]
print("%d refused writes; gaps: %s" % (len(times), ", ".join("%.2fs" % g for g in gaps)))
# try k waits at least 0.5 x 250 ms x 2^k (jitter in [0.5, 1.5)); a retry at
# the debounce rate would have every gap near 0.25 s
assert len(gaps) >= 3, "want at least four refused writes"
for k, g in enumerate(gaps):
    assert g >= 0.125 * 2 ** k - 0.02, "try %d after %.2fs, want >= %.2fs" % (k + 1, g, 0.125 * 2 ** k)
PY
		ok $? "$on: the refused write is retried with exponential backoff ($(tail -1 "$W/gaps"))"
	fi
	daemon_stop op
	ok $? "$on: the operator stops cleanly on SIGTERM"
	grep -q 'lost leadership' "$W/operator-$on.log"
	[ $? -ne 0 ]
	ok $? "$on: ...without claiming it lost leadership" || grep 'lost leadership' "$W/operator-$on.log" | sed 's/^/#   /'
	grep -q 'became the leader' "$W/operator-$on.log" &&
		[ "$(kubectl get lease gkm-operator -n gkm -o jsonpath='{.spec.holderIdentity}')" = "" ]
	ok $? "$on: it led on the Lease gkm/gkm-operator and released it"

	# the agent: the last cache of a namespace deleted
	port=$(free_port)
	$G agent --node node-a --kubeconfig "$KUBECONFIG" --gpu-file spec/fixtures/gpu/inventory/h100.json \
		--root "$W/$on-root" --run-dir "$W/$on-run" --verify-enabled false --health-listen "127.0.0.1:$port" \
		>"$W/agent-$on.log" 2>&1 &
	PID[agent]=$!
	gkmcache solo only
	wait_for 60 is "Pending" status_of gkmcn node-a solo "s.get('caches', {}).get('only', {}).get('state')"
	ok $? "$on: the agent reports the only cache of namespace solo" ||
		tail -5 "$W/agent-$on.log" | sed 's/^/#   /'
	# every field of a GPU group the CRD declares, as the server stored it
	kubectl get cgkmcn node-a -o json | py "
import json, sys
g = json.load(sys.stdin)['status']['gpus']
common = {'gpuType': 'NVIDIA H100 80GB HBM3', 'backend': 'cuda', 'arch': 'sm_90', 'warpSize': 32,
          'driverVersion': '550.54.15', 'cudaVersion': '12.4', 'memoryBytes': 85520809984}
want = [dict(common, ids=[0, 1], fabricClique='5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.1'),
        dict(common, ids=[2, 3], fabricClique='5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.2')]
sys.exit(0 if g == want else 'got %s' % g)" >"$W/gpus" 2>&1
	ok $? "$on: node status gpus: backend, arch sm_90, warp size, driver and CUDA version, memory, clique" ||
		sed 's/^/#   /' "$W/gpus"
	kubectl delete gkmc only -n solo >/dev/null &&
		wait_for 30 is "None 0" status_of gkmcn node-a solo "s.get('caches'), s.get('totalCaches')"
	ok $? "$on: the cache deleted: its node object lists no caches" ||
		{ status_of gkmcn node-a solo s | sed 's/^/#   /'; tail -5 "$W/agent-$on.log" | sed 's/^/#   /'; }
	! grep -q 'node status write failed' "$W/agent-$on.log"
	ok $? "$on: no node status write failed" || grep 'write failed' "$W/agent-$on.log" | head -3 | sed 's/^/#   /'
	daemon_stop agent
	ok $? "$on: the agent stops cleanly"
}

if ! command -v kubectl >/dev/null; then
	skip "status writes" "kubectl missing"
	finish
	exit
fi

make_node() {
	if [ "$KUBE_SERVER" = real ]; then
		kubeenv_ctl node "$1" >/dev/null
	else
		printf 'apiVersion: v1\nkind: Node\nmetadata: {name: %s}\n' "$1" | kubectl apply -f - >/dev/null
	fi
}
on_both_servers scenario "the same status writes"
finish
