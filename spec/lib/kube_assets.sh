#!/bin/sh
# Unpack xz-compressed Kubernetes binaries (kube-apiserver.xz, ...) from SRC
# into DEST, once, and print DEST: the directory GKM_KUBE_ASSETS names.
#   GKM_KUBE_ASSETS=$(sh spec/lib/kube_assets.sh SRC build/kube-assets)
set -eu
src=$1 dest=$2
mkdir -p "$dest"
for xz in "$src"/*.xz; do
	[ -e "$xz" ] || { echo "kube_assets: no *.xz in $src" >&2; exit 1; }
	bin=$dest/$(basename "$xz" .xz)
	[ -x "$bin" ] && [ "$bin" -nt "$xz" ] && continue
	xz -dc "$xz" >"$bin.tmp"
	chmod +x "$bin.tmp"
	mv "$bin.tmp" "$bin"
done
cd "$dest" && pwd
