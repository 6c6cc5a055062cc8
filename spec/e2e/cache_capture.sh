#!/usr/bin/env bash
# gkm cache capture, merge and promote against a real registry (Debian's
# docker-registry): a fake compiler script writes kernels into the cache
# directory the capture gives it (a real overlay mount of a base image as
# root, or a copy), every bad input a command can leave behind is refused
# with its reason and nothing reaches the registry, and the merged CUDA +
# ROCm image gets the right compat verdicts on a T4, an MI210 and a mixed
# node (gkm up with a GPU inventory file).
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/../lib/registry.sh"
. "$(dirname "$0")/../lib/poll.sh"
. "$(dirname "$0")/../lib/upstate.sh"
cd "$GKM_ROOT"
G=$GKM_BIN
FX=spec/fixtures/caches/triton
INV=spec/fixtures/gpu/inventory
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-capture-e2e.XXXXXX")
WRITER=""
trap '[ -n "$WRITER" ] && kill "$WRITER" 2>/dev/null; up_stop; registry_stop_all; rm -rf "$W"' EXIT
py() { /usr/bin/python3 -c "$@"; }

if ! registry_available; then
	skip "cache capture against a registry" "docker-registry missing"
	finish
	exit
fi
registry_start cap || { ok 1 "registry starts"; finish; exit; }
R=$REG_cap_ADDR
export TMPDIR=$W # the capture's workspaces, checked below to be gone

# The fake compiler: one Triton kernel (metadata, binary, group file) for
# the target its arguments name, in the directory the capture gives it.
cat >"$W/fakecc.sh" <<'SH'
#!/bin/sh
# fakecc.sh BACKEND ARCH WARP NAME [HASHDIR]
set -e
d="$TRITON_CACHE_DIR/${5:-$(printf '%s' "$1$2$4" | sha256sum | cut -c1-52 | tr a-z A-Z)}"
mkdir -p "$d"
case "$2" in [0-9]*) arch=$2 ;; *) arch="\"$2\"" ;; esac
printf '{"hash":"%s","target":{"backend":"%s","arch":%s,"warp_size":%s},"name":"%s","num_warps":4}' \
	"$4$2" "$1" "$arch" "$3" "$4" >"$d/$4.json"
head -c 20000 /dev/urandom >"$d/$4.bin"
printf '{"child_paths":{"%s.json":"%s.json"}}' "$4" "$4" >"$d/__grp__$4.json"
SH
chmod +x "$W/fakecc.sh"
CC=$W/fakecc.sh

label() { # ref label
	py "
import json, subprocess
j = json.loads(subprocess.check_output(['$G', 'cache', 'inspect', '$1', '-o', 'json', '--no-signatures']))
print(j['labels'].get('$2', ''))"
}
layers() { $G cache inspect "$1" -o json --no-signatures | py "import json,sys; print(' '.join(l['digest'] for l in json.load(sys.stdin)['layers']))"; }
# the files of a layer (registry storage), cache paths only, sorted
layer_files() { tar tzf "$(registry_blob_file cap "$1")" | grep -v '/$' | grep '^io.triton.cache/' | sort; }
no_tag() { # repo tag: the registry has no manifest under the tag
	[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$R/v2/$1/manifests/$2")" = 404 ]
}
blob_count() { find "$REG_cap_DIR/docker/registry/v2/blobs" -name data 2>/dev/null | wc -l; }
no_workspace() { ! ls -d "$W"/gkm-capture-* >/dev/null 2>&1 && ! grep -q "$W/gkm-capture" /proc/mounts; }
show() { # status name file
	ok "$1" "$2"
	[ "$1" -eq 0 ] || sed 's/^/#   /' "$3" | head -20
}

$G cache keygen --output-key-prefix "$W/ci" >/dev/null 2>&1
ok $? "a signing key pair for CI"
$G cache build "$FX/cuda-sm75-vector-add" -t "$R/caches/vector-add:base" >/dev/null 2>&1
ok $? "the base image (the real CUDA Triton cache) is in the registry"

# ---- a capture from nothing ----------------------------------------------
$G cache capture -t "$R/caches/fresh:c1" --gpu-file $INV/t4.json -o json -- "$CC" cuda 75 32 mul_kernel >"$W/fresh.json" 2>"$W/err"
show $? "capture runs the command and pushes what it compiled" "$W/err"
[ "$(label "$R/caches/fresh:c1" cache.triton.image/summary)" = '{"targets":[{"backend":"cuda","arch":75,"warp_size":32}]}' ] &&
	[ "$(label "$R/caches/fresh:c1" cache.triton.image/entry-count)" = 1 ] &&
	[ "$(layers "$R/caches/fresh:c1" | wc -w)" = 1 ]
ok $? "fresh capture: one layer, summary and entry count from the kernel it compiled"
$G cache extract "$R/caches/fresh:c1" "$W/x-fresh" >/dev/null 2>&1 &&
	[ -f "$W/x-fresh/io.triton.cache/$(ls "$W/x-fresh/io.triton.cache")/mul_kernel.bin" ]
ok $? "fresh capture extracts to the kernel the command wrote"
no_workspace
ok $? "the workspace is gone after the capture"

# vLLM: VLLM_CACHE_ROOT names the directory; its Triton kernels label the image
$G cache build spec/fixtures/caches/vllm/torch-compile-hip-gfx90a -t "$R/caches/vllm:v1" >/dev/null 2>&1
$G cache capture --base "$R/caches/vllm:v1" -t "$R/caches/vllm:c1" --gpu-file $INV/mi210.json -- sh -c '
	d=$VLLM_CACHE_ROOT/torch_compile_cache/0123456789/rank_0_0/triton_cache/NEWHIPKERNEL
	mkdir -p $d && printf "{\"hash\":\"n\",\"name\":\"k\",\"target\":{\"backend\":\"hip\",\"arch\":\"gfx90a\",\"warp_size\":64}}" >$d/k.json &&
	head -c 4096 /dev/urandom >$d/k.hsaco' >"$W/out" 2>&1 &&
	[ "$(label "$R/caches/vllm:c1" cache.vllm.image/summary)" = '{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64}]}' ] &&
	[ "$(label "$R/caches/vllm:c1" cache.vllm.image/entry-count)" = 2 ]
show $? "vLLM capture on the vLLM fixture: VLLM_CACHE_ROOT, labels of both torch.compile hashes" "$W/out"

# ---- on a base: overlay (root) and copy --------------------------------------
BASE_LAYER=$(layers "$R/caches/vector-add:base")
$G cache capture --base "$R/caches/vector-add:base" -t "$R/caches/vector-add:c-overlay" \
	--gpu-file $INV/t4.json -o json -- "$CC" cuda 75 32 mul_kernel >"$W/ov.json" 2>"$W/err"
show $? "capture on a base image (overlay mount)" "$W/err"
set -- $(layers "$R/caches/vector-add:c-overlay")
[ $# = 2 ] && [ "$1" = "$BASE_LAYER" ]
ok $? "the candidate is the base's layer, reused by digest, plus one new layer"
NEW_LAYER=$2
[ "$(layer_files "$NEW_LAYER" | sed 's|^io.triton.cache/[^/]*/||' | tr '\n' ' ')" = "__grp__mul_kernel.json mul_kernel.bin mul_kernel.json " ]
ok $? "the new layer holds only the files the command added" || layer_files "$NEW_LAYER" | sed 's/^/#   /'
[ "$(label "$R/caches/vector-add:c-overlay" cache.triton.image/entry-count)" = 2 ] &&
	py "import json; j=json.load(open('$W/ov.json')); assert j['addedFiles']==3 and j['entryCount']==2 and j['layers']==2, j"
ok $? "labels describe the whole cache (2 kernels); the result says 3 files were added"
$G cache extract "$R/caches/vector-add:c-overlay" "$W/x-ov" >/dev/null 2>&1 &&
	[ -f "$W/x-ov/io.triton.cache/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin" ] &&
	py "import json; j=json.load(open('$W/x-ov/io.triton.manifest/manifest.json')); assert sorted(k['name'] for k in j['triton'])==['add_kernel','mul_kernel'], j"
ok $? "extracted candidate: base and new kernels, manifest.json lists both"

$G cache capture --copy --base "$R/caches/vector-add:base" -t "$R/caches/vector-add:c-copy" \
	--gpu-file $INV/t4.json -- "$CC" cuda 75 32 mul_kernel >"$W/out" 2>&1
show $? "capture on a base with --copy (what runs without root)" "$W/out"
set -- $(layers "$R/caches/vector-add:c-copy")
[ $# = 2 ] && [ "$1" = "$BASE_LAYER" ] && [ "$(layer_files "$2")" = "$(layer_files "$NEW_LAYER")" ]
ok $? "the copy gives the same new layer content as the overlay"
$G cache capture --squash --base "$R/caches/vector-add:base" -t "$R/caches/vector-add:c-squash" \
	--gpu-file $INV/t4.json -- "$CC" cuda 75 32 mul_kernel >"$W/out" 2>&1 &&
	[ "$(layers "$R/caches/vector-add:c-squash" | wc -w)" = 1 ] &&
	[ "$(label "$R/caches/vector-add:c-squash" cache.triton.image/entry-count)" = 2 ]
show $? "--squash: one layer holding base and new kernels" "$W/out"
no_workspace
ok $? "no workspace or mount left behind"

# ---- signing and promotion ------------------------------------------------
$G cache verify "$R/caches/vector-add:c-overlay" --key "$W/ci.pub" >"$W/out" 2>&1
[ $? -eq 1 ] && grep -q "not signed" "$W/out"
ok $? "a candidate is not signed: nothing would mount it"
$G cache promote "$R/caches/vector-add:c-overlay" --key "$W/ci.key" -t "$R/caches/vector-add:v2" \
	--cache default/vector-add >"$W/prom" 2>&1
show $? "promote signs the candidate with the CI key" "$W/prom"
DG=$(py "import json; print(json.load(open('$W/ov.json'))['digest'])")
grep -qx "spec.image: $R/caches/vector-add@$DG" "$W/prom" &&
	grep -qF "kubectl patch gkmcache vector-add -n default --type merge -p '{\"spec\":{\"image\":\"$R/caches/vector-add@$DG\"}}'" "$W/prom"
show $? "promote prints the spec.image to set and the kubectl patch" "$W/prom"
$G cache verify "$R/caches/vector-add:v2" --key "$W/ci.pub" >/dev/null 2>&1
ok $? "the promoted image verifies with the CI key"
$G cache capture --base "$R/caches/vector-add:base" -t "$R/caches/vector-add:c-signed" --key "$W/ci.key" \
	--gpu-file $INV/t4.json -- "$CC" cuda 75 32 other_kernel >"$W/out" 2>&1 &&
	$G cache verify "$R/caches/vector-add:c-signed" --key "$W/ci.pub" >/dev/null 2>&1
show $? "capture --key signs what it pushed" "$W/out"

# ---- refusals: nothing pushed, nothing left ----------------------------------
refused() { # name pattern repo-tag command...
	local name=$1 pat=$2 tag=$3 before
	shift 3
	before=$(blob_count)
	$G cache capture --base "$R/caches/vector-add:base" -t "$R/caches/bad:$tag" --gpu-file $INV/t4.json \
		-- sh -c "$1" >"$W/neg.out" 2>&1
	local rc=$?
	if [ $rc -eq 1 ] && grep -qE "$pat" "$W/neg.out" && no_tag caches/bad "$tag" &&
		[ "$(blob_count)" = "$before" ] && no_workspace; then
		ok 0 "$name"
	else
		ok 1 "$name"
		echo "# exit $rc, blobs $before -> $(blob_count), output:"
		sed 's/^/#   /' "$W/neg.out" | head -20
	fi
}
K='d=$TRITON_CACHE_DIR/NEWK; mkdir -p $d; '
refused "a symlink escaping the cache is refused, nothing pushed" \
	"NEWK/passwd: a symlink \(to '/etc/passwd'\)" s1 \
	"$K ln -s /etc/passwd \$d/passwd"
refused "a symlink inside the cache is refused too (only regular files)" "a symlink \(to 'k.bin'\)" s2 \
	"$K echo x >\$d/k.bin; ln -s k.bin \$d/alias"
refused "a 10 GB sparse file hits the byte cap, nothing pushed" "over its byte cap of 8589934592" big \
	"$K truncate -s 10G \$d/huge.bin"
refused "a device node is refused" "NEWK/null: a character device" dev "$K mknod \$d/null c 1 3"
refused "a FIFO is refused" "NEWK/fifo: a FIFO" fifo "$K mkfifo \$d/fifo"
refused "a set-user-ID file is refused" "set-user-ID" suid "$K echo x >\$d/k.bin; chmod 4755 \$d/k.bin"
refused "a hard link is refused" "2 names \(hard links\)" hl "$K echo x >\$d/k.bin; ln \$d/k.bin \$d/k2.bin"
refused "a file deleted from the base is refused (a capture only adds)" "deleted from the base cache" del \
	'rm $TRITON_CACHE_DIR/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.ttir'
refused "a command that fails captures nothing" "exited with status 3; nothing captured" fails "exit 3"
refused "a command that adds nothing captures nothing" "added no files" none "true"
refused "kernels for another GPU are refused" "run on none of the GPUs.*BackendMismatch" wronggpu \
	"TRITON_CACHE_DIR=\$TRITON_CACHE_DIR $CC hip gfx90a 64 k"

# a writer still writing when the command returns (the command returns once it has started)
before=$(blob_count)
$G cache capture --base "$R/caches/vector-add:base" -t "$R/caches/bad:busy" --gpu-file $INV/t4.json -- sh -c \
	"$K"' (while :; do echo x >>$d/k.bin; done) </dev/null >/dev/null 2>&1 & echo $! >'"$W/writer.pid"'
	until [ -s $d/k.bin ]; do sleep 0.01; done' >"$W/neg.out" 2>&1
rc=$?
WRITER=$(cat "$W/writer.pid" 2>/dev/null)
[ $rc -eq 1 ] && grep -qE "changed while it was captured|something is still writing" "$W/neg.out" &&
	no_tag caches/bad busy && [ "$(blob_count)" = "$before" ]
show $? "a file still being written is detected: refused, nothing pushed" "$W/neg.out"
kill "$WRITER" 2>/dev/null
WRITER=""
wait_for 10 no_workspace
ok $? "the busy capture's workspace is removed"

# a million tiny files: the cap stops the walk while it reads the directory
mkdir -p "$W/million"
py "
import os
d = '$W/million/MANY'
os.mkdir(d)
for i in range(1000000):
    os.close(os.open('%s/%07d' % (d, i), os.O_CREAT | os.O_WRONLY, 0o644))"
before=$(blob_count)
$G cache capture -t "$R/caches/bad:million" --gpu-file $INV/t4.json -o json -- sh -c \
	"mv $W/million/MANY \$TRITON_CACHE_DIR/" >"$W/neg.out" 2>&1
[ $? -eq 1 ] && grep -q "more than 200000 files and directories: over the capture's file cap" "$W/neg.out" &&
	no_tag caches/bad million && [ "$(blob_count)" = "$before" ]
show $? "1,000,000 tiny files hit the file cap, nothing pushed" "$W/neg.out"
$G cache capture -t "$R/caches/bad:cap" --max-files 3 --gpu-file $INV/t4.json -- "$CC" cuda 75 32 k >"$W/neg.out" 2>&1
[ $? -eq 1 ] && grep -q "more than 3 files" "$W/neg.out"
show $? "--max-files lowers the cap" "$W/neg.out"
wait_for 60 no_workspace
ok $? "no workspace left after the refusals"

# ---- --from: what a pod wrote, swapped while the capture runs ---------------
# A pod owns its upper layer: while the capture waits on the base registry
# (a tenant can stall its own registry), it swaps the cache directory for a
# link to a directory of secrets, or a kernel file for a link to /dev/zero.
# The capture holds the directory it opened and never follows the name again.
proxy_start stall "$R" || ok 1 "a stalling proxy starts"
P=$PROXY_stall_ADDR
U=$W/pod/upper
mkdir -p "$U" "$W/secret"
TRITON_CACHE_DIR=$U/io.triton.cache "$CC" cuda 75 32 pod_kernel
PODK=$(ls "$U/io.triton.cache")
echo "SECRET-TOKEN" >"$W/secret/token"
held() { curl -s "http://$P/_stats" | py "import json,sys; sys.exit(0 if json.load(sys.stdin)['held'] > 0 else 1)"; }
stalled_capture() { # tag swap-command: capture --from U while the base pull is held
	proxy_fault "$P" '{"hold": true, "match": "^(GET|HEAD) /v2/caches/vector-add/"}'
	$G cache capture --base "$P/caches/vector-add:base" -t "$R/caches/steal:$1" --gpu-file $INV/t4.json \
		-o json --from "$U/io.triton.cache" >"$W/swap.out" 2>"$W/swap.err" &
	local pid=$!
	wait_for 20 held || echo "# the base pull was never held"
	sh -c "$2"
	proxy_fault "$P" '{}'
	wait $pid
}
swapped() { # name pattern tag swap-command undo-command
	local before rc
	before=$(blob_count)
	stalled_capture "$3" "$4"
	rc=$?
	sh -c "$5"
	if [ $rc -eq 1 ] && grep -qE "$2" "$W/swap.err" && ! grep -q /proc/self/fd "$W/swap.err" &&
		no_tag caches/steal "$3" && [ "$(blob_count)" = "$before" ] && no_workspace; then
		ok 0 "$1"
	else
		ok 1 "$1"
		echo "# exit $rc, blobs $before -> $(blob_count), output:"
		sed 's/^/#   /' "$W/swap.err" | head -20
	fi
}
stalled_capture ok "true"
show $? "--from through a stalled base registry, nothing swapped: captured" "$W/swap.err"
py "
import hashlib, json
j = json.load(open('$W/swap.json' if False else '$W/swap.out'))
got = {p['path']: p['digest'] for p in j['addedPaths']}
want = {}
for n in ('pod_kernel.json', 'pod_kernel.bin', '__grp__pod_kernel.json'):
    want['io.triton.cache/$PODK/' + n] = 'sha256:' + hashlib.sha256(open('$U/io.triton.cache/$PODK/' + n, 'rb').read()).hexdigest()
assert got == want, (got, want)"
ok $? "the result lists the added files with the digests of the bytes the layer read"
swapped "the cache directory swapped for a link during the stalled pull: refused naming it, nothing pushed" \
	"$U/io.triton.cache: a symlink \(to '$W/secret'\) replaced it while it was captured" dir \
	"mv '$U/io.triton.cache' '$U/moved' && ln -s '$W/secret' '$U/io.triton.cache'" \
	"rm '$U/io.triton.cache' && mv '$U/moved' '$U/io.triton.cache'"
swapped "a kernel file swapped for a link to /dev/zero: refused naming it, nothing read through it" \
	"$U/io.triton.cache/$PODK/pod_kernel.bin: a symlink \(to '/dev/zero'\)" file \
	"mv '$U/io.triton.cache/$PODK/pod_kernel.bin' '$W/k.bin' && ln -s /dev/zero '$U/io.triton.cache/$PODK/pod_kernel.bin'" \
	"rm '$U/io.triton.cache/$PODK/pod_kernel.bin' && mv '$W/k.bin' '$U/io.triton.cache/$PODK/pod_kernel.bin'"
mv "$U/io.triton.cache" "$U/kept" && ln -s "$W/secret" "$U/io.triton.cache"
before=$(blob_count)
$G cache capture --base "$R/caches/vector-add:base" -t "$R/caches/steal:link" --gpu-file $INV/t4.json \
	--from "$U/io.triton.cache" >"$W/swap.out" 2>"$W/swap.err"
[ $? -eq 1 ] && grep -q "$U/io.triton.cache: a symlink (to '$W/secret')" "$W/swap.err" &&
	no_tag caches/steal link && [ "$(blob_count)" = "$before" ]
show $? "--from naming a link is refused before anything is read" "$W/swap.err"
rm "$U/io.triton.cache" && mv "$U/kept" "$U/io.triton.cache"

# ---- merge: one image for a mixed cluster ----------------------------------
$G cache build "$FX/hip-gfx90a-vector-add" -t "$R/caches/rocm:v1" >/dev/null 2>&1 &&
	$G cache merge "$R/caches/vector-add:base" "$R/caches/rocm:v1" -t "$R/caches/mixed:v1" -o json >"$W/merge.json" 2>"$W/err"
show $? "merge the real CUDA and ROCm caches" "$W/err"
py "
import json
got = json.loads('''$(label "$R/caches/mixed:v1" cache.triton.image/summary)''')
assert got == {'targets': [{'backend': 'cuda', 'arch': 75, 'warp_size': 32}, {'backend': 'hip', 'arch': 'gfx90a', 'warp_size': 64}]}, got"
ok $? "the merged summary label lists both targets"
$G cache extract "$R/caches/mixed:v1" "$W/x-mixed" >/dev/null 2>&1 &&
	diff -r "$FX/cuda-sm75-vector-add" "$W/x-mixed/io.triton.cache" 2>&1 | grep -q "Only in $W/x-mixed/io.triton.cache: MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A" &&
	cmp -s "$FX/hip-gfx90a-vector-add/MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A/add_kernel.hsaco" \
		"$W/x-mixed/io.triton.cache/MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A/add_kernel.hsaco"
ok $? "the merged tree holds both caches' kernels byte for byte"
cp -r "$FX/cuda-sm75-vector-add" "$W/other" && chmod -R u+w "$W/other" &&
	echo changed >>"$W/other/5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin" &&
	$G cache build "$W/other" -t "$R/caches/other:v1" >/dev/null 2>&1
$G cache merge "$R/caches/vector-add:base" "$R/caches/other:v1" -t "$R/caches/mixed:bad" >"$W/neg.out" 2>&1
[ $? -eq 1 ] && grep -q "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin has other contents in $R/caches/other:v1" "$W/neg.out" &&
	no_tag caches/mixed bad
show $? "a path with two contents is an error naming the path; nothing pushed" "$W/neg.out"
$G cache merge "$R/caches/vector-add:base" "$R/caches/vllm:v1" -t "$R/caches/mixed:fmt" >"$W/neg.out" 2>&1
[ $? -eq 1 ] && grep -q "is a vllm cache, the images before it triton caches" "$W/neg.out"
show $? "caches of two formats do not merge" "$W/neg.out"

$G cache sign "$R/caches/vector-add:base" --key "$W/ci.key" >/dev/null 2>&1
$G cache merge --key "$W/ci.pub" "$R/caches/vector-add:base" "$R/caches/rocm:v1" -t "$R/caches/mixed:unsigned" >"$W/neg.out" 2>&1
[ $? -eq 1 ] && grep -q "refusing .*: image is not signed" "$W/neg.out" && no_tag caches/mixed unsigned
show $? "merge --key: an input without a trusted signature is refused" "$W/neg.out"

# the merged image's verdicts where nodes use them: gkm up with a GPU file
$G cache sign "$R/caches/mixed:v1" --key "$W/ci.key" >/dev/null 2>&1
mkdir -p "$W/policies" && cp policies/*.lua "$W/policies/"
cat >"$W/cache.yaml" <<YAML
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
  name: mixed
  namespace: default
spec:
  image: $R/caches/mixed:v1
YAML
verdicts() { # inventory -> "[compatible ids] [incompatible ids]" once the cache is ready
	$G apply --state "$W/state-$1" -f "$W/cache.yaml" >/dev/null 2>&1
	up_start "$W/state-$1" --gpu-file "$INV/$1.json" --key "$W/ci.pub" --policy-dir "$W/policies" \
		--health-listen "127.0.0.1:$(free_port)"
	wait_for 60 is Ready/ node_entry default mixed "e['state'] + '/'"
	node_entry default mixed "*(sorted(i for s in e.get(k, []) for i in s['ids']) for k in ('compatibleGPUs', 'incompatibleGPUs'))"
	up_stop
}
[ "$(verdicts t4)" = "[0] []" ]
ok $? "merged image on a T4 node: the T4 runs it"
[ "$(verdicts mi210)" = "[0, 1] []" ]
ok $? "merged image on an MI210 node: both MI210s run it"
[ "$(verdicts mixed)" = "[0, 1, 2] []" ]
ok $? "merged image on the mixed node: the T4 and both MI210s run it"

finish
