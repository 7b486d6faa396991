"""What is done with arrays of each library: new ones, results handed back, streams.

* :func:`empty` / :func:`full` — a new array of the user's kind, with its device view;
  :func:`allocator` — the same, made once for a launch plan's replays;
* :func:`to_device` / :func:`to_user` — NumPy values in, results out as the user's kind
  (NumPy: copied); :func:`reshape`, :func:`cast`, :func:`concatenate`, :func:`to_numpy`;
* :func:`as_stream` — a Numba stream from any library's stream or a raw handle.

What an array *is* (kind, dtype, strides, pointer) is :mod:`.kinds`.
"""

import numpy as np
from numba import cuda

from . import pool
from ..runtime import record
from .kinds import BFLOAT16, c_strides, describe, is_torch, device_typestr, view, view_of


def _torch_dtype(torch, dtype):
    return torch.bfloat16 if dtype == BFLOAT16 else getattr(torch, np.dtype(dtype).name)


def _cupy_dtype(dtype):
    if dtype == BFLOAT16:
        raise TypeError("CuPy has no bfloat16 arrays; use PyTorch tensors for bfloat16")
    return dtype


def empty(kind, shape, dtype, like=None, stream=0):
    """(user array, its contiguous device view): a new array of ``kind`` on the device of
    ``like``.  For NumPy the "user array" is a Numba device array (copied back by
    :func:`to_user`).  Noted by a launch-plan recording in progress."""
    shape = tuple(shape)
    if kind == "torch":
        import torch

        buf = torch.empty(shape, dtype=_torch_dtype(torch, dtype), device=like.device)
        ptr = buf.data_ptr()
    elif kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            buf = cupy.empty(shape, dtype=_cupy_dtype(dtype))
        ptr = buf.data.ptr
    else:
        buf = pool.device_array(shape, np.dtype(device_typestr(dtype)), stream=stream)
        return record.allocated(buf, buf, (kind, shape, dtype, None))
    dev = view(buf, ptr, shape, c_strides(shape), dtype) if all(shape) else None
    return record.allocated(buf, dev, (kind, shape, dtype, like.device))


def allocator(recipe, arrays=()):
    """A function ``(stream, arrays) -> (user array, data pointer)`` that makes a buffer
    like the one a recipe noted by :func:`empty` describes (plan replay; what can be
    looked up once — library dtype, device, a template — is looked up here).  ``arrays``:
    the call's arrays when the plan is made.  PyTorch buffers copy an input of their very
    layout (contiguous, same shape, dtype and device) with ``empty_like`` — less host
    time than ``empty`` — or else one of their dtype and device with ``new_empty``; the
    plan key pins every input's layout, so the template stays one on every replay."""
    kind, shape, dtype, device = recipe
    if kind == "torch":
        import torch

        empty_, t_dtype = torch.empty, _torch_dtype(torch, dtype)
        kin = [j for j, a in enumerate(arrays) if type(a).__module__.startswith("torch")
               and a.dtype == t_dtype and a.device == device]
        like = next((j for j in kin if arrays[j].shape == shape
                     and arrays[j].is_contiguous()), None)
        if like is not None:
            empty_like = torch.empty_like

            def make(stream, arrays):
                buf = empty_like(arrays[like])
                return buf, buf.data_ptr()
        elif kin:  # new_empty: its dtype and device, not parsed again (cheaper than empty)
            like = kin[0]

            def make(stream, arrays):
                buf = arrays[like].new_empty(shape)
                return buf, buf.data_ptr()
        else:
            def make(stream, arrays):
                buf = empty_(shape, dtype=t_dtype, device=device)
                return buf, buf.data_ptr()
    elif kind == "cupy":
        import cupy

        dev_id = device.id
        if cupy.cuda.Device().id == dev_id:  # the plan key pins the current context
            def make(stream, arrays):
                buf = cupy.empty(shape, dtype=dtype)
                return buf, buf.data.ptr
        else:
            def make(stream, arrays):
                with cupy.cuda.Device(dev_id):  # a fresh one: a Device's with-stack is its own
                    buf = cupy.empty(shape, dtype=dtype)
                return buf, buf.data.ptr
    else:
        pooled = pool.allocator(shape, np.dtype(device_typestr(dtype)))

        def make(stream, arrays):
            return pooled(stream)
    return make


def full(kind, shape, value, dtype, like=None):
    """An array of ``kind`` filled with ``value`` (results that need no kernel)."""
    if kind == "torch":
        import torch

        return torch.full(tuple(shape), value, dtype=_torch_dtype(torch, dtype), device=like.device)
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.full(tuple(shape), value, dtype=_cupy_dtype(dtype))
    host = np.full(tuple(shape), value, dtype=np.float32 if dtype == BFLOAT16 else dtype)
    if dtype == BFLOAT16:
        host = _as_bfloat16_host(host)
    return host if kind == "numpy" else cuda.to_device(host)


def _as_bfloat16_host(host):
    """float32 NumPy values as an ``ml_dtypes.bfloat16`` array (NumPy bfloat16 inputs only
    exist when ml_dtypes is installed)."""
    import ml_dtypes

    return host.astype(ml_dtypes.bfloat16)


def host_bits(host):
    """A NumPy array as the device sees it: bfloat16 → its uint16 bits."""
    return host.view(np.uint16) if host.dtype.name == BFLOAT16 else host


def to_device(host, stream=0):
    """A contiguous NumPy array copied to a new Numba device array (noted for plans).

    NumPy calls an array C-contiguous whatever stride its size-1 axes carry (one element
    reversed, ``x[::-1]``, has a negative one); Numba sizes the device copy from the
    strides and would see an empty extent, so such an array is repacked first."""
    if host.strides != tuple(s * host.itemsize for s in c_strides(host.shape)):
        host = np.array(host, order="C", copy=True)
    return record.staged(cuda.to_device(host_bits(host), stream=stream), host)


def to_user(kind, buf, stream=0, dtype=None):
    """The user-kind result for a buffer made by :func:`empty` (NumPy: copied to the host,
    bfloat16 bits given back as ``ml_dtypes.bfloat16``)."""
    if kind != "numpy":
        return buf
    host = buf.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()  # copy_to_host on a stream is asynchronous
    return host.view(_bf16_numpy()) if dtype == BFLOAT16 else host


def _bf16_numpy():
    import ml_dtypes

    return ml_dtypes.bfloat16


def reshape(kind, buf, shape, order=None):
    """``buf`` (contiguous) reshaped, then its axes permuted by ``order`` (no copy)."""
    if kind in ("torch", "cupy", "numpy"):
        out = buf if tuple(buf.shape) == tuple(shape) else buf.reshape(shape)
        if not order:
            return out
        return out.permute(order) if kind == "torch" else out.transpose(order)
    out = buf.reshape(*shape) if shape else buf.reshape(1)[0:1].reshape(())
    if not order or list(order) == sorted(order):
        return out
    d = describe(out, "numba")  # Numba transposes only 2-D arrays: permute by strides
    return view_of(d, tuple(d.shape[i] for i in order), tuple(d.strides[i] for i in order))


def to_numpy(x):
    """Any array kind's values as a NumPy array (tests and the plans' self-check)."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        t = x.detach()
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).cpu().numpy()
    if mod.startswith("cupy"):
        import cupy

        return cupy.asnumpy(x)
    return x.copy_to_host()


def cast(x, like):
    """``x`` (a NumPy, CuPy or PyTorch array) in ``like``'s dtype — ``like`` an array of the
    same library, or a NumPy dtype — sharing ``x``'s memory where the dtype already is."""
    dtype = like if isinstance(like, (np.dtype, type, str)) else like.dtype
    if is_torch(x):
        import torch

        return x.to(dtype if isinstance(dtype, torch.dtype) else _torch_dtype(torch, dtype))
    return x.astype(dtype, copy=False)


def concatenate(parts, axis):
    """NumPy, CuPy or PyTorch arrays (all of one library) joined along ``axis``."""
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=axis)
    if type(parts[0]).__module__.startswith("cupy"):
        import cupy

        return cupy.concatenate(parts, axis=axis)
    return np.concatenate(parts, axis=axis)


# --- streams ------------------------------------------------------------------------------
_EXTERNAL = {}


def as_stream(stream):
    """A Numba stream from: None (the default stream), a Numba stream, a raw
    ``cudaStream_t`` handle (int), or a CuPy / PyTorch stream object."""
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
        return 0  # the legacy default stream
    if hasattr(stream, "handle") and hasattr(stream, "synchronize") and not hasattr(stream, "ptr"):
        return stream  # already a Numba stream
    handle = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError(f"stream must be a Numba/CuPy/PyTorch stream or an int handle, "
                        f"got {type(stream).__name__}")
    if handle == 0:
        return 0  # e.g. torch.cuda.current_stream() when nothing else was chosen
    if handle not in _EXTERNAL:
        _EXTERNAL[handle] = cuda.external_stream(handle)
    return _EXTERNAL[handle]


def stream_key(stream):
    """A hashable identity of a stream from :func:`as_stream`."""
    if not stream:
        return 0
    try:
        return int(stream)  # a Numba stream's int() is its handle
    except TypeError:
        return id(stream)  # the simulator's streams have none
