#!/usr/bin/env bash
# The agent's node objects (GKMCacheNode per namespace, ClusterGKMCacheNode):
# writes the API server keeps failing are retried with exponential backoff
# (not at the debounce rate), counted in gkm_agent_errors_total, and land once
# the server answers again; an object deleted by hand is written again at
# once, while one of a namespace without caches is left deleted. On the
# fault-injection API server (spec/kube/apiserver.py), which fails the writes
# on cue and records when each arrived.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/loopback.sh"
. "$(dirname "$0")/../lib/daemon.sh"
cd "$GKM_ROOT"
. spec/lib/kubeserver.sh
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
W=$(mktemp -d)
cleanup() {
	daemon_stop_all
	kubeserver_cleanup
	rm -rf "$W"
}
trap cleanup EXIT
if ! command -v kubectl >/dev/null; then
	skip "agent status retries" "kubectl missing"
	finish
	exit
fi
kubeserver_start || { ok 1 "test API server starts"; finish; exit; }
trap cleanup EXIT
FAILS=5
post() { # path JSON: create an object (kubectl's writes need more than this server serves)
	kubeserver_curl POST "$1" -H 'Content-Type: application/json' -d "$2" -o /dev/null -f
}
post /api/v1/namespaces '{"metadata": {"name": "team"}}' &&
	post /apis/gkm.io/v1alpha1/namespaces/team/gkmcaches \
		'{"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache", "metadata": {"name": "c1"}, "spec": {"image": "registry.invalid/c:v1"}}' &&
	kubeserver_control fault "{\"stage\": \"request\", \"action\": \"status:500\", \"method\": \"PATCH\", \"path\": \"/namespaces/team/gkmcachenodes/\", \"count\": $FAILS}" >/dev/null
ok $? "a GKMCache, and the API server set to fail the next $FAILS writes of the namespace's node object"

PORT=$(free_port)
$G agent --node n1 --kubeconfig "$KUBECONFIG" --gpu-file spec/fixtures/gpu/inventory/t4.json \
	--root "$W/root" --run-dir "$W/run" --verify-enabled false --health-listen "127.0.0.1:$PORT" >"$W/agent.log" 2>&1 &
PID[agent]=$!

has_entry() { kubectl get gkmcn n1 -n team -o jsonpath='{.status.caches.c1.state}' 2>/dev/null | grep -q .; }
wait_for 60 has_entry
ok $? "the node object is written once the server answers again"

kubeserver_control requests '{"path": "/namespaces/team/gkmcachenodes/"}' >"$W/requests.json"
/usr/bin/python3 - "$W/requests.json" "$FAILS" >"$W/gaps" 2>&1 <<'PY'
import json, sys
reqs = [r for r in json.load(open(sys.argv[1]))["requests"] if r["method"] == "PATCH"]
fails = int(sys.argv[2])
failed = [r for r in reqs if r["status"] == 500]
assert len(failed) == fails, "%d failed writes, want %d" % (len(failed), fails)
times = [r["time"] for r in reqs[: fails + 1]]
gaps = [b - a for a, b in zip(times, times[1:])]
print("gaps between attempts: " + ", ".join("%.2fs" % g for g in gaps))
# retry k waits at least 0.5 x 200 ms x 2^k (jitter in [0.5, 1.5)); a fixed
# retry at the debounce rate would have all of them near 0.2 s
for k, g in enumerate(gaps):
    assert g >= 0.1 * 2 ** k - 0.02, "retry %d after %.2fs, want >= %.2fs" % (k, g, 0.1 * 2 ** k)
PY
ok $? "failed writes are retried with exponential backoff ($(tail -1 "$W/gaps"))"

[ "$(metric "$PORT" 'gkm_agent_errors_total{kind="status_write"}')" = "$FAILS" ]
ok $? "each failed write is counted in gkm_agent_errors_total{kind=\"status_write\"}"
grep -q 'node status write failed; will retry.*in=' "$W/agent.log"
ok $? "the log says when it retries"

kubectl delete gkmcn n1 -n team >/dev/null
ok $? "the namespace's node object deleted by hand"
wait_for 20 has_entry
ok $? "the agent writes it again, with its cache entry"
kubectl delete cgkmcn n1 >/dev/null && wait_for 20 kubectl get cgkmcn n1 -o name
ok $? "the ClusterGKMCacheNode deleted by hand comes back too"

kubectl delete gkmc c1 -n team >/dev/null &&
	wait_for 20 is "" kubectl get gkmcn n1 -n team -o jsonpath='{.status.caches.c1}'
ok $? "the cache deleted: its entry leaves the node object"
kubectl delete gkmcn n1 -n team >/dev/null && sleep 2 &&
	! kubectl get gkmcn n1 -n team >/dev/null 2>&1
ok $? "a node object of a namespace without caches stays deleted"

daemon_stop agent
ok $? "the agent stops cleanly (no sanitizer report)" || tail -20 "$W/agent.log"
finish
