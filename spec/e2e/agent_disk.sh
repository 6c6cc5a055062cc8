#!/usr/bin/env bash
# The node's disk: an image whose files would not fit in the store is not
# downloaded. Its cache-size-bytes label is read before the first layer
# byte; the node reports Failed/InsufficientStorage naming what is needed
# and what is free, tries again after a while, and pulls once space is
# freed. `gkm up` with its state (and store) on a small tmpfs, a real
# registry, a real signature.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-agent-disk.XXXXXX")
trap 'up_stop; registry_stop_all; umount "$W/small" 2>/dev/null; rm -rf "$W"' EXIT

if ! registry_available; then
	skip "the store's free space" "docker-registry missing"
	finish
	exit
fi
mkdir -p "$W/small"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=96m tmpfs "$W/small" 2>/dev/null; then
	skip "the store's free space" "mounting a small tmpfs for the store needs root"
	finish
	exit
fi
registry_start reg || { ok 1 "the registry starts"; finish; exit; }
R=$REG_reg_ADDR
PORT=$(free_port)

# a Triton cache of 40 MiB: the fixture and one large file beside its kernel
cp -r "$FX/cuda-sm75-vector-add" "$W/big"
head -c $((40 << 20)) /dev/urandom >"$W/big/$(ls "$W/big" | head -1)/blob.bin"
$G cache keygen --output-key-prefix "$W/k" >/dev/null 2>&1 &&
	$G cache build "$W/big" -t "$R/caches/big:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/big:v1" --key "$W/k.key" >/dev/null 2>&1
ok $? "a signed 40 MiB cache image"

# 96 MiB of tmpfs with 60 MiB taken: 36 MiB free, less than 40 MiB + room
head -c $((60 << 20)) /dev/zero >"$W/small/filler"
mkdir -p "$W/policies"
cp policies/*.lua "$W/policies/"
$G apply --state "$W/small/state" -f - >/dev/null 2>&1 <<YAML
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: big, namespace: default}
spec: {image: "$R/caches/big:v1"}
YAML
ok $? "a cache of it, on a node whose store has 36 MiB free"
up_start "$W/small/state" --gpu-file spec/fixtures/gpu/inventory/mixed.json --key "$W/k.pub" \
	--policy-dir "$W/policies" --health-listen "127.0.0.1:$PORT"

wait_for 30 is Failed/InsufficientStorage node_entry default big
ok $? "the node reports Failed/InsufficientStorage" || tail -5 "$UP_LOG"
MSG=$(node_entry default big "e['message']")
case "$MSG" in *"take 40 MiB (label cache-size-bytes) and need about 61 MiB in the store, which has"*"MiB free"*"nothing was downloaded"*) r=0 ;; *) r=1 ;; esac
ok $r "its message names what is needed and what is free" || echo "# $MSG"
[ -n "$(node_entry default big "e.get('nextAttemptTime', '')")" ]
ok $? "it is tried again by itself (a next attempt time)"
[ "$(metric "$PORT" 'gkm_pull_bytes_total')" = 0 ] && [ "$(du -sm "$W/small" | cut -f1)" -le 62 ]
ok $? "nothing was downloaded or extracted: the store holds no part of it"

rm -f "$W/small/filler"
wait_for 90 is Ready node_entry default big "e['state']"
ok $? "space freed: the next try pulls it, Ready" || tail -5 "$UP_LOG"
finish
