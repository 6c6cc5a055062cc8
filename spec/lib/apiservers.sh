# Run a shell test's scenario on the test API server, then on a real
# kube-apiserver where GKM_KUBE_ASSETS names one (a skip with the reason
# where not): source after tap.sh, kubeserver.sh and kubeenv.sh.
#
#   on_both_servers FUNC WHAT
#
# FUNC LABEL runs with KUBECONFIG pointing at the server and KUBE_SERVER set
# to "test" or "real"; LABEL names the server in test names. WHAT names the
# skipped check. The caller's EXIT trap is put back after each server starts
# (both install their own), and each server is stopped once FUNC returns.
on_both_servers() {
	local fn=$1 what=$2 why exit_trap
	exit_trap=$(trap -p EXIT)
	if kubeserver_start; then
		eval "${exit_trap:-trap - EXIT}"
		KUBE_SERVER=test "$fn" "test API server"
		kubeserver_cleanup
	else
		ok 1 "test API server starts"
	fi
	if why=$(kubeenv_unavailable); then
		echo "# real kube-apiserver: skipped: $why"
		skip "real kube-apiserver: $what" "$why"
	elif kubeenv_start; then
		eval "${exit_trap:-trap - EXIT}"
		KUBE_SERVER=real "$fn" "kube-apiserver"
		kubeenv_stop
	else
		ok 1 "real kube-apiserver starts"
	fi
}
