#!/usr/bin/env bash
# Kubernetes client benchmark: informer list and watch throughput and memory
# per cached object with 10,000 GKMCacheNode-sized objects (see kube_bench.py).
# Reported, never asserted. KUBE_BENCH_OBJECTS / _RUNS / _UPDATES / _FIREHOSE
# change the sizes.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
export GKM_ROOT=$PWD GKM_BUILD=$PWD/$BUILD
make --no-print-directory "$BUILD/spec/kubetool-opt" >/dev/null
exec /usr/bin/python3 spec/bench/kube_bench.py
