#!/usr/bin/env bash
# Standalone mode end to end: `gkm up` against a real registry, with real
# signatures, a file-described GPU inventory (a T4 and two MI210s), policy
# changes and restarts. Asserts what a user sees: `gkm get`, node status,
# the files of the cache view and their bytes, Events, metrics.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-up-e2e.XXXXXX")
UP_PID=""
stop_up() { [ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null; UP_PID=""; }
trap 'stop_up; registry_stop_all; rm -rf "$W"' EXIT
py() { /usr/bin/python3 -c "$@"; }

if ! registry_available; then
	skip "standalone mode" "docker-registry missing"
	finish
	exit
fi
registry_start up || { ok 1 "registry starts"; finish; exit; }
R=$REG_up_ADDR
S=$W/state
PORT=$(free_port)

$G cache keygen --output-key-prefix "$W/trusted" >/dev/null 2>&1
ok $? "a signing key pair"
$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/cuda:v1" >/dev/null 2>&1 &&
	$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/caches/rocm:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/cuda:v1" --key "$W/trusted.key" >/dev/null 2>&1
ok $? "two cache images pushed, the CUDA one signed"

start_up() { # extra flags...
	$G up --state "$S" --node node-1 --gpu-file spec/fixtures/gpu/inventory/mixed.json \
		--key "$W/trusted.pub" --poll-ms 100 --policy-dir "$W/policies" \
		--health-listen "127.0.0.1:$PORT" "$@" >>"$W/up.log" 2>&1 &
	UP_PID=$!
}
field() { # kind name [ns] python-expression-on-obj
	$G get --state "$S" "$1" "$2" ${3:+-n "$3"} -o json 2>/dev/null |
		py "import json,sys; o=json.load(sys.stdin); print($4)" 2>/dev/null
}
cache_state() { field cgkmcn node-1 "" "o['status']['caches']['$1']['state']"; }
ns_state() { field gkmcn node-1 default "o['status']['caches']['$1']['state']"; }

mkdir -p "$W/policies"
cp policies/*.lua "$W/policies/"
cat >"$W/caches.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: vector-add
  namespace: default
spec:
  image: $R/caches/cuda:v1
---
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata:
  name: rocm-unsigned
spec:
  image: $R/caches/rocm:v1
EOF
$G apply --state "$S" -f "$W/caches.yaml" >"$W/out" 2>&1
grep -q "gkmcache.gkm.io/vector-add created" "$W/out"
ok $? "gkm apply creates the caches"

start_up
wait_for 20 curl -sf "http://127.0.0.1:$PORT/readyz"
ok $? "gkm up becomes ready"
wait_for 30 is 1 field gkmc vector-add default "o['status']['readyNodes']"
ok $? "the signed cache becomes ready on the node"

$G get --state "$S" gkmc >"$W/get" 2>&1
grep -qE '^vector-add +sha256:[0-9a-f]{12}\.\.\. +True +True +1/1 +0 +0 ' "$W/get" &&
	head -1 "$W/get" | grep -qE '^NAME +DIGEST +VERIFIED +READY +NODES +FAILED +INCOMPATIBLE +AGE$'
ok $? "gkm get gkmc: digest, Verified True, Ready True, 1/1 nodes, 0 failed, 0 incompatible" || sed 's/^/#   /' "$W/get"
[ "$(field gkmc vector-add default "[c['reason'] for c in o['status']['conditions'] if c['type']=='Verified'][0]")" = VerifiedOnNodes ]
ok $? "Verified says the node checked the signature"
DIGEST=$(field gkmc vector-add default "o['status']['resolvedDigest']")
REG_DIGEST=$(curl -sI -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$R/v2/caches/cuda/manifests/v1" |
	awk -F': ' 'tolower($1)=="docker-content-digest"{print $2}' | tr -d '\r')
[ -n "$DIGEST" ] && [ "$DIGEST" = "$REG_DIGEST" ]
ok $? "status.resolvedDigest is the registry's digest for the tag"

entry() { field gkmcn node-1 default "o['status']['caches']['vector-add']$1"; }
[ "$(entry "['compatibleGPUs']")" = "[{'ids': [0], 'gpuType': 'Tesla T4'}]" ] ||
	[ "$(entry "['compatibleGPUs'][0]['ids']")" = "[0]" ]
ok $? "node status: the T4 (id 0) is compatible"
[ "$(entry "['incompatibleGPUs'][0]['ids']")" = "[1, 2]" ] &&
	[ "$(entry "['incompatibleGPUs'][0]['reason']")" = BackendMismatch ]
ok $? "node status: the two MI210s (ids 1, 2) are one set, BackendMismatch"
[ "$(field cgkmcn node-1 "" "len(o['status']['gpus'])")" = 2 ]
ok $? "node status lists the GPUs as two id sets"

V=$S/caches/default/vector-add
[ "$(py "import json; print(json.load(open('$V/ready.json'))['state'])")" = Ready ] && [ -L "$V/data" ]
ok $? "the cache view has ready.json (Ready) and a data link"
cmp -s "$V/data/io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin" \
	"$FX/cuda-sm75-vector-add/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin"
ok $? "the extracted kernel binary is byte for byte the one packaged"

wait_for 20 is Unsigned field cgkmcn node-1 "" "o['status']['caches']['rocm-unsigned']['reason']"
ok $? "the unsigned image is refused on the node (reason Unsigned)"
# the node's record of a cache: "state reason" from its ready.json
record() { py "import json; r=json.load(open('$1/ready.json')); print(r['state'], r['reason'])" 2>/dev/null; }
[ ! -e "$S/caches/_cluster/rocm-unsigned/data" ] &&
	wait_for 10 is "Failed Unsigned" record "$S/caches/_cluster/rocm-unsigned"
ok $? "nothing of the unsigned image is published; the node's record says Failed (Unsigned)"
wait_for 10 is Unsigned field cgkmc rocm-unsigned "" "[c['reason'] for c in o['status']['conditions'] if c['type']=='Verified'][0]"
ok $? "the cluster cache says Verified False, Unsigned"
grep -q '"reason":"CacheReady"' "$S/events.jsonl"
ok $? "an Event records the cache becoming ready"
[ "$(metric "$PORT" 'gkm_pulls_total{result="pulled"}')" = 1 ]
ok $? "metrics: one pull"

# a policy change that flips the verdict takes effect without a restart
cat >"$W/policies/compat.lua" <<'EOF'
local M = {}
function M.evaluate(input)
  local out = {}
  for _, g in ipairs(input.gpus) do
    out[#out + 1] = { index = g.index, compatible = false, reason = "DeniedByPolicy",
                      message = "this site does not run prebuilt kernels" }
  end
  return { gpus = out }
end
return M
EOF
wait_for 20 is DeniedByPolicy entry "['reason']"
ok $? "a policy change flips the verdict (DeniedByPolicy) without a restart"
wait_for 10 test ! -e "$V/data" && wait_for 10 is "Incompatible DeniedByPolicy" record "$V"
ok $? "the view of a cache that became incompatible is withdrawn; its record says why"

# a broken policy is refused; the last good one keeps answering
printf 'local M = {}\nfunction M.evaluate(input\nreturn M\n' >"$W/policies/compat.lua"
wait_for 10 grep -q 'compat.lua:3' "$S/policy-status.json"
ok $? "a broken policy is refused with file and line (policy-status.json)"
grep -q 'policy bundle refused' "$W/up.log"
ok $? "the refusal is logged"
[ "$(metric "$PORT" 'gkm_policy_reloads_total{result="refused"}')" -ge 1 ] 2>/dev/null
ok $? "metrics count the refused reload"
cp policies/compat.lua "$W/policies/compat.lua"
wait_for 20 is Ready entry "['state']"
ok $? "restoring the policy makes the cache ready again"
[ "$(metric "$PORT" 'gkm_pulls_total{result="pulled"}')" = 1 ]
ok $? "... from the store, without pulling again"

# restart: state is recovered from the store and the views, nothing is pulled
stop_up
start_up
wait_for 20 curl -sf "http://127.0.0.1:$PORT/readyz"
sleep 1
[ "$(ns_state vector-add)" = Ready ] && [ -z "$(metric "$PORT" 'gkm_pulls_total{result="pulled"}')" ]
ok $? "after a restart the cache is ready with no pull"

# deleting the cache releases its files
$G delete --state "$S" gkmc vector-add >/dev/null 2>&1
wait_for 20 test ! -e "$V/ready.json"
ok $? "deleting the cache withdraws its view"
no_entry() { ! $G get --state "$S" gkmcn node-1 -o json | grep -q '"vector-add"'; }
wait_for 10 no_entry
ok $? "... and its entry leaves the node status"

stop_up
finish
