"""Host side: arrays in, the same kind of array out; validation; streams.

Kernels see one shape only: a 2-D device array of *rows* (rows, n), the reduced axis
last, possibly strided.  This module turns what a user hands in into that view, and
hands back the result as the kind of array that came in:

* NumPy ``ndarray``            → copied to the device once, result copied back (NumPy);
* CuPy, PyTorch CUDA tensors, Numba device arrays, anything with
  ``__cuda_array_interface__`` → a zero-copy view; result of the same kind, same device.

Any ``axis`` (negative too) and non-contiguous inputs are handled: the axis is moved
last *as a view*; only when the leading axes cannot be folded into one strided row axis
is a contiguous copy made.  Inputs are never written to.
"""

import math
import operator

import numpy as np
from numba import cuda

from ._sim import simulator_enabled as _is_simulator

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# --- what kind of array is this? ----------------------------------------------------------
def kind_of(x):
    """"numpy", "cupy", "torch" or "numba"; TypeError for anything else."""
    return _kind(x)


def _kind(x):
    mod = type(x).__module__.split(".")[0]
    if isinstance(x, np.ndarray):
        return "numpy"
    if mod == "torch":
        if not x.is_cuda:
            raise TypeError("PyTorch tensors must live on a CUDA device; got a CPU tensor "
                            "(use x.numpy() to pass it as NumPy, or x.cuda())")
        return "torch"
    if mod == "cupy":
        return "cupy"
    if hasattr(x, "__cuda_array_interface__") or type(x).__name__ == "FakeCUDAArray":
        return "numba"
    raise TypeError(
        f"expected a NumPy array or a CUDA array (CuPy, PyTorch, Numba), got {type(x).__name__}"
    )


def _dtype_of(x, kind):
    if kind == "torch":
        import torch

        names = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64"}
        return np.dtype(names[x.dtype]) if x.dtype in names else str(x.dtype).replace("torch.", "")
    return np.dtype(x.dtype)


def check_float(x, name="x", allowed=FLOAT_DTYPES):
    """Return (kind, dtype) of ``x``; TypeError naming the dtype if it is not allowed."""
    kind = _kind(x)
    dtype = _dtype_of(x, kind)
    if not isinstance(dtype, np.dtype) or dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{name} has dtype {dtype}; supported: {names}")
    return kind, dtype


def normalize_axis(axis, ndim):
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an integer, got {type(axis).__name__}") from None
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"axis {axis} is out of bounds for an array of {ndim} dimensions")
    return axis % max(ndim, 1)


# --- streams ------------------------------------------------------------------------------
_EXTERNAL = {}


def as_stream(stream):
    """A Numba stream from: None (the default stream), a Numba stream, a raw ``cudaStream_t``
    handle (int), or a CuPy / PyTorch stream object (``.ptr`` / ``.cuda_stream``)."""
    if stream is None or stream == 0:
        return 0  # the legacy default stream
    if hasattr(stream, "handle") and hasattr(stream, "synchronize") and not hasattr(stream, "ptr"):
        return stream  # already a Numba stream
    handle = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))
    if not isinstance(handle, int):
        raise TypeError(f"stream must be a Numba/CuPy/PyTorch stream or an int handle, "
                        f"got {type(stream).__name__}")
    if handle not in _EXTERNAL:
        _EXTERNAL[handle] = cuda.external_stream(handle)
    return _EXTERNAL[handle]


# --- rows views ---------------------------------------------------------------------------
def _cai(x, kind):
    if kind == "torch":
        return x.detach().__cuda_array_interface__
    return x.__cuda_array_interface__


def _device_view(x, kind, shape, strides_bytes):
    """A Numba device array over x's memory with the given shape and byte strides."""
    desc = dict(_cai(x, kind))
    desc.update(shape=tuple(shape), strides=tuple(strides_bytes), version=3)
    desc.pop("stream", None)  # ordering is the caller's stream's job (see docs: streams)
    return cuda.from_cuda_array_interface(desc, owner=x, sync=False)


def _fold_rows(shape, strides, axis):
    """Move ``axis`` last; fold the other axes into one row axis if their strides allow it.

    Returns (rows, n, row_stride, col_stride) in elements, or None when no single row
    stride exists (then the caller copies)."""
    n, col_stride = shape[axis], strides[axis]
    lead = [(s, st) for i, (s, st) in enumerate(zip(shape, strides)) if i != axis and s != 1]
    rows = math.prod(s for s, _ in lead)
    if not lead:
        return rows, n, n * col_stride if n else 1, col_stride
    for (s_outer, st_outer), (s_inner, st_inner) in zip(lead[:-1], lead[1:]):
        if st_outer != st_inner * s_inner:
            return None
    return rows, n, lead[-1][1], col_stride


class Rows:
    """An input seen as rows: ``.view`` is the (rows, n) device array the kernels read."""

    def __init__(self, x, axis, stream):
        self.kind, self.dtype = check_float(x)
        self.x, self.stream = x, stream
        self.shape = tuple(x.shape)
        self.axis = normalize_axis(axis, len(self.shape))
        if not self.shape:  # a 0-d array is a row of one value
            self.shape, self.axis = (1,), 0
        self.n = self.shape[self.axis] if self.shape else 1
        self.lead_shape = self.shape[: self.axis] + self.shape[self.axis + 1 :]
        self.rows = math.prod(self.lead_shape)
        self.view = self._make_view()

    def _make_view(self):
        x, kind = self.x, self.kind
        if self.rows == 0 or self.n == 0:
            return None
        if kind != "numpy" and not _is_simulator():
            itemsize = self.dtype.itemsize
            strides = _cai_strides(_cai(x, kind), self.shape, itemsize)
            folded = _fold_rows(self.shape, strides, self.axis)
            if folded is not None and min(folded[2:]) >= 0:
                rows, n, rs, cs = folded
                return _device_view(x, kind, (rows, n), (rs * itemsize, cs * itemsize))
            x = _contiguous_rows(x, kind, self.axis)  # the rare slow path: one device copy
            if kind != "numba":
                return _device_view(x, kind, (self.rows, self.n), (self.n * itemsize, itemsize))
        host = np.asarray(x.copy_to_host() if kind == "numba" else x).reshape(self.shape)
        host = np.ascontiguousarray(np.moveaxis(host, self.axis, -1)).reshape(self.rows, self.n)
        return cuda.to_device(host, stream=self.stream)

    # -- results --------------------------------------------------------------------------
    def empty_like_rows(self, n_out, dtype=None):
        """A contiguous (rows, n_out) result buffer: device array + the user-kind twin."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        shape = (self.rows, n_out)
        if self.kind == "cupy":
            import cupy

            with cupy.cuda.Device(self.x.device.id):
                buf = cupy.empty(shape, dtype=dtype)
        elif self.kind == "torch":
            import torch

            buf = torch.empty(shape, dtype=getattr(torch, dtype.name), device=self.x.device)
        else:
            buf = cuda.device_array(shape, dtype=dtype, stream=self.stream)
            return buf, buf
        return _device_view(buf, self.kind, shape, (n_out * dtype.itemsize, dtype.itemsize)), buf

    def finish(self, buf, keep_axis=True):
        """Give the (rows, n) or (rows,) result back in the user's kind and layout."""
        if keep_axis:
            moved = self.lead_shape + (self.n,)
            order = list(range(len(moved) - 1))
            order.insert(self.axis, len(moved) - 1)
        else:
            moved, order = self.lead_shape, list(range(len(self.lead_shape)))
        if self.kind == "numpy":
            host = buf.copy_to_host(stream=self.stream) if hasattr(buf, "copy_to_host") else buf
            if hasattr(buf, "copy_to_host") and self.stream:
                self.stream.synchronize()  # copy_to_host on a stream is asynchronous
            return np.transpose(np.asarray(host).reshape(moved), order)
        if self.kind == "cupy":
            return buf.reshape(moved).transpose(order)
        if self.kind == "torch":
            return buf.reshape(moved).permute(order)
        out = buf.reshape(*moved) if moved else buf.reshape(1)[0:1].reshape(())
        return _numba_permuted(out, order)


def _cai_strides(desc, shape, itemsize):
    """Element strides from a CUDA-array-interface description (None = C order)."""
    if desc.get("strides") is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        return tuple(reversed(strides))
    return tuple(s // itemsize for s in desc["strides"])


def _contiguous_rows(x, kind, axis):
    """A contiguous copy with ``axis`` last, made by the array's own library."""
    if kind == "cupy":
        import cupy

        return cupy.ascontiguousarray(cupy.moveaxis(x, axis, -1))
    if kind == "torch":
        return x.detach().movedim(axis, -1).contiguous()
    return x  # Numba arrays: the caller goes through the host (no N-d device copy in Numba)


def _numba_permuted(arr, order):
    """A Numba device array viewed with its axes permuted (no copy)."""
    if order == sorted(order) or arr.ndim < 2:
        return arr
    if _is_simulator():
        host = np.transpose(arr.copy_to_host(), order)
        return cuda.to_device(np.ascontiguousarray(host))
    desc = dict(arr.__cuda_array_interface__)
    strides = _cai_strides(desc, arr.shape, arr.dtype.itemsize)
    desc.update(
        shape=tuple(arr.shape[i] for i in order),
        strides=tuple(strides[i] * arr.dtype.itemsize for i in order),
    )
    desc.pop("stream", None)
    return cuda.from_cuda_array_interface(desc, owner=arr, sync=False)


# --- results that need no kernel, and out= ------------------------------------------------
def _full(kind, like, shape, value, dtype):
    if kind == "cupy":
        import cupy

        return cupy.full(shape, value, dtype=dtype)
    if kind == "torch":
        import torch

        return torch.full(shape, value, dtype=getattr(torch, dtype.name), device=like.device)
    host = np.full(shape, value, dtype=dtype)
    return host if kind == "numpy" else cuda.to_device(host)


def result_shape(rows, keep_axis):
    return tuple(rows.x.shape) if keep_axis else rows.lead_shape


def empty_result(rows, keep_axis, target):
    """An empty axis (or no rows): softmax → an empty array, logsumexp → −inf per row."""
    result = _full(rows.kind, rows.x, result_shape(rows, keep_axis), -np.inf, rows.dtype)
    return target.fill(result) if target is not None else result


def _extent(desc, shape, itemsize):
    """[first byte, last byte] a CUDA array touches (for overlap checks)."""
    start = desc["data"][0]
    strides = _cai_strides(desc, shape, itemsize)
    span = sum((s - 1) * st for s, st in zip(shape, strides)) * itemsize if all(shape) else -1
    return start, start + span + itemsize - 1


class Out:
    """A user's ``out=``: checked before any kernel runs, then written or filled."""

    def __init__(self, out, rows, keep_axis):
        kind, dtype = _kind(out), None
        if kind != rows.kind:
            raise TypeError(f"out must be the same kind of array as the input ({rows.kind}), got {kind}")
        dtype = _dtype_of(out, kind)
        if dtype != rows.dtype:
            raise TypeError(f"out has dtype {dtype}; the result has dtype {rows.dtype}")
        shape = result_shape(rows, keep_axis)
        if tuple(out.shape) != shape:
            raise ValueError(f"out has shape {tuple(out.shape)}; the result has shape {shape}")
        self.out, self.rows, self.keep_axis = out, rows, keep_axis
        self.direct = None
        if kind != "numpy" and not _is_simulator() and rows.rows and rows.n:
            self.direct = self._direct_view()
        if kind == "numba" and self.direct is None and not out.is_c_contiguous():
            # the result would have to be copied in, and Numba copies only contiguous arrays
            raise ValueError("out: a strided Numba device array is written only when its axes "
                             "fold into rows the kernels can address; pass a contiguous array")

    def _direct_view(self):
        """A (rows, n) — or (rows, 1) — view of ``out`` the kernels can write, or None."""
        rows, out = self.rows, self.out
        itemsize = rows.dtype.itemsize
        desc = _cai(out, rows.kind)
        strides = _cai_strides(desc, tuple(out.shape), itemsize)
        if self.keep_axis:
            folded = _fold_rows(tuple(out.shape), strides, rows.axis)
        else:  # logsumexp: the rows are out's elements, one column
            folded = _fold_rows(tuple(out.shape) + (1,), strides + (1,), len(out.shape))
        self._check_alias(desc, strides)
        if folded is None or min(folded[2:]) < 0:
            return None  # a copy is filled in afterwards (Numba arrays: refused in __init__)
        n_rows, n, rs, cs = folded
        return _device_view(out, rows.kind, (n_rows, n), (rs * itemsize, cs * itemsize))

    def _check_alias(self, desc, strides):
        rows = self.rows
        if rows.kind == "numpy":
            return
        x_desc = _cai(rows.x, rows.kind)
        a = _extent(x_desc, rows.shape, rows.dtype.itemsize)
        b = _extent(desc, tuple(self.out.shape), rows.dtype.itemsize)
        if a[1] < b[0] or b[1] < a[0]:
            return  # disjoint
        same = (self.keep_axis and x_desc["data"][0] == desc["data"][0]
                and _cai_strides(x_desc, rows.shape, rows.dtype.itemsize) == strides)
        if not same:
            raise ValueError("out overlaps the input without being the input itself; "
                             "pass out=x for in place, or a separate array")

    def rows_buffer(self):
        return (self.direct, self.out) if self.direct is not None else (None, None)

    def fill(self, result):
        if result is self.out:
            return self.out
        kind = self.rows.kind
        if kind == "numpy":
            np.copyto(self.out, result)
        elif kind == "torch":
            self.out.copy_(result)
        elif kind == "cupy":
            self.out[...] = result
        else:
            self.out.copy_to_device(np.ascontiguousarray(result.copy_to_host()))
        return self.out
