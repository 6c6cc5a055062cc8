# The gkm webhook in a real API server's admission chain (spec/lib/kubeenv.sh
# started it): source after kubeenv.sh, daemon.sh, poll.sh and registry.sh (for
# free_port), with
# `declare -A PORT` in the test.
#
#   kubewebhook_start GKM LOG [webhook flags...]   # e.g. --trust-dir DIR --plain-http
#
# Makes the webhook's certificate (signed by the cluster CA), starts `GKM
# webhook` (PID[webhook], PORT[webhook], PORT[webhook-health]), waits until
# it is ready and registers it by URL with caBundle as mutate.gkm.io and
# validate.gkm.io for CREATE and UPDATE of GKMCaches (ClusterGKMCaches are
# left out, so a test can show what happens without a webhook). Fails when
# it does not come up or register.

kubewebhook_config() { # kind name path
	cat <<EOF2
apiVersion: admissionregistration.k8s.io/v1
kind: $1
metadata: {name: gkm}
webhooks:
- name: $2
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
  rules:
  - {apiGroups: [gkm.io], apiVersions: [v1alpha1], operations: [CREATE, UPDATE], resources: [gkmcaches]}
  clientConfig:
    url: https://127.0.0.1:${PORT[webhook]}$3
    caBundle: $(base64 -w0 "$KUBEENV_CA")
EOF2
}

kubewebhook_start() { # gkm log flags...
	local gkm=$1 log=$2
	shift 2
	kubeenv_ctl cert webhook 127.0.0.1 >/dev/null || return 1
	PORT[webhook]=$(free_port)
	PORT[webhook-health]=$(free_port)
	"$gkm" webhook --listen "127.0.0.1:${PORT[webhook]}" \
		--health-listen "127.0.0.1:${PORT[webhook-health]}" \
		--tls-cert "$KUBEENV_DIR/pki/webhook.crt" --tls-key "$KUBEENV_DIR/pki/webhook.key" \
		"$@" >>"$log" 2>&1 &
	PID[webhook]=$!
	wait_for 20 curl -sf "http://127.0.0.1:${PORT[webhook-health]}/readyz" >/dev/null &&
		{ kubewebhook_config MutatingWebhookConfiguration mutate.gkm.io /mutate &&
			echo --- && kubewebhook_config ValidatingWebhookConfiguration validate.gkm.io /validate; } |
		kubectl apply -f - >/dev/null
}
