"""The small calls of the overhead table, a few times each (for ``ncu``: their kernels'
GPU time, beside the host time the benchmark measures).

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        python scripts/gpu/small_calls.py [NAME ...]

``LINEINFO=1``: every kernel compiled with line information (for ncu's source page).
"""

import os
import sys

import torch
from numba import cuda

if os.environ.get("LINEINFO"):
    _jit = cuda.jit
    cuda.jit = lambda *a, **kw: _jit(*a, lineinfo=True, **kw)

import numba_softmax as ns  # noqa: E402


def main():
    x = torch.randn(1, 1024, device="cuda")
    q = torch.randn(1, 8, 128, 64, device="cuda")
    q1 = torch.randn(1, 8, 1, 64, device="cuda")
    kv = torch.randn(1, 8, 1024, 64, device="cuda")
    o, lse = ns.attention(q, q, q, return_lse=True)
    kc = kv[0].permute(1, 0, 2).reshape(64, 16, 8, 64).contiguous()  # pages of 16
    table = torch.arange(64, dtype=torch.int32, device="cuda")[None]
    lens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
    calls = {"softmax": lambda: ns.softmax(x), "logsumexp": lambda: ns.logsumexp(x),
             "torch.softmax": lambda: torch.softmax(x, -1),
             "attention": lambda: ns.attention(q, q, q),
             "merge": lambda: ns.merge_attention(o, lse, o, lse),
             "decode": lambda: ns.attention(q1, kv, kv, num_splits=4),
             "decode16": lambda: ns.attention(q1, kv, kv, num_splits=16),
             "paged": lambda: ns.paged_attention(q1, kc, kc, table, lens, check=False)}
    for name, fn in calls.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        for _ in range(3):
            torch.cuda.nvtx.range_push(name)
            fn()
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
