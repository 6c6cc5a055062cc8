#!/usr/bin/env bash
# Convergence at scale: from creating a GKMCache to readyNodes == N, with N
# simulated agents server-side applying their own GKMCacheNode status and the
# real `gkm operator` aggregating it, against the test API server; then the
# same N writes as read-modify-write of one shared object, and as server-side
# apply to one shared object, for contrast. Prints medians (min-max) of
# GKM_BENCH_RUNS runs (default 5) for the sharded design, one run for the
# contrasts (each stopped after GKM_BENCH_CONTRAST_LIMIT seconds, default 60).
# The test API server's own CPU per request is printed beside each figure, so
# that its share can be told from the controller's. Nothing is asserted.
#
#   GKM_BENCH_NODES="10 100 1000" spec/bench/convergence.sh
set -u
cd "$(dirname "$0")/../.."
export GKM_ROOT=${GKM_ROOT:-$PWD}
export GKM_BIN=${GKM_BIN:-$PWD/build/gkm}
NODES=${GKM_BENCH_NODES:-10 100 1000}
RUNS=${GKM_BENCH_RUNS:-5}
LIMIT=${GKM_BENCH_CONTRAST_LIMIT:-60}
SIM="/usr/bin/python3 spec/bench/convergence_sim.py"
OUT=$(mktemp "${TMPDIR:-/tmp}/gkm-convergence.XXXXXX")
trap 'rm -f "$OUT"' EXIT

[ -x "$GKM_BIN" ] || { echo "convergence: $GKM_BIN not built"; exit 1; }
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); test API server over plain HTTP; 32 agent threads"
for n in $NODES; do
	for r in $(seq 1 "$RUNS"); do
		$SIM --nodes "$n" >>"$OUT" || echo "convergence: sharded run failed (N=$n)"
	done
	$SIM --nodes "$n" --design rmw --contrast-limit "$LIMIT" >>"$OUT" || echo "convergence: rmw run failed (N=$n)"
	$SIM --nodes "$n" --design ssa-shared --contrast-limit "$LIMIT" >>"$OUT" || echo "convergence: ssa-shared run failed (N=$n)"
done
/usr/bin/python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(v, fmt):
    v = sorted(v)
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), v[0], v[-1])
print("%-34s %5s %4s  %-22s %-16s %-10s %-16s %-16s %s" % (
    "design", "N", "runs", "to readyNodes==N, s", "agent writes", "op wr", "409s",
    "server ms CPU/req", "note"))
groups = {}
for r in rows:
    groups.setdefault((r["design"], r["n"]), []).append(r)
for (design, n), rs in groups.items():
    conv = [r for r in rs if r["converged"]]
    note = ""
    if len(conv) < len(rs):
        note = "stopped: %d of %d written" % (rs[0].get("done", 0), n)
    secs = [r["seconds"] for r in rs]
    ms_req = [1000 * r["server_cpu_s"] / max(1, r["requests"]) for r in rs]
    opw = [r.get("operator_writes", 0) for r in rs]
    print("%-34s %5d %4d  %-22s %-16s %-10s %-16s %-16s %s" % (
        design, n, len(rs), med(secs, "%.2f"), med([r["agent_writes"] for r in rs], "%d"),
        med(opw, "%d") if "operator_writes" in rs[0] else "-",
        med([r["conflicts"] for r in rs], "%d"), med(ms_req, "%.2f"), note))
    if "operator_writes" in rs[0]:
        lag = [r["seconds"] - r["agents_done_s"] for r in rs]
        print("%-34s        agents' writes done %s s; operator after the last write %s s; "
              "operator CPU %s s; server CPU %s s" % (
                  "", med([r["agents_done_s"] for r in rs], "%.2f"), med(lag, "%.2f"),
                  med([r["operator_cpu_s"] for r in rs], "%.2f"),
                  med([r["server_cpu_s"] for r in rs], "%.2f")))
        print("%-34s        readyNodes as written by the operator (s: nodes): %s" % (
            "", ", ".join("%.2f: %d" % (t, k) for t, k in rs[len(rs) // 2]["curve"])))
EOF
