"""The call path for CUDA arrays, with Numba's per-call work taken out.

``kernel[grid, block](x, y)`` types every argument, wraps it as a device array and looks
the compiled kernel up on each call — about 25 µs before the GPU sees anything — and our
own checks and array views add more.  A softmax of one 1×1024 row is ~3 µs of GPU work.
So the first call on CUDA arrays of a given layout *records* a launch plan (the compiled
kernels, grids, blocks and arguments of each launch, noted by
:func:`numba_softmax.kernels.launcher.launch`), and later calls *replay* it: a dictionary
look-up, two data pointers, an output allocation and one driver launch per kernel.

A plan is keyed by everything that shaped it: array library, device, dtype, shape,
strides, axis, method, output, stream and the input's 16-byte alignment.  Only the
input and output pointers change between calls; they are patched into the recorded
argument lists (Numba's kernel ABI passes an array as meminfo, parent, size, itemsize,
data, shape…, strides…).  NumPy inputs, ``out=``, empty arrays, inputs that needed a copy,
and the simulator always take the ordinary path.
"""

import ctypes
import threading
import types

from .kernels import launcher

try:  # the launcher numba-cuda itself uses (cuda.core)
    from numba.cuda.cudadrv.driver import _to_core_stream
    from numba.cuda.dispatcher import CUDA_CORE_GE_1_0, LaunchConfig
    from numba.cuda.dispatcher import launch as _core_launch
except ImportError:  # pragma: no cover - another numba-cuda: no fast path
    _core_launch = None

_PLANS = {}
_LOCK = threading.Lock()
MAX_PLANS = 256


def _pointer(x, kind):
    if kind == "cupy":
        return x.data.ptr
    if kind == "torch":
        return x.data_ptr()
    return x.__cuda_array_interface__["data"][0]


def key(x, kind, axis, method, mode, stream):
    """The plan key of a call, or None when this call must take the ordinary path."""
    if _core_launch is None or kind not in ("cupy", "torch"):
        return None
    if kind == "cupy":
        layout = (x.device.id, x.dtype, x.shape, x.strides)
    else:
        layout = (x.device, x.dtype, tuple(x.shape), x.stride())
    return (kind, layout, axis, method, mode, int(stream) if stream else 0,
            _pointer(x, kind) % 16 == 0)


def replay(plan_key, x):
    """The result of a call whose plan exists, or None."""
    plan = _PLANS.get(plan_key)
    return None if plan is None else plan(x)


recording = launcher.recording


def _flat_array(a):
    """Numba's kernel ABI for an array argument (see ``_Kernel._prepare_args``)."""
    ptr = a.__cuda_array_interface__["data"][0]
    return [0, 0, a.size, a.dtype.itemsize, ptr, *a.shape, *a.strides]


def _dim3(d):
    d = (d,) if isinstance(d, int) else tuple(d)
    return d + (1,) * (3 - len(d))


class Plan:
    def __init__(self, notes, x_view, y_view, allocate, finish, stream, x_ptr):
        self.allocate, self.finish = allocate, finish
        self.kind = None
        self.stream = _to_core_stream(stream)
        self.launches = []
        self.keep = []  # workspaces the recorded launches point to stay alive with the plan
        for kernel, grid, block, args, shared in notes:
            argtypes = tuple(kernel.typeof_pyval(a) for a in args)
            compiled = kernel.overloads[argtypes]
            flat, x_at, y_at = [], [], []
            for a, ty in zip(args, argtypes):
                if hasattr(a, "__cuda_array_interface__"):
                    if a is x_view:
                        x_at.append(len(flat) + 4)
                    elif a is y_view:
                        y_at.append(len(flat) + 4)
                    else:
                        self.keep.append(a)
                    flat += _flat_array(a)
                else:
                    flat.append(getattr(ctypes, f"c_{ty}")(a))
            option = "is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch"
            config = LaunchConfig(grid=_dim3(grid), block=_dim3(block), shmem_size=shared, **{option: False})
            self.launches.append((compiled._codelibrary.get_cufunc().kernel, config, flat, x_at, y_at))
        if _flat_array(x_view)[4] != x_ptr:
            raise ValueError("the kernels read a copy of the input: no plan")

    def __call__(self, x):
        buf, y_ptr = self.allocate()
        x_ptr = _pointer(x, self.kind)
        for cufunc, config, flat, x_at, y_at in self.launches:
            args = list(flat)
            for i in x_at:
                args[i] = x_ptr
            for i in y_at:
                args[i] = y_ptr
            _core_launch(self.stream, config, cufunc, *args)
        return self.finish(buf)


def store(plan_key, notes, rows, y_view, buf, keep_axis, stream):
    """Keep a plan for this key, built from the launches just recorded."""
    if plan_key is None or not notes:
        return
    kind = rows.kind
    shape, dtype = tuple(buf.shape), buf.dtype
    if kind == "cupy":
        import cupy

        device = rows.x.device.id

        def allocate():
            with cupy.cuda.Device(device):
                out = cupy.empty(shape, dtype=dtype)
            return out, out.data.ptr
    else:
        import torch

        device = rows.x.device

        def allocate():
            out = torch.empty(shape, dtype=dtype, device=device)
            return out, out.data_ptr()

    layout = types.SimpleNamespace(kind=kind, lead_shape=rows.lead_shape, n=rows.n, axis=rows.axis)

    def finish(out):  # the result's shape and axes, as the ordinary path gives them
        return type(rows).finish(layout, out, keep_axis)

    try:
        plan = Plan(notes, rows.view, y_view, allocate, finish, stream, _pointer(rows.x, kind))
    except (KeyError, ValueError, TypeError, AttributeError):
        return  # something this plan cannot replay: the ordinary path stays in use
    plan.kind = kind
    with _LOCK:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[plan_key] = plan
