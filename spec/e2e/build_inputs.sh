#!/usr/bin/env bash
# The build's input check (core/inputs.sh, run by make before the first
# compile): with an input taken away through the variable, PATH or pkg-config
# directory make uses, `make` stops before compiling anything and names the
# Debian package, never with make's own "No rule to make target". The table
# agrees with the Makefile: its packages are in DEPS, and every pkg-config
# module the build links is in it.
set -u
. "$(dirname "$0")/../lib/tap.sh"
cd "$GKM_ROOT"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gkm-inputs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/empty"
mk() { make -s --no-print-directory BUILD="$tmp/build" "$@" >"$tmp/out" 2>&1; }
said() { grep -qF -- "$1" "$tmp/out"; }
# ok, with make's output as TAP comments when it fails
seen() {
	local rc=$1
	[ "$rc" -eq 0 ] || sed 's/^/# /' "$tmp/out"
	ok "$rc" "$2"
}
nothing_built() { ! said "No rule to make target" && [ -z "$(find "$tmp/build" -name '*.[oS]' 2>/dev/null)" ]; }

mk INPUTS="build test" inputs
[ $? -eq 0 ] && [ ! -s "$tmp/out" ]
seen $? "every input of the build and the test programs is here: the check is silent"

mk -j2 PROTO_INCLUDE="$tmp/empty" all
[ $? -ne 0 ] && said "gkm: $tmp/empty/google/protobuf/wrappers.proto is missing: apt-get install libprotobuf-dev" &&
	nothing_built
seen $? "make all without wrappers.proto names libprotobuf-dev and compiles nothing"
mk -j2 PROTO_INCLUDE="$tmp/empty" "$tmp/build/gkm-csi.so"
[ $? -ne 0 ] && said "apt-get install libprotobuf-dev" && nothing_built
seen $? "the CSI module alone: the same message, not make's"

# a PATH holding everything of this one but protoc-c and pkg-config
mkdir "$tmp/bin"
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
	for f in "$d"/*; do
		case ${f##*/} in protoc-c | pkg-config) continue ;; esac
		[ -x "$f" ] && [ ! -e "$tmp/bin/${f##*/}" ] && ln -s "$f" "$tmp/bin/"
	done
done
PATH=$tmp/bin mk -j2 all
[ $? -ne 0 ] && said "gkm: protoc-c is missing: apt-get install protobuf-c-compiler" &&
	said "gkm: pkg-config is missing: apt-get install pkg-config" && ! said "pkg-config module" && nothing_built
seen $? "tools missing from PATH are named with their packages (and no module is blamed on a missing pkg-config)"

# a pkg-config directory holding every .pc file of this machine but grpc's
mkdir "$tmp/pc"
IFS=: read -ra dirs <<<"$(pkg-config --variable pc_path pkg-config)"
for d in "${dirs[@]}"; do
	for f in "$d"/*.pc; do
		[ -e "$f" ] && [ "${f##*/}" != grpc.pc ] && [ ! -e "$tmp/pc/${f##*/}" ] && ln -s "$f" "$tmp/pc/"
	done
done
PKG_CONFIG_PATH='' PKG_CONFIG_LIBDIR=$tmp/pc mk -j2 all
[ $? -ne 0 ] && said "gkm: pkg-config module grpc is missing: apt-get install libgrpc-dev" &&
	[ "$(grep -c '^gkm: .* is missing: ' "$tmp/out")" -eq 1 ] && nothing_built
seen $? "a missing pkg-config module is named with its -dev package, and only it"

PKG_CONFIG_PATH='' PKG_CONFIG_LIBDIR=$tmp/empty mk -j2 all
[ $? -ne 0 ] && said "apt-get install liblua5.4-dev libcurl4-openssl-dev libcjson-dev" && ! said libcmocka-dev
seen $? "several missing: the last line installs them all at once; make all does not ask for the tests' packages"

mk GO_1_19="$tmp/empty/go" inputs
[ $? -eq 0 ]
seen $? "make all does not need Go"
mk GO_1_19="$tmp/empty/go" INPUTS="build test" inputs
[ $? -ne 0 ] && said "gkm: $tmp/empty/go is missing: apt-get install golang-1.19-go"
seen $? "make test's check names the Go toolchain the chart renderer is built with"

# the table against the Makefile
mk --eval 'show-vars: ; @echo "$(DEPS)" && echo "$(PKGS) $(CSI_PKGS)"' show-vars
deps=" $(sed -n 1p "$tmp/out" | tr -s '\t ' '  ') "
modules=$(sed -n 2p "$tmp/out")
PROTO_INCLUDE=/usr/include GO_1_19=go sh core/inputs.sh list >"$tmp/table"
bad=""
while read -r _ _ _ package; do
	case $deps in *" $package "*) ;; *) bad="$bad $package" ;; esac
done <"$tmp/table"
[ -n "$modules" ] && [ -z "$bad" ]
ok $? "every package the check names is in DEPS (not there:${bad:- none})"
bad=""
for m in $modules; do
	grep -qE "^[a-z]+ +pc +$m " "$tmp/table" || bad="$bad $m"
done
[ -z "$bad" ]
ok $? "every pkg-config module the build links is checked (not checked:${bad:- none})"
finish
