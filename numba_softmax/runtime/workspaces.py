"""Scratch device memory kept from call to call: one buffer per (tag, dtype, stream, device).

A ``cudaMalloc`` per call would cost more than a small kernel, so the kernels' scratch
— split partials, (m, ℓ) states, counters — lives in buffers kept here and grown as
needed, one per stream because two streams running at once must not share one.  Launch
plans may point at them (:func:`workspace_holding` finds the one holding an address).
The three functions are importable from :mod:`.launcher` too, where the kernels ask.
"""

import threading

from .sim import simulator_enabled

_WORKSPACES = {}
_WS_LOCK = threading.Lock()


def workspace(tag, n, dtype, stream=0, zeroed=False):
    """A flat device buffer of at least ``n`` values of ``dtype``, kept per (tag, dtype,
    stream) and grown as needed: scratch that outlives calls (a cudaMalloc per call would
    cost more than a small kernel), one per stream because two streams running at once
    must not share it.  Launch plans may point at these (and keep them alive).
    ``zeroed``: a new buffer starts as zeros (counters that kernels keep consistent)."""
    from numba import cuda

    try:
        handle = int(stream) if stream else 0  # a Numba stream's int() is its handle
    except TypeError:
        handle = id(stream)  # the simulator's streams have none
    device = None if simulator_enabled() else cuda.get_current_device().id
    key = (tag, str(dtype), handle, device)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.shape[0] < n:
        if zeroed:
            import numpy as np

            buf = cuda.to_device(np.zeros(max(n, 4096), dtype=dtype), stream=stream)
        else:
            buf = cuda.device_array(max(n, 4096), dtype=dtype, stream=stream)
        with _WS_LOCK:
            _WORKSPACES[key] = buf
    return buf


def scratch(shape, dtype, stream, tag):
    """A device array of ``shape`` and ``dtype`` (contents undefined) carved from the
    :func:`workspace` of (``tag``, dtype, stream): valid until the next call with the same
    tag on that stream (use one tag per array a launch needs at once)."""
    n = 1
    for s in shape:
        n *= s
    return workspace(tag, max(n, 1), dtype, stream)[:n].reshape(shape)


def workspace_holding(ptr):
    """The workspace whose memory holds device address ``ptr``, or None."""
    for buf in list(_WORKSPACES.values()):
        base = buf.__cuda_array_interface__["data"][0]
        if base <= ptr < base + buf.nbytes:
            return buf
    return None
