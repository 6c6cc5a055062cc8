#!/usr/bin/env bash
# Keyless-signed caches on a real control plane (GKM_KUBE_ASSETS; skipped
# with the reason where it is not set): images signed as CI signs them
# (cosign keyless: a Fulcio certificate for the workflow's identity, a Rekor
# entry), by the test's own sigstore (spec/lib/fake_sigstore.c), and a trust
# directory holding its trusted root and one identity rule (the release
# workflow of a GitHub repository). The gkm webhook in the API server's
# admission chain admits them and refuses an image signed by another issuer
# or with a certificate expired when it was logged, naming why; the operator
# says in Verified who signed and by which rule; the agent makes them Ready,
# and refuses on the node (a ClusterGKMCache, which the webhook leaves out)
# what the webhook would have refused.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/kubeenv.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/daemon.sh"
. "$(dirname "$0")/../lib/kubewebhook.sh"
cd "$GKM_ROOT"
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FAKE=${GKM_BUILD:-$GKM_ROOT/build}/spec/fake-sigstore
FX=spec/fixtures/caches/triton
INV=spec/fixtures/gpu/inventory
GITHUB=https://token.actions.githubusercontent.com
WORKFLOW=https://github.com/org/kernels/.github/workflows/release.yml@refs/heads/main
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-verified-keyless.XXXXXX")
declare -A PORT
cleanup() {
	daemon_stop_all
	kubeenv_stop
	registry_stop_all
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
py() { /usr/bin/python3 -c "$@"; }

if why=$(kubeenv_unavailable); then
	skip "keyless signatures on a real control plane" "$why"
	finish
	exit
fi
if ! registry_available || ! command -v kubectl >/dev/null || [ ! -x "$FAKE" ]; then
	skip "keyless signatures on a real control plane" "docker-registry, kubectl or $FAKE missing"
	finish
	exit
fi
registry_start kl || { ok 1 "registry starts"; finish; exit; }
R=$REG_kl_ADDR
digest_of() { registry_digest "$R" "$1"; } # repo:tag

# ---- the images, signed keyless ----
mkdir -p "$W/trust" "$W/sig" && "$FAKE" init "$W/root" && cp "$W/root/trusted_root.json" "$W/trust/" &&
	printf -- '- name: release\n  issuer: %s\n  subject: %s\n' "$GITHUB" "$WORKFLOW" >"$W/trust/identities.yaml"
ok $? "a trusted root of the test's Fulcio and Rekor, and one identity rule"
# name form case issuer
IMAGES="simple simple valid $GITHUB
bundle bundle-0.3 valid $GITHUB
other-issuer simple valid https://accounts.evil.example
expired simple expired $GITHUB"
sign_one() { # name form case issuer
	local d
	$G cache build "$FX/cuda-sm75-vector-add" -t "$R/keyless/$1:v1" --label "case=$1" >/dev/null 2>&1 &&
		d=$(digest_of "keyless/$1:v1") &&
		"$FAKE" sign "$W/root" "$W/sig/$1" --digest "$d" --ref "$R/keyless/$1" --form "$2" --case "$3" \
			--issuer "$4" --subject "$WORKFLOW" &&
		/usr/bin/python3 - "$R" "$1" "$d" "$2" "$W/sig/$1" <<'EOF'
import os, sys
sys.path.insert(0, os.path.join(os.environ["GKM_ROOT"], "spec", "lib"))
import webhook_env as env
addr, name, digest, form, out = sys.argv[1:]
reg = env.Registry.__new__(env.Registry)
reg.addr = addr
read = lambda f: open(os.path.join(out, f)).read()
if form == "simple":
    reg.attach_simple(f"keyless/{name}", digest, read("payload.json").encode(), {
        "dev.cosignproject.cosign/signature": read("signature.b64"),
        "dev.sigstore.cosign/certificate": read("cert.pem"),
        "dev.sigstore.cosign/chain": read("chain.pem"),
        "dev.sigstore.cosign/bundle": read("rekor-bundle.json")})
else:
    reg.attach_bundle(f"keyless/{name}", digest, read("bundle.json").encode())
EOF
}
signed=0
while read -r name form case issuer; do
	sign_one "$name" "$form" "$case" "$issuer" || signed=1
done <<<"$IMAGES"
ok $signed "four images signed keyless as cosign stores it: simple signing and a bundle by the release workflow, one by another issuer, one whose certificate expired before it was logged"

kubeenv_start || { ok 1 "the control plane starts"; finish; exit; }
trap cleanup EXIT
K=$KUBECONFIG

# ---- the webhook in the admission chain, an operator, an agent ----
PORT[agent]=$(free_port)
PORT[op]=$(free_port)
kubewebhook_start "$G" "$W/webhook.log" --trust-dir "$W/trust" --plain-http
ok $? "the gkm webhook, trusting the root and the rule, registered with the API server"

kubectl create namespace gkm >/dev/null && kubectl create namespace team >/dev/null &&
	printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n  labels: {kubernetes.io/hostname: node-1}\n' |
	kubectl apply -f - >/dev/null
mkdir -p "$W/n1/root" "$W/n1/run"
$G agent --node node-1 --kubeconfig "$K" --gpu-file "$INV/t4.json" --root "$W/n1/root" \
	--run-dir "$W/n1/run" --trust-dir "$W/trust" --health-listen "127.0.0.1:${PORT[agent]}" \
	>>"$W/agent.log" 2>&1 &
PID[agent]=$!
$G operator --kubeconfig "$K" --identity op --trust-dir "$W/trust" \
	--health-listen "127.0.0.1:${PORT[op]}" >>"$W/operator.log" 2>&1 &
PID[op]=$!
wait_for 30 curl -sf "http://127.0.0.1:${PORT[agent]}/readyz" >/dev/null
ok $? "an agent and an operator with the same trust directory"

gkmcache() { # kind name image [namespace]
	printf 'apiVersion: gkm.io/v1alpha1\nkind: %s\nmetadata: {name: %s%s}\nspec: {image: "%s"}\n' \
		"$1" "$2" "${4:+, namespace: $4}" "$3" | kubectl apply -f - >"$W/out" 2>&1
}
json() { kubectl get "$@" -o json 2>/dev/null; }
field() { # python expression on o; kubectl get args...
	local expr=$1
	shift
	json "$@" | py "import json,sys; o=json.load(sys.stdin); print($expr)" 2>/dev/null
}
cond() { # type kubectl-get-args... : "status reason" of a condition
	local t=$1
	shift
	field "' '.join([c['status'] + ' ' + c['reason'] for c in o['status']['conditions'] if c['type'] == '$t'])" "$@"
}
message() { # type kubectl-get-args...
	local t=$1
	shift
	field "[c['message'] for c in o['status']['conditions'] if c['type'] == '$t'][0]" "$@"
}

# ---- admission ----
for name in simple bundle; do
	gkmcache GKMCache "$name" "$R/keyless/$name:v1" team &&
		[ "$(kubectl get gkmc "$name" -n team -o jsonpath='{.metadata.annotations.gkm\.io/resolvedDigest}')" = \
			"$(digest_of "keyless/$name:v1")" ]
	ok $? "the API server admits the keyless-signed $name cache through the webhook, with its digest" ||
		sed 's/^/#   /' "$W/out"
done
gkmcache GKMCache other-issuer "$R/keyless/other-issuer:v1" team
[ $? != 0 ] && grep -q 'denied the request: SignatureNotTrusted' "$W/out" &&
	grep -q "issuer: the certificate's OIDC issuer 'https://accounts.evil.example' is not one any identity rule accepts" "$W/out"
ok $? "another issuer is refused by the API server with the webhook's reason: the issuer" || sed 's/^/#   /' "$W/out"
gkmcache GKMCache expired "$R/keyless/expired:v1" team
[ $? != 0 ] && grep -q "expired at integration" "$W/out"
ok $? "a certificate expired when the entry was logged: refused, saying so" || sed 's/^/#   /' "$W/out"

# ---- verified and Ready ----
for name in simple bundle; do
	wait_for 60 is 1 field "o['status']['readyNodes']" gkmc "$name" -n team
	ok $? "$name: verified on the node and Ready" || tail -5 "$W/agent.log" | sed 's/^/#   /'
	wait_for 30 is "True SignatureVerified" cond Verified gkmc "$name" -n team
	message Verified gkmc "$name" -n team >"$W/msg"
	grep -q "verified keyless: identity $WORKFLOW, issuer $GITHUB, rule 'release'" "$W/msg"
	ok $? "$name: Verified True, naming the identity, the issuer and the rule" || sed 's/^/#   /' "$W/msg"
done

# ---- refused on the node (no webhook for ClusterGKMCaches) ----
gkmcache ClusterGKMCache other-issuer "$R/keyless/other-issuer@$(digest_of keyless/other-issuer:v1)"
ok $? "a ClusterGKMCache of the other issuer's image by digest (the webhook does not see it)"
entry() { field "(lambda e: e['state'] + ' ' + e['reason'] + ' ' + e.get('message', ''))(o['status']['caches']['other-issuer'])" cgkmcn node-1; }
on_node_failed() { entry | grep -q "^Failed SignatureNotTrusted"; }
wait_for 60 on_node_failed
entry >"$W/entry"
grep -q "^Failed SignatureNotTrusted .*issuer: the certificate's OIDC issuer 'https://accounts.evil.example'" "$W/entry"
ok $? "the agent refuses it on the node: Failed, SignatureNotTrusted, naming the issuer" || sed 's/^/#   /' "$W/entry"
wait_for 30 is "False SignatureNotTrusted" cond Verified cgkmc other-issuer
message Verified cgkmc other-issuer >"$W/msg"
grep -q "issuer: the certificate's OIDC issuer" "$W/msg"
ok $? "the operator's Verified: False, SignatureNotTrusted, naming the issuer" || sed 's/^/#   /' "$W/msg"

daemon_stop op && daemon_stop agent && daemon_stop webhook
ok $? "the daemons stop cleanly"
finish
