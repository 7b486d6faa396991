#!/usr/bin/env python
"""hb1 and hb2, the wgmma attention backwards, beside b3 (the package's mma.sync
backward) and SDPA's backward; at D 64 also hb2 in one kernel (``fused=True``).

    python scripts/experiments/hopper_bwd.py [--dtype bf16] [--out FILE] [--profile N]

Needs an sm_90 GPU and PyTorch.  At each shape: O and LSE from h2 (the wgmma forward),
dO random; hb1's and hb2's gradients compared with b3's (max |difference| over dQ, dK,
dV: kernels that share no code with b3 but the references' rule), then each timed —
kernel time behind a sleeping kernel (``_timing.kernel_ms``: CUDA events, 20 calls a
round, the median of 5 rounds), the preprocess and dQ-rounding kernels counted — and
SDPA's backward (``torch.autograd.grad`` of its output, the forward not counted).  FLOPs
10·B·H·S²·D (the five products; half with causal), what FlashAttention's papers count.
``--profile N``: after the table, one call of each at the first shape under torch.profiler,
with its N costliest GPU kernels — where a backward's time goes (hb1's and hb2's dK/dV and
dQ kernels apart, the preprocess and the dQ rounding).
"""

import argparse
import sys
from pathlib import Path

import torch
from numba import cuda

from numba_softmax.kernels.attention import hopper_ws
from numba_softmax.kernels.backward import attention_backward_tc_launch as b3
from numba_softmax.kernels.backward import hopper_backward as hb
from numba_softmax.kernels.backward import hopper_backward_ws as hb2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import attention_row, profile_lines, profiled, write_table  # noqa: E402

SHAPES = [(4, 16, 4096, 64, False), (4, 16, 4096, 128, False), (4, 16, 4096, 64, True),
          (4, 16, 4096, 128, True), (1, 16, 16384, 64, False), (1, 16, 16384, 128, False),
          (1, 16, 16384, 64, True), (1, 16, 16384, 128, True)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the table here")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    p.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also list each backward's N costliest GPU kernels at the first shape")
    args = p.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    names = ("hb1", "hb2", "hb2 fused", "b3 (mma.sync)", "SDPA")
    lines = [f"{args.dtype} attention backward on {torch.cuda.get_device_name()}: ms and "
             "TFLOP/s (10·B·H·S²·D, half causal); |hb1 − b3|: max over dQ, dK, dV",
             f"{'B':>2} {'H':>3} {'S':>5} {'D':>4} {'causal':>6} "
             + " ".join(f"{n:>14}" for n in names) + "   |hb1 − b3| |hb2 − b3| |fused − b3|"]
    print("\n".join(lines), flush=True)
    torch.manual_seed(0)
    bits = (lambda t: t) if dtype == torch.float16 else (lambda t: t.view(torch.uint16))
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    profiles = []
    for b, h, s, d, causal in SHAPES[:args.shapes]:
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
        o, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        nb = [cuda.as_cuda_array(bits(t)) for t in (do, q, k, v, o)]
        nl = cuda.as_cuda_array(lse)
        hopper_ws.launch(*nb[1:4], nb[4], nl, causal=causal, stream=stream)
        grads = [[torch.empty_like(q) for _ in range(3)] for _ in range(4)]
        ng = [[cuda.as_cuda_array(bits(t)) for t in g] for g in grads]
        runs = [lambda _: hb.launch(*nb, nl, *ng[0], causal=causal, stream=stream),
                lambda _: hb2.launch(*nb, nl, *ng[1], causal=causal, stream=stream),
                (lambda _: hb2.launch(*nb, nl, *ng[2], causal=causal, stream=stream, fused=True))
                if d == 64 else None,
                lambda _: b3.launch(*nb, nl, *ng[3], causal=causal, stream=stream)]
        for fn in runs:
            if fn is not None:
                fn(0)
        torch.cuda.synchronize()
        diffs = [max((x.float() - y.float()).abs().max().item() for x, y in zip(g, grads[3]))
                 if fn is not None else None for g, fn in zip(grads[:3], runs)]
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        runs.append(lambda _: torch.autograd.grad(out, leaves, do, retain_graph=True))
        flops = 10 * b * h * s * s * d * (0.5 if causal else 1.0)
        lines.append(attention_row(b, h, s, d, causal, runs, flops,
                                   "    ".join("   —   " if x is None else f"{x:.1e}"
                                              for x in diffs)))
        if args.profile and not profiles:  # the first shape: one call of each, profiled
            shape = f"B {b}, H {h}, S {s}, D {d}{', causal' if causal else ''}"
            profiles = [profile_lines(f"{name} at {shape}, one call",
                                      profiled(lambda fn=fn: fn(0), args.profile))
                        for name, fn in zip(names, runs) if fn is not None]
    for more in profiles:
        print("\n".join(more), flush=True)
        lines += more
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
