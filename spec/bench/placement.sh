#!/usr/bin/env bash
# Pod admission with placement on: the gkm webhook with --pod-placement,
# watching 200 GKMCaches on a real kube-apiserver (GKM_KUBE_ASSETS), answers
# AdmissionReviews for Pods over HTTPS on loopback at a fixed 200 pods/s
# (spec/bench/review_load.c: open loop, latency from the moment each request
# was due, 16 kept-alive verified TLS connections), for
#  - a pod mounting a cache through a csi.gkm.io volume (placement.lua, the
#    annotation, the patch, an Event noted), and
#  - a pod whose image volume names a cache's image (the same, plus the image
#    verified: tag resolution and signature verdict cached after the first).
# Also the webhook's own view (its latency histogram for endpoint "pods"), its
# CPU time per review and peak RSS. Figures are printed, never asserted. Runs
# are bounded: GKM_BENCH_RUNS (default 3) of GKM_BENCH_SECONDS (default 10).
set -eu
cd "$GKM_ROOT"
. spec/lib/registry.sh
. spec/lib/kubeenv.sh
. spec/lib/webhook_bench.sh
RUNS=${GKM_BENCH_RUNS:-3}
SECS=${GKM_BENCH_SECONDS:-10}
RATE=200
CACHES=200
G=$GKM_BIN
if why=$(kubeenv_unavailable); then
	echo "placement: skipped: $why"
	exit 0
fi
tmp=$(mktemp -d)
wh_pid=""
cleanup() {
	set +e # stopping what ran is not a failure of the benchmark
	[ -n "$wh_pid" ] && kill "$wh_pid" 2>/dev/null && wait "$wh_pid" 2>/dev/null
	registry_stop_all
	kubeenv_stop
	rm -rf "$tmp"
}
trap cleanup EXIT

wb_build_load

kubeenv_start >/dev/null
trap cleanup EXIT # kubeenv_start installed its own; ours also stops it
kubectl apply --server-side -f charts/gkm/crds >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f charts/gkm/crds >/dev/null
kubectl create namespace bench >/dev/null
kubeenv_ctl cert webhook 127.0.0.1 >/dev/null

# a signed cache image in a real registry
wb_signed_image "$tmp"

# 200 caches, each Ready on 2 of 3 nodes (the status the operator writes)
/usr/bin/python3 - "$R" "$CACHES" >"$tmp/caches.json" <<'EOF'
import json, sys
reg, n = sys.argv[1], int(sys.argv[2])
items = [{"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
          "metadata": {"name": "cache-%d" % i, "namespace": "bench"},
          "spec": {"image": "%s/bench/%s:v1" % (reg, "cache" if i == 0 else "c%d" % i)}}
         for i in range(n)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
EOF
kubectl create -f "$tmp/caches.json" >/dev/null
for i in $(seq 0 $((CACHES - 1))); do
	echo "cache-$i"
done | xargs -P 4 -I{} kubectl patch gkmc {} -n bench --subresource=status --type=merge \
	-p '{"status":{"readyNodes":2,"totalNodes":3}}' >/dev/null

$G webhook --tls-cert "$KUBEENV_DIR/pki/webhook.crt" --tls-key "$KUBEENV_DIR/pki/webhook.key" \
	--trust-dir "$tmp/trust" --listen 127.0.0.1:0 --health-listen 127.0.0.1:0 --log-format json \
	--resolve-ttl 3600 --plain-http --pod-placement true --kubeconfig "$KUBECONFIG" 2>"$tmp/log" &
wh_pid=$!
port="" hport=""
for _ in $(seq 1 200); do
	port=$(grep -o '"https_port":"[0-9]*"' "$tmp/log" | grep -o '[0-9]*' || true)
	hport=$(grep -o '"health_port":"[0-9]*"' "$tmp/log" | grep -o '[0-9]*' || true)
	[ -n "$hport" ] && curl -sf "http://127.0.0.1:$hport/readyz" >/dev/null && break
	sleep 0.05
done
curl -sf "http://127.0.0.1:$hport/readyz" >/dev/null || { echo "webhook not ready:"; cat "$tmp/log"; exit 1; }
url=https://127.0.0.1:$port/mutate-pods

review() { # name volume-json
	cat <<EOF
{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"0b9e7d4c-bench",
"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},
"namespace":"bench","operation":"CREATE","object":{"apiVersion":"v1","kind":"Pod",
"metadata":{"generateName":"vllm-","namespace":"bench","labels":{"app":"vllm"}},
"spec":{"containers":[{"name":"vllm","image":"registry.example.com/vllm:latest",
"volumeMounts":[{"name":"kernels","mountPath":"/cache"}]}],
"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
{"matchExpressions":[{"key":"gpu","operator":"In","values":["h100"]}]}]}}},
"volumes":[$2]}}}}
EOF
}
review csi '{"name":"kernels","csi":{"driver":"csi.gkm.io","volumeAttributes":{"cacheName":"cache-7"}}}' >"$tmp/csi.json"
review image "{\"name\":\"kernels\",\"image\":{\"reference\":\"$R/bench/cache:v1\"}}" >"$tmp/image.json"
for b in csi image; do # warm up: the image's tag and signatures are checked once
	curl -s --cacert "$KUBEENV_CA" --data @"$tmp/$b.json" "$url" | grep -q '"allowed":true' ||
		{ echo "the warm-up review ($b) was not allowed"; cat "$tmp/log"; exit 1; }
done


echo "placement: $(nproc) CPUs here, load average $(cut -d' ' -f1-3 /proc/loadavg); $CACHES GKMCaches watched on kube-apiserver; $RATE pods/s"
for b in csi image; do
	for i in $(seq 1 "$RUNS"); do
		wb_open_run "$wh_pid" "$hport" pods "$tmp" "$b volume, run $i" \
			"$WB_LOAD" "$url" "$KUBEENV_CA" "$tmp/$b.json" "$RATE" "$SECS" 16 1
	done
done
events=$(curl -s "http://127.0.0.1:$hport/metrics" | awk '/^gkm_webhook_events_total/ {print $1 "=" $2}' | tr '\n' ' ')
echo "Events about placements: $events"
echo "webhook peak RSS: $(awk '/VmHWM/ {print $2, $3}' "/proc/$wh_pid/status")"
