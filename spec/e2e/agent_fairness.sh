#!/usr/bin/env bash
# One dead registry delays only the caches that use it. Ten caches name a
# registry that accepts connections and never answers (a proxy told to
# hang, reads given a 120 s timeout); a cache from a registry that answers,
# created after them, becomes Ready while every request to the silent one is
# still unanswered: the silent registry holds no slot the healthy cache
# needs.
# `gkm up` against a real registry; no timing is asserted, only the order.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-agent-fairness.XXXXXX")
trap 'up_stop; registry_stop_all; rm -rf "$W"' EXIT
N=10

if ! registry_available; then
	skip "agent fairness" "docker-registry missing"
	finish
	exit
fi
registry_start good && proxy_start silent "$REG_good_ADDR" || { ok 1 "registry and proxy start"; finish; exit; }
R=$REG_good_ADDR Q=$PROXY_silent_ADDR
$G cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/cuda:v1" >"$W/build" 2>&1 &&
	proxy_fault "$Q" '{"hang": true}'
ok $? "an image in a registry, and a proxy in front of it that never answers"

# each its own digest (nothing behind them is ever read)
for i in $(seq 1 $N); do
	printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: dead-%d, namespace: default}\nspec: {image: "%s/caches/dead-%d@sha256:%064x"}\n' \
		"$i" "$Q" "$i" "$i"
done >"$W/dead.yaml"
$G apply --state "$W/state" -f "$W/dead.yaml" >/dev/null 2>&1
ok $? "$N caches of the silent registry"
up_start "$W/state" --gpu-file spec/fixtures/gpu/inventory/t4.json --timeout 120 --verify-enabled false
asked() { curl -s "http://$Q/_stats" | /usr/bin/python3 -c 'import json,sys
print(sum(1 for m, p in json.load(sys.stdin)["requests"] if p.startswith("/v2/caches/")))'; }
some_asked() { [ "$(asked)" -gt 0 ]; }
wait_for 30 some_asked
ok $? "the agent is waiting on the silent registry ($(asked) requests unanswered)"

printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: healthy, namespace: default}\nspec: {image: "%s/caches/cuda:v1"}\n' "$R" |
	$G apply --state "$W/state" -f - >/dev/null 2>&1
wait_for 60 is Ready/Ready node_entry default healthy
ok $? "a cache of the answering registry, created after them, becomes Ready" ||
	{ node_entry default healthy; tail -5 "$UP_LOG"; }
waiting() { # every dead cache is still waiting for its first answer
	local i
	for i in $(seq 1 $N); do
		[ "$(node_entry default "dead-$i")" = Pending/CheckingImage ] || return 1
	done
}
waiting
ok $? "... while no request to the silent registry has been answered or has timed out"

up_stop
finish
