#!/usr/bin/env python
"""GPU check of the attention kernels: correctness first, then speed beside PyTorch.

    python scripts/gpu/attention.py            # everything (≈ 90 s on an H100, JIT included)
    python scripts/gpu/attention.py --quick    # correctness only
    python scripts/gpu/attention.py --sim      # correctness, tiny shapes, CUDA simulator

1. Correctness (five worker processes, in parallel, each compiling its own kernels):
   the CUDA-core forward (fp32, fp16, bf16 as uint16 bits) with causal, sliding windows,
   GQA/MQA, varlen packing (an empty sequence, one without keys), split partials and their
   merge, the tile configurations timed below, > 65535 batch·heads; the GQA split-KV
   decode kernel (dense); paged decoding on shuffled block tables with shared prefixes,
   odd lengths, page sizes 5/16/256, speculative rows, the append kernel in a decoder
   loop, and the table validator.  Fresh random data, float64 NumPy references, outputs
   poisoned with NaN, explicit tolerances; one line per failure, exit status 1 if any.
2. Timing (this process alone, kernel time by CUDA events behind a sleeping kernel so
   that host launch overhead is not counted, median of 25, inputs rotated past L2):
   fp32 forward vs SDPA fp32 (TFLOP/s), a tile sweep at (4, 8, 4096, 64), dense GQA
   forward vs the same call with expanded heads (fp32 on CUDA cores, fp16 on tensor
   cores), and decoding (Hq 32, Hkv 8, D 128,
   fp16; bf16 at a few points): SDPA's dense GQA decode, our dense split-KV decode and
   paged decode (pages 16, and 256 at B = 1) — GB/s of K/V cache read.
Prints one table per part and the targets of issues #14/#17 beside the numbers.
"""

import argparse
import concurrent.futures as cf
import math
import multiprocessing as mp
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

F16, F32, BF16 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.uint16)
SIM = "--sim" in sys.argv
if SIM:  # the correctness part on the CUDA simulator, tiny shapes: checks this script
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def sz(gpu, sim):
    """``gpu`` on a GPU, ``sim`` with --sim."""
    return sim if SIM else gpu
TOL = {F32: (1e-4, 2e-5), F16: (4e-3, 2e-3), BF16: (1.6e-2, 1.6e-2)}


# --- data -------------------------------------------------------------------------------------
def to_bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def values(x):
    x = np.asarray(x)
    if x.dtype == BF16:
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def rand(rng, shape, dtype, spread=1.0):
    x = (spread * rng.standard_normal(shape)).astype(np.float32)
    return to_bf16(x) if dtype == BF16 else x.astype(dtype)


def poisoned(shape, dtype):
    from numba import cuda

    fill = np.full(shape, 0x7FC0, np.uint16) if dtype == BF16 else np.full(shape, np.nan, dtype)
    return cuda.to_device(fill)


def compare(name, o, lse, ref_o, ref_lse, dtype):
    """'' when o, lse match the references, else what is wrong."""
    o, rtol_atol = values(o), TOL[np.dtype(dtype)]
    rtol, atol = rtol_atol
    if np.isnan(o).any():
        return f"{name}: {int(np.isnan(o).sum())} NaN outputs"
    empty = np.isneginf(ref_lse)
    if not np.array_equal(np.isneginf(lse), empty):
        return f"{name}: LSE = -inf on the wrong rows"
    if np.any(o[empty] != 0):
        return f"{name}: rows that see no key must have O = 0"
    err = np.abs(o - ref_o) - rtol * np.abs(ref_o)
    if err.max(initial=0) > atol:
        return f"{name}: |O - ref| exceeds tolerance by {err.max():.2e} at {np.unravel_index(err.argmax(), err.shape)}"
    lerr = np.abs(lse[~empty] - ref_lse[~empty]) - 1e-5 * np.abs(ref_lse[~empty])
    if lerr.max(initial=0) > 2e-4:
        return f"{name}: |LSE - ref| {lerr.max():.2e}"
    return ""


def guard(out, name, fn):
    """Run one check; an exception is a failure too (and the next check still runs)."""
    try:
        out.append(fn())
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        out.append(f"{name}: {type(exc).__name__}: {exc}")


def _dev(*xs):
    from numba import cuda

    return [cuda.to_device(np.ascontiguousarray(x)) for x in xs]


# --- correctness tasks (each runs in its own process) -----------------------------------------
SMALL = dict(small=True) if SIM else {}


def task_forward(dtypes):
    from numba import cuda

    from numba_softmax import reference as R
    from numba_softmax.kernels.attention import attention as KA
    from numba_softmax.kernels.attention import merge as KM

    rng, out = np.random.default_rng(), []

    def run(q, k, v, name, ref_kw=None, **kw):
        def check():
            o, lse = poisoned(q.shape[:3] + (v.shape[-1],), q.dtype), poisoned(q.shape[:3], F32)
            KA.launch(*_dev(q, k, v), o, lse, **SMALL, **kw)
            ref = R.attention(values(q), values(k), values(v), return_lse=True, **(ref_kw or kw))
            return compare(name, o.copy_to_host(), lse.copy_to_host(), *ref, q.dtype)

        guard(out, name, check)

    masks = [dict(), dict(causal=True), dict(window=(64, 16)), dict(causal=True, window=(100, -1))]
    shapes = sz([(2, 8, 2, 300, 333, 64, 64), (2, 4, 4, 257, 1000, 128, 128), (1, 6, 3, 77, 129, 40, 24),
                 (1, 4, 1, 500, 70, 64, 64)], [(1, 4, 2, 9, 70, 16, 16), (1, 2, 1, 20, 7, 8, 8)])
    for dtype in dtypes:
        for b, hq, hkv, sq, sk, d, dv in shapes:
            q, k, v = rand(rng, (b, hq, sq, d), dtype, 1.5), rand(rng, (b, hkv, sk, d), dtype), rand(rng, (b, hkv, sk, dv), dtype)
            for m in masks:
                run(q, k, v, f"forward {dtype.name} {(b, hq, hkv, sq, sk, d, dv)} {m}", **m)
    # varlen: an empty sequence, one without keys, one with more queries than keys
    lq, lk = sz(([300, 0, 77, 513], [280, 99, 0, 700]), ([3, 0, 9, 4], [5, 7, 0, 2]))
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lq, lk))
    for dtype in dtypes:
        q, k, v = rand(rng, (cu_q[-1], 8, 64), dtype, 1.5), rand(rng, (cu_k[-1], 2, 64), dtype), rand(rng, (cu_k[-1], 2, 64), dtype)
        for m in masks:
            def check(m=m):
                o, lse = poisoned((1, 8, cu_q[-1], 64), dtype), poisoned((1, 8, cu_q[-1]), F32)
                heads = _dev(*(np.swapaxes(x, 0, 1)[None] for x in (q, k, v)))
                KA.launch(*heads, o, lse, cu_seqlens_q=cuda.to_device(cu_q), cu_seqlens_k=cuda.to_device(cu_k),
                          max_seqlen_q=max(lq), **SMALL, **m)
                ref_o, ref_lse = R.attention_varlen(values(q), values(k), values(v), cu_q, cu_k, return_lse=True, **m)
                return compare(f"varlen {dtype.name} {m}", np.swapaxes(o.copy_to_host()[0], 0, 1),
                               lse.copy_to_host()[0].T, ref_o, ref_lse.T, dtype)

            guard(out, f"varlen {dtype.name} {m}", check)
    # split partials (kv_chunk) and the merge kernel
    for dtype in dtypes:
        sk, chunk, left = sz((3001, 512, 1500), (40, 16, 20))
        q, k, v = rand(rng, (2, 8, 5, 64), dtype, 1.5), rand(rng, (2, 2, sk, 64), dtype), rand(rng, (2, 2, sk, 64), dtype)

        def check():
            z = -(-sk // chunk)
            o_ws, lse_ws = poisoned((2 * z, 8, 5, 64), F32), poisoned((2 * z, 8, 5), F32)
            KA.launch(*_dev(q, k, v), o_ws, lse_ws, causal=True, window=(left, -1), kv_chunk=chunk, **SMALL)
            o, lse = poisoned((2, 8, 5, 64), dtype), poisoned((2, 8, 5), F32)
            KM.merge_splits_launch(o_ws, lse_ws, o, lse, **SMALL)
            ref = R.attention(values(q), values(k), values(v), causal=True, window=(left, -1), return_lse=True)
            return compare(f"kv_chunk partials + merge {dtype.name}", o.copy_to_host(), lse.copy_to_host(), *ref, dtype)

        guard(out, f"kv_chunk {dtype.name}", check)
    if F32 in dtypes and not SIM:  # more than 65535 batch·heads, forward and merge_pair
        q, k, v = rand(rng, (35000, 2, 3, 8), F32), rand(rng, (35000, 1, 5, 8), F32), rand(rng, (35000, 1, 5, 8), F32)
        run(q, k, v, "forward 70000 batch·heads", causal=True)

        def check():
            parts = []
            for lo, hi in ((0, 2), (2, 5)):
                o, lse = poisoned(q.shape, F32), poisoned(q.shape[:3], F32)
                KA.launch(*_dev(q, k[:, :, lo:hi], v[:, :, lo:hi]), o, lse)
                parts += [o, lse]
            o, lse = poisoned(q.shape, F32), poisoned(q.shape[:3], F32)
            KM.merge_pair_launch(*parts, o, lse)
            return compare("merge_pair 70000 batch·heads", o.copy_to_host(), lse.copy_to_host(),
                           *R.attention(q, k, v, return_lse=True), F32)

        guard(out, "merge_pair 70000", check)
    return [x for x in out if x], len(out)


def task_decode():
    from numba_softmax import reference as R
    from numba_softmax.kernels.decode import decode_launch as KD

    rng, out = np.random.default_rng(), []
    d = sz(128, 16)
    cases = sz([(3, 32, 8, 1, 4097, {}, {}), (3, 32, 8, 3, 4097, dict(causal=True), {}),
                (2, 32, 8, 1, 100, dict(window=(50, -1)), dict(num_splits=7)),
                (2, 32, 1, 1, 3000, dict(window=(1000, 0)), {}),  # MQA: 8 row chunks
                (2, 8, 8, 1, 2049, {}, dict(num_splits=64)), (1, 32, 8, 1, 1, {}, {}),
                (2, 32, 8, 1, 5000, {}, dict(kv_chunk=333)), (1, 4, 2, 40, 300, dict(causal=True), {})],
               [(1, 4, 2, 1, 37, {}, {}), (1, 8, 1, 2, 30, dict(causal=True, window=(9, 0)), dict(num_splits=3))])
    for dtype in (F16, BF16, F32):
        for b, hq, hkv, sq, sk, mask, split in cases:
            name = f"decode {dtype.name} {(b, hq, hkv, sq, sk)} {mask} {split}"

            def check():
                q, k, v = rand(rng, (b, hq, sq, d), dtype, 1.5), rand(rng, (b, hkv, sk, d), dtype), rand(rng, (b, hkv, sk, d), dtype)
                o, lse = poisoned((b, hq, sq, d), dtype), poisoned((b, hq, sq), F32)
                KD.launch(*_dev(q, k, v), o, lse, **SMALL, **mask, **split)
                ref = R.attention(values(q), values(k), values(v), return_lse=True, **mask)
                return compare(name, o.copy_to_host(), lse.copy_to_host(), *ref, dtype)

            guard(out, name, check)
    return [x for x in out if x], len(out)


def paged_cache(rng, lengths, bs, hkv, d, dtype, prefix):
    per = [-(-n // bs) + 1 for n in lengths]
    n_blocks = prefix + sum(p - min(p, prefix) for p in per) + 3
    order = list(rng.permutation(n_blocks))
    shared, rest = order[:prefix], order[prefix:]
    table = np.full((len(lengths), max(per)), -1, np.int32)
    for b, p in enumerate(per):
        table[b, :p] = (shared[:p] + [rest.pop() for _ in range(p - min(p, prefix))])[:p]
    return (rand(rng, (n_blocks, bs, hkv, d), dtype), rand(rng, (n_blocks, bs, hkv, d), dtype), table,
            np.asarray(lengths, np.int32))


def task_paged():
    from numba import cuda

    from numba_softmax import reference as R
    from numba_softmax.kernels.decode import append as KAp
    from numba_softmax.kernels.decode import paged as KP

    rng, out = np.random.default_rng(), []
    d, hq, hkv = sz((128, 32, 8), (16, 4, 2))
    lengths = sz([4097, 1, 0, 777, 256, 3000], [13, 0, 6])
    configs = sz([(16, 1, {}, None, 3), (256, 4, dict(causal=True), None, 1),
                  (5, 2, dict(causal=True, window=(300, -1)), 3, 0), (16, 1, dict(window=(100, 20)), 64, 0)],
                 [(4, 1, {}, None, 1), (5, 2, dict(causal=True, window=(4, -1)), 2, 0)])
    for dtype in sz((F16, BF16, F32), (F16, BF16)):
        for bs, sq, mask, splits, prefix in configs:
            name = f"paged {dtype.name} bs {bs} Sq {sq} {mask} splits {splits}"

            def check():
                k_c, v_c, table, lens = paged_cache(rng, lengths, bs, hkv, d, dtype, prefix)
                q = rand(rng, (len(lengths), hq, sq, d), dtype, 1.5)
                o, lse = poisoned(q.shape, dtype), poisoned(q.shape[:3], F32)
                KP.check_tables(table, lens, k_c.shape[0], bs, batch=len(lengths))
                KP.launch(*_dev(q, k_c, v_c, table, lens), o, lse, num_splits=splits, **SMALL, **mask)
                ref = R.paged_attention(values(q), values(k_c), values(v_c), table, lens, return_lse=True, **mask)
                return compare(name, o.copy_to_host(), lse.copy_to_host(), *ref, dtype)

            guard(out, name, check)
    for dtype in (F16, BF16):  # a decoder loop: append then decode, against dense attention
        def loop():
            k_c, v_c, table, lens = paged_cache(rng, sz([300, 17, 64], [6, 5]), 16, hkv, d, dtype, 1)
            dk, dv = _dev(k_c, v_c)
            fails = []
            for step, new in enumerate((2, 1, 1)):
                k_new, v_new = rand(rng, (len(lens), new, hkv, d), dtype), rand(rng, (len(lens), new, hkv, d), dtype)
                KP.check_tables(table, lens, k_c.shape[0], 16, new_tokens=new)
                KAp.launch(*_dev(k_new, v_new), dk, dv, *_dev(table, lens), **SMALL)
                k_c, v_c = R.append_kv(k_c, v_c, table, lens, k_new, v_new)
                if not (np.array_equal(dk.copy_to_host(), k_c) and np.array_equal(dv.copy_to_host(), v_c)):
                    fails.append(f"append {dtype.name} step {step}: the caches differ from append_kv")
                lens = lens + new
                q = rand(rng, (len(lens), hq, new, d), dtype)
                o, lse = poisoned(q.shape, dtype), poisoned(q.shape[:3], F32)
                KP.launch(*_dev(q), dk, dv, *_dev(table, lens), o, lse, causal=True, **SMALL)
                for b, n in enumerate(lens):
                    kb, vb = (np.swapaxes(values(R.gather_kv(c, table, b, n)), 0, 1) for c in (k_c, v_c))
                    ref = R.attention(values(q[b]), kb, vb, causal=True, return_lse=True)
                    fails.append(compare(f"decoder loop {dtype.name} step {step} seq {b}",
                                         o.copy_to_host()[b], lse.copy_to_host()[b], *ref, dtype))
            return "; ".join(f for f in fails if f)

        guard(out, f"decoder loop {dtype.name}", loop)
    bad = 0  # the validator: every bad table is a ValueError
    table = np.array([[3, 1, -1]], np.int32)
    for t, n in ((table, np.array([-1], np.int32)), (table, np.array([13], np.int32)),
                 (np.array([[3, 9, -1]], np.int32), np.array([7], np.int32))):
        try:
            KP.check_tables(cuda.to_device(t), cuda.to_device(n), 5, 4)
            bad += 1
        except ValueError:
            pass
    out.append(f"validator accepted {bad} bad tables" if bad else "")
    return [x for x in out if x], len(out)


SWEEP_64 = [(128, 64, None), (64, 64, 4), (128, 32, 8), (64, 32, 4)]
SWEEP_128 = [(64, 32, None), (128, 32, 4), (64, 64, 4)]


# --- timing -----------------------------------------------------------------------------------
class Timer:
    """Kernel time of ``fn()`` by CUDA events; a sleeping kernel queued first holds the GPU
    while the host enqueues, so launch overhead is not timed.  Median of ``n``."""

    def __init__(self, torch):
        self.torch = torch

    def __call__(self, fn, n=25, warmup=3, sleep_us=2000):
        torch = self.torch
        for _ in range(warmup):
            fn(0)
        torch.cuda.synchronize()
        times = []
        for i in range(n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(sleep_us * 1500))  # ≥ 1.5 GHz: at most sleep_us
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return float(np.median(times))


def nb(t):
    """A torch CUDA tensor as a Numba device array (bf16 as uint16 bits)."""
    import torch
    from numba import cuda

    return cuda.as_cuda_array(t.view(torch.uint16) if t.dtype == torch.bfloat16 else t)


def copies(nbytes):
    return max(1, min(16, -(-200 * 2**20 // max(nbytes, 1))))


def time_forward(torch, timer, rows):
    from numba_softmax.kernels.attention import attention as KA

    sdpa = torch.nn.functional.scaled_dot_product_attention
    for s, d in ((1024, 64), (4096, 64), (1024, 128), (4096, 128)):
        b, h = 4, 8
        nbytes = 3 * b * h * s * d * 4
        sets = [[torch.randn(b, h, s, d, device="cuda") for _ in range(3)] for _ in range(copies(nbytes))]
        o = torch.empty(b, h, s, d, device="cuda")
        lse = torch.empty(b, h, s, device="cuda")
        nsets = [[nb(x) for x in qkv] for qkv in sets]
        no, nl = nb(o), nb(lse)
        configs = [(None, None, None)] + (SWEEP_64[1:] if (s, d) == (4096, 64) else
                                          SWEEP_128[1:] if (s, d) == (4096, 128) else [])
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            t_sdpa = timer(lambda i: sdpa(*sets[i % len(sets)], is_causal=causal))
            for bq, bk, rpl in configs:
                t = timer(lambda i: KA.launch(*nsets[i % len(nsets)], no, nl, causal=causal,
                                              block_q=bq, block_k=bk, rows_per_lane=rpl))
                tiles = "default" if bq is None else f"{bq}x{bk} rpl {rpl}"
                rows.append(("forward fp32", f"B4 H8 S{s} D{d} {'causal' if causal else 'full'}",
                             tiles, flops / t / 1e12, flops / t_sdpa / 1e12, "TFLOP/s"))
        del sets, nsets
    # dense GQA forward vs the same call with the K/V heads expanded (fp32, CUDA cores)
    b, hq, hkv, s, d = 2, 32, 8, 2048, 64
    q = torch.randn(b, hq, s, d, device="cuda")
    k, v = (torch.randn(b, hkv, s, d, device="cuda") for _ in range(2))
    ke, ve = (x.repeat_interleave(hq // hkv, dim=1).contiguous() for x in (k, v))
    o, lse = torch.empty_like(q), torch.empty(b, hq, s, device="cuda")
    flops = 4 * b * hq * s * s * d
    t_gqa = timer(lambda i: KA.launch(nb(q), nb(k), nb(v), nb(o), nb(lse)), n=10)
    t_exp = timer(lambda i: KA.launch(nb(q), nb(ke), nb(ve), nb(o), nb(lse)), n=10)
    rows.append(("forward fp32 GQA", f"B2 Hq32 Hkv8 S{s} D{d}", "GQA vs expanded",
                 flops / t_gqa / 1e12, flops / t_exp / 1e12, "TFLOP/s"))
    # the same on tensor cores (fp16, D 128, causal and not): the forward fp16/bf16 takes
    from numba_softmax.kernels.attention import attention_tc as KT

    d = 128
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.float16) for _ in range(2))
    ke, ve = (x.repeat_interleave(hq // hkv, dim=1).contiguous() for x in (k, v))
    o, lse = torch.empty_like(q), torch.empty(b, hq, s, device="cuda")
    for causal in (False, True):
        flops = 4 * b * hq * s * s * d // (2 if causal else 1)
        t_gqa = timer(lambda i: KT.launch(nb(q), nb(k), nb(v), nb(o), nb(lse), causal=causal), n=10)
        t_exp = timer(lambda i: KT.launch(nb(q), nb(ke), nb(ve), nb(o), nb(lse), causal=causal),
                      n=10)
        rows.append(("forward fp16 GQA (tensor cores)",
                     f"B2 Hq32 Hkv8 S{s} D{d} {'causal' if causal else 'full'}", "GQA vs expanded",
                     flops / t_gqa / 1e12, flops / t_exp / 1e12, "TFLOP/s"))


def time_decode(torch, timer, rows):
    from numba_softmax.kernels.decode import decode_launch as KD
    from numba_softmax.kernels.decode import paged as KP

    hq, hkv, d = 32, 8, 128

    def sdpa(q, k, v):  # PyTorch's dense GQA decode (enable_gqa since 2.5; else expanded heads)
        f = torch.nn.functional.scaled_dot_product_attention
        try:
            return f(q, k, v, enable_gqa=True)
        except TypeError:
            return f(q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1))

    grid = [(b, s) for b in (1, 16, 64) for s in (4096, 32768, 131072)]
    for b, s in grid:
        for tdtype in ((torch.float16, torch.bfloat16) if (b, s) in ((1, 4096), (16, 32768)) else (torch.float16,)):
            nbytes = 2 * b * hkv * s * d * 2
            n = copies(nbytes)
            kv = [[torch.randn(b, hkv, s, d, device="cuda", dtype=tdtype) for _ in range(2)] for _ in range(n)]
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=tdtype)
            o = torch.empty_like(q)
            lse = torch.empty(b, hq, 1, device="cuda")
            t_sdpa = timer(lambda i: sdpa(q, *kv[i % n]))
            nkv = [[nb(x) for x in pair] for pair in kv]
            nq, no, nl = nb(q), nb(o), nb(lse)
            t_dense = timer(lambda i: KD.launch(nq, *nkv[i % n], no, nl))
            name = "fp16" if tdtype == torch.float16 else "bf16"
            rows.append((f"decode {name}", f"B{b} ctx {s // 1024}K", "dense split-KV",
                         nbytes / t_dense / 1e9, nbytes / t_sdpa / 1e9, "GB/s"))
            for bs in ((16, 256) if b == 1 else (16,)):
                # the same memory seen as a pool of pages, handed out in a shuffled order
                blocks = b * s // bs
                table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(b, s // bs)
                lens = torch.full((b,), s, device="cuda", dtype=torch.int32)
                pools = [[nb(x.view(blocks, bs, hkv, d)) for x in pair] for pair in kv]  # bytes only
                nt, nlen = nb(table), nb(lens)
                t_paged = timer(lambda i: KP.launch(nq, *pools[i % n], nt, nlen, no, nl, max_seqlen_k=s))
                rows.append((f"decode {name}", f"B{b} ctx {s // 1024}K", f"paged, page {bs}",
                             nbytes / t_paged / 1e9, nbytes / t_sdpa / 1e9, "GB/s"))
            del kv, nkv, pools, nq, no, nl, nt, nlen, q, o, lse, table, lens
            torch.cuda.empty_cache()


def table(rows):
    print(f"{'kernel':<18} {'problem':<26} {'variant':<18} {'ours':>9} {'torch':>9}  ratio  unit")
    for kind, problem, variant, ours, theirs, unit in rows:
        print(f"{kind:<18} {problem:<26} {variant:<18} {ours:9.1f} {theirs:9.1f} {ours / theirs:6.2f}  {unit}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="correctness only")
    parser.add_argument("--sim", action="store_true", help="correctness on the simulator, tiny shapes")
    args = parser.parse_args(argv)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    tasks = [("forward fp32", task_forward, ([F32],)), ("forward fp16", task_forward, ([F16],)),
             ("forward bf16", task_forward, ([BF16],)), ("decode", task_decode, ()), ("paged", task_paged, ())]
    failures, checked, sweep_results = [], 0, []
    with cf.ProcessPoolExecutor(len(tasks), mp_context=ctx) as pool:
        futures = {pool.submit(fn, *a): name for name, fn, a in tasks}
        if not (args.quick or args.sim):  # meanwhile: compile and check the timed kernels here
            guard(sweep_results, "tile sweep", lambda: "; ".join(f for f in warm() if f))
        for fut in cf.as_completed(futures):
            try:
                fails, n = fut.result()
                failures += fails
                checked += n
            except Exception:
                failures.append(f"{futures[fut]}: crashed\n{traceback.format_exc()}")
    from numba_softmax.runtime import launcher

    failures += [f for f in sweep_results if f]
    checked += len(sweep_results)
    print(f"device: {launcher.device_limits().name}")
    print(f"correctness: {checked - len(failures)}/{checked} checks passed ({time.time() - t0:.0f} s)")
    for f in failures:
        print("FAIL", f)
    if failures or args.quick or args.sim:
        return 1 if failures else 0
    import torch

    timer, rows = Timer(torch), []
    time_forward(torch, timer, rows)
    time_decode(torch, timer, rows)
    table(rows)
    print("targets: fp32 forward >= 1.0x SDPA (33.5 TFLOP/s at S4096 D64); decode >= 0.9x SDPA at "
          "every point and >= 2000 GB/s paged at B1 ctx 4K; GQA >= expanded")
    print(f"total {time.time() - t0:.0f} s")
    return 0


def warm():
    """Compile the kernels the timing uses, and check each tile configuration once.
    Returns the failures."""
    from numba import cuda

    from numba_softmax import reference as R
    from numba_softmax.kernels.attention import attention as KA
    from numba_softmax.kernels.decode import decode_launch as KD
    from numba_softmax.kernels.decode import paged as KP

    rng, fails = np.random.default_rng(), []
    for d, sweep in ((64, SWEEP_64), (128, SWEEP_128)):
        q, k, v = rand(rng, (1, 4, 777, d), F32, 1.5), rand(rng, (1, 2, 901, d), F32), rand(rng, (1, 2, 901, d), F32)
        ref = R.attention(q, k, v, causal=True, return_lse=True)
        for bq, bk, rpl in sweep:
            o, lse = poisoned((1, 4, 777, d), F32), poisoned((1, 4, 777), F32)
            KA.launch(*_dev(q, k, v), o, lse, causal=True, block_q=bq, block_k=bk, rows_per_lane=rpl)
            fails.append(compare(f"forward tiles {bq}x{bk} rpl {rpl} D{d}", o.copy_to_host(),
                                 lse.copy_to_host(), *ref, F32))
    for dtype in (F16, BF16):
        q = cuda.to_device(np.zeros((1, 32, 1, 128), dtype))
        k = cuda.to_device(np.zeros((1, 8, 64, 128), dtype))
        o, lse = cuda.device_array((1, 32, 1, 128), dtype), cuda.device_array((1, 32, 1), np.float32)
        KD.launch(q, k, k, o, lse)
        pool = cuda.to_device(np.zeros((4, 16, 8, 128), dtype))
        KP.launch(q, pool, pool, cuda.to_device(np.arange(4, dtype=np.int32)[None]),
                  cuda.to_device(np.array([64], np.int32)), o, lse)
    cuda.synchronize()
    return fails


if __name__ == "__main__":
    sys.exit(main())
