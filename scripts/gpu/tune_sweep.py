"""Launch-configuration sweeps for the decode kernel and the split top-k (issues 17, 18).

    python scripts/gpu/tune_sweep.py [--only decode|topk]

Kernel time by CUDA events around calls queued behind ``torch.cuda._sleep`` (so host
time is hidden), median of 5 sets of 20 calls, inputs rotated past the L2.  Each
configuration is forced by replacing the module's choice for the run (the kernel sources
are not touched) and every result is checked against the default configuration's.
Prints a table per case; nothing is kept.
"""

import argparse
import statistics

import numpy as np
import torch

import numba_softmax as ns
from numba_softmax import plans
from numba_softmax.kernels import decode, topk


def kernel_ms(fn, sets, calls=20, rounds=5):
    fn(0)
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(4_000_000)  # ~2 ms: the calls below are queued before it ends
        start.record()
        for i in range(calls):
            fn(i % sets)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / calls)
    return statistics.median(out)


def fresh_plans():
    with plans._LOCK:
        plans._PLANS.clear()


def decode_sweep():
    hq, hkv, d = 32, 8, 128
    cases = []
    for batch, ctx in ((1, 4096), (1, 131072), (16, 32768), (64, 4096)):
        nbytes = 2 * batch * hkv * ctx * d * 2
        sets = max(1, min(8, (200 << 20) // nbytes + 1))
        data = [(torch.randn(batch, hq, 1, d, device="cuda", dtype=torch.float16),
                 torch.randn(batch, hkv, ctx, d, device="cuda", dtype=torch.float16),
                 torch.randn(batch, hkv, ctx, d, device="cuda", dtype=torch.float16))
                for _ in range(sets)]
        sdpa = kernel_ms(lambda i: torch.nn.functional.scaled_dot_product_attention(
            *data[i], enable_gqa=True), sets)
        want = ns.attention(*data[0], num_splits=None).float()
        cases.append((batch, ctx, nbytes, sets, data, sdpa, want))
        print(f"decode B{batch} ctx {ctx}: SDPA {sdpa * 1e3:.1f} µs = {nbytes / sdpa / 1e6:.0f} GB/s")
    print(f"\n{'case':>14} {'warps':>5} {'unroll':>6} {'splits':>7} {'µs':>8} {'GB/s':>6} {'× SDPA':>7} max|diff|")
    base_lanes, base_warps = decode.lanes, decode.WARPS
    for warps in (4, 8, 16):
        for unroll in (2, 4, 8):
            def lanes(dtype, dd, dv, unroll=unroll):
                lpk, kpw, _ = base_lanes(dtype, dd, dv)
                return lpk, kpw, unroll

            decode.lanes, decode.WARPS = lanes, warps
            decode.kernel.cache_clear()
            for batch, ctx, nbytes, sets, data, sdpa, want in cases:
                for splits in (None, "x2"):
                    fresh_plans()
                    n = None
                    if splits == "x2":
                        n = min(decode.MAX_SPLITS, 2 * max(1, round(1056 / (batch * hkv))))
                    name = f"B{batch} {ctx}"
                    try:
                        t = kernel_ms(lambda i: ns.attention(*data[i], num_splits=n), sets)
                        diff = float((ns.attention(*data[0], num_splits=n).float() - want).abs().max())
                    except Exception as e:  # noqa: BLE001 - a configuration that cannot launch
                        print(f"{name:>14} {warps:>5} {unroll:>6} {str(splits):>7}  {type(e).__name__}: {e}"[:160])
                        continue
                    print(f"{name:>14} {warps:>5} {unroll:>6} {str(n or 'auto'):>7} {t * 1e3:8.1f} "
                          f"{nbytes / t / 1e6:6.0f} {sdpa / t:7.2f} {diff:.1e}")
    decode.lanes, decode.WARPS = base_lanes, base_warps
    decode.kernel.cache_clear()
    fresh_plans()


def topk_sweep():
    base = topk.choose
    for batch, vocab, k in ((1, 128256, 50), (1, 128256, 8), (1, 262144, 50)):
        sets = 8
        xs = [torch.randn(batch, vocab, device="cuda") for _ in range(sets)]
        ref = torch.topk(torch.softmax(xs[0], -1), k)
        torch_ms = kernel_ms(lambda i: torch.topk(torch.softmax(xs[i], -1), k), sets)
        default = base(batch, vocab, k, np.dtype(np.float32), 4, topk.launcher.device_limits())
        print(f"\ntopk B{batch} V{vocab} k{k}: torch {torch_ms * 1e3:.1f} µs; default {default}")
        print(f"{'threads':>7} {'vpt':>4} {'splits':>6} {'µs':>8} {'× torch':>8} ok")
        for threads in (128, 256, 512):
            for vpt in (4, 8, 16):
                for splits in (8, 16, 32, 64):
                    plan = topk.Plan(False, threads, vpt, splits)
                    topk.choose = lambda *a, plan=plan: plan
                    fresh_plans()
                    try:
                        t = kernel_ms(lambda i: ns.softmax_topk(xs[i], k), sets)
                        v, idx = ns.softmax_topk(xs[0], k)
                        ok = bool(torch.allclose(v, ref.values, rtol=1e-5, atol=1e-7))
                    except Exception as e:  # noqa: BLE001
                        print(f"{threads:>7} {vpt:>4} {splits:>6}  {type(e).__name__}: {e}"[:150])
                        continue
                    print(f"{threads:>7} {vpt:>4} {splits:>6} {t * 1e3:8.1f} {torch_ms / t:8.2f} {ok}")
        topk.choose = base
        fresh_plans()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--only", choices=("decode", "topk"))
    a = p.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    if a.only != "decode":
        topk_sweep()
    if a.only != "topk":
        decode_sweep()
