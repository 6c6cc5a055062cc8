# Polling helpers for shell end-to-end tests: source this file.
#   wait_for SECONDS cmd...   poll (every 0.1 s) until cmd succeeds; 1 on timeout
#   is WANT cmd...            succeeds when cmd prints exactly WANT
wait_for() {
	local n=$(($1 * 10))
	shift
	while [ $n -gt 0 ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
		n=$((n - 1))
	done
	return 1
}
is() { [ "$("${@:2}")" = "$1" ]; }
