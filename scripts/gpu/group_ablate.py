"""What the group kernel's exchange costs (issue 13): the shipped kernel timed beside the
same source with its group barrier replaced by a block barrier — no atomic, no spin, so
each block folds whatever states are posted (wrong results: a timing bound only).
GPU only; prints only.

    python scripts/gpu/group_ablate.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import RowSets, kernel_ms  # noqa: E402

from numba import cuda  # noqa: E402

from numba_softmax.kernels.softmax import group  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

SHAPES = [((1024, 65536), torch.float32), ((256, 262144), torch.float32),
          ((128, 1048576), torch.float32), ((256, 262144), torch.float16)]


@cuda.jit(device=True)
def no_group_barrier(counters, g, size):
    cuda.syncthreads()  # the block's own barrier only: the group is never waited for


def main():
    print(f"device: {torch.cuda.get_device_name()}")
    shipped = group.group_barrier
    for (rows, n), dt in SHAPES:
        r = RowSets(rows, n, dt)
        copy = r.copy_gbps()
        line = f"{dt} {rows}x{n}: copy {copy:.0f} GB/s"
        for name, barrier in (("shipped", shipped), ("no group barrier", no_group_barrier)):
            group.group_barrier = barrier
            group.kernel.cache_clear()
            ms = kernel_ms(lambda i: group.launch(r.nx[i], r.ny[i], SOFTMAX), r.sets)
            line += f" | {name} {r.gbps(ms):.0f} ({100 * r.gbps(ms) / copy:.1f} %)"
        group.group_barrier = shipped
        group.kernel.cache_clear()
        print(line, flush=True)


if __name__ == "__main__":
    main()
