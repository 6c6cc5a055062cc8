#!/usr/bin/env bash
# The agent under policies that try to get around the budget (`gkm up`
# against a real registry): a compat policy that sets a __gc finalizer
# (finalizers run with hooks off, after the budget is disarmed) and one
# that runs a backtracking pattern over a long string. The node reports a
# policy error for the cache and stays responsive; the default policy,
# put back, makes the cache Ready without a restart.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-policy-budget.XXXXXX")
trap 'up_stop; registry_stop_all; rm -rf "$W"' EXIT

if ! registry_available; then
	skip "the agent under escaping policies" "docker-registry missing"
	finish
	exit
fi
registry_start r || { ok 1 "registry starts"; finish; exit; }
R=$REG_r_ADDR
PORT=$(free_port)
$G cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/va:v1" >/dev/null 2>&1
ok $? "a cache image in the registry"

mkdir -p "$W/policies"
cp policies/*.lua "$W/policies/"
policy() { # compat.lua's evaluate body
	printf 'local M = {}\nfunction M.evaluate(input)\n%s\n  return { gpus = {} }\nend\nreturn M\n' "$1" \
		>"$W/policies/compat.lua.tmp" && mv "$W/policies/compat.lua.tmp" "$W/policies/compat.lua"
}
add_cache() { # name
	printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: default}\nspec: {image: "%s"}\n' \
		"$1" "$R/caches/va:v1" >"$W/$1.yaml" && $G apply --state "$W/state" -f "$W/$1.yaml" >/dev/null 2>&1
}
healthy() { [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")" = 200 ]; }
reason() { node_entry default "$1" "e.get('reason', '') + ': ' + e.get('message', '')"; }

policy '  setmetatable({}, { __gc = function() while true do end end })
  collectgarbage()'
up_start "$W/state" --gpu-file spec/fixtures/gpu/inventory/t4.json --verify-enabled false \
	--policy-dir "$W/policies" --health-listen "127.0.0.1:$PORT"
add_cache gc
wait_for 30 sh -c "$(declare -f node_entry reason); UP_STATE=$W/state GKM_BIN=$G; reason gc | grep -q __gc"
ok $? "a compat policy that sets a __gc finalizer: the node reports the blocked call for the cache" ||
	{ reason gc; tail -5 "$UP_LOG"; }
sample 5 0 sh -c "$(declare -f healthy); PORT=$PORT; healthy; echo \$?"
ok $? "the agent stays responsive (/healthz, sampled)"
sample 5 Failed/PolicyError node_entry default gc
ok $? "the cache is Failed/PolicyError on the node, at every sample"

policy '  local s = input.cache.name:rep(20000)
  s:find("(.-)x(.-)y")'
add_cache pattern
wait_for 30 sh -c "$(declare -f node_entry reason); UP_STATE=$W/state GKM_BIN=$G; reason pattern | grep -q 'matching steps'"
ok $? "a backtracking pattern over a long string is refused before it runs; the node says so" ||
	{ reason pattern; tail -5 "$UP_LOG"; }
healthy
ok $? "the agent is still responsive"

cp policies/compat.lua "$W/policies/compat.lua"
wait_for 60 is Ready/Ready node_entry default gc && wait_for 30 is Ready/Ready node_entry default pattern
ok $? "the default policy put back: both caches Ready without a restart" ||
	{ node_entry default gc; node_entry default pattern; tail -5 "$UP_LOG"; }
finish
