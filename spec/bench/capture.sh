#!/usr/bin/env bash
# gkm cache capture against a real registry (Debian's docker-registry):
#  1. time and peak RSS to capture and push a ~1 GiB upper layer of 20,000
#     files (spec/lib/gen_cache_tree.py), read in place as a pod's overlay
#     upper layer would be (--from);
#  2. the bytes that reach the registry for a capture that adds 1% new
#     files (200 files, ~1% of the bytes) on top of that cache as a base:
#     counted as the blob bytes the registry's storage gained, next to the
#     size of the base's layer (which must not travel again).
# In 2, the command moves prepared files in, so the figures are the capture's
# own. Figures are printed, never asserted. N rounds (default 2);
# generated data lives under $BUILD/bench/capture.
#   N=3 GKM_BENCH_SCALE=0.25 spec/bench/capture.sh
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
N=${N:-2}
SCALE=${GKM_BENCH_SCALE:-1}
G=$PWD/$BUILD/gkm
PY=/usr/bin/python3
. spec/lib/registry.sh
work=$PWD/$BUILD/bench/capture
mkdir -p "$work"
run=$(mktemp -d "$work/run.XXXXXX")
trap 'set +e; registry_stop_all; rm -rf "$run"' EXIT
export TMPDIR=$run # workspaces on the same file system as the prepared trees
INV=spec/fixtures/gpu/inventory/h100.json

if ! registry_available; then
	echo "skipped: docker-registry missing"
	exit 0
fi
registry_start bench
R=$REG_bench_ADDR
tree=$work/tree-$SCALE
if [ ! -d "$tree" ]; then
	echo "generating the scale-$SCALE cache tree (once)..." >&2
	"$PY" spec/lib/gen_cache_tree.py "$tree.tmp" --scale "$SCALE" >/dev/null
	mv "$tree.tmp" "$tree"
fi
files=$(find "$tree/io.triton.cache" -type f | wc -l)
bytes=$(du -sb "$tree/io.triton.cache" | cut -f1)
storage_bytes() { find "$REG_bench_DIR" -path '*/blobs/*' -name data -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {print s+0}'; }
mb() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b/1048576}'; }

echo "cache: $files files, $(mb "$bytes") (scale $SCALE), $N rounds"
echo
echo "1. capture + push of the whole cache as an upper layer (--from, one layer)"
printf '   %-6s %10s %12s %14s\n' round "wall s" "peak RSS" "layer"
for i in $(seq 1 "$N"); do
	# a source date per round: a layer the registry already has would not travel
	/usr/bin/time -f '%e %M' -o "$run/time" "$G" cache capture --from "$tree/io.triton.cache" \
		-t "$R/bench/full:r$i" --gpu-file "$INV" --settle-ms 0 --source-date-epoch $((1000000 + i)) \
		-o json >"$run/out.json"
	read -r wall rss <"$run/time"
	layer=$("$PY" -c "import json; print(json.load(open('$run/out.json'))['layerSize'])")
	printf '   %-6s %10s %9s MiB %14s\n' "$i" "$wall" "$((rss / 1024))" "$(mb "$layer")"
done

echo
echo "2. capture on that cache as a base, adding 1% new files"
"$G" cache build "$tree/io.triton.cache" -t "$R/bench/base:v1" -o json >"$run/base.json"
base_layer=$("$PY" -c "import json; print(json.load(open('$run/base.json'))['layerSize'])")
new=$((files / 100))
per=$((bytes / 100 / (new > 0 ? new : 1)))
printf '   %-6s %10s %12s %16s %16s\n' round "wall s" "peak RSS" "pushed" "base layer"
for i in $(seq 1 "$N"); do
	rm -rf "$run/addi" && mkdir -p "$run/addi/NEWKERNELSXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
	"$PY" - "$run/addi/NEWKERNELSXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX" "$new" "$per" "$i" <<-'PY'
	import json, os, random, sys
	d, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
	rng = random.Random(int(sys.argv[4]))
	json.dump({"hash": "new", "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "name": "new_kernel"},
	          open(os.path.join(d, "new_kernel.json"), "w"))
	for i in range(n - 1):
	    open(os.path.join(d, "part%04d.bin" % i), "wb").write(rng.randbytes(per))
	PY
	added=$(du -sb "$run/addi" | cut -f1)
	before=$(storage_bytes)
	/usr/bin/time -f '%e %M' -o "$run/time" "$G" cache capture --base "$R/bench/base:v1" -t "$R/bench/base:c$i" \
		--gpu-file "$INV" --settle-ms 0 -o json -- sh -c 'mv "$0"/* "$TRITON_CACHE_DIR"/' "$run/addi" >"$run/c.json"
	read -r wall rss <"$run/time"
	pushed=$(($(storage_bytes) - before))
	printf '   %-6s %10s %9s MiB %16s %16s\n' "$i" "$wall" "$((rss / 1024))" "$(mb "$pushed")" "$(mb "$base_layer")"
done
echo "   (added: $new files, $(mb "$added"); the capture downloads the base to run on it,"
echo "    and uploads only the new layer, its config and manifest)"
