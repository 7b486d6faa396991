"""Layouts: which strided views a kernel can read in place, and the copy when it cannot.

Pure stride arithmetic (element strides, no library calls), unit-tested on the host:

* :func:`fold_rows` — an N-d array reduced along ``axis`` as a (rows, n) array with one
  row stride and one column stride, or ``None`` when the other axes do not fold into
  one stride (or a stride is negative);
* :func:`fold_heads` — an (..., S, D) array as (B, H, S, D), H the axis before S;
* :func:`overlaps_itself` — whether two different indices reach one element (a zero
  stride, or interleaved axes): such an array may be read, never written;
* :func:`device_copy` — the fallback when a fold fails: the strided copy kernel of
  :mod:`numba_softmax.runtime.copy`, on the device, for every array kind.
"""

from ..runtime import copy as _copy
from . import kinds


def _merge(dims):
    """One (size, stride) for axes that fold into a single strided axis, else None."""
    dims = [(n, st) for n, st in dims if n != 1]
    for (_, st_outer), (n_inner, st_inner) in zip(dims[:-1], dims[1:]):
        if st_outer != st_inner * n_inner:
            return None
    size = 1
    for n, _ in dims:
        size *= n
    return size, (dims[-1][1] if dims else 0)


def fold_rows(shape, strides, axis):
    """(rows, n, row_stride, col_stride) of ``shape``/``strides`` reduced along ``axis``,
    or None when no single row stride exists or a stride is negative."""
    n, col = shape[axis], strides[axis]
    lead = [(s, st) for i, (s, st) in enumerate(zip(shape, strides)) if i != axis]
    merged = _merge(lead)
    if merged is None:
        return None
    rows, row = merged
    if rows <= 1:
        row = n * col if n > 1 else 1  # one row: any stride will do; keep it plausible
    if n <= 1:
        col = 1
    if row < 0 or col < 0:
        return None
    return rows, n, row, col


def heads_shape(shape, tail):
    """(B, H, then the tail axes) for an array whose last ``tail`` axes are kept: H is the axis
    before them (1 if there is none), B the product of the axes before H."""
    lead = shape[: len(shape) - tail]
    h = lead[-1] if lead else 1
    b = 1
    for s in lead[:-1]:
        b *= s
    return (b, h) + tuple(shape[len(shape) - tail:])


def fold_heads(shape, strides, tail):
    """Element strides of ``shape`` seen as (B, H, tail…) (:func:`heads_shape`), or None
    when the batch axes do not fold into one stride or a stride is negative."""
    lead = len(shape) - tail
    b_axes = [(shape[i], strides[i]) for i in range(max(lead - 1, 0))]
    merged = _merge(b_axes)
    if merged is None:
        return None
    sb = merged[1]
    sh = strides[lead - 1] if lead >= 1 else 0
    out = (sb, sh) + tuple(strides[lead:])
    return out if min(out) >= 0 else None


def overlaps_itself(shape, strides):
    """True when two different indices reach the same element (zero strides, axes that
    interleave): writing such an array would race with itself."""
    if 0 in shape:
        return False  # no elements at all
    dims = sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1)
    reach = 0  # the furthest element reached by the axes so far, in elements
    for st, n in dims:
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def _flat(d, shape, strides, offset=0):
    """A flat 1-D view of ``d``'s memory from its lowest touched address, and the offset
    of element [0, …] in it."""
    lo = hi = 0
    for n, st in zip(shape, strides):
        if n > 1:
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
    base = kinds.view(d.obj, d.ptr + (offset + lo) * d.itemsize, (hi - lo + 1,), (1,), d.dtype)
    return base, -lo


def device_copy(src, src_shape, src_strides, dst, dst_strides, stream=0, src_offset=0):
    """Copy ``src`` (a :class:`kinds.Described`, seen with ``src_shape``/``src_strides``
    from ``src_offset``) into ``dst`` (Described, same shape, ``dst_strides``)."""
    if not all(src_shape):
        return
    s_flat, s_off = _flat(src, src_shape, src_strides, src_offset)
    d_flat, d_off = _flat(dst, src_shape, dst_strides)
    _copy.launch(s_flat, s_off, tuple(src_strides), d_flat, d_off, tuple(dst_strides),
                 tuple(src_shape), stream=stream)
