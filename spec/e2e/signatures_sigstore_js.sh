#!/usr/bin/env bash
# Bundles made by another sigstore implementation: sigstore-js
# (@sigstore/sign's DSSEBundleBuilder with a local key and no witnesses, so
# nothing on the network) signs an in-toto statement naming an image, and
# @sigstore/oci stores the bundle in a real registry (Debian's
# docker-registry) as an OCI 1.1 referrer: through the fallback
# sha256-<hex> tag index where the registry has no referrers API, through
# the referrers API where the test proxy adds it. gkm verifies them with the
# key, refuses them with another key or when the statement names another
# image, and adds its own bundle beside them without losing theirs. The other
# way round, sigstore-js's verifier accepts the bundle `gkm cache sign
# --bundle` writes. sigstore-js comes from `make sigstore-js` (spec/sigstore-js).
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
cd "$GKM_ROOT"
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
JS=spec/sigstore-js
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-sigstore-js.XXXXXX")
trap 'registry_stop_all; rm -rf "$W"' EXIT
unset GKM_KEY_PASSPHRASE

if ! command -v node >/dev/null 2>&1; then
	skip "bundles made by sigstore-js" "node is not installed"
	finish
	exit
fi
if ! why=$(cd "$JS" && node -e "require('@sigstore/sign'); require('@sigstore/oci');
	require('@sigstore/verify')" 2>&1); then
	skip "bundles made by sigstore-js" "sigstore-js is not installed (make sigstore-js): $(echo "$why" | grep -m1 -E 'Error|Cannot' || echo "$why" | head -1)"
	finish
	exit
fi
if ! registry_available; then
	skip "bundles made by sigstore-js" "docker-registry missing"
	finish
	exit
fi
registry_start plain || { ok 1 "registry starts"; finish; exit; }
R=$REG_plain_ADDR
proxy_start p "$R" || { ok 1 "the referrers proxy starts"; finish; exit; }
P=$PROXY_p_ADDR
py() { /usr/bin/python3 -c "$@"; }

TAP_OUT=$W/out

img() { # name -> pushes, prints the digest
	$G cache build "$FX" --label "test=$1" -t "$R/js/$1:v1" -o json 2>/dev/null |
		py "import json,sys; print(json.load(sys.stdin)['digest'])"
}
sjs() { node "$JS/sign.js" "$@"; }

# keys: gkm's own (ECDSA P-256, PKCS#8), an Ed25519 key made by openssl, a stranger's
$G cache keygen --output-key-prefix "$W/k" >/dev/null 2>&1 &&
	$G cache keygen --output-key-prefix "$W/other" >/dev/null 2>&1 &&
	openssl genpkey -algorithm ed25519 -out "$W/ed.key" 2>/dev/null &&
	openssl pkey -in "$W/ed.key" -pubout -out "$W/ed.pub" 2>/dev/null
ok $? "keys: gkm keygen (P-256) and openssl (Ed25519)"
A=$(img a)
B=$(img b)
C=$(img c)
D=$(img d)
E=$(img e)

# the fallback tag (docker-registry has no referrers API)
expect 0 "sigstore-js signs image a and attaches the bundle" "^attached sha256:" \
	sjs --key "$W/k.key" --image "$R/js/a" --digest "$A" --out "$W/a.bundle.json" --attach
py "
import json; b=json.load(open('$W/a.bundle.json'))
assert b['mediaType']=='application/vnd.dev.sigstore.bundle.v0.3+json', b['mediaType']
assert 'dsseEnvelope' in b and b['dsseEnvelope']['payloadType']=='application/vnd.in-toto+json'
assert b['verificationMaterial']['publicKey']['hint'] and not b['verificationMaterial'].get('tlogEntries')"
ok $? "sigstore-js wrote a v0.3 DSSE bundle with a public-key hint and no log entries"
skopeo inspect --raw --tls-verify=false "docker://$R/js/a:sha256-${A#sha256:}" 2>/dev/null |
	py "
import json,sys; ix=json.load(sys.stdin)
assert [m['artifactType'] for m in ix['manifests']]==['application/vnd.dev.sigstore.bundle.v0.3+json'], ix"
ok $? "@sigstore/oci listed the referrer in the sha256-<hex> fallback index"
expect 0 "gkm cache verify accepts it (bundle, fallback tag)" "Verified .*@$A: bundle signature .*fallback tag" \
	$G cache verify "$R/js/a:v1" --key "$W/k.pub"
expect 1 "with another key it is refused" "is not verified.*no trusted key verifies the DSSE signature" \
	$G cache verify "$R/js/a:v1" --key "$W/other.pub"
expect 0 "gkm sees sigstore-js's bundle as the key's signature: nothing added" \
	"already has a bundle signature by key" \
	$G cache sign "$R/js/a:v1" --bundle --key "$W/k.key"
expect 0 "gkm adds a bundle by another key to sigstore-js's index" "fallback tag index" \
	$G cache sign "$R/js/a:v1" --bundle --key "$W/other.key"
$G cache inspect "$R/js/a:v1" --key "$W/k.pub" -o json 2>/dev/null | py "
import json,sys; s=json.load(sys.stdin)['signatures']
assert s['bundles']==2 and s['verified'] is True, s"
ok $? "both bundles are listed and sigstore-js's still verifies"

# Ed25519
expect 0 "sigstore-js signs image b with an Ed25519 key" "^attached" \
	sjs --key "$W/ed.key" --image "$R/js/b" --digest "$B" --attach
expect 0 "gkm verifies the Ed25519 bundle" "Verified .*@$B" $G cache verify "$R/js/b:v1" --key "$W/ed.pub"

# a valid bundle whose statement names another image, attached to image c
expect 0 "sigstore-js attaches to image c a statement for image a" "^attached" \
	sjs --key "$W/k.key" --image "$R/js/c" --digest "$C" --statement-digest "$A" --attach
expect 1 "gkm refuses it: the statement is for another image" "statement is for $A, not $C" \
	$G cache verify "$R/js/c:v1" --key "$W/k.pub"

# the referrers API (the proxy in front of the registry serves it)
expect 0 "sigstore-js attaches through a registry with the referrers API" "^attached" \
	sjs --key "$W/k.key" --image "$P/js/d" --digest "$D" --attach
skopeo inspect --raw --tls-verify=false "docker://$R/js/d:sha256-${D#sha256:}" >/dev/null 2>&1
[ $? -ne 0 ]
ok $? "... and writes no fallback tag there"
$G cache inspect "$P/js/d:v1" --key "$W/k.pub" -o json >"$W/insp.json" 2>/dev/null
py "
import json; s=json.load(open('$W/insp.json'))['signatures']
assert s['referrersAPI'] is True and s['bundles']==1 and s['verified'] is True, s"
ok $? "gkm finds the bundle through the referrers API and verifies it"

# the other way: sigstore-js verifies what gkm signs
expect 0 "gkm cache sign --bundle image e" "Signed" $G cache sign "$R/js/e:v1" --bundle --key "$W/k.key"
bundle_of() { # image digest -> the bundle blob, found through the fallback index
	local ix m
	ix=$(skopeo inspect --raw --tls-verify=false "docker://$R/js/e:sha256-${1#sha256:}") &&
		m=$(echo "$ix" | py "import json,sys; print(json.load(sys.stdin)['manifests'][0]['digest'])") &&
		curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$R/v2/js/e/manifests/$m" |
		py "import json,sys; print(json.load(sys.stdin)['layers'][0]['digest'])" |
			xargs -I{} curl -sf "http://$R/v2/js/e/blobs/{}"
}
bundle_of "$E" >"$W/e.bundle.json"
ok $? "gkm's bundle fetched from the registry"
expect 0 "sigstore-js's verifier accepts gkm's bundle with the key" "^verified https://sigstore.dev/cosign/sign/v1 for $E" \
	node "$JS/verify.js" --key "$W/k.pub" --bundle "$W/e.bundle.json" --digest "$E"
expect 1 "... and refuses it with another key" "verify.js: " \
	node "$JS/verify.js" --key "$W/other.pub" --bundle "$W/e.bundle.json" --digest "$E"
expect 0 "sigstore-js's verifier accepts its own bundle too (the control)" "^verified" \
	node "$JS/verify.js" --key "$W/k.pub" --bundle "$W/a.bundle.json" --digest "$A"

finish
