#!/usr/bin/env python
"""``fused``'s teams (docs/algorithms/fused.md, "Teams of whole warps"): the kernel's
default team at rows of 3072–16384 values in float32, float16 and float64, 528 and 2048
rows, against power-of-two teams (a tree that has them as an option) or against ``onchip``
and ``cluster`` (an older tree, whose default they were), for a package tree given on the
command line — two trees in one command:

    git archive <commit> numba_softmax | tar -x -C scratch_ab/old   # an ignored folder
    python scripts/gpu/fused_teams.py scratch_ab/old old; python scripts/gpu/fused_teams.py . new

Each launch is checked against float32 ``torch.softmax`` (max error < 1e-2, else WRONG),
then timed: kernel time behind a sleeping kernel (``_timing.kernel_ms``), inputs rotated
past the L2, % of a device copy of the same bytes.  Then float32 log-softmax at 2048 rows.
Prints one line a shape; nothing is kept.  Alone on the GPU.
"""
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
label = sys.argv[2] if len(sys.argv) > 2 else "this"
sys.path.insert(0, os.path.abspath(root))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _timing import RowSets, kernel_ms  # noqa: E402

import numba_softmax  # noqa: E402
from numba_softmax.kernels.softmax import fused, methods  # noqa: E402
from numba_softmax.kernels.rows.epilogue import LOG_SOFTMAX, SOFTMAX  # noqa: E402

print(label, numba_softmax.__file__, torch.cuda.get_device_name(), flush=True)
try:  # trees before teams of whole warps have no power-of-two option: they are that
    fused.default_team(1024, np.float32, exact=False)
    NEW = True
except TypeError:
    NEW = False
PLAN = [("float32", (3072, 5120, 6144, 9216, 10240, 11264, 12288, 14336, 16384)),
        ("float16", (5120, 6144, 10240, 12288, 14336)),
        ("float64", (3072, 5120, 6144, 7168))]
for dt, ns in PLAN:
    npdt = np.float16 if dt == "float16" else np.dtype(dt)
    for n in ns:
        for rows in (528, 2048):
            r = RowSets(rows, n, getattr(torch, dt))
            copy = r.copy_gbps()
            line = [f"{label} {dt} {rows}x{n} team {fused.default_team(n, npdt)}:"]
            runs = [("fused", lambda i: methods.launch("fused", SOFTMAX, r.nx[i], r.ny[i]))]
            if NEW:
                pow2 = fused.default_team(n, npdt, exact=False)
                runs.append(("pow2", lambda i: fused.launch(r.nx[i], r.ny[i], SOFTMAX, threads=pow2)))
            else:
                runs += [(m, lambda i, m=m: methods.launch(m, SOFTMAX, r.nx[i], r.ny[i]))
                         for m in ("onchip", "cluster")]
            for name, fn in runs:
                try:
                    r.ys[0].fill_(float("nan"))
                    fn(0)
                    torch.cuda.synchronize()
                    err = float((r.ys[0].float() - r.want).abs().max())
                    if not err < 1e-2:
                        line.append(f"{name} WRONG {err:.1e}")
                        continue
                    ms = kernel_ms(fn, r.sets, rounds=3)
                    line.append(f"{name} {100 * r.gbps(ms) / copy:5.1f}")
                except ValueError:
                    line.append(f"{name} ---")
            print(" ".join(line) + f" (copy {copy:.0f})", flush=True)
            del r
            torch.cuda.empty_cache()
# log_softmax (no kept exps, no register cap in float32) at the rows that change
for n in (10240, 6144, 14336):
    r = RowSets(2048, n, torch.float32)
    copy = r.copy_gbps()
    fn = lambda i: methods.launch("fused", LOG_SOFTMAX, r.nx[i], r.ny[i])
    ms = kernel_ms(fn, r.sets, rounds=3)
    print(f"{label} log_softmax float32 2048x{n} fused {100 * r.gbps(ms) / copy:5.1f}", flush=True)
