#!/usr/bin/python3
"""Write a deterministic synthetic Triton-style kernel cache tree.

Shape (defaults, about 1 GiB): DIRS hash directories under io.triton.cache/,
FILES small text files spread over them (kernel JSON metadata, IR and PTX
text), BINARIES compiled-kernel-like blobs of 7-30 MiB (part random, part
repetitive, so gzip packs the tree to roughly 70%), and
io.triton.manifest/manifest.json. The same arguments always give the same
bytes. --scale multiplies every count and size bound.

usage: gen_cache_tree.py OUTDIR [--scale X] [--seed N]
       gen_cache_tree.py --tar - [--scale X]    (a tar stream on stdout,
                         fixed owners and mtimes, no files written)
"""
import argparse
import io
import json
import os
import random
import sys
import tarfile

B32 = "abcdefghijklmnopqrstuvwxyz234567"
WORDS = ("tt.load tt.store tt.dot arith.addf arith.mulf scf.for tt.reduce %arg0 %arg1 "
         "i32 f16 f32 bf16 !tt.ptr<f16> #blocked #mma ld.global.v4.b32 st.shared.b16 "
         "mma.sync.aligned.m16n8k16 bar.sync cvt.rn.f16.f32 add.s32 mov.u32 @%p1 bra "
         "$L__BB0_1 ret; .reg .pred .param .u64 llvm.nvvm.read.ptx.sreg.tid.x").split()


def text_pool(rng, size):
    out, n = [], 0
    while n < size:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        line = f"  %{rng.randint(0, 9999)} = {line} : {rng.randint(0, 1 << 20):#x}\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()


def entries(scale, seed):
    """Yield (relative path, bytes or None for a directory) in a fixed order."""
    rng = random.Random(seed)
    dirs = max(1, int(4000 * scale))
    files = max(1, int(20000 * scale))
    binaries = max(1, int(40 * scale))
    pool = text_pool(rng, 4 << 20)
    names = ["".join(rng.choice(B32) for _ in range(52)) for _ in range(dirs)]
    yield "io.triton.cache", None
    for n in names:
        yield f"io.triton.cache/{n}", None
    exts = (".ttir", ".ttgir", ".llir", ".ptx")
    targets = []
    for i in range(files):
        d = names[i % dirs]
        kernel = f"kernel_{i // dirs}"
        if (i // dirs) % 5 == 0:
            meta = {"hash": d, "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
                    "num_warps": rng.choice((4, 8)), "num_stages": 3, "ptx_version": 84,
                    "name": kernel, "shared": rng.randint(0, 1 << 16)}
            targets.append(meta["target"])
            yield f"io.triton.cache/{d}/{kernel}.json", json.dumps(meta, indent=1).encode()
        else:
            size = rng.randint(2 << 10, 30 << 10)
            off = rng.randint(0, len(pool) - size)
            yield f"io.triton.cache/{d}/{kernel}{exts[i % 4]}", pool[off:off + size]
    blk = 64 << 10
    for i in range(binaries):
        size = rng.randint(7 << 20, 30 << 20)
        parts, left = [], size
        while left > 0:
            n = min(blk, left)
            if rng.random() < 0.78:
                parts.append(rng.randbytes(n))
            else:
                pat = rng.randbytes(rng.choice((16, 32, 128)))
                parts.append((pat * (n // len(pat) + 1))[:n])
            left -= n
        yield f"io.triton.cache/{names[(i * 97) % dirs]}/kernel_{i}.cubin", b"".join(parts)
    yield "io.triton.manifest", None
    yield "io.triton.manifest/manifest.json", json.dumps(
        {"entries": files, "binaries": binaries, "targets": targets[:1]}).encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--tar", help="write a tar stream here ('-' for stdout) instead of files")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    if a.tar:
        out = sys.stdout.buffer if a.tar == "-" else open(a.tar, "wb")
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as t:
            for path, data in entries(a.scale, a.seed):
                ti = tarfile.TarInfo(path)
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 1700000000, 0, 0, "", ""
                if data is None:
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    t.addfile(ti)
                else:
                    ti.size, ti.mode = len(data), 0o644
                    t.addfile(ti, io.BytesIO(data))
        out.flush()
        return
    if not a.outdir:
        ap.error("OUTDIR or --tar is needed")
    for path, data in entries(a.scale, a.seed):
        full = os.path.join(a.outdir, path)
        if data is None:
            os.makedirs(full, exist_ok=True)
        else:
            with open(full, "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
