#!/usr/bin/env bash
# Signatures in a real registry: cosign simple signing on the
# sha256-<hex>.sig tag, sigstore bundles as OCI 1.1 referrers (through the
# referrers API where the registry has one: the test proxy adds it to
# docker-registry; else the sha256-<hex> fallback index), verification with
# the right key, the wrong key, a payload for another digest, an unsigned
# image, and extraction gated on verification.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
cd "$GKM_ROOT"
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FX=spec/fixtures/caches/triton
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-sig-e2e.XXXXXX")
trap 'registry_stop_all; rm -rf "$W"' EXIT
unset GKM_KEY_PASSPHRASE

if ! registry_available; then
	skip "signatures in a registry" "docker-registry missing"
	finish
	exit
fi
registry_start plain || { ok 1 "registry starts"; finish; exit; }
R=$REG_plain_ADDR
py() { /usr/bin/python3 -c "$@"; }

TAP_OUT=$W/out

# keys: a good pair (encrypted), a stranger's pair
printf 'correct horse\n' >"$W/pass"
expect 0 "keygen writes an encrypted key pair" "encrypted" \
	$G cache keygen --output-key-prefix "$W/good" --passphrase-file "$W/pass"
expect 0 "keygen writes a second pair" "Public key written" $G cache keygen --output-key-prefix "$W/other"
expect 1 "keygen never overwrites" "already exists" $G cache keygen --output-key-prefix "$W/good"
[ "$(stat -c %a "$W/good.key")" = 600 ] && grep -q "ENCRYPTED PRIVATE KEY" "$W/good.key"
ok $? "the private key is mode 0600 and encrypted"

img() { # name fixture -> pushes, prints the digest
	$G cache build "$FX/$2" --label "test=$1" -t "$R/sig/$1:v1" -o json 2>/dev/null |
		py "import json,sys; print(json.load(sys.stdin)['digest'])"
}
A=$(img a cuda-sm75-vector-add)
B=$(img b hip-gfx90a-vector-add)
C=$(img c cuda-sm75-vector-add)

expect 1 "an unsigned image is refused, said so" "image is not signed" \
	$G cache verify "$R/sig/a:v1" --key "$W/good.pub"
expect 1 "signing with a wrong passphrase fails, named" "key .*good.key" \
	$G cache sign "$R/sig/a:v1" --key "$W/good.key"
expect 0 "sign (simple signing) with the encrypted key" "simple signing on tag sha256-${A#sha256:}.sig" \
	$G cache sign "$R/sig/a:v1" --key "$W/good.key" --passphrase-file "$W/pass"
skopeo inspect --raw --tls-verify=false "docker://$R/sig/a:sha256-${A#sha256:}.sig" >"$W/sig.json" 2>/dev/null &&
	py "
import json; m=json.load(open('$W/sig.json'))
l=m['layers'][0]
assert l['mediaType']=='application/vnd.dev.cosign.simplesigning.v1+json'
assert 'dev.cosignproject.cosign/signature' in l['annotations']"
ok $? "skopeo sees the cosign layout: one simplesigning layer with its signature annotation"
expect 0 "verify with the right key" "Verified .*@$A" $G cache verify "$R/sig/a:v1" --key "$W/good.pub"
expect 1 "verify with the wrong key is refused with the reason" "is not verified" \
	$G cache verify "$R/sig/a:v1" --key "$W/other.pub"
expect 0 "verify with both keys accepts (one trusted key suffices)" "Verified" \
	$G cache verify "$R/sig/a:v1" --key "$W/other.pub" --key "$W/good.pub"
expect 0 "signing twice with the same key adds nothing" "already has a simple-signing signature by key" \
	$G cache sign "$R/sig/a:v1" --key "$W/good.key" --passphrase-file "$W/pass"
skopeo inspect --raw --tls-verify=false "docker://$R/sig/a:sha256-${A#sha256:}.sig" |
	py "import json,sys; n=len(json.load(sys.stdin)['layers']); assert n==1, n"
ok $? "the .sig manifest still holds one signature"
GKM_KEY_PASSPHRASE= $G cache sign "$R/sig/a:v1" --key "$W/other.key" >/dev/null 2>&1
skopeo inspect --raw --tls-verify=false "docker://$R/sig/a:sha256-${A#sha256:}.sig" |
	py "import json,sys; n=len(json.load(sys.stdin)['layers']); assert n==2, n"
ok $? "a second key's signature is appended as a second layer"

# a signature payload made for image a, presented as image b's
$G cache push "$R/sig/a:sha256-${A#sha256:}.sig" "$R/sig/b:sha256-${B#sha256:}.sig" >/dev/null 2>&1
ok $? "copy a's signature manifest to b's .sig tag"
expect 1 "a payload for another digest is refused" "is not verified.*$A" \
	$G cache verify "$R/sig/b:v1" --key "$W/good.pub"

# inspect shows the state
$G cache inspect "$R/sig/a:v1" --key "$W/good.pub" -o json >"$W/insp.json" 2>/dev/null
py "
import json; s=json.load(open('$W/insp.json'))['signatures']
assert s['found']==2 and s['simpleSigning']==2 and s['verified'] is True, s"
ok $? "inspect --key: two signatures found, verified"
$G cache inspect "$R/sig/a:v1" >"$W/insp.txt" 2>&1 && grep -q "Signatures:   2 found (2 simple signing, 0 bundle), not verified (give --key, or keyless trust)" "$W/insp.txt"
ok $? "inspect without --key: found, not verified"

# extraction is gated on verification
expect 0 "extract --key with the right key" "Extracted" $G cache extract "$R/sig/a:v1" "$W/x-a" --key "$W/good.pub"
expect 1 "extract --key refuses an unverified image" "refusing $B" \
	$G cache extract "$R/sig/b:v1" "$W/x-b" --key "$W/good.pub"
[ ! -e "$W/x-b" ]
ok $? "nothing extracted for the refused image"
expect 1 "extract --key refuses an unsigned image" "image is not signed" \
	$G cache extract "$R/sig/c:v1" "$W/x-c" --key "$W/good.pub"

# sigstore bundles: docker-registry has no referrers API -> fallback tag index
expect 0 "sign --bundle on a registry without referrers API" "fallback tag index" \
	$G cache sign "$R/sig/c:v1" --bundle --key "$W/good.key" --passphrase-file "$W/pass"
skopeo inspect --raw --tls-verify=false "docker://$R/sig/c:sha256-${C#sha256:}" >"$W/fb.json" 2>/dev/null &&
	py "
import json; ix=json.load(open('$W/fb.json'))
assert ix['mediaType']=='application/vnd.oci.image.index.v1+json'
assert ix['manifests'][0]['artifactType']=='application/vnd.dev.sigstore.bundle.v0.3+json', ix"
ok $? "the fallback sha256-<hex> tag holds an index naming the bundle referrer"
expect 0 "verify finds the bundle through the fallback tag" '"verified":[[:space:]]*true' \
	$G cache verify "$R/sig/c:v1" --key "$W/good.pub" -o json
py "import json; j=json.load(open('$W/out')); assert j['kind']=='bundle' and j['verified'], j" 2>/dev/null
ok $? "verify -o json says a bundle verified"
expect 1 "a bundle with the wrong key is refused" "is not verified" \
	$G cache verify "$R/sig/c:v1" --key "$W/other.pub"

# the referrers API (served by the proxy in front of the registry)
proxy_start p "$R" || ok 1 "proxy starts"
P=$PROXY_p_ADDR
D=$(img d hip-gfx90a-vector-add)
expect 0 "sign --bundle through a registry with the referrers API" "indexed by the registry's referrers API" \
	$G cache sign "$P/sig/d:v1" --bundle --key "$W/good.key" --passphrase-file "$W/pass"
$G cache inspect "$P/sig/d:v1" --key "$W/good.pub" -o json >"$W/insp.json" 2>/dev/null
py "
import json; s=json.load(open('$W/insp.json'))['signatures']
assert s['bundles']==1 and s['referrersAPI'] is True and s['verified'] is True, s"
ok $? "verify finds the bundle through the referrers API (artifactType filter)"
skopeo inspect --raw --tls-verify=false "docker://$R/sig/d:sha256-${D#sha256:}" >/dev/null 2>&1
[ $? -ne 0 ]
ok $? "no fallback tag is written when the registry indexes referrers"
proxy_fault "$P" '{"referrers": false}'
expect 1 "without the API (and no fallback tag) the image reads as unsigned" "image is not signed" \
	$G cache verify "$P/sig/d:v1" --key "$W/good.pub"
proxy_fault "$P" '{}'

# layouts: the same, with no registry at all
$G cache build "$FX/cuda-sm75-vector-add" -t "oci:$W/lay:v1" >/dev/null 2>&1
expect 0 "sign a layout image (simple)" "Signed" $G cache sign "oci:$W/lay:v1" --key "$W/other.key"
expect 0 "sign a layout image (bundle, fallback index)" "fallback tag index" \
	$G cache sign "oci:$W/lay:v1" --bundle --key "$W/good.key" --passphrase-file "$W/pass"
expect 0 "verify a layout image" "Verified" $G cache verify "oci:$W/lay:v1" --key "$W/good.pub"
$G cache inspect "oci:$W/lay:v1" -o json | py "
import json,sys; s=json.load(sys.stdin)['signatures']; assert s['simpleSigning']==1 and s['bundles']==1, s"
ok $? "layout: one simple signature and one bundle found"

finish
