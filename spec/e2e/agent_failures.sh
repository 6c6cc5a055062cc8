#!/usr/bin/env bash
# What a user reads while the node agent fails, sampled the way a user
# samples it (`gkm get` again and again, a reason that flickers is a bug):
# - a registry that is down when a cache is created: the node reports the
#   failure with the time of its next try at every sample, retries with
#   backoff, and the cache becomes ready once the registry is back;
# - an image refused for good (unsigned): Failed/Unsigned at every sample,
#   never Pulling, not retried on a timer; retried when the cache is edited
#   (an annotation) or the policies change.
# `gkm up` against real registries, with a real signature and key.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-agent-failures.XXXXXX")
trap 'up_stop; registry_stop_all; rm -rf "$W"' EXIT

if ! registry_available; then
	skip "agent failures" "docker-registry missing"
	finish
	exit
fi
registry_start good && registry_start flaky || { ok 1 "registries start"; finish; exit; }
R=$REG_good_ADDR F=$REG_flaky_ADDR
PORT=$(free_port)

$G cache keygen --output-key-prefix "$W/trusted" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$F/caches/late:v1" >"$W/push" 2>&1 &&
	$G cache sign "$F/caches/late:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/caches/unsigned:v1" >/dev/null 2>&1 &&
	$G cache push "$R/caches/unsigned:v1" "$R/caches/unsigned2:v1" >/dev/null 2>&1
ok $? "two cache images: a signed CUDA one, an unsigned ROCm one (in two repositories)"
DIGEST=$(digest_of "$W/push")
registry_stop flaky
! curl -s -o /dev/null "http://$F/v2/"
ok $? "the registry of one of them is stopped"

mkdir -p "$W/policies"
cp policies/*.lua "$W/policies/"
cat >"$W/caches.yaml" <<YAML
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: late, namespace: default}
spec: {image: "$F/caches/late@$DIGEST"}
---
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: unsigned, namespace: default}
spec: {image: "$R/caches/unsigned:v1"}
---
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: unsigned2, namespace: default}
spec: {image: "$R/caches/unsigned2:v1"}
YAML
$G apply --state "$W/state" -f "$W/caches.yaml" >/dev/null 2>&1
ok $? "three caches: one from the stopped registry (by digest), two unsigned"

up_start "$W/state" --gpu-file spec/fixtures/gpu/inventory/mixed.json --key "$W/trusted.pub" \
	--policy-dir "$W/policies" --health-listen "127.0.0.1:$PORT"
state_of() { node_entry default "$1" "e['state']"; }
next_try() { node_entry default "$1" "e.get('nextAttemptTime', '')"; }
failed_pulls() { metric "$PORT" 'gkm_pulls_total{result="failed"}'; }
both_unsigned() { echo "$(node_entry default unsigned) $(node_entry default unsigned2)"; }

# --- a registry that is down, then back ---
wait_for 30 is Failed state_of late
ok $? "the cache of the stopped registry is Failed on the node" || tail -5 "$UP_LOG"
NEXT=$(next_try late)
[ -n "$NEXT" ]
ok $? "its entry says when the next try is ($NEXT)"
sample 15 Failed state_of late
ok $? "sampled 15 times while the registry is down: Failed every time, never Pending or Pulling"
registry_restart flaky
wait_for 60 is Ready state_of late
ok $? "the registry is back: the cache becomes Ready without a restart of the agent" ||
	{ node_entry default late e; grep 'late' "$UP_LOG" | tail -5; }
[ -z "$(next_try late)" ]
ok $? "a Ready entry carries no next try"

# --- an image refused for good ---
wait_for 30 is Failed/Unsigned node_entry default unsigned
ok $? "the unsigned image is Failed/Unsigned on the node"
wait_for 10 is False/Unsigned cache_condition default unsigned Verified
ok $? "the cache says Verified False, Unsigned"
wait_for 30 is Failed/Unsigned node_entry default unsigned2
BEFORE=$(failed_pulls)
sample 25 Failed/Unsigned node_entry default unsigned
ok $? "sampled 25 times over 5 s: Failed/Unsigned every time, never Pulling"
sample 5 False/Unsigned cache_condition default unsigned Verified
ok $? "sampled 5 times: the cache's Verified stays False/Unsigned"
[ "$(failed_pulls)" = "$BEFORE" ]
ok $? "a refused image is not pulled again on a timer (failed pulls stay at $BEFORE)"
[ -z "$(next_try unsigned)" ]
ok $? "its entry names no next try"

$G cache sign "$R/caches/unsigned:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/unsigned2:v1" --key "$W/trusted.key" >/dev/null 2>&1
ok $? "the image is signed in both repositories"
sample 10 "Failed/Unsigned Failed/Unsigned" both_unsigned
ok $? "nothing changed on the node yet: both still Failed/Unsigned (no timer retry)"
printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: unsigned, namespace: default, annotations: {gkm.io/recheck: "1"}}\nspec: {image: "%s/caches/unsigned:v1"}\n' "$R" |
	$G apply --state "$W/state" -f - >/dev/null 2>&1
wait_for 30 is Ready state_of unsigned
ok $? "an annotation on the cache makes the agent try it again: Ready" || node_entry default unsigned e
sample 10 Failed/Unsigned node_entry default unsigned2
ok $? "the other cache was not edited: still Failed/Unsigned"
printf '\n-- touched to make the agent look again\n' >>"$W/policies/compat.lua"
wait_for 30 is Ready state_of unsigned2
ok $? "a policy change makes the agent try again: Ready" || node_entry default unsigned2 e
[ "$(failed_pulls)" = "$BEFORE" ]
ok $? "... and neither try failed"

up_stop
finish
