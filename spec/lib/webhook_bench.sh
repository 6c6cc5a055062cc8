# Helpers of the webhook benchmarks (spec/bench/webhook.sh, placement.sh):
# source this. The load generator, and the webhook's own view of a run from
# its /metrics: the latency histogram, the answers counted, its CPU time.

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
