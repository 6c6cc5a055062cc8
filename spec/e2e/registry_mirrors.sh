#!/usr/bin/env bash
# Registry mirrors as nodes configure them, against real docker-registry
# instances on loopback: an origin, a mirror holding a copy (then a subset,
# then a corrupted blob), a mirror behind htpasswd, a mirror with TLS from a
# CA made here. containerd's hosts directory and registries.conf v2 each
# route digests and tags their own way; every byte is checked whichever
# source sent it; signatures are found on the mirror when the origin is down.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
cd "$GKM_ROOT"
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-mirrors-e2e.XXXXXX")
UP_PID=""
trap '[ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null; registry_stop_all; rm -rf "$W"' EXIT
unset REGISTRY_AUTH_FILE DOCKER_CONFIG https_proxy HTTPS_PROXY http_proxy HTTP_PROXY
export HOME=$W XDG_RUNTIME_DIR=$W/run
py() { /usr/bin/python3 -c "$@"; }

if ! registry_available || ! command -v htpasswd >/dev/null || ! command -v openssl >/dev/null; then
	skip "registry mirrors" "docker-registry, htpasswd or openssl missing"
	finish
	exit
fi

registry_start origin || { ok 1 "origin registry starts"; finish; exit; }
registry_start mirror || { ok 1 "mirror registry starts"; finish; exit; }
O=$REG_origin_ADDR M=$REG_mirror_ADDR
$G cache build "$FX" --source-date-epoch 1700000000 -t "$O/team/cache:v1" -o json >"$W/b.json" 2>"$W/b.err"
ok $? "image built into the origin"
D=$(py "import json; print(json.load(open('$W/b.json'))['digest'])")
L=$(py "import json; print(json.load(open('$W/b.json'))['layerDigest'])")
$G cache keygen --output-key-prefix "$W/k" >/dev/null 2>&1 &&
	$G cache sign "$O/team/cache@$D" --key "$W/k.key" >/dev/null 2>&1
ok $? "image signed in the origin"
SIGTAG="sha256-${D#sha256:}.sig"
$G cache push "$O/team/cache:v1" "$M/team/cache:v1" >/dev/null 2>&1 &&
	$G cache push "$O/team/cache:$SIGTAG" "$M/team/cache:$SIGTAG" >/dev/null 2>&1
ok $? "image and signature copied to the mirror"
$G cache extract "$O/team/cache@$D" "$W/want" >/dev/null 2>&1
ok $? "reference tree extracted from the origin"

same_tree() { diff -r "$W/want" "$1" >/dev/null; }
HD=$W/certs.d
hosts() { # registry toml...: write HD/<registry>/hosts.toml
	mkdir -p "$HD/$1"
	printf '%s\n' "${@:2}" >"$HD/$1/hosts.toml"
}

# ---- containerd hosts directory --------------------------------------------
hosts "$O" "server = \"http://$O\"" "[host.\"http://$M\"]" 'capabilities = ["pull"]'
registry_stop origin
expect 0 "hosts.toml: a digest is pulled from the mirror while the origin is down" "" \
	$G cache extract "$O/team/cache@$D" "$W/x1" --registry-hosts-dir "$HD"
same_tree "$W/x1"
ok $? "hosts.toml: the tree from the mirror is the origin's"
expect 1 "hosts.toml: a tag is not resolved by a pull-only mirror (the origin is asked, and is down)" \
	"mirrors passed over|Connection refused|Couldn't connect" \
	$G cache extract "$O/team/cache:v1" "$W/x2" --registry-hosts-dir "$HD"
hosts "$O" "server = \"http://$O\"" "[host.\"http://$M\"]" 'capabilities = ["pull", "resolve"]'
expect 0 "hosts.toml: with resolve, the tag resolves on the mirror" "" \
	$G cache extract "$O/team/cache:v1" "$W/x3" --registry-hosts-dir "$HD"
expect 0 "hosts.toml: the signature is found on the mirror and verifies" "" \
	$G cache verify "$O/team/cache@$D" --key "$W/k.pub" --registry-hosts-dir "$HD"
# the whole node pipeline with the origin down: the operator resolves the
# tag and the agent pulls and verifies the signature, all through the mirror
cat >"$W/tag.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata: {name: by-tag}
spec: {image: "$O/team/cache:v1"}
EOF
$G apply --state "$W/up0" -f "$W/tag.yaml" >/dev/null 2>&1
$GKM_BIN up --state "$W/up0" --node node-1 --gpu-source file --gpu-file spec/fixtures/gpu/inventory/t4.json \
	--poll-ms 100 --key "$W/k.pub" --registry-hosts-dir "$HD" --health-listen "" >"$W/up0.log" 2>&1 &
UP_PID=$!
wait_for 60 is Ready eval "$G get --state '$W/up0' cgkmcn node-1 -o json 2>/dev/null | /usr/bin/python3 -c \"import json,sys; print(json.load(sys.stdin)['status']['caches']['by-tag']['state'])\""
ok $? "standalone, origin down: a cache by tag resolves, verifies and becomes Ready through the mirror" || tail -5 "$W/up0.log"
[ "$($G get --state "$W/up0" cgkmc by-tag -o json 2>/dev/null | py "import json,sys; print(json.load(sys.stdin)['status']['resolvedDigest'])")" = "$D" ]
ok $? "standalone, origin down: the digest the mirror resolved is the origin's"
kill $UP_PID 2>/dev/null; wait $UP_PID 2>/dev/null
UP_PID=""
mv "$HD/$O" "$HD/_default"
expect 0 "hosts.toml: _default applies to a registry without its own directory" "" \
	$G cache extract "$O/team/cache@$D" "$W/x4" --registry-hosts-dir "$HD"
rm -rf "$HD/_default"
hosts "$O" "[host.\"http://$M\"]" 'capabilites = ["pull"]'
expect 2 "hosts.toml: a misspelt key is refused at start, naming the file" \
	"$O/hosts.toml: \[host.\"http://$M\"\]: unknown key 'capabilites'" \
	$G cache extract "$O/team/cache@$D" "$W/x5" --registry-hosts-dir "$HD"
hosts "$O" "[host.\"http://$M\"]" 'capabilities = ["pull"' ''
expect 2 "hosts.toml: a syntax error is refused with file and line" "$O/hosts.toml:2: array not closed" \
	$G cache extract "$O/team/cache@$D" "$W/x5" --registry-hosts-dir "$HD"
registry_restart origin

# ---- registries.conf --------------------------------------------------------
RC=$W/registries.conf
conf() { printf '%s\n' "$@" >"$RC"; }
conf "[[registry]]" "location = \"$O\"" "[[registry.mirror]]" "location = \"$M\"" \
	'pull-from-mirror = "digest-only"'
registry_stop origin
expect 0 "registries.conf: a digest is pulled from a digest-only mirror" "" \
	$G cache extract "$O/team/cache@$D" "$W/y1" --registries-conf "$RC"
expect 1 "registries.conf: a tag never goes to a digest-only mirror" "Connection refused|Couldn't connect" \
	$G cache inspect "$O/team/cache:v1" --registries-conf "$RC"
conf "[[registry]]" "prefix = \"$O/team\"" "location = \"$O/team\"" "[[registry.mirror]]" \
	"location = \"$M/team\""
expect 0 "registries.conf: an 'all' mirror under a repository prefix resolves the tag too" "" \
	$G cache extract "$O/team/cache:v1" "$W/y2" --registries-conf "$RC"
conf "[[registry]]" "location = \"$O\"" "blocked = true"
expect 1 "registries.conf: a blocked registry is refused, naming the file" "registry $O is blocked by $RC" \
	$G cache inspect "$O/team/cache@$D" --registries-conf "$RC"
conf "[[registry]]" "location = \"$O\"" "[[registry.mirror]]" "location = \"$M\"" \
	'pull-from-mirror = "sometimes"'
expect 2 "registries.conf: a bad pull-from-mirror is refused at start" "not all, digest-only or tag-only" \
	$G cache inspect "$O/team/cache@$D" --registries-conf "$RC"
registry_restart origin

# ---- a mirror with a subset, and with a corrupted blob ----------------------
conf "[[registry]]" "location = \"$O\"" "[[registry.mirror]]" "location = \"$M\""
BLOB=$(registry_blob_file mirror "$L")
mv "$BLOB" "$W/layer.saved"
expect 0 "a layer the mirror lacks comes from the origin" "" \
	$G cache extract "$O/team/cache@$D" "$W/z1" --registries-conf "$RC"
same_tree "$W/z1"
ok $? "the tree from mirror and origin together is the origin's"
cp "$W/layer.saved" "$BLOB"
py "p='$BLOB'; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0xff; open(p,'wb').write(b)"
expect 0 "a corrupted layer on the mirror is refused, with the reason, and the origin used" \
	"mirror passed over for a blob.*mirror=$M.*digest mismatch" \
	$G cache extract "$O/team/cache@$D" "$W/z2" --registries-conf "$RC"
same_tree "$W/z2"
ok $? "the tree after a corrupted mirror blob is the origin's"
# a layer too large to be checked before it streams (over 4 MiB): the
# extraction in progress is thrown away and done again from the origin
cp -r "$FX" "$W/big" && head -c 6000000 /dev/urandom >"$W/big/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.bin"
$G cache build "$W/big" -t "$O/team/big:v1" -o json >"$W/big.json" 2>/dev/null &&
	$G cache push "$O/team/big:v1" "$M/team/big:v1" >/dev/null 2>&1
ok $? "a 6 MB image in the origin and the mirror"
BD=$(py "import json; print(json.load(open('$W/big.json'))['digest'])")
BL=$(registry_blob_file mirror "$(py "import json; print(json.load(open('$W/big.json'))['layerDigest'])")")
py "p='$BL'; b=bytearray(open(p,'rb').read()); b[len(b)-100]^=0xff; open(p,'wb').write(b)"
BIN=5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.bin
expect 0 "gkm cache extract: a large corrupted mirror layer is pulled again from the origin" \
	"pull retried from the next source.*mirror $M \(passed over from now on\): layer 0 digest mismatch" \
	$G cache extract "$O/team/big@$BD" "$W/z4" --registries-conf "$RC"
cmp -s "$W/big/$BIN" "$W/z4/io.triton.cache/$BIN" && ! ls "$W"/z4.partial-* >/dev/null 2>&1
ok $? "gkm cache extract: the tree holds the origin's bytes, nothing partial left"
expect 0 "gkm cache extract --store: the same, into the content store" \
	"pull retried from the next source.*digest mismatch" \
	$G cache extract "$O/team/big@$BD" --store "$W/store" --registries-conf "$RC"
cmp -s "$W/big/$BIN" "$W/store/sha256/${BD#sha256:}/io.triton.cache/$BIN"
ok $? "gkm cache extract --store: the entry holds the origin's bytes"
# the node's pull (standalone mode runs the agent's) does it again from the origin
S=$W/up
cat >"$W/big.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata:
  name: big
spec:
  image: $O/team/big:v1
EOF
$G apply --state "$S" -f "$W/big.yaml" >/dev/null 2>&1
$GKM_BIN up --state "$S" --node node-1 --gpu-source file --gpu-file spec/fixtures/gpu/inventory/mixed.json \
	--poll-ms 100 --registries-conf "$RC" --verify-enabled false --health-listen "" >"$W/up.log" 2>&1 &
UP_PID=$!
state() { $G get --state "$S" cgkmcn node-1 -o json 2>/dev/null |
	py "import json,sys; print(json.load(sys.stdin)['status']['caches']['big']['state'])" 2>/dev/null; }
wait_for 60 is Ready state
ok $? "standalone: the cache behind a corrupted mirror layer becomes Ready"
kill $UP_PID 2>/dev/null; wait $UP_PID 2>/dev/null
grep -q "pull retried from the next source.*digest mismatch" "$W/up.log"
ok $? "standalone: the log says the pull was done again after the mirror's digest mismatch" || tail -5 "$W/up.log"
cmp "$W/big/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.bin" \
	"$S/caches/_cluster/big/data/io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.bin"
ok $? "standalone: the cache holds the origin's bytes"
registry_stop origin
expect 1 "with the origin down, the corrupted mirror layer is never accepted" "digest mismatch" \
	$G cache extract "$O/team/cache@$D" "$W/z3" --registries-conf "$RC"
[ ! -e "$W/z3" ]
ok $? "nothing extracted from the corrupted mirror"
registry_restart origin
cp "$W/layer.saved" "$BLOB"

# ---- a mirror behind htpasswd -----------------------------------------------
htpasswd -Bbn carol 'm1rr0r' >"$W/htpasswd" 2>/dev/null
registry_start auth htpasswd "$W/htpasswd" || { ok 1 "htpasswd mirror starts"; finish; exit; }
A=$REG_auth_ADDR
$G cache push "$O/team/cache:v1" "$A/team/cache:v1" --creds 'carol:m1rr0r' >/dev/null 2>&1
ok $? "image copied to the htpasswd mirror"
printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$A" "$(printf carol:m1rr0r | base64 -w0)" >"$W/auth.json"
hosts "$O" "[host.\"http://$A\"]" 'capabilities = ["pull"]'
registry_stop origin
expect 0 "the mirror's credentials are found under the mirror's host" "" \
	$G cache extract "$O/team/cache@$D" "$W/a1" --registry-hosts-dir "$HD" --authfile "$W/auth.json"
expect 1 "without them the mirror refuses, and the reason names it" \
	"mirror.*$A|$A.*(login|credentials)" \
	$G cache extract "$O/team/cache@$D" "$W/a2" --registry-hosts-dir "$HD"
registry_restart origin

# ---- a mirror with TLS from our own CA ---------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$W/ca.key" -out "$W/ca.pem" -days 2 \
	-subj /CN=gkm-test-ca >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -keyout "$W/tls.key" -out "$W/tls.csr" -subj /CN=127.0.0.1 >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1\n' >"$W/san.ext"
openssl x509 -req -in "$W/tls.csr" -CA "$W/ca.pem" -CAkey "$W/ca.key" -CAcreateserial \
	-out "$W/tls.crt" -days 2 -extfile "$W/san.ext" >/dev/null 2>&1
registry_start tls tls "$W/tls.crt" "$W/tls.key" || { ok 1 "TLS mirror starts"; finish; exit; }
T=$REG_tls_ADDR
$G cache push "$O/team/cache:v1" "$T/team/cache:v1" --ca-file "$W/ca.pem" >/dev/null 2>&1
ok $? "image copied to the TLS mirror"
cp "$W/ca.pem" "$HD/ca.pem"
hosts "$O" "[host.\"https://$T\"]" 'capabilities = ["pull"]' 'ca = "../ca.pem"'
registry_stop origin
expect 0 "TLS mirror: its CA from hosts.toml (relative to the file) is trusted" "" \
	$G cache extract "$O/team/cache@$D" "$W/t1" --registry-hosts-dir "$HD"
hosts "$O" "[host.\"https://$T\"]" 'capabilities = ["pull"]'
expect 1 "TLS mirror: without its CA the certificate is refused" "certificate|SSL" \
	$G cache extract "$O/team/cache@$D" "$W/t2" --registry-hosts-dir "$HD"
hosts "$O" "[host.\"https://$T\"]" 'capabilities = ["pull"]' 'skip_verify = true'
expect 0 "TLS mirror: skip_verify accepts it (the digests still checked)" "" \
	$G cache extract "$O/team/cache@$D" "$W/t3" --registry-hosts-dir "$HD"
same_tree "$W/t3"
ok $? "the tree from the TLS mirror is the origin's"
registry_restart origin

# ---- proxies: HTTPS_PROXY and NO_PROXY, as libcurl reads them -----------------
fwdproxy_start || { ok 1 "forward proxy starts"; finish; exit; }
HTTPS_PROXY=http://$FWDPROXY_ADDR expect 0 "HTTPS_PROXY: a TLS registry is reached through the proxy" "" \
	$G cache extract "$T/team/cache@$D" "$W/p1" --ca-file "$W/ca.pem"
grep -q "^CONNECT $T" "$FWDPROXY_LOG"
ok $? "HTTPS_PROXY: the proxy tunnelled the connection (CONNECT $T)" || sed 's/^/#   /' "$FWDPROXY_LOG"
: >"$FWDPROXY_LOG"
HTTPS_PROXY=http://$FWDPROXY_ADDR NO_PROXY=127.0.0.1 expect 0 "NO_PROXY: the registry is reached directly" "" \
	$G cache extract "$T/team/cache@$D" "$W/p2" --ca-file "$W/ca.pem"
[ ! -s "$FWDPROXY_LOG" ]
ok $? "NO_PROXY: the proxy saw nothing" || sed 's/^/#   /' "$FWDPROXY_LOG"
http_proxy=http://$FWDPROXY_ADDR expect 0 "http_proxy: a plain-HTTP registry is reached through the proxy" "" \
	$G cache inspect "$O/team/cache@$D" --no-signatures
grep -q "^GET http://$O/v2/" "$FWDPROXY_LOG"
ok $? "http_proxy: the proxy forwarded the requests" || sed 's/^/#   /' "$FWDPROXY_LOG"
HTTPS_PROXY=http://127.0.0.1:$(free_port) expect 1 "HTTPS_PROXY: a proxy that is down fails the pull (it is really used)" \
	"proxy|Couldn't connect|Connection refused" \
	$G cache extract "$T/team/cache@$D" "$W/p3" --ca-file "$W/ca.pem" --retries 0

# ---- failure reasons in the node status ---------------------------------------
NOHOST=127.0.0.1:$(free_port) NOMIRROR=127.0.0.1:$(free_port)
hosts "$NOHOST" "[host.\"http://$NOMIRROR\"]" 'capabilities = ["pull", "resolve"]'
S2=$W/up2
cat >"$W/fail.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata: {name: down}
spec: {image: "$NOHOST/team/cache@$D"}
---
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata: {name: cert}
spec: {image: "$T/team/cache@$D"}
---
apiVersion: gkm.io/v1alpha1
kind: ClusterGKMCache
metadata: {name: auth}
spec: {image: "$A/team/cache@$D"}
EOF
$G apply --state "$S2" -f "$W/fail.yaml" >/dev/null 2>&1
$GKM_BIN up --state "$S2" --node node-1 --gpu-source file --gpu-file spec/fixtures/gpu/inventory/mixed.json \
	--poll-ms 100 --registry-hosts-dir "$HD" --verify-enabled false --health-listen "" >"$W/up2.log" 2>&1 &
UP_PID=$!
field2() { $G get --state "$S2" cgkmcn node-1 -o json 2>/dev/null |
	py "import json,sys; c=json.load(sys.stdin)['status']['caches']['$1']; print($2)" 2>/dev/null; }
wait_for 60 is MirrorUnreachable field2 down "c['reason']"
ok $? "status: mirror and origin both down is MirrorUnreachable"
field2 down "c['message']" | grep -q "no mirror ($NOMIRROR) nor the origin answered"
ok $? "status: the message names the mirror tried" || field2 down "c['message']"
wait_for 60 is CertificateUnknown field2 cert "c['reason']"
ok $? "status: a registry certificate from an unknown CA is CertificateUnknown"
field2 cert "c['message']" | grep -q "the certificate of $T is not trusted"
ok $? "status: the message names the registry and how to give its CA" || field2 cert "c['message']"
wait_for 60 is Unauthorized field2 auth "c['reason']"
ok $? "status: a registry that wants credentials is Unauthorized"
field2 auth "c['message']" | grep -q "$A"
ok $? "status: the message names the registry" || field2 auth "c['message']"
kill $UP_PID 2>/dev/null; wait $UP_PID 2>/dev/null
UP_PID=""

finish
