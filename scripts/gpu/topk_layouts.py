#!/usr/bin/env python
"""Top-k layouts timed side by side, for a package tree given on the command line — so that
two trees (a checkout of an earlier commit and this one) can be compared in one run:

    python scripts/gpu/topk_layouts.py [PACKAGE_ROOT] [LABEL]
    git archive <commit> numba_softmax | tar -x -C /tmp/old
    python scripts/gpu/topk_layouts.py /tmp/old old; python scripts/gpu/topk_layouts.py . new

Kernel time by CUDA events behind ``torch.cuda._sleep`` (``_timing.kernel_ms``), inputs
rotated past the L2, float32 N(0, 1) logits; each plan forced through
:func:`numba_softmax.kernels.topk.topk.launch`'s ``plan=`` and checked against
``torch.topk(torch.softmax(x, -1), k)`` (values to 1e-5, indices ≥ 99 % equal: ties in
float32 probabilities may swap).  GB/s counts one read of the logits.  Prints one line a
plan; nothing is kept.
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


def case(B, V, k, plans):
    sets = max(2, min(16, -(-120 * 2**20 // (B * V * 4))))
    xs = [torch.randn(B, V, device="cuda") for _ in range(sets)]
    views = [cuda.as_cuda_array(x) for x in xs]
    values = torch.empty(B, k, device="cuda")
    indices = torch.empty(B, k, device="cuda", dtype=torch.int64)
    vv, iv = cuda.as_cuda_array(values), cuda.as_cuda_array(indices)
    ref = torch.topk(torch.softmax(xs[0], -1), k)
    for name, plan in plans:
        def run(i):
            K.launch(views[i], k, vv, iv, plan=plan)

        run(0)
        torch.cuda.synchronize()
        ok = (bool(torch.allclose(values, ref.values, rtol=1e-5, atol=1e-8))
              and bool((indices == ref.indices).float().mean() > 0.99))
        ms = kernel_ms(run, sets)
        print(f"{label:5} B {B:5} V {V:6} k {k:3} {name:14} {ms * 1e3:8.1f} µs "
              f"{B * V * 4 / ms / 1e6:6.0f} GB/s {'ok' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    P = K.Plan
    print(f"{label}: {numba_softmax.__file__} on {torch.cuda.get_device_name()}")
    for k in (1, 8, 50):
        case(1024, 128256, k, [("block 64 x16", P(False, 64, 16)), ("block 64 x8", P(False, 64, 8))])
    for V in (32000, 262144):
        for k in (8, 50):
            case(1024, V, k, [("block 64 x16", P(False, 64, 16))])
    for V in (32000, 128256, 262144):
        for k in (8, 50):
            case(64, V, k, [("block 512 x16", P(False, 512, 16)), ("split 2x512", P(False, 512, 16, 2)),
                            ("filter 256x8", P(False, 256, 8, 1, filter=True))])
    for k in (8, 50):
        case(256, 128256, k, [("block 256 x16", P(False, 256, 16)), ("filter 256x8", P(False, 256, 8, 1, filter=True))])
