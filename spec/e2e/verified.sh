#!/usr/bin/env bash
# What the Verified condition may claim, with no admission webhook in the
# way (a namespace the webhook leaves out): the gkm.io/resolvedDigest
# annotation, which anyone who may edit a cache can set, proves nothing; the
# operator, given the trusted keys, checks each cache's signature itself
# through the cache's own image reference and says what it found, and by
# whom. Then the digests of caches that exist survive an operator restarted
# without --resolve-digests (as when the webhook is turned on later), and
# move with spec.image only when someone resolves the new image. On a real
# kube-apiserver (GKM_KUBE_ASSETS; skipped with the reason where it is not set).
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/daemon.sh"
cd "$GKM_ROOT"
. spec/lib/kubeenv.sh
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-verified.XXXXXX")
cleanup() {
	daemon_stop_all
	kubeenv_stop
	registry_stop_all
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }

if ! registry_available || ! command -v kubectl >/dev/null; then
	skip "what Verified claims" "docker-registry or kubectl missing"
	finish
	exit
fi
if why=$(kubeenv_unavailable); then
	echo "# real kube-apiserver: skipped: $why"
	skip "what Verified claims" "$why"
	finish
	exit
fi
registry_start v || { ok 1 "registry starts"; finish; exit; }
R=$REG_v_ADDR
digest_of() { registry_digest "$R" "$1"; } # repo:tag
mkdir -p "$W/trust" &&
	$G cache keygen --output-key-prefix "$W/trusted" >/dev/null 2>&1 && cp "$W/trusted.pub" "$W/trust/" &&
	$G cache keygen --output-key-prefix "$W/stranger" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/team/signed:v1" >/dev/null 2>&1 &&
	$G cache sign "$R/team/signed:v1" --key "$W/trusted.key" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/team/copy:v1" >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/team/unsigned:v1" --label variant=unsigned >/dev/null 2>&1 &&
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/team/stranger:v1" --label variant=stranger >/dev/null 2>&1 &&
	$G cache sign "$R/team/stranger:v1" --key "$W/stranger.key" >/dev/null 2>&1 &&
	$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/team/rocm:v1" >/dev/null 2>&1
ok $? "images: one signed with the trusted key, a copy in a repository without signatures, one unsigned, one signed by another key"
SIGNED=$(digest_of team/signed:v1)
[ "$(digest_of team/copy:v1)" = "$SIGNED" ]
ok $? "the copy has the signed image's digest ($SIGNED)"

gkmcache() { # name image [digest]: a GKMCache in namespace team, its digest annotated by hand
	local ann=""
	[ -n "${3:-}" ] && ann=", annotations: {gkm.io/resolvedDigest: \"$3\"}"
	kubectl apply -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: $1, namespace: team$ann}
spec: {image: "$2"}
EOF
}
verified() { # name: "status reason" of its Verified condition
	kubectl get gkmc "$1" -n team -o json 2>/dev/null |
		py "import json,sys; s=json.load(sys.stdin).get('status') or {}
print(' '.join(c['status'] + ' ' + c['reason'] for c in s.get('conditions', []) if c['type'] == 'Verified'))"
}
status_of() { # name python-expression on s
	kubectl get gkmc "$1" -n team -o json 2>/dev/null |
		py "import json,sys; s=json.load(sys.stdin).get('status') or {}; print($2)"
}
op_start() { # flags...
	$G operator --kubeconfig "$KUBECONFIG" --identity op --health-listen "" "$@" \
		>>"$W/operator.log" 2>&1 &
	PID[op]=$!
}
# every sample of cache $1's Verified until it reads $2 (at most 30 s), into $W/samples
sample_until() {
	: >"$W/samples"
	local i
	for i in $(seq 1 150); do
		verified "$1" >>"$W/samples"
		[ "$(tail -1 "$W/samples")" = "$2" ] && return 0
		sleep 0.2
	done
	return 1
}

scenario() {
	kubectl create namespace gkm >/dev/null && kubectl create namespace team >/dev/null &&
		gkmcache forged "$R/team/unsigned:v1" "$(digest_of team/unsigned:v1)" &&
		gkmcache signed "$R/team/signed:v1" "$SIGNED" &&
		gkmcache copy "$R/team/copy:v1" "$SIGNED" &&
		gkmcache stranger "$R/team/stranger:v1" "$(digest_of team/stranger:v1)"
	ok $? "four caches whose digests were set by hand"

	op_start --trust-dir "$W/trust"
	sample_until forged "False Unsigned"
	ok $? "an unsigned digest set by hand: Verified False, Unsigned" || tail -3 "$W/samples" | sed 's/^/#   /'
	! grep -q '^True' "$W/samples"
	ok $? "...and never Verified True while it was looked at ($(wc -l <"$W/samples") samples)"
	wait_for 30 is "True SignatureVerified" verified signed
	ok $? "the signed one: Verified True, SignatureVerified"
	status_of signed "[c['message'] for c in s['conditions'] if c['type'] == 'Verified'][0]" >"$W/msg"
	grep -q "^the operator verified the signature of $SIGNED: simple-signing signature .*verified with key sha256:" "$W/msg" &&
		! grep -qi webhook "$W/msg"
	ok $? "...saying the operator verified it, with which key" || sed 's/^/#   /' "$W/msg"
	wait_for 30 is "False Unsigned" verified copy
	ok $? "the same digest through a repository without its signature: Unsigned (trust is per cache)"
	wait_for 30 is "False SignatureNotTrusted" verified stranger
	ok $? "signed by a key nobody trusts: SignatureNotTrusted"
	kubectl get events -n team -o json | py "
import json, sys
ev = [e for e in json.load(sys.stdin)['items'] if e['reason'] == 'Verified']
names = sorted(e['involvedObject']['name'] for e in ev)
bad = [e['message'] for e in ev if 'webhook' in e['message']]
sys.exit(0 if names == ['signed'] and not bad else 'Verified Events for %s; %s' % (names, bad))" >"$W/ev" 2>&1
	ok $? "one Verified Event, for the signed cache only, naming no webhook" || sed 's/^/#   /' "$W/ev"
	daemon_stop op
	ok $? "the operator stops cleanly"

	# an operator that resolves digests (no webhook), then one that does not
	gkmcache tagged "$R/team/signed:v1"
	op_start --verify-enabled false
	wait_for 30 is "$SIGNED $R/team/signed:v1" status_of tagged "s.get('resolvedDigest'), s.get('resolvedImage')"
	ok $? "with --verify-enabled false the operator resolves the tag and records the image it resolved"
	daemon_stop op
	op_start --resolve-digests false --trust-dir "$W/trust"
	sample_until tagged "True SignatureVerified"
	ok $? "restarted without --resolve-digests: the digest stays and is verified"
	: >"$W/ready"
	for i in $(seq 1 10); do
		status_of tagged "s.get('resolvedDigest'), [c['reason'] for c in s['conditions'] if c['type'] == 'Ready']" >>"$W/ready"
		sleep 0.2
	done
	! grep -q DigestNotResolved "$W/ready" && [ "$(sort -u "$W/ready" | wc -l)" = 1 ] && grep -q "$SIGNED" "$W/ready"
	ok $? "...every sample keeps it (never DigestNotResolved)" || sort -u "$W/ready" | sed 's/^/#   /'
	kubectl patch gkmc tagged -n team --type=merge -p "{\"spec\": {\"image\": \"$R/team/rocm:v1\"}}" >/dev/null &&
		wait_for 30 is "None DigestNotResolved" status_of tagged \
			"s.get('resolvedDigest'), [c['reason'] for c in s['conditions'] if c['type'] == 'Ready'][0]"
	ok $? "spec.image changed with nobody to resolve it: the old digest is not carried over"
	daemon_stop op
	ok $? "the operator stops cleanly again"
}

kubeenv_start || { ok 1 "the real control plane starts"; finish; exit; }
trap cleanup EXIT
scenario
finish
