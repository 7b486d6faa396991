"""Workspaces the kernels need between launches, kept instead of allocated per call.

A ``cuda.device_array`` per call costs a ``cuMemAlloc``, and its later ``cuMemFree``
synchronises the whole device — in a training loop, a stall per step.  :func:`scratch`
keeps one growing buffer per (stream, dtype, tag) and hands out views of it.  Two
launches on one stream run in order, so they may share it; another stream gets its own.
"""

import math

import numpy as np
from numba import cuda

_BUFFERS = {}


def scratch(shape, dtype, stream, tag):
    """A device array of ``shape`` and ``dtype`` (contents undefined), valid until the next
    call with the same ``stream``, ``dtype`` and ``tag`` (use one tag per array a launch
    needs at once)."""
    dtype = np.dtype(dtype)
    try:
        handle = int(stream) if stream else 0  # a Numba stream's int() is its handle
    except TypeError:
        handle = id(stream)  # the simulator's streams have none
    key = (handle, dtype, tag)
    need = max(1, math.prod(shape))
    buf = _BUFFERS.get(key)
    if buf is None or buf.shape[0] < need:
        buf = _BUFFERS[key] = cuda.device_array(max(need, 4096), dtype=dtype, stream=stream)
    return buf[:math.prod(shape)].reshape(shape)
