"""s2 — three-pass safe softmax: the textbook algorithm, one pass over memory per step.

A team of threads per row (:mod:`.chunk`: a warp for short rows, the whole block for
long ones), reading the row in chunks of team·VPT values, 16 bytes at a time.

    pass 1  m = max_j x_j                     (read the row)
    pass 2  ℓ = Σ_j exp(x_j − m)              (read it again)
    pass 3  y_j = exp(x_j − m) / ℓ            (read it a third time, write the output)

Memory traffic: read 3·N·b, write N·b (4·N·b) — unless the row is short enough that
the second and third reads find it still in L1/L2 (:func:`traffic`).  Both reductions
are the combiner with a twist: the max pass folds states (x, 0) — combine((a, 0),
(b, 0)) = (max, 0) — and the sum pass folds states that share the one m —
combine((m, a), (m, b)) = (m, a + b) — so even the textbook kernel runs on the one
team combine of :mod:`.reduce`.
NumPy twin: :func:`numba_softmax.reference.softmax`.
"""

import functools
import math

from numba import cuda

from ...combine import larger_device, weight_device
from ..rows import chunk
from ..hw import jit, vector
from ..rows.epilogue import LOGSUMEXP, row_constant
from ..rows.reduce import team_combine

VECTORS = 2  # 16-byte vectors per thread per chunk: 32 bytes in flight per thread
VALUES, SHORT_BYTES = 16, 64 * 1024  # short rows: 16 values a thread, two chunks a team
# (a narrower team leaves more blocks on a multiprocessor, and its second and third passes
# re-read a chunk it has just read, from L1; longer rows lose by it, so they keep one chunk
# a team: the figures are in docs/algorithms/three_pass.md)


@functools.cache
def kernel(dtype, vpt, mode, width):
    acc = jit.accumulator(dtype)
    io = chunk.ops(dtype, vpt, width)
    store = jit.storer(dtype)

    @jit.kernel
    def three_pass(x, y, team):
        row, t, n = chunk.team_row(x, team)
        size = team * vpt
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        v = cuda.local.array(vpt, acc)  # one chunk's values, in registers (unrolled)

        m = acc(-math.inf)  # pass 1: the max
        base = 0
        while base < n:
            io.load(x, row, base, n, t, team, v, acc(-math.inf))
            for i in range(vpt):
                m = larger_device(m, v[i])  # a NaN is kept, as the combiner keeps it
            base += size
        m, _ = team_combine(m, acc(0.0), m_slots, l_slots, team)

        l = acc(0.0)  # pass 2: the sum, every thread against the same m
        base = 0
        while base < n:
            io.load(x, row, base, n, t, team, v, acc(-math.inf))
            for i in range(vpt):
                l += weight_device(v[i], m)
            base += size
        m, l = team_combine(m, l, m_slots, l_slots, team)

        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0 and row < x.shape[0]:
                y[row, 0] = store(c)
            return
        base = 0
        while base < n:  # pass 3: normalise
            io.load(x, row, base, n, t, team, v, m)
            io.normalise(v, m, c, mode)
            io.store(y, row, base, n, t, team, v)
            base += size

    return three_pass


def configure(x, y, mode, threads=None, vpt=None):
    """The launch: a team per row as wide as one chunk of the row (a row in one chunk
    is read from DRAM once; passes 2 and 3 find it in L1), at most a block; blocks of at
    least 256 threads; ``threads`` caps the block (default: the compiled kernel's own
    limit, :func:`.launcher.max_threads`).  Rows of at most :data:`SHORT_BYTES` (float32 or
    16-bit), enough to fill the device: :data:`VALUES` values a thread and teams that
    cover the row in two chunks — narrower, more blocks a multiprocessor."""
    if x.dtype.itemsize <= 4 and x.shape[1] * x.dtype.itemsize <= SHORT_BYTES and chunk.fills_device(x):
        return chunk.team_plan(kernel, x, y, mode, vpt or VALUES, threads, min_block=256, chunks=2)
    vpt = vpt or VECTORS * vector.width_for(x.dtype)
    return chunk.team_plan(kernel, x, y, mode, vpt, threads, min_block=256)


def launch(x, y, mode, threads=None, stream=0, vpt=None):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    chunk.run(configure(x, y, mode, threads, vpt), stream)
