#!/bin/sh
# Install the Debian packages named on the command line that are missing.
# Idempotent and silent when everything is present.
set -eu
missing=""
for p in "$@"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "gkm: installing missing packages:$missing" >&2
if [ "$(id -u)" != 0 ]; then
	echo "gkm: not root; install them with: apt-get install$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends $missing >/dev/null
