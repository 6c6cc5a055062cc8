# TAP helpers for shell end-to-end tests: source this file.
#   ok COND_EXIT_CODE "name" ; check "name" cmd args... ; skip "name" "reason"
#   expect STATUS "name" ERE cmd args...   the exit status and what it printed
#   finish   (prints the plan; exits non-zero if anything failed)
TAP_N=0
TAP_FAILED=0
ok() { # status name
	TAP_N=$((TAP_N + 1))
	if [ "$1" -eq 0 ]; then echo "ok $TAP_N - $2"; else echo "not ok $TAP_N - $2"; TAP_FAILED=$((TAP_FAILED + 1)); fi
}
check() { # name cmd...
	local name=$1
	shift
	"$@"
	ok $? "$name"
}
expect() { # status name pattern cmd...: passes when cmd exits with status and its
	# output (stdout and stderr, kept in $TAP_OUT where that is set) matches
	local want=$1 name=$2 pat=$3 out=${TAP_OUT:-$(mktemp "${TMPDIR:-/tmp}/tap-out.XXXXXX")}
	shift 3
	"$@" >"$out" 2>&1
	local rc=$?
	if [ $rc -eq "$want" ] && grep -qE "$pat" "$out"; then
		ok 0 "$name"
	else
		ok 1 "$name"
		echo "# exit $rc (wanted $want), output:"
		sed 's/^/#   /' "$out" | head -12
	fi
	[ -n "${TAP_OUT:-}" ] || rm -f "$out"
}
skip() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1 # SKIP $2"; }
finish() { echo "1..$TAP_N"; [ "$TAP_FAILED" -eq 0 ]; }
