#!/usr/bin/env bash
# Signature verification cost per image: by key (simple signing, DSSE
# bundle) beside keyless (cosign's annotations with a Fulcio certificate and
# a Rekor entry; a bundle with an inclusion proof; with an SCT), measured in
# process by spec/bench/sig_bench.c. Figures only, never asserted.
set -eu
cd "$GKM_ROOT"
make -s --no-print-directory BUILD="${BUILD:-build}" sig-bench >/dev/null
exec "$GKM_BUILD/spec/sig_bench" "${GKM_BENCH_SIG_ITERATIONS:-300}"
