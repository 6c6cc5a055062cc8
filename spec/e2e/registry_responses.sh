#!/usr/bin/env bash
# What a registry answers is not trusted (real docker-registry instances
# behind spec/lib/regproxy.py, which misbehaves on cue):
# - a blob download redirected to another host (as registries send blobs to
#   storage) is followed, and the credentials of the registry never go with
#   it; a redirected manifest or tag is not followed;
# - a registry that speaks HTTPS cannot send a download to plain HTTP;
# - an error body reaches users only as a short printable excerpt.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-registry-responses.XXXXXX")
trap 'registry_stop_all; rm -rf "$W"' EXIT
py() { /usr/bin/python3 -c "$@"; }

if ! registry_available || ! command -v htpasswd >/dev/null || ! command -v openssl >/dev/null; then
	skip "registry responses" "docker-registry, htpasswd or openssl missing"
	finish
	exit
fi
htpasswd -Bbn ana s3cret >"$W/htpasswd" 2>/dev/null
registry_start origin htpasswd "$W/htpasswd" && registry_start storage ||
	{ ok 1 "registries start"; finish; exit; }
O=$REG_origin_ADDR S=$REG_storage_ADDR
# the same image (one source date: the same blobs) in the origin, which wants
# a login, and in an open "storage" registry that stands for a blob store
$G cache build "$FX" -t "$O/caches/x:v1" --source-date-epoch 1 --creds ana:s3cret >/dev/null 2>&1 &&
	$G cache build "$FX" -t "$S/caches/x:v1" --source-date-epoch 1 >/dev/null 2>&1
ok $? "one image in a registry that wants a login and in an open one"
proxy_start front "$O" && proxy_start store "$S" || { ok 1 "proxies start"; finish; exit; }
F=$PROXY_front_ADDR B=$PROXY_store_ADDR
stats() { curl -s "http://$1/_stats"; }

# ---- blob downloads follow redirects; credentials stay home ----
proxy_fault "$F" "{\"redirect\": \"http://$B\", \"match\": \"^GET /v2/caches/x/blobs/\"}"
$G cache extract "$F/caches/x:v1" "$W/x1" --creds ana:s3cret >"$W/out" 2>&1 &&
	[ -d "$W/x1/io.triton.cache" ]
ok $? "blob downloads redirected to another host are followed" || sed 's/^/#   /' "$W/out"
stats "$B" | py "import json,sys
j = json.load(sys.stdin)
blobs = [p for m, p in j['requests'] if '/blobs/' in p]
assert blobs and not j['authorized'], j"
ok $? "the other host got the blob requests and never the registry's credentials" || stats "$B"
stats "$F" | py "import json,sys
j = json.load(sys.stdin)
assert any('/manifests/' in p for m, p in j['authorized']), j"
ok $? "the registry itself got them (the login worked)"

proxy_fault "$F" "{\"redirect\": \"http://$B\", \"match\": \"^(GET|HEAD) /v2/caches/x/manifests/\"}"
$G cache extract "$F/caches/x:v1" "$W/x2" --creds ana:s3cret >"$W/out" 2>&1
[ $? -ne 0 ] && grep -q "HTTP 307" "$W/out" && [ ! -d "$W/x2/io.triton.cache" ]
ok $? "a redirected manifest is not followed: the pull fails naming the answer" || sed 's/^/#   /' "$W/out"
proxy_fault "$F" '{}'

# ---- HTTPS never hands a download to plain HTTP ----
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$W/ca.key" -out "$W/ca.pem" -days 2 \
	-subj /CN=gkm-test-ca >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -keyout "$W/tls.key" -out "$W/tls.csr" -subj /CN=127.0.0.1 >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1\n' >"$W/san.ext"
openssl x509 -req -in "$W/tls.csr" -CA "$W/ca.pem" -CAkey "$W/ca.key" -CAcreateserial \
	-out "$W/tls.crt" -days 2 -extfile "$W/san.ext" >/dev/null 2>&1
proxy_start secure "$S" "$W/tls.crt" "$W/tls.key" || { ok 1 "an HTTPS proxy starts"; finish; exit; }
T=$PROXY_secure_ADDR
$G cache extract "$T/caches/x:v1" "$W/x3" --ca-file "$W/ca.pem" >"$W/out" 2>&1 && [ -d "$W/x3/io.triton.cache" ]
ok $? "the image pulls over HTTPS" || sed 's/^/#   /' "$W/out"
proxy_fault "$T" "{\"redirect\": \"http://$B\", \"match\": \"^GET /v2/caches/x/blobs/\"}"
before=$(stats "$B" | py "import json,sys; print(sum('/blobs/' in p for m, p in json.load(sys.stdin)['requests']))")
$G cache extract "$T/caches/x:v1" "$W/x4" --ca-file "$W/ca.pem" >"$W/out" 2>&1
rc=$?
after=$(stats "$B" | py "import json,sys; print(sum('/blobs/' in p for m, p in json.load(sys.stdin)['requests']))")
[ $rc -ne 0 ] && [ "$before" = "$after" ] && [ ! -d "$W/x4/io.triton.cache" ]
ok $? "an HTTPS registry that redirects a blob to plain HTTP: refused, nothing fetched over HTTP" ||
	{ echo "# requests $before -> $after"; sed 's/^/#   /' "$W/out"; }

# ---- error bodies: a short printable excerpt ----
junk=$(py "print(('\\x1b[31mPWNED\\x07 ' + 'A' * 60 + '<script>') * 40)")
proxy_fault "$F" "$(py "import json,sys; print(json.dumps({'fail': 100, 'status': 400, 'body': sys.argv[1], 'match': '/manifests/'}))" "$junk")"
$G cache inspect "$F/caches/x:v1" --creds ana:s3cret >"$W/out" 2>&1
[ $? -ne 0 ] && grep -q "HTTP 400" "$W/out" && ! grep -q "$(printf '\033')" "$W/out" &&
	! grep -q "$(printf '\007')" "$W/out" &&
	[ "$(grep "HTTP 400" "$W/out" | py "import sys; l = sys.stdin.read(); print(len(l.split('HTTP 400', 1)[1]))")" -le 130 ]
ok $? "an error body of 4 KB with control characters: a printable excerpt of at most 120 bytes" ||
	cat -v "$W/out" | head -3 | sed 's/^/#   /'
proxy_fault "$F" "$(py "import json; print(json.dumps({'fail': 100, 'status': 400, 'match': '/manifests/', 'body': json.dumps({'errors': [{'code': 'DENIED', 'message': '\\x1b]0;title\\x07' + 'B' * 500}]})}))")"
$G cache inspect "$F/caches/x:v1" --creds ana:s3cret >"$W/out" 2>&1
[ $? -ne 0 ] && grep -q "HTTP 400: DENIED ?]0;title?BBB" "$W/out" && ! grep -q "$(printf '\033')" "$W/out" &&
	[ "$(grep -o 'B*\.\.\.' "$W/out" | head -1 | wc -c)" -le 125 ]
ok $? "a distribution error message is cut and stripped the same way" || cat -v "$W/out" | head -3 | sed 's/^/#   /'
proxy_fault "$F" '{}'
finish
