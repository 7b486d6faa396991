#!/usr/bin/env python
"""h1 … h7, the wgmma attention forwards, beside the package's mma.sync kernel, the Triton
peer (:mod:`numba_softmax.bench.triton_attention`) and SDPA.

    python scripts/experiments/hopper_fwd.py [--dtype bf16] [--skip NAME] [--out FILE]

Needs an sm_90 GPU, PyTorch and Triton.  Checks h1 (threads copy the tiles), h2 (TMA, two
stages, a producer warp), h3 (two consumer warpgroups, 128-key tiles, setmaxnreg), h4 (h3
with the softmax of tile j under the product of tile j − 1), h5 (h4 on three stages), h6
(h5 with the two consumers taking turns), h7 (h5 with three consumers, D 64 only) and the
Triton peer against SDPA (float32 math) at each shape first, then times them with the
mma.sync kernel and SDPA, in float16 or bfloat16 (``--dtype``): kernel time behind a
sleeping kernel (``_timing.kernel_ms``: CUDA events, 20 calls a round, the median of 5
rounds); FLOPs 4·B·H·Sq·Sk·D (half with causal).
"""

import argparse
import sys
from pathlib import Path

import torch
from numba import cuda

from numba_softmax.bench import triton_attention
from numba_softmax.kernels.attention import attention_tc, hopper, hopper_ws

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import attention_row, write_table  # noqa: E402

SHAPES = [(4, 16, 4096, 64, False), (4, 16, 4096, 128, False), (4, 16, 4096, 64, True),
          (4, 16, 4096, 128, True), (1, 16, 16384, 64, False), (1, 16, 16384, 128, False),
          (1, 16, 16384, 64, True), (1, 16, 16384, 128, True)]
CHECKED = 8  # the first runs are ours and Triton's: checked, and not timed if they fail


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the table here")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    p.add_argument("--skip", action="append", default=[], help="a kernel not to run (repeatable)")
    args = p.parse_args()
    dev = torch.cuda.get_device_name()
    names = ("h1", "h2", "h3", "h4", "h5", "h6", "h7", "triton", "mma.sync", "SDPA")
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    lines = [f"{args.dtype} attention forward on {dev}: ms and TFLOP/s (4·B·H·S²·D, half causal); "
             "err: max |O − SDPA in float32|",
             f"{'B':>2} {'H':>3} {'S':>5} {'D':>4} {'causal':>6} "
             + " ".join(f"{n:>14}" for n in names) + "   err " + " / ".join(names[:CHECKED])]
    print("\n".join(lines))
    torch.manual_seed(0)
    for b, h, s, d, causal in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        outs = [torch.empty_like(q) for _ in range(9)]
        bits = (lambda t: t) if dtype == torch.float16 else (lambda t: t.view(torch.uint16))
        nq, nk, nv = (cuda.as_cuda_array(bits(t)) for t in (q, k, v))  # bf16: its bits
        nl = cuda.as_cuda_array(lse)
        no = [cuda.as_cuda_array(bits(t)) for t in outs]
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        runs = [lambda _: hopper.launch(nq, nk, nv, no[0], nl, causal=causal, stream=stream),
                lambda _: hopper_ws.launch(nq, nk, nv, no[1], nl, causal=causal, stream=stream),
                *(lambda _, i=i, c=c: hopper_ws.launch(nq, nk, nv, no[i], nl, causal=causal,
                                                       stream=stream, config=c)
                  for i, c in ((2, "h3"), (3, "h4"), (4, "h5"), (5, "h6"), (6, "h7"))),
                lambda _: triton_attention.attention(q, k, v, causal, o=outs[7]),
                lambda _: attention_tc.launch(nq, nk, nv, no[8], nl, causal=causal, stream=stream),
                lambda _: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                           is_causal=causal)]
        for i, name in enumerate(names):
            if name in args.skip or (name in hopper_ws.CONFIGS and not hopper_ws.takes(name, d, d)):
                runs[i] = None
        errs = []
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               is_causal=causal)
        for i in range(CHECKED):
            if runs[i] is None:
                errs.append("skipped")
                continue
            try:
                runs[i](0)
                torch.cuda.synchronize()
                errs.append(f"{(outs[i].float() - ref).abs().max().item():.1e}")
            except Exception as e:  # a kernel that fails here is reported, not timed
                errs.append(f"{type(e).__name__}: {str(e)[:60]}")
                runs[i] = None
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        lines.append(attention_row(b, h, s, d, causal, runs, flops, " / ".join(errs)))
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
