"""s5 — split-row softmax: S blocks a row, their pieces' states merged by ``combine``.

One block a row keeps one multiprocessor busy per row; with few, long rows the rest of
the GPU idles.  Cut each row into S pieces, one block each (a grid of M × S blocks):

    kernel 1  block (r, s): the piece's (m_s, ℓ_s), as s3's pass 1     read M·N·4 bytes
              (thread fold, then block tree), written to a workspace   write M·S·8
    kernel 2  block (r, s): (m, ℓ) = combine of (m_0, ℓ_0) … (m_S−1, ℓ_S−1),
              folded in the same order by every block, so all agree    read M·S·S·8
              then p_j = exp(x_j − m) / ℓ over piece s                 read M·N·4, write M·N·4

Bytes: read 2·M·N·4, write M·N·4, plus the small workspace.  FLOPs: as s3.  The launch
boundary between the kernels is the grid-wide barrier: every piece's state is written
before any block merges them.  Any S gives the same (m, ℓ): the merge is associative.
NumPy twin: ``numba_softmax.reference.merge_chunks`` (chunks = pieces).  Fast kernel:
``numba_softmax.kernels.softmax.split`` (``softmax(x, method="split")``).
Run: ``python -m numba_softmax.textbook.s5_split``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import combine_device, weight_device

THREADS = 256  # threads a block (a power of 2, at most MAX_THREADS)
MAX_THREADS = 1024


@cuda.jit
def piece_states(x, m_parts, l_parts):
    row, s, t, T = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
    S, n = cuda.gridDim.y, x.shape[1]
    lo, hi = s * n // S, (s + 1) * n // S  # piece s of the row
    m_tree = cuda.shared.array(MAX_THREADS, np.float32)
    l_tree = cuda.shared.array(MAX_THREADS, np.float32)
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lo + t, hi, T):  # thread fold: (m, ℓ) ← combine((m, ℓ), (x_j, 1))
        m, l = combine_device(m, l, x[row, j], np.float32(1.0))
    m_tree[t], l_tree[t] = m, l
    cuda.syncthreads()  # every thread's state is posted before the tree reads it
    half = T // 2
    while half > 0:  # block tree: slot t ← combine(slot t, slot t + half)
        if t < half:
            m_tree[t], l_tree[t] = combine_device(m_tree[t], l_tree[t],
                                                  m_tree[t + half], l_tree[t + half])
        cuda.syncthreads()  # this level is complete before the next one reads it
        half //= 2
    if t == 0:  # the piece's state, for kernel 2
        m_parts[row, s], l_parts[row, s] = m_tree[0], l_tree[0]


@cuda.jit
def normalise_piece(x, m_parts, l_parts, y):
    row, s, t, T = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
    S, n = cuda.gridDim.y, x.shape[1]
    m, l = np.float32(-math.inf), np.float32(0.0)
    for k in range(S):  # merge the pieces: (m, ℓ) ← combine((m, ℓ), (m_k, ℓ_k))
        m, l = combine_device(m, l, m_parts[row, k], l_parts[row, k])
    for j in range(s * n // S + t, (s + 1) * n // S, T):  # p_j = exp(x_j − m) / ℓ
        y[row, j] = weight_device(x[row, j], m) / l


def launch(x, y=None, splits=4, threads=THREADS):
    """y = softmax of the rows of the float32 device array x (M, N), each row cut into
    ``splits`` pieces; returns y."""
    if threads < 1 or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of 2 up to {MAX_THREADS}, got {threads}")
    if splits < 1:
        raise ValueError(f"splits must be at least 1, got {splits}")
    y = cuda.device_array_like(x) if y is None else y
    m_parts = cuda.device_array((x.shape[0], splits), np.float32)
    l_parts = cuda.device_array((x.shape[0], splits), np.float32)
    piece_states[(x.shape[0], splits), threads](x, m_parts, l_parts)
    normalise_piece[(x.shape[0], splits), threads](x, m_parts, l_parts, y)
    return y


if __name__ == "__main__":
    from numba_softmax import reference, softmax
    from numba_softmax.textbook import _main, s3_online

    print("s5 split-row softmax: validate against the float64 reference, any split count")
    for m, n in _main.SHAPES:
        x = _main.randn(m, n)
        for splits in (1, 3) if _main.SIM else (1, 3, 16):
            got = launch(cuda.to_device(x), splits=splits, threads=32).copy_to_host()
            _main.check(f"{m} × {n}, {splits} pieces", got, reference.softmax(x))
    if _main.timing():
        m, n, splits = 16, 1 << 22, 32  # few, long rows: the case the split is for
        xd, yd, yf = (cuda.to_device(_main.randn(m, n)), cuda.device_array((m, n), np.float32),
                      cuda.device_array((m, n), np.float32))
        _main.bench((m, n), "read 2·M·N·4, write M·N·4", 3 * m * n * 4, [
            ("s5 split (this file), 32 pieces", lambda: launch(xd, yd, splits=splits)),
            ("s3 online, one block a row", lambda: s3_online.launch(xd, yd)),
            ("fast split", lambda: softmax(xd, method="split", out=yf))])
