#!/usr/bin/env python
"""The streaming kernels' team launch, old against current (issue 13): ``online`` and
``three_pass`` at the bench's shapes, each launched as before (a team as wide as one chunk
of the row, two 16-byte vectors a thread) and by today's ``configure`` (16 values a
thread and narrower teams where the rows fill the device), plus the neighbours the
choice was made from (online: 16 values in one or four chunks, 32 in one).

    python scripts/gpu/team_launch.py

Kernel time behind a sleeping kernel (``_timing.kernel_ms``), inputs rotated past the L2,
% of a same-size device copy (torch ``copy_``) of the same run; each launch checked
against float32 ``torch.softmax`` first (``ERR`` if off).  Prints one line a shape.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from numba_softmax.kernels.rows import chunk
from numba_softmax.kernels.softmax import online, three_pass  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

from _timing import RowSets, kernel_ms  # noqa: E402

SHAPES = [((16384, 1024), "float32"), ((4096, 8192), "float32"), ((2048, 16384), "float32"),
          ((1024, 65536), "float32"), ((256, 262144), "float32"), ((16384, 1024), "float16"),
          ((4096, 8192), "float16"), ((2048, 16384), "bfloat16"), ((1024, 65536), "float16"),
          ((256, 262144), "float16"), ((16384, 1024), "bfloat16"), ((37, 1128), "float32"),
          ((1, 16777216), "float32")]


def launches(r, w):
    """(name, plan of input i) for each launch compared."""
    fixed = lambda mod, vpt, chunks: (lambda i: chunk.team_plan(  # noqa: E731
        mod.kernel, r.nx[i], r.ny[i], SOFTMAX, vpt, None, min_block=256, chunks=chunks))
    return [("online old", fixed(online, 2 * w, 1)),
            ("online now", lambda i: online.configure(r.nx[i], r.ny[i], SOFTMAX)),
            ("16 x1", fixed(online, 16, 1)), ("32 x1", fixed(online, 32, 1)), ("16 x4", fixed(online, 16, 4)),
            ("three_pass old", fixed(three_pass, 2 * w, 1)),
            ("three_pass now", lambda i: three_pass.configure(r.nx[i], r.ny[i], SOFTMAX))]


def main():
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    for (rows, n), dtype in SHAPES:
        r = RowSets(rows, n, getattr(torch, dtype))
        copy = r.copy_gbps()
        out = []
        for name, plan in launches(r, 4 if dtype == "float32" else 8):
            r.ys[0].fill_(float("nan"))
            p = plan(0)
            chunk.run(p)
            err = float((r.ys[0].float() - r.want).abs().max())
            ms = kernel_ms(lambda i: chunk.run(plan(i)), r.sets)
            out.append(f"{name} (team {p.team}) {100 * r.gbps(ms) / copy:5.1f}{'' if err < 1e-2 else ' ERR'}")
        print(f"{dtype:8} {rows}x{n}: " + " | ".join(out), flush=True)


if __name__ == "__main__":
    main()
