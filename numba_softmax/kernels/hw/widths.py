"""How wide a vector an array allows: values per 16-byte load, and the widest every row
of some (rows, n) arrays can take (the host side of :mod:`.vector`, whose names these
also are).
"""

import numba
import numpy as np

from ...runtime.sim import simulator_enabled

VECTOR_BYTES = 16


def width_for(dtype):
    """Values per 16-byte vector for ``dtype``."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def storage_type(dtype):
    """The numba type a row of ``dtype`` is stored in (uint16 for bfloat16)."""
    from . import jit

    return numba.uint16 if jit.storage(dtype) == jit.BFLOAT16 else numba.from_dtype(np.dtype(dtype))


def vector_width(*arrays):
    """The widest W every (rows, n) array allows: unit column stride, row stride a
    multiple of W, 16-byte aligned base (not checkable, and not needed, on the simulator)."""
    width = width_for(arrays[0].dtype)
    for a in arrays:
        w = width_for(a.dtype)
        rs, cs = (s // a.dtype.itemsize for s in a.strides)
        if a.shape[1] > 1 and cs != 1:
            return 1
        if a.shape[0] > 1 and rs % w:
            return 1
        if not simulator_enabled() and a.__cuda_array_interface__["data"][0] % VECTOR_BYTES:
            return 1
        width = min(width, w)
    return width
