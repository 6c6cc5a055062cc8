#!/usr/bin/env bash
# Status writes that must never freeze, on a real kube-apiserver
# (GKM_KUBE_ASSETS; skipped with the reason where it is not given). It turns
# an applied empty map over entries the manager owned into null and refuses
# the write (422): the operator's failedNodeConditions after every node
# recovered, the agent's caches after the last cache of a namespace was
# deleted. Both must apply without the map, and a status the server does
# refuse must say so in its conditions while the operator backs off (the
# retries timed from the server's audit log). The operator runs
# leader-elected in its default namespace (gkm) and must not claim to have
# lost the lead when SIGTERM makes it release the Lease.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/loopback.sh"
. "$(dirname "$0")/../lib/daemon.sh"
cd "$GKM_ROOT"
. spec/lib/kubeenv.sh
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-status-writes.XXXXXX")
D=sha256:$(printf 'cache' | sha256sum | cut -d' ' -f1)
cleanup() {
	daemon_stop_all
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

# the writes of c2's status the server refused (422), from its audit log, which
# has the time each request arrived: how many; with "gaps", the gaps between
# them, checked against the backoff
refused_writes() {
	/usr/bin/python3 - "$KUBEENV_AUDIT_LOG" "$@" <<'PY'
import datetime, json, sys
times = []
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue    # a line being written
    ref = e.get("objectRef") or {}
    if e["verb"] == "patch" and ref.get("name") == "c2" and ref.get("subresource") == "status" \
            and e["responseStatus"]["code"] == 422:
        times.append(datetime.datetime.strptime(e["requestReceivedTimestamp"],
                                                "%Y-%m-%dT%H:%M:%S.%fZ").timestamp())
if len(sys.argv) < 3:
    print(len(times))
    sys.exit(0)
gaps = [b - a for a, b in zip(sorted(times), sorted(times)[1:])]
print("%d refused writes; gaps: %s" % (len(times), ", ".join("%.2fs" % g for g in gaps)))
# try k waits at least 0.5 x 250 ms x 2^k (jitter in [0.5, 1.5)); a retry at
# the debounce rate would have every gap near 0.25 s
assert len(gaps) >= 3, "want at least four refused writes"
for k, g in enumerate(gaps):
    assert g >= 0.125 * 2 ** k - 0.02, "try %d after %.2fs, want >= %.2fs" % (k + 1, g, 0.125 * 2 ** k)
PY
}

scenario() {
	local port
	kubectl create namespace gkm >/dev/null && kubectl create namespace team >/dev/null &&
		kubectl create namespace solo >/dev/null &&
		kubeenv_ctl node node-1 >/dev/null && kubeenv_ctl node node-2 >/dev/null &&
		kubeenv_ctl node node-a >/dev/null &&
		node_objects node-1 && node_objects node-2 &&
		gkmcache team c1 "$D"
	ok $? "two Nodes, their node objects and a cache with its digest"

	port=$(free_port)
	# leader-elected, on a Lease in namespace gkm (its --namespace default)
	$G operator --kubeconfig "$KUBECONFIG" --identity op-1 \
		--health-listen "127.0.0.1:$port" >"$W/operator.log" 2>&1 &
	PID[op]=$!
	report node-1 Failed PullFailed && report node-2 Failed PullFailed &&
		wait_for 30 is "2 {'PullFailed': ['node-1', 'node-2']}" \
			status_of gkmc c1 team "s.get('failedNodes'), s.get('failedNodeConditions')"
	ok $? "both nodes fail: failedNodes 2, failedNodeConditions lists them under PullFailed"

	# the registry came back: the map empties, and must leave the status
	report node-1 Ready Ready && report node-2 Ready Ready &&
		wait_for 30 is "2 0 None" \
			status_of gkmc c1 team "s.get('readyNodes'), s.get('failedNodes'), s.get('failedNodeConditions')"
	ok $? "both recover: readyNodes 2, failedNodes 0, no failedNodeConditions" ||
		{ status_of gkmc c1 team s | sed 's/^/#   /'; tail -5 "$W/operator.log" | sed 's/^/#   /'; }
	[ "$(status_of gkmc c1 team "[c['status'] for c in s['conditions'] if c['type'] in ('Ready', 'Error')]")" = "['True', 'False']" ]
	ok $? "Ready True, Error False"
	report node-1 Failed PullFailed &&
		wait_for 30 is "1 {'PullFailed': ['node-1']}" \
			status_of gkmc c1 team "s.get('failedNodes'), s.get('failedNodeConditions')"
	ok $? "node-1 fails again: failedNodeConditions is filled again"
	! grep -q 'refused the cache status' "$W/operator.log"
	ok $? "the API server refused none of these writes" || grep refused "$W/operator.log" | sed 's/^/#   /'

	# a status the API server does refuse (a digest set by hand that is none)
	gkmcache team c2 sha256:nope
	wait_for 30 is "Unknown StatusRefused True StatusRefused" status_of gkmc c2 team \
		"' '.join(c['status'] + ' ' + c['reason'] for c in s.get('conditions', []) if c['type'] in ('Ready', 'Error'))"
	ok $? "a status the server refuses: Ready Unknown and Error True, reason StatusRefused" ||
		tail -5 "$W/operator.log" | sed 's/^/#   /'
	status_of gkmc c2 team "[c['message'] for c in s['conditions'] if c['type'] == 'Error'][0]" >"$W/msg"
	grep -q 'refused this cache.s status: .*status.resolvedDigest.*next try is in [0-9]*s' "$W/msg"
	ok $? "...the message quotes the server (status.resolvedDigest) and says when the next try is" ||
		sed 's/^/#   /' "$W/msg"
	kubectl get events -n team --field-selector involvedObject.name=c2 -o json |
		py "import json,sys; sys.exit(0 if [e for e in json.load(sys.stdin)['items'] if e['reason'] == 'StatusRefused' and e['type'] == 'Warning'] else 1)"
	ok $? "...and a Warning Event StatusRefused"
	grep -q 'the API server refused the cache status; will retry.*in=' "$W/operator.log"
	ok $? "the operator logs the refusal and when it tries again"
	# backoff: the refused write of c2 is tried again later and later
	wait_for 30 eval '[ "$(refused_writes)" -ge 4 ]'
	refused_writes gaps >"$W/gaps" 2>&1
	ok $? "the refused write is retried with exponential backoff ($(tail -1 "$W/gaps"))"
	daemon_stop op
	ok $? "the operator stops cleanly on SIGTERM"
	grep -q 'lost leadership' "$W/operator.log"
	[ $? -ne 0 ]
	ok $? "...without claiming it lost leadership" || grep 'lost leadership' "$W/operator.log" | sed 's/^/#   /'
	grep -q 'became the leader' "$W/operator.log" &&
		[ "$(kubectl get lease gkm-operator -n gkm -o jsonpath='{.spec.holderIdentity}')" = "" ]
	ok $? "it led on the Lease gkm/gkm-operator and released it"

	# the agent: the last cache of a namespace deleted
	port=$(free_port)
	$G agent --node node-a --kubeconfig "$KUBECONFIG" --gpu-file spec/fixtures/gpu/inventory/h100.json \
		--root "$W/root" --run-dir "$W/run" --verify-enabled false --health-listen "127.0.0.1:$port" \
		>"$W/agent.log" 2>&1 &
	PID[agent]=$!
	gkmcache solo only
	wait_for 60 is "Pending" status_of gkmcn node-a solo "s.get('caches', {}).get('only', {}).get('state')"
	ok $? "the agent reports the only cache of namespace solo" ||
		tail -5 "$W/agent.log" | sed 's/^/#   /'
	# every field of a GPU group the CRD declares, as the server stored it
	kubectl get cgkmcn node-a -o json | py "
import json, sys
g = json.load(sys.stdin)['status']['gpus']
common = {'gpuType': 'NVIDIA H100 80GB HBM3', 'backend': 'cuda', 'arch': 'sm_90', 'warpSize': 32,
          'driverVersion': '550.54.15', 'cudaVersion': '12.4', 'memoryBytes': 85520809984}
want = [dict(common, ids=[0, 1], fabricClique='5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.1'),
        dict(common, ids=[2, 3], fabricClique='5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.2')]
sys.exit(0 if g == want else 'got %s' % g)" >"$W/gpus" 2>&1
	ok $? "node status gpus: backend, arch sm_90, warp size, driver and CUDA version, memory, clique" ||
		sed 's/^/#   /' "$W/gpus"
	kubectl delete gkmc only -n solo >/dev/null &&
		wait_for 30 is "None 0" status_of gkmcn node-a solo "s.get('caches'), s.get('totalCaches')"
	ok $? "the cache deleted: its node object lists no caches" ||
		{ status_of gkmcn node-a solo s | sed 's/^/#   /'; tail -5 "$W/agent.log" | sed 's/^/#   /'; }
	! grep -q 'node status write failed' "$W/agent.log"
	ok $? "no node status write failed" || grep 'write failed' "$W/agent.log" | head -3 | sed 's/^/#   /'
	daemon_stop agent
	ok $? "the agent stops cleanly"
}

if why=$(kubeenv_unavailable); then
	echo "# real kube-apiserver: skipped: $why"
	skip "status writes" "$why"
	finish
	exit
fi
kubeenv_start --audit || { ok 1 "the real control plane starts"; finish; exit; }
trap cleanup EXIT
scenario
finish
