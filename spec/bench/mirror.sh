#!/usr/bin/env bash
# N nodes (default 20) pulling the same cache (default 1024 MB) at once from
# one origin registry: each node is a `gkm up` with its own state directory
# and content store (standalone mode runs the agent's pull code). Three
# rounds, each from empty stores:
#   direct       every node pulls from the origin
#   mirror-cold  the nodes' hosts.toml sends digests and tags to a
#                pull-through cache (docker-registry with proxy.remoteurl)
#                that starts empty
#   mirror-warm  the same cache, already holding the image
#   waves-cold   the cold mirror again, with N `gkm agent`s and the operator
#                on one real control plane (GKM_KUBE_ASSETS; left out with the
#                reason where it is unset): a cache pulled through a mirror
#                rolls out with a first wave of one node, which fills the
#                mirror before the others come
# Figures: wall time from start until every node reports the cache Ready,
# and the bytes the origin served (summed from its access log). Printed,
# never asserted.
#
#   GKM_BENCH_NODES=N  GKM_BENCH_MIRROR_MB=MB  GKM_BENCH_DIR (default $GKM_BUILD/bench)
#   GKM_BENCH_MIRROR_ROUNDS="direct mirror-cold mirror-warm waves-cold" (the default: all)
#   KEEP=1 keeps the last round's node directories and the run directory
set -u
cd "$GKM_ROOT"
. spec/lib/registry.sh
. spec/lib/kubeenv.sh
G=$GKM_BIN
N=${GKM_BENCH_NODES:-20}
MB=${GKM_BENCH_MIRROR_MB:-1024}
B=${GKM_BENCH_DIR:-$GKM_BUILD/bench}
mkdir -p "$B"
RUN=$(mktemp -d "$B/mirror.XXXXXX")
PIDS=""
stop_nodes() {
	local p
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	for p in $PIDS; do wait "$p" 2>/dev/null; done
	PIDS=""
}
ROUNDS=${GKM_BENCH_MIRROR_ROUNDS:-direct mirror-cold mirror-warm waves-cold}
trap 'stop_nodes; kubeenv_stop; registry_stop_all; [ -n "${KEEP:-}" ] || rm -rf "$RUN"' EXIT
command -v docker-registry >/dev/null || { echo "mirror.sh: docker-registry missing, benchmark skipped"; exit 0; }
need=$(((N + 3) * MB * 12 / 10))
avail=$(($(df -Pm "$B" | awk 'NR==2 {print $4}')))
if [ "$avail" -lt "$need" ]; then
	echo "mirror.sh: $avail MB free in $B, $need MB needed ($N nodes x $MB MB); set GKM_BENCH_MIRROR_MB lower"
	exit 0
fi

# the cache: the T4 fixture's kernels plus incompressible binaries up to MB
FX=spec/fixtures/caches/triton/cuda-sm75-vector-add
cp -r "$FX" "$RUN/cache"
hd=$(ls "$RUN/cache")
i=0
while [ $((i * 64)) -lt "$MB" ]; do
	head -c $((64 << 20)) /dev/urandom >"$RUN/cache/$hd/blob$i.cubin"
	i=$((i + 1))
done

REGISTRY_LOG_ACCESSLOG_DISABLED=false registry_start origin || exit 1
O=$REG_origin_ADDR
$G cache build "$RUN/cache" -t "$O/bench/big:v1" >/dev/null 2>&1 || { echo "mirror.sh: build failed"; exit 1; }
rm -rf "$RUN/cache"
layer_mb=$(du -sm "$REG_origin_DIR" | cut -f1)
REGISTRY_PROXY_REMOTEURL=http://$O registry_start mirror || exit 1
M=$REG_mirror_ADDR
mkdir -p "$RUN/certs.d/$O"
printf 'server = "http://%s"\n[host."http://%s"]\ncapabilities = ["pull", "resolve"]\n' "$O" "$M" \
	>"$RUN/certs.d/$O/hosts.toml"

origin_bytes() { # bytes in the origin's access log so far
	awk '/"(GET|HEAD) \/v2\// { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9][0-9][0-9]$/ && $(i+1) ~ /^[0-9]+$/) { s += $(i+1); break } } END { printf "%.0f\n", s }' \
		"$_REG_TMP/origin/log"
}

# the cache, as each round applies it
printf 'apiVersion: gkm.io/v1alpha1\nkind: ClusterGKMCache\nmetadata: {name: big}\nspec: {image: "%s/bench/big:v1"}\n' "$O" \
	>"$RUN/cache.yaml"

start_up_nodes() { # [extra gkm up flags]: N standalone nodes, each with its own state
	local k
	for k in $(seq 1 "$N"); do
		$G apply --state "$RUN/nodes/$k" -f "$RUN/cache.yaml" >/dev/null 2>&1
	done
	sync
	for k in $(seq 1 "$N"); do
		$G up --state "$RUN/nodes/$k" --node "node-$k" --gpu-source file \
			--gpu-file spec/fixtures/gpu/inventory/t4.json --poll-ms 200 --verify-enabled false --health-listen "" \
			"$@" >"$RUN/nodes/$k.log" 2>&1 &
		PIDS="$PIDS $!"
	done
}

start_cluster_nodes() { # [extra gkm agent flags]: N agents and the operator on one control plane
	local k
	for k in $(seq 1 "$N"); do
		mkdir -p "$RUN/nodes/$k/run"
		$G agent --node "node-$k" --kubeconfig "$KUBECONFIG" --gpu-file spec/fixtures/gpu/inventory/t4.json \
			--root "$RUN/nodes/$k" --run-dir "$RUN/nodes/$k/run" --verify-enabled false --health-listen "" \
			"$@" >"$RUN/nodes/$k.log" 2>&1 &
		PIDS="$PIDS $!"
	done
	$G operator --kubeconfig "$KUBECONFIG" --leader-elect false --verify-enabled false --resolve-digests true \
		--health-listen "" >"$RUN/nodes/operator.log" 2>&1 &
	PIDS="$PIDS $!"
	kubectl apply -f "$RUN/cache.yaml" >/dev/null
}

round() { # name start-function [extra flags]: N nodes from empty stores; prints the figures
	local name=$1 start=$2 k t0 t1 b0 b1 ready
	shift 2
	case " $ROUNDS " in *" $name "*) ;; *) return ;; esac
	rm -rf "$RUN/nodes"
	mkdir -p "$RUN/nodes"
	b0=$(origin_bytes)
	t0=$(date +%s.%N)
	"$start" "$@"
	while :; do
		ready=0
		for k in $(seq 1 "$N"); do
			grep -q '"state": *"Ready"' "$RUN/nodes/$k/caches/_cluster/big/ready.json" 2>/dev/null &&
				ready=$((ready + 1))
		done
		[ "$ready" -eq "$N" ] && break
		if awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { exit !(a - b > 1800) }'; then
			echo "$name: only $ready of $N nodes Ready after 30 minutes"
			break
		fi
		sleep 0.5
	done
	t1=$(date +%s.%N)
	b1=$(origin_bytes)
	stop_nodes
	awk -v n="$name" -v N="$N" -v mb="$layer_mb" -v t0="$t0" -v t1="$t1" -v b0="$b0" -v b1="$b1" 'BEGIN {
		printf "%-12s %3d nodes x %5d MB layer: all Ready in %7.1f s; origin served %8.1f MB (%.2f x the image)\n",
			n, N, mb, t1 - t0, (b1 - b0) / 1048576, (b1 - b0) / 1048576 / mb }'
	[ -z "${KEEP:-}" ] || cp "$_REG_TMP/origin/log" "$RUN/origin-$name.log"
	[ -n "${KEEP:-}" ] || rm -rf "$RUN/nodes"
}

round direct start_up_nodes
round mirror-cold start_up_nodes --registry-hosts-dir "$RUN/certs.d"
round mirror-warm start_up_nodes --registry-hosts-dir "$RUN/certs.d"
case " $ROUNDS " in *" waves-cold "*)
	if why=$(kubeenv_unavailable); then
		echo "waves-cold: skipped: $why"
	else
		# a cold mirror again: a new pull-through cache with empty storage
		registry_stop mirror
		REGISTRY_PROXY_REMOTEURL=http://$O registry_start cold || exit 1
		M=$REG_cold_ADDR
		printf 'server = "http://%s"\n[host."http://%s"]\ncapabilities = ["pull", "resolve"]\n' "$O" "$M" \
			>"$RUN/certs.d/$O/hosts.toml"
		kubeenv_start || { echo "waves-cold: the control plane did not start"; exit 1; }
		for k in $(seq 1 "$N"); do kubeenv_ctl node "node-$k" >/dev/null; done
		round waves-cold start_cluster_nodes --registry-hosts-dir "$RUN/certs.d"
	fi
	;;
esac
