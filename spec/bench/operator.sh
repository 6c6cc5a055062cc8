#!/usr/bin/env bash
# Lean operator: `gkm operator` with 1,000 nodes (a ClusterGKMCacheNode and a
# GKMCacheNode each, as gkm agent writes them) and 100 GKMCaches, on a real
# kube-apiserver with etcd (GKM_KUBE_ASSETS; skipped with the reason where it
# is not set). Prints, per run: time from start to every cache showing the
# expected readyNodes, memory at rest (VmRSS, peak VmHWM, PSS, private dirty),
# CPU, and the time and CPU of a full re-aggregation (a policy ConfigMap that
# changes every cache's status). See spec/bench/operator_sim.py. Nothing is
# asserted.
#
#   GKM_BENCH_OP_NODES=1000 GKM_BENCH_OP_CACHES=100 GKM_BENCH_RUNS=3 spec/bench/operator.sh
set -u
cd "$(dirname "$0")/../.."
export GKM_ROOT=${GKM_ROOT:-$PWD}
export GKM_BIN=${GKM_BIN:-$PWD/build/gkm}
NODES=${GKM_BENCH_OP_NODES:-1000}
CACHES=${GKM_BENCH_OP_CACHES:-100}
RUNS=${GKM_BENCH_RUNS:-3}
OUT=$(mktemp "${TMPDIR:-/tmp}/gkm-bench-operator.XXXXXX")
trap 'rm -f "$OUT"' EXIT

[ -x "$GKM_BIN" ] || { echo "operator: $GKM_BIN not built"; exit 1; }
why=$(/usr/bin/python3 spec/lib/kubeenv.py unavailable)
[ -z "$why" ] || { echo "operator: skipped: $why"; exit 0; }
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); kube-apiserver with etcd over HTTPS"
for r in $(seq 1 "$RUNS"); do
	/usr/bin/python3 spec/bench/operator_sim.py --nodes "$NODES" --caches "$CACHES" >>"$OUT" ||
		echo "operator: run $r failed"
done
/usr/bin/python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not rows:
    sys.exit(1)
def med(key, fmt, scale=1.0):
    v = sorted(key(r) * scale for r in rows)
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), v[0], v[-1])
r0 = rows[0]
print("gkm operator, %d nodes (x2 node objects, %.0f MB of objects written in %s s) and %d caches, %d run(s), median (min-max)"
      % (r0["nodes"], r0["state_mb"], med(lambda r: r["populate_s"], "%.0f"), r0["caches"], len(rows)))
conv = sum(1 for r in rows if r["converged"])
print("  start to every cache's readyNodes as expected: %s s (%d of %d runs converged); operator CPU %s s"
      % (med(lambda r: r["ready_s"], "%.2f"), conv, len(rows), med(lambda r: r["cpu_to_ready_s"], "%.2f")))
mib = 1 / 1024
print("  at rest: VmRSS %s MiB, peak VmHWM %s MiB, PSS %s MiB, private dirty %s MiB; idle CPU %s s per 2 s"
      % (med(lambda r: r["rest"]["VmRSS"], "%.1f", mib), med(lambda r: r["rest"]["VmHWM"], "%.1f", mib),
         med(lambda r: r["rest"]["Pss"], "%.1f", mib), med(lambda r: r["rest"]["Private_Dirty"], "%.1f", mib),
         med(lambda r: r["idle_cpu_2s"], "%.2f")))
print("  of that VmRSS: anonymous (heap, stacks) %s MiB, mapped files (the binary and its shared libraries) %s MiB"
      % (med(lambda r: r["rest"]["RssAnon"], "%.1f", mib), med(lambda r: r["rest"]["RssFile"], "%.1f", mib)))
print("  full re-aggregation (policy reload changing every status): %s s to all %d caches written, operator CPU %s s"
      % (med(lambda r: r["reaggregate_s"], "%.2f"), r0["caches"], med(lambda r: r["reaggregate_cpu_s"], "%.2f")))
print("  after it: VmRSS %s MiB, VmHWM %s MiB; operator CPU in all %s s; kube-apiserver and etcd CPU %s s"
      % (med(lambda r: r["after"]["VmRSS"], "%.1f", mib), med(lambda r: r["after"]["VmHWM"], "%.1f", mib),
         med(lambda r: r["cpu_total_s"], "%.2f"), med(lambda r: r["server_cpu_s"], "%.1f")))
EOF
