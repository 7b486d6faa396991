"""The CUDA driver, for the few calls the package makes itself.

Numba's own wrappers for these (``cuda.current_context()``, ``get_current_device``) cost
microseconds a call on paths that have few to spend; the driver answers in a fraction of
one (``docs/plans.md``, "Where the microseconds go").  ``cu`` is
``cuda.bindings.driver``, or None where it is missing (then launch plans are off and the
callers take Numba's way).
"""

try:
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - no cuda.bindings
    cu = None


def current_context():
    """This thread's current CUDA context, as an int handle (0: none)."""
    if cu is None:
        return 0
    err, ctx = cu.cuCtxGetCurrent()
    return 0 if err else int(ctx)


def current_device():
    """The device ordinal of this thread's current CUDA context, or None without one."""
    if cu is None:
        return None
    err, dev = cu.cuCtxGetDevice()
    return None if err else int(dev)


def set_kernel_attribute(name, value, handle, device):
    """``cuKernelSetAttribute``: set the ``CUfunction_attribute`` ``name`` on the compiled
    kernel ``handle`` for ``device``; raises RuntimeError with the driver's error."""
    _require()
    attr = getattr(cu.CUfunction_attribute, name)
    (err,) = cu.cuKernelSetAttribute(attr, value, handle, device)
    if int(err) != 0:
        raise RuntimeError(f"cuKernelSetAttribute({name}, {value}): {err}")


def kernel_function(handle):
    """The CUfunction of the compiled kernel ``handle`` in the current context, or None."""
    _require()
    err, func = cu.cuKernelGetFunction(handle)
    return None if int(err) != 0 else func


def _require():
    if cu is None:
        raise RuntimeError("this needs the CUDA driver's Python bindings (cuda.bindings, "
                           "installed with numba-cuda[cu12] or [cu13])")
