#!/usr/bin/env bash
# `make bench`: runs every spec/bench/*.sh and *.py benchmark in turn. Figures
# are printed, never asserted. GKM_BENCH_FILTER selects by substring.
set -u
cd "$(dirname "$0")/../.."
export BUILD=${BUILD:-build}
export GKM_BIN=$PWD/$BUILD/gkm GKM_BUILD=$PWD/$BUILD GKM_ROOT=$PWD
status=0
for b in spec/bench/*.sh spec/bench/*.py; do
	[ -x "$b" ] || continue
	[ "$(basename "$b")" = run.sh ] && continue
	case "$b" in *"${GKM_BENCH_FILTER:-}"*) ;; *) continue ;; esac
	echo "=== $(basename "$b")"
	"$b" || { echo "benchmark $b failed"; status=1; }
done
exit $status
