#!/usr/bin/env python
"""Top-k of 16-bit rows against float32, for a package tree given on the command line
(issue 18; the table of :ref:`topk-16-bit-words` in ``docs/algorithms/topk.md``):

    git archive <commit> numba_softmax | tar -x -C scratch_ab/old      # an ignored folder
    python scripts/gpu/topk_16bit.py scratch_ab/old old; python scripts/gpu/topk_16bit.py . new
    python scripts/gpu/topk_16bit.py . new --plans        # other layouts, torch beside them
    ncu -k regex:softmax_topk --launch-skip 1 --launch-count 1 --section … \\
        python scripts/gpu/topk_16bit.py . new --launch bfloat16   # one B 1024 × 128256 call

Kernel time by CUDA events behind a sleeping kernel (``_timing.kernel_ms``), inputs
rotated past the L2, N(0, 1) logits rounded to the dtype; GB/s counts one read of the
logits.  Each result is checked against float32 ``torch.topk(torch.softmax(x, -1), k)``
of the same rounded values (the largest error of the values is printed: the indices of
16-bit ties may differ).  Prints one line a case; nothing is kept.
"""

import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
label = sys.argv[2] if len(sys.argv) > 2 else "this"
sys.path.insert(0, os.path.abspath(root))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from numba import cuda  # noqa: E402

import numba_softmax  # noqa: E402
from numba_softmax.kernels.topk import topk as K  # noqa: E402

from _timing import kernel_ms  # noqa: E402

P = K.Plan
CASES = [(1024, 128256, 8), (1024, 128256, 50), (1024, 32000, 8), (1024, 32000, 50),
         (64, 128256, 8), (64, 128256, 50), (1, 128256, 50)]
PLANS = {64: [("split 3x512", P(False, 512, 16, 3)), ("split 2x256", P(False, 256, 16, 2)),
              ("split 4x256", P(False, 256, 16, 4)), ("block 512", P(False, 512, 16)),
              ("block 1024", P(False, 1024, 16))],
         1024: [("block 64x32", P(False, 64, 32)), ("block 128x16", P(False, 128, 16)),
                ("block 96x16", P(False, 96, 16))]}


def view(t):
    """The Numba view of a tensor (bfloat16 as its uint16 bits)."""
    return cuda.as_cuda_array(t.view(torch.uint16) if t.dtype == torch.bfloat16 else t)


def arrays(dtype, B, V, k, sets):
    xs = [torch.randn(B, V, device="cuda").to(dtype) for _ in range(sets)]
    values = torch.empty(B, k, device="cuda", dtype=dtype)
    indices = torch.empty(B, k, device="cuda", dtype=torch.int64)
    return xs, values, indices


def case(dtype, B, V, k, plans, with_torch=False):
    nbytes = B * V * dtype.itemsize
    sets = max(2, min(8, -(-180 * 2**20 // nbytes)))
    xs, values, indices = arrays(dtype, B, V, k, sets)
    views, vv, iv = [view(x) for x in xs], view(values), cuda.as_cuda_array(indices)
    want = torch.topk(torch.softmax(xs[0].float(), -1), k).values
    t_torch = kernel_ms(lambda i: torch.topk(torch.softmax(xs[i], -1), k), sets) if with_torch else None
    for name, plan in plans:
        def run(i, plan=plan):
            K.launch(views[i], k, vv, iv, plan=plan)

        run(0)
        torch.cuda.synchronize()
        err = float((values.float() - want).abs().max())
        ms = kernel_ms(run, sets)
        vs = f"  {t_torch / ms:5.2f}x torch ({t_torch * 1e3:.1f} us)" if with_torch else ""
        print(f"{label:5} {str(dtype)[6:]:8} B {B:5} V {V:6} k {k:3} {name:12} {ms * 1e3:8.1f} us "
              f"{nbytes / ms / 1e6:6.0f} GB/s  err {err:.1e}{vs}", flush=True)


if __name__ == "__main__":
    flags = sys.argv[3:]
    if "--launch" in flags:  # one call to profile (after one that compiles)
        dtype = getattr(torch, flags[flags.index("--launch") + 1])
        xs, values, indices = arrays(dtype, 1024, 128256, 8, 1)
        for _ in range(2):
            K.launch(view(xs[0]), 8, view(values), cuda.as_cuda_array(indices))
            torch.cuda.synchronize()
        sys.exit(0)
    print(f"{label}: {numba_softmax.__file__} on {torch.cuda.get_device_name()}", flush=True)
    for B, V, k in CASES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            extra = PLANS.get(B, []) if "--plans" in flags and dtype == torch.bfloat16 else []
            case(dtype, B, V, k, [("default", None)] + extra, with_torch="--plans" in flags)
