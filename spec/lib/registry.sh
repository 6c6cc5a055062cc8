# Start and stop Debian's docker-registry (the distribution project's
# registry) for tests: source this file, then
#
#   registry_start NAME [htpasswd FILE | token REALM SERVICE ISSUER CERT | tls CERT KEY]
#       -> sets REG_<NAME>_ADDR (127.0.0.1:PORT), REG_<NAME>_DIR (storage root)
#   registry_stop NAME        (registry_stop_all runs from the EXIT trap)
#   registry_restart NAME     start a stopped registry again: same port, same content
#   free_port                 prints a free loopback TCP port (loopback.sh)
#   registry_blob_file NAME DIGEST   the file holding a blob in storage
#
# Each registry gets a temporary directory (config + storage) removed at
# exit. Needs /usr/bin/docker-registry; registry_available says whether it
# is there.
. "$(dirname "${BASH_SOURCE[0]}")/loopback.sh"
REGISTRY_BIN=${REGISTRY_BIN:-/usr/bin/docker-registry}
_REG_TMP=${_REG_TMP:-$(mktemp -d "${TMPDIR:-/tmp}/gkm-registry.XXXXXX")}
_REG_NAMES=""

registry_available() { [ -x "$REGISTRY_BIN" ]; }

registry_start() { # name [htpasswd FILE | token REALM SERVICE ISSUER CERT | tls CERT KEY]
	local name=$1 mode=${2:-} port dir auth="" tls=""
	port=$(free_port)
	dir="$_REG_TMP/$name"
	mkdir -p "$dir/data"
	case "$mode" in
	htpasswd) auth="auth:
  htpasswd:
    realm: gkm-test
    path: $3" ;;
	token) auth="auth:
  token:
    realm: $3
    service: $4
    issuer: $5
    rootcertbundle: $6" ;;
	tls) tls="  tls:
    certificate: $3
    key: $4" ;;
	esac
	cat >"$dir/config.yml" <<CONF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
  cache:
    blobdescriptor: ""
http:
  addr: 127.0.0.1:$port
  secret: gkm-test-secret
$tls
$auth
CONF
	_REG_NAMES="$_REG_NAMES $name"
	_registry_serve "$name" "$port" || return 1
	eval "REG_${name}_ADDR=127.0.0.1:$port"
	eval "REG_${name}_DIR=$dir/data"
}

_registry_serve() { # name port: run it and wait until it answers
	local dir="$_REG_TMP/$1" i
	"$REGISTRY_BIN" serve "$dir/config.yml" >"$dir/log" 2>&1 &
	echo $! >"$dir/pid"
	for i in $(seq 1 100); do
		curl -s -o /dev/null "http://127.0.0.1:$2/v2/" && return 0
		curl -sk -o /dev/null "https://127.0.0.1:$2/v2/" && return 0
		sleep 0.1
	done
	echo "# registry $1 did not start:" >&2
	sed 's/^/#   /' "$dir/log" >&2
	return 1
}

registry_restart() {
	local addr
	eval "addr=\$REG_${1}_ADDR"
	_registry_serve "$1" "${addr##*:}"
}

registry_stop() {
	local pidf="$_REG_TMP/$1/pid"
	[ -f "$pidf" ] || return 0
	local pid
	pid=$(cat "$pidf")
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	rm -f "$pidf"
}

registry_stop_all() {
	local n
	_stop_helpers
	for n in $_REG_NAMES; do registry_stop "$n"; done
	rm -rf "$_REG_TMP"
}

registry_digest() { # addr repo:tag -> the registry's manifest digest
	curl -sI -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
		"http://$1/v2/${2%%:*}/manifests/${2#*:}" |
		awk -F': ' 'tolower($1)=="docker-content-digest"{print $2}' | tr -d '\r'
}

registry_blob_file() { # name digest
	local dir hex
	eval "dir=\$REG_${1}_DIR"
	hex=${2#sha256:}
	echo "$dir/docker/registry/v2/blobs/sha256/${hex:0:2}/$hex/data"
}

# Python helpers (spec/lib/regproxy.py, spec/lib/tokenserver.py,
# spec/lib/fwdproxy.py), stopped
# by registry_stop_all too.
_REG_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_REG_PIDS=""

_wait_port_file() { # file -> prints the port
	local i
	for i in $(seq 1 100); do
		[ -s "$1" ] && { cat "$1"; return 0; }
		sleep 0.05
	done
	return 1
}

proxy_start() { # name upstream_addr [cert key: HTTPS] -> PROXY_<name>_ADDR
	local pf="$_REG_TMP/proxy-$1.port" port
	/usr/bin/python3 "$_REG_LIB/regproxy.py" "$2" "$pf" ${3:+"$3" "$4"} >"$_REG_TMP/proxy-$1.log" 2>&1 &
	_REG_PIDS="$_REG_PIDS $!"
	port=$(_wait_port_file "$pf") || { echo "# proxy $1 did not start" >&2; return 1; }
	eval "PROXY_${1}_ADDR=127.0.0.1:$port"
}

proxy_fault() { # addr json (the proxy speaks HTTP, or HTTPS)
	curl -sf -o /dev/null -X POST --data "$2" "http://$1/_control" ||
		curl -skf -o /dev/null -X POST --data "$2" "https://$1/_control"
}

fwdproxy_start() { # -> FWDPROXY_ADDR; FWDPROXY_LOG lists "METHOD TARGET" per request
	local pf="$_REG_TMP/fwdproxy.port" port
	FWDPROXY_LOG=$_REG_TMP/fwdproxy.requests
	: >"$FWDPROXY_LOG"
	/usr/bin/python3 "$_REG_LIB/fwdproxy.py" "$pf" "$FWDPROXY_LOG" >"$_REG_TMP/fwdproxy.log" 2>&1 &
	_REG_PIDS="$_REG_PIDS $!"
	port=$(_wait_port_file "$pf") || { echo "# forward proxy did not start" >&2; return 1; }
	FWDPROXY_ADDR=127.0.0.1:$port
}

tokenserver_start() { # key cert issuer service user:pass -> TOKEN_ADDR
	local pf="$_REG_TMP/token.port" port
	/usr/bin/python3 "$_REG_LIB/tokenserver.py" "$pf" "$@" >"$_REG_TMP/token.log" 2>&1 &
	_REG_PIDS="$_REG_PIDS $!"
	port=$(_wait_port_file "$pf") || { echo "# token server did not start" >&2; return 1; }
	TOKEN_ADDR=127.0.0.1:$port
}

_stop_helpers() {
	local p
	for p in $_REG_PIDS; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	_REG_PIDS=""
}
