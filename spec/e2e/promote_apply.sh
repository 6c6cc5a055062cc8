#!/usr/bin/env bash
# gkm cache promote --apply against the real API server (GKM_KUBE_ASSETS)
# and a real registry: a candidate captured on a cache's image is signed and
# becomes the GKMCache's (and a ClusterGKMCache's) spec.image through a merge
# patch that changes nothing else; a cache that does not exist is reported.
set -u
ROOT=${GKM_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$ROOT/spec/lib/tap.sh"
. "$ROOT/spec/lib/registry.sh"
. "$ROOT/spec/lib/kubeenv.sh"
cd "$ROOT"
G=$GKM_BIN
INV=spec/fixtures/gpu/inventory
why=$(kubeenv_unavailable) || { command -v kubectl >/dev/null || why="kubectl is not installed"; }
registry_available || why=${why:-"docker-registry missing"}
if [ -n "$why" ]; then
	skip "promote --apply against the real API server" "$why"
	finish
	exit 0
fi
kubeenv_start || { ok 1 "the API server starts"; finish; exit 1; }
trap 'registry_stop_all; kubeenv_stop' EXIT
W=$KUBEENV_DIR/work
mkdir -p "$W"
export TMPDIR=$W
registry_start prom || { ok 1 "registry starts"; finish; exit 1; }
R=$REG_prom_ADDR

$G cache keygen --output-key-prefix "$W/ci" >/dev/null 2>&1 &&
	$G cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/add:v1" >/dev/null 2>&1 &&
	$G cache capture --base "$R/caches/add:v1" -t "$R/caches/add:cand" --gpu-file $INV/t4.json -o json -- sh -c '
		d=$TRITON_CACHE_DIR/NEWKERNEL && mkdir -p $d &&
		printf "{\"hash\":\"n\",\"name\":\"k\",\"target\":{\"backend\":\"cuda\",\"arch\":75,\"warp_size\":32}}" >$d/k.json' \
		>"$W/cand.json" 2>"$W/err"
ok $? "a key pair, the cache image and a candidate captured on it"
DG=$(/usr/bin/python3 -c "import json; print(json.load(open('$W/cand.json'))['digest'])")
kubectl create namespace team-a >/dev/null 2>&1
kubectl apply -f - >"$W/out" 2>&1 <<YAML
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: add
  namespace: team-a
  labels:
    team: a
spec:
  image: $R/caches/add:v1
---
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata:
  name: add-all
spec:
  image: $R/caches/add:v1
YAML
ok $? "a GKMCache and a ClusterGKMCache name the old image" || sed 's/^/#   /' "$W/out"

$G cache promote "$R/caches/add:cand" --key "$W/ci.key" --cache team-a/add --apply >"$W/out" 2>&1
[ $? -eq 0 ] && grep -q "Set spec.image of GKMCache team-a/add" "$W/out"
ok $? "promote --apply signs the candidate and sets the GKMCache's spec.image" || sed 's/^/#   /' "$W/out"
[ "$(kubectl get gkmcache add -n team-a -o jsonpath='{.spec.image}')" = "$R/caches/add@$DG" ] &&
	[ "$(kubectl get gkmcache add -n team-a -o jsonpath='{.metadata.labels.team}')" = a ]
ok $? "the API server has spec.image = the candidate by digest; nothing else changed"
$G cache verify "$R/caches/add@$DG" --key "$W/ci.pub" >/dev/null 2>&1
ok $? "the image it names verifies with the trusted key"
$G cache promote "$R/caches/add:cand" --key "$W/ci.key" --cache add-all --apply >"$W/out" 2>&1 &&
	[ "$(kubectl get clustergkmcache add-all -o jsonpath='{.spec.image}')" = "$R/caches/add@$DG" ]
ok $? "a ClusterGKMCache (--cache NAME) is set the same way" || sed 's/^/#   /' "$W/out"
$G cache promote "$R/caches/add:cand" --key "$W/ci.key" --cache team-a/nope --apply >"$W/out" 2>&1
[ $? -eq 1 ] && grep -q "signed, but spec.image of team-a/nope was not set: .*not found" "$W/out"
ok $? "a cache that does not exist: the failure says so" || sed 's/^/#   /' "$W/out"
$G cache promote "$R/caches/add:cand" --key "$W/ci.key" --apply >"$W/out" 2>&1
[ $? -eq 2 ] && grep -q "\-\-apply needs \-\-cache" "$W/out"
ok $? "--apply without --cache is a usage error"
finish
