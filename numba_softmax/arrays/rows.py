"""Reductions along one axis: any array seen as (rows, n), and its result given back.

Kernels see one shape only: a 2-D device array of *rows*, the reduced axis last, possibly
strided.  :class:`Rows` turns a user's array into that view (zero-copy when the other
axes fold into one row stride, else one device copy); :class:`Out` checks a user's
``out=`` and gives the kernels a view of it to write in place (or a buffer copied into it
afterwards); :class:`Finish` turns the kernels' contiguous result back into the user's
kind, shape and axis order.  Nothing here looks at an array library: :mod:`.kinds` and
:mod:`.ops` do.
"""

import math
import operator

import numpy as np

from . import kinds, layout, ops


def normalize_axis(axis, ndim, name="axis"):
    """``axis`` as a non-negative int (a 0-d array takes axis 0 or −1)."""
    if isinstance(axis, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(axis).__name__}") from None
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{name} {axis} is out of bounds for an array of {ndim} dimensions")
    return axis % max(ndim, 1)


def check_dtype(d, name, allowed=kinds.FLOATS):
    if d.dtype not in allowed:
        names = ", ".join(str(a) for a in allowed)
        raise TypeError(f"{name} has dtype {d.dtype}; supported: {names}")


class Rows:
    """A user's array reduced along ``axis``: validated now, viewed by :meth:`view`.

    ``.view()`` is the (rows, n) device array the kernels read (built after every
    argument of the call has been checked, so a bad argument never costs a copy).
    ``facts``: what a launch plan's look-up read of ``x`` (:func:`.kinds.describe`)."""

    def __init__(self, x, axis, name="x", allowed=kinds.FLOATS, facts=None):
        try:
            self.d = d = kinds.describe(x, facts=facts)
        except TypeError as e:  # not an array: say which argument
            raise TypeError(f"{name}: {e}") from None
        check_dtype(d, name, allowed)
        self.kind, self.dtype, self.name = d.kind, d.dtype, name
        self.axis = normalize_axis(axis, d.ndim)
        self.shape = d.shape or (1,)  # a 0-d array is one row of one value
        self.strides = d.strides or (1,)
        self.n = self.shape[self.axis]
        self.lead_shape = self.shape[: self.axis] + self.shape[self.axis + 1:]
        self.rows = math.prod(self.lead_shape)

    @property
    def empty(self):
        return self.rows == 0 or self.n == 0

    def moved(self):
        """Element strides with ``axis`` moved last (the order of the rows view)."""
        st = self.strides
        return st[: self.axis] + st[self.axis + 1:] + (st[self.axis],)

    def view(self, stream=0):
        """The (rows, n) device array over the input (zero-copy when it folds)."""
        d = self.d
        if self.kind == "numpy":  # one copy to the device, axis last, contiguous
            host = np.ascontiguousarray(np.moveaxis(d.obj.reshape(self.shape), self.axis, -1))
            return ops.to_device(host.reshape(self.rows, self.n), stream)
        folded = layout.fold_rows(self.shape, self.strides, self.axis)
        if folded is not None:
            rows, n, rs, cs = folded
            return kinds.view_of(d, (rows, n), (rs, cs))
        buf, dev = ops.empty(self.kind, (self.rows, self.n), self.dtype, like=d.obj, stream=stream)
        layout.device_copy(d, self.lead_shape + (self.n,), self.moved(),
                           kinds.describe(buf), kinds.c_strides(self.lead_shape + (self.n,)),
                           stream)
        return dev


class Out:
    """A user's ``out=``: checked before anything runs (kind, dtype, shape, aliasing),
    then written in place when it can be viewed as rows, else filled by a copy."""

    def __init__(self, out, rows, shape, dtype=None, allow_in_place=True, facts=None):
        dtype = rows.dtype if dtype is None else dtype
        kind = kinds.kind_of(out)
        if kind != rows.kind:
            raise TypeError(f"out must be the same kind of array as {rows.name} ({rows.kind}), "
                            f"got {kind}")
        self.d = d = kinds.describe(out, kind, facts)
        if d.dtype != dtype:
            raise TypeError(f"out has dtype {d.dtype}; the result has dtype {dtype}")
        if tuple(d.shape) != tuple(shape):
            raise ValueError(f"out has shape {tuple(d.shape)}; the result has shape {tuple(shape)}")
        if kind != "numpy":
            if layout.overlaps_itself(d.shape, d.strides):
                raise ValueError("out has elements that share memory (a zero or interleaved "
                                 "stride); it cannot be written")
            check_alias(rows.d, d, allow_in_place)
        self.out, self.kind = out, kind

    def rows_view(self, n_rows, n, axis):
        """A (rows, n) device view of ``out`` the kernels can write, or None (then the
        result goes to a buffer and :meth:`fill` copies it in).  ``axis``: the axis of
        ``out`` that holds the n values (None: one value per row, logsumexp)."""
        d = self.d
        if self.kind == "numpy" or not n_rows:
            return None
        shape, strides = d.shape or (1,), d.strides or (1,)
        if axis is None:
            shape, strides, axis = shape + (1,), strides + (1,), len(shape)
        folded = layout.fold_rows(shape, strides, axis)
        if folded is None:
            return None
        r, m, rs, cs = folded
        return kinds.view_of(d, (r, m), (rs, cs))

    def fill(self, result, stream=0):
        """Copy a finished result (same kind and shape) into ``out``; returns ``out``."""
        if result is self.out:
            return self.out
        if self.kind == "numpy":
            np.copyto(self.out, result)
            return self.out
        src = kinds.describe(result, self.kind)
        layout.device_copy(src, src.shape, src.strides, self.d, self.d.strides, stream)
        return self.out


def check_alias(src, dst, allow_in_place=True):
    """ValueError when ``dst`` overlaps ``src`` without being ``src`` itself (same memory,
    same layout: in place, allowed when ``allow_in_place``)."""
    if src.kind == "numpy":
        return  # NumPy inputs are copied to the device first
    a, b = src.extent(), dst.extent()
    if a[1] < b[0] or b[1] < a[0]:
        return
    same = src.ptr == dst.ptr and src.shape == dst.shape and src.strides == dst.strides
    if not (same and allow_in_place):
        raise ValueError("out overlaps an input without being that input itself; pass the "
                         "input for in place (where allowed) or a separate array")


class Finish:
    """The kernels' contiguous (rows, n_out) result → the user's kind, shape and axes.

    Holds only the layout (never an array), so a launch plan can keep it."""

    def __init__(self, rows, keep_axis, n_out=None, dtype=None):
        self.kind, self.dtype = rows.kind, rows.dtype if dtype is None else dtype
        n_out = rows.n if n_out is None else n_out
        lead = rows.lead_shape
        if keep_axis:
            self.moved = lead + (n_out,)
            order = list(range(len(lead)))
            order.insert(rows.axis, len(lead))
            self.order = None if order == sorted(order) else tuple(order)
        else:
            self.moved, self.order = lead, None
        if rows.d.ndim == 0:
            self.moved, self.order = (), None  # 0-d in, 0-d out (torch/NumPy shapes)

    def __call__(self, buf, out=None, stream=0):
        host = ops.to_user(self.kind, buf, stream, self.dtype)
        if self.order is None and tuple(host.shape) == self.moved:
            return host  # already the user's shape (the common case: a plan replay's µs)
        return ops.reshape(self.kind, host, self.moved, self.order)
