#!/usr/bin/env python
"""Split-KV decoding on tensor cores (issue 17) on the GPU: checked, then timed against
SDPA's grouped-query decode, dense and paged.

    python scripts/experiments/decode_tc.py [--sweep] [--quick] [--configs W,BC,ST ...]
                                    [--shapes BxCTX ...]

One query token, Hq 32, Hkv 8, D 128, fp16 (and bf16 at one shape); (B, context) over
{1, 16, 64} × {4K, 32K, 128K}.  Kernel time: CUDA events around 20 calls queued behind
``torch.cuda._sleep`` (host time hidden: the calls go through Numba's dispatch, ~0.5 ms
each, without the launch plans of ``ns.attention``), median of 5 such sets, inputs rotated past the
50 MB L2.  Bytes: K and V read once, 2·B·Hkv·ctx·D·2.  Every result is checked against
float32 SDPA on the same inputs: the error must be at most 2× fp16 SDPA's (+1e-3 slack
for rounding at the output's half ulp) — else the run exits 1 before any timing is kept.
Paged caches of page size 16 and 256 beside them, where the free memory holds them (a
shuffled pool per input set, built a sequence at a time, rotated as the dense caches are, so that no small cache's paged rows
are read from the L2).  ``--sweep``: every tiles
configuration at each shape, dense and paged (tiles inside a page); default: the chosen
one and the CUDA-core kernel (``tiles=False``).  ``--configs``: sweep only these (warps,
block_k, stages); ``--shapes``: these (B, context) instead of the nine (or ``--quick``'s).
Prints tables; nothing is kept.
"""

import argparse
import sys

import torch
from numba import cuda

from numba_softmax.kernels.decode import decode_launch as DL
from numba_softmax.kernels.decode import decode_tc_tiles as TT
from numba_softmax.kernels.decode import paged as KP

from _timing import kernel_ms  # (scripts/experiments/, the script's own folder)

HQ, HKV, D = 32, 8, 128
CONFIGS = [dict(warps=w, block_k=bk, stages=st) for w, bk, st in
           ((4, 32, 2), (4, 16, 3), (4, 16, 4), (8, 16, 2), (8, 16, 3), (4, 16, 2), (2, 16, 2),
            (2, 32, 3), (4, 64, 2), (8, 32, 2), (2, 64, 2), (4, 32, 3))]
FAILED = []


def nb(t):
    """A Numba view of a tensor (bfloat16 as its uint16 bits, as the kernels take it)."""
    return cuda.as_cuda_array((t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).detach())


def paged_copy(k, v, bs, gen):
    """The dense (B, Hkv, ctx, D) caches as a shuffled pool of pages (blocks, bs, Hkv, D)."""
    b, hkv, ctx, d = k.shape
    per = ctx // bs
    perm = torch.randperm(b * per, device="cuda", generator=gen)
    table = perm.view(b, per).to(torch.int32)
    pool_k = torch.empty(b * per, bs, hkv, d, device="cuda", dtype=k.dtype)
    pool_v = torch.empty_like(pool_k)
    for i in range(b):  # a sequence at a time: no temporary the size of the whole cache
        pages = perm[i * per:(i + 1) * per]  # sequence i's page j → pool block table[i, j]
        pool_k[pages] = k[i].view(hkv, per, bs, d).permute(1, 2, 0, 3)
        pool_v[pages] = v[i].view(hkv, per, bs, d).permute(1, 2, 0, 3)
    return pool_k, pool_v, table, torch.full((b,), ctx, device="cuda", dtype=torch.int32)


def check(name, o, ref, tol):
    err = float((o.float() - ref).abs().max())
    if not err <= tol:
        FAILED.append(f"{name}: max|O − O_fp32| {err:.2e} > {tol:.2e}")
    return err


def case(batch, ctx, dtype, sweep, gen):
    nbytes = 2 * batch * HKV * ctx * D * 2
    sets = max(1, min(8, (200 << 20) // nbytes + 1))
    data = [(torch.randn(batch, HQ, 1, D, device="cuda", dtype=dtype, generator=gen),
             torch.randn(batch, HKV, ctx, D, device="cuda", dtype=dtype, generator=gen),
             torch.randn(batch, HKV, ctx, D, device="cuda", dtype=dtype, generator=gen))
            for _ in range(sets)]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q0, k0, v0 = data[0]
    ref = torch.cat([sdpa(q0[i:i + 4].float(), k0[i:i + 4].float(), v0[i:i + 4].float(),
                          enable_gqa=True) for i in range(0, batch, 4)])  # (memory: 4 at a time)
    tol = 2 * float((sdpa(q0, k0, v0, enable_gqa=True).float() - ref).abs().max()) + 1e-3
    t_sdpa = kernel_ms(lambda i: sdpa(*data[i], enable_gqa=True), sets)
    outs = [(torch.empty(batch, HQ, 1, D, device="cuda", dtype=dtype),
             torch.empty(batch, HQ, 1, device="cuda", dtype=torch.float32)) for _ in range(sets)]
    dev = [tuple(nb(x) for x in d + o) for d, o in zip(data, outs)]
    label = f"B{batch:<3} ctx {ctx:>6} {str(dtype)[6:]:>8}"
    print(f"{label}  SDPA {t_sdpa * 1e3:8.1f} µs {nbytes / t_sdpa / 1e6:6.0f} GB/s")

    def row(name, fn, out):
        fn(0)
        err = check(f"{label} {name}", out, ref, tol)
        t = kernel_ms(fn, sets)
        print(f"{'':28}{name:<34} {t * 1e3:8.1f} µs {nbytes / t / 1e6:6.0f} GB/s "
              f"{t_sdpa / t:5.2f}× SDPA  err {err:.1e}")

    for cfg in (CONFIGS if sweep else [None, False]):
        name = "tensor cores " + (str(tuple(cfg.values())) if cfg else "(default)") \
            if cfg is not False else "CUDA cores"
        if cfg and TT.Tiles(D, D, **cfg).shared > 227 * 1024:
            continue
        row(name, lambda i, cfg=cfg: DL.run(*dev[i], paged=False, tiles=cfg), outs[0][0])
    if torch.cuda.mem_get_info()[0] > sets * nbytes + (2 << 30):  # (a pool beside the caches)
        for bs in (16, 256):  # a pool per set of inputs: rotated past the L2 as the dense
            pools = [paged_copy(k_, v_, bs, gen) for _, k_, v_ in data]
            args = [[nb(x) for x in (q_, *pool)] + [nb(x) for x in out]
                    for (q_, _, _), pool, out in zip(data, pools, outs)]
            for cfg in [None] + (CONFIGS if sweep else []):
                if cfg and (cfg["block_k"] > bs or TT.Tiles(D, D, **cfg).shared > 227 * 1024):
                    continue  # (tiles that cross pages: the slow path, not worth timing)
                name = f"paged, page {bs} " + (str(tuple(cfg.values())) if cfg else "(default)")
                row(name, lambda i, cfg=cfg: KP.launch(*args[i], max_seqlen_k=ctx, tiles=cfg),
                    outs[0][0])
            del pools, args


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="every tiles configuration")
    p.add_argument("--quick", action="store_true", help="B 1 and 64 at 4K, B 16 at 32K")
    p.add_argument("--configs", nargs="+", metavar="W,BC,ST", help="sweep only these tiles")
    p.add_argument("--shapes", nargs="+", metavar="BxCTX", help="(B, context) pairs, e.g. 1x4096")
    a = p.parse_args()
    if a.configs:
        CONFIGS[:] = [dict(zip(("warps", "block_k", "stages"), map(int, c.split(","))))
                      for c in a.configs]
    print(f"device: {torch.cuda.get_device_name()}; Hq {HQ}, Hkv {HKV}, D {D}, one query token")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    shapes = [(1, 4096), (16, 32768), (64, 4096)] if a.quick else \
        [(b, c) for b in (1, 16, 64) for c in (4096, 32768, 131072)]
    if a.shapes:
        shapes = [tuple(int(x) for x in sh.split("x")) for sh in a.shapes]
    for batch, ctx in shapes:
        case(batch, ctx, torch.float16, a.sweep, gen)
        torch.cuda.empty_cache()  # the case's caches are gone: give their memory back
    case(16, 32768, torch.bfloat16, a.sweep, gen)
    if FAILED:
        print("\nFAILED:\n  " + "\n  ".join(FAILED))
        sys.exit(1)
    print("\nall results within 2× SDPA's fp16 error")


if __name__ == "__main__":
    main()
