"""v1 — three-pass safe softmax: the textbook algorithm, one pass over memory per step.

One block per row, T threads striding over the row.

    pass 1  m = max_j x_j                     (read the row)
    pass 2  ℓ = Σ_j exp(x_j − m)              (read it again)
    pass 3  y_j = exp(x_j − m) / ℓ            (read it a third time, write the output)

Memory traffic: read 3·N·b, write N·b (4·N·b).  Both reductions are the combiner with a
twist: the max pass folds states (x, 0) — combine((a, 0), (b, 0)) = (max, 0) — and the
sum pass folds states that share the one m — combine((m, a), (m, b)) = (m, a + b) — so
even the textbook kernel runs on the one block combine of :mod:`.reduce`.
NumPy twin: :func:`numba_softmax.reference.softmax`.
"""

import functools
import math

from numba import cuda

from ..combine import larger_device, weight_device
from . import jit, launcher
from .jit import accumulator
from .epilogue import LOGSUMEXP, element, row_constant
from .reduce import block_combine


@functools.cache
def kernel(dtype, threads, mode):
    acc = accumulator(dtype)

    @jit.kernel
    def three_pass(x, y):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        n = x.shape[1]
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)

        m = acc(-math.inf)  # pass 1: the max
        for j in range(t, n, threads):
            m = larger_device(m, acc(x[row, j]))  # a NaN is kept, as the combiner keeps it
        m, _ = block_combine(m, acc(0.0), m_shared, l_shared)

        l = acc(0.0)  # pass 2: the sum, every thread against the same m
        for j in range(t, n, threads):
            l += weight_device(acc(x[row, j]), m)
        m, l = block_combine(m, l, m_shared, l_shared)

        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0:
                y[row, 0] = c
            return
        for j in range(t, n, threads):  # pass 3: normalise
            y[row, j] = element(acc(x[row, j]), m, c, mode)

    return three_pass


def launch(x, y, mode, threads=256, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    launcher.launch(kernel(x.dtype, threads, mode), x.shape[0], threads, stream, (x, y))
