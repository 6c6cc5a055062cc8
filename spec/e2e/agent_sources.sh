#!/usr/bin/env bash
# Trust and sources belong to each cache, not to a digest. Several caches
# name the same digest through different repositories and registries; the
# node's store keeps one copy of the content, but each cache is verified
# through its own reference and pulled from its own source:
# - a repository without a signature, or with one by an untrusted key, is
#   refused although another repository's signature of the same digest
#   verified (and the content is already on the node);
# - a dead or unauthorised registry fails only the caches that use it, and
#   never makes another cache of the same digest fail, or become Ready;
# - a source that serves the manifest and configuration of a digest on the
#   node but not its layers does not get the content.
# `gkm up` against real registries, sampled as a user samples it.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-agent-sources.XXXXXX")
trap 'up_stop; registry_stop_all; rm -rf "$W"' EXIT

if ! registry_available || ! command -v htpasswd >/dev/null; then
	skip "agent sources" "docker-registry or htpasswd missing"
	finish
	exit
fi
htpasswd -Bbc "$W/htpasswd" owner s3cret >/dev/null 2>&1
registry_start good && registry_start dead && registry_start locked htpasswd "$W/htpasswd" ||
	{ ok 1 "registries start"; finish; exit; }
R=$REG_good_ADDR D=$REG_dead_ADDR L=$REG_locked_ADDR
S=$W/state

$G cache keygen --output-key-prefix "$W/trusted" >/dev/null 2>&1 &&
	$G cache keygen --output-key-prefix "$W/other" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/signed:v1" >"$W/cuda" 2>&1 &&
	$G cache sign "$R/caches/signed:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache push "$R/caches/signed:v1" "$R/caches/copy:v1" >/dev/null 2>&1 &&
	$G cache push "$R/caches/signed:v1" "$R/caches/forged:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/forged:v1" --key "$W/other.key" >/dev/null 2>&1
ok $? "one CUDA image in three repositories: signed with the trusted key, unsigned, signed with another key"
CUDA=$(digest_of "$W/cuda")
copy_signed() { # destination: push the ROCm image there and sign it with the trusted key
	$G cache push "$R/caches/rocm:v1" "$1" --creds owner:s3cret >/dev/null 2>&1 &&
		$G cache sign "$1" --key "$W/trusted.key" --creds owner:s3cret >/dev/null 2>&1
}
$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/caches/rocm:v1" >"$W/rocm" 2>&1 &&
	$G cache sign "$R/caches/rocm:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	copy_signed "$D/caches/rocm:v1" && copy_signed "$L/caches/rocm:v1"
ok $? "one ROCm image, signed with the trusted key, in three registries (one needs credentials)"
ROCM=$(digest_of "$W/rocm")
registry_stop dead

cache() { # namespace name image
	printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: %s}\nspec: {image: "%s"}\n' \
		"$2" "$1" "$3" >>"$W/caches.yaml"
}
apply() { $G apply --state "$S" -f "$W/caches.yaml" >/dev/null 2>&1 && rm -f "$W/caches.yaml"; }
settled() { # ns name: the entry is Ready or Failed
	case "$(node_entry "$1" "$2")" in Ready/* | Failed/*) return 0 ;; esac
	return 1
}
entries() { # ns/name...: their "state/reason", one line
	local c out=""
	for c in "$@"; do out="$out $(node_entry "${c%%/*}" "${c#*/}")"; done
	echo "${out# }"
}

mkdir -p "$S"
cache a signed "$R/caches/signed@$CUDA"
apply
up_start "$S" --gpu-file spec/fixtures/gpu/inventory/mixed.json --key "$W/trusted.pub"
wait_for 30 is Ready/Ready node_entry a signed
ok $? "the cache of the signed repository is Ready on the node"

# --- trust: the same digest through repositories without a valid signature ---
cache b copy "$R/caches/copy@$CUDA"
cache c forged "$R/caches/forged@$CUDA"
apply
wait_for 30 settled b copy && wait_for 30 settled c forged
ok $? "two more caches of the same digest, from the unsigned and the wrongly signed repository"
sample 10 "Ready/Ready Failed/Unsigned Failed/SignatureNotTrusted" entries a/signed b/copy c/forged
ok $? "sampled 10 times: unsigned and untrusted are refused although the digest is on the node"
[ "$(cache_condition b copy Verified)" = False/Unsigned ] &&
	[ "$(cache_condition c forged Verified)" = False/SignatureNotTrusted ]
ok $? "their caches say Verified False (Unsigned, SignatureNotTrusted), not True"
not_published() { # ns/name: no record of the cache on the node says Ready
	local f=$S/caches/$1/ready.json
	[ ! -e "$f" ] || [ "$(/usr/bin/python3 -c "import json; print(json.load(open('$f'))['state'])")" != Ready ]
}
not_published b/copy && not_published c/forged
ok $? "nothing is published as ready for them"

# --- sources: the same digest from a dead and an unauthorised registry ---
cache d dead "$D/caches/rocm@$ROCM"
cache e locked "$L/caches/rocm@$ROCM"
apply
wait_for 30 settled d dead && wait_for 30 settled e locked
ok $? "two caches of a new digest: one from a stopped registry, one from a registry that wants credentials"
cache f live "$R/caches/rocm@$ROCM"
apply
wait_for 30 is Ready/Ready node_entry f live
ok $? "a third cache of that digest, from a registry that answers, becomes Ready" || node_entry f live
sample 10 "Ready/Ready Failed/RegistryUnavailable Failed/Unauthorized" entries f/live d/dead e/locked
ok $? "sampled 10 times: the dead and the unauthorised source fail only their own caches"
grep -q "reason=RegistryUnavailable" "$UP_LOG" && grep -q "reason=Unauthorized" "$UP_LOG"
ok $? "the log names each cache's own failure"

# --- a source that serves the manifest but not the layers ---
proxy_start nolayers "$R" || ok 1 "a proxy starts"
P=$PROXY_nolayers_ADDR
LAYER=$($G cache inspect "$R/caches/signed@$CUDA" -o json --no-signatures |
	/usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['layers'][0]['digest'])")
proxy_fault "$P" "{\"fail\": 1000, \"status\": 404, \"match\": \"/blobs/$LAYER\"}"
cache g partial "$P/caches/signed@$CUDA"
apply
wait_for 30 settled g partial
sample 10 "Ready/Ready Failed/ImageNotFound" entries a/signed g/partial
ok $? "a source without the layers: its cache is not linked to the content on the node (ImageNotFound)" ||
	node_entry g partial e
not_published g/partial
ok $? "nothing is published as ready for it"
grep "partial" "$UP_LOG" | grep -q "does not serve layer 0"
ok $? "the log says which layer the source does not serve"

up_stop
finish
