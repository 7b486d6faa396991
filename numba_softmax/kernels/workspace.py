"""Scratch device memory the split kernels reuse from call to call, one set per stream.

A ``cudaMalloc`` per call would cost more than decoding one token, so the float32
partials of split-KV (:mod:`.decode`, :mod:`.paged`) and the tickets of the decode
kernel's in-kernel merge are allocated once and grown as needed.  One set per stream:
two streams running at once must not share them.  The tickets are zero between launches
(the last block of each group resets its own), so they are zeroed only when allocated.
"""

import numpy as np
from numba import cuda

from .._sim import simulator_enabled

_FLOATS, _TICKETS, _DUMMIES = {}, {}, {}


def _key(stream):
    device = None if simulator_enabled() else cuda.get_current_device().id
    return device, int(stream) if stream else 0  # a Numba stream's int() is its handle


def partials(shape, dv, stream=0):
    """Float32 O (shape + (dv,)) and LSE (shape), C-contiguous, carved from one buffer."""
    key = _key(stream)
    n = shape[0] * shape[1] * shape[2]
    need = n * (dv + 1)
    buf = _FLOATS.get(key)
    if buf is None or buf.shape[0] < need:
        buf = _FLOATS[key] = cuda.device_array(max(need, 4096), dtype=np.float32, stream=stream)
    return buf[: n * dv].reshape(*shape, dv), buf[n * dv : need].reshape(*shape)


def tickets(n, stream=0):
    """At least n int32 counters, all zero."""
    key = _key(stream)
    buf = _TICKETS.get(key)
    if buf is None or buf.shape[0] < n:
        buf = _TICKETS[key] = cuda.to_device(np.zeros(max(n, 1024), np.int32), stream=stream)
    return buf


def dummy(ndim, dtype):
    """A tiny array standing in for an argument a kernel variant does not read."""
    key = (ndim, np.dtype(dtype), _key(0)[0])
    if key not in _DUMMIES:
        _DUMMIES[key] = cuda.to_device(np.zeros((1,) * ndim, dtype))
    return _DUMMIES[key]
