#!/usr/bin/env bash
# One dead registry beside a healthy one: the time from creating a cache of
# a registry that answers to its node entry being Ready, in standalone mode
# (`gkm up`), beside 0, 10 and 100 caches of a registry that is dead, two
# kinds of dead:
#   refused  nothing listens on its port (connections are refused at once)
#   silent   a proxy that accepts connections, reads requests and never
#            answers (the agent's default timeouts: connect 10 s, stall 30 s)
# The dead caches are created first, each with its own digest, and the agent
# is given time to start (its ClusterGKMCacheNode is written) and to start on
# them (until it reports every one; at most 10 s in all);
# then the healthy cache is created by tag (the operator resolves it) and
# timed until Ready, polling its node status file every 10 ms. Runs are
# stopped after GKM_BENCH_LIMIT seconds (default 120; printed as "> limit").
# GKM_BENCH_DEAD selects the counts (default "0 10 100"), GKM_BENCH_RUNS the
# runs per point (default 3; the median is printed, min-max beside it).
# Nothing is asserted.
set -u
cd "$(dirname "$0")/../.."
export GKM_ROOT=${GKM_ROOT:-$PWD}
export GKM_BIN=${GKM_BIN:-$PWD/build/gkm}
. spec/lib/registry.sh
COUNTS=${GKM_BENCH_DEAD:-0 10 100}
RUNS=${GKM_BENCH_RUNS:-3}
LIMIT=${GKM_BENCH_LIMIT:-120}
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-bench-dead.XXXXXX")
UP=""
stop_up() { [ -n "$UP" ] && kill "$UP" 2>/dev/null && wait "$UP" 2>/dev/null; UP=""; }
trap 'stop_up; registry_stop_all; rm -rf "$W"' EXIT
[ -x "$GKM_BIN" ] || { echo "dead_registry: $GKM_BIN not built"; exit 1; }
registry_available || { echo "dead_registry: docker-registry missing, benchmark skipped"; exit 0; }
registry_start good >/dev/null && proxy_start silent "$REG_good_ADDR" || { echo "registry did not start"; exit 1; }
proxy_fault "$PROXY_silent_ADDR" '{"hang": true}'
R=$REG_good_ADDR
REFUSED=127.0.0.1:$(free_port)
"$GKM_BIN" cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/healthy:v1" >"$W/build" 2>&1 ||
	{ cat "$W/build"; exit 1; }
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); gkm up --poll-ms 50, default --max-pulls and timeouts"

one_run() { # dead-registry-address count: prints seconds to Ready, or "> LIMIT"
	local s=$W/run
	rm -rf "$s"
	mkdir -p "$s"
	local i
	for i in $(seq 1 "$2"); do
		printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: dead-%d, namespace: default}\nspec: {image: "%s/caches/dead-%d@sha256:%064x"}\n' \
			"$i" "$1" "$i" "$i"
	done >"$s.dead.yaml"
	[ "$2" -gt 0 ] && "$GKM_BIN" apply --state "$s" -f "$s.dead.yaml" >/dev/null
	"$GKM_BIN" up --state "$s" --node node-1 --gpu-file spec/fixtures/gpu/inventory/t4.json \
		--poll-ms 50 --verify-enabled false >"$s.log" 2>&1 &
	UP=$!
	/usr/bin/python3 - "$s" "$2" "$R" "$LIMIT" "$GKM_BIN" <<'PY'
import glob, json, subprocess, sys, time
state, dead, reg, limit, gkm = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]

def caches():
    for path in glob.glob(state + "/objects/*/default/node-1.status.json"):
        try:
            return json.load(open(path))["status"].get("caches", {})
        except (OSError, ValueError, KeyError):
            pass
    return {}

deadline = time.monotonic() + 10  # the agent runs and has started on the dead caches
while (not glob.glob(state + "/objects/*/_cluster/node-1.status.json") or
       len(caches()) < dead) and time.monotonic() < deadline:
    time.sleep(0.05)
doc = ("apiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata: {name: healthy, namespace: default}\n"
       "spec: {image: \"%s/caches/healthy:v1\"}\n" % reg)
t0 = time.monotonic()
subprocess.run([gkm, "apply", "--state", state, "-f", "-"], input=doc.encode(), check=True,
               stdout=subprocess.DEVNULL)
while time.monotonic() - t0 < limit:
    if caches().get("healthy", {}).get("state") == "Ready":
        print("%.2f" % (time.monotonic() - t0))
        sys.exit(0)
    time.sleep(0.01)
print("> %d" % limit)
PY
	stop_up
}

median() { # values...: "median (min-max) s", or the "> limit" of any run that hit it
	printf '%s\n' "$@" | /usr/bin/python3 -c '
import sys
v = [l.strip() for l in sys.stdin if l.strip()]
if any(x.startswith(">") for x in v):
    print("%s s (%d of %d runs hit the limit)" % (next(x for x in v if x.startswith(">")),
          sum(x.startswith(">") for x in v), len(v)))
else:
    f = sorted(float(x) for x in v)
    print("%.2f s (%.2f-%.2f)" % (f[len(f) // 2], f[0], f[-1]))'
}

for kind in refused silent; do
	addr=$REFUSED
	[ "$kind" = silent ] && addr=$PROXY_silent_ADDR
	for n in $COUNTS; do
		[ "$n" = 0 ] && [ "$kind" = silent ] && continue # the same run as refused 0
		vals=()
		for _ in $(seq 1 "$RUNS"); do vals+=("$(one_run "$addr" "$n")"); done
		printf '  healthy cache Ready beside %3d caches of a %-7s registry: %s\n' "$n" "$kind" "$(median "${vals[@]}")"
	done
done
