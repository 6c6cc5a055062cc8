#!/usr/bin/env bash
# Pull + verify + extract of a ~1 GiB synthetic Triton-like cache image from
# a local docker-registry: gkm against `skopeo copy` + `umoci raw unpack` of
# the same image, GNU `tar -xzf` and `bsdtar -xzf` of the same layer, and
# each single stage gkm's pipeline is made of, timed alone: the download
# (`curl` of the blob), SHA-256 (`openssl dgst`), inflate (`igzip -dc`, the
# isa-l inflater gkm uses) and writing the tree (`tar -xf` of the plain tar).
# Everything runs alternately (gkm, skopeo+umoci, tar, ..., gkm, ...);
# medians of N runs with min and max, MB/s of the extracted tree, peak RSS
# (/usr/bin/time -v), and the ratios, among them gkm against its slowest
# stage. The same image with a zstd layer: gkm against `zstd -dc`. Then the
# time to make a second cache with the same digest ready in the content
# store (nothing pulled), and gkm's peak RSS on a tiny image for comparison
# (streaming: it must not grow with the layer).
#
#   GKM_BENCH_RUNS=N (default 5)   GKM_BENCH_DIR (default $GKM_BUILD/bench)
#   GKM_BENCH_BASELINE=PATH: another gkm binary (an earlier commit's build),
#     timed on the same image right after gkm in every run, for a before and
#     after on the same machine state
#
# The synthetic cache (20,000 small text files in 4,000 hash dirs + 40
# binaries of 5-30 MB, generated deterministically) and its image are
# kept under GKM_BENCH_DIR so reruns skip the slow part (the image is
# built again when the gkm binary is newer than it). Timed extractions
# get fresh destinations by renaming old ones away; trees are deleted only
# at the end (see BENCHMARKING.md for why). Every timed command starts from
# the same memory state: after a `sync`, so that the writeback of the tree an
# earlier command left dirty (none of the tools fsyncs) does not compete with
# it for the two cores, and, where the bench may write
# /proc/sys/vm/drop_caches (root), with the page cache emptied and then
# refilled with every input the commands read (the registry's storage, the
# layer files) and the files they run from (binaries and their libraries).
# Without that, later runs write into a full page cache where every page
# written first needs one reclaimed, and the spread of each command was
# several times as wide (reclaim work that can run on a spare core, which
# a one-threaded tar leaves and a pipelined extractor does not, is the
# likely reason the drift fell more on gkm).
set -u
cd "$GKM_ROOT"
. spec/lib/registry.sh
G=$GKM_BIN
BASE=${GKM_BENCH_BASELINE:-}
N=${GKM_BENCH_RUNS:-5}
B=${GKM_BENCH_DIR:-$GKM_BUILD/bench}
mkdir -p "$B"
RUN=$(mktemp -d "$B/run.XXXXXX")
trap 'registry_stop_all; rm -rf "$RUN"' EXIT
for t in docker-registry skopeo umoci /usr/bin/time tar bsdtar curl openssl igzip zstd; do
	command -v "$t" >/dev/null || { echo "pull.sh: $t missing, benchmark skipped"; exit 0; }
done

# ---- the synthetic cache and its image (cached) ---------------------------------
GEN_VERSION=1
CACHE=$B/cache-1g
if [ "$(cat "$CACHE/.gen" 2>/dev/null)" != "$GEN_VERSION" ]; then
	echo "generating the synthetic cache in $CACHE (once)"
	rm -rf "$CACHE" "$B/layout"
	/usr/bin/python3 - "$CACHE" <<'PY'
import base64, json, os, random, sys
root = sys.argv[1]
rng = random.Random(20240601)
os.makedirs(root)
def hashdir(i):
    return base64.b32encode(rng.randbytes(32)).decode().rstrip("=")
words = [base64.b32encode(rng.randbytes(5)).decode().lower() for _ in range(4000)]
for d in range(4000):
    h = hashdir(d)
    p = os.path.join(root, h)
    os.mkdir(p)
    name = "kernel_%d" % d
    meta = {"hash": rng.randbytes(32).hex(), "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "num_warps": 4, "num_stages": 3, "ptx_version": None, "name": name}
    with open(os.path.join(p, name + ".json"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(p, "__grp__" + name + ".json"), "w") as f:
        json.dump({"child_paths": {name + x: name + x for x in (".json", ".ttir", ".ptx")}}, f)
    for ext in (".ttir", ".ttgir", ".ptx"):
        n = rng.randint(8000, 40000)
        text = []
        size = 0
        while size < n:
            line = "  %%%d = %s.%s %s, %s : i32\n" % (size, rng.choice(words), rng.choice(words),
                                                    rng.choice(words), rng.choice(words))
            text.append(line)
            size += len(line)
        with open(os.path.join(p, name + ext), "w") as f:
            f.write("".join(text))
# 40 binaries of 5-30 MB: random blocks and zero runs (cubins compress to about 70%)
bins = os.path.join(root, "ZZBINARIES0000000000000000000000000000000000000000000000")
os.mkdir(bins)
for i in range(40):
    size = rng.randint(5_000_000, 30_000_000)
    with open(os.path.join(bins, "fused_%02d.cubin" % i), "wb") as f:
        left = size
        while left > 0:
            k = min(left, 65536)
            f.write(rng.randbytes(k) if rng.random() < 0.7 else bytes(k))
            left -= k
PY
	echo "$GEN_VERSION" >"$CACHE/.gen"
fi
tree_bytes=$(du -sb --exclude=.gen "$CACHE" | cut -f1)
files=$(find "$CACHE" -type f ! -name .gen | wc -l)
# the image is rebuilt when gkm is newer: the layer gkm writes is part of what is measured
if [ ! -f "$B/layout/index.json" ] || [ "$G" -nt "$B/layout/index.json" ]; then
	rm -rf "$B/layout" "$B/layout-zstd" "$B/layer.tar"
	mv "$CACHE/.gen" "$B/.gen.tmp"
	/usr/bin/time -f "%e s" -o "$B/build.time" \
		"$G" cache build "$CACHE" -t "oci:$B/layout:bench" --source-date-epoch 1700000000 >"$B/build.out" || exit 1
	mv "$B/.gen.tmp" "$CACHE/.gen"
fi
layer=$(/usr/bin/python3 -c "
import json; d='$B/layout'
ix=json.load(open(d+'/index.json')); m=json.load(open(d+'/blobs/sha256/'+ix['manifests'][0]['digest'][7:]))
print(m['layers'][0]['digest'][7:], m['layers'][0]['size'])")
layer_hex=${layer% *}
layer_size=${layer#* }
echo "cache: $files files, $((tree_bytes / 1000000)) MB; layer $((layer_size / 1000000)) MB gzip; gkm cache build took $(cat "$B/build.time" 2>/dev/null || echo '?')"
# trees are only deleted at the end: each run leaves six (and skopeo's copy of the layout)
need_kb=$((N * 7 * tree_bytes / 1024 + 2 * 1024 * 1024))
avail_kb=$(df -Pk "$B" | awk 'NR == 2 {print $4}')
if [ "$avail_kb" -lt "$need_kb" ]; then
	echo "pull.sh: $N runs need about $((need_kb / 1048576)) GiB free in $B, there are $((avail_kb / 1048576)); use fewer runs (GKM_BENCH_RUNS) or free some disk"
	exit 1
fi

# the plain tar (for the write stage) and the same image with a zstd layer
LAYER=$B/layout/blobs/sha256/$layer_hex
if [ ! -f "$B/layer.tar" ]; then
	igzip -dc "$LAYER" >"$B/layer.tar.tmp" && mv "$B/layer.tar.tmp" "$B/layer.tar" || exit 1
fi
if [ ! -f "$B/layout-zstd/index.json" ]; then
	rm -rf "$B/layout-zstd"
	cp -r "$B/layout" "$B/layout-zstd"
	zstd -q -3 -T0 -c "$B/layer.tar" >"$B/layer.tar.zst" || exit 1
	/usr/bin/python3 - "$B/layout-zstd" "$B/layer.tar.zst" <<'PY' || exit 1
import hashlib, json, os, shutil, sys
d, zst = sys.argv[1], sys.argv[2]
blobs = os.path.join(d, "blobs", "sha256")
def put(data):
    h = hashlib.sha256(data).hexdigest()
    open(os.path.join(blobs, h), "wb").write(data)
    return h
h = hashlib.sha256()
with open(zst, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
zhex = h.hexdigest()
shutil.move(zst, os.path.join(blobs, zhex))
ix = json.load(open(os.path.join(d, "index.json")))
m = json.load(open(os.path.join(blobs, ix["manifests"][0]["digest"][7:])))
os.unlink(os.path.join(blobs, m["layers"][0]["digest"][7:]))
m["layers"][0].update(mediaType="application/vnd.oci.image.layer.v1.tar+zstd",
                      digest="sha256:" + zhex, size=os.path.getsize(os.path.join(blobs, zhex)))
raw = json.dumps(m).encode()
ix["manifests"][0].update(digest="sha256:" + put(raw), size=len(raw))
json.dump(ix, open(os.path.join(d, "index.json"), "w"))
PY
fi
ZLAYER=$(ls -S "$B/layout-zstd/blobs/sha256/" | head -1)
ZLAYER=$B/layout-zstd/blobs/sha256/$ZLAYER

registry_start bench || exit 1
R=$REG_bench_ADDR
"$G" cache push "oci:$B/layout:bench" "$R/bench/cache:v1" >"$RUN/push.out" || { cat "$RUN/push.out"; exit 1; }
DIGEST=$(sed -n 's/.*@\(sha256:[0-9a-f]*\).*/\1/p' "$RUN/push.out")
"$G" cache push "oci:$B/layout-zstd:bench" "$R/bench/zcache:v1" >"$RUN/push.out" || { cat "$RUN/push.out"; exit 1; }
echo "pushed to docker-registry at $R: $DIGEST (and the zstd variant)"

# ---- timed runs ------------------------------------------------------------------
mkdir -p "$RUN/trash"
k=0
fresh() { # d= a new, empty destination name; the old tree is renamed away
	k=$((k + 1))
	[ -e "$RUN/dest" ] && mv "$RUN/dest" "$RUN/trash/$k"
	d=$RUN/dest
}
DROP=no
[ -w /proc/sys/vm/drop_caches ] && DROP=yes
# what the timed commands run from: their binaries and the libraries they load
TOOLS=$(for t in "$G" ${BASE:+"$BASE"} /usr/bin/time sh skopeo umoci tar bsdtar curl openssl igzip zstd; do
	p=$(command -v "$t") && echo "$p" && ldd "$p" 2>/dev/null | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done | sort -u)
settle() { # nothing dirty; with root, a page cache holding just the inputs and the tools
	sync
	[ "$DROP" = yes ] || return 0
	echo 3 >/proc/sys/vm/drop_caches
	# shellcheck disable=SC2086 # one path per word
	find -H "$REG_bench_DIR" "$LAYER" "$ZLAYER" "$B/layer.tar" $TOOLS -type f -exec cat {} + >/dev/null # -H: libraries are named by their symlinks
}
timed() { # label cmd...: appends "wall_s rss_kb" to $RUN/<label>
	local label=$1
	shift
	settle
	/usr/bin/time -v -o "$RUN/tv" "$@" >"$RUN/cmd.out" 2>&1 || {
		echo "$label failed:"
		tail -5 "$RUN/cmd.out"
		return 1
	}
	local wall rss
	wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$RUN/tv")
	rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$RUN/tv")
	echo "$wall $rss" >>"$RUN/$label.part"
}
commit_part() { # label: sum the walls and max the RSS of the parts of run $i
	awk -v i="$i" '{w+=$1; if ($2>r) r=$2} END {print w, r, i}' "$RUN/$1.part" >>"$RUN/$1"
	rm -f "$RUN/$1.part"
}

for i in $(seq 1 "$N"); do
	fresh
	timed gkm "$G" cache extract "$R/bench/cache:v1" "$d" && commit_part gkm
	if [ -n "$BASE" ]; then
		fresh
		timed gkm_base "$BASE" cache extract "$R/bench/cache:v1" "$d" && commit_part gkm_base
	fi
	fresh
	mkdir -p "$RUN/sk"
	[ -e "$RUN/sk/l" ] && mv "$RUN/sk/l" "$RUN/trash/sk$k"
	timed skopeo skopeo copy -q --src-tls-verify=false "docker://$R/bench/cache:v1" "oci:$RUN/sk/l:t" &&
		timed skopeo umoci raw unpack --rootless --image "$RUN/sk/l:t" "$d" && commit_part skopeo
	fresh
	mkdir -p "$d"
	timed tar tar -xzf "$LAYER" -C "$d" && commit_part tar
	fresh
	mkdir -p "$d"
	timed bsdtar bsdtar -xzf "$LAYER" -C "$d" && commit_part bsdtar
	timed curl curl -sf -o /dev/null "http://$R/v2/bench/cache/blobs/sha256:$layer_hex" && commit_part curl
	timed sha256 openssl dgst -sha256 "$LAYER" && commit_part sha256
	timed igzip sh -c 'exec igzip -dc "$1" >/dev/null' _ "$LAYER" && commit_part igzip
	fresh
	mkdir -p "$d"
	timed write tar -xf "$B/layer.tar" -C "$d" && commit_part write
	fresh
	timed gkm_zstd "$G" cache extract "$R/bench/zcache:v1" "$d" && commit_part gkm_zstd
	timed zstd sh -c 'exec zstd -q -dc "$1" >/dev/null' _ "$ZLAYER" && commit_part zstd
	echo "run $i/$N done"
done

# second cache with the same digest: the content store has it, nothing is pulled
ST=$RUN/store
timed store_first "$G" cache extract "$R/bench/cache@$DIGEST" --store "$ST" && commit_part store_first
timed store_again "$G" cache extract "$R/bench/cache@$DIGEST" --store "$ST" && commit_part store_again
timed store_tag "$G" cache extract "$R/bench/cache:v1" --store "$ST" && commit_part store_tag
# the same pipeline on a tiny image: peak RSS must not grow with the layer
"$G" cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/bench/tiny:v1" >/dev/null
fresh
timed tiny "$G" cache extract "$R/bench/tiny:v1" "$d" && commit_part tiny

/usr/bin/python3 - "$RUN" "$tree_bytes" "$N" "$layer_size" "$DROP" <<'PY'
import statistics, sys
run, tree, n, layer, drop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def load(label):
    try:
        return [tuple(map(float, l.split())) for l in open(f"{run}/{label}")]
    except FileNotFoundError:
        return []
med = {}
def table(title, rows):
    print(f"\n{title:34} {'median s':>9} {'min':>7} {'max':>7} {'MB/s':>7} {'peak RSS MB':>12}")
    for label, name, *nbytes in rows: # MB/s of the tree, or of the bytes given
        r = load(label)
        if not r and label == "gkm_base":
            continue  # no baseline asked for
        if not r:
            print(f"{name:34} (failed)")
            continue
        w = [x[0] for x in r]
        med[label] = statistics.median(w)
        print(f"{name:34} {med[label]:9.2f} {min(w):7.2f} {max(w):7.2f} {(nbytes or [tree])[0]/med[label]/1e6:7.0f} "
              f"{max(x[1] for x in r)/1024:12.1f}")
table("gzip layer, end to end", (("gkm", "gkm pull+verify+extract"),
                                 ("gkm_base", "baseline gkm (GKM_BENCH_BASELINE)"),
                                 ("skopeo", "skopeo copy + umoci unpack"),
                                 ("tar", "GNU tar -xzf (local layer)"),
                                 ("bsdtar", "bsdtar -xzf (local layer)")))
table("the stages gkm is made of, alone", (("curl", "download: curl blob > /dev/null", layer),
                                           ("sha256", "SHA-256: openssl dgst", layer),
                                           ("igzip", "inflate: igzip -dc > /dev/null"),
                                           ("write", "write the tree: tar -xf plain tar")))
table("zstd layer", (("gkm_zstd", "gkm pull+verify+extract"), ("zstd", "decode: zstd -dc > /dev/null")))
print()
if "gkm" in med:
    for other in ("gkm_base", "skopeo", "tar", "bsdtar"):
        if other in med:
            print(f"ratio {other}/gkm: {med[other]/med['gkm']:.2f}x")
    stages = [s for s in ("curl", "sha256", "igzip", "write") if s in med]
    if stages:
        slow = max(stages, key=lambda s: med[s])
        print(f"gkm / its slowest stage ({slow}, {med[slow]:.2f} s): {med['gkm']/med[slow]:.2f}x "
              f"(sum of the stages {sum(med[s] for s in stages):.2f} s)")
        of_run = {x[2]: x[0] for x in load(slow)}
        pairs = [g[0] / of_run[g[2]] for g in load("gkm") if g[2] in of_run]
        if pairs:
            print(f"gkm / {slow} of the same run, median of {len(pairs)}: {statistics.median(pairs):.2f}x "
                  f"({min(pairs):.2f}-{max(pairs):.2f})")
if "gkm_zstd" in med and "write" in med and "zstd" in med:
    slow = max(med["zstd"], med["write"]) # download and hash were timed on the gzip blob only
    print(f"gkm zstd / the slower of zstd -dc and the write: {med['gkm_zstd']/slow:.2f}x")
for label, title in (("store_first", "store: first pull by digest"),
                     ("store_again", "store: same digest again"),
                     ("store_tag", "store: same image by tag"),
                     ("tiny", "gkm on a 27 KB image")):
    r = load(label)
    if r:
        print(f"{title:28} {r[0][0]:9.3f} s  peak RSS {r[0][1]/1024:.1f} MB")
print(f"({n} runs each, alternating; tree {tree/1e6:.0f} MB; page cache emptied and refilled with the inputs "
      f"and the tools before each timed command: {drop})")
w = [x[0] for x in load("write")]
if w and max(w) > 2 * min(w):
    print(f"note: writing the same tree took {min(w):.2f}-{max(w):.2f} s: the VM's page cache was in its slow "
          "state for some runs (or files were deleted shortly before; see BENCHMARKING.md), which stretches "
          "every extraction of those runs; the ratios from the same runs are the figures to compare")
PY
rm -rf "$RUN/trash"
