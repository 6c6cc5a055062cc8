#!/usr/bin/env bash
# Lean daemons: `gkm agent` at rest with 100 caches ready on its node.
# The agent runs in Kubernetes mode against a real kube-apiserver
# (GKM_KUBE_ASSETS; skipped with the reason where it is not set), 100 GKMCache
# objects of one image from a local registry (digests as the admission
# webhook would have set them), GPUs from a file. Reports VmRSS and VmHWM
# (what `ps` shows), split into anonymous memory (this process's own) and
# file pages (mostly shared library code, shared with every other process
# that maps the same libraries), PSS and private dirty memory, and the same
# figures for `gkm csi` idle (the CSI plugin is the only command that maps
# gRPC: it lives in build/gkm-csi.so, loaded by `gkm csi` alone), and two
# floors: programs that do nothing but link libcurl, or every library gkm
# links, and initialise libcurl.
# The agent verifies no signature (--verify-enabled false, as the figures in
# performance.md were taken); GKM_BENCH_VERIFY=1 signs the image and gives
# the agent the key, so that every cache's source is checked with its
# signature. GKM_BENCH_WRAP runs the agent under a profiler (e.g. heaptrack).
set -u
cd "$GKM_ROOT"
. spec/lib/registry.sh
. spec/lib/kubeenv.sh
G=$GKM_BIN
N=${GKM_BENCH_CACHES:-100}
W=$(mktemp -d "${TMPDIR:-/tmp}/gkm-bench-daemons.XXXXXX")
AGENT="" CSI=""
cleanup() {
	local p
	for p in $AGENT $CSI; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
	kubeenv_stop
	registry_stop_all
	rm -rf "$W"
}
trap cleanup EXIT
why=$(kubeenv_unavailable) && { echo "daemons.sh: skipped: $why"; exit 0; }
registry_start bench >/dev/null || { echo "registry did not start"; exit 1; }
R=$REG_bench_ADDR
$G cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/caches/bench:v1" >"$W/build.out" 2>&1 ||
	{ cat "$W/build.out"; exit 1; }
DIGEST=$(sed -n 's/.*@\(sha256:[0-9a-f]*\).*/\1/p' "$W/build.out" | head -1)
TRUST=(--verify-enabled false)
if [ -n "${GKM_BENCH_VERIFY:-}" ]; then
	$G cache keygen --output-key-prefix "$W/cosign" >/dev/null 2>&1 &&
		$G cache sign "$R/caches/bench:v1" --key "$W/cosign.key" >/dev/null 2>&1 ||
		{ echo "cannot sign the image"; exit 1; }
	TRUST=(--key "$W/cosign.pub")
fi
kubeenv_start || { echo "the control plane did not start"; exit 1; }
trap cleanup EXIT
kubectl create namespace bench >/dev/null
kubeenv_ctl node bench-node >/dev/null
for i in $(seq 1 "$N"); do
	printf -- '---\napiVersion: gkm.io/v1alpha1\nkind: GKMCache\nmetadata:\n  name: cache-%d\n  namespace: bench\n  annotations: {gkm.io/resolvedDigest: "%s"}\nspec:\n  image: %s/caches/bench:v1\n' \
		"$i" "$DIGEST" "$R"
done | kubectl apply -f - >/dev/null || exit 1

mem() { # pid label: one line of memory figures (spec/lib/proc.py)
	/usr/bin/python3 -c 'import sys; sys.path.insert(0, "spec/lib"); from proc import memory
m = {k: v / 1024 for k, v in memory(int(sys.argv[1])).items()}
print("  %-23s VmRSS %5.1f MiB (anon %.1f + file %.1f), VmHWM %5.1f MiB, PSS %5.1f MiB, private dirty %5.1f MiB"
      % (sys.argv[2], m["VmRSS"], m["RssAnon"], m["RssFile"], m["VmHWM"], m["Pss"], m["Private_Dirty"]))' "$1" "$2"
}
cpu() { # pid: its user + system CPU seconds
	/usr/bin/python3 -c 'import sys; sys.path.insert(0, "spec/lib"); from proc import cpu_s; print(cpu_s(int(sys.argv[1])))' "$1"
}

mkdir -p "$W/root" "$W/run"
start=$(date +%s.%N)
${GKM_BENCH_WRAP:-} $G agent --node bench-node --kubeconfig "$KUBECONFIG" --gpu-file spec/fixtures/gpu/inventory/t4.json \
	--root "$W/root" --run-dir "$W/run" "${TRUST[@]}" --health-listen "" >"$W/agent.log" 2>&1 &
AGENT=$!
ready=0
for _ in $(seq 1 1200); do
	ready=$(kubectl get gkmcachenode bench-node -n bench -o json 2>/dev/null | grep -c '"state": "Ready"')
	[ "$ready" -ge "$N" ] && break
	kill -0 "$AGENT" 2>/dev/null || { echo "the agent exited:"; tail -5 "$W/agent.log"; exit 1; }
	sleep 0.1
done
t_ready=$(echo "$(date +%s.%N) - $start" | bc)
cpu_ready=$(cpu "$AGENT")
printf 'gkm agent: %d of %d caches Ready on its node in %.2f s (one pull, %d views%s)\n' "$ready" "$N" "$t_ready" "$N" \
	"${GKM_BENCH_VERIFY:+, signatures verified}"
sleep 5 # at rest: a few resync and poll cycles
mem "$AGENT" "agent, at rest:"
cpu0=$(cpu "$AGENT")
sleep 10
cpu1=$(cpu "$AGENT")
printf '  agent CPU: %.2f s to get ready, %.2f s in 10 s at rest\n' "$cpu_ready" "$(echo "$cpu1 - $cpu0" | bc)"

$G csi --node-id bench-node --endpoint "unix://$W/csi.sock" --root "$W/root" --run-dir "$W/run" \
	--health-listen "" >"$W/csi.log" 2>&1 &
CSI=$!
for _ in $(seq 1 100); do [ -S "$W/csi.sock" ] && break; sleep 0.1; done
sleep 1
mem "$CSI" "csi (gRPC), idle:"

# The floor under every gkm daemon: a C program that only links libcurl (as
# Debian builds it: OpenSSL, GnuTLS through librtmp, Kerberos, LDAP, ...) and
# calls curl_global_init, which initialises OpenSSL.
cat >"$W/floor.c" <<'C'
#include <curl/curl.h>
#include <signal.h>
#include <unistd.h>
int main(void)
{
	curl_global_init(CURL_GLOBAL_ALL);
	pause();
	return 0;
}
C
# The second links every library the gkm binary names (loaded and
# relocated, their constructors run: libmicrohttpd's initialises GnuTLS),
# the same call, nothing else: what any daemon built on them starts from.
floor() { # label libraries...
	local label=$1 pid
	shift
	cc -O2 -o "$W/floor" "$W/floor.c" -Wl,--no-as-needed "$@" 2>/dev/null || return 0
	"$W/floor" &
	pid=$!
	sleep 0.5
	mem "$pid" "$label"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}
floor "floor: libcurl alone:" -lcurl
floor "floor: gkm's libraries:" $(readelf -d "$G" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/-l:\1/p' | grep -v 'libc\.so')
