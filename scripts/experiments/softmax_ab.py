#!/usr/bin/env python
"""Softmax kernels timed for a package tree given on the command line, so that two trees
(a checkout of an earlier commit and this one) can be compared in one command (issue 13):

    git archive <commit> numba_softmax | tar -x -C scratch_ab/old   # an ignored folder
    python scripts/experiments/softmax_ab.py scratch_ab/old old; python scripts/experiments/softmax_ab.py . new
    python scripts/experiments/softmax_ab.py . new float32     # a third argument: only that dtype's cases
    python scripts/experiments/softmax_ab.py . new online      # … or only that method's

For each case (shape, dtype, method — fused, cluster, online, group, split, three_pass,
``auto``): a device-to-device copy of the same bytes (torch ``copy_``), then the method
through ``kernels.softmax.methods.launch`` in softmax mode, checked against float32
``torch.softmax`` (max error printed) and timed: kernel time behind a sleeping kernel
(``_timing.kernel_ms``), inputs rotated past the L2, GB/s = read once + written once, % of
the copy. Run the trees one after the other, alone on the GPU. Prints one line a case;
nothing is kept.
"""

import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
label = sys.argv[2] if len(sys.argv) > 2 else "this"
only = sys.argv[3] if len(sys.argv) > 3 else None
sys.path.insert(0, os.path.abspath(root))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import numba_softmax  # noqa: E402
from numba_softmax.kernels.softmax import methods  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

from _timing import RowSets, kernel_ms  # noqa: E402

CASES = [((16384, 1024), "float32", "fused"), ((16384, 1024), "float16", "fused"),
         ((16384, 1024), "bfloat16", "fused"), ((4096, 8192), "float32", "fused"),
         ((2048, 16384), "float16", "auto"), ((1024, 65536), "float32", "cluster"),
         ((1024, 65536), "float16", "cluster"), ((1024, 65536), "bfloat16", "cluster"),
         ((256, 262144), "float32", "cluster"), ((256, 262144), "float16", "cluster"),
         ((4096, 8192), "float16", "fused"), ((4096, 8192), "bfloat16", "fused"),
         ((2048, 16384), "bfloat16", "auto"), ((256, 262144), "bfloat16", "cluster"),
         ((16384, 1024), "float32", "online"), ((1024, 65536), "float32", "group"),
         ((2048, 16384), "float32", "fused"), ((2048, 16384), "float32", "onchip"),
         ((256, 262144), "float32", "online"), ((128, 1048576), "float32", "online"),
         ((1, 16777216), "float32", "split"), ((1024, 65536), "float16", "group"),
         ((4096, 8192), "float32", "three_pass")]


def main():
    if not numba_softmax.__file__.startswith(os.path.abspath(root)):
        sys.exit(f"numba_softmax came from {numba_softmax.__file__}, not from {root}")
    print(f"{label}: {numba_softmax.__file__} on {torch.cuda.get_device_name()}", flush=True)
    for (rows, n), dtype, method in CASES:
        if only is not None and only not in (dtype, method):
            continue
        r = RowSets(rows, n, getattr(torch, dtype))
        copy = r.copy_gbps()
        r.ys[0].fill_(float("nan"))
        ran = methods.launch(method, SOFTMAX, r.nx[0], r.ny[0])
        err = float((r.ys[0].float() - r.want).abs().max())
        ms = kernel_ms(lambda i: methods.launch(method, SOFTMAX, r.nx[i], r.ny[i]), r.sets)
        print(f"{label:5} {dtype:8} {rows}x{n} {method:7} ({ran:7}) {ms * 1e3:8.1f} µs "
              f"{r.gbps(ms):6.0f} GB/s {100 * r.gbps(ms) / copy:5.1f} % of copy ({copy:.0f}) "
              f"max error {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
