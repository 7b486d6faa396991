"""s3 — online softmax in two passes: the max and the sum fused into one (m, ℓ) state.

Milakov & Gimelshein's recurrence: fold each value x into the running state with the
combiner, m' = max(m, x), ℓ' = ℓ·exp(m − m') + exp(x − m') — ``combine(m, ℓ, x, 1)``.
Because the merge is associative, each thread folds its own share of the row and the
block then merges the T thread states pairwise, in any tree:

    pass 1  thread t: (m, ℓ) over x[t], x[t+T], …   read M·N·4 bytes
            block tree: T states → 1, by combine     (shared memory, log2 T levels)
    pass 2  p_j = exp(x_j − m) / ℓ                   read M·N·4, write M·N·4

Bytes: read 2·M·N·4, write M·N·4 — one read fewer than s2, the row length unbounded
(only (m, ℓ) is kept between the passes).  FLOPs: three exp a value (two in pass 1).
Edge cases: those of s2, all handled inside ``combine`` (``numba_softmax.combine``).
NumPy twin: ``numba_softmax.reference.online_softmax``.  Fast kernel:
``numba_softmax.kernels.softmax.online`` (``softmax(x, method="online")``).
Run: ``python -m numba_softmax.textbook.s3_online``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import combine_device, weight_device

THREADS = 256  # threads a block (a power of 2, at most MAX_THREADS)
MAX_THREADS = 1024


@cuda.jit
def online(x, y):
    row, t, T, n = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, x.shape[1]
    m_tree = cuda.shared.array(MAX_THREADS, np.float32)
    l_tree = cuda.shared.array(MAX_THREADS, np.float32)
    m, l = np.float32(-math.inf), np.float32(0.0)  # the identity: nothing seen yet
    for j in range(t, n, T):  # pass 1: fold x_j, the state (x_j, 1), into (m, ℓ)
        m, l = combine_device(m, l, x[row, j], np.float32(1.0))
    m_tree[t], l_tree[t] = m, l
    cuda.syncthreads()  # every thread's state is posted before the tree reads it
    s = T // 2
    while s > 0:  # the block tree: slot t ← combine(slot t, slot t + s)
        if t < s:
            m_tree[t], l_tree[t] = combine_device(m_tree[t], l_tree[t], m_tree[t + s], l_tree[t + s])
        cuda.syncthreads()  # this level is complete before the next one reads it
        s //= 2
    m, l = m_tree[0], l_tree[0]  # the row's state
    for j in range(t, n, T):  # pass 2: p_j = exp(x_j − m) / ℓ
        y[row, j] = weight_device(x[row, j], m) / l


def launch(x, y=None, threads=THREADS):
    """y = softmax of the rows of the float32 device array x (M, N); returns y."""
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of 2 up to {MAX_THREADS}, got {threads}")
    y = cuda.device_array_like(x) if y is None else y
    online[x.shape[0], threads](x, y)
    return y


if __name__ == "__main__":
    from numba_softmax import reference, softmax
    from numba_softmax.textbook import _main

    print("s3 online softmax: validate against the float64 reference, any block size")
    for m, n in _main.SHAPES:
        x = _main.randn(m, n)
        for threads in (32, 64) if _main.SIM else (32, 256, 1024):
            got = launch(cuda.to_device(x), threads=threads).copy_to_host()
            _main.check(f"{m} × {n}, {threads} threads", got, reference.softmax(x))
    if _main.timing():
        m, n = 4096, 8192
        xd, yd, yf = (cuda.to_device(_main.randn(m, n)), cuda.device_array((m, n), np.float32),
                      cuda.device_array((m, n), np.float32))
        _main.bench((m, n), "read 2·M·N·4, write M·N·4", 3 * m * n * 4, [
            ("s3 online (this file)", lambda: launch(xd, yd)),
            ("fast online", lambda: softmax(xd, method="online", out=yf))])
