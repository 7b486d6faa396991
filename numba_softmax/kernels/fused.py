"""v2 — fused softmax: the row stays on chip.  One read and one write per element.

T threads per row, each holding VPT values in registers (a row of up to T·VPT values).
Thread t owns the values x[t], x[t + T], x[t + 2T], … (coalesced: at each step the warp
reads 32 neighbours).  Short rows (≤ 32·VPT) get one *warp* each — several rows per
block, reduced with shuffles alone, no shared memory and no barrier; longer rows get a
whole block of T threads.

    1. load     each thread reads its VPT values once, into registers;
    2. state    each thread folds them into its own (m, ℓ): m = max, ℓ = Σ exp(x − m);
    3. combine  the T states fold into the row's (m, ℓ): a warp butterfly, then (for a
                block per row) one more across warps (:mod:`.reduce`);
    4. write    each thread normalises the values it still holds: exp(x − m)/ℓ.

Memory traffic: read N·b, write N·b bytes for N values of b bytes — the minimum, half of
the three-pass kernel's 3 reads + 1 write (4·N·b).  (Source: the CuTe kernel of the
sources, one block per row with a per-thread online state and a shared-memory tree.)
NumPy twin: :func:`numba_softmax.reference.softmax`.

Rows longer than T·VPT do not fit: use ``online`` (two passes) or ``split``.
"""

import functools
import math

from numba import cuda

from ..combine import larger_device, weight_device
from . import vector
from . import jit, launcher
from .jit import accumulator
from .epilogue import LOGSUMEXP, element, row_constant
from .reduce import block_combine, warp_combine

MAX_VPT = 32  # values per thread held in registers; beyond this they would spill


@functools.cache
def kernel(dtype, threads, vpt, mode, row_threads, width):
    acc = accumulator(dtype)
    rows_per_block = threads // row_threads
    load_row, store_row = vector.row_io(width)

    @jit.kernel
    def fused(x, y):
        # row_threads = 32: a warp per row (rows_per_block rows per block, reduced with
        # shuffles alone); otherwise the whole block is one row.  Compile-time choice.
        row = cuda.blockIdx.x * rows_per_block + cuda.threadIdx.x // row_threads
        t = cuda.threadIdx.x % row_threads
        n = x.shape[1]
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        v = cuda.local.array(vpt, acc)  # this thread's values, in registers (unrolled)
        if row_threads == 32 and row >= x.shape[0]:
            return  # a whole warp past the last row: no one below waits for it

        # 1. load: VPT values as VPT/W vectors of W, all issued before any is used
        for i in range(vpt // width):  # thread t's i-th vector: coalesced; −inf pads
            load_row(x, row, (t + i * row_threads) * width, n, v, i * width, acc(-math.inf))
        m = acc(-math.inf)  # 2. this thread's state: its max, then Σ exp(v − max)
        for i in range(vpt):
            m = larger_device(m, v[i])  # a NaN is kept
        l = acc(0.0)
        for i in range(vpt):
            l += weight_device(v[i], m)
        if row_threads == 32:  # 3. the row's state
            m, l = warp_combine(m, l)
        else:
            m, l = block_combine(m, l, m_shared, l_shared)
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0:
                y[row, 0] = c
            return
        for i in range(vpt):  # 4. normalise in registers, then write W at a time
            v[i] = element(v[i], m, c, mode)
        for i in range(vpt // width):
            store_row(y, row, (t + i * row_threads) * width, n, v, i * width)

    return fused


def launch(x, y, mode, threads=None, vpt=None, stream=0, rows_per_block=4, max_threads=1024):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp.

    ``threads`` per row: 32 means a warp per row, ``rows_per_block`` rows per block.
    Default: a warp per row while a row fits in 32 lanes × ``MAX_VPT`` values, else one
    block per row with about 16 values per thread (at most ``max_threads``).
    """
    rows, n = x.shape
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    if threads is None:
        threads = 32 if n <= 32 * MAX_VPT else min(max_threads, max(64, _pow2_at_least(n // 16)))
    vpt = max(vpt or fit_vpt(n, threads), width)
    if threads * vpt < n or vpt % width or vpt > max_vpt(threads):
        raise ValueError(
            f"fused keeps a row on chip: at most threads·vpt = {threads}·{vpt} = "
            f"{threads * vpt} values, got a row of {n}; use method='online' or 'split'"
        )
    if threads == 32:  # warp per row, several rows per block
        grid = -(-rows // rows_per_block)
        launcher.launch(kernel(x.dtype, 32 * rows_per_block, vpt, mode, 32, width), grid, 32 * rows_per_block, stream, (x, y))
    else:
        launcher.launch(kernel(x.dtype, threads, vpt, mode, threads, width), rows, threads, stream, (x, y))


def _pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def max_vpt(threads):
    """Values one thread may hold: ``MAX_VPT``, or half of it in a block of 1024 threads,
    where the register file (64K per multiprocessor) leaves each thread 64 registers."""
    return MAX_VPT if threads <= 512 else MAX_VPT // 2


def max_row(max_threads):
    """The longest row the fused kernel takes with blocks of at most ``max_threads``."""
    return max(t * max_vpt(t) for t in (32, 64, 128, 256, 512, 1024) if t <= max_threads)


def fit_vpt(n, threads):
    """The smallest power-of-two values-per-thread that holds a row of n; ValueError if
    even :func:`max_vpt` does not."""
    vpt = 1
    while threads * vpt < n and vpt < max_vpt(threads):
        vpt *= 2
    if threads * vpt < n:
        raise ValueError(
            f"a row of {n} values does not fit on chip (at most {threads}·{max_vpt(threads)} = "
            f"{threads * max_vpt(threads)} with {threads} threads); use method='online' or 'split'"
        )
    return vpt
