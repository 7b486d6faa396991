"""The public backward API: the gradients of softmax, log_softmax and attention.

Each call: validate → views (the (rows, n) or (B, H, S, D) device arrays the kernels read,
built by :mod:`._arrays` and the helpers of ``numba_softmax/attention.py``) → kernel
launch → give back, as the kind of array that came in (NumPy in → NumPy out; CuPy,
PyTorch CUDA tensors and Numba device arrays → the same kind, on the same device).
Inputs are never written.
"""

import math
import operator

from . import _arrays
from .attention import (_buffer_heads, _check_same_kind, _empty, _give_back, _heads,
                        _split_point)
from .kernels import attention_backward as _attention_kernel
from .kernels import softmax_backward as _rows_kernel
from .kernels.epilogue import LOG_SOFTMAX, SOFTMAX

__all__ = ["softmax_backward", "log_softmax_backward", "attention_backward"]


def _rows_backward(mode, dy, y, axis, out, stream):
    # validate
    kinds = _check_same_kind({"dy": (dy, _arrays.FLOAT_DTYPES), "y": (y, _arrays.FLOAT_DTYPES)})
    dtype, dtype_y = kinds["dy"][1], kinds["y"][1]
    if dtype != dtype_y:
        raise TypeError(f"dy and y must have one dtype, got {dtype} and {dtype_y}")
    if tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"dy {tuple(dy.shape)} and y {tuple(y.shape)} must have one shape")
    stream = _arrays.as_stream(stream)
    # views: both as (rows, n), out= checked (and alias-checked against both) before any launch
    g_rows, y_rows = _arrays.Rows(dy, axis, stream), _arrays.Rows(y, axis, stream)
    target = None
    if out is not None:
        target = _arrays.Out(out, g_rows, True)
        _arrays.Out(out, y_rows, True)  # out may be y itself, or apart from it
    if g_rows.view is None:
        return _arrays.empty_result(g_rows, True, target)
    dx_dev, dx_user = target.rows_buffer() if target is not None else (None, None)
    direct = dx_dev is not None
    if not direct:
        dx_dev, dx_user = g_rows.empty_like_rows(g_rows.n)
    # launch
    _rows_kernel.launch(mode, g_rows.view, y_rows.view, dx_dev, stream=stream)
    # give back
    if direct:
        return target.out
    result = g_rows.finish(dx_user)
    return target.fill(result) if target is not None else result


def softmax_backward(dy, y, axis=-1, *, out=None, stream=None):
    """The gradient of softmax: dx = y ∘ (dy − Σ y∘dy) along ``axis``.

    float16, float32 or float64 (float16 accumulated in float32); NumPy, or CUDA arrays of
    one kind.  One read of y and dy and one write of dx when a row fits on chip
    (:mod:`numba_softmax.kernels.softmax_backward`).

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


def _check_attention(do, q, k, v, o, lse, window):
    float_ = _arrays.FLOAT_DTYPES
    kinds = _check_same_kind({"do": (do, float_), "q": (q, float_), "k": (k, float_),
                                    "v": (v, float_), "o": (o, float_), "lse": (lse, float_)})
    kind, dtype = kinds["q"]
    odd = [name for name in ("do", "k", "v", "o") if kinds[name][1] != dtype]
    if odd:
        raise TypeError(f"do, q, k, v and o must have one dtype; q has {dtype}, "
                        + ", ".join(f"{n} {kinds[n][1]}" for n in odd))
    shapes = {n: tuple(x.shape) for n, x in (("do", do), ("q", q), ("k", k), ("v", v), ("o", o))}
    qs, ks, vs = shapes["q"], shapes["k"], shapes["v"]
    if len(qs) < 2 or any(len(s) != len(qs) for s in shapes.values()):
        raise ValueError(f"do, q, k, v, o need one rank >= 2 (..., S, D), got {shapes}")
    gqa = len(qs) >= 3 and ks[-3] != qs[-3]
    if gqa:  # fewer K/V heads than query heads, a whole number of query heads each
        lead_ok = qs[:-3] == ks[:-3] and ks[-3] > 0 and qs[-3] % ks[-3] == 0
    else:
        lead_ok = qs[:-2] == ks[:-2]
    if not lead_ok or ks[:-2] != vs[:-2] or qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        raise ValueError(f"incompatible shapes q {qs}, k {ks}, v {vs}: q (..., Hq, Sq, D), k "
                         f"(..., Hkv, Sk, D), v (..., Hkv, Sk, Dv) with Hq a multiple of Hkv")
    o_shape = qs[:-1] + (vs[-1],)
    for name in ("o", "do"):
        if shapes[name] != o_shape:
            raise ValueError(f"{name} has shape {shapes[name]}; with q {qs} and v {vs} it must "
                             f"be {o_shape}")
    if tuple(lse.shape) != qs[:-1]:
        raise ValueError(f"lse has shape {tuple(lse.shape)}; with q {qs} it must be {qs[:-1]}")
    try:
        left, right = (operator.index(w) for w in window)
    except (TypeError, ValueError):
        raise TypeError(f"window must be two integers (left, right), got {window!r}") from None
    return kind, dtype, gqa, (left, right)


def attention_backward(do, q, k, v, o, lse, *, causal=False, window=(-1, -1), scale=None,
                       stream=None):
    """The gradients (dQ, dK, dV) of O = attention(Q, K, V), FlashAttention-2 style.

    P is rebuilt tile by tile from the forward's LSE, P = exp(scale·QKᵀ − LSE), and
    dS = P ∘ (dP − D) with D = rowsum(dO ∘ O) (:mod:`numba_softmax.kernels.attention_backward`).

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
    stream
        As for :func:`numba_softmax.softmax`.

    All arrays of one kind; do, q, k, v, o of one dtype (float16, float32 or float64;
    float16 accumulated in float32), lse any float.  Returns (dq, dk, dv) in the dtype
    and kind of q.  dQ is accumulated with atomic adds: its last bits may differ from run
    to run.
    """
    kind, dtype, gqa, (left, right) = _check_attention(do, q, k, v, o, lse, window)
    *lead, sq, d = tuple(q.shape)
    sk, dv = tuple(k.shape)[-2], tuple(v.shape)[-1]
    if not (1 <= d <= _attention_kernel.MAX_HEAD_DIM and 1 <= dv <= _attention_kernel.MAX_HEAD_DIM):
        raise ValueError(f"head dimensions must be between 1 and {_attention_kernel.MAX_HEAD_DIM}, "
                         f"got D={d} (q, k) and Dv={dv} (v)")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    stream = _arrays.as_stream(stream)
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if math.prod(lead) * sq * sk == 0:  # no query, or no key: every gradient is 0
        return tuple(_arrays._full(kind, q, s, 0.0, dtype) for s in shapes)
    # views: (B, H, S, ·) device arrays; with GQA, H is axis −3 itself
    arrays = [(x, 2) for x in (do, q, k, v, o)] + [(lse, 1)]
    p = len(lead) - 1 if gqa else _split_point(arrays, kind, len(lead))
    do4, q4, k4, v4, o4 = (_heads(x, kind, p, 2, stream) for x in (do, q, k, v, o))
    lse3 = _heads(lse, kind, p, 1, stream)
    bufs = [_empty(kind, q, s, dtype, stream) for s in shapes]
    dq4, dk4, dv4 = (_buffer_heads(b, kind, p, 2) for b in bufs)
    # launch
    _attention_kernel.launch(do4, q4, k4, v4, o4, lse3, dq4, dk4, dv4, causal=causal,
                             window=(left, right), scale=scale, stream=stream,
                             small=_arrays._is_simulator())
    # give back
    return tuple(_give_back(b, kind, stream) for b in bufs)
