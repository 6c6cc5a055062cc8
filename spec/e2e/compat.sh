#!/usr/bin/env bash
# The compat policy as an operator uses it: gkm policy eval on the sample
# inputs, an edited copy of the policy (the README's example of allowing a
# newer driver range), and edits that break it.
set -u
. "$GKM_ROOT/spec/lib/tap.sh"
cd "$GKM_ROOT"
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
F=spec/fixtures/compat
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

eval_to() { "$G" policy eval "$1" compat "$2" >"$tmp/out" 2>"$tmp/err"; }
# the reasons of the verdicts, in GPU order: "Compatible BackendMismatch ..."
reasons() { /usr/bin/python3 -c "import json; print(' '.join(v['reason'] for v in json.load(open('$tmp/out'))['gpus']))"; }

eval_to policies $F/triton-cuda-sm75-on-mixed-node.json
[ $? -eq 0 ] && [ "$(reasons)" = "Compatible BackendMismatch BackendMismatch" ]
ok $? "eval: the CUDA sm_75 cache runs on the T4 of the mixed node only"

eval_to policies $F/triton-hip-gfx90a-on-mixed-node.json
[ $? -eq 0 ] && [ "$(reasons)" = "BackendMismatch Compatible Compatible" ]
ok $? "eval: the ROCm gfx90a cache runs on the two MI210s"

eval_to policies $F/vllm-cuda129-sm90-on-h100.json
[ $? -eq 0 ] && [ "$(reasons)" = "PtxTooNew PtxTooNew PtxTooNew PtxTooNew" ] &&
	grep -qF "the cache needs CUDA 12.9 (PTX ISA 8.8, driver >= 575.51.03); the GPU's driver 550.54.15 runs CUDA 12.4" "$tmp/out"
ok $? "eval: a CUDA 12.9 cache on a 550 driver says which driver it needs"

# The README's edit: a driver branch the tables do not list yet.
mkdir -p "$tmp/newer"
sed -e 's/\["9.0"\] = "13.0",/["9.0"] = "13.0", ["9.1"] = "13.1",/' \
	-e 's/{ cuda = "13.0", driver = "580.65.06" },/&\n    { cuda = "13.1", driver = "590.44.01" },/' \
	policies/compat.lua >"$tmp/newer/compat.lua"
/usr/bin/python3 - "$F/vllm-cuda129-sm90-on-h100.json" "$tmp/in590.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["cache"]["targets"] = [{"backend": "cuda", "arch": 90, "warp_size": 32, "ptx_version": 91}]
for g in d["gpus"]:
    g["driverVersion"] = "590.48.01"
    g.pop("cudaDriverVersion", None)
json.dump(d, open(sys.argv[2], "w"))
PY
eval_to policies "$tmp/in590.json"
[ "$(reasons)" = "PtxTooNew PtxTooNew PtxTooNew PtxTooNew" ] && grep -q "does not list" "$tmp/out"
ok $? "eval: PTX ISA 9.1 is refused while the tables do not list it"
"$G" policy check "$tmp/newer" >"$tmp/out" 2>&1
ok $? "check: the edited policy loads"
eval_to "$tmp/newer" "$tmp/in590.json"
[ $? -eq 0 ] && [ "$(reasons)" = "Compatible Compatible Compatible Compatible" ]
ok $? "eval: with the 13.1 rows added, the 590 driver runs PTX ISA 9.1"

# Edits that break the policy are refused before they reach a daemon.
mkdir -p "$tmp/syntax" "$tmp/liar"
sed 's/^M.match = "any"$/M.match = "any/' policies/compat.lua >"$tmp/syntax/compat.lua"
"$G" policy check "$tmp/syntax" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "compat.lua:[0-9]*:" "$tmp/out"
ok $? "check: a syntax error in compat.lua is refused with file and line"

printf 'return { evaluate = function() return { gpus = { { index = 0, compatible = "yes" } } } end }\n' \
	>"$tmp/liar/compat.lua"
eval_to "$tmp/liar" $F/triton-cuda-sm75-on-mixed-node.json
[ $? -ne 0 ] && grep -q "bad return value" "$tmp/err" && grep -q "boolean 'compatible'" "$tmp/err"
ok $? "eval: a verdict that is not a boolean is a policy error, not a verdict"

echo '{"cache": {"targets": []}, "gpus": "none"}' >"$tmp/bad.json"
eval_to policies "$tmp/bad.json"
[ $? -ne 0 ] && grep -q "input.gpus must be the GPU list" "$tmp/err"
ok $? "eval: an input without a GPU list is a clean policy error"

finish
