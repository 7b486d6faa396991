"""The group kernel's launch choices on long rows (issue 13): run on a GPU; prints only.

    python scripts/experiments/group_sweep.py [--quick | --default | --per-sm]

For float32 rows of 65536 … 16M values (and float16 at 262144): a device-to-device copy
of the same bytes (torch ``copy_``), ``torch.softmax``, ``online``, and ``group`` with
each (threads, values a thread loads per chunk, blocks per multiprocessor) — kernel time
behind a sleeping kernel (``_timing.kernel_ms``), inputs rotated past the L2.  GB/s =
bytes read once + written once; % of the copy's GB/s.  Each variant is checked against
``torch.softmax`` first.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import RowSets, kernel_ms  # noqa: E402

from numba_softmax.kernels.softmax import group, online  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

SHAPES = [((1024, 65536), torch.float32), ((256, 262144), torch.float32),
          ((128, 1048576), torch.float32), ((1, 16777216), torch.float32),
          ((256, 262144), torch.float16)]
# (threads, vpt, shared cap): None = the defaults; a cap past half an SM's shared memory
# leaves one block a multiprocessor
VARIANTS = [(None, None, None), (512, 16, None), (256, None, None), (1024, None, None),
            (512, None, 200_000)]
# --per-sm: (threads, blocks a multiprocessor) — the kernel recompiled with launch bounds
# for that many blocks (``group.BLOCKS_PER_SM``), each with its share of shared memory
PER_SM = [(512, 2), (256, 4), (512, 3), (512, 4), (256, 6), (256, 8)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="three shapes, the default launch")
    p.add_argument("--default", action="store_true", help="every shape, the default launch")
    p.add_argument("--per-sm", action="store_true", help="sweep blocks a multiprocessor")
    a = p.parse_args()
    shapes = SHAPES[:1] + SHAPES[3:] if a.quick else SHAPES
    print(f"device: {torch.cuda.get_device_name()}")
    variants = VARIANTS[:1] if a.quick or a.default else VARIANTS
    if a.per_sm:
        variants = [(t, None, None, per_sm) for t, per_sm in PER_SM]
    for (rows, n), dt in shapes:
        r = RowSets(rows, n, dt)
        sets, xs, ys, nx, ny, want, gbps = r.sets, r.xs, r.ys, r.nx, r.ny, r.want, r.gbps
        copy = r.copy_gbps()
        line = f"{dt} {rows}x{n}: copy {copy:.0f} GB/s"
        torch_ms = kernel_ms(lambda i: torch.softmax(xs[i], -1), sets)
        line += f" | torch {gbps(torch_ms):.0f} ({100 * gbps(torch_ms) / copy:.1f} %)"
        online_ms = kernel_ms(lambda i: online.launch(nx[i], ny[i], SOFTMAX), sets)
        line += f" | online {gbps(online_ms):.0f} ({100 * gbps(online_ms) / copy:.1f} %)"
        print(line, flush=True)
        for threads, vpt, shared, *per_sm in variants:
            name = f"group threads={threads} vpt={vpt} shared={shared}"
            if per_sm:
                group.BLOCKS_PER_SM = per_sm[0]
                group.kernel.cache_clear()
                name += f" blocks/SM={per_sm[0]}"
            try:
                ys[0].fill_(float("nan"))
                group.launch(nx[0], ny[0], SOFTMAX, threads, vpt, shared)
                err = float((ys[0].float() - want).abs().max())
                if not err < 1e-3:
                    print(f"  {name}: WRONG, max error {err:.2e}")
                    continue
                plan = group.configure(nx[0], ny[0], SOFTMAX, threads, vpt, shared)
                ms = kernel_ms(lambda i: group.launch(nx[i], ny[i], SOFTMAX, threads, vpt,
                                                      shared), sets)
                print(f"  {name}: size {plan.size} groups {plan.groups} threads {plan.threads} "
                      f"piece {plan.piece} spill {plan.spill}: {ms * 1e3:.1f} µs, "
                      f"{gbps(ms):.0f} GB/s ({100 * gbps(ms) / copy:.1f} % of copy)", flush=True)
            except Exception as e:  # noqa: BLE001 - a variant that cannot launch is reported
                print(f"  {name}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
