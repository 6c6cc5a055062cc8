# TAP helpers for shell end-to-end tests: source this file.
#   ok COND_EXIT_CODE "name" ; check "name" cmd args... ; skip "name" "reason"
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
skip() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1 # SKIP $2"; }
finish() { echo "1..$TAP_N"; [ "$TAP_FAILED" -eq 0 ]; }
