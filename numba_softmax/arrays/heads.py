"""Attention's arrays: any (..., S, D) array seen as (B, H, S, D), and results given back.

The head axis H is the axis before S (GQA: K and V may have fewer heads than Q), B is
every axis before it folded into one.  A CUDA array whose batch axes fold into one stride
is read in place — any strides of H, S and D, a head axis of stride 0 (``expand``) too;
otherwise (or with a negative stride) it is copied once on the device.  Kernels that need
unit stride on the last axis ask for it (``unit_last``).
"""

import math

import numpy as np

from ..runtime import launcher
from . import kinds, layout, ops

F32 = np.dtype(np.float32)


def view(d, tail, stream=0, unit_last=False, copy=False):
    """The (B, H, last ``tail`` axes) device view of the described array ``d``; ``copy``:
    a C-contiguous copy of a device array, whatever its strides."""
    shape4 = layout.heads_shape(d.shape, tail)
    if d.on_host:
        host = np.ascontiguousarray(d.obj).reshape(shape4)
        return ops.to_device(host, stream)
    strides = layout.fold_heads(d.shape, d.strides, tail)
    if strides is not None and not copy and (not unit_last or strides[-1] == 1 or shape4[-1] == 1):
        return kinds.view_of(d, shape4, strides)
    buf, dev = ops.empty(d.kind, d.shape, d.dtype, like=d.obj, stream=stream)
    layout.device_copy(d, d.shape, d.strides, kinds.describe(buf), kinds.c_strides(d.shape), stream)
    return dev.reshape(*shape4) if math.prod(shape4) else dev


def output(kind, shape, dtype, like, tail, stream=0):
    """A new contiguous result of ``kind``: (user array, its (B, H, tail…) device view)."""
    buf, dev = ops.empty(kind, shape, dtype, like=like, stream=stream)
    shape4 = layout.heads_shape(tuple(shape), tail)
    if dev is None:
        return buf, None
    return buf, dev.reshape(*shape4)


def out_view(d, tail):
    """A (B, H, tail…) view of a user's ``out=`` the kernels may write, or None (then the
    result is written to a buffer and copied in)."""
    if d.on_host or layout.overlaps_itself(d.shape, d.strides):
        return None
    strides = layout.fold_heads(d.shape, d.strides, tail)
    if strides is None:
        return None
    return kinds.view_of(d, layout.heads_shape(d.shape, tail), strides)


def lse_output(kind, shape, like, return_lse, stream):
    """LSE's (buffers to hand back, (B, H, S) device view): a new array when the caller
    asked for it, else per-stream scratch that outlives the call — the kernels write LSE
    either way, and a new array (a PyTorch allocation above all) is a large part of the
    host time of a call that does not want it."""
    if return_lse:
        buf, dev = output(kind, shape, F32, like, 1, stream)
        return (buf,), dev
    return (), launcher.scratch(layout.heads_shape(tuple(shape), 1), F32, stream, "attention lse")


class Result:
    """The result of an attention call without ``out=``: O (and LSE, when its buffer is
    given) in the user's kind.  Holds only the kind and dtype, so a launch plan keeps it."""

    def __init__(self, kind, dtype):
        self.kind, self.dtype = kind, dtype

    def __call__(self, o_buf, *lse_buf, out=None, stream=0):
        o = ops.to_user(self.kind, o_buf, stream, self.dtype)
        return (o, ops.to_user(self.kind, lse_buf[0], stream)) if lse_buf else o


class LseOnly:
    """The result of an attention call with ``out=``: ``out`` (already written), and LSE
    when its buffer is given."""

    def __init__(self, kind):
        self.kind = kind

    def __call__(self, *lse_buf, out=None, stream=0):
        return (out, ops.to_user(self.kind, lse_buf[0], stream)) if lse_buf else out
