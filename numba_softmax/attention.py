"""The public attention API: ``attention`` and ``merge_attention`` on any array kind.

Each call: a launch plan? replay it (:mod:`.plans`) — else validate every argument →
see each (..., H, S, D) array as a (B, H, S, D) device array (:mod:`.arrays.heads`) →
launch → hand the results back as the kind of array that came in (NumPy in → NumPy out;
CuPy, PyTorch CUDA tensors and Numba device arrays → the same kind, on the same device).
"""

import math
import numbers

import numpy as np

from . import plans
from .arrays import heads, kinds, layout
from .arrays.rows import check_alias, check_dtype
from .kernels.attention import attention as _forward
from .kernels.attention import attention_tc as _tensor_cores
from .kernels.decode import decode_launch as _decode
from .runtime import launcher
from .kernels.attention import merge as _merge

__all__ = ["attention", "merge_attention"]

DTYPES = (np.dtype(np.float16), kinds.BFLOAT16, np.dtype(np.float32))
LSE_DTYPES = kinds.FLOATS
F32 = np.dtype(np.float32)


# --- validation (all of it before anything is copied or launched) -----------------------
def _named(x, name):
    """``kinds.describe(x)``, its TypeError (not an array) naming the argument."""
    try:
        return kinds.describe(x)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None


def _describe_all(named, allowed):
    """Described arrays by name; one kind for all, each dtype in ``allowed``."""
    out, first = {}, None
    for name, x in named.items():
        d = _named(x, name)
        check_dtype(d, name, allowed[name] if isinstance(allowed, dict) else allowed)
        if first is not None and d.kind != out[first].kind:
            raise TypeError(f"{first} and {name} must be the same kind of array, got "
                            f"{out[first].kind} and {d.kind}")
        first = first or name
        out[name] = d
    return out


def _check_flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_scale(scale, d):
    if scale is None:  # (D = 0 is refused by the head-dimension check that follows)
        return 1.0 / math.sqrt(d) if d > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite real number or None, got {scale!r}")
    return float(scale)


def _check_window(window):
    if window is None:
        return (-1, -1)
    try:
        left, right = window
        left, right = (int(w) if isinstance(w, numbers.Integral) and not isinstance(w, bool)
                       else None for w in (left, right))
    except (TypeError, ValueError):
        left = right = None
    if left is None or right is None:
        raise TypeError(f"window must be None or a pair of ints (left, right), got {window!r}")
    return (max(left, -1), max(right, -1))


def _check_splits(num_splits):
    if num_splits is None:
        return None
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"num_splits must be an integer or None, got {num_splits!r}")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return int(num_splits)


def _check_qkv(q, k, v):
    ds = _describe_all({"q": q, "k": k, "v": v}, DTYPES)
    dq, dk, dv = ds["q"], ds["k"], ds["v"]
    if not dq.dtype == dk.dtype == dv.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {dq.dtype}, {dk.dtype} and {dv.dtype}")
    qs, ks, vs = dq.shape, dk.shape, dv.shape
    if len(qs) < 2 or len(ks) != len(qs) or len(vs) != len(qs):
        raise ValueError(f"q, k and v need the same rank >= 2 (..., S, D), got shapes "
                         f"q {qs}, k {ks}, v {vs}")
    if ks[:-2] != vs[:-2]:
        raise ValueError(f"k {ks} and v {vs} must have the same leading dimensions")
    if qs[:-3] != ks[:-3] or (len(qs) >= 3 and (qs[-3] % ks[-3] if ks[-3] else qs[-3])):
        raise ValueError(f"q {qs} and k {ks} must have the same leading dimensions, except that "
                         f"k/v may have fewer heads (axis -3) dividing q's (grouped-query attention)")
    if qs[-1] != ks[-1]:
        raise ValueError(f"q {qs} and k {ks} must have the same head dimension (last axis)")
    if ks[-2] != vs[-2]:
        raise ValueError(f"k {ks} and v {vs} must have the same number of keys (axis -2)")
    return dq, dk, dv


def _check_out(out, dq, dtype, shape, inputs):
    d = kinds.describe(out)
    if d.kind != dq.kind:
        raise TypeError(f"out must be the same kind of array as the inputs ({dq.kind}), got {d.kind}")
    if d.dtype != dtype:
        raise TypeError(f"out has dtype {d.dtype}; the result has dtype {dtype}")
    if tuple(d.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(d.shape)}; the result has shape {tuple(shape)}")
    if not d.on_host and layout.overlaps_itself(d.shape, d.strides):
        raise ValueError("out has elements that share memory (a zero or interleaved stride); "
                         "it cannot be written")
    return d


def _overlaps_any(d, inputs):
    """Whether ``out`` shares memory with q, k or v: the kernels read those while they
    write O, so such an O is written to a buffer first and copied in afterwards."""
    for x in inputs:
        try:
            check_alias(x, d, allow_in_place=False)
        except ValueError:
            return True
    return False


# --- the API ------------------------------------------------------------------------------
def attention(q, k, v, *, causal=False, window=None, scale=None, return_lse=False,
              num_splits=None, out=None, stream=None):
    """Scaled dot-product attention, FlashAttention-style: O = softmax(scale·Q Kᵀ) V.

    The Sq×Sk score matrix is never formed: one pass over K and V per tile of queries
    keeps each query row's online-softmax state (m, ℓ, O) on chip
    (:mod:`numba_softmax.kernels.attention.attention`; float16/bfloat16 on tensor cores).

    Parameters
    ----------
    q, k, v : arrays (..., Hq, Sq, D), (..., Hkv, Sk, D), (..., Hkv, Sk, Dv)
        The same kind — NumPy, or CUDA arrays (CuPy, PyTorch CUDA tensors, Numba device
        arrays) — and one dtype: float16, bfloat16 (PyTorch) or float32, accumulated in
        float32.  K and V may have fewer heads than Q (grouped-query attention: query
        head h reads key/value head h // (Hq // Hkv)); the other leading axes match.
        Never modified.
    causal : bool
        Query i sees key j iff j <= i + Sk − Sq (aligned bottom-right; PyTorch's
        ``is_causal`` when Sq == Sk).  A query that sees no key gets O = 0, LSE = −inf.
    window : (left, right) or None
        Sliding window: query i sees keys i + Sk − Sq − left … i + Sk − Sq + right
        (−1: unbounded on that side), as flash-attn's ``window_size``; with ``causal``.
    scale : float, optional
        The score scale; default 1/sqrt(D).
    return_lse : bool
        Also return LSE = log Σ_j exp(scale·q·k_j), shape (..., Hq, Sq), float32.
    num_splits : int or None
        None (default): chosen from the shape and the device — a few query rows per
        K/V head ((Hq/Hkv)·Sq ≤ 32: decoding) take the split-KV decode kernel with as
        many splits as fill the device; more rows take one pass.  1: one pass, one block
        per (batch·head, query tile).  More: split-KV (flash-decoding) — the keys are cut
        into up to ``num_splits`` ranges processed by different blocks and merged.
    out : array, optional
        Where to write O: the same kind and dtype as q, shape (..., Hq, Sq, Dv); it may
        be q itself (O is then computed into a buffer and copied in).
    stream : Numba stream, CuPy/PyTorch stream, or int handle, optional
        As for :func:`numba_softmax.softmax`.

    Returns
    -------
    O, or (O, LSE) with ``return_lse``.
    """
    stream = kinds.as_stream(stream)
    options = (causal, window, scale, return_lse, num_splits)
    plan_key, plan, ptrs = plans.lookup(("attention",) + options, (q, k, v, out), stream)
    if plan is not None:
        return plan((q, k, v, out), stream, ptrs)

    dq, dk, dv = _check_qkv(q, k, v)
    causal = _check_flag(causal, "causal")
    return_lse = _check_flag(return_lse, "return_lse")
    window = _check_window(window)
    splits = _check_splits(num_splits)
    *lead, sq, d = dq.shape
    sk, d_v = dk.shape[-2], dv.shape[-1]
    scale = _check_scale(scale, d)
    kernel = _kernel_for(dq.dtype, scale)
    kernel.check_head_dims(d, d_v)
    o_shape, lse_shape = tuple(lead) + (sq, d_v), tuple(lead) + (sq,)
    target = _check_out(out, dq, dq.dtype, o_shape, (dq, dk, dv)) if out is not None else None
    kind = dq.kind

    if math.prod(lead) * sq == 0 or sk == 0:  # nothing to attend to: no kernel
        o = kinds.full(kind, o_shape, 0.0, dq.dtype, like=q)
        lse = kinds.full(kind, lse_shape, -np.inf, F32, like=q)
        o = _fill(target, o, stream) if target is not None else o
        return (o, lse) if return_lse else o

    with plans.Recorder(plan_key, (q, k, v, out), stream) as rec:
        q4, k4, v4 = (heads.view(x, 2, stream) for x in (dq, dk, dv))
        o4 = None
        if target is not None and not _overlaps_any(target, (dq, dk, dv)):
            o4 = heads.out_view(target, 2)
        o_buf = None
        if o4 is None:
            o_buf, o4 = heads.output(kind, o_shape, dq.dtype, q, 2, stream)
        lse_bufs, lse4 = lse_output(kind, lse_shape, q, return_lse, stream)
        small = plans.simulator_enabled()
        if splits is None and not _decode.few_rows(q4, k4):
            splits = 1  # chosen: enough query tiles to fill the device, one pass
        if splits == 1:
            kernel.launch(q4, k4, v4, o4, lse4, causal=causal, window=window, scale=scale,
                          stream=stream, small=small)
        else:  # split-KV: num_splits ranges of keys, or (None) as many as pay
            _decode.launch(q4, k4, v4, o4, lse4, num_splits=splits, causal=causal,
                           window=window, scale=scale, stream=stream, small=small)
        if target is not None and o_buf is not None:
            _fill(target, kinds.to_user(kind, o_buf, stream, dq.dtype), stream)
        if o_buf is None or target is not None:
            return rec.done(_LseOnly(kind), *lse_bufs, out=out)
        return rec.done(_OAndLse(kind, dq.dtype), o_buf, *lse_bufs)


def _kernel_for(dtype, scale):
    """float16 / bfloat16 run on tensor cores (:mod:`.kernels.attention.attention_tc`); float32 on
    CUDA cores (:mod:`.kernels.attention.attention`), exact in float32 — as does a zero scale, which
    the tensor-core kernel's scaled-exponent form cannot take."""
    return _forward if dtype == F32 or scale == 0 else _tensor_cores


def _fill(target, result, stream):
    """Copy a finished O into the user's ``out=`` (described); returns ``out``."""
    if target.on_host:
        np.copyto(target.obj, result)
        return target.obj
    from .arrays import layout

    src = kinds.describe(result, target.kind)
    layout.device_copy(src, src.shape, src.strides, target, target.strides, stream)
    return target.obj


def lse_output(kind, shape, like, return_lse, stream):
    """LSE's (buffers to hand back, (B, H, S) device view): a new array when the caller
    asked for it, else per-stream scratch that outlives the call — the kernels write LSE
    either way, and a PyTorch allocation is ~3 µs of a call that should cost ~20."""
    if return_lse:
        buf, dev = heads.output(kind, shape, F32, like, 1, stream)
        return (buf,), dev
    return (), launcher.scratch(layout.heads_shape(tuple(shape), 1), F32, stream, "attention lse")


class _OAndLse:
    """The result of a call without ``out=``: O (and LSE, when its buffer is given) in
    the user's kind."""

    def __init__(self, kind, dtype):
        self.kind, self.dtype = kind, dtype

    def __call__(self, o_buf, *lse_buf, out=None, stream=0):
        o = kinds.to_user(self.kind, o_buf, stream, self.dtype)
        return (o, kinds.to_user(self.kind, lse_buf[0], stream)) if lse_buf else o


class _LseOnly:
    """The result of a call with ``out=``: ``out`` (already written), and LSE when its
    buffer is given."""

    def __init__(self, kind):
        self.kind = kind

    def __call__(self, *lse_buf, out=None, stream=0):
        return (out, kinds.to_user(self.kind, lse_buf[0], stream)) if lse_buf else out


def merge_attention(o_a, lse_a, o_b, lse_b, *, stream=None):
    """Merge two attention results over disjoint sets of keys, on the device.

    (o_a, lse_a) is attention of some queries over keys K_a, (o_b, lse_b) over K_b; the
    result is attention over K_a ∪ K_b — ring attention's ``update_out_and_lse``, and the
    last step of split-KV decoding.  Each (O, LSE) pair is the state (m = LSE, ℓ = 1, O),
    merged with the combiner: m = max, ℓ = Σ exp(LSE − m), O = Σ exp(LSE − m)·O / ℓ.
    A side with LSE = −inf weighs exactly 0; both sides empty give O = 0, LSE = −inf.

    ``o_a``, ``o_b``: (..., S, Dv), float16, bfloat16 or float32, one dtype; ``lse_a``,
    ``lse_b``: (..., S), float; all the same kind.  Returns (o, lse): o in the dtype of
    ``o_a``, lse float32, the same kind as the inputs.
    """
    stream = kinds.as_stream(stream)
    plan_key, plan, ptrs = plans.lookup(("merge_attention",), (o_a, lse_a, o_b, lse_b, None),
                                        stream)
    if plan is not None:
        return plan((o_a, lse_a, o_b, lse_b, None), stream, ptrs)
    ds = _describe_all({"o_a": o_a, "lse_a": lse_a, "o_b": o_b, "lse_b": lse_b},
                       {"o_a": DTYPES, "o_b": DTYPES, "lse_a": LSE_DTYPES, "lse_b": LSE_DTYPES})
    da, db = ds["o_a"], ds["o_b"]
    if db.dtype != da.dtype:
        raise TypeError(f"o_a and o_b must have one dtype, got {da.dtype} and {db.dtype}")
    sa, sb = da.shape, db.shape
    if len(sa) < 2 or sa != sb:
        raise ValueError(f"o_a {sa} and o_b {sb} must have one shape (..., S, Dv)")
    for name in ("lse_a", "lse_b"):
        if ds[name].shape != sa[:-1]:
            raise ValueError(f"{name} has shape {ds[name].shape}; with o_a {sa} it must be {sa[:-1]}")
    kind = da.kind
    if math.prod(sa[:-1]) == 0:
        o = kinds.full(kind, sa, 0.0, da.dtype, like=o_a)
        return o, kinds.full(kind, sa[:-1], -np.inf, F32, like=o_a)

    with plans.Recorder(plan_key, (o_a, lse_a, o_b, lse_b, None), stream) as rec:
        oa4, ob4 = (heads.view(ds[n], 2, stream) for n in ("o_a", "o_b"))
        la3, lb3 = (heads.view(ds[n], 1, stream) for n in ("lse_a", "lse_b"))
        o_buf, o4 = heads.output(kind, sa, da.dtype, o_a, 2, stream)
        lse_buf, lse3 = heads.output(kind, sa[:-1], F32, o_a, 1, stream)
        _merge.merge_pair_launch(oa4, la3, ob4, lb3, o4, lse3, stream=stream,
                                  small=plans.simulator_enabled())
        return rec.done(_OAndLse(kind, da.dtype), o_buf, lse_buf)
