"""The cluster kernel (issue 13) beside ``group``, ``onchip`` and ``torch.softmax``: run on
a GPU (sm_90); prints only.

    python scripts/gpu/cluster_sweep.py [--sizes 2,4,8]

For rows of 16K … 256K values (float32, float16): a device-to-device copy of
the same bytes, ``torch.softmax``, ``group`` (its default launch), ``onchip`` where the row
fits one block, and ``cluster`` with its default launch (the pieces in registers where they fit), with its
pieces in shared memory (``registers=False``), and each of ``--sizes`` —
kernel time behind a sleeping kernel (``_timing.kernel_ms``), inputs rotated past the
L2; GB/s = read once + written once; % of the copy's GB/s.  Each launch is checked
against ``torch.softmax`` first.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import RowSets, kernel_ms  # noqa: E402

from numba_softmax.kernels.softmax import cluster, methods  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

SHAPES = [((2048, 16384), "float32"), ((1024, 65536), "float32"), ((512, 131072), "float32"),
          ((256, 262144), "float32"), ((1024, 65536), "float16"), ((256, 262144), "float16"),
          ((1024, 65536), "bfloat16"), ((4096, 20000), "float32")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="2,4,8")
    p.add_argument("--runs", default="", help="more cluster launches, e.g. "
                   "'registers=True,vpt=32|registers=True,threads=512' (integers, True/False)")
    p.add_argument("--shapes", default="", help="only these, e.g. 1024x65536:float16")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s]
    extra = [{k: eval(v) for k, v in (kv.split("=") for kv in run.split(","))}
             for run in a.runs.split("|") if run]
    shapes = SHAPES if not a.shapes else [
        (tuple(int(d) for d in shape.split(":")[0].split("x")), shape.split(":")[1])
        for shape in a.shapes.split(",")]
    print(f"device: {torch.cuda.get_device_name()}")
    for (rows, n), name in shapes:
        r = RowSets(rows, n, getattr(torch, name))
        copy = r.copy_gbps()
        pct = lambda ms: f"{r.gbps(ms):.0f} GB/s ({100 * r.gbps(ms) / copy:.1f} %)"  # noqa: E731
        torch_ms = kernel_ms(lambda i: torch.softmax(r.xs[i], -1), r.sets)
        print(f"{name} {rows}x{n}: copy {copy:.0f} GB/s | torch {pct(torch_ms)} | auto → "
              f"{methods.choose(rows, n, r.nx[0].dtype, methods.launcher.device_limits())}",
              flush=True)
        runs = [("group", dict()), ("onchip", dict()), ("cluster", dict()),
                ("cluster", dict(registers=False))]
        runs += [("cluster", dict(size=s)) for s in sizes] + [("cluster", e) for e in extra]
        for method, config in runs:
            label = f"  {method} {config or 'default'}"
            launch = methods.KERNELS[method].launch
            try:
                r.ys[0].fill_(float("nan"))
                launch(r.nx[0], r.ny[0], SOFTMAX, **config)
                err = float((r.ys[0].float() - r.want).abs().max())
                if not err < 1e-3:
                    print(f"{label}: WRONG, max error {err:.2e}", flush=True)
                    continue
                ms = kernel_ms(lambda i: launch(r.nx[i], r.ny[i], SOFTMAX, **config), r.sets)
                plan = ""
                if method == "cluster":
                    c = cluster.configure(r.nx[0], r.ny[0], SOFTMAX, **config)
                    where = "registers" if c.shared == 0 else "shared"
                    plan = f"size {c.size} threads {c.threads} piece {c.piece} ({where}): "
                print(f"{label}: {plan}{ms * 1e3:.1f} µs, {pct(ms)}", flush=True)
            except ValueError as e:
                print(f"{label}: refused ({str(e)[:80]})", flush=True)


if __name__ == "__main__":
    main()
