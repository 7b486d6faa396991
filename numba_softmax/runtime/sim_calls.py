"""The simulator's device-function calls made cheap: the fake ``cuda`` module swapped into
a module once per launch (used only under ``NUMBA_ENABLE_CUDASIM=1``; installed with
:mod:`.sim_blocks`).

The simulator swaps its fake ``cuda`` into a module's globals around *every*
device-function call, under a per-module lock and a reference count; here a module is
swapped on its first call in a launch and restored when the launch ends.
"""

import threading
from contextlib import contextmanager

LOCK = threading.Lock()
_held = {}  # id(module globals) -> (globals, {name: the real cuda module})
_simulator_swap = _simulator_call = None


@contextmanager
def _swapped_cuda_module(fn, fake):
    """The simulator swaps the fake ``cuda`` into a module's globals around *every*
    device-function call, under a per-module lock and a reference count — with 64
    threads calling device functions, most of a launch went to waiting on that lock.
    Here a module is swapped once, on its first call in a launch, and stays swapped
    until the launch ends (the simulator runs one launch at a time)."""
    from numba.cuda.simulator.kernel import _get_kernel_context

    if fake is None or _get_kernel_context() is not fake:  # outside a launch: as before
        with _simulator_swap(fn, fake):
            yield
        return
    g = fn.__globals__
    if id(g) not in _held:
        from numba import cuda

        with LOCK:
            if id(g) not in _held:
                names = {k: v for k, v in g.items() if v is cuda}
                for k in names:
                    g[k] = fake
                _held[id(g)] = (g, names)
    yield


def _launch(self, *args):
    """``FakeCUDAKernel.__call__``: the launch itself, then every module swapped for it
    restored."""
    from numba.cuda.simulator.kernel import _get_kernel_context

    if self._device or _get_kernel_context() is not None:
        return _simulator_call(self, *args)
    try:
        return _simulator_call(self, *args)
    finally:
        with LOCK:
            for g, names in _held.values():
                g.update(names)
            _held.clear()


def install():
    """Put :func:`_swapped_cuda_module` and :func:`_launch` in the simulator's place
    (idempotent)."""
    global _simulator_swap, _simulator_call
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator import kernelapi

    if _simulator_swap is None:
        _simulator_swap = kernelapi.swapped_cuda_module
        _simulator_call = simkernel.FakeCUDAKernel.__call__
        simkernel.swapped_cuda_module = _swapped_cuda_module
        simkernel.FakeCUDAKernel.__call__ = _launch
