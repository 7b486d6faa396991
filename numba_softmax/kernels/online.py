"""v3 — two-pass online softmax: rows of any length.  Two reads and one write per element.

One block per row, T threads; the row is streamed in chunks of C = T·VPT values.

    pass 1  for each chunk: each thread reads its VPT values, folds them into a chunk
            state (max, Σ exp(x − max)) and merges that into its running (m, ℓ) with
            the combiner — the per-block online recurrence of Milakov & Gimelshein.
            Then the block folds the T running states into the row's (m, ℓ).
    pass 2  re-read each value and write exp(x − m)/ℓ.

Memory traffic: read 2·N·b, write N·b (3·N·b), against 4·N·b for the three-pass kernel
— the max pass and the sum pass are fused into one (source: the Triton two-pass online
softmax in the sources, for rows too long for on-chip memory).  Nothing is held on chip
between passes but the two numbers (m, ℓ), so the row length is unbounded.
NumPy twin: :func:`numba_softmax.reference.online_softmax` (``block`` = C).
"""

import functools
import math

from numba import cuda

from ..combine import combine_device, weight_device
from ._compile import FASTMATH, accumulator
from .epilogue import LOGSUMEXP, element, row_constant
from .reduce import block_combine


@functools.cache
def stream_state(dtype, threads, vpt):
    """Device function: this thread's (m, ℓ) over x[row, start:stop], read in chunks of
    T·VPT values (pass 1).  Shared with the split-row kernel, which streams a piece of a
    row the same way."""
    acc = accumulator(dtype)
    chunk = threads * vpt

    @cuda.jit(device=True)
    def fold(x, row, start, stop):
        t = cuda.threadIdx.x
        v = cuda.local.array(vpt, acc)  # one chunk's values, in registers (unrolled)
        m, l = acc(-math.inf), acc(0.0)
        for base in range(start, stop, chunk):
            m_chunk = acc(-math.inf)
            for i in range(vpt):  # all loads of the chunk are issued before any exp
                j = base + t + i * threads
                v[i] = acc(x[row, j]) if j < stop else acc(-math.inf)  # −inf weighs 0
                m_chunk = v[i] if v[i] > m_chunk else m_chunk
            l_chunk = acc(0.0)
            for i in range(vpt):
                l_chunk += weight_device(v[i], m_chunk)
            m, l = combine_device(m, l, m_chunk, l_chunk)  # the online step, per chunk
        return m, l

    return fold


@functools.cache
def kernel(dtype, threads, vpt, mode):
    acc = accumulator(dtype)
    chunk = threads * vpt
    fold = stream_state(dtype, threads, vpt)

    @cuda.jit(fastmath=FASTMATH)
    def online(x, y):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        n = x.shape[1]
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)

        m, l = fold(x, row, 0, n)  # pass 1: stream the row, keeping (m, ℓ)
        m, l = block_combine(m, l, m_shared, l_shared)
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0:
                y[row, 0] = c
            return
        v = cuda.local.array(vpt, acc)
        for base in range(0, n, chunk):  # pass 2: re-read and write, a chunk at a time
            for i in range(vpt):  # VPT loads in flight per thread, as in pass 1
                j = base + t + i * threads
                v[i] = acc(x[row, j]) if j < n else acc(0.0)
            for i in range(vpt):
                j = base + t + i * threads
                if j < n:
                    y[row, j] = element(v[i], m, c, mode)

    return online


def launch(x, y, mode, threads=1024, vpt=4, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    rows = x.shape[0]
    kernel(x.dtype, threads, vpt, mode)[rows, threads, stream](x, y)
