#!/usr/bin/env bash
# Convergence at scale: from creating a GKMCache to readyNodes == N, with N
# simulated agents server-side applying their own GKMCacheNode status and the
# real `gkm operator` aggregating it; then the same N writes as
# read-modify-write of one shared object, and as server-side apply to one
# shared object, for contrast. Against a real kube-apiserver with etcd
# (GKM_KUBE_ASSETS, see spec/lib/kubeenv.py; skipped with the reason where it
# is not there), a fresh one each run. Prints medians (min-max) of
# GKM_BENCH_RUNS runs (default 5) for the sharded design, one run for the
# contrasts (each stopped after GKM_BENCH_CONTRAST_LIMIT seconds, default 60).
# Writes and their status codes are counted from the server's JSON audit log,
# by verb, resource and writer. The server's own CPU per write is printed
# beside each figure, so that its share can be told from the controller's. A
# run (the server's start included) is stopped after GKM_BENCH_REAL_LIMIT
# seconds (default 300); nothing it started outlives it. After convergence the
# run waits for the operator's Node labels (one apply per node) and prints
# when the last one landed. Nothing is asserted.
#
#   GKM_BENCH_NODES="10 100 1000" spec/bench/convergence.sh
#   GKM_BENCH_BASELINE=PATH: another gkm binary (an earlier commit's build) as
#     the operator, run after gkm in every round, for a before and after on
#     the same machine state
set -u
cd "$(dirname "$0")/../.." || exit 1
export GKM_ROOT=${GKM_ROOT:-$PWD}
export GKM_BIN=${GKM_BIN:-$PWD/build/gkm}
NODES=${GKM_BENCH_NODES:-100 1000}
RUNS=${GKM_BENCH_RUNS:-5}
LIMIT=${GKM_BENCH_CONTRAST_LIMIT:-60}
REAL_LIMIT=${GKM_BENCH_REAL_LIMIT:-300}
BASELINE=${GKM_BENCH_BASELINE:-}
SIM=(/usr/bin/python3 spec/bench/convergence_sim.py)
OUT=$(mktemp "${TMPDIR:-/tmp}/gkm-convergence.XXXXXX")
trap 'rm -f "$OUT"' EXIT

[ -x "$GKM_BIN" ] || { echo "convergence: $GKM_BIN not built"; exit 1; }
real_why=$(/usr/bin/python3 spec/lib/kubeenv.py unavailable)
if [ -n "$real_why" ]; then
	echo "convergence: skipped: $real_why"
	exit 0
fi
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); 32 agent threads"
echo "API server: $("$GKM_KUBE_ASSETS/kube-apiserver" --version) with etcd $(/usr/bin/etcd --version | sed -n 's/^etcd Version: //p'), over HTTPS with a token, audit log (writes, Metadata level, blocking)"

# sim ARGS...: one run, its JSON line appended to $OUT
sim() {
	timeout -k 30 "$REAL_LIMIT" "${SIM[@]}" "$@" >>"$OUT" || echo "convergence: run failed or stopped ($*)"
}

for n in $NODES; do
	for _ in $(seq 1 "$RUNS"); do
		sim --nodes "$n"
		[ -z "$BASELINE" ] || GKM_BIN=$BASELINE sim --nodes "$n" --baseline
	done
	sim --nodes "$n" --design rmw --contrast-limit "$LIMIT"
	sim --nodes "$n" --design ssa-shared --contrast-limit "$LIMIT"
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(v, fmt):
    v = sorted(v)
    if len(v) == 1:
        return fmt % v[0]
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), v[0], v[-1])
print("%-32s %-6s %5s %4s  %-20s %-16s %-8s %-16s %-5s %-5s %-16s %s" % (
    "design", "server", "N", "runs", "to readyNodes==N, s", "agent writes", "op wr", "409s",
    "422s", "other", "server ms CPU/wr", "note"))
groups = {}
for r in rows:
    groups.setdefault((r["n"], r["design"], r["server"]), []).append(r)
ORDER = ["sharded SSA + gkm operator", "sharded SSA + baseline operator", "shared object, read-modify-write", "shared object, SSA per writer"]
for (n, design, server), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], ORDER.index(kv[0][1]))):
    conv = [r for r in rs if r["converged"]]
    note = ""
    if len(conv) < len(rs):
        note = "stopped: %d of %d written" % (rs[0].get("done", 0), n)
    secs = [r["seconds"] for r in rs]
    ms_wr = [1000 * r["server_cpu_s"] / max(1, r["writes"]) for r in rs]
    opw = [r.get("operator_writes", 0) for r in rs]
    print("%-32s %-6s %5d %4d  %-20s %-16s %-8s %-16s %-5s %-5s %-16s %s" % (
        design.replace(" + gkm operator", " + operator"), server, n, len(rs), med(secs, "%.2f"),
        med([r["agent_writes"] for r in rs], "%d"),
        med(opw, "%d") if "operator_writes" in rs[0] else "-",
        med([r["conflicts"] for r in rs], "%d"), med([r["invalid"] for r in rs], "%d"),
        med([r["other_errors"] for r in rs], "%d"), med(ms_wr, "%.2f"), note))
    mid = sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2]
    pad = " " * 34
    if "operator_writes" in rs[0]:
        lag = [r["seconds"] - r["agents_done_s"] for r in rs]
        print("%sagents' writes done %s s; operator after the last write %s s; operator CPU %s s" % (
            pad, med([r["agents_done_s"] for r in rs], "%.2f"), med(lag, "%.2f"),
            med([r["operator_cpu_s"] for r in rs], "%.2f")))
        lab = [r["labels_done_s"] for r in rs if r.get("labels_done_s") is not None]
        if lab:
            print("%sthe last Node label applied at %s s" % (pad, med(lab, "%.2f")))
        print("%sreadyNodes as written by the operator (s: nodes): %s" % (
            pad, ", ".join("%.2f: %d" % (t, k) for t, k in mid["curve"])))
    cpu = "server CPU %s s" % med([r["server_cpu_s"] for r in rs], "%.2f")
    if rs[0].get("etcd_cpu_s") is not None:
        cpu += " (etcd %s s); server start %s s" % (med([r["etcd_cpu_s"] for r in rs], "%.2f"),
                                                    med([r["server_start_s"] for r in rs], "%.1f"))
    print("%s%s; server peak RSS %s MiB" % (pad, cpu, med([r["server_peak_mib"] for r in rs], "%.0f")))
    print("%swrites (%s run): %s" % (pad, "median" if len(rs) > 1 else "the", "; ".join(
        "%s %s" % (k, " ".join("%dx%s" % (v, c) for c, v in sorted(codes.items())))
        for k, codes in sorted(mid["writes_by"].items()))))
PY
