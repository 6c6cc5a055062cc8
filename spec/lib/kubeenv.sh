# A real Kubernetes control plane (etcd, kube-apiserver, optionally the
# controller manager and the scheduler) for a shell test: source this.
# The binaries come from GKM_KUBE_ASSETS (see spec/lib/kubeenv.py).
#
#   why=$(kubeenv_unavailable) && { skip "..." "$why"; finish; exit; }
#   kubeenv_start [--controller-manager] [--scheduler] [--audit] [--no-crds]
#   kubectl get gkmc                       # KUBECONFIG points at it
#   kubeenv_ctl kill kube-apiserver        # SIGKILL; `start kube-apiserver` brings it back
#   kubeenv_ctl node node-1 gpu=t4         # a schedulable Node with no kubelet
#   kubeenv_ctl cert webhook 127.0.0.1     # $KUBEENV_DIR/pki/webhook.crt|key, signed by $KUBEENV_CA
#   kubeenv_stop                           # also run by the EXIT trap it installs
#
# Sets KUBEENV_DIR, KUBEENV_URL, KUBEENV_PORT, KUBEENV_CA, KUBEENV_CA_KEY,
# KUBEENV_TOKEN, KUBEENV_AUDIT_LOG and exports KUBECONFIG.

KUBEENV_ROOT=${GKM_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
KUBEENV_PY=/usr/bin/python3
[ -x "$KUBEENV_PY" ] || KUBEENV_PY=python3
KUBEENV_PID=

# Prints why the real control plane cannot run here and succeeds; fails
# (prints nothing) when it can. Extra arguments name more required binaries.
kubeenv_unavailable() {
	local why
	why=$("$KUBEENV_PY" "$KUBEENV_ROOT/spec/lib/kubeenv.py" unavailable "$@")
	[ -n "$why" ] && echo "$why"
}

kubeenv_start() {
	KUBEENV_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gkm-kubeenv.XXXXXX")
	"$KUBEENV_PY" "$KUBEENV_ROOT/spec/lib/kubeenv.py" serve "$KUBEENV_DIR" "$@" \
		>>"$KUBEENV_DIR/serve.log" 2>&1 &
	KUBEENV_PID=$!
	trap kubeenv_stop EXIT
	local i
	for i in $(seq 1 1200); do
		[ -s "$KUBEENV_DIR/env" ] && break
		if [ -s "$KUBEENV_DIR/error" ] || ! kill -0 "$KUBEENV_PID" 2>/dev/null; then
			echo "# the control plane did not start:" >&2
			sed 's/^/# /' "$KUBEENV_DIR/error" "$KUBEENV_DIR/serve.log" >&2 2>/dev/null
			return 1
		fi
		sleep 0.1
	done
	[ -s "$KUBEENV_DIR/env" ] || { echo "# the control plane did not start in 120 s" >&2; return 1; }
	. "$KUBEENV_DIR/env"
	export KUBECONFIG
}

kubeenv_ctl() {
	"$KUBEENV_PY" "$KUBEENV_ROOT/spec/lib/kubeenv.py" ctl "$KUBEENV_DIR" "$@"
}

kubeenv_stop() {
	if [ -n "$KUBEENV_PID" ]; then
		kill -TERM "$KUBEENV_PID" 2>/dev/null
		wait "$KUBEENV_PID" 2>/dev/null
		KUBEENV_PID=
	fi
	[ -n "${KUBEENV_DIR:-}" ] && [ -z "${KEEP:-}" ] && rm -rf "$KUBEENV_DIR"
}

# kubeenv_curl METHOD PATH [curl args...]: one request as the cluster admin.
kubeenv_curl() {
	local method=$1 path=$2
	shift 2
	curl -sS -X "$method" --cacert "$KUBEENV_CA" -H "Authorization: Bearer $KUBEENV_TOKEN" \
		"$@" "$KUBEENV_URL$path"
}
