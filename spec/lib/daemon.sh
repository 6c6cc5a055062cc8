# Daemons a shell test starts in the background, kept by name: source this.
#
#   gkm agent ... & PID[agent]=$!
#   daemon_stop [-SIGNAL] NAME...   signal them (SIGTERM unless told), reap
#                                   them and forget them; fails when one
#                                   stopped with SIGTERM did not exit 0, and
#                                   adds its name to DAEMON_UNCLEAN
#   daemon_stop_all                 every one still kept (for the EXIT trap)
declare -gA PID
DAEMON_UNCLEAN=""

daemon_stop() {
	local sig=TERM n p rc=0
	case ${1:-} in -*) sig=${1#-} && shift ;; esac
	for n in "$@"; do [ -n "${PID[$n]:-}" ] && kill "-$sig" "${PID[$n]}" 2>/dev/null; done
	for n in "$@"; do
		p=${PID[$n]:-}
		[ -n "$p" ] || continue
		if ! wait "$p" 2>/dev/null && [ "$sig" = TERM ]; then
			rc=1
			DAEMON_UNCLEAN="$DAEMON_UNCLEAN $n"
		fi
		PID[$n]=""
	done
	return $rc
}

daemon_stop_all() { daemon_stop "${!PID[@]}"; }
