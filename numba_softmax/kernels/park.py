"""A piece of a row parked in shared memory by ``cp.async``: the group kernel's two passes.

:mod:`.onchip`'s keeper parks a row through registers: a thread loads a chunk of VPT
values, folds them, stores them to shared memory, and only then loads the next chunk —
at most VPT·4 bytes a thread in flight.  With two blocks of 512 threads a multiprocessor
that is 32 KB, about half of what the memory system needs in flight per multiprocessor to
run at full rate (bandwidth × latency: ~33 KB/µs × 1.5 µs on an H200), so the read half
of the group kernel ran at ~57 % of copy.  ``cp.async`` copies global → shared memory
without passing through a register, so the whole piece can be in flight at once:

    copy    thread t issues ``cp.async`` for its 16-byte vectors of x[row, start:stop]
            (the team's neighbouring vectors, as a chunk is read) to the same place in
            ``held``: the piece in its memory order;
    wait    ``cp.async.wait_group 0`` (its own copies) and a barrier (everyone's);
    fold    thread t folds held[t], held[t + T], … — neighbouring threads, neighbouring
            4-byte words: no bank conflicts — into its (m, ℓ), VPT values at a time;
    write   once the row's (m, ℓ) is known, y[row, start + p] ← out(held[p]) for the
            same p: each value by the thread that folded it, stores coalesced.

(Each thread reading back its *own* vectors would need no barrier, but 4-byte reads of
16-byte stretches put 4 threads on each bank: measured 20 % slower than the registers.)
Shared memory: the piece, (stop − start)·b bytes, no padding.  Needs 16-byte vectors and
a row length that is a multiple of them (:func:`usable`): a partial vector would read
past the row.  NumPy twin: :func:`numba_softmax.reference.merge_chunks`.
"""

import functools
import math

import numpy as np
from numba import cuda

from ..combine import combine_device
from . import chunk, jit
from .epilogue import element
from .mma import cp_async16, cp_async_commit, cp_async_wait_all


def usable(dtype, width, n):
    """Whether rows of n values in ``width``-value vectors can be parked by ``cp.async``."""
    return width * np.dtype(dtype).itemsize == 16 and n % width == 0


@functools.cache
def parker(dtype, vpt, width):
    """Device function ``park(x, row, start, stop, held, t, team) -> (m, ℓ)``: copy
    x[row, start:stop] to ``held`` and fold it (thread t's share of the fold)."""
    acc = jit.accumulator(dtype)
    to_acc = jit.loader(dtype)
    state = chunk.ops(dtype, vpt, width).state
    vectors = vpt // width

    @jit.device
    def park(x, row, start, stop, held, t, team):
        cuda.syncthreads()  # the previous row is written out of held before it is overwritten
        base = start
        while base < stop:  # copy: the team's vectors, chunk by chunk, all in flight
            for i in range(vectors):
                col = base + (t + i * team) * width
                if col < stop:
                    cp_async16(held, col - start, x, row, col, True)
            base += team * vpt
        cp_async_commit()
        cp_async_wait_all()  # this thread's copies have landed …
        cuda.syncthreads()  # … and every thread's: the fold reads them all
        v = cuda.local.array(vpt, acc)
        m, l = acc(-math.inf), acc(0.0)
        n, p = stop - start, t
        while p < n:  # fold held[t], held[t + T], …: one word per bank
            for i in range(vpt):
                q = p + i * team
                v[i] = to_acc(held[q]) if q < n else acc(-math.inf)
            m_chunk, l_chunk = state(v)
            m, l = combine_device(m, l, m_chunk, l_chunk)  # the online step, per chunk
            p += team * vpt
        return m, l

    return park


@functools.cache
def writer(dtype, vpt, mode):
    """Device function ``write(y, row, start, stop, held, t, team, m, c)``: y[row,
    start:stop] from the parked values, each by the thread that folded it."""
    acc = jit.accumulator(dtype)
    to_acc = jit.loader(dtype)
    store = jit.storer(dtype)

    @jit.device
    def write(y, row, start, stop, held, t, team, m, c):
        v = cuda.local.array(vpt, acc)
        n, p = stop - start, t
        while p < n:
            for i in range(vpt):  # all VPT shared loads first: the stores to y (a generic
                q = p + i * team  # pointer, which might alias held) would order them
                v[i] = to_acc(held[q]) if q < n else m
            for i in range(vpt):
                q = p + i * team
                if q < n:
                    y[row, start + q] = store(element(v[i], m, c, mode))
            p += team * vpt

    return write
