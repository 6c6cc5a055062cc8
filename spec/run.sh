#!/usr/bin/env bash
# Runs every test and ends with one line "N passed, N failed[, N skipped]".
#
# Every test program speaks TAP on stdout ("ok N - name", "not ok N - name",
# "ok N - name # SKIP reason"):
#   - C unit tests: $BUILD/unit/test_* (cmocka, sanitizer build)
#   - Lua specs:    spec/lua/*_spec.lua (busted, through the real engine)
#   - end-to-end:   spec/e2e/*.sh and spec/e2e/*.py (executable, TAP);
#                   GKM_BIN is the binary, GKM_BIN_SAN the same built with ASan/UBSan
# A program that exits non-zero without reporting a failure counts as one
# failure, so a crash is never silent. Set GKM_TEST_FILTER to a substring to
# run only matching programs.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export GKM_BIN=$PWD/$BUILD/gkm GKM_BUILD=$PWD/$BUILD GKM_ROOT=$PWD
# the sanitizer build of gkm, for tests that feed it bad input
export GKM_BIN_SAN=$PWD/$BUILD/gkm-san
export CMOCKA_MESSAGE_OUTPUT=TAP
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
logdir=$(mktemp -d "${TMPDIR:-/tmp}/gkm-test.XXXXXX")
passed=0 failed=0 skipped=0
failures=()

run_one() { # name, command...
	local name=$1
	shift
	case "$name" in *"${GKM_TEST_FILTER:-}"*) ;; *) return ;; esac
	local log="$logdir/$(echo "$name" | tr '/ ' '__').log"
	local start=$SECONDS
	"$@" >"$log" 2>&1 </dev/null
	local rc=$?
	local p f s
	p=$(grep -cE '^[[:space:]]*ok [0-9]+' "$log" | head -1)
	# cmocka reports a skipped test as "not ok N - name # SKIP"
	s=$(grep -cE '^[[:space:]]*(not )?ok [0-9]+.*# (SKIP|skip)' "$log" | head -1)
	f=$(grep -E '^[[:space:]]*not ok [0-9]+' "$log" | grep -cvE '# (SKIP|skip)' | head -1)
	p=$((p - $(grep -cE '^[[:space:]]*ok [0-9]+.*# (SKIP|skip)' "$log")))
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
		f=1
		echo "not ok - $name exited with status $rc" >>"$log"
	fi
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
	printf '%-48s %4d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" $((SECONDS - start))
	grep -E '^[[:space:]]*(not )?ok [0-9]+.*# (SKIP|skip)' "$log" | sed 's/^/    /'
	if [ "$f" -gt 0 ]; then
		failures+=("$name")
		echo "---- $name (failures and the output around them) ----"
		grep -nE -B3 -A25 '^[[:space:]]*not ok [0-9]+' "$log" | grep -vE '# (SKIP|skip)' | head -150
		[ "$rc" -ne 0 ] && tail -30 "$log"
		echo "----"
	fi
}

for t in "$BUILD"/unit/test_*; do
	[ -x "$t" ] && run_one "unit/$(basename "$t")" "$t"
done

for s in spec/lua/*_spec.lua; do
	[ -e "$s" ] || continue
	run_one "lua/$(basename "$s")" lua5.4 /usr/bin/busted --lpath='spec/lua/?.lua;lua/?.lua' \
		--cpath="$BUILD/spec/?.so" -o TAP "$s"
done

for e in spec/e2e/*.sh spec/e2e/*.py; do
	[ -x "$e" ] || continue
	run_one "e2e/$(basename "$e")" "$e"
done

if [ ${#failures[@]} -gt 0 ]; then
	echo "failed: ${failures[*]} (logs in $logdir)"
else
	rm -rf "$logdir"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
