#!/usr/bin/env bash
# One check of a source serves the caches that would make exactly the same
# check, and no other (`gkm up` against a real registry, keys in a
# --trust-dir as a mounted ConfigMap gives them, the agent's
# gkm_agent_source_checks_total read from /metrics):
# - six caches of one repository and digest, created at once: their source
#   is checked once (its signature verified once), the other five take
#   that check;
# - two caches of the same digest in a repository signed by an untrusted
#   key, created with them: each is refused, none takes the trusted check;
# - a key added: a new cache of the trusted repository is checked again,
#   not served by the check made under the old keys;
# - the trusted key removed: none of the caches it verified is served by a
#   check made while it was trusted; each is refused.
# Credentials are the other half of the key: spec/e2e/pull_secrets.sh.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
. "$(dirname "$0")/../lib/loopback.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-source-checks.XXXXXX")
trap 'up_stop; registry_stop_all; rm -rf "$W"' EXIT

if ! registry_available; then
	skip "source checks shared" "docker-registry missing"
	finish
	exit
fi
registry_start r || { ok 1 "registry starts"; finish; exit; }
R=$REG_r_ADDR
PORT=$(free_port)
$G cache keygen --output-key-prefix "$W/a" >/dev/null 2>&1 &&
	$G cache keygen --output-key-prefix "$W/b" >/dev/null 2>&1 &&
	$G cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/by-a:v1" >"$W/build" 2>&1 &&
	$G cache sign "$R/caches/by-a:v1" --key "$W/a.key" >/dev/null 2>&1 &&
	$G cache push "$R/caches/by-a:v1" "$R/caches/by-b:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/caches/by-b:v1" --key "$W/b.key" >/dev/null 2>&1
ok $? "one image in two repositories: signed by key A in one, by key B in the other"
D=$(digest_of "$W/build")

caches() { # name repository...: GKMCaches of the repository, pinned to D
	local repo=$1 n
	shift
	for n in "$@"; do
		printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: default}\nspec: {image: "%s"}\n' \
			"$n" "$R/caches/$repo@$D"
	done >>"$W/caches.yaml"
}
apply() { $G apply --state "$W/state" -f "$W/caches.yaml" >/dev/null 2>&1 && rm -f "$W/caches.yaml"; }
entries() { # names...: their "state/reason", one line
	local n out=""
	for n in "$@"; do out="$out $(node_entry default "$n")"; done
	echo "${out# }"
}
checks() { # result: the agent's count (0 before the first)
	local v
	v=$(metric "$PORT" "gkm_agent_source_checks_total{result=\"$1\"}")
	echo "${v:-0}"
}
settled() { # names...: each Ready or Failed
	local n
	for n in "$@"; do
		case "$(node_entry default "$n")" in Ready/* | Failed/*) ;; *) return 1 ;; esac
	done
}
times() { # n word: the word n times, one line
	local out=""
	for _ in $(seq 1 "$1"); do out="$out $2"; done
	echo "${out# }"
}
verified_lines() { # the agent's "signature verified" lines for D (the operator's name a cache)
	grep "signature verified" "$UP_LOG" | grep "digest=$D" | grep -vc " cache="
}

SIX="s1 s2 s3 s4 s5 s6"
A6=$(times 6 Ready/Ready)
mkdir -p "$W/trust"
cp "$W/a.pub" "$W/trust/a.pub"
# shellcheck disable=SC2086
caches by-a $SIX
caches by-b f1 f2
apply
ok $? "eight caches at once: six of A's repository, two of B's, one digest"
up_start "$W/state" --gpu-file spec/fixtures/gpu/inventory/t4.json --verify-enabled true \
	--trust-dir "$W/trust" --health-listen "127.0.0.1:$PORT"

# ---- the same source, credentials and trust: one check ----
# shellcheck disable=SC2086
wait_for 60 settled $SIX f1 f2
# shellcheck disable=SC2086
sample 10 "$A6 Failed/SignatureNotTrusted Failed/SignatureNotTrusted" entries $SIX f1 f2
ok $? "sampled 10 times: A's six caches Ready, B's two refused (SignatureNotTrusted) although the digest verified through A's repository" ||
	tail -5 "$UP_LOG"
[ "$(checks shared)" = 5 ] && [ "$(verified_lines)" = 1 ]
ok $? "A's repository was checked once, its signature verified once; five caches took that check ($(checks shared) shared, $(verified_lines) verified)"
[ "$(checks checked)" = 3 ]
ok $? "three checks in all: A's repository once, B's once per cache (a refusal serves no other cache) ($(checks checked))"

# ---- a key added: the trust changed, so a kept check no longer serves ----
cp "$W/b.pub" "$W/trust/b.pub"
wait_for 30 is "Ready/Ready Ready/Ready" entries f1 f2
ok $? "key B added: B's caches are checked again and Ready" || entries f1 f2
sample 5 "$A6" entries $SIX
ok $? "A's caches stay Ready (A is still trusted)"
before=$(checks checked) shared=$(checks shared)
caches by-a s7
apply
wait_for 30 is Ready/Ready node_entry default s7
ok $? "a seventh cache of A's repository is Ready"
[ "$(checks checked)" = $((before + 1)) ] && [ "$(checks shared)" = "$shared" ]
ok $? "it was checked at the registry, not served by the check made under the old keys ($before -> $(checks checked) checked, $shared -> $(checks shared) shared)"

# ---- key A removed: nothing it verified is served from before ----
rm "$W/trust/a.pub"
REFUSED7=$(times 7 Failed/SignatureNotTrusted)
# shellcheck disable=SC2086
wait_for 30 is "$REFUSED7" entries $SIX s7
# shellcheck disable=SC2086
sample 10 "$REFUSED7 Ready/Ready Ready/Ready" entries $SIX s7 f1 f2
ok $? "key A removed: each of A's seven caches is refused at every sample, none served by a check made while A was trusted; B's stay Ready" ||
	entries $SIX s7 f1 f2
up_stop
finish
