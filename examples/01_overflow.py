"""01 — why softmax subtracts the max: exp(x)/Σexp(x) overflows, the safe form does not.

The textbook formula p_i = exp(x_i) / Σ_j exp(x_j) is exact in real numbers but not in
floating point: exp overflows to inf once x ≳ 88.7 (float32) or ≳ 709.8 (float64), and
then inf / inf is NaN.  Scaling a random row by 1000 is enough (the sources show the same
row printing ``[0, 0, nan, nan, 0, 0, 0, 0]``).  Softmax is shift-invariant, so the safe
form subtracts the row max m first: every exponent is ≤ 0, the largest term is exactly 1,
and nothing can overflow.

The table runs both forms on the same rows, on the host (NumPy, float64) and on the
device (float32): a strawman device kernel written here for the naive formula, and every
safe kernel of the package (three-pass, fused, online, split).

    python examples/01_overflow.py          # on the GPU
    python examples/01_overflow.py --sim    # on the CUDA simulator
"""

import math
import sys
import warnings

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda, float32

import numba_softmax as ns
from numba_softmax import reference as R


def naive_kernel(sim, threads):
    """STRAWMAN — the unsafe formula on the device, kept only to watch it fail.

    One block per row: each thread sums exp(x) over its strided values, a shared-memory
    tree adds the T partial sums, and each thread writes exp(x_j) / Σ.  No max is
    subtracted anywhere, which is the whole point."""
    # The simulator runs kernels as Python, whose math.exp *raises* OverflowError where
    # the GPU returns inf; NumPy's exp returns inf like the GPU does.
    exp = np.exp if sim else math.exp

    @cuda.jit
    def naive_softmax(x, y):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        n = x.shape[1]
        partial = cuda.shared.array(threads, float32)
        s = float32(0.0)
        for j in range(t, n, threads):
            s += exp(x[row, j])  # overflows to inf for x ≳ 88.7
        partial[t] = s
        cuda.syncthreads()  # every partial sum is posted before the tree reads them
        stride = threads // 2
        while stride > 0:
            if t < stride:
                partial[t] += partial[t + stride]
            cuda.syncthreads()  # this level is complete before the next one reads it
            stride //= 2
        for j in range(t, n, threads):
            y[row, j] = exp(x[row, j]) / partial[0]  # inf / inf = nan

    return naive_softmax


def stats(p, ref):
    """(rows holding a NaN, worst |Σp − 1| over the other rows, max |p − ref| over the
    non-NaN entries)."""
    p = np.asarray(p, dtype=np.float64)
    bad_rows = np.isnan(p).any(axis=-1)
    good = ~bad_rows
    row_sum_err = float(np.abs(p[good].sum(axis=-1) - 1.0).max()) if good.any() else None
    ok = ~np.isnan(p)
    err = float(np.abs(p - ref)[ok].max()) if ok.any() else None
    return f"{int(bad_rows.sum())}/{len(p)}", row_sum_err, err


def main(argv=None):
    def options(parser):
        parser.add_argument("--rows", type=int, default=None, help="rows (default 4 / 1024)")
        parser.add_argument("--n", type=int, default=None, help="row length (default 8 / 4096)")
        parser.add_argument("--seed", type=int, default=0)

    args = _common.parse(__doc__, options, argv)
    rows = args.rows or _common.pick(args, 4, 1024)
    n = args.n or _common.pick(args, 8, 4096)

    warnings.simplefilter("ignore", RuntimeWarning)  # the overflows are the point
    threads = 32 if args.sim else 256
    naive = naive_kernel(args.sim, threads)
    rng = np.random.default_rng(args.seed)
    base = rng.standard_normal((rows, n))

    print(f"device: {_common.device_name(args.sim)};  {rows} rows × {n} values")
    x1000 = (base[0, :8] * 1000).astype(np.float32)
    print("one row ×1000:       ", np.array2string(x1000, precision=0, suppress_small=True))
    print("naive (NumPy, fp32): ", R.naive_softmax(x1000, dtype=np.float32).round(4))
    print("safe  (NumPy, fp32): ", R.softmax(x1000, dtype=np.float32).round(4))

    results = []
    for scale in (1.0, 1000.0):
        x64 = base * scale
        x32 = x64.astype(np.float32)
        ref = R.softmax(x32.astype(np.float64))  # the exact answer for the fp32 inputs

        impls = [
            ("naive exp/Σexp", "host fp64", lambda: R.naive_softmax(x64)),
            ("safe (3 passes)", "host fp64", lambda: R.softmax(x64)),
        ]

        def on_device_naive():
            x_d = cuda.to_device(x32)
            y_d = cuda.device_array_like(x_d)
            naive[rows, threads](x_d, y_d)
            return y_d.copy_to_host()

        impls.append(("naive exp/Σexp [strawman]", "device fp32", on_device_naive))
        for method in ("three_pass", "fused", "online", "split"):
            impls.append((f"safe: {method}", "device fp32",
                          lambda method=method: ns.softmax(x32, method=method)))

        for name, where, run in impls:
            nans, sum_err, err = stats(run(), ref if "fp32" in where else R.softmax(x64))
            results.append((f"x·{scale:g}", name, where, nans, sum_err, err))

    _common.table(
        "naive vs safe softmax: rows with a NaN; Σp over the other rows; error over the "
        "non-NaN entries",
        ["input", "softmax", "where", "NaN rows", "max |Σp − 1|", "max |p − p_ref|"],
        results,
        ["", "", "", "", ".1e", ".1e"],
    )
    def has_nan(r):
        return not r[3].startswith("0/")

    bad = [r for r in results if r[0] == "x·1000" and "safe" in r[1] and has_nan(r)]
    naive_nan = [r for r in results if r[0] == "x·1000" and "naive" in r[1] and has_nan(r)]
    print()
    print("The naive formula produced NaN at x·1000:", "yes" if naive_nan else "NO (unexpected)")
    print("Every safe kernel stayed finite:         ", "yes" if not bad else "NO")
    return 0 if (naive_nan and not bad) else 1


if __name__ == "__main__":
    sys.exit(main())
