#!/usr/bin/env bash
# Runs every test and ends with one line "N passed, N failed[, N skipped]".
#
# Every test program speaks TAP on stdout ("ok N - name", "not ok N - name",
# "ok N - name # SKIP reason"):
#   - end-to-end:   spec/e2e/*.sh and spec/e2e/*.py (executable, TAP);
#                   GKM_BIN is the binary, GKM_BIN_SAN the same built with ASan/UBSan
#   - Lua specs:    spec/lua/*_spec.lua (busted, through the real engine)
#   - C unit tests: $BUILD/unit/test_* (cmocka, sanitizer build)
# A program that exits non-zero without reporting a failure counts as one
# failure, so a crash is never silent. Set GKM_TEST_FILTER to a substring to
# run only matching programs.
#
# Programs run GKM_TEST_JOBS at a time (default: two per CPU, at most 8), the long
# end-to-end ones first; each reports as it ends. Every program works in its
# own temporary directories and on ports it picks free, so they do not meet;
# the ones that start a real kubelet (whose directories are fixed on the host)
# run one at a time.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export GKM_BIN=$PWD/$BUILD/gkm GKM_BUILD=$PWD/$BUILD GKM_ROOT=$PWD
# the sanitizer build of gkm, for tests that feed it bad input
export GKM_BIN_SAN=$PWD/$BUILD/gkm-san
export CMOCKA_MESSAGE_OUTPUT=TAP
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# at most 8: each end-to-end test may run its own API server, etcd and registry
jobs_max=${GKM_TEST_JOBS:-$((2 * $(nproc) < 8 ? 2 * $(nproc) : 8))}
logdir=$(mktemp -d "${TMPDIR:-/tmp}/gkm-test.XXXXXX")
passed=0 failed=0 skipped=0
failures=()
queue=()              # "name<TAB>group<TAB>command words..." not yet started
declare -A running=() # id -> queue entry
next_id=0
# each program's subshell writes its id here as it ends
mkfifo "$logdir/ended"
exec 3<>"$logdir/ended"
declare -A busy=()    # group -> 1 while one of its programs runs

add() { # name, command...
	local name=$1 group=-
	shift
	case "$name" in *"${GKM_TEST_FILTER:-}"*) ;; *) return ;; esac
	# a real kubelet keeps its state in fixed host directories
	[ -f "$1" ] && grep -q 'KubeNode(' "$1" && group=kubelet
	local IFS=$'\t'
	queue+=("$name"$'\t'"$group"$'\t'"$*")
}

logof() { echo "$logdir/$(echo "$1" | tr '/ ' '__').log"; }

start() { # queue entry
	local name group cmd
	IFS=$'\t' read -r name group cmd <<<"$1"
	local log
	log=$(logof "$name")
	local IFS=$'\t'
	# shellcheck disable=SC2086 # the command's words are tab-separated
	(
		set -f
		s=$SECONDS
		$cmd >"$log" 2>&1 </dev/null 3>&-
		echo "$? $((SECONDS - s))" >"$log.rc"
		echo "$next_id" >&3
	) &
	running[$next_id]=$1
	next_id=$((next_id + 1))
	[ "$group" = - ] || busy[$group]=1
}

report() { # queue entry of a program that ended
	local name group cmd
	IFS=$'\t' read -r name group cmd <<<"$1"
	[ "$group" = - ] || unset "busy[$group]"
	local log rc secs p f s
	log=$(logof "$name")
	read -r rc secs <"$log.rc" 2>/dev/null || { rc=255 secs=0; }
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
	printf '%-48s %4d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" "$secs"
	grep -E '^[[:space:]]*(not )?ok [0-9]+.*# (SKIP|skip)' "$log" | sed 's/^/    /'
	if [ "$f" -gt 0 ]; then
		failures+=("$name")
		echo "---- $name (failures and the output around them) ----"
		grep -nE -B3 -A25 '^[[:space:]]*not ok [0-9]+' "$log" | grep -vE '# (SKIP|skip)' | head -150
		[ "$rc" -ne 0 ] && tail -30 "$log"
		echo "----"
	fi
}

for e in spec/e2e/*.sh spec/e2e/*.py; do
	[ -x "$e" ] && add "e2e/$(basename "$e")" "$e"
done
for s in spec/lua/*_spec.lua; do
	[ -e "$s" ] && add "lua/$(basename "$s")" lua5.4 /usr/bin/busted --lpath='spec/lua/?.lua;lua/?.lua' \
		--cpath="$BUILD/spec/?.so" -o TAP "$s"
done
for t in "$BUILD"/unit/test_*; do
	[ -x "$t" ] && add "unit/$(basename "$t")" "$t"
done

while [ ${#queue[@]} -gt 0 ] || [ ${#running[@]} -gt 0 ]; do
	# start the first programs whose group is free, while there is room
	rest=()
	for q in "${queue[@]}"; do
		IFS=$'\t' read -r _ group _ <<<"$q"
		if [ ${#running[@]} -lt "$jobs_max" ] && { [ "$group" = - ] || [ -z "${busy[$group]:-}" ]; }; then
			start "$q"
		else
			rest+=("$q")
		fi
	done
	queue=("${rest[@]}")
	[ ${#running[@]} -gt 0 ] || break
	read -r done_id <&3
	report "${running[$done_id]}"
	unset "running[$done_id]"
done

wait
if [ ${#failures[@]} -gt 0 ]; then
	echo "failed: ${failures[*]} (logs in $logdir)"
else
	rm -rf "$logdir"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
