"""What every softmax kernel writes once it knows a row's (m, ℓ): one place, three outputs.

``mode`` is a compile-time constant of each kernel (the factories close over it), so the
branches below vanish from the compiled code.

    SOFTMAX      p_i   = exp(x_i − m) · (1/ℓ)          row constant c = 1/ℓ
    LOG_SOFTMAX  log p = (x_i − m) − log ℓ             row constant c = log ℓ
    LOGSUMEXP    lse   = m + log ℓ                     one value per row, no element pass

Edge rows fall out of the arithmetic, no special cases: a row of all −inf has m = −inf,
ℓ = 0, so c = 1/0 = inf and exp(−inf − 0) · inf = 0 · inf → NaN everywhere, as in
PyTorch; a NaN or +inf makes ℓ NaN and so the whole row NaN.
"""

import math

from ..hw import jit

from ...combine import lse_device

SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2
MODES = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "logsumexp": LOGSUMEXP}


@jit.device
def row_constant(m, l, one, mode):
    """c: 1/ℓ for softmax, log ℓ for log_softmax, the LSE itself for logsumexp.

    ``one`` is 1 in the accumulator type (a bare 1.0 would be float64)."""
    if mode == SOFTMAX:
        return one / l  # ℓ = 0 gives inf, and then NaN: the row is all −inf
    if mode == LOG_SOFTMAX:
        return math.log(l) if l != 0 else m  # log 0 = −inf (m is −inf there); log NaN = NaN
    return lse_device(m, l)


@jit.device
def base(m, zero):
    """What to subtract before ``exp``: the max m, or 0 where m = −inf.  Every value is −inf
    then, and exp(−inf − 0) = 0: the NaN of −inf − (−inf) is never formed, with one test
    for all the values that share m (:func:`.combine.weight` tests each).  ``zero``: 0 in
    m's type."""
    return zero if m == -math.inf else m


@jit.device
def element(x, b, c, mode):
    """The output for one input value x, given the row's :func:`base` b and constant c.
    (For log_softmax b is m itself but where m = −inf; the output is NaN there either
    way: c = log 0 = −inf.)"""
    if mode == SOFTMAX:
        return math.exp(x - b) * c
    return (x - b) - c
