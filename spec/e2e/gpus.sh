#!/usr/bin/env bash
# gkm gpus as a user runs it: NVML found through the loader path (the
# stand-in libnvidia-ml.so.1 of spec/fake_nvml), KFD sysfs trees, the file
# source, the mixed node, and the errors a user gets for bad input.
set -u
. "$GKM_ROOT/spec/lib/tap.sh"
F=$GKM_ROOT/spec/fixtures/gpu
NV=$GKM_BUILD/spec/fake_nvml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the sanitizer build: a memory error or leak changes the exit status
G=${GKM_BIN_SAN:-$GKM_BIN}
export ASAN_OPTIONS=detect_leaks=1:exitcode=99
gpus() { "$G" gpus "$@" >"$tmp/out" 2>"$tmp/err"; }
has() { grep -qF -- "$1" "$tmp/${2:-out}"; }
json() { /usr/bin/python3 -c "import json,sys; d=json.load(open('$tmp/out')); sys.exit(0 if ($1) else 1)"; }
# row "cell|cell|...": a line of the table has these cells, in this order
row() { /usr/bin/python3 - "$tmp/out" "$1" <<'PY'
import re, sys
want = sys.argv[2].split("|")
sys.exit(0 if any(re.split(r"\s{1,}", l.strip()) == " ".join(want).split() and all(c in l for c in want)
                  for l in open(sys.argv[1])) else 1)
PY
}
# every value of both tables starts where its column's header starts
aligned() { /usr/bin/python3 - "$tmp/out" <<'PY'
import re, sys
for block in open(sys.argv[1]).read().strip().split("\n\n"):
    lines = block.splitlines()
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S", lines[0]) if lines[0][m.start():].split()[0] not in ("IDS",)]
    for l in lines[1:]:
        for a, b in zip(starts, starts[1:]):
            if l[a - 1:a] not in ("", " ") or l[a] == " " or l[b - 1] != " ":
                sys.exit("misaligned at %d: %r" % (a, l))
PY
}

# NVIDIA, with dlopen resolving libnvidia-ml.so.1 through the loader path
export FAKE_NVML_CONFIG=$F/nvml/h100x4-nvlink.json
LD_LIBRARY_PATH=$NV gpus --source nvml
ok $? "nvml: exits 0"
row "0|nvidia|NVIDIA H100 80GB HBM3|sm_90|550.54.15|12.4|79.6GiB|00000000:19:00.0|5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.1"
ok $? "nvml: table row shows name, arch, driver, CUDA, memory, bus id and clique"
row "2,3|NVIDIA H100 80GB HBM3|sm_90|550.54.15|5a4d1e60-b8f3-4c2e-9a7d-0c1b2e3f4a5b.2"
ok $? "nvml: GPUs of the second NVLink clique form their own id set"
aligned
ok $? "nvml: the columns line up"

LD_LIBRARY_PATH=$NV gpus -o json
ok $? "auto -o json: exits 0"
json "d['source']=='auto' and len(d['gpus'])==4 and d['gpus'][3]['fabric']['clique'].endswith('.2') and [g['ids'] for g in d['groups']]==[[0,1],[2,3]]"
ok $? "auto -o json: the documented shape with fabric cliques and groups"

# a driver that is installed but not running
FAKE_NVML_CONFIG=$F/nvml/init-fails.json LD_LIBRARY_PATH=$NV gpus --source nvml
[ $? -eq 1 ] && has "gkm gpus: nvml probe failed: nvmlInit: Driver Not Loaded" err
ok $? "nvml: a driver that does not initialise is an error naming NVML's reason"

gpus --source nvml --nvml-library "$tmp/none/libnvidia-ml.so.1"
[ $? -eq 1 ] && has "cannot load $tmp/none/libnvidia-ml.so.1" err
ok $? "nvml: a missing library is an error, not a crash"

FAKE_NVML_CONFIG=$F/nvml/errors.json LD_LIBRARY_PATH=$NV gpus --source nvml
[ $? -eq 0 ] && has "warning: GPU 1: nvmlDeviceGetUUID: GPU is lost" err && [ "$(grep -c nvidia "$tmp/out")" -eq 2 ]
ok $? "nvml: a lost GPU is left out with a warning, the others are listed"

# AMD through sysfs
gpus --source rocm --sysfs-root "$F/sysfs/mi300x"
[ $? -eq 0 ] && row "0|amd|AMD Instinct MI300X|gfx942|6.10.5|-|192.0GiB|0000:0c:00.0|-" &&
	row "0,1,2,3|AMD Instinct MI300X|gfx942|6.10.5|-"
ok $? "rocm: MI300X node from KFD topology, one id set"

gpus --source rocm --sysfs-root "$tmp"
[ $? -eq 1 ] && has "rocm probe failed: $tmp/class/kfd/kfd/topology/nodes: No such file or directory" err
ok $? "rocm: no KFD topology under the root is an error with the path"

# a node with NVIDIA and AMD GPUs
FAKE_NVML_CONFIG=$F/nvml/t4-r470.json gpus --nvml-library "$NV/legacy/libnvidia-ml.so.1" \
	--sysfs-root "$F/sysfs/mi210" -o json
ok $? "auto on a mixed node: exits 0"
json "[g['vendor'] for g in d['gpus']]==['nvidia','amd','amd'] and [g['index'] for g in d['gpus']]==[0,1,2] and [g['ids'] for g in d['groups']]==[[0],[1,2]]"
ok $? "auto on a mixed node: node-wide ids, one id set per GPU type"

# the file source reads the JSON it prints
cp "$tmp/out" "$tmp/inv.json"
# an arch with its target features, the widest cell of its column
/usr/bin/python3 -c "
import json; d = json.load(open('$tmp/inv.json'))
d['gpus'][1]['features'] = d['gpus'][2]['features'] = 'sramecc+:xnack-'
json.dump(d, open('$tmp/features.json', 'w'))"
gpus --file "$tmp/features.json" && row "1|amd|AMD Instinct MI210|gfx90a:sramecc+:xnack-|6.7.0|-|64.0GiB|0000:03:00.0|-" && aligned
ok $? "file: an arch with target features (gfx90a:sramecc+:xnack-) keeps the columns in line" || sed 's/^/#   /' "$tmp/out"
gpus --file "$tmp/inv.json" -o json
json "d['source']=='file' and [g['ids'] for g in d['groups']]==[[0],[1,2]] and d['gpus'][2]['uuid']=='GPU-b846912060024fb1'"
ok $? "file: reads back what -o json printed"

echo '{"gpus": [{"vendor": "amd", "arch": 942}]}' >"$tmp/bad.json"
gpus --file "$tmp/bad.json"
[ $? -eq 1 ] && has "$tmp/bad.json: gpus[0].arch: want a string" err
ok $? "file: a wrong type is refused with the field's path"

# usage errors
gpus --source cuda
[ $? -eq 2 ] && has "invalid --source 'cuda'" err
ok $? "usage: an unknown source exits 2 with a message"
gpus -o yaml
[ $? -eq 2 ] && has "invalid --output 'yaml'" err
ok $? "usage: an unknown output format exits 2"
gpus --source file
[ $? -eq 2 ] && has "--source file needs --file F" err
ok $? "usage: --source file without --file exits 2"
gpus --help
[ $? -eq 0 ] && has "--sysfs-root D" && has "--log-level"
ok $? "usage: --help lists the flags"

finish
