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

from ..combine import combine_device, larger_device, weight_device
from . import vector
from . import jit, launcher
from .jit import accumulator
from .epilogue import LOGSUMEXP, element, row_constant
from .reduce import block_combine


@functools.cache
def stream_state(dtype, threads, vpt, width):
    """Device function: this thread's (m, ℓ) over x[row, start:stop], read in chunks of
    T·VPT values, W at a time (pass 1).  Shared with the split-row kernel, which streams
    a piece of a row the same way.  ``start`` must be a multiple of W."""
    acc = accumulator(dtype)
    chunk = threads * vpt
    load_row, _ = vector.row_io(width)

    @jit.device
    def fold(x, row, start, stop):
        t = cuda.threadIdx.x
        v = cuda.local.array(vpt, acc)  # one chunk's values, in registers (unrolled)
        m, l = acc(-math.inf), acc(0.0)
        for base in range(start, stop, chunk):
            for i in range(vpt // width):  # all loads of the chunk before any exp
                load_row(x, row, base + (t + i * threads) * width, stop, v, i * width, acc(-math.inf))
            m_chunk = acc(-math.inf)
            for i in range(vpt):
                m_chunk = larger_device(m_chunk, v[i])  # a NaN is kept
            l_chunk = acc(0.0)
            for i in range(vpt):
                l_chunk += weight_device(v[i], m_chunk)
            m, l = combine_device(m, l, m_chunk, l_chunk)  # the online step, per chunk
        return m, l

    return fold


@functools.cache
def normalise_range(dtype, threads, vpt, width, mode):
    """Device function: y[row, start:stop] = output(x[row, start:stop]) given the row's m
    and constant c (pass 2), with the same chunks and vectors as pass 1."""
    acc = accumulator(dtype)
    chunk = threads * vpt
    load_row, store_row = vector.row_io(width)

    @jit.device
    def write(x, y, row, start, stop, m, c):
        t = cuda.threadIdx.x
        v = cuda.local.array(vpt, acc)
        for base in range(start, stop, chunk):
            for i in range(vpt // width):  # VPT loads in flight per thread
                load_row(x, row, base + (t + i * threads) * width, stop, v, i * width, m)
            for i in range(vpt):
                v[i] = element(v[i], m, c, mode)
            for i in range(vpt // width):
                store_row(y, row, base + (t + i * threads) * width, stop, v, i * width)

    return write


@functools.cache
def kernel(dtype, threads, vpt, mode, width):
    acc = accumulator(dtype)
    fold = stream_state(dtype, threads, vpt, width)
    write = normalise_range(dtype, threads, vpt, width, mode)

    @jit.kernel
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
        write(x, y, row, 0, n, m, c)  # pass 2: re-read and write

    return online


def launch(x, y, mode, threads=1024, vpt=8, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    vpt = max(vpt, width)
    launcher.launch(kernel(x.dtype, threads, vpt, mode, width), x.shape[0], threads, stream, (x, y))
