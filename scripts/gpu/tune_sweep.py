"""Launch-configuration sweep of the split top-k (issue 18).  (The decode kernel's sweep,
of the tensor-core kernel's tiles, is ``scripts/gpu/decode_tc.py --sweep``.)

    python scripts/gpu/tune_sweep.py

Kernel time by CUDA events around calls queued behind ``torch.cuda._sleep`` (so host
time is hidden), median of 5 sets of 20 calls, inputs rotated past the L2.  Each
configuration is forced by replacing the module's choice for the run (the kernel sources
are not touched) and every result is checked against the default configuration's.
Prints a table per case; nothing is kept.
"""

import argparse

import numpy as np
import torch

import numba_softmax as ns
from numba_softmax import plans
from numba_softmax.kernels import topk

from _timing import kernel_ms  # (scripts/gpu/, the script's own folder)


def fresh_plans():
    with plans._LOCK:
        plans._PLANS.clear()


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
    p.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    topk_sweep()
