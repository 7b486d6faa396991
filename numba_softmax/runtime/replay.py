"""Replayable launches: a recorded kernel launch whose pointer arguments can be swapped.

A launch plan (:mod:`numba_softmax.plans`) keeps, for each kernel a call launched, the
flat argument list Numba built for it (meminfo, parent, size, itemsize, data, shape…,
strides… per array; a C scalar per scalar) and where the data pointers sit in it.  A
replay writes the new pointers there and launches — nothing is typed or wrapped again.

Two ways to launch, chosen per process by ``NUMBA_SOFTMAX_REPLAY`` (default ``driver``):

* ``driver`` — the argument values live in C objects made once; ``kernelParams`` (the
  array of their addresses that ``cuLaunchKernel`` reads) is made once too; a replay sets
  the pointer objects' values and calls ``cuLaunchKernel`` through ``cuda.bindings``
  with that array's address (the cheapest of the calls timed in ``docs/plans.md``, "The
  launch itself").
* ``core`` — ``cuda.core.launch``, which numba-cuda itself uses: it converts every
  argument again on each launch.

Both are checked the same way: the first plan of a process is replayed beside the
ordinary result and compared (:func:`numba_softmax.plans._self_check`).  A lock makes the
patch-then-launch step atomic, since two threads may replay one plan.
"""

import ctypes
import functools
import os
import threading

import numpy as np

from .driver import cu as _cu

try:
    from cuda.core import LaunchConfig, Stream
    from cuda.core import launch as _core_launch
    from numba.cuda._compat import CUDA_CORE_GE_1_0
except ImportError:  # pragma: no cover - another numba-cuda or cuda.core: no replays
    _core_launch = None

MODE = os.environ.get("NUMBA_SOFTMAX_REPLAY", "driver")
_STREAMS = {}


def available():
    return _core_launch is not None and _cu is not None


def _c_value(v):
    """A C object holding one flat argument the way cuda.core passes it: Python ints
    are intptr_t, bools one byte, floats double; ctypes scalars as they are."""
    if isinstance(v, (bool, np.bool_)):
        return ctypes.c_bool(bool(v))
    if isinstance(v, int):
        return ctypes.c_int64(v)
    if isinstance(v, float):
        return ctypes.c_double(v)
    if isinstance(v, ctypes._SimpleCData):
        return type(v)(v.value)
    raise TypeError(f"cannot replay a kernel argument of type {type(v).__name__}")


def _triple(dims):
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return tuple(dims) + (1,) * (3 - len(dims))


class Launch:
    """One recorded launch: ``fire(stream_handle, values)`` sets argument i to
    ``values[k]`` for the k-th patch index and launches."""

    __slots__ = ("patches", "fire", "_lock")

    def __init__(self, compiled, grid, block, shared, flat, patches):
        self.patches = tuple(patches)
        self._lock = threading.Lock()
        cufunc = compiled._codelibrary.get_cufunc()
        cooperative = bool(compiled.cooperative)
        if MODE == "core":
            self.fire = self._core(cufunc.kernel, grid, block, shared, cooperative, flat)
        else:
            self.fire = self._driver(cufunc.handle, grid, block, shared, cooperative, flat)

    def _driver(self, handle, grid, block, shared, cooperative, flat):
        err, func = _cu.cuKernelGetFunction(handle)  # the CUfunction in this context
        if err != _cu.CUresult.CUDA_SUCCESS:
            raise NotImplementedError(f"cuKernelGetFunction: {err}")
        objs = [_c_value(v) for v in flat]
        params = (ctypes.c_void_p * max(len(objs), 1))(*[ctypes.addressof(o) for o in objs])
        address = ctypes.addressof(params)
        targets = [objs[i] for i in self.patches]
        (gx, gy, gz), (bx, by, bz) = _triple(grid), _triple(block)
        lock = self._lock
        # the launch with everything but the stream bound (a C-level partial: no frame)
        launch = _cu.cuLaunchCooperativeKernel if cooperative else _cu.cuLaunchKernel
        go = functools.partial(launch, func, gx, gy, gz, bx, by, bz, shared)
        tail = (address,) if cooperative else (address, 0)  # kernelParams (, extra)

        def fire(stream_handle, values):
            with lock:  # the C objects are shared by every replay of this launch
                for o, v in zip(targets, values):
                    o.value = v
                err = go(stream_handle, *tail)[0]
            if err:
                raise RuntimeError(f"cuLaunchKernel failed: {err!r}")

        fire.params = params  # the address is all the driver sees: these must outlive it
        fire.values = objs
        return fire

    def _core(self, kernel, grid, block, shared, cooperative, flat):
        option = "is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch"
        config = LaunchConfig(grid=_triple(grid), block=_triple(block), shmem_size=shared,
                              **{option: cooperative})
        template = tuple(flat)

        def fire(stream_handle, values):
            args = list(template)
            for i, v in zip(self.patches, values):
                args[i] = v
            _core_launch(_core_stream(stream_handle), config, kernel, *args)

        return fire


def _core_stream(handle):
    """The cuda.core stream of a handle, made once per handle."""
    core = _STREAMS.get(handle)
    if core is None:
        core = _STREAMS[handle] = Stream.from_handle(handle)
    return core
