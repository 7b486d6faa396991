"""Device memory the decode kernels keep from call to call besides the launcher's
workspaces: zeroed ticket counters, and placeholders for arguments a variant ignores.

The decode kernel's in-kernel merge (:mod:`.decode`) counts finished blocks per K/V head
with an atomic ticket; the counters must be zero before a launch, so they are zeroed when
allocated and the last block of each group resets its own — they are zero between
launches.  One set per stream: two streams running at once must not share them.
(The float32 partials are :func:`.launcher.scratch` workspaces.)
"""

import numpy as np
from numba import cuda

from .._sim import simulator_enabled

_TICKETS, _PLACEHOLDERS = {}, {}


def _device():
    return None if simulator_enabled() else cuda.get_current_device().id


def tickets(n, stream=0):
    """At least n int32 counters, all zero."""
    try:
        handle = int(stream) if stream else 0  # a Numba stream's int() is its handle
    except TypeError:
        handle = id(stream)  # the simulator's streams have none
    key = (_device(), handle)
    buf = _TICKETS.get(key)
    if buf is None or buf.shape[0] < n:
        buf = _TICKETS[key] = cuda.to_device(np.zeros(max(n, 1024), np.int32), stream=stream)
    return buf


def placeholder(ndim, dtype):
    """A tiny array standing in for an argument a kernel variant does not read."""
    key = (ndim, np.dtype(dtype), _device())
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS[key] = cuda.to_device(np.zeros((1,) * ndim, dtype))
    return _PLACEHOLDERS[key]
