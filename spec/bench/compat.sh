#!/usr/bin/env bash
# Compat policy evaluation through the engine: 1,000 cache targets against
# 8 GPUs (spec/bench/compat_bench.c). Figures only, never asserted.
set -eu
cd "$GKM_ROOT"
make -s --no-print-directory BUILD="${BUILD:-build}" compat-bench >/dev/null
exec "$GKM_BUILD/spec/compat_bench"
