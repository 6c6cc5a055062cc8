# Helpers of the webhook benchmarks (spec/bench/webhook.sh, placement.sh):
# source this (after spec/lib/registry.sh). The signed image reviewed, the
# load generator, and the webhook's own view of a run from its /metrics: the
# latency histogram, the answers counted, its CPU time.

# wb_signed_image DIR: a real registry holding the image R/bench/cache:v1,
# built from a fixture cache and signed; sets R to the registry and leaves
# the public key in DIR/trust (for --trust-dir).
wb_signed_image() {
	registry_start bench
	R=$REG_bench_ADDR
	$GKM_BIN cache build spec/fixtures/caches/triton/cuda-sm75-vector-add -t "$R/bench/cache:v1" >/dev/null
	$GKM_BIN cache keygen --output-key-prefix "$1/key" >/dev/null
	$GKM_BIN cache sign "$R/bench/cache:v1" --key "$1/key.key" >/dev/null
	mkdir "$1/trust"
	cp "$1/key.pub" "$1/trust/"
}

# Build spec/bench/review_load.c; sets WB_LOAD to it.
wb_build_load() {
	mkdir -p "$GKM_BUILD/bench"
	cc -O2 -o "$GKM_BUILD/bench/review_load" spec/bench/review_load.c -lcurl
	WB_LOAD=$GKM_BUILD/bench/review_load
}

# wb_cpu_ticks PID: user + system CPU ticks of a process so far.
wb_cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wb_hist HEALTH_PORT ENDPOINT: the review latency histogram's buckets.
wb_hist() { curl -s "http://127.0.0.1:$1/metrics" | grep "^gkm_webhook_review_seconds_bucket{endpoint=\"$2\""; }

# wb_allowed HEALTH_PORT ENDPOINT: reviews allowed so far.
wb_allowed() {
	curl -s "http://127.0.0.1:$1/metrics" |
		awk -v ep="$2" '$0 ~ "^gkm_webhook_decisions_total\\{endpoint=\"" ep "\",result=\"allowed\"" {s += $2} END {print s + 0}'
}

# wb_cpu_per_review TICKS0 TICKS1 REVIEWS0 REVIEWS1: microseconds of CPU per review.
wb_cpu_per_review() {
	awk -v c=$(($2 - $1)) -v n=$(($4 - $3)) -v hz="$(getconf CLK_TCK)" \
		'BEGIN { if (n) printf "%.0f", c / hz / n * 1e6; else print "?" }'
}

# wb_server_view BEFORE AFTER: p50 and p99 of the reviews between two
# wb_hist snapshots, interpolated in the histogram's buckets, and the share
# answered within 5 ms.
wb_server_view() {
	paste "$1" "$2" | awk '{
		split($1, a, "le=\""); split(a[2], b, "\""); le[NR] = b[1]; n[NR] = $4 - $2
	} END {
		total = n[NR]; if (!total) { print "server: no reviews"; exit }
		for (q = 1; q <= 2; q++) {
			want = (q == 1 ? 0.50 : 0.99) * total; prev = 0; lo = 0
			for (i = 1; i <= NR; i++) {
				if (n[i] >= want) {
					hi = le[i] == "+Inf" ? lo : le[i]
					v[q] = lo + (hi - lo) * (want - prev) / (n[i] - prev > 0 ? n[i] - prev : 1); break
				}
				prev = n[i]; lo = le[i]
			}
		}
		for (i = 1; i <= NR; i++) if (le[i] == "0.005") w5 = n[i]
		printf "server p50 %.3f ms  p99 %.3f ms  within 5 ms %.2f%%", v[1] * 1000, v[2] * 1000, 100 * w5 / total
	}'
}

# wb_open_run PID HEALTH_PORT ENDPOINT DIR LABEL COMMAND...: one run of the
# load generator COMMAND against the webhook PID; prints LABEL, what the
# load generator measured, the webhook's CPU per review and its own view
# (DIR holds the histogram snapshots).
wb_open_run() {
	local pid=$1 hport=$2 ep=$3 dir=$4 label=$5 c0 c1 d0 d1 out
	shift 5
	c0=$(wb_cpu_ticks "$pid") d0=$(wb_allowed "$hport" "$ep")
	wb_hist "$hport" "$ep" >"$dir/h0"
	out=$("$@")
	wb_hist "$hport" "$ep" >"$dir/h1"
	c1=$(wb_cpu_ticks "$pid") d1=$(wb_allowed "$hport" "$ep")
	echo "$label: $out  webhook CPU $(wb_cpu_per_review "$c0" "$c1" "$d0" "$d1") us/review"
	echo "    $(wb_server_view "$dir/h0" "$dir/h1")"
}
