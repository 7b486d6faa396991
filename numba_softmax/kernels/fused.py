"""v2 — fused softmax: the row stays on chip.  One read and one write per element.

One block per row, T threads, each holding VPT values in registers (a row of up to
T·VPT values).  Thread t owns the values x[t], x[t + T], x[t + 2T], … (coalesced: at
each step the warp reads 32 neighbours).

    1. load     each thread reads its VPT values once, into registers;
    2. state    each thread folds them into its own (m, ℓ): m = max, ℓ = Σ exp(x − m);
    3. combine  the block folds the T states into the row's (m, ℓ): warp butterflies,
                then one more across warps (:mod:`.reduce`);
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

from ..combine import weight_device
from ._compile import FASTMATH, accumulator
from .epilogue import LOGSUMEXP, element, row_constant
from .reduce import block_combine

MAX_VPT = 32  # values per thread held in registers; beyond this they would spill


@functools.cache
def kernel(dtype, threads, vpt, mode):
    acc = accumulator(dtype)

    @cuda.jit(fastmath=FASTMATH)
    def fused(x, y):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        n = x.shape[1]
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        v = cuda.local.array(vpt, acc)  # this thread's values, in registers (unrolled)

        m = acc(-math.inf)  # 1. load (and 2a. the running max)
        for i in range(vpt):
            j = t + i * threads
            v[i] = acc(x[row, j]) if j < n else acc(-math.inf)  # padding: −inf weighs 0
            m = v[i] if v[i] > m else m
        l = acc(0.0)  # 2b. ℓ relative to the thread's own max
        for i in range(vpt):
            l += weight_device(v[i], m)
        m, l = block_combine(m, l, m_shared, l_shared)  # 3. the row's state
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0:
                y[row, 0] = c
            return
        for i in range(vpt):  # 4. write from registers
            j = t + i * threads
            if j < n:
                y[row, j] = element(v[i], m, c, mode)

    return fused


def launch(x, y, mode, threads=128, vpt=None, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    rows, n = x.shape
    vpt = vpt or fit_vpt(n, threads)
    if threads * vpt < n:
        raise ValueError(
            f"fused keeps a row on chip: at most threads·vpt = {threads}·{vpt} = "
            f"{threads * vpt} values, got a row of {n}; use method='online' or 'split'"
        )
    kernel(x.dtype, threads, vpt, mode)[rows, threads, stream](x, y)


def fit_vpt(n, threads):
    """The smallest power-of-two values-per-thread that holds a row of n; ValueError if
    even ``MAX_VPT`` does not."""
    vpt = 1
    while threads * vpt < n and vpt < MAX_VPT:
        vpt *= 2
    if threads * vpt < n:
        raise ValueError(
            f"a row of {n} values does not fit on chip (at most {threads}·{MAX_VPT} = "
            f"{threads * MAX_VPT} with {threads} threads); use method='online' or 'split'"
        )
    return vpt
