"""s4 — fused softmax: the row read once into registers, one read and one write a value.

When a row fits in the block's registers (N ≤ T·VALUES), nothing needs a second read:

    load    thread t holds v[i] = x[t + i·T], i < VALUES       read M·N·4 bytes
    state   thread t: m_t = max_i v[i], ℓ_t = Σ_i exp(v[i] − m_t)   (from registers)
    tree    the block merges the T states (m_t, ℓ_t) by combine
    write   p = exp(v[i] − m) / ℓ, from the registers           write M·N·4

Bytes: read M·N·4, write M·N·4 — the least any softmax can move, half of s2's.  FLOPs:
two exp a value.  The cost is the row limit: T·VALUES values (16 384 here); longer rows
spill, and s3 or s5 take them.  ``VALUES`` is a constant so the compiler can keep v in
registers (a loop over it is unrolled; a runtime index would put v in local memory).
NumPy twin: ``numba_softmax.reference.softmax``.  Fast kernel:
``numba_softmax.kernels.softmax.fused`` (``softmax(x, method="fused")``).
Run: ``python -m numba_softmax.textbook.s4_fused``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import combine_device, larger_device, weight_device

VALUES = 16  # values a thread holds in registers
MAX_THREADS = 1024


@cuda.jit
def fused(x, y):
    row, t, T, n = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, x.shape[1]
    m_tree = cuda.shared.array(MAX_THREADS, np.float32)
    l_tree = cuda.shared.array(MAX_THREADS, np.float32)
    v = cuda.local.array(VALUES, np.float32)
    m = np.float32(-math.inf)
    for i in range(VALUES):  # load: the row's only read; past its end, −inf weighs 0
        j = t + i * T
        v[i] = x[row, j] if j < n else np.float32(-math.inf)
        m = larger_device(m, v[i])
    l = np.float32(0.0)
    for i in range(VALUES):  # state: ℓ_t = Σ exp(v − m_t), from registers
        l += weight_device(v[i], m)
    m_tree[t], l_tree[t] = m, l
    cuda.syncthreads()  # every thread's state is posted before the tree reads it
    s = T // 2
    while s > 0:  # tree: slot t ← combine(slot t, slot t + s)
        if t < s:
            m_tree[t], l_tree[t] = combine_device(m_tree[t], l_tree[t], m_tree[t + s], l_tree[t + s])
        cuda.syncthreads()  # this level is complete before the next one reads it
        s //= 2
    m, l = m_tree[0], l_tree[0]
    for i in range(VALUES):  # write: p = exp(v − m) / ℓ, no second read
        j = t + i * T
        if j < n:
            y[row, j] = weight_device(v[i], m) / l


def threads_for(n):
    """The fewest threads, a power of 2 from 32, whose registers hold n values."""
    threads = 32
    while threads * VALUES < n:
        threads *= 2
    return threads


def launch(x, y=None, threads=None):
    """y = softmax of the rows of the float32 device array x (M, N ≤ 16 384); returns y."""
    threads = threads_for(x.shape[1]) if threads is None else threads
    if threads > MAX_THREADS or threads & (threads - 1) or threads * VALUES < x.shape[1]:
        raise ValueError(f"threads must be a power of 2 up to {MAX_THREADS} holding the row "
                         f"({VALUES} values each), got {threads} for N = {x.shape[1]}")
    y = cuda.device_array_like(x) if y is None else y
    fused[x.shape[0], threads](x, y)
    return y


if __name__ == "__main__":
    from numba_softmax import reference, softmax
    from numba_softmax.textbook import _main

    print("s4 fused softmax: validate against the float64 reference")
    for m, n in _main.SHAPES:
        x = _main.randn(m, n)
        _main.check(f"{m} × {n}", launch(cuda.to_device(x)).copy_to_host(), reference.softmax(x))
    if _main.timing():
        m, n = 16384, 4096
        xd, yd, yf = (cuda.to_device(_main.randn(m, n)), cuda.device_array((m, n), np.float32),
                      cuda.device_array((m, n), np.float32))
        _main.bench((m, n), "read M·N·4, write M·N·4", 2 * m * n * 4, [
            ("s4 fused (this file)", lambda: launch(xd, yd)),
            ("fast fused", lambda: softmax(xd, method="fused", out=yf))])
