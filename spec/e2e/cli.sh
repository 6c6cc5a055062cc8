#!/usr/bin/env bash
# The gkm command line: dispatch, --help everywhere, flag validation, and the
# policy subcommands on real files.
set -u
. "$(dirname "$0")/../lib/tap.sh"
cd "$GKM_ROOT"
# the sanitizer build: any memory error or undefined behaviour fails the test
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
fx=spec/fixtures/policy
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for c in operator agent csi webhook up apply get cache policy gpus; do
	$G $c --help >"$tmp/out" 2>&1
	[ $? -eq 0 ] && grep -qi "usage" "$tmp/out"
	ok $? "gkm $c --help prints usage"
done
# `gkm csi` lives in a module next to the binary; without it, it says which
cp "$GKM_BIN" "$tmp/gkm"
"$tmp/gkm" csi --help >"$tmp/out" 2>&1
[ $? -eq 3 ] && grep -q "cannot load the module.*$tmp/gkm-csi.so" "$tmp/out"
ok $? "gkm csi without its module: exit 3, names the module it looked for"
mkdir -p "$tmp/lib/gkm" "$tmp/bin" && mv "$tmp/gkm" "$tmp/bin/gkm" &&
	cp "$(dirname "$GKM_BIN")/gkm-csi.so" "$tmp/lib/gkm/gkm-csi.so"
"$tmp/bin/gkm" csi --help 2>&1 | grep -qi usage
ok $? "gkm csi finds its module installed in ../lib/gkm"
$G version | grep -q '^gkm '
ok $? "gkm version"
$G nope >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "unknown command 'nope'" "$tmp/out"
ok $? "unknown command is a usage error"
$G >/dev/null 2>&1
[ $? -eq 2 ]
ok $? "no command is a usage error"

$G policy check policies >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q "policies: ok" "$tmp/out"
ok $? "policy check accepts the default policies"
$G policy check $fx/broken >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "admission.lua:7:" "$tmp/out"
ok $? "policy check refuses a syntax error with file and line"
$G policy check /nonexistent >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "/nonexistent: cannot open policy directory" "$tmp/out"
ok $? "policy check names a missing directory"

$G policy eval policies admission $fx/admission-unsigned.json >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q '"reason":[[:space:]]*"Unsigned"' "$tmp/out"
ok $? "policy eval prints the hook result as JSON"
printf '{\n  "image": ]\n}\n' >"$tmp/bad.json"
$G policy eval policies admission "$tmp/bad.json" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "invalid JSON at line 2" "$tmp/out"
ok $? "policy eval names a JSON syntax error with its line"
$G policy eval policies admission $fx/admission-unsigned.json --timeout-ms 2000 >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q '"reason":[[:space:]]*"Unsigned"' "$tmp/out"
ok $? "flags after the positional arguments, as kubectl and cosign take them"
$G policy eval policies admission $fx/admission-unsigned.json --timeout-ms 0 >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q -- "--timeout-ms wants 1 to 3600000" "$tmp/out"
ok $? "... and checked as before"
$G policy eval policies nohook $fx/admission-unsigned.json >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "unknown hook 'nohook'" "$tmp/out"
ok $? "policy eval refuses an unknown hook"

# routes around the budget (each bounded by timeout: the old sandbox never returned)
mkdir -p "$tmp/gc-top" "$tmp/gc-hook"
printf 'setmetatable({}, { __gc = function() while true do end end })\nlocal M = {}\nfunction M.evaluate() return { gpus = {} } end\nreturn M\n' >"$tmp/gc-top/compat.lua"
timeout 20 $G policy check "$tmp/gc-top" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "compat: called blocked function .setmetatable with __gc" "$tmp/out"
ok $? "policy check refuses a module that sets a __gc finalizer (it would run outside the budget)"
printf 'local M = {}\nfunction M.evaluate(input)\n  setmetatable({}, { __gc = function() while true do end end })\n  collectgarbage()\n  return { gpus = {} }\nend\nreturn M\n' >"$tmp/gc-hook/compat.lua"
timeout 20 $G policy eval "$tmp/gc-hook" compat spec/fixtures/compat/triton-cuda-sm75-on-mixed-node.json >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "blocked function.*__gc" "$tmp/out"
ok $? "policy eval of a hook that sets a __gc finalizer: blocked, in time"

mkdir -p "$tmp/pattern-top"
printf 'local s = string.rep("a", 200000)\ns:find("(.-)x(.-)y")\nlocal M = {}\nfunction M.evaluate() return { gpus = {} } end\nreturn M\n' >"$tmp/pattern-top/compat.lua"
timeout 20 $G policy check "$tmp/pattern-top" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "matching steps on a subject of 200000 bytes" "$tmp/out"
ok $? "policy check refuses a module whose backtracking pattern over a long string would run for minutes"

$G policy test policies $fx/admission-cases.json >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q "2 passed, 0 failed" "$tmp/out"
ok $? "policy test runs cases against the default policy"
$G policy test $fx/allow-all $fx/admission-cases.json >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "not ok 1 - unsigned image refused: result differs at .allowed" "$tmp/out"
ok $? "policy test reports the case and field that differ"

$G policy reload policies $fx/broken admission $fx/admission-unsigned.json >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q "refused" "$tmp/out" && grep -q "still answering with generation 1" "$tmp/out" &&
	[ "$(grep -c '"Unsigned"' "$tmp/out")" -eq 2 ]
ok $? "policy reload: a broken bundle is refused and the previous one keeps answering"
$G policy reload policies $fx/allow-all admission $fx/admission-unsigned.json >"$tmp/out" 2>&1
[ $? -eq 0 ] && grep -q "generation 2" "$tmp/out" && grep -q '"allowed":[[:space:]]*true' "$tmp/out"
ok $? "policy reload: a valid bundle switches generation"

$G policy --memory abc check policies >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q -- "--memory wants bytes" "$tmp/out"
ok $? "a bad flag value is named"
$G policy --bogus check policies >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "unrecognized option" "$tmp/out"
ok $? "an unknown flag is refused"
$G policy --log-level loud check policies >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "invalid --log-level 'loud'" "$tmp/out"
ok $? "a bad log level is refused"
$G policy --log-format json reload policies $fx/broken admission $fx/admission-unsigned.json 2>"$tmp/err" >/dev/null
grep -q '^{"ts":".*","level":"error","msg":"policy bundle refused; keeping the previous one"' "$tmp/err"
ok $? "JSON logs are one object per line"
$G policy frob x >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "unknown subcommand 'frob'" "$tmp/out"
ok $? "unknown policy subcommand"
$G policy --timeout-ms 50 --instructions 1000000000000 eval "$tmp" admission $fx/admission-unsigned.json >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "policy eval fails cleanly on a directory without policies"
finish
