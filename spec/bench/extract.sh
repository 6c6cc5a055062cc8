#!/usr/bin/env bash
# Layer extraction: gkm's extractor against bsdtar -xzf and GNU tar -xzf on
# the same synthetic ~1 GiB Triton cache layer (spec/lib/gen_cache_tree.py:
# 20,000 small files in 4,000 hash dirs + 40 binaries of 7-30 MiB, gzip -6),
# plus the zstd form of the layer and gkm through the content store (temp
# dir, syncfs, rename). Runs alternate tool by tool, N rounds (default 3);
# every run gets a fresh destination by renaming the last one away, and all
# trees are deleted only at the end (see BENCHMARKING.md). Prints median,
# min and max wall time, MB/s of tree bytes, peak RSS, and ratios to gkm;
# CPU s is user+sys (median), steadier than wall time on a shared machine;
# then gkm's peak RSS on a layer a quarter the size (streaming: it must not grow
# with the layer). Generated data lives under $BUILD/bench/extract.
#   N=5 GKM_BENCH_SCALE=0.25 spec/bench/extract.sh
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
N=${N:-3}
SCALE=${GKM_BENCH_SCALE:-1}
PY=/usr/bin/python3
make -s "$BUILD/bench/extract_layer" >/dev/null
tool=$PWD/$BUILD/bench/extract_layer
work=$PWD/$BUILD/bench/extract
mkdir -p "$work"

layer_for() { # scale -> path of the gzip layer (made once, kept)
	local l="$work/layer-$1.tar.gz"
	if [ ! -s "$l" ]; then
		echo "generating the scale-$1 layer (once)..." >&2
		"$PY" spec/lib/gen_cache_tree.py --tar - --scale "$1" | gzip -6 >"$l.tmp"
		mv "$l.tmp" "$l"
	fi
	echo "$l"
}
layer=$(layer_for "$SCALE")
zlayer="$work/layer-$SCALE.tar.zst"
if [ ! -s "$zlayer" ]; then
	gzip -dc "$layer" | zstd -q -3 -o "$zlayer.tmp" && mv "$zlayer.tmp" "$zlayer"
fi

run=$(mktemp -d "$work/run.XXXXXX")
mkdir -p "$run/trash"
cleanup() { rm -rf "$run"; }
trap cleanup EXIT
results="$run/results"
: >"$results"

timed() { # name, command... (run in a fresh $run/dest)
	local name=$1
	shift
	[ -e "$run/dest" ] && mv "$run/dest" "$run/trash/$name.$RANDOM$RANDOM"
	mkdir "$run/dest"
	/usr/bin/time -f '%e %M %U %S' -o "$run/time" "$@" >"$run/out" 2>"$run/err" || {
		echo "$name failed:" >&2
		cat "$run/err" >&2
		return 1
	}
	echo "$name $(cat "$run/time")" >>"$results"
}

echo "layer: $(du -h "$layer" | cut -f1) gzip, $(du -h "$zlayer" | cut -f1) zstd; N=$N"
for i in $(seq "$N"); do
	timed gkm "$tool" "$run/dest" "$layer"
	bytes=$(sed -n 's/.*bytes=\([0-9]*\).*/\1/p' "$run/out")
	timed bsdtar bsdtar -xf "$layer" -C "$run/dest"
	timed gnutar tar -xzf "$layer" -C "$run/dest"
	timed gkm-zstd "$tool" "$run/dest" "$zlayer"
	timed bsdtar-zstd bsdtar -xf "$zlayer" -C "$run/dest"
	timed gkm-store "$tool" --store "$run/store" "sha256:$(printf '%064x' "$i")" "$layer"
done

small=$(layer_for "$(awk "BEGIN { print $SCALE / 4 }")")
for i in $(seq "$N"); do
	timed gkm-quarter "$tool" "$run/dest" "$small"
done

"$PY" - "$results" "$bytes" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, wall, rss, user, sys_ = line.split()
    rows.setdefault(name, []).append((float(wall), int(rss), float(user) + float(sys_)))
tree = int(sys.argv[2])
base = statistics.median(w for w, _, _ in rows["gkm"])
print(f"tree: {tree / 1e6:.0f} MB uncompressed")
print(f"{'tool':<13}{'median s':>9}{'min':>7}{'max':>7}{'MB/s':>8}{'peak RSS MiB':>14}{'x gkm':>7}{'CPU s':>7}")
for name, v in rows.items():
    walls = [w for w, _, _ in v]
    med = statistics.median(walls)
    cpu = statistics.median(c for _, _, c in v)
    rss = max(r for _, r, _ in v) / 1024
    mbs = tree / 1e6 / med if name != "gkm-quarter" else float("nan")
    ratio = med / base if name != "gkm-quarter" else float("nan")
    print(f"{name:<13}{med:>9.2f}{min(walls):>7.2f}{max(walls):>7.2f}{mbs:>8.0f}{rss:>14.1f}{ratio:>7.2f}{cpu:>7.2f}")
PY
echo "deleting the extracted trees (untimed)..."
