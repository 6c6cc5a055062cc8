#!/usr/bin/env bash
# `make run`: the whole gkm pipeline on this machine, no cluster needed.
# A local registry (Debian's docker-registry on loopback), a Triton cache
# packaged and signed with gkm, then `gkm up` checking it against a described
# GPU inventory (a T4 and two MI210s), pulling, verifying, extracting it, and
# the status a user reads. Everything lives in a temporary directory.
set -eu
G=$PWD/${BUILD:-build}/gkm
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-demo.XXXXXX")
UP=""
cleanup() {
	set +e
	[ -n "$UP" ] && kill "$UP" 2>/dev/null && wait "$UP" 2>/dev/null
	registry_stop_all
	rm -rf "$W"
}
. spec/lib/registry.sh
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$1"; }
show() { printf '$ %s\n' "$*"; "$@"; }
wait_ready() { # name
	for _ in $(seq 1 100); do
		"$G" get --state "$W/state" gkmc "$1" -o json 2>/dev/null | grep -q '"readyNodes":[[:space:]]*1' && return 0
		sleep 0.2
	done
	echo "the cache did not become ready; gkm up said:" >&2
	cat "$W/up.log" >&2
	return 1
}

step "1. A local OCI registry (docker-registry on loopback)"
registry_start demo
R=$REG_demo_ADDR
echo "registry at $R"

step "2. Package a real Triton cache (sm75 vector-add) as an image, push it, sign it"
show "$G" cache keygen --output-key-prefix "$W/cosign"
show "$G" cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/vector-add:v1" --rewrite-group-paths
show "$G" cache sign "$R/caches/vector-add:v1" --key "$W/cosign.key"
show "$G" cache inspect "$R/caches/vector-add:v1" --key "$W/cosign.pub"

step "3. The GPUs of this (described) machine"
show "$G" gpus --source file --file spec/fixtures/gpu/inventory/mixed.json

step "4. Start gkm up and ask for the cache"
"$G" up --state "$W/state" --node demo-node --gpu-file spec/fixtures/gpu/inventory/mixed.json \
	--key "$W/cosign.pub" --poll-ms 100 >"$W/up.log" 2>&1 &
UP=$!
cat >"$W/cache.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: vector-add
  namespace: default
spec:
  image: $R/caches/vector-add:v1
EOF
show "$G" apply --state "$W/state" -f "$W/cache.yaml"
wait_ready vector-add

step "5. What a user reads: the cache, and the node's per-GPU verdicts"
show "$G" get --state "$W/state" gkmc
show "$G" get --state "$W/state" gkmcn -o yaml

step "6. The view a pod would mount (CSI), straight from the store"
show ls -l "$W/state/caches/default/vector-add/"
show find "$W/state/caches/default/vector-add/data/" -type f

step "7. Policies: the bundle the daemons run, and a broken one refused while the good one keeps answering"
show "$G" policy check policies
if "$G" policy check spec/fixtures/policy/broken; then
	echo "unexpected: the broken bundle was accepted" >&2
	exit 1
fi
show "$G" policy reload policies spec/fixtures/policy/broken admission spec/fixtures/policy/admission-unsigned.json

printf '\nAll good: a signed cache went from a registry to a verified, GPU-checked, mounted-ready view.\n'
