"""s3 — two-pass online softmax: rows of any length.  Two reads and one write per element.

A team of threads per row (:mod:`.chunk`) streams the row chunk by chunk, C = team·VPT
values a chunk: where rows fill the device, as wide as gives each thread 128 bytes of the
row (two or four chunks: a warp for a 1024-value row, several rows to a block), else as
wide as one chunk; at most the whole block (:func:`configure`).

    pass 1  for each chunk: each thread reads its VPT values, folds them into a chunk
            state (max, Σ exp(x − max)) and merges that into its running (m, ℓ) with
            the combiner — the per-block online recurrence of Milakov & Gimelshein.
            Then the team folds its running states into the row's (m, ℓ).
    pass 2  re-read each value and write exp(x − m)/ℓ — last chunk first: pass 1 read
            it last, so it is the likeliest still in L1/L2.

Memory traffic: read 2·N·b, write N·b (3·N·b), against 4·N·b for the three-pass kernel
— the max pass and the sum pass are fused into one (source: the Triton two-pass online
softmax in the sources, for rows too long for on-chip memory).  A short row is one
chunk, re-read a moment later from L1, so it costs N·b from DRAM, like a kernel that
holds the row; a long row's tail is re-read from L2.  Nothing is held on chip between
passes but the two numbers (m, ℓ), so the row length is unbounded.
NumPy twin: :func:`numba_softmax.reference.online_softmax` (``block`` = C).
"""

import functools
import math

from numba import cuda

from ...combine import combine_device
from ..rows import chunk
from ..hw import jit, vector
from ..rows.epilogue import LOGSUMEXP, row_constant
from ..rows.reduce import team_combine

VECTORS = 2  # 16-byte vectors per thread per chunk (the kernels that share the stream)
VALUES = 16  # online's own launch where rows fill the device: values a thread a chunk …
ROW_BYTES = 128  # … and a team no wider than gives each thread this much of its row
# (narrower teams put more blocks on a multiprocessor, and pass 2 re-reads chunks just
# read; with few rows they cost parallelism, so they are used only where rows fill the
# device: the figures are in docs/algorithms/online.md)


@functools.cache
def stream_state(dtype, vpt, width):
    """Device function: thread t's (m, ℓ) over x[row, start:stop], read in chunks of
    team·VPT values, W at a time (pass 1).  Shared with the split-row and group kernels,
    which stream a piece of a row the same way.  ``start`` must be a multiple of W."""
    acc = jit.accumulator(dtype)
    io = chunk.ops(dtype, vpt, width)

    @jit.device
    def fold(x, row, start, stop, t, team):
        v = cuda.local.array(vpt, acc)  # one chunk's values, in registers (unrolled)
        m, l = acc(-math.inf), acc(0.0)
        base = start
        while base < stop:
            io.load(x, row, base, stop, t, team, v, acc(-math.inf))
            m_chunk, l_chunk = io.state(v)
            m, l = combine_device(m, l, m_chunk, l_chunk)  # the online step, per chunk
            base += team * vpt
        return m, l

    return fold


@functools.cache
def normalise_range(dtype, vpt, width, mode):
    """Device function: y[row, start:stop] = output(x[row, start:stop]) given the row's m
    and constant c (pass 2), with the same chunks and vectors as pass 1, last chunk
    first."""
    acc = jit.accumulator(dtype)
    io = chunk.ops(dtype, vpt, width)

    @jit.device
    def write(x, y, row, start, stop, t, team, m, c):
        v = cuda.local.array(vpt, acc)
        size = team * vpt
        base = start + (stop - start - 1) // size * size  # the chunk read last, first
        while base >= start:
            io.load(x, row, base, stop, t, team, v, m)
            io.normalise(v, m, c, mode)
            io.store(y, row, base, stop, t, team, v)
            base -= size

    return write


@functools.cache
def kernel(dtype, vpt, mode, width):
    acc = jit.accumulator(dtype)
    fold = stream_state(dtype, vpt, width)
    write = normalise_range(dtype, vpt, width, mode)
    store = jit.storer(dtype)

    @jit.kernel
    def online(x, y, team):
        row, t, n = chunk.team_row(x, team)
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)

        m, l = fold(x, row, 0, n, t, team)  # pass 1: stream the row, keeping (m, ℓ)
        m, l = team_combine(m, l, m_slots, l_slots, team)
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0 and row < x.shape[0]:
                y[row, 0] = store(c)
            return
        write(x, y, row, 0, n, t, team, m, c)  # pass 2: re-read and write

    return online


def configure(x, y, mode, threads=None, vpt=None):
    """The launch (:func:`.chunk.team_plan`).  Rows enough to fill the device (float32 or
    16-bit): :data:`VALUES` values a thread, a team per row as wide as gives each thread
    :data:`ROW_BYTES` of its row (two chunks of float32, four of a 16-bit type); else
    (few rows, float64) :data:`VECTORS` vectors a thread and a team as wide as one chunk
    of the row.  Teams of 32 threads at least, the block limit at most (then they stream
    more chunks), blocks of at least 256 threads; ``threads`` caps the block (default: the
    compiled kernel's own limit)."""
    if x.dtype.itemsize > 4 or not chunk.fills_device(x):
        vpt = vpt or VECTORS * vector.width_for(x.dtype)
        return chunk.team_plan(kernel, x, y, mode, vpt, threads, min_block=256)
    vpt = vpt or VALUES
    chunks = max(1, ROW_BYTES // (vpt * x.dtype.itemsize))
    return chunk.team_plan(kernel, x, y, mode, vpt, threads, min_block=256, chunks=chunks)


def launch(x, y, mode, threads=None, vpt=None, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    chunk.run(configure(x, y, mode, threads, vpt), stream)
