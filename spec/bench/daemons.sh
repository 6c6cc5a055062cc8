#!/usr/bin/env bash
# Lean daemons: memory of the node-side loops at rest with 100 caches.
# `gkm up` (agent + operator in one process, the daemons' code) on a local
# registry, 100 GKMCache objects of one image, GPUs from a file. Reports
# VmRSS and VmHWM (what `ps`/kubelet show; shared library pages included),
# and private dirty memory (what this process alone costs).
set -u
cd "$GKM_ROOT"
. spec/lib/registry.sh
G=$GKM_BIN
N=${GKM_BENCH_CACHES:-100}
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-bench-daemons.XXXXXX")
UP=""
trap '[ -n "$UP" ] && kill $UP 2>/dev/null; registry_stop_all; rm -rf "$W"' EXIT
registry_start bench >/dev/null || { echo "registry did not start"; exit 1; }
R=$REG_bench_ADDR
$G cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/bench:v1" >/dev/null 2>&1
for i in $(seq 1 "$N"); do
	printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata:\n  name: cache-%d\n  namespace: bench\nspec:\n  image: %s/caches/bench:v1\n' "$i" "$R"
done >"$W/caches.yaml"
$G apply --state "$W/state" -f "$W/caches.yaml" >/dev/null
start=$(date +%s.%N)
${GKM_UP_WRAP:-} $G up --state "$W/state" --node bench-node --gpu-file spec/fixtures/gpu/inventory/t4.json \
	--poll-ms 250 >"$W/up.log" 2>&1 &
UP=$!
ready=0
for _ in $(seq 1 600); do
	ready=$($G get --state "$W/state" gkmc -n bench -o json 2>/dev/null | grep -c '"readyNodes":[[:space:]]*1')
	[ "$ready" -ge "$N" ] && break
	sleep 0.1
done
t_ready=$(echo "$(date +%s.%N) - $start" | bc)
sleep 5 # at rest: a few resync and poll cycles
rss=$(awk '/^VmRSS/{print $2}' /proc/$UP/status)
hwm=$(awk '/^VmHWM/{print $2}' /proc/$UP/status)
priv=$(awk '/^Private_Dirty/{print $2}' /proc/$UP/smaps_rollup)
pss=$(awk '/^Pss:/{print $2}' /proc/$UP/smaps_rollup)
printf 'gkm up, %d caches ready on 1 node in %.2f s (one pull, %d views)\n' "$ready" "$t_ready" "$N"
printf '  at rest: VmRSS %.1f MiB, peak VmHWM %.1f MiB, PSS %.1f MiB, private dirty %.1f MiB\n' \
	"$(echo "$rss/1024" | bc -l)" "$(echo "$hwm/1024" | bc -l)" "$(echo "$pss/1024" | bc -l)" \
	"$(echo "$priv/1024" | bc -l)"
