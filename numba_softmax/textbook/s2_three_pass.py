"""s2 — safe softmax in three passes: a block per row, one trip over the row per step.

Subtracting the row max m keeps every exponent ≤ 0, so nothing overflows (s1's flaw):

    pass 1  m = max_j x_j                 read M·N·4 bytes
    pass 2  ℓ = Σ_j exp(x_j − m)          read M·N·4
    pass 3  p_j = exp(x_j − m) / ℓ        read M·N·4, write M·N·4

Bytes: read 3·M·N·4, write M·N·4.  FLOPs: two exp a value.  Thread t reads x[t], x[t+T],
… so a warp reads 32 neighbours at once (coalesced).  Each of passes 1 and 2 ends in a
block tree in shared memory: T values, then T/2 sums of pairs, … (sequential addressing,
as in NVIDIA's reduction sample: thread t adds slot t + s, no bank conflicts).
Edge cases as ``torch.softmax``: a NaN wins the max (``larger``); a +inf makes
exp(inf − inf) = NaN; a row of −inf has m = −inf, ℓ = 0 (``weight`` never forms
exp(−inf − (−inf))) and p = 0 / 0 = NaN.
NumPy twin: ``numba_softmax.reference.softmax``.  Fast kernel:
``numba_softmax.kernels.softmax.three_pass`` (``softmax(x, method="three_pass")``).
Run: ``python -m numba_softmax.textbook.s2_three_pass``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import larger_device, weight_device

THREADS = 256  # threads a block (a power of 2, at most MAX_THREADS)
MAX_THREADS = 1024


@cuda.jit(device=True)
def block_tree(tree, v, t, take_max):
    """The max (or the sum) of every thread's v, returned to every thread."""
    tree[t] = v
    cuda.syncthreads()  # every thread's value is in its slot before any is read
    s = cuda.blockDim.x // 2
    while s > 0:
        if t < s:  # the lower half folds in the upper half
            tree[t] = larger_device(tree[t], tree[t + s]) if take_max else tree[t] + tree[t + s]
        cuda.syncthreads()  # this level is complete before the next one reads it
        s //= 2
    total = tree[0]
    cuda.syncthreads()  # all have read tree[0] before a next call overwrites the slots
    return total


@cuda.jit
def three_pass(x, y):
    row, t, T, n = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, x.shape[1]
    tree = cuda.shared.array(MAX_THREADS, np.float32)
    m = np.float32(-math.inf)
    for j in range(t, n, T):  # pass 1: m = max_j x_j (a NaN is kept)
        m = larger_device(m, x[row, j])
    m = block_tree(tree, m, t, True)
    l = np.float32(0.0)
    for j in range(t, n, T):  # pass 2: ℓ = Σ_j exp(x_j − m)
        l += weight_device(x[row, j], m)
    l = block_tree(tree, l, t, False)
    for j in range(t, n, T):  # pass 3: p_j = exp(x_j − m) / ℓ
        y[row, j] = weight_device(x[row, j], m) / l


def launch(x, y=None, threads=THREADS):
    """y = softmax of the rows of the float32 device array x (M, N); returns y."""
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of 2 up to {MAX_THREADS}, got {threads}")
    y = cuda.device_array_like(x) if y is None else y
    three_pass[x.shape[0], threads](x, y)
    return y


if __name__ == "__main__":
    from numba_softmax import reference, softmax
    from numba_softmax.textbook import _main

    print("s2 three-pass softmax: validate against the float64 reference")
    for m, n in _main.SHAPES:
        x = _main.randn(m, n)
        for threads in (32, 64) if _main.SIM else (32, 256, 1024):
            got = launch(cuda.to_device(x), threads=threads).copy_to_host()
            _main.check(f"{m} × {n}, {threads} threads", got, reference.softmax(x))
    x = _main.randn(2, 8) + np.float32(1000.0)  # s1 would overflow here
    _main.check("2 × 8 around 1000", launch(cuda.to_device(x)).copy_to_host(), reference.softmax(x))
    if _main.timing():
        m, n = 4096, 8192
        xd, yd, yf = (cuda.to_device(_main.randn(m, n)), cuda.device_array((m, n), np.float32),
                      cuda.device_array((m, n), np.float32))
        _main.bench((m, n), "read 3·M·N·4, write M·N·4", 4 * m * n * 4, [
            ("s2 three_pass (this file)", lambda: launch(xd, yd)),
            ("fast three_pass", lambda: softmax(xd, method="three_pass", out=yf))])
