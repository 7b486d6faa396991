"""How every kernel here is compiled: one place for the options and the accumulator type.

* ``FASTMATH`` (defined beside the combiner, whose device twins use it too): fast
  ``exp``/``log`` and reciprocal, FMA contraction, no ``nnan``/``ninf``.  Every
  ``cuda.jit`` here — kernels *and* device functions — passes it: a kernel's flag does
  not reach into the device functions it calls.  (The simulator ignores fastmath.)
* ``accumulator(dtype)``: float16 inputs accumulate in float32, like PyTorch; float32 and
  float64 accumulate in their own type.  Kernels are built by small cached factories
  that close over this type, so constants such as the identity (−inf, 0) are typed
  exactly (a bare ``-math.inf`` would silently turn float32 arithmetic into float64).
"""

import threading

import numba
import numpy as np

from ..combine import FASTMATH  # noqa: F401  (re-exported for the kernels)

_ACCUMULATE = {np.dtype(np.float16): numba.float32, np.dtype(np.float32): numba.float32,
               np.dtype(np.float64): numba.float64}


def accumulator(dtype):
    """The numba type a kernel accumulates ``dtype`` values in."""
    return _ACCUMULATE[np.dtype(dtype)]


_recording = threading.local()


def launch_kernel(kernel, grid, block, stream, *args):
    """``kernel[grid, block, stream](*args)``, the one place every kernel is launched.

    While :mod:`numba_softmax._fastpath` records a launch plan, each launch is also
    noted (kernel, grid, block, arguments), so the plan can replay it later without
    Numba's per-call argument handling."""
    kernel[grid, block, stream](*args)
    notes = getattr(_recording, "launches", None)
    if notes is not None:
        notes.append((kernel, grid, block, args))
