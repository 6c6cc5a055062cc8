#!/usr/bin/env bash
# A first run on a fresh Debian 12, proven in a clean root. Not part of
# `make test`: it downloads and installs the whole dependency closure.
#
#   bash spec/fresh/debian12.sh        (as root, in a clone; installs mmdebstrap if missing)
#
# It makes a minimal Debian 12 root with mmdebstrap (essential packages, apt
# and make: what a user has after `apt-get install make`) from this machine's
# apt sources, copies `git archive HEAD` into it, and inside it with chroot:
# `make deps` (the Makefile's DEPS, installed by core/deps.sh with
# --no-install-recommends, as `make run` and `make test` do), `make all`, then
# `make test` limited to GKM_TEST_FILTER (default: unit, the C unit tests;
# the test programs of every kind are built all the same). Any package the
# build needs beyond DEPS makes a step fail.
#
#   GKM_TEST_FILTER   test programs to run inside (default unit)
#   GKM_FRESH_KEEP=1  keep the root afterwards (it is printed); default: removed
# Each step prints one line; a failed step prints the end of its log.
set -euo pipefail
cd "$(dirname "$0")/../.."
filter=${GKM_TEST_FILTER-unit}
[ "$(id -u)" = 0 ] || { echo "fresh: run as root (mmdebstrap, chroot and mounts)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || sh core/deps.sh mmdebstrap || exit 1

work=$(mktemp -d "${TMPDIR:-/var/tmp}/gkm-fresh.XXXXXX")
root=$work/root
mounts=()
cleanup() {
	local i
	for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" || umount -l "${mounts[i]}"; done
	if [ "${GKM_FRESH_KEEP:-}" = 1 ]; then echo "fresh: kept $work"; else rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT

start=$SECONDS
step() { # name, command...: runs the command with its output in a log
	local name=$1 t=$SECONDS
	shift
	printf '%-44s' "$name"
	if "$@" >"$work/step.log" 2>&1; then
		printf 'ok   (%ds)\n' $((SECONDS - t))
	else
		printf 'FAILED (%ds); the end of its log:\n' $((SECONDS - t))
		tail -40 "$work/step.log" | sed 's/^/    /'
		exit 1
	fi
}
inside() { # command line, run in the source tree inside the root
	chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
		GKM_TEST_FILTER="$filter" sh -c "cd /src/gkm && $1"
}

# this machine's apt sources and the Acquire options they need (a proxy,
# snapshot mirrors' dates); sources.list.d files other than *.list and
# *.sources are disabled ones
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
	[ -f "$f" ] && grep -qv '^[[:space:]]*\(#\|$\)' "$f" && sources+=("$f")
done
apt-config dump --no-empty --format '%f "%v";%n' Acquire::http::Proxy Acquire::https::Proxy \
	Acquire::Check-Valid-Until Acquire::Check-Date >"$work/apt.conf"

step "a minimal Debian 12 root (mmdebstrap)" \
	mmdebstrap --variant=minbase --include=make --aptopt="$work/apt.conf" bookworm "$root" "${sources[@]}"
# packages' maintainer scripts must not start services (etcd) in the root
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
mkdir -p "$root/src/gkm"
git archive --format=tar HEAD | tar -x -C "$root/src/gkm"
echo "source: $(git rev-parse --short HEAD) (git archive), root: $(du -sh "$root" | cut -f1)"

mount -t proc proc "$root/proc" && mounts+=("$root/proc")
mount -t sysfs -o ro sysfs "$root/sys" && mounts+=("$root/sys")
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" && mounts+=("$root/dev/pts")
mkdir -p "$root/dev/shm" && mount -t tmpfs shm "$root/dev/shm" && mounts+=("$root/dev/shm")

before=$(chroot "$root" dpkg-query -W -f='${Package}\n' | wc -l)
step "make deps (DEPS, --no-install-recommends)" inside 'make deps'
echo "packages: $before in the minimal root, $(chroot "$root" dpkg-query -W -f='${Package}\n' | wc -l) after make deps"
step "make all" inside 'make -j$(nproc) all'
step "make test, GKM_TEST_FILTER='$filter'" inside 'make test'
grep -E '^(unit|lua|e2e)/|passed,' "$work/step.log"
echo "fresh Debian 12: make deps, make all and make test passed in $((SECONDS - start)) s"
