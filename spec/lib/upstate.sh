# Standalone mode (`gkm up`) seen the way a user sees it, for shell tests:
# source this file (after tap.sh and registry.sh; GKM_BIN names gkm).
#
#   up_start STATE FLAGS...       gkm up on the state directory STATE, node
#                                 node-1, log in $UP_LOG; up_stop stops it
#   node_entry NS NAME [EXPR]     the cache's entry on node-1 as "state/reason",
#                                 or a Python expression on it (e)
#   cache_condition NS NAME TYPE  "status/reason" of a condition of the cache
#   sample N WANT CMD...          N readings of CMD, 0.2 s apart, each WANT;
#                                 prints every other reading (a status that
#                                 flickers is a bug)
#   digest_of FILE                the first sha256 digest a gkm command printed
UP_PID=""
UP_STATE=""
UP_LOG=""

up_start() { # state flags...
	UP_STATE=$1
	UP_LOG=$1.log
	shift
	"$GKM_BIN" up --state "$UP_STATE" --node node-1 --poll-ms 100 "$@" >>"$UP_LOG" 2>&1 &
	UP_PID=$!
}

up_stop() { # SIGTERM, then SIGKILL after 30 s (a daemon stuck in a loop ends too)
	local i
	if [ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null; then
		for i in $(seq 1 300); do
			kill -0 "$UP_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$UP_PID" 2>/dev/null
		wait "$UP_PID" 2>/dev/null
	fi
	UP_PID=""
}

node_entry() { # ns name [expression on e]
	"$GKM_BIN" get --state "$UP_STATE" gkmcn node-1 -n "$1" -o json 2>/dev/null |
		/usr/bin/python3 -c "import json,sys
e = json.load(sys.stdin)['status']['caches']['$2']
print(${3:-e['state'] + '/' + e.get('reason', '')})" 2>/dev/null
}

cache_condition() { # ns name type
	"$GKM_BIN" get --state "$UP_STATE" gkmc "$2" -n "$1" -o json 2>/dev/null |
		/usr/bin/python3 -c "import json,sys
c = [c for c in json.load(sys.stdin)['status']['conditions'] if c['type'] == '$3'][0]
print(c['status'] + '/' + c['reason'])" 2>/dev/null
}

sample() { # n want cmd...
	local n=$1 want=$2 got i bad=0
	shift 2
	for i in $(seq 1 "$n"); do
		got=$("$@")
		if [ "$got" != "$want" ]; then
			echo "#   sample $i: '$got'"
			bad=1
		fi
		sleep 0.2
	done
	return $bad
}

digest_of() { sed -n 's/.*@\(sha256:[0-9a-f]\{64\}\).*/\1/p' "$1" | head -1; }
