# Start and stop the fault-injection API server (spec/kube/apiserver.py) from
# a shell test: source this.
#
#   kubeserver_start [apiserver flags...]   # HTTPS + token + gkm CRDs
#   kubectl get gkmc                        # KUBECONFIG points at it
#   kubeserver_curl POST /api/v1/namespaces -H 'Content-Type: application/json' \
#       -d '{"metadata": {"name": "team"}}'
#   kubeserver_control compact              # /_test/compact (watch 410s)
#   kubeserver_restart                      # same port, same objects
#   kubeserver_stop                         # also run by the EXIT trap it installs
#
# Sets KUBESERVER_DIR, KUBESERVER_PORT, KUBESERVER_URL, KUBESERVER_TOKEN,
# KUBESERVER_CA, KUBESERVER_PID and exports KUBECONFIG.
# KUBESERVER_TLS=0 serves plain HTTP; KUBESERVER_TOKEN= (empty) turns auth off.

KUBESERVER_ROOT=${GKM_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
KUBESERVER_PY=/usr/bin/python3
[ -x "$KUBESERVER_PY" ] || KUBESERVER_PY=python3
KUBESERVER_TOKEN=${KUBESERVER_TOKEN-gkm-test-token}
KUBESERVER_TLS=${KUBESERVER_TLS:-1}
KUBESERVER_PORT=0
KUBESERVER_PID=
KUBESERVER_ARGS=()

kubeserver_start() {
	[ -n "${KUBESERVER_DIR:-}" ] || KUBESERVER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gkm-kubeserver.XXXXXX")
	[ $# -gt 0 ] && KUBESERVER_ARGS=("$@")
	local args=(--port "$KUBESERVER_PORT" --port-file "$KUBESERVER_DIR/port" --crds "$KUBESERVER_ROOT/charts/gkm/crds"
		--kubeconfig "$KUBESERVER_DIR/kubeconfig" --state "$KUBESERVER_DIR/state.json")
	local scheme=http
	if [ "$KUBESERVER_TLS" = 1 ]; then
		args+=(--tls-dir "$KUBESERVER_DIR/tls")
		scheme=https
		KUBESERVER_CA=$KUBESERVER_DIR/tls/ca.crt
	fi
	[ -n "$KUBESERVER_TOKEN" ] && args+=(--token "$KUBESERVER_TOKEN")
	rm -f "$KUBESERVER_DIR/port"
	"$KUBESERVER_PY" "$KUBESERVER_ROOT/spec/kube/apiserver.py" "${args[@]}" "${KUBESERVER_ARGS[@]}" \
		>>"$KUBESERVER_DIR/apiserver.log" 2>&1 &
	KUBESERVER_PID=$!
	local i
	for i in $(seq 1 300); do
		[ -s "$KUBESERVER_DIR/port" ] && break
		if ! kill -0 "$KUBESERVER_PID" 2>/dev/null; then
			echo "# test API server exited:" >&2
			sed 's/^/# /' "$KUBESERVER_DIR/apiserver.log" >&2
			return 1
		fi
		sleep 0.1
	done
	[ -s "$KUBESERVER_DIR/port" ] || { echo "# test API server did not start" >&2; return 1; }
	KUBESERVER_PORT=$(cat "$KUBESERVER_DIR/port")
	KUBESERVER_URL=$scheme://127.0.0.1:$KUBESERVER_PORT
	export KUBECONFIG=$KUBESERVER_DIR/kubeconfig
	trap kubeserver_cleanup EXIT
}

kubeserver_stop() {
	if [ -n "$KUBESERVER_PID" ] && kill -0 "$KUBESERVER_PID" 2>/dev/null; then
		kill -TERM "$KUBESERVER_PID"
		local i
		for i in $(seq 1 100); do
			kill -0 "$KUBESERVER_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$KUBESERVER_PID" 2>/dev/null
		wait "$KUBESERVER_PID" 2>/dev/null
	fi
	KUBESERVER_PID=
}

kubeserver_restart() {
	kubeserver_stop
	kubeserver_start
}

kubeserver_cleanup() {
	kubeserver_stop
	[ -n "${KUBESERVER_DIR:-}" ] && rm -rf "$KUBESERVER_DIR"
}

# kubeserver_curl METHOD PATH [curl args...]: one authenticated request.
kubeserver_curl() {
	local method=$1 path=$2
	shift 2
	local auth=()
	[ -n "$KUBESERVER_TOKEN" ] && auth=(-H "Authorization: Bearer $KUBESERVER_TOKEN")
	local ca=()
	[ "$KUBESERVER_TLS" = 1 ] && ca=(--cacert "$KUBESERVER_CA")
	curl -sS -X "$method" "${ca[@]}" "${auth[@]}" "$@" "$KUBESERVER_URL$path"
}

# kubeserver_control WHAT [JSON]: fault, clear-faults, compact, close-watches,
# requests ({"since": SEQ, "path": SUBSTRING}: the requests clients sent); see
# spec/kube/apiserver.py.
kubeserver_control() {
	kubeserver_curl POST "/_test/$1" -H 'Content-Type: application/json' -d "${2:-{\}}"
}
