#!/usr/bin/env bash
# Credentials per namespace on a real API server (GKM_KUBE_ASSETS) with a
# real docker-registry behind htpasswd: a GKMCache names pull Secrets of its
# own namespace, a ClusterGKMCache Secrets of gkm's namespace; without any,
# the agent's own credentials serve only the namespaces it is told to and
# ClusterGKMCaches. Two namespaces
# name the same digest; the node already holds it for the one with the
# credentials, and the other is still refused (Unauthorized, naming the
# registry and the Secret) until its own credentials reach the registry.
# One check of the source serves the caches that name the same Secret (as
# it was when read), never those of another Secret, nor any after the
# Secret was edited (the agent's gkm_agent_source_checks_total).
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/kubeenv.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/daemon.sh"
. "$(dirname "$0")/../lib/loopback.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-secrets-e2e.XXXXXX")
cleanup() {
	daemon_stop_all
	kubeenv_stop
	registry_stop_all
	rm -rf "$W"
}
trap cleanup EXIT
unset REGISTRY_AUTH_FILE DOCKER_CONFIG
export HOME=$W

if why=$(kubeenv_unavailable); then
	skip "pull Secrets per namespace" "$why"
	finish
	exit
fi
if ! registry_available || ! command -v htpasswd >/dev/null || ! command -v kubectl >/dev/null; then
	skip "pull Secrets per namespace" "docker-registry, htpasswd or kubectl missing"
	finish
	exit
fi
htpasswd -Bbn dana 'p4ss' >"$W/htpasswd" 2>/dev/null
htpasswd -Bbn erin 's3cret' >>"$W/htpasswd" 2>/dev/null
registry_start auth htpasswd "$W/htpasswd" || { ok 1 "htpasswd registry starts"; finish; exit; }
A=$REG_auth_ADDR
$G cache build "$FX" -t "$A/private/cache:v1" --creds dana:p4ss -o json >"$W/b.json" 2>/dev/null
ok $? "a private image in a registry that wants a login"
D=$(/usr/bin/python3 -c "import json; print(json.load(open('$W/b.json'))['digest'])")

kubeenv_start || { ok 1 "the control plane starts"; finish; exit; }
trap cleanup EXIT

secret() { # ns name user:pass [host]
	local host=${4:-$A}
	kubectl create secret docker-registry "$2" -n "$1" --docker-server="$host" \
		--docker-username="${3%%:*}" --docker-password="${3#*:}" --dry-run=client -o yaml |
		kubectl apply -f - >/dev/null
}
cache() { # ns name secret...: a GKMCache pinned to the digest, naming the Secrets
	local ns=$1 name=$2 list="" s
	shift 2
	for s in "$@"; do list="$list{name: $s},"; done
	kubectl apply -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: $name
  namespace: $ns
  annotations: {gkm.io/resolvedDigest: "$D"}
spec:
  image: $A/private/cache:v1
  pullSecrets: [${list%,}]
EOF
}
kubectl create namespace team-a >/dev/null && kubectl create namespace team-b >/dev/null &&
	kubectl create namespace gkm-system >/dev/null
ok $? "namespaces team-a, team-b and gkm's own"
secret team-a regcred dana:p4ss && secret team-b regcred dana:wrong &&
	secret team-b elsewhere dana:p4ss other.example:5000
ok $? "team-a's Secret holds the credentials; team-b's a wrong password, and one for another registry"
kubectl get gkmc -n team-a -o name >/dev/null && cache team-a c regcred &&
	[ "$(kubectl get gkmc c -n team-a -o jsonpath='{.spec.pullSecrets[0].name}')" = regcred ]
ok $? "the CRD keeps spec.pullSecrets"

# the agent's own credentials (registry.authSecret) serve team-a and
# ClusterGKMCaches only
PORT=$(free_port)
/usr/bin/python3 -c "import base64, json; print(json.dumps({'auths': {'$A': {'auth': base64.b64encode(b'dana:p4ss').decode()}}}))" >"$W/global.json"
POD_NAMESPACE=gkm-system $G agent --node n1 --kubeconfig "$KUBECONFIG" \
	--gpu-file spec/fixtures/gpu/inventory/t4.json --root "$W/root" --run-dir "$W/run" \
	--authfile "$W/global.json" --global-credentials-namespaces team-a \
	--verify-enabled false --health-listen "127.0.0.1:$PORT" >"$W/agent.log" 2>&1 &
PID[agent]=$!

entry() { # ns cache field
	kubectl get gkmcn n1 -n "$1" -o jsonpath="{.status.caches.$2.$3}" 2>/dev/null
}
wait_for 60 is Ready entry team-a c state
ok $? "team-a: the cache becomes Ready with its namespace's Secret"

cache team-b c regcred
wait_for 60 is Unauthorized entry team-b c reason
ok $? "team-b, same digest, already on the node: refused, Unauthorized"
msg=$(entry team-b c message)
case "$msg" in *"$A"*"Secret team-b/regcred"*) r=0 ;; *) r=1 ;; esac
ok $r "the message names the registry and the Secret ($msg)"
[ ! -e "$W/root/caches/team-b/c/data" ]
ok $? "team-b's view is not published: the node's bytes are not handed over"
sleep 3
[ "$(entry team-b c state)" != Ready ] && [ ! -e "$W/root/caches/team-b/c/data" ]
ok $? "still refused a while later (sampled again)"

cache team-b d elsewhere
wait_for 60 is Unauthorized entry team-b d reason
ok $? "a Secret without credentials for the registry: Unauthorized"
case "$(entry team-b d message)" in *"no credentials were found for it in Secret team-b/elsewhere"*) r=0 ;; *) r=1 ;; esac
ok $r "the message says the Secret has none for this registry ($(entry team-b d message))"
cache team-b e nosuch
wait_for 60 is Unauthorized entry team-b e reason
case "$(entry team-b e message)" in *"pull Secret team-b/nosuch not found"*) r=0 ;; *) r=1 ;; esac
ok $r "a Secret that does not exist: Unauthorized, naming it ($(entry team-b e message))"

secret team-b regcred dana:p4ss
wait_for 90 is Ready entry team-b c state
ok $? "team-b's Secret fixed: its own credentials succeed and the cache becomes Ready"
[ -L "$W/root/caches/team-b/c/data" ]
ok $? "team-b's view is published now"

cluster_cache() { # name secret
	kubectl apply -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata:
  name: $1
  annotations: {gkm.io/resolvedDigest: "$D"}
spec:
  image: $A/private/cache:v1
  pullSecrets: [{name: $2}]
EOF
}
secret gkm-system clustercred dana:p4ss
cluster_cache shared clustercred
wait_for 60 is Ready kubectl get cgkmcn n1 -o jsonpath='{.status.caches.shared.state}'
ok $? "a ClusterGKMCache reads its Secret in gkm's namespace"
cluster_cache other regcred
wait_for 60 is Unauthorized kubectl get cgkmcn n1 -o jsonpath='{.status.caches.other.reason}'
ok $? "a ClusterGKMCache never reads a team's Secret (regcred is not in gkm's namespace)"
# no pullSecrets: the agent's own credentials serve the namespaces listed
# and ClusterGKMCaches, never another tenant's
cache team-a mine
cache team-b theirs
kubectl create namespace team-c >/dev/null
cache team-c theirs
kubectl apply -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata:
  name: global
  annotations: {gkm.io/resolvedDigest: "$D"}
spec:
  image: $A/private/cache:v1
EOF
wait_for 60 is Ready entry team-a mine state &&
	wait_for 60 is Ready kubectl get cgkmcn n1 -o jsonpath='{.status.caches.global.state}'
ok $? "no pullSecrets: team-a (listed) and a ClusterGKMCache read with the agent's own credentials: Ready"
wait_for 60 is Unauthorized entry team-c theirs reason && wait_for 60 is Unauthorized entry team-b theirs reason
ok $? "no pullSecrets in team-b and team-c (not listed): read anonymously, Unauthorized, although the node holds the digest"
case "$(entry team-c theirs message)" in *"not one gkm's own credentials serve"*) r=0 ;; *) r=1 ;; esac
ok $r "the message says why no credentials were used ($(entry team-c theirs message))"
[ ! -e "$W/root/caches/team-c/theirs/data" ]
ok $? "team-c's view is not published"
kubectl apply -f - >/dev/null 2>"$W/bad.err" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: bad, namespace: team-a}
spec:
  image: $A/private/cache:v1
  pullSecrets: [{name: "Not A Name"}]
EOF
[ $? -ne 0 ] && grep -q "pullSecrets" "$W/bad.err"
ok $? "the API server refuses a pullSecrets name that is no Secret name"
# One check per source and credentials, in team-d (one digest, one
# repository): three caches name Secret good and two Secret bad (a wrong
# password), all created at once; then one names Secret other (erin, who may
# read the image too); then Secret good is edited.
kubectl create namespace team-d >/dev/null
secret team-d good dana:p4ss && secret team-d bad dana:wrong && secret team-d other erin:s3cret
checks() { # result: the agent's gkm_agent_source_checks_total
	local v
	v=$(metric "$PORT" "gkm_agent_source_checks_total{result=\"$1\"}")
	echo "${v:-0}"
}
states() { # names...: their state/reason in team-d, one line
	local n out=""
	for n in "$@"; do out="$out $(entry team-d "$n" state)/$(entry team-d "$n" reason)"; done
	echo "${out# }"
}
team_d() { # name:secret...: GKMCaches of team-d pinned to the digest, applied at once
	local n
	for n in "$@"; do
		printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: %s, namespace: team-d, annotations: {gkm.io/resolvedDigest: "%s"}}\nspec: {image: "%s", pullSecrets: [{name: %s}]}\n' \
			"${n%%:*}" "$D" "$A/private/cache:v1" "${n#*:}"
	done | kubectl apply -f - >/dev/null
}
READY3="Ready/Ready Ready/Ready Ready/Ready"
shared0=$(checks shared)
team_d g1:good g2:good g3:good b1:bad b2:bad
ok $? "team-d: five caches at once, three naming Secret good, two Secret bad"
wait_for 60 is "$READY3 Failed/Unauthorized Failed/Unauthorized" states g1 g2 g3 b1 b2
ok $? "Secret good's three are Ready, Secret bad's two refused (Unauthorized): one digest, one source" ||
	states g1 g2 g3 b1 b2
sleep 2
[ "$(states g1 g2 g3 b1 b2)" = "$READY3 Failed/Unauthorized Failed/Unauthorized" ] &&
	[ ! -e "$W/root/caches/team-d/b1/data" ] && [ ! -e "$W/root/caches/team-d/b2/data" ]
ok $? "a while later still so, and nothing published for Secret bad's caches"
[ "$(checks shared)" = $((shared0 + 2)) ]
ok $? "the source was checked once with Secret good: two of its caches took that check, none of Secret bad's ($shared0 -> $(checks shared) shared)"

# other credentials that also read the image: checked with them, not served
checked1=$(checks checked) shared1=$(checks shared)
team_d o1:other
wait_for 60 is Ready/Ready states o1
ok $? "a cache naming Secret other (erin's credentials) is Ready" || states o1
[ "$(checks shared)" = "$shared1" ] && [ "$(checks checked)" -gt "$checked1" ]
ok $? "its source was checked with its own credentials, not served by Secret good's check ($checked1 -> $(checks checked) checked, $shared1 -> $(checks shared) shared)"

# Secret good edited: what was checked with it before no longer serves
checked2=$(checks checked) shared2=$(checks shared)
secret team-d good erin:s3cret
team_d g4:good
wait_for 60 is Ready/Ready states g4
ok $? "Secret good edited (erin's credentials now): a new cache naming it is Ready" || states g4
[ "$(checks shared)" = "$shared2" ] && [ "$(checks checked)" -gt "$checked2" ]
ok $? "it was checked with the Secret as edited, not served by the check made with it before ($checked2 -> $(checks checked) checked, $shared2 -> $(checks shared) shared)"
secret team-d good dana:wrong
team_d g5:good
wait_for 60 is Failed/Unauthorized states g5
ok $? "Secret good edited again (a wrong password): a new cache naming it is refused ($(states g5))"
sleep 2
[ "$(states g5)" = Failed/Unauthorized ] && [ ! -e "$W/root/caches/team-d/g5/data" ] &&
	[ "$(states g1 g2 g3)" = "$READY3" ]
ok $? "still refused a while later, its view not published; the caches read before the edits stay Ready"
# a node where the cache fits no GPU: what team-a's read of the image says
# (Incompatible) is not told to team-b's caches, which cannot read it
POD_NAMESPACE=gkm-system $G agent --node n2 --kubeconfig "$KUBECONFIG" \
	--gpu-file spec/fixtures/gpu/inventory/mi210.json --root "$W/root2" --run-dir "$W/run2" \
	--verify-enabled false --health-listen "" >"$W/agent2.log" 2>&1 &
PID[agent2]=$!
entry2() { kubectl get gkmcn n2 -n "$1" -o jsonpath="{.status.caches.$2.$3}" 2>/dev/null; }
wait_for 60 is Incompatible entry2 team-a c state
ok $? "node n2 (MI210s): team-a's cache, read with its Secret, is Incompatible"
wait_for 60 is Unauthorized entry2 team-b d reason && wait_for 60 is Unauthorized entry2 team-b e reason
ok $? "node n2: team-b's caches without access say Unauthorized, not what team-a's read found"
daemon_stop agent2
# the operator resolves tags (no webhook here) with each cache's own Secret
$G operator --kubeconfig "$KUBECONFIG" --identity op --namespace gkm-system --leader-elect false \
	--resolve-digests true --verify-enabled false --health-listen "" >"$W/operator.log" 2>&1 &
PID[operator]=$!
tag_cache() { # ns name secret
	kubectl apply -f - >/dev/null <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata: {name: $2, namespace: $1}
spec:
  image: $A/private/cache:v1
  pullSecrets: [{name: $3}]
EOF
}
tag_cache team-a bytag regcred
tag_cache team-b bytag elsewhere
wait_for 60 is "$D" kubectl get gkmc bytag -n team-a -o jsonpath='{.status.resolvedDigest}'
ok $? "operator: team-a's tag resolves with team-a's Secret"
ready_msg() { kubectl get gkmc bytag -n "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}' 2>/dev/null; }
wait_for 60 eval 'ready_msg team-b | grep -q "in Secret team-b/elsewhere"'
ok $? "operator: team-b's tag does not resolve with a Secret lacking the registry, and says so ($(ready_msg team-b))"
[ -z "$(kubectl get gkmc bytag -n team-b -o jsonpath='{.status.resolvedDigest}')" ]
ok $? "operator: team-b's cache gets no digest from team-a's resolution"
wait_for 60 eval "kubectl get gkmc d -n team-b -o jsonpath='{.status.failedNodeConditions.Unauthorized}' | grep -q n1"
ok $? "operator: the cache's status groups the node under Unauthorized ($(kubectl get gkmc d -n team-b -o jsonpath='{.status.failedNodeConditions}'))"
daemon_stop operator
daemon_stop agent
ok $? "the agent stops cleanly"
finish
