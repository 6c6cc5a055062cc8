#!/bin/sh
# Checks that what the build reads is on this machine before anything is
# compiled, and names the Debian package of whatever is not:
#   sh core/inputs.sh build        the inputs of `make all`
#   sh core/inputs.sh build test   and of the test programs `make test` builds
#   sh core/inputs.sh list         the table: group, kind, input, package
# The Makefile runs it with PROTO_INCLUDE and GO_1_19 set to the paths it
# uses. Silent when everything is there; otherwise one line per missing input
# and exit 1. Every package named here is in the Makefile's DEPS, and every
# pkg-config module the Makefile links is here (spec/e2e/build_inputs.sh).
set -eu
: "${PROTO_INCLUDE:?}" "${GO_1_19:?}"

table() {
	cat <<EOF
build cmd  cc             build-essential
build cmd  pkg-config     pkg-config
build cmd  protoc-c       protobuf-c-compiler
build file $PROTO_INCLUDE/google/protobuf/wrappers.proto libprotobuf-dev
build pc   lua5.4         liblua5.4-dev
build pc   libcurl        libcurl4-openssl-dev
build pc   libcjson       libcjson-dev
build pc   libarchive     libarchive-dev
build pc   yaml-0.1       libyaml-dev
build pc   openssl        libssl-dev
build pc   libmicrohttpd  libmicrohttpd-dev
build pc   zlib           zlib1g-dev
build pc   libzstd        libzstd-dev
build pc   libisal        libisal-dev
build pc   grpc           libgrpc-dev
build pc   libprotobuf-c  libprotobuf-c-dev
test  pc   cmocka         libcmocka-dev
test  cmd  $GO_1_19       golang-1.19-go
test  file /usr/share/gocode/src/github.com/Masterminds/sprig golang-github-masterminds-sprig-dev
test  file /usr/share/gocode/src/gopkg.in/yaml.v3 golang-gopkg-yaml.v3-dev
EOF
}

[ "${1:-}" = list ] && table && exit 0

have_pkgconfig=$(command -v pkg-config || true)
missing=""
while read -r group kind input package; do
	case " $* " in *" $group "*) ;; *) continue ;; esac
	case $kind in
	cmd) command -v "$input" >/dev/null 2>&1 && continue ;;
	file) [ -e "$input" ] && continue ;;
	# without pkg-config nothing can be said of its modules; it is reported itself
	pc) [ -z "$have_pkgconfig" ] || pkg-config --exists "$input" && continue
		input="pkg-config module $input" ;;
	esac
	echo "gkm: $input is missing: apt-get install $package" >&2
	case " $missing " in *" $package "*) ;; *) missing="$missing $package" ;; esac
done <<EOF
$(table)
EOF
[ -z "$missing" ] && exit 0
echo "gkm: the build cannot start: apt-get install$missing (or, as root, make deps: every package gkm needs)" >&2
exit 1
