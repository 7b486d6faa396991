"""Device memory for the Numba device arrays this package makes, kept for reuse.

Numba gives every device array its own ``cuMemAlloc`` and frees it later, in batches,
with ``cuMemFree``: for a small call that is many times the GPU work of the call itself,
and many times what PyTorch's caching allocator takes for ``torch.empty``
(``docs/plans.md`` has the figures).  This pool does what PyTorch's and CuPy's allocators do, for
the outputs and scratch buffers of numba_softmax only (Numba's allocator is left alone):

* a *block* is memory from Numba (``context.memalloc``): Numba still owns and frees it;
* an array made here holds a *loan* of a block as its memory's owner — the way
  ``cuda.from_cuda_array_interface(..., owner=...)`` arrays hold theirs — and every view
  or slice of the array holds the same loan;
* when the last of them is gone, the loan puts the block back in the pool of its
  (context, stream, size), and the next array of that size on that stream takes it.

Stream order makes the reuse safe on the stream an array was made for: a kernel queued
there later runs after every earlier use.  As with PyTorch's and CuPy's pools, an array
that was used on *another* stream must be synchronised by its user before it is dropped.
At most ``MAX_CACHED`` idle bytes are kept; :func:`release` hands them all back to Numba.
A block whose context was reset (``cuda.close()``) is found dead and never lent again.
"""

import math
import threading

import numpy as np
from numba import cuda

from ..runtime.sim import simulator_enabled

MAX_CACHED = 256 << 20  # idle bytes kept for reuse, over every context and stream

_LOCK = threading.RLock()  # re-entrant: a loan collected while its thread holds the lock
_IDLE = {}  # (context id, stream handle, bytes) -> [(Numba's owned pointer, address)]
_CACHED = [0]


class _Loan:
    """The owner of a lent block: gives it back when the last array holding it is gone."""

    __slots__ = ("block", "where")

    def __init__(self, block, where):
        self.block, self.where = block, where

    def __del__(self):
        try:
            _give_back(self.where, self.block)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to reuse
            pass


def _give_back(where, block):
    fresh = []  # made outside the lock: an allocation may run the garbage collector
    with _LOCK:
        if _CACHED[0] + where[2] <= MAX_CACHED:
            _IDLE.setdefault(where, fresh).append(block)
            _CACHED[0] += where[2]


def _take(where, context):
    """An idle block of ``where`` (alive), or a new one from Numba."""
    while True:
        with _LOCK:
            idle = _IDLE.get(where)
            if not idle:
                break
            block = idle.pop()
            _CACHED[0] -= where[2]
        try:
            block[0].device_pointer  # raises once Numba freed it with its context
            return block
        except ReferenceError:
            continue
    return new_block(context, where[2])


def new_block(context, nbytes):
    """(Numba's owned pointer, address) of ``nbytes`` fresh from Numba's allocator."""
    owned = context.memalloc(nbytes)
    return owned, owned.device_pointer_value


def release():
    """Hand every idle block back to Numba (its allocator frees them)."""
    with _LOCK:
        _IDLE.clear()
        _CACHED[0] = 0


def allocator(shape, dtype):
    """A function ``stream -> (Numba device array, its address)`` making C-contiguous
    arrays of ``shape`` and ``dtype`` in the current context (looked up once: a launch
    plan's context is part of its key)."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    strides = tuple(math.prod(shape[i + 1:]) * dtype.itemsize for i in range(len(shape)))
    if not nbytes or nbytes > MAX_CACHED:
        def make(stream):
            buf = cuda.device_array(shape, dtype=dtype, stream=stream)
            return buf, buf.device_ctypes_pointer.value or 0
        return make
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import MemoryPointer

    context = cuda.current_context()
    home = id(context)

    def make(stream):
        where = (home, int(stream) if stream else 0, nbytes)
        block = _take(where, context)
        memory = MemoryPointer(context, block[0].device_pointer, nbytes,
                               owner=_Loan(block, where))
        return DeviceNDArray(shape, strides, dtype, stream=stream, gpu_data=memory), block[1]

    return make


def device_array(shape, dtype, stream=0):
    """A new C-contiguous Numba device array, its memory from the pool."""
    if simulator_enabled():
        return cuda.device_array(tuple(shape), dtype=np.dtype(dtype), stream=stream)
    return allocator(shape, dtype)(stream)[0]
