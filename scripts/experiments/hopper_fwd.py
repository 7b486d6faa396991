#!/usr/bin/env python
"""h1, the wgmma attention forward, beside the package's mma.sync kernel and PyTorch's SDPA.

    python scripts/experiments/hopper_fwd.py [--out FILE]

Needs an sm_90 GPU and PyTorch.  Checks h1 against SDPA (float32 math) at each shape
first, then times the three: kernel time behind a sleeping kernel (``_timing.kernel_ms``:
CUDA events, 20 calls a round, the median of 5 rounds); FLOPs 4·B·H·Sq·Sk·D (half with
causal).
"""

import argparse
import sys
from pathlib import Path

import torch
from numba import cuda

from numba_softmax.kernels.attention import attention_tc, hopper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import kernel_ms  # noqa: E402

SHAPES = [(4, 16, 4096, 64, False), (4, 16, 4096, 128, False), (4, 16, 4096, 128, True),
          (8, 16, 1024, 64, True)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the table here")
    args = p.parse_args()
    dev = torch.cuda.get_device_name()
    lines = [f"h1 (wgmma) beside attention_tc (mma.sync) and SDPA, fp16, on {dev}",
             f"{'B':>2} {'H':>3} {'S':>5} {'D':>4} {'causal':>6}  {'max|h1-sdpa|':>12} "
             f"{'h1 ms':>8} {'TF/s':>6} {'tc ms':>8} {'TF/s':>6} {'sdpa ms':>8} {'TF/s':>6}"]
    print(lines[0])
    torch.manual_seed(0)
    for b, h, s, d, causal in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        nq, nk, nv, no, nl = (cuda.as_cuda_array(t) for t in (q, k, v, o, lse))
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)

        def run_h1(_):
            hopper.launch(nq, nk, nv, no, nl, causal=causal, stream=stream)

        def run_tc(_):
            attention_tc.launch(nq, nk, nv, no, nl, causal=causal, stream=stream)

        def run_sdpa(_):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        run_h1(0)
        torch.cuda.synchronize()
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               is_causal=causal)
        err = (o.float() - ref).abs().max().item()
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        row = []
        for fn in (run_h1, run_tc, run_sdpa):
            ms = kernel_ms(fn, 1)
            row += [ms, flops / ms / 1e9]
        line = (f"{b:>2} {h:>3} {s:>5} {d:>4} {str(causal):>6}  {err:>12.2e} "
                + " ".join(f"{row[i]:>8.3f} {row[i + 1]:>6.1f}" for i in (0, 2, 4)))
        print(line, flush=True)
        lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
