"""How every kernel here is compiled: one place for the options and the accumulator type.

* ``FASTMATH``: fast ``exp``/``log`` and reciprocal, contraction to FMA — but *not* the
  ``nnan``/``ninf`` flags of ``fastmath=True``, which would let the compiler delete the
  −inf and NaN handling the combiner relies on.  (The simulator ignores fastmath.)
* ``accumulator(dtype)``: float16 inputs accumulate in float32, like PyTorch; float32 and
  float64 accumulate in their own type.  Kernels are built by small cached factories
  that close over this type, so constants such as the identity (−inf, 0) are typed
  exactly (a bare ``-math.inf`` would silently turn float32 arithmetic into float64).
"""

import numba
import numpy as np

FASTMATH = {"contract", "afn", "arcp"}

_ACCUMULATE = {np.dtype(np.float16): numba.float32, np.dtype(np.float32): numba.float32,
               np.dtype(np.float64): numba.float64}


def accumulator(dtype):
    """The numba type a kernel accumulates ``dtype`` values in."""
    return _ACCUMULATE[np.dtype(dtype)]
