#!/usr/bin/env bash
# gkm webhook under load: AdmissionReviews for an image whose tag resolution
# and signature verdict are already cached (the steady state of a cluster),
# over HTTPS on loopback.
#  - open loop at fixed rates (spec/bench/review_load.c: latency from the
#    moment each request was due, 16 kept-alive verified TLS connections)
#  - closed loop with wrk (-t2 -c16) for the most reviews per second
# Also the webhook's own latency (its histogram: request headers in to answer
# out), its CPU time per review and its peak RSS. Figures are printed, never
# asserted. Runs: GKM_BENCH_RUNS (default 3), seconds per run:
# GKM_BENCH_SECONDS (default 10).
set -eu
cd "$GKM_ROOT"
. spec/lib/registry.sh
. spec/lib/webhook_bench.sh
RUNS=${GKM_BENCH_RUNS:-3}
# GKM_BENCH_RT=1 runs the webhook and the load generator with real-time
# priority (chrt -f 10), to see their own latency apart from whatever else
# this machine runs
RT=""
[ "${GKM_BENCH_RT:-0}" = 1 ] && RT="chrt -f 10"
SECS=${GKM_BENCH_SECONDS:-10}
G=$GKM_BIN
tmp=$(mktemp -d)
wh_pid=""
cleanup() {
	set +e # stopping what ran is not a failure of the benchmark
	[ -n "$wh_pid" ] && kill "$wh_pid" 2>/dev/null && wait "$wh_pid" 2>/dev/null
	registry_stop_all
	rm -rf "$tmp"
}
trap cleanup EXIT

wb_build_load
load=$WB_LOAD

# a CA and a server certificate for 127.0.0.1
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/ca.key" \
	-out "$tmp/ca.pem" -days 1 -subj "/CN=bench CA" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/tls.key" \
	-out "$tmp/tls.csr" -subj "/CN=gkm-webhook" 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" >"$tmp/san.ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
	-out "$tmp/tls.crt" -days 1 -extfile "$tmp/san.ext" 2>/dev/null

# a signed image in a real registry
wb_signed_image "$tmp"

$RT $G webhook --tls-cert "$tmp/tls.crt" --tls-key "$tmp/tls.key" --trust-dir "$tmp/trust" \
	--listen 127.0.0.1:0 --health-listen 127.0.0.1:0 --log-format json \
	--resolve-ttl 3600 --plain-http 2>"$tmp/log" &
wh_pid=$!
port=""
for _ in $(seq 1 100); do
	port=$(grep -o '"https_port":"[0-9]*"' "$tmp/log" | grep -o '[0-9]*' || true)
	[ -n "$port" ] && break
	sleep 0.05
done
[ -n "$port" ] || { echo "webhook did not start:"; cat "$tmp/log"; exit 1; }
hport=$(grep -o '"health_port":"[0-9]*"' "$tmp/log" | grep -o '[0-9]*')
url=https://127.0.0.1:$port/mutate

cat >"$tmp/review.json" <<EOF
{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"0b9e7d4c-bench",
"kind":{"group":"gkm.io","version":"v1alpha1","kind":"GKMCache"},
"resource":{"group":"gkm.io","version":"v1alpha1","resource":"gkmcaches"},
"namespace":"bench","name":"cache","operation":"CREATE",
"object":{"apiVersion":"gkm.io/v1alpha1","kind":"GKMCache","metadata":{"name":"cache","namespace":"bench"},
"spec":{"image":"$R/bench/cache:v1"}}}}
EOF
# first review: resolves, finds and verifies the signature, fills the caches
curl -s --cacert "$tmp/ca.pem" --data @"$tmp/review.json" "$url" | grep -q '"allowed":true' ||
	{ echo "the warm-up review was not allowed"; cat "$tmp/log"; exit 1; }


echo "webhook: $(nproc) CPUs here, load average $(cut -d' ' -f1-3 /proc/loadavg)${RT:+, real-time priority}; image $R/bench/cache:v1 resolved and verified once, then cached"
for rate in 500 1000; do
	for i in $(seq 1 "$RUNS"); do
		wb_open_run "$wh_pid" "$hport" mutate "$tmp" "open loop $rate/s run $i" \
			$RT "$load" "$url" "$tmp/ca.pem" "$tmp/review.json" "$rate" "$SECS" 16 1
	done
done
cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("$tmp/review.json"))
wrk.body = f:read("a")
f:close()
EOF
for i in $(seq 1 "$RUNS"); do
	c0=$(wb_cpu_ticks "$wh_pid") d0=$(wb_allowed "$hport" mutate)
	out=$($RT wrk -t2 -c16 -d"${SECS}s" --latency -s "$tmp/post.lua" "$url")
	c1=$(wb_cpu_ticks "$wh_pid") d1=$(wb_allowed "$hport" mutate)
	rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
	p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
	p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
	non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
	us=$(wb_cpu_per_review "$c0" "$c1" "$d0" "$d1")
	echo "closed loop wrk -t2 -c16 run $i: ${rps} reviews/s  p50 $p50  p99 $p99  non-2xx ${non2xx:-0}  webhook CPU ${us} us/review"
done
rss=$(awk '/VmHWM/ {print $2, $3}' "/proc/$wh_pid/status")
echo "webhook peak RSS: $rss"
