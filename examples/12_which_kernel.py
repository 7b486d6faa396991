"""12 — which kernel: what ``auto`` picks for a shape, and whether it is the fastest here.

Seven kernels compute the same softmax.  Three keep a row on chip and compete for rows of
16–160 KB: ``fused`` (the row in registers, a team of up to 512 threads × 32 values),
``onchip`` (one block's shared memory) and ``cluster`` (a thread-block cluster's, sm_90);
``group`` (blocks meeting through global memory) takes the rest.  ``method="auto"`` picks
one from the row's bytes, its item size and the number of rows, against a table measured
on an H200 (``numba_softmax/kernels/softmax/crossovers.json``, ``docs/algorithms/auto.md``;
``numba-softmax bench --crossovers`` measures it on your own GPU).

  table 1  per shape: the row's bytes, the share of a multiprocessor's register slots
           ``fused``'s blocks of such rows would fill (past 32 KB the rule asks for
           80 %), ``auto``'s pick, and each method's
           largest error against the float64 NumPy softmax ("—": it does not take the
           shape);
  table 2  on a GPU: each method's kernel time as % of a device copy of the same bytes
           (inputs rotated past the L2), the fastest, and ``auto`` against it — whether
           the table holds on your GPU.

    python examples/12_which_kernel.py          # on the GPU
    python examples/12_which_kernel.py --sim    # on the CUDA simulator (tiny rows, no times)
"""

import math

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.kernels.softmax import fused, methods
from numba_softmax.runtime import launcher

METHODS = ("fused", "onchip", "cluster", "group")
GPU_SHAPES = [("float32", 2048, 8192), ("float32", 2048, 12288), ("float32", 528, 14336),
              ("float32", 2048, 16384), ("float32", 66, 16384), ("float32", 2048, 24576),
              ("float32", 2048, 32768), ("float16", 2048, 12288), ("float16", 2048, 16384),
              ("float16", 2048, 32768)]
SIM_SHAPES = [("float32", 3, 37), ("float32", 5, 760), ("float16", 3, 300), ("float32", 2, 1128),
              ("float32", 4, 3000), ("float16", 1, 5000)]


def main():
    args = _common.parse(__doc__)
    sim = args.sim
    limits = launcher.device_limits()
    print(f"device: {_common.device_name(sim)}")
    picks, speeds = [], []
    for name, rows, n in _common.pick(args, SIM_SHAPES, GPU_SHAPES):
        dtype = np.dtype(name)
        x = (np.random.default_rng().standard_normal((rows, n)) * 3).astype(dtype)
        want = R.softmax(x.astype(np.float64))
        sets = max(1, math.ceil(3 * limits.l2_bytes / (2 * x.nbytes)))  # rotated past the L2
        xs = [cuda.to_device(x) for _ in range(sets)]
        ys = [cuda.device_array_like(x) for _ in range(sets)]
        fill = fused.fill(n, dtype) if n <= fused.max_row(limits.max_threads, dtype) else None
        chosen = methods.choose(rows, n, dtype, limits)
        errors, times = [], {}
        for m in METHODS:
            try:
                ns.softmax(xs[0], method=m, out=ys[0])
            except ValueError:  # the row does not fit this method
                errors.append(None)
                continue
            errors.append(float(np.abs(ys[0].copy_to_host().astype(np.float64) - want).max()))
            times[m] = _common.seconds(rotating(lambda i: ns.softmax(xs[i], method=m, out=ys[i]),
                                                sets), sim)
        copy = _common.seconds(rotating(lambda i: ys[i].copy_to_device(xs[i]), sets), sim)
        picks.append([name, f"{rows} x {n}", _common.nbytes(n * dtype.itemsize),
                      None if fill is None else 100 * fill, chosen, *errors])
        pct = {m: None if sim else 100 * copy / t for m, t in times.items()}
        best = None if sim else max(pct, key=pct.get)
        speeds.append([name, f"{rows} x {n}", *(pct.get(m) for m in METHODS), best or "—",
                       chosen, None if sim else 100 * pct[chosen] / pct[best]])
    _common.table("1. what auto picks, and each method's largest error against float64",
                  ["dtype", "rows x n", "row", "fused fill %", "auto", *METHODS],
                  picks, ["", "", "", ".1f", "", *[".1e"] * len(METHODS)])
    _common.table("2. % of a device copy of the same bytes (kernel time; GPU only)",
                  ["dtype", "rows x n", *METHODS, "fastest", "auto", "auto % of fastest"],
                  speeds, ["", "", *[".1f"] * len(METHODS), "", "", ".1f"])


def rotating(call, sets):
    """``call(i)`` on input set i, the next set each time (so no call finds its input in
    the L2 from the call before)."""
    state = [0]

    def step():
        call(state[0] % sets)
        state[0] += 1

    return step


if __name__ == "__main__":
    main()
