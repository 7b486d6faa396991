"""Launch-configuration sweep of the top-k paths (issue 18).  (The decode kernel's sweep,
of the tensor-core kernel's tiles, is ``scripts/experiments/decode_tc.py --sweep``.)

    python scripts/experiments/tune_sweep.py [--quick]

Kernel time by CUDA events around calls queued behind ``torch.cuda._sleep`` (so host
time is hidden), median of 5 sets of 20 calls, inputs rotated past the L2.  Each plan is
forced through :func:`numba_softmax.kernels.topk.topk.launch`'s ``plan=`` (the kernel sources
are not touched) and every result is checked against torch's.  Three parts:

1. few rows (B = 1): the radix split's two kernels timed apart (the piece kernel alone,
   the merge alone) and every (threads, values a thread) layout of the pieces;
2. many rows (B = 64, 1024): the chosen plan, the radix split with several waves of
   pieces, and the block-per-row lists, beside torch, with % of one read of the logits;
3. the device copy's GB/s of the same run, for the bound.
Prints tables; nothing is kept.
"""

import argparse
import os
import sys

import numpy as np
import torch
from numba import cuda

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from numba_softmax.runtime import launcher  # noqa: E402
from numba_softmax.kernels.topk import topk as K  # noqa: E402

from _timing import kernel_ms  # noqa: E402  (scripts/experiments/, the script's own folder)


class Case:
    """Rotated float32 inputs of (B, V) past the L2, outputs, torch's answer and time."""

    def __init__(self, B, V, k):
        self.B, self.V, self.k = B, V, k
        self.sets = max(2, min(16, -(-120 * 2**20 // (B * V * 4))))
        self.xs = [torch.randn(B, V, device="cuda") for _ in range(self.sets)]
        self.views = [cuda.as_cuda_array(x) for x in self.xs]
        self.values = torch.empty(B, k, device="cuda")
        self.indices = torch.empty(B, k, device="cuda", dtype=torch.int64)
        self.vv, self.iv = cuda.as_cuda_array(self.values), cuda.as_cuda_array(self.indices)
        self.ref = torch.topk(torch.softmax(self.xs[0], -1), k).values
        self.torch_ms = kernel_ms(lambda i: torch.topk(torch.softmax(self.xs[i], -1), k), self.sets)

    def time(self, plan, skip=None):
        """ms per call of ``plan``; ``skip``: the launch (0 piece, 1 merge) left out."""
        run = lambda i: K.launch(self.views[i], self.k, self.vv, self.iv, plan=plan)  # noqa: E731
        run(0)
        ok = bool(torch.allclose(self.values, self.ref, rtol=1e-5, atol=1e-8))
        if skip is None:
            return kernel_ms(run, self.sets), ok
        real, count = launcher.launch, [0]

        def some(*a, **kw):
            count[0] += 1
            if (count[0] - 1) % 2 != skip:
                real(*a, **kw)

        launcher.launch = some
        try:
            return kernel_ms(run, self.sets), ok
        finally:
            launcher.launch = real

    def gbps(self, ms):
        return self.B * self.V * 4 / ms / 1e6


def radix(V, threads, per, k):
    splits = -(-V // (threads * per))
    if splits * k > K.RADIX_MERGE_THREADS * K.RADIX_MERGE_PER_THREAD:
        return None
    return K.Plan(False, threads, per, splits, True)


def row(label, case, ms, ok):
    print(f"  {label:<34} {ms * 1e3:9.1f} µs {case.torch_ms / ms:7.2f}× torch "
          f"{case.gbps(ms):6.0f} GB/s  {'ok' if ok else 'WRONG'}")


def few_rows(quick):
    limits = launcher.device_limits()
    for V, k in ((128256, 50), (128256, 8)) if quick else ((128256, 50), (128256, 8), (262144, 50), (32000, 50)):
        case = Case(1, V, k)
        chosen = K.choose(1, V, k, np.dtype(np.float32), 4, limits, True)
        print(f"\nB 1 V {V} k {k}: torch {case.torch_ms * 1e3:.1f} µs; chosen {chosen}")
        if chosen.radix or chosen.filter:
            for skip, what in ((None, "both kernels"), (1, "piece kernel only"), (0, "merge kernel only")):
                row(f"chosen, {what}", case, *case.time(chosen, skip))
        for threads, per in ((256, 8), (512, 4)):
            plan = radix(V, threads, per, k)
            if plan is not None:
                row(f"radix {plan.splits} × {threads} × {per}", case, *case.time(plan))
        for splits in (32, 64):
            row(f"filter {splits} × 128 × 16", case, *case.time(K.Plan(False, 128, 16, splits, filter=True)))


def many_rows(quick):
    limits = launcher.device_limits()
    shapes = [(64, 128256, 50), (64, 32000, 50), (64, 128256, 8), (1024, 128256, 50),
              (1024, 32000, 8), (1024, 262144, 50), (1024, 32000, 50), (256, 128256, 50)]
    for B, V, k in shapes[:3] if quick else shapes:
        case = Case(B, V, k)
        chosen = K.choose(B, V, k, np.dtype(np.float32), 4, limits, True)
        print(f"\nB {B} V {V} k {k}: torch {case.torch_ms * 1e3:.1f} µs; chosen {chosen}")
        row("chosen", case, *case.time(chosen))
        for splits in sorted({1, -(-2 * limits.sms // B)}):
            for threads, per in ((64, 16), (128, 16), (256, 16), (256, 8)):
                plan = K.Plan(False, threads, per, splits, filter=True)
                row(f"filter {splits} × {threads} × {per}", case, *case.time(plan))
        for threads in (64, 128, 256, 512):
            row(f"lists block/row × {threads}", case, *case.time(K.Plan(False, threads, 16)))
        for splits in sorted({-(-limits.sms // B), -(-2 * limits.sms // B), -(-4 * limits.sms // B)} - {1}):
            if splits <= K.max_splits(np.dtype(np.float32), k):
                row(f"lists split {splits} × 256", case, *case.time(K.Plan(False, 256, 16, splits)))
        del case


def copy_gbps():
    a = torch.empty(256 * 2**20, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / kernel_ms(lambda i: b.copy_(a), 1, calls=5) / 1e6


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer shapes")
    args = p.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy_gbps():.0f} GB/s (read + write)")
    few_rows(args.quick)
    many_rows(args.quick)
