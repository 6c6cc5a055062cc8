#!/usr/bin/env bash
# Node selection and rollout waves on a real control plane (etcd,
# kube-apiserver from GKM_KUBE_ASSETS): five Nodes, one `gkm agent` each and
# the operator; a ClusterGKMCache for the nodes labelled gpu=t4 with
# spec.rollout.maxPulling 2, pulled through a proxy that holds the layer's
# blob requests until the test lets them go. What is checked, from the
# agents' own metrics (gkm_pulls_running) and the objects a user reads:
# a node the cache is not for never pulls and reports nothing; never more
# than two nodes pull at once, the others report Waiting with their place;
# the grants survive an operator restart; a new digest rolls out the same
# way while every node keeps serving the old one (its ready record, what the
# CSI plugin mounts, never goes away); a changed selector adds a node and
# lets one go without touching the rest.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/kubeenv.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/daemon.sh"
. "$(dirname "$0")/../lib/loopback.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-rollout-e2e.XXXXXX")
declare -A PORT
MON=
cleanup() {
	[ -n "$MON" ] && kill "$MON" 2>/dev/null
	daemon_stop_all
	kubeenv_stop
	registry_stop_all
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }

if why=$(kubeenv_unavailable); then
	skip "rollout waves on a real control plane" "$why"
	finish
	exit
fi
if ! registry_available; then
	skip "rollout waves on a real control plane" "docker-registry is not installed"
	finish
	exit
fi
registry_start wave && proxy_start wave "$REG_wave_ADDR" || { ok 1 "registry starts"; finish; exit; }
R=$REG_wave_ADDR P=$PROXY_wave_ADDR
kubeenv_start || { ok 1 "the control plane starts"; finish; exit; }
trap cleanup EXIT
K=$KUBECONFIG

cp -r "$FX" "$W/v2" && echo "a second build" >"$W/v2/$(ls "$W/v2")/rebuilt.txt" &&
	$G cache build "$FX" -t "$R/caches/wave:v1" >/dev/null 2>&1 &&
	$G cache build "$W/v2" -t "$R/caches/wave:v2" >/dev/null 2>&1
ok $? "two builds of a cache pushed (v1, v2)"
layers() { # tag -> the layer digests, a regex alternation
	curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$R/v2/caches/wave/manifests/$1" |
		py "import json,sys; print('|'.join(l['digest'] for l in json.load(sys.stdin)['layers']))"
}
hold() { # tag: the layer blobs of tag wait until release
	proxy_fault "$P" "{\"hold\": true, \"match\": \"^GET /v2/caches/wave/blobs/($(layers "$1"))\"}"
}
release() { proxy_fault "$P" '{}'; }

for i in 1 2 3 4 5; do kubeenv_ctl node "node-$i" >/dev/null || exit 1; done
for i in 1 2 3 4; do kubectl label node "node-$i" gpu=t4 >/dev/null || exit 1; done
kubectl label node node-5 gpu=a100 >/dev/null
ok $? "five Nodes: node-1 to node-4 labelled gpu=t4, node-5 gpu=a100"

start_agent() { # i
	local i=$1
	mkdir -p "$W/n$i/root" "$W/n$i/run"
	[ -n "${PORT[agent$i]:-}" ] || PORT[agent$i]=$(free_port)
	$G agent --node "node-$i" --kubeconfig "$K" --gpu-file spec/fixtures/gpu/inventory/t4.json \
		--root "$W/n$i/root" --run-dir "$W/n$i/run" --verify-enabled false \
		--health-listen "127.0.0.1:${PORT[agent$i]}" >>"$W/agent$i.log" 2>&1 &
	PID[agent$i]=$!
}
start_operator() {
	[ -n "${PORT[op]:-}" ] || PORT[op]=$(free_port)
	$G operator --kubeconfig "$K" --leader-elect false --verify-enabled false --resolve-digests true \
		--health-listen "127.0.0.1:${PORT[op]}" >>"$W/operator.log" 2>&1 &
	PID[op]=$!
	wait_for 20 curl -sf "http://127.0.0.1:${PORT[op]}/readyz"
}
for i in 1 2 3 4 5; do start_agent "$i"; done
start_operator
ok $? "five agents and the operator run"

# the agents' own count of pulls running now, summed over nodes
pulling() {
	local i n s=0
	for i in 1 2 3 4 5; do
		n=$(metric "${PORT[agent$i]}" gkm_pulls_running)
		s=$((s + ${n:-0}))
	done
	echo "$s"
}
# the most pulls ever seen running at once, sampled until killed
monitor() {
	local most=0 n
	while :; do
		n=$(pulling)
		[ "$n" -gt "$most" ] && most=$n && echo "$most" >"$W/most"
		sleep 0.1
	done
}
echo 0 >"$W/most"
monitor &
MON=$!
# state of the cache on each node, from the node objects: "1:Ready 2:Waiting ..."
states() {
	local i
	for i in 1 2 3 4 5; do
		printf '%s:%s ' "$i" "$(kubectl get cgkmcn "node-$i" -o jsonpath='{.status.caches.wave.state}' 2>/dev/null)"
	done
}
count() { states | tr ' ' '\n' | grep -c ":$1\$"; }

hold v1
cat <<EOF | kubectl apply -f - >/dev/null
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata: {name: wave}
spec:
  image: $P/caches/wave:v1
  nodeSelector: {gpu: t4}
  rollout: {maxPulling: 2}
EOF
ok $? "a ClusterGKMCache for gpu=t4 nodes, at most two pulling at once, its layer held at the registry"

wait_for 60 eval '[ "$(pulling)" = 2 ] && [ "$(count Waiting)" = 2 ]'
ok $? "two nodes pull, two wait" || echo "# pulling $(pulling); $(states)"
sleep 3
[ "$(pulling)" = 2 ] && [ "$(count Waiting)" = 2 ] && [ "$(count Pulling)" = 2 ]
ok $? "... and no third node starts while the first two hold their slots" || echo "# pulling $(pulling); $(states)"
kubectl get cgkmc wave -o json >"$W/cache.json"
py "import json
s = json.load(open('$W/cache.json'))['status']
r = s['rollout']
assert r['maxPulling'] == 2 and len(r['pulling']) == 2 and len(r['waiting']) == 2, r
assert s['totalNodes'] == 4 and s.get('failedNodes', 0) == 0, s" 2>&1
ok $? "status.rollout names the two pulling and the two waiting; totalNodes counts the four selected nodes"
first=$(py "import json; print(json.load(open('$W/cache.json'))['status']['rollout']['waiting'][0])")
msg=$(kubectl get cgkmcn "$first" -o jsonpath='{.status.caches.wave.message}')
[[ "$msg" == *"1 of 2 waiting"*"2 of at most 2"* ]] &&
	[ "$(kubectl get cgkmcn "$first" -o jsonpath='{.status.caches.wave.reason}')" = RolloutWaiting ]
ok $? "a waiting node says so, with its place: $msg"
[ -z "$(kubectl get cgkmcn node-5 -o jsonpath='{.status.caches.wave}' 2>/dev/null)" ] &&
	[ "$(metric "${PORT[agent5]}" gkm_pulls_running)" = 0 ] && ! grep -q 'pull started' "$W/agent5.log"
ok $? "node-5 (gpu=a100) neither pulls nor reports the cache"

daemon_stop op && start_operator && sleep 3
[ "$(pulling)" = 2 ] && [ "$(count Waiting)" = 2 ] &&
	[ "$(kubectl get cgkmc wave -o jsonpath='{.status.rollout.pulling}')" = "$(py "import json; print(json.dumps(json.load(open('$W/cache.json'))['status']['rollout']['pulling'], separators=(',', ':')))")" ]
ok $? "an operator restarted mid-rollout keeps the same two grants" || echo "# pulling $(pulling); $(states)"

release
wait_for 90 is 4 count Ready
ok $? "released: the rest of the rollout goes through and the four selected nodes are Ready" || echo "# $(states)"
[ "$(cat "$W/most")" -le 2 ]
ok $? "never more than two nodes pulled at once ($(cat "$W/most") at most, from the agents' gkm_pulls_running)"
[ "$(kubectl get cgkmc wave -o jsonpath='{.status.readyNodes}/{.status.totalNodes}')" = 4/4 ] &&
	[ -z "$(kubectl get cgkmcn node-5 -o jsonpath='{.status.caches.wave}' 2>/dev/null)" ] &&
	! grep -q 'pull started' "$W/agent5.log" && [ -z "$(find "$W/n5/root/store/sha256" -mindepth 1 2>/dev/null)" ]
ok $? "the cache is Ready on 4 of 4 nodes; node-5 still has nothing of it"

# ---- an upgrade: every node serves v1 until v2 is Ready there ----
D1=$(kubectl get cgkmc wave -o jsonpath='{.status.resolvedDigest}')
ready_file() { find "$W/n$1/root" -path '*/wave/ready.json' 2>/dev/null | head -1; }
for i in 1 2 3 4; do [ -n "$(ready_file "$i")" ] || echo "# node-$i has no ready record"; done
# every 0.1 s: each selected node's ready record says Ready (for v1 or v2)
watch_ready() {
	local i f
	while :; do
		for i in 1 2 3 4; do
			f=$(ready_file "$i")
			if [ -z "$f" ] || ! grep -q '"state": *"Ready"' "$f" 2>/dev/null; then
				echo "node-$i at $(date +%T.%N)" >>"$W/missing"
			fi
		done
		sleep 0.1
	done
}
: >"$W/missing"
watch_ready &
WATCH=$!
hold v2
kubectl patch cgkmc wave --type merge -p "{\"spec\":{\"image\":\"$P/caches/wave:v2\"}}" >/dev/null
ok $? "the cache moved to v2 (its layer held)"
wait_for 60 eval '[ "$(pulling)" = 2 ] && [ "$(count Waiting)" = 2 ]'
ok $? "v2 rolls out in the same waves: two pull, two wait" || echo "# pulling $(pulling); $(states)"
serving=$(for i in 1 2 3 4; do kubectl get cgkmcn "node-$i" -o jsonpath='{.status.caches.wave.servingDigest}'; echo; done | sort -u)
[ "$serving" = "$D1" ]
ok $? "every node not yet on v2 reports servingDigest v1 ($serving)"
[ "$(kubectl get node -l clustergkmcache.gkm.io/wave=ready -o name | wc -l)" = 4 ]
ok $? "the four Nodes keep their label: pods placed there still mount v1"
release
wait_for 90 eval '[ "$(count Ready)" = 4 ] && [ "$(kubectl get cgkmc wave -o jsonpath="{.status.readyNodes}")" = 4 ]'
ok $? "v2 is Ready on the four nodes" || echo "# $(states)"
D2=$(kubectl get cgkmc wave -o jsonpath='{.status.resolvedDigest}')
sleep 1
kill "$WATCH" 2>/dev/null
wait "$WATCH" 2>/dev/null
on_v2() {
	local i
	for i in 1 2 3 4; do grep -q "$D2" "$(ready_file "$i")" || return 1; done
}
[ "$D2" != "$D1" ] && [ ! -s "$W/missing" ] && on_v2
ok $? "no node's ready record was ever missing during the upgrade, and each now serves v2" ||
	head -5 "$W/missing" | sed 's/^/# /'
[ "$(cat "$W/most")" -le 2 ]
ok $? "never more than two nodes pulled at once during the upgrade ($(cat "$W/most") at most)"

# ---- the selection changes: one node joins, one leaves ----
before=$(for i in 2 3 4; do grep -c 'pull started' "$W/agent$i.log"; done | paste -sd,)
kubectl label node node-5 gpu=t4 --overwrite >/dev/null && kubectl label node node-1 gpu=a100 --overwrite >/dev/null
wait_for 60 eval '[ "$(kubectl get cgkmcn node-5 -o jsonpath="{.status.caches.wave.state}")" = Ready ]'
ok $? "node-5, now gpu=t4, pulls the cache and is Ready" || echo "# $(states)"
wait_for 30 eval '[ -z "$(kubectl get cgkmcn node-1 -o jsonpath="{.status.caches.wave}")" ] && [ -z "$(ready_file 1)" ]'
ok $? "node-1, now gpu=a100 and with no pod on it, lets the cache go and reports nothing" || echo "# $(states)"
wait_for 30 eval '[ "$(kubectl get cgkmc wave -o jsonpath="{.status.readyNodes}/{.status.totalNodes}")" = 4/4 ]' &&
	[ -z "$(kubectl get node node-1 -o jsonpath='{.metadata.labels.clustergkmcache\.gkm\.io/wave}')" ] &&
	[ "$(kubectl get node node-5 -o jsonpath='{.metadata.labels.clustergkmcache\.gkm\.io/wave}')" = ready ]
ok $? "status counts 4 of 4 nodes again; node-1's label is gone, node-5 has it"
[ "$(for i in 2 3 4; do grep -c 'pull started' "$W/agent$i.log"; done | paste -sd,)" = "$before" ]
ok $? "the nodes that stayed selected pulled nothing more"

kill "$MON" 2>/dev/null
MON=
for d in op agent1 agent2 agent3 agent4 agent5; do
	daemon_stop "$d" || { echo "# $d did not stop cleanly"; false; } || break
done
ok $? "the agents and the operator stop cleanly"
finish
