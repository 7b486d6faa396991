"""The small float32 decode calls of the overhead table, kernel and call time, for kernel
variants (issue 12's decode rows): run on a GPU; prints only.

    python scripts/gpu/decode_small.py [--variants U:WARPS ...]

Each variant sets the keys a lane loads at once (U, :func:`numba_softmax.kernels.decode.decode.lanes`)
and the warps of a block, then times the dense call (B 1, H 8, Sk 1024, D 64, float32,
1–16 splits) and the paged one (pages of 16, automatic splits, ``check=False``): kernel
time behind a sleeping kernel, and the synchronised call beside ``torch.softmax``'s.
Every variant's output is compared with the first's.
"""

import argparse
import time

import numpy as np
import torch

import numba_softmax as ns
from numba_softmax import plans
from numba_softmax.kernels.decode import decode

from _timing import kernel_ms

_LANES = decode.lanes


def per_call_us(fn, calls=400, loops=7, sync=True):
    """Median per-call µs of fn()+synchronize, loops alternating with torch.softmax's;
    returns (µs, ratio to torch.softmax)."""
    x = torch.randn(1, 1024, device="cuda")
    base = lambda: torch.softmax(x, -1)  # noqa: E731
    mine, theirs = [], []
    for f in (fn, base):
        f()
    torch.cuda.synchronize()
    for _ in range(loops):
        for f, out in ((fn, mine), (base, theirs)):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
                if sync:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) / calls * 1e6)
    ratios = [a / b for a, b in zip(mine, theirs)]
    return float(np.median(mine)), float(np.median(ratios))


def variant(u, warps):
    decode.lanes = lambda dtype, d, dv: _LANES(dtype, d, dv)[:2] + (u,)
    decode.WARPS = warps
    decode.kernel.cache_clear()
    with plans._LOCK:
        plans._PLANS.clear()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", nargs="*", default=["2:8", "4:8", "8:8", "2:16", "4:16"])
    a = p.parse_args()
    torch.manual_seed(0)
    h, d, ctx, page = 8, 64, 1024, 16
    q = torch.randn(1, h, 1, d, device="cuda")
    kv = torch.randn(1, h, ctx, d, device="cuda")
    per_seq = ctx // page
    kc = kv[0].permute(1, 0, 2).reshape(per_seq, page, h, d).contiguous()
    table = torch.arange(per_seq, dtype=torch.int32, device="cuda")[None]
    lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
    first = None
    print(f"device: {torch.cuda.get_device_name()}")
    for v in a.variants:
        u, warps = map(int, v.split(":"))
        variant(u, warps)
        outs = {s: ns.attention(q, kv, kv, num_splits=s) for s in (1, 2, 4, 8, 16)}
        outs["paged"] = ns.paged_attention(q, kc, kc, table, lens, check=False)
        if first is None:
            first = outs
        err = max(float((outs[k] - first[k]).abs().max()) for k in outs)
        ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv)
        err_ref = max(float((outs[k] - ref).abs().max()) for k in outs)
        line = [f"U {u} warps {warps}: max |Δ| vs first {err:.2e}, vs SDPA {err_ref:.2e}; kernel µs"]
        for s in (1, 2, 4, 8, 16):
            line.append(f"z{s} {kernel_ms(lambda i, s=s: ns.attention(q, kv, kv, num_splits=s), 1) * 1e3:.2f}")
        line.append(f"paged {kernel_ms(lambda i: ns.paged_attention(q, kc, kc, table, lens, check=False), 1) * 1e3:.2f}")
        print("  ".join(line), flush=True)
        us, x = per_call_us(lambda: ns.attention(q, kv, kv, num_splits=4))
        us_p, x_p = per_call_us(lambda: ns.paged_attention(q, kc, kc, table, lens, check=False))
        host = per_call_us(lambda: ns.attention(q, kv, kv, num_splits=4), sync=False)[0]
        host_p = per_call_us(lambda: ns.paged_attention(q, kc, kc, table, lens, check=False),
                             sync=False)[0]
        print(f"    call µs (× torch.softmax): dense z4 {us:.1f} ({x:.2f}×), paged {us_p:.1f} "
              f"({x_p:.2f}×); unsynchronised {host:.1f}, {host_p:.1f}", flush=True)


if __name__ == "__main__":
    main()
