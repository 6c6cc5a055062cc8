#!/bin/sh
# `make run`: show gkm at work on its embedded defaults, no cluster needed.
set -eu
G=${BUILD:-build}/gkm
fx=spec/fixtures/policy
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }

step "1. Check the default policy bundle, exactly as a daemon loads it" \
	"gkm policy check policies"
$G policy check policies

step "2. Evaluate the admission hook on a sample review (an unsigned image)" \
	"gkm policy eval policies admission $fx/admission-unsigned.json"
$G policy eval policies admission $fx/admission-unsigned.json

step "3. A broken policy is refused with file, line and reason" \
	"gkm policy check $fx/broken"
if $G policy check $fx/broken; then
	echo "unexpected: the broken bundle was accepted" >&2
	exit 1
fi

step "4. A live reload to the broken policy: refused, the good one keeps answering" \
	"gkm policy reload policies $fx/broken admission $fx/admission-unsigned.json"
$G policy reload policies $fx/broken admission $fx/admission-unsigned.json

printf '\nAll good. Next: README.md for the rest of gkm.\n'
