#!/usr/bin/env bash
# Trusted keys on the node (`gkm up` against a real registry, keys in a
# --trust-dir as a mounted ConfigMap gives them):
# - verification on and no key at all: nothing is Ready, Verified is never
#   True, and the node says why (NoTrustedKeys), at every sample;
# - a key added to the directory is trusted without a restart;
# - a key removed stops working without a restart: the cache it alone signed
#   is no longer mountable (its record is not Ready), with the reason, while
#   a cache signed by a key still trusted stays Ready at every sample;
# - a restart does not bring it back from its old view.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-trust-reload.XXXXXX")
trap 'up_stop; registry_stop_all; rm -rf "$W"' EXIT

if ! registry_available; then
	skip "trusted keys reloaded on the node" "docker-registry missing"
	finish
	exit
fi
registry_start r || { ok 1 "registry starts"; finish; exit; }
R=$REG_r_ADDR
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
$G cache keygen --output-key-prefix "$W/a" >/dev/null 2>&1 &&
	$G cache keygen --output-key-prefix "$W/b" >/dev/null 2>&1 &&
	$G cache build "$FX" -t "$R/caches/by-a:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/by-a:v1" --key "$W/a.key" >/dev/null 2>&1 &&
	$G cache build "$FX" -t "$R/caches/by-b:v1" --label team=b >/dev/null 2>&1 &&
	$G cache sign "$R/caches/by-b:v1" --key "$W/b.key" >/dev/null 2>&1
ok $? "two signed images: one by key A, one by key B"

mkdir -p "$W/trust"
for n in by-a by-b; do
	printf 'apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: default}\nspec: {image: "%s"}\n' \
		"$n" "$R/caches/$n:v1"
done | sed 's/^spec/spec/;1!s/^apiVersion/---\napiVersion/' >"$W/caches.yaml"
$G apply --state "$W/state" -f "$W/caches.yaml" >/dev/null 2>&1
ok $? "two caches"
start() { up_start "$W/state" --gpu-file spec/fixtures/gpu/inventory/t4.json --verify-enabled true --trust-dir "$W/trust"; }
record() { /usr/bin/python3 -c "import json; print(json.load(open('$W/state/caches/default/$1/ready.json'))['state'])" 2>/dev/null; }
start

# ---- no key: fail closed ----
wait_for 30 is Failed/NoTrustedKeys node_entry default by-a
ok $? "verification on, no trusted key: the node refuses the cache (Failed/NoTrustedKeys)" ||
	{ node_entry default by-a; tail -5 "$UP_LOG"; }
wait_for 10 is False/NoTrustedKeys cache_condition default by-a Verified &&
	sample 10 False/NoTrustedKeys cache_condition default by-a Verified &&
	sample 5 False/NodesFailed cache_condition default by-a Ready
ok $? "Verified False (NoTrustedKeys) and Ready False at every sample: nothing unverified looks verified" ||
	{ cache_condition default by-a Verified; cache_condition default by-a Ready; }
[ ! -e "$W/state/caches/default/by-a/data" ]
ok $? "no view is published for it"

# ---- keys added: trusted without a restart ----
cp "$W/a.pub" "$W/trust/a.pub" && cp "$W/b.pub" "$W/trust/b.pub"
wait_for 30 is Ready/Ready node_entry default by-a && wait_for 30 is Ready/Ready node_entry default by-b
ok $? "keys A and B added to the directory: both caches Ready, without a restart" ||
	{ node_entry default by-a; node_entry default by-b; tail -5 "$UP_LOG"; }
[ "$(record by-b)" = Ready ] && wait_for 10 is True/VerifiedOnNodes cache_condition default by-b Verified
ok $? "B's cache: its record is Ready (mountable), Verified True" || cache_condition default by-b Verified

# ---- key B removed: its cache stops being mountable ----
rm "$W/trust/b.pub"
wait_for 30 is Failed/SignatureNotTrusted node_entry default by-b
ok $? "key B removed: the cache only B signed is Failed/SignatureNotTrusted, without a restart" ||
	{ node_entry default by-b; tail -5 "$UP_LOG"; }
[ "$(record by-b)" = Failed ]
ok $? "its record is no longer Ready: the CSI plugin mounts it into no new pod" || record by-b
sample 10 Ready/Ready node_entry default by-a
ok $? "the cache signed by A (still trusted) stays Ready at every sample"
wait_for 10 is False/SignatureNotTrusted cache_condition default by-b Verified
ok $? "B's cache: Verified False, SignatureNotTrusted" || cache_condition default by-b Verified

# ---- a restart does not revive it from its old view ----
up_stop
start
sleep 3
sample 10 Failed/SignatureNotTrusted node_entry default by-b
ok $? "after a restart without key B: still Failed at every sample, never Ready from the old view"
wait_for 30 is Ready/Ready node_entry default by-a
ok $? "after the restart A's cache is Ready"
finish
