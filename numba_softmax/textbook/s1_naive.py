"""s1 — naive softmax: p_i = exp(x_i) / Σ_j exp(x_j), one thread per row.

The formula ported as written (llm.c's version 1).  No max is subtracted, so exp(x)
overflows float32 once x > 88.72: ℓ is inf, the large value's p is inf / inf = NaN and
every other p is 0 — the reason every later rung carries the row max m.

    pass 1  ℓ = Σ_j exp(x_j)          read M·N·4 bytes
    pass 2  p_i = exp(x_i) / ℓ        read M·N·4, write M·N·4

Bytes: read 2·M·N·4, write M·N·4.  FLOPs: two exp a value (one a pass).  One thread a
row leaves the GPU idle unless M runs to tens of thousands, and the 32 threads of a warp
read 32 different rows at once (no coalescing): s2 gives each row a block.
NumPy twin: ``numba_softmax.reference.naive_softmax``.  No fast kernel computes this
formula; ``__main__`` times it beside ``softmax(method="three_pass")``.
Run: ``python -m numba_softmax.textbook.s1_naive``.
"""

import math

import numpy as np
from numba import cuda

THREADS = 128  # rows a block: one thread each


@cuda.jit
def naive_softmax(x, y):
    row = cuda.grid(1)  # one thread, one whole row
    if row >= x.shape[0]:
        return
    l = np.float32(0.0)
    for j in range(x.shape[1]):  # pass 1: ℓ = Σ exp(x_j) — inf as soon as one x_j > 88.72
        l += np.float32(math.exp(x[row, j]))
    for j in range(x.shape[1]):  # pass 2: p_j = exp(x_j) / ℓ — inf / inf is NaN, x / inf is 0
        y[row, j] = np.float32(math.exp(x[row, j])) / l


def launch(x, y=None, threads=THREADS):
    """y = naive softmax of the rows of the float32 device array x (M, N); returns y."""
    y = cuda.device_array_like(x) if y is None else y
    naive_softmax[(x.shape[0] + threads - 1) // threads, threads](x, y)
    return y


if __name__ == "__main__":
    import warnings

    from numba_softmax import reference, softmax
    from numba_softmax.textbook import _main

    warnings.simplefilter("ignore", RuntimeWarning)  # the overflow below is the point
    print("s1 naive softmax: validate against the float64 reference")
    for m, n in _main.SHAPES:
        x = _main.randn(m, n)
        _main.check(f"{m} × {n}", launch(cuda.to_device(x)).copy_to_host(), reference.softmax(x))
    x = _main.randn(2, 8)
    x[1, 0] = 100.0  # exp(100) ≈ 2.7e43 > 3.4e38, the float32 maximum
    naive, safe = launch(cuda.to_device(x)).copy_to_host(), reference.softmax(x)
    print(f"  a row holding 100.0: naive gives {naive[1, :3]}, safe softmax {safe[1, :3].round(6)}")
    assert np.isnan(naive[1, 0]) and (naive[1, 1:] == 0).all() and np.isfinite(safe[1]).all()
    if _main.timing():
        m, n = 8192, 1024
        xd, yd, yf = cuda.to_device(_main.randn(m, n)), cuda.device_array((m, n), np.float32), \
            cuda.device_array((m, n), np.float32)
        _main.bench((m, n), "read 2·M·N·4, write M·N·4", 3 * m * n * 4, [
            ("s1 naive (this file)", lambda: launch(xd, yd)),
            ("fast three_pass (safe, 4·M·N·4)", lambda: softmax(xd, method="three_pass", out=yf))])
