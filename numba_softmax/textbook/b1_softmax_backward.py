"""b1 — softmax backward: dx = y ∘ (dy − Σ_j y_j·dy_j), a block per row.

Softmax's Jacobian is diag(y) − y yᵀ, so its vector–Jacobian product needs only the
forward's output y and one number a row, D = Σ_j y_j·dy_j (the same D as attention's
backward, b2):

    pass 1  thread t: Σ y_j·dy_j over j = t, t+T, …; block tree → D    read 2·M·N·4 bytes
    pass 2  dx_j = y_j·(dy_j − D)                                      read 2·M·N·4, write M·N·4

Bytes: read 4·M·N·4, write M·N·4 (a kernel holding the row in registers reads 2·M·N·4).
FLOPs: four a value, no exp.  A NaN in y or dy makes D, and so the row, NaN.
NumPy twin: ``numba_softmax.reference.softmax_backward``.  Fast kernel:
``numba_softmax.kernels.backward.softmax_backward`` (``softmax_backward(dy, y)``).
Run: ``python -m numba_softmax.textbook.b1_softmax_backward``.
"""

import numpy as np
from numba import cuda

THREADS = 256  # threads a block (a power of 2, at most MAX_THREADS)
MAX_THREADS = 1024


@cuda.jit
def softmax_backward(dy, y, dx):
    row, t, T, n = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, y.shape[1]
    tree = cuda.shared.array(MAX_THREADS, np.float32)
    D = np.float32(0.0)
    for j in range(t, n, T):  # pass 1: my share of D = Σ y_j·dy_j
        D += y[row, j] * dy[row, j]
    tree[t] = D
    cuda.syncthreads()  # every thread's share is posted before the tree reads it
    s = T // 2
    while s > 0:  # block tree: slot t += slot t + s
        if t < s:
            tree[t] += tree[t + s]
        cuda.syncthreads()  # this level is complete before the next one reads it
        s //= 2
    D = tree[0]
    for j in range(t, n, T):  # pass 2: dx_j = y_j·(dy_j − D)
        dx[row, j] = y[row, j] * (dy[row, j] - D)


def launch(dy, y, dx=None, threads=THREADS):
    """dx of float32 device arrays dy, y (M, N), y = softmax(x); returns dx."""
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of 2 up to {MAX_THREADS}, got {threads}")
    if dy.shape != y.shape:
        raise ValueError(f"dy and y must have one shape, got {dy.shape} and {y.shape}")
    dx = cuda.device_array_like(y) if dx is None else dx
    softmax_backward[y.shape[0], threads](dy, y, dx)
    return dx


if __name__ == "__main__":
    from numba_softmax import reference
    from numba_softmax import softmax_backward as fast_backward
    from numba_softmax.textbook import _main

    print("b1 softmax backward: validate against the float64 reference")
    for m, n in _main.SHAPES:
        y = reference.softmax(_main.randn(m, n)).astype(np.float32)
        dy = _main.randn(m, n)
        for threads in (32, 64) if _main.SIM else (32, 256, 1024):
            got = launch(cuda.to_device(dy), cuda.to_device(y), threads=threads).copy_to_host()
            _main.check(f"{m} × {n}, {threads} threads", got, reference.softmax_backward(dy, y))
    if _main.timing():
        m, n = 4096, 8192
        dy, y = cuda.to_device(_main.randn(m, n)), cuda.to_device(_main.randn(m, n))
        dx, dxf = cuda.device_array((m, n), np.float32), cuda.device_array((m, n), np.float32)
        _main.bench((m, n), "read 4·M·N·4, write M·N·4", 5 * m * n * 4, [
            ("b1 softmax backward (this file)", lambda: launch(dy, y, dx)),
            ("fast softmax_backward", lambda: fast_backward(dy, y, out=dxf))])
