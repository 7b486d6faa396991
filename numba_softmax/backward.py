"""The public backward API: the gradients of softmax, log_softmax and attention.

Each call: validate (:mod:`.checks`) → views (the (rows, n) or (B, H, S, D) device
arrays the kernels read, built by :mod:`.arrays`) → kernel launch → give back, as the
kind of array that came in (NumPy in → NumPy out; CuPy, PyTorch CUDA tensors and Numba
device arrays → the same kind, on the same device).
Inputs are never written.
"""

import math

import numpy as np

from . import checks, plans
from .arrays import heads, kinds, ops
from .arrays.rows import Finish, Out, Rows, check_alias
from .attention import hopper_backward, hopper_setting
from .kernels.backward import attention_backward as _attention_kernel
from .kernels.backward import attention_backward_tc_launch as _tensor_cores
from .kernels.backward import hopper_backward_ws as _hopper
from .kernels.backward import softmax_backward_launch as _rows_kernel
from .kernels.rows.epilogue import LOG_SOFTMAX, SOFTMAX

__all__ = ["softmax_backward", "log_softmax_backward", "attention_backward"]


def _rows_backward(mode, dy, y, axis, out, stream):
    stream = ops.as_stream(stream)
    plan_key, plan, ptrs = plans.lookup(("rows_backward", mode, axis), (dy, y, out), stream)
    if plan is not None:
        return plan((dy, y, out), stream, ptrs)
    seen = plans.seen(plan_key, ptrs, 3)  # what the look-up read: each array described once
    g_rows, y_rows = Rows(dy, axis, "dy", facts=seen[0]), Rows(y, axis, "y", facts=seen[1])
    if y_rows.kind != g_rows.kind:
        raise TypeError(f"dy and y must be the same kind of array, got {g_rows.kind} and {y_rows.kind}")
    if g_rows.dtype != y_rows.dtype:
        raise TypeError(f"dy and y must have one dtype, got {g_rows.dtype} and {y_rows.dtype}")
    if g_rows.d.shape != y_rows.d.shape:
        raise ValueError(f"dy {g_rows.d.shape} and y {y_rows.d.shape} must have one shape")
    target = None
    if out is not None:  # out may be dy or y itself (in place), or apart from both
        target = Out(out, g_rows, g_rows.d.shape, facts=seen[2])
        check_alias(y_rows.d, target.d)
    finish = Finish(g_rows, True)
    if g_rows.empty:
        result = ops.full(g_rows.kind, g_rows.d.shape, 0.0, g_rows.dtype, like=dy)
        return target.fill(result, stream) if target is not None else result

    described = (g_rows.d, y_rows.d, target.d if target is not None else None)
    with plans.Recorder(plan_key, (dy, y, out), stream, described) as rec:
        g_view, y_view = g_rows.view(stream), y_rows.view(stream)
        dx = target.rows_view(g_rows.rows, g_rows.n, g_rows.axis) if target else None
        buf = None
        if dx is None:
            buf, dx = ops.empty(g_rows.kind, (g_rows.rows, g_rows.n), g_rows.dtype, like=dy,
                                stream=stream)
        _rows_kernel.launch(mode, g_view, y_view, dx, stream=stream)
        if target is None:
            return rec.done(finish, buf)
        if buf is not None:
            target.fill(finish(buf, stream=stream), stream)
        return rec.done(_the_out, out=out)


def _the_out(out=None, stream=0):
    return out


def softmax_backward(dy, y, axis=-1, *, out=None, stream=None):
    """The gradient of softmax: dx = y ∘ (dy − Σ y∘dy) along ``axis``.

    float16, float32 or float64 (float16 accumulated in float32); NumPy, or CUDA arrays of
    one kind.  One read of y and dy and one write of dx when a row fits on chip
    (:mod:`numba_softmax.kernels.backward.softmax_backward`).

    Parameters
    ----------
    dy : array
        dL/dy, the gradient of a loss with respect to the softmax output.
    y : array
        The softmax output itself (what the forward returned), the same shape and dtype.
    axis, out, stream
        As for :func:`numba_softmax.softmax`; ``out`` may be ``dy`` or ``y`` (in place).

    Returns
    -------
    dx, the same kind, shape and dtype as ``dy``.
    """
    return _rows_backward(SOFTMAX, dy, y, axis, out, stream)


def log_softmax_backward(dy, y, axis=-1, *, out=None, stream=None):
    """The gradient of log_softmax: dx = dy − exp(y) ∘ Σ dy along ``axis``, with ``y`` the
    log_softmax output.  Arguments as :func:`softmax_backward`."""
    return _rows_backward(LOG_SOFTMAX, dy, y, axis, out, stream)


def attention_backward(do, q, k, v, o, lse, *, causal=False, window=(-1, -1), scale=None,
                       softcap=None, alibi_slopes=None, stream=None):
    """The gradients (dQ, dK, dV) of O = attention(Q, K, V), FlashAttention-2 style.

    P is rebuilt tile by tile from the forward's LSE, P = exp(scale·QKᵀ − LSE), and
    dS = P ∘ (dP − D) with D = rowsum(dO ∘ O) (:mod:`numba_softmax.kernels.backward.attention_backward`).
    On an sm_90 GPU, float16/bfloat16 with D and Dv 64 or 128 and no soft-capping or ALiBi
    run on the wgmma backward (:mod:`numba_softmax.kernels.backward.hopper_backward_ws`)
    wherever tensor maps describe do, q, k, v as they lie (a model's transposed views
    do); ``NUMBA_SOFTMAX_HOPPER=off`` keeps ``mma.sync``, as for the forward.

    Parameters
    ----------
    do : array (..., Hq, Sq, Dv)
        dL/dO.
    q, k, v : arrays (..., Hq, Sq, D), (..., Hkv, Sk, D), (..., Hkv, Sk, Dv)
        The forward's inputs; Hq a multiple of Hkv (grouped-query attention: dK, dV sum
        over each group of query heads).  1 <= D, Dv <= 128.
    o, lse : arrays (..., Hq, Sq, Dv) and (..., Hq, Sq)
        The forward's output and log-sum-exp (``attention(..., return_lse=True)``).  A row
        with LSE = −inf saw no key: its gradients are 0.
    causal, window, scale
        As in the forward: query i sees key j iff −left <= j − (i + Sk − Sq) <= right for
        ``window=(left, right)`` (−1: unbounded), and ``causal`` adds right <= 0.
    softcap, alibi_slopes
        As in the forward (:func:`numba_softmax.attention`), and the same values it was
        given: with s = scale·q·k, the score is x = softcap·tanh(s / softcap) (softcap > 0)
        minus slope·abs(i + Sk − Sq − j) (ALiBi), P = exp(x − LSE), and dS is taken with
        respect to s: times dx/ds = 1 − tanh²(s / softcap) (ALiBi adds a constant; the
        slopes get no gradient).  NumPy twin:
        :func:`numba_softmax.reference.attention_backward`.
    stream
        As for :func:`numba_softmax.softmax`.

    All arrays of one kind; do, q, k, v, o of one dtype (float16, bfloat16, float32 or
    float64; float16 and bfloat16 on tensor cores, accumulated in float32), lse any float.  Returns (dq, dk, dv) in the dtype
    and kind of q.  dQ is accumulated with atomic adds, its last bits possibly differing
    from run to run — except on the wgmma backward, which writes each row of dQ once.
    """
    stream = ops.as_stream(stream)
    plan_key, plan, ptrs = None, None, None  # slopes are read on the host each call: no plan
    if alibi_slopes is None:
        # the Hopper setting is in the key: a plan recorded under one is not replayed under another
        plan_key, plan, ptrs = plans.lookup(("attention_backward", causal, window, scale, softcap,
                                             hopper_setting()), (do, q, k, v, o, lse, None), stream)
    if plan is not None:
        return plan((do, q, k, v, o, lse, None), stream, ptrs)
    seen = plans.seen(plan_key, ptrs, 6)  # what the look-up read: each array described once
    ds = checks.attention_grads(do, q, k, v, o, lse, seen)
    causal = checks.flag(causal, "causal")
    window = checks.window(window)
    softcap = checks.softcap(softcap)
    slopes = checks.alibi_slopes(alibi_slopes, ds["q"].shape[:-2])
    dq_, kind, dtype = ds["q"], ds["q"].kind, ds["q"].dtype
    *lead, sq, d = dq_.shape
    sk, dv = ds["k"].shape[-2], ds["v"].shape[-1]
    if not (1 <= d <= _attention_kernel.MAX_HEAD_DIM and 1 <= dv <= _attention_kernel.MAX_HEAD_DIM):
        raise ValueError(f"head dimensions must be between 1 and {_attention_kernel.MAX_HEAD_DIM}, "
                         f"got D={d} (q, k) and Dv={dv} (v)")
    scale = checks.scale(scale, d)
    shapes = (dq_.shape, ds["k"].shape, ds["v"].shape)
    if math.prod(lead) * sq * sk == 0:  # no query, or no key: every gradient is 0
        return tuple(ops.full(kind, s, 0.0, dtype, like=q) for s in shapes)

    described = tuple(ds[n] for n in ("do", "q", "k", "v", "o", "lse")) + (None,)
    with plans.Recorder(plan_key, (do, q, k, v, o, lse, None), stream, described) as rec:
        do4, q4, k4, v4, o4 = (heads.view(ds[n], 2, stream) for n in ("do", "q", "k", "v", "o"))
        lse3 = heads.view(ds["lse"], 1, stream)
        outs = [heads.output(kind, s, dtype, q, 2, stream) for s in shapes]
        alibi = None if slopes is None else ops.to_device(slopes, stream)
        kernel = _backward_kernel(dtype, scale)
        if kernel is _tensor_cores and hopper_backward(d, dv, softcap, slopes, (do4, q4, k4, v4)):
            _hopper.launch(do4, q4, k4, v4, o4, lse3, *(dev for _, dev in outs), causal=causal,
                           window=window, scale=scale, stream=stream)
        else:
            kernel.launch(do4, q4, k4, v4, o4, lse3, *(dev for _, dev in outs), causal=causal,
                          window=window, scale=scale, stream=stream,
                          small=plans.simulator_enabled(), softcap=softcap, alibi=alibi)
        return rec.done(_Grads(kind, dtype), *(buf for buf, _ in outs))


def _backward_kernel(dtype, scale):
    """float16 / bfloat16 on tensor cores (:mod:`.kernels.backward.attention_backward_tc`); float32,
    float64 and a zero ``scale`` on CUDA cores (:mod:`.kernels.backward.attention_backward`): the
    tensor-core kernel masks a score by making scale·s = −inf, which a zero scale cannot
    (as the forward, :func:`numba_softmax.attention`, does for the same reason)."""
    half = dtype in (np.dtype(np.float16), kinds.BFLOAT16)
    return _tensor_cores if half and scale != 0 else _attention_kernel


class _Grads:
    """(dq, dk, dv) in the user's kind from the three new buffers."""

    def __init__(self, kind, dtype):
        self.kind, self.dtype = kind, dtype

    def __call__(self, dq, dk, dv, out=None, stream=0):
        return tuple(ops.to_user(self.kind, b, stream, self.dtype) for b in (dq, dk, dv))
