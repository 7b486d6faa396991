"""The fused kernel's (v2) team and block sizes against Triton's tutorial kernel (issue 13:
"best method ≥ the Triton tutorial on every shape"): run on a GPU; prints only.

    python scripts/gpu/fused_sweep.py [--quick] [--only float16:4096x8192 ...]

For each shape and dtype: a device-to-device copy of the same bytes, the Triton tutorial
kernel (``numba_softmax.bench.triton_peers``), ``torch.softmax``, the fused kernel's
default launch, and every team of 32 … 512 threads a row (the fewest values a thread that
hold the row) with 1 … 8 teams a block — kernel time behind a sleeping kernel
(``_timing.kernel_ms``), inputs rotated past the L2, GB/s = read once + written once,
% of the copy.  Each launch is checked against ``torch.softmax`` first.  ``--only``
keeps the named shapes (``dtype:ROWSxN``, repeatable).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import RowSets, kernel_ms  # noqa: E402

from numba_softmax.kernels.softmax import fused  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

SHAPES = [((16384, 1024), "float32"), ((16384, 1024), "float16"), ((16384, 1024), "bfloat16"),
          ((4096, 8192), "float32"), ((4096, 8192), "float16"), ((32768, 512), "float32"),
          ((8192, 2048), "float16"), ((8192, 2048), "float32"), ((4096, 4096), "float16"),
          ((2048, 16384), "float16"), ((2048, 16384), "float32")]


def main():
    quick = "--quick" in sys.argv  # the default launch and the old one (4 teams a block) only
    only = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--only"]
    try:
        from numba_softmax.bench import triton_peers
    except ImportError:
        triton_peers = None
    print(f"device: {torch.cuda.get_device_name()}")
    for (rows, n), name in SHAPES:
        if only and f"{name}:{rows}x{n}" not in only:
            continue
        r = RowSets(rows, n, getattr(torch, name))
        copy = r.copy_gbps()
        pct = lambda ms: f"{r.gbps(ms):.0f} GB/s ({100 * r.gbps(ms) / copy:.1f} %)"  # noqa: E731
        line = f"{name} {rows}x{n}: copy {copy:.0f} GB/s"
        line += f" | torch {pct(kernel_ms(lambda i: torch.softmax(r.xs[i], -1), r.sets))}"
        if triton_peers is not None:
            line += (" | triton tutorial "
                     f"{pct(kernel_ms(lambda i: triton_peers.tutorial(r.xs[i], r.ys[i]), r.sets))}")
        print(line, flush=True)
        runs = [dict()] + [dict(threads=t, rows_per_block=b) for t in (32, 64, 128, 256, 512)
                           for b in (1, 2, 4, 8) if t * b <= 1024]
        if quick:
            old = 32 if n <= 1024 else max(64, min(1024, n // 16))  # the team before 8b8a952+
            runs = [dict(), dict(threads=old, rows_per_block=max(1, 128 // old))]
        for config in runs:
            try:
                plan = fused.configure(r.nx[0], r.ny[0], SOFTMAX, **config)
                r.ys[0].fill_(float("nan"))
                fused.launch(r.nx[0], r.ny[0], SOFTMAX, **config)
                err = float((r.ys[0].float() - r.want).abs().max())
                if not err < 1e-2:
                    print(f"  {config}: WRONG, max error {err:.2e}", flush=True)
                    continue
                ms = kernel_ms(lambda i: fused.launch(r.nx[i], r.ny[i], SOFTMAX, **config),
                               r.sets)
            except ValueError as e:
                print(f"  {config}: refused ({str(e)[:60]})", flush=True)
                continue
            print(f"  {str(config or 'default'):40s} team {plan.team:4d} block {plan.block:4d}: "
                  f"{ms * 1e3:7.1f} µs, {pct(ms)}", flush=True)


if __name__ == "__main__":
    main()
