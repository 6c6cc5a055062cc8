#!/usr/bin/env bash
# gkm cache against a real registry (Debian's docker-registry on loopback),
# with skopeo and umoci as independent producer and consumer, and a fault
# injecting proxy in front of the registry for the failure cases.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
GS=${GKM_BIN_SAN:-$GKM_BIN} # bad input goes to the sanitizer build
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
FX=spec/fixtures/caches
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-cache-e2e.XXXXXX")
trap 'registry_stop_all; rm -rf "$W"' EXIT

if ! registry_available || ! command -v skopeo >/dev/null || ! command -v umoci >/dev/null; then
	skip "cache images against a registry" "docker-registry, skopeo or umoci missing"
	finish
	exit
fi
registry_start plain || { ok 1 "registry starts"; finish; exit; }
R=$REG_plain_ADDR
SK="--tls-verify=false"

py() { /usr/bin/python3 -c "$@"; }
# label L of image REF as skopeo sees it
sk_label() { skopeo inspect $SK "docker://$1" | py "import json,sys; print(json.load(sys.stdin)['Labels']['$2'])"; }
# the targets of every kernel JSON under a Triton cache dir, as the summary must list them
want_summary() {
	py "
import json, os, sys
ts = []
for d, _, fs in sorted(os.walk('$1')):
    for f in sorted(fs):
        if f.endswith('.json') and not f.startswith('__grp__'):
            j = json.load(open(os.path.join(d, f)))
            if 'hash' in j and 'target' in j:
                t = {k: j['target'][k] for k in ('backend', 'arch', 'warp_size')}
                if isinstance(j.get('ptx_version'), int): t['ptx_version'] = j['ptx_version']
                if t not in ts: ts.append(t)
print(json.dumps({'targets': ts}, sort_keys=True))"
}
same_json() { py "import json,sys; sys.exit(0 if json.loads(sys.argv[1]) == json.loads(sys.argv[2]) else 1)" "$1" "$2"; }
dir_bytes() { find "$1" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}'; }

# ---- build from the real caches; labels as MCV writes them ----------------
for f in cuda-sm75-vector-add hip-gfx90a-vector-add; do
	$G cache build "$FX/triton/$f" -t "$R/caches/$f:v1" >"$W/build.out" 2>&1
	ok $? "build $f and push it to the registry"
	got=$(sk_label "$R/caches/$f:v1" cache.triton.image/summary)
	want=$(want_summary "$FX/triton/$f")
	same_json "$got" "$want"
	ok $? "$f: summary label matches each kernel's target (skopeo reads $got)"
	[ "$(sk_label "$R/caches/$f:v1" cache.triton.image/entry-count)" = 1 ]
	ok $? "$f: entry-count label is 1"
	[ "$(sk_label "$R/caches/$f:v1" cache.triton.image/cache-size-bytes)" = "$(dir_bytes "$FX/triton/$f")" ]
	ok $? "$f: cache-size-bytes label is the packaged bytes"
done
grep -q "1 of 1 hold absolute paths (built at /opt/app-root/src/.triton/cache)" "$W/build.out" ||
	grep -q "hold absolute paths" "$W/build.out"
ok $? "build reports group files with absolute paths"

for v in torch-compile-hip-gfx90a binary-llama; do
	$G cache build "$FX/vllm/$v" -t "$R/caches/vllm-$v:v1" -o json >"$W/$v.json" 2>&1
	ok $? "build vLLM cache $v"
done
got=$(sk_label "$R/caches/vllm-torch-compile-hip-gfx90a:v1" cache.vllm.image/summary)
same_json "$got" '{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64}]}'
ok $? "vLLM torch.compile summary from its Triton kernels: $got"
got=$(sk_label "$R/caches/vllm-binary-llama:v1" cache.vllm.image/summary)
same_json "$got" '{"targets":[{"backend":"cuda","warp_size":32,"cuda_version":"12.9"}]}'
ok $? "vLLM binary summary from cache_key_factors.json: $got"
[ "$(sk_label "$R/caches/vllm-binary-llama:v1" cache.vllm.image/format)" = binary ]
ok $? "vLLM binary cache labelled format=binary"
# identity: the runtime versions the cache's own files name
same_json "$(sk_label "$R/caches/hip-gfx90a-vector-add:v1" cache.triton.image/identity)" '{"triton":["3.2.0"]}'
ok $? "identity label: the Triton version in the kernels' metadata"
same_json "$(sk_label "$R/caches/vllm-binary-llama:v1" cache.vllm.image/identity)" \
	"{\"vllmCodeHash\":[\"$(py "import json;print(json.load(open('$FX/vllm/binary-llama/torch_compile_cache/edf531ca35/rank_0_0/backbone/cache_key_factors.json'))['code_hash'])")\"],\"vllmCompilerHash\":[\"4fc2f2ae9e\"]}"
ok $? "identity label: vLLM's code and compiler hashes from cache_key_factors.json"
skopeo inspect $SK "docker://$R/caches/cuda-sm75-vector-add:v1" |
	py "import json,sys; l=json.load(sys.stdin)['Labels']; sys.exit(0 if 'cache.triton.image/summary' in l and 'cache.triton.image/identity' not in l else 1)"
ok $? "no identity label where the files name no version"
$G cache inspect "$R/caches/hip-gfx90a-vector-add:v1" | grep -q "^Identity:     triton 3.2.0$"
ok $? "inspect shows the identity"

# ---- skopeo + umoci consume what gkm pushed ---------------------------------
skopeo copy -q $SK "docker://$R/caches/cuda-sm75-vector-add:v1" "oci:$W/sk:v1" >/dev/null 2>&1 &&
	umoci raw unpack --rootless --image "$W/sk:v1" "$W/um" >/dev/null 2>&1
ok $? "skopeo copy + umoci raw unpack read the image gkm pushed"
diff -r "$FX/triton/cuda-sm75-vector-add" "$W/um/io.triton.cache" >/dev/null
ok $? "umoci unpacks io.triton.cache/ identical to the cache directory"
py "import json; j=json.load(open('$W/um/io.triton.manifest/manifest.json')); assert j['triton'][0]['name']=='add_kernel' and j['triton'][0]['arch']==75"
ok $? "io.triton.manifest/manifest.json lists the kernel"

# ---- gkm extracts what skopeo pushed from an image umoci built -------------
umoci init --layout "$W/ul" >/dev/null 2>&1 && umoci new --image "$W/ul:v1" >/dev/null 2>&1 &&
	umoci unpack --rootless --image "$W/ul:v1" "$W/bundle" >/dev/null 2>&1 &&
	mkdir -p "$W/bundle/rootfs/io.triton.cache" &&
	cp -r "$FX/triton/hip-gfx90a-vector-add/." "$W/bundle/rootfs/io.triton.cache/" &&
	umoci repack --image "$W/ul:v1" "$W/bundle" >/dev/null 2>&1 &&
	umoci config --image "$W/ul:v1" --config.label 'cache.triton.image/entry-count=1' >/dev/null 2>&1 &&
	skopeo copy -q $SK "oci:$W/ul:v1" "docker://$R/umoci/hip:v1" >/dev/null 2>&1
ok $? "umoci builds an image and skopeo pushes it"
$G cache extract "$R/umoci/hip:v1" "$W/x-umoci" >"$W/out" 2>&1 &&
	diff -r "$FX/triton/hip-gfx90a-vector-add" "$W/x-umoci/io.triton.cache" >/dev/null
ok $? "gkm extracts the skopeo-pushed umoci image"
# umoci 0.4.7 insert writes layers without the tar end-of-archive blocks
umoci insert --rootless --image "$W/ul:v1" "$FX/triton/cuda-sm75-vector-add" /io.triton.cache >/dev/null 2>&1 &&
	skopeo copy -q $SK "oci:$W/ul:v1" "docker://$R/umoci/two:v1" >/dev/null 2>&1
ok $? "umoci insert adds a second layer, skopeo pushes it"
$G cache extract "$R/umoci/two:v1" "$W/x-two" >"$W/out" 2>&1 &&
	[ -f "$W/x-two/io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin" ] &&
	[ -f "$W/x-two/io.triton.cache/MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A/add_kernel.hsaco" ]
ok $? "gkm extracts both layers, the one without end-of-archive blocks included"

# ---- extract, inspect, layouts, push, group paths, reproducibility ----------
$G cache extract "$R/caches/cuda-sm75-vector-add:v1" "$W/x1" >"$W/out" 2>&1 &&
	diff -r "$FX/triton/cuda-sm75-vector-add" "$W/x1/io.triton.cache" >/dev/null
ok $? "extract by tag gives the cache directory back"
$G cache inspect "$R/caches/cuda-sm75-vector-add:v1" -o json >"$W/insp.json" 2>"$W/err"
ok $? "inspect -o json"
py "
import json; j=json.load(open('$W/insp.json'))
assert j['format']=='triton' and j['entryCount']==1
assert j['targets']==[{'backend':'cuda','arch':75,'warp_size':32}]
assert j['scan']['groupFiles']=={'total':1,'absolute':1,'buildRoot':'/opt/app-root/src/.triton/cache'}
assert j['scan']['kernels'][0]['name']=='add_kernel'
assert j['signatures']['found']==0 and j['signatures']['state']=='unsigned'
assert j['layers'][0]['mediaType']=='application/vnd.oci.image.layer.v1.tar+gzip'
assert j['runtimeEnv']==[{'name':'TRITON_CACHE_DIR','subPath':'io.triton.cache'}], j['runtimeEnv']"
ok $? "inspect JSON: targets, entries, absolute group paths, kernels, unsigned, the runtime's variable"
dg=$(py "import json; print(json.load(open('$W/insp.json'))['digest'])")
$G cache inspect "$R/caches/cuda-sm75-vector-add@$dg" >"$W/insp.txt" 2>&1 &&
	grep -q "hold absolute paths" "$W/insp.txt" && grep -q "cuda     75" "$W/insp.txt" &&
	grep -q "Signatures:   unsigned" "$W/insp.txt" &&
	grep -q "^Runtime env:  TRITON_CACHE_DIR=<mountPath>/io.triton.cache$" "$W/insp.txt"
ok $? "inspect by digest (table): targets, group paths, signatures, the runtime's variable"
$G cache build "$FX/triton/cuda-sm75-vector-add" --rewrite-group-paths -t "oci:$W/lay:rel" >/dev/null 2>&1 &&
	$G cache extract "oci:$W/lay:rel" "$W/x-rel" >/dev/null 2>&1 &&
	py "
import json,glob; g=json.load(open(glob.glob('$W/x-rel/io.triton.cache/*/__grp__add_kernel.json')[0]))
assert all('/' not in v for v in g['child_paths'].values()), g"
ok $? "--rewrite-group-paths writes bare file names into group files"
$G cache inspect "oci:$W/lay:rel" -o json | py "import json,sys; j=json.load(sys.stdin); assert j['scan']['groupFiles']['absolute']==0"
ok $? "inspect of the rewritten image finds no absolute group paths"
$G cache push "oci:$W/lay:rel" "$R/caches/rel:v1" >/dev/null 2>&1 &&
	skopeo inspect $SK "docker://$R/caches/rel:v1" >/dev/null 2>&1
ok $? "push from a layout to the registry, readable by skopeo"
$G cache push "$R/caches/rel:v1" "oci:$W/back:v1" >/dev/null 2>&1 &&
	umoci raw unpack --rootless --image "$W/back:v1" "$W/um-back" >/dev/null 2>&1
ok $? "push from the registry into a layout umoci can unpack"
d1=$($G cache build "$FX/triton/hip-gfx90a-vector-add" --source-date-epoch 1700000000 -t "oci:$W/r1:v1" -o json | py "import json,sys; print(json.load(sys.stdin)['digest'])")
d2=$($G cache build "$FX/triton/hip-gfx90a-vector-add" --source-date-epoch 1700000000 -t "oci:$W/r2:v1" -o json | py "import json,sys; print(json.load(sys.stdin)['digest'])")
[ -n "$d1" ] && [ "$d1" = "$d2" ]
ok $? "the same cache builds to the same digest ($d1)"

# ---- refusals ----------------------------------------------------------------
show() { # status name file: ok, with the file's text when it failed
	ok "$1" "$2"
	[ "$1" -eq 0 ] || sed 's/^/#   /' "$3" | head -20
}

expect_fail() { # name pattern cmd...
	local name=$1 pat=$2
	shift 2
	"$@" >"$W/neg.out" 2>&1
	local rc=$?
	if [ $rc -ne 0 ] && [ $rc -ne 99 ] && grep -qE "$pat" "$W/neg.out"; then
		ok 0 "$name"
	else
		ok 1 "$name"
		echo "# exit $rc, output:"
		sed 's/^/#   /' "$W/neg.out" | head -20
	fi
}

$GS cache build "$FX/triton/cuda-sm75-vector-add" -t "$R/c/x:v1" --format vllm >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "building a Triton cache as vLLM fails"
expect_fail "nonexistent tag names the image" "not found" $GS cache inspect "$R/caches/nope:v1"
expect_fail "malformed reference is a usage error with the reason" "must be lowercase" $GS cache inspect "$R/Caches/x"

# tampered blob in the registry's storage: same size, one byte changed (a
# clamped mtime gives this image layer bytes no other image here shares)
$G cache build "$FX/triton/hip-gfx90a-vector-add" --source-date-epoch 1000000 -t "$R/neg/tamper:v1" -o json >"$W/t.json" 2>/dev/null
layer=$(py "import json; print(json.load(open('$W/t.json'))['layerDigest'])")
blob=$(registry_blob_file plain "$layer")
py "
p='$blob'; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0xff; open(p,'wb').write(b)"
expect_fail "tampered blob: extract fails naming the digest mismatch" "digest mismatch: expected $layer" \
	$GS cache extract "$R/neg/tamper:v1" "$W/x-tamper"
[ ! -e "$W/x-tamper" ] && ! ls "$W"/x-tamper.partial-* >/dev/null 2>&1
ok $? "tampered blob: nothing left at the destination"

# a tampered manifest in storage: the registry sends other bytes than the digest it names
$G cache build "$FX/triton/cuda-sm75-vector-add" --label test=mlie -t "$R/neg/mlie:v1" -o json >"$W/m.json" 2>/dev/null
mdg=$(py "import json; print(json.load(open('$W/m.json'))['digest'])")
mblob=$(registry_blob_file plain "$mdg")
py "
p='$mblob'; s=open(p).read(); open(p,'w').write(s.replace('\"schemaVersion\":2', '\"schemaVersion\": 2'))"
expect_fail "manifest by digest whose bytes differ is refused" "other bytes than asked for" \
	$GS cache inspect "$R/neg/mlie@$mdg"
expect_fail "manifest by tag whose bytes differ from Docker-Content-Digest is refused" "Docker-Content-Digest $mdg" \
	$GS cache inspect "$R/neg/mlie:v1"

# a proxy in front of the registry for transport faults
proxy_start p "$R" || ok 1 "proxy starts"
P=$PROXY_p_ADDR
proxy_fault "$P" '{"lie_digest": true, "match": "manifests"}'
expect_fail "a Docker-Content-Digest that lies is caught" "Docker-Content-Digest sha256:0000" \
	$GS cache inspect "$P/caches/cuda-sm75-vector-add:v1"
proxy_fault "$P" '{"fail": 2, "status": 500, "match": "GET /v2/.*/blobs/"}'
$GS cache extract --retries 3 "$P/caches/cuda-sm75-vector-add:v1" "$W/x-500" >"$W/out" 2>&1 &&
	diff -r "$FX/triton/cuda-sm75-vector-add" "$W/x-500/io.triton.cache" >/dev/null &&
	grep -q "retrying" "$W/out"
show $? "a registry answering 500 twice, then fine: retried and extracted" "$W/out"
proxy_fault "$P" '{"fail": 5, "status": 503, "match": "GET /v2/.*/manifests/"}'
expect_fail "persistent 503 gives up with the status named" "giving up after 2 attempts.*HTTP 503" \
	$GS cache inspect --retries 1 "$P/caches/cuda-sm75-vector-add:v1"
$G cache build "$FX/triton/hip-gfx90a-vector-add" -t "$R/neg/trunc:v1" -o json >"$W/tr.json" 2>/dev/null
layer=$(py "import json; print(json.load(open('$W/tr.json'))['layerDigest'])")
proxy_fault "$P" "{\"truncate\": 3000, \"times\": 1, \"match\": \"GET /v2/.*/blobs/$layer\"}"
$GS cache extract --retries 2 "$P/neg/trunc:v1" "$W/x-trunc" >"$W/out" 2>&1 &&
	grep -q "resuming" "$W/out"
show $? "a stream cut short once is resumed with a Range request and verified" "$W/out"
proxy_fault "$P" "{\"truncate\": 3000, \"times\": 99, \"match\": \"GET /v2/.*/blobs/$layer\"}"
expect_fail "a stream always cut short fails, naming the cut" "cut short after|truncated" \
	$GS cache extract --retries 1 "$P/neg/trunc:v1" "$W/x-trunc2"
proxy_fault "$P" '{"big_manifest": 5000000, "match": "manifests"}'
expect_fail "an oversized manifest is refused" "larger than the 4194304 bytes" \
	$GS cache inspect "$P/caches/cuda-sm75-vector-add:v1"
proxy_fault "$P" '{"hang": true, "match": "manifests"}'
start=$SECONDS
expect_fail "a registry that hangs times out" "timed out" \
	timeout 60 $GS cache inspect --timeout 2 --retries 0 "$P/caches/cuda-sm75-vector-add:v1"
echo "# hang gave up after $((SECONDS - start)) s"
proxy_fault "$P" '{}'

# uploads: chunked PATCHes when asked, and when the registry refuses a large PUT
$G cache build "$FX/triton/hip-gfx90a-vector-add" --label up=chunked -t "oci:$W/up:v1" >/dev/null 2>&1
$GS cache push --chunk-size 4096 "oci:$W/up:v1" "$P/up/chunked:v1" >"$W/out" 2>&1 &&
	skopeo copy -q $SK "docker://$R/up/chunked:v1" "oci:$W/up-back:v1" >/dev/null 2>&1 &&
	curl -s "http://$P/_stats" | py "
import json,sys; r=json.load(sys.stdin)['requests']
assert sum(1 for m,p in r if m=='PATCH' and '/up/chunked/blobs/uploads/' in p) >= 2, r"
show $? "push --chunk-size uploads in PATCH chunks; skopeo reads the result" "$W/out"
$G cache build "$FX/triton/hip-gfx90a-vector-add" --label up=413 -t "oci:$W/up:v2" >/dev/null 2>&1
proxy_fault "$P" '{"fail": 1, "status": 413, "match": "PUT /v2/up/big/blobs/uploads/.*digest="}'
$GS cache push "oci:$W/up:v2" "$P/up/big:v1" >"$W/out" 2>&1 &&
	grep -q "refused a monolithic upload, sending chunks" "$W/out" &&
	skopeo inspect $SK "docker://$R/up/big:v1" >/dev/null 2>&1
show $? "a monolithic upload refused with 413 is sent again in chunks" "$W/out"
proxy_fault "$P" '{}'

# a layer of a media type gkm cannot extract
$G cache build "$FX/triton/cuda-sm75-vector-add" -t "oci:$W/odd:v1" >/dev/null 2>&1
py "
import json, hashlib, os
d='$W/odd'
ix=json.load(open(d+'/index.json'))
m=ix['manifests'][0]
mf=json.load(open(d+'/blobs/sha256/'+m['digest'][7:]))
mf['layers'][0]['mediaType']='application/vnd.example.cache.layer.v1+custom'
b=json.dumps(mf).encode()
h=hashlib.sha256(b).hexdigest()
open(d+'/blobs/sha256/'+h,'wb').write(b)
m['digest']='sha256:'+h; m['size']=len(b)
json.dump(ix, open(d+'/index.json','w'))"
$G cache push "oci:$W/odd:v1" "$R/neg/odd:v1" >/dev/null 2>&1
expect_fail "a layer of unknown media type is refused by name" "application/vnd.example.cache.layer.v1\+custom.*not a tar layer" \
	$GS cache extract "$R/neg/odd:v1" "$W/x-odd"

finish
