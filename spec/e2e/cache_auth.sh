#!/usr/bin/env bash
# Registry authentication against real docker-registry instances: htpasswd
# (Basic) and token auth (Bearer, with a token server issuing RS256 JWTs
# the registry verifies against a certificate made here with openssl).
# Credentials from --creds, dockerconfigjson files, $REGISTRY_AUTH_FILE and
# a Kubernetes Secret document; skopeo reads what gkm pushed.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
cd "$GKM_ROOT"
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-auth-e2e.XXXXXX")
trap 'registry_stop_all; rm -rf "$W"' EXIT
unset REGISTRY_AUTH_FILE DOCKER_CONFIG
export HOME=$W XDG_RUNTIME_DIR=$W/run

if ! registry_available || ! command -v htpasswd >/dev/null || ! command -v openssl >/dev/null; then
	skip "registry authentication" "docker-registry, htpasswd or openssl missing"
	finish
	exit
fi

expect_fail() { # name pattern cmd...
	local name=$1 pat=$2
	shift 2
	"$@" >"$W/neg.out" 2>&1
	local rc=$?
	if [ $rc -eq 1 ] && grep -qE "$pat" "$W/neg.out"; then
		ok 0 "$name"
	else
		ok 1 "$name"
		echo "# exit $rc:"
		sed 's/^/#   /' "$W/neg.out" | head -10
	fi
}
expect_ok() { # name cmd...
	local name=$1
	shift
	"$@" >"$W/pos.out" 2>&1
	local rc=$?
	ok $rc "$name"
	[ $rc -eq 0 ] || sed 's/^/#   /' "$W/pos.out" | head -10
}
authfile() { # file host user pass
	printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$2" "$(printf '%s:%s' "$3" "$4" | base64 -w0)" >"$1"
}

# ---- Basic (htpasswd) ----------------------------------------------------------
htpasswd -Bbn alice 's3cret!' >"$W/htpasswd" 2>/dev/null
registry_start basic htpasswd "$W/htpasswd" || { ok 1 "htpasswd registry starts"; finish; exit; }
B=$REG_basic_ADDR
expect_fail "basic: no credentials says a login is needed" "requires a login and no credentials were found" \
	$G cache build "$FX" -t "$B/team/cache:v1"
expect_fail "basic: wrong password is named as rejected credentials" "rejected the credentials from explicit credentials" \
	$G cache build "$FX" -t "$B/team/cache:v1" --creds 'alice:wrong'
expect_ok "basic: --creds pushes" $G cache build "$FX" -t "$B/team/cache:v1" --creds 'alice:s3cret!'
authfile "$W/auth.json" "$B" alice 's3cret!'
expect_ok "basic: --authfile (dockerconfigjson) reads" $G cache inspect "$B/team/cache:v1" --authfile "$W/auth.json"
REGISTRY_AUTH_FILE=$W/auth.json expect_ok "basic: \$REGISTRY_AUTH_FILE reads" $G cache inspect "$B/team/cache:v1"
mkdir -p "$W/.docker" && cp "$W/auth.json" "$W/.docker/config.json"
expect_ok "basic: ~/.docker/config.json reads" $G cache extract "$B/team/cache:v1" "$W/x-basic"
rm -f "$W/.docker/config.json"
printf '{"apiVersion":"v1","kind":"Secret","type":"kubernetes.io/dockerconfigjson","data":{".dockerconfigjson":"%s"}}\n' \
	"$(base64 -w0 <"$W/auth.json")" >"$W/secret.json"
expect_ok "basic: a Secret's .dockerconfigjson reads" $G cache inspect "$B/team/cache:v1" --authfile "$W/secret.json"
authfile "$W/other.json" "other.example:5000" alice 's3cret!'
expect_fail "basic: an auth file without this host gives the login message" "no credentials were found" \
	$G cache inspect "$B/team/cache:v1" --authfile "$W/other.json"
echo '{"auths":{"'"$B"'":{"auth":"%%%"}}}' >"$W/bad.json"
expect_fail "basic: a malformed auth entry is reported" "not base64 of user:password" \
	$G cache inspect "$B/team/cache:v1" --authfile "$W/bad.json"
skopeo inspect --tls-verify=false --creds 'alice:s3cret!' "docker://$B/team/cache:v1" >/dev/null 2>&1
ok $? "basic: skopeo reads the image gkm pushed"

# ---- Bearer (token auth) -------------------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$W/tok.key" -out "$W/tok.crt" -days 2 \
	-subj /CN=gkm-test-token >/dev/null 2>&1
tokenserver_start "$W/tok.key" "$W/tok.crt" gkm-test-issuer gkm-test-registry 'bob:pa55' ||
	{ ok 1 "token server starts"; finish; exit; }
registry_start tok token "http://$TOKEN_ADDR/token" gkm-test-registry gkm-test-issuer "$W/tok.crt" ||
	{ ok 1 "token-auth registry starts"; finish; exit; }
T=$REG_tok_ADDR
curl -si "http://$T/v2/" | grep -qi '^www-authenticate: bearer realm='
ok $? "bearer: the registry challenges with Bearer"
expect_fail "bearer: anonymous is refused by the token server, named" "refused anonymous access.*credentials needed" \
	$G cache build "$FX" -t "$T/team/cache:v1"
expect_fail "bearer: wrong password is named" "rejected the credentials" \
	$G cache build "$FX" -t "$T/team/cache:v1" --creds 'bob:nope'
expect_ok "bearer: --creds gets a token and pushes" $G cache build "$FX" -t "$T/team/cache:v1" --creds 'bob:pa55'
stats() { curl -s "http://$TOKEN_ADDR/stats"; }
before=$(stats | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
expect_ok "bearer: extract with a token" $G cache extract "$T/team/cache:v1" "$W/x-tok" --creds 'bob:pa55'
after=$(stats | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
[ $((after - before)) -eq 1 ]
ok $? "bearer: one token serves every request of a pull (manifest, config, layer): $((after - before)) fetched"
stats | /usr/bin/python3 -c 'import json,sys; s=json.load(sys.stdin)["scopes"]; assert "repository:team/cache:pull,push" in s and "repository:team/cache:pull" in s, s'
ok $? "bearer: push asks for pull,push, pull for pull"
authfile "$W/tok.json" "$T" bob pa55
expect_ok "bearer: credentials from an auth file" $G cache inspect "$T/team/cache:v1" --authfile "$W/tok.json"
skopeo inspect --tls-verify=false --creds 'bob:pa55' "docker://$T/team/cache:v1" >/dev/null 2>&1
ok $? "bearer: skopeo reads the image gkm pushed"

finish
