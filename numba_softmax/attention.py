"""The public attention API: ``attention`` and ``merge_attention`` on any array kind.

Each call: validate (dtypes, shapes, ``out=``) → see every (..., S, D) array as a 4-D
(B, H, S, D) device array (:func:`_heads`) → launch → hand the results back as the kind
of array that came in (NumPy in → NumPy out; CuPy, PyTorch CUDA tensors and Numba device
arrays → the same kind, on the same device).

The leading axes "..." are folded into two, (B, H), at one split point shared by all
arrays of a call; CUDA arrays whose strides allow it are read in place (any strides of
the last two axes; a head axis of stride 0, as from ``expand``, is fine), the others are
copied once.  Inputs are never written to.
"""

import math
import operator

import numpy as np
from numba import cuda

from . import _arrays
from .kernels import attention as _forward
from .kernels import decode as _decode

__all__ = ["attention", "merge_attention"]

DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
LSE_DTYPES = _arrays.FLOAT_DTYPES


# --- (..., S, D) arrays as (B, H, S, D) device arrays -----------------------------------
def _elem_strides(x, kind):
    desc = _arrays._cai(x, kind)
    return _arrays._cai_strides(desc, tuple(x.shape), np.dtype(desc["typestr"]).itemsize)


def _fold(shape, strides, p, tail):
    """Element strides of ``shape`` seen as (B, H, *last ``tail`` axes), B = the leading
    axes before ``p``, H = those from ``p``; None if a group cannot be one strided axis."""
    lead = len(shape) - tail

    def group(lo, hi):
        dims = [(shape[i], strides[i]) for i in range(lo, hi) if shape[i] != 1]
        for (_, st_outer), (s_inner, st_inner) in zip(dims[:-1], dims[1:]):
            if st_outer != st_inner * s_inner:
                return None
        return dims[-1][1] if dims else 0

    sb, sh = group(0, p), group(p, lead)
    if sb is None or sh is None:
        return None
    out = (sb, sh) + tuple(strides[lead:])
    return out if min(out) >= 0 else None


def _heads_shape(shape, p, tail):
    lead = len(shape) - tail
    return (math.prod(shape[:p]), math.prod(shape[p:lead])) + tuple(shape[lead:])


def _split_point(arrays, kind, n_lead):
    """The split p of the leading axes into (B, H) under which most of ``arrays`` — pairs
    (array, tail) — can be viewed in place."""
    if kind == "numpy" or _arrays._is_simulator():
        return n_lead
    strided = [(tuple(x.shape), _elem_strides(x, kind), tail) for x, tail in arrays]
    scores = [sum(_fold(s, st, p, t) is not None for s, st, t in strided)
              for p in range(n_lead + 1)]
    return max(range(n_lead + 1), key=lambda p: (scores[p], p))


def _heads(x, kind, p, tail, stream):
    """A (B, H, *tail) device array reading ``x``: in place when its strides allow,
    otherwise a contiguous copy (always through the host for NumPy and the simulator)."""
    shape = tuple(x.shape)
    shape4 = _heads_shape(shape, p, tail)
    if kind != "numpy" and not _arrays._is_simulator():
        itemsize = np.dtype(_arrays._cai(x, kind)["typestr"]).itemsize
        strides = _fold(shape, _elem_strides(x, kind), p, tail)
        if strides is not None:
            return _arrays._device_view(x, kind, shape4, tuple(s * itemsize for s in strides))
        if kind in ("cupy", "torch"):  # one contiguous copy, made by the array's own library
            x = _contiguous(x, kind)
            return _arrays._device_view(x, kind, shape4, _c_strides(shape4, itemsize))
    host = np.asarray(x.copy_to_host() if kind == "numba" else x)
    return cuda.to_device(np.ascontiguousarray(host).reshape(shape4), stream=stream)


def _contiguous(x, kind):
    if kind == "cupy":
        import cupy

        return cupy.ascontiguousarray(x)
    return x.detach().contiguous()


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _empty(kind, like, shape, dtype, stream):
    """A contiguous result buffer of the user's kind (a Numba device array for NumPy)."""
    dtype = np.dtype(dtype)
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=dtype)
    if kind == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype.name), device=like.device)
    return cuda.device_array(shape, dtype=dtype, stream=stream)


def _buffer_heads(buf, kind, p, tail):
    """The (B, H, *tail) view of a contiguous buffer made by :func:`_empty` (writable)."""
    shape4 = _heads_shape(tuple(buf.shape), p, tail)
    if kind in ("numpy", "numba"):
        return buf.reshape(*shape4)
    return _arrays._device_view(buf, kind, shape4, _c_strides(shape4, np.dtype(_dtype(buf, kind)).itemsize))


def _dtype(x, kind):
    return _arrays._dtype_of(x, kind)


def _give_back(buf, kind, stream):
    """A result buffer as the user's kind: NumPy results are copied to the host."""
    if kind != "numpy":
        return buf
    host = buf.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()  # copy_to_host on a stream is asynchronous
    return host


def _fill(out, result, kind):
    if kind == "numpy":
        np.copyto(out, result)
    elif kind == "torch":
        out.copy_(result)
    elif kind == "cupy":
        out[...] = result
    else:
        out.copy_to_device(result)
    return out


def _overlaps(a, b, kind):
    ea = _arrays._extent(_arrays._cai(a, kind), tuple(a.shape), np.dtype(_dtype(a, kind)).itemsize)
    eb = _arrays._extent(_arrays._cai(b, kind), tuple(b.shape), np.dtype(_dtype(b, kind)).itemsize)
    return not (ea[1] < eb[0] or eb[1] < ea[0])


# --- validation ---------------------------------------------------------------------------
def _check_same_kind(named):
    kinds = {name: _arrays.check_float(x, name, allowed=allowed)
             for name, (x, allowed) in named.items()}
    first = next(iter(kinds))
    for name, (kind, _) in kinds.items():
        if kind != kinds[first][0]:
            raise TypeError(f"{first} and {name} must be the same kind of array, got "
                            f"{kinds[first][0]} and {kind}")
    return kinds


def _check_out(out, kind, dtype, shape):
    """``out=``: the same kind and dtype as the inputs and the result's shape (checked
    before anything runs)."""
    out_kind = _arrays._kind(out)
    if out_kind != kind:
        raise TypeError(f"out must be the same kind of array as the inputs ({kind}), got {out_kind}")
    out_dtype = _dtype(out, out_kind)
    if out_dtype != dtype:
        raise TypeError(f"out has dtype {out_dtype}; the result has dtype {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}; the result has shape {tuple(shape)}")


def _check_qkv(q, k, v):
    kinds = _check_same_kind({"q": (q, DTYPES), "k": (k, DTYPES), "v": (v, DTYPES)})
    (kind, dtype), dk, dv = kinds["q"], kinds["k"][1], kinds["v"][1]
    if not dtype == dk == dv:
        raise TypeError(f"q, k and v must have one dtype, got {dtype}, {dk} and {dv}")
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    if len(qs) < 2 or len(ks) != len(qs) or len(vs) != len(qs):
        raise ValueError(f"q, k and v need the same rank >= 2 (..., S, D), got shapes "
                         f"q {qs}, k {ks}, v {vs}")
    if qs[:-2] != ks[:-2]:
        raise ValueError(f"q {qs} and k {ks} must have the same leading dimensions")
    if ks[:-2] != vs[:-2]:
        raise ValueError(f"k {ks} and v {vs} must have the same leading dimensions")
    if qs[-1] != ks[-1]:
        raise ValueError(f"q {qs} and k {ks} must have the same head dimension (last axis)")
    if ks[-2] != vs[-2]:
        raise ValueError(f"k {ks} and v {vs} must have the same number of keys (axis -2)")
    return kind, dtype


def _check_splits(num_splits):
    try:
        num_splits = operator.index(num_splits)
    except TypeError:
        raise TypeError(f"num_splits must be an integer, got {type(num_splits).__name__}") from None
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return num_splits


# --- the API ------------------------------------------------------------------------------
def attention(q, k, v, *, causal=False, scale=None, return_lse=False, num_splits=1,
              out=None, stream=None):
    """Scaled dot-product attention, FlashAttention-style: O = softmax(scale·Q Kᵀ) V.

    The Sq×Sk score matrix is never formed: one pass over K and V per tile of queries
    keeps each query row's online-softmax state (m, ℓ, O) on chip
    (:mod:`numba_softmax.kernels.attention`).

    Parameters
    ----------
    q, k, v : arrays (..., Sq, D), (..., Sk, D), (..., Sk, Dv)
        The same leading dimensions, the same kind — NumPy, or CUDA arrays (CuPy,
        PyTorch CUDA tensors, Numba device arrays) — and one dtype, float16 or float32
        (accumulated in float32).  1 <= D, Dv <= 128.  Never modified.
    causal : bool
        Query i sees key j iff j <= i + Sk − Sq (aligned bottom-right; PyTorch's
        ``is_causal`` when Sq == Sk).  A query that sees no key (Sq > Sk) gets O = 0 and
        LSE = −inf.
    scale : float, optional
        The score scale; default 1/sqrt(D).
    return_lse : bool
        Also return LSE = log Σ_j exp(scale·q·k_j), shape (..., Sq), float32.
    num_splits : int
        1: one block per (batch·head, query tile).  More: split-KV (flash-decoding,
        :mod:`numba_softmax.kernels.decode`) — the keys are cut into up to ``num_splits``
        ranges processed by different blocks and merged; for few query rows and long
        key sequences (decoding).
    out : array, optional
        Where to write O: the same kind and dtype as q, shape (..., Sq, Dv).
    stream : Numba stream, CuPy/PyTorch stream, or int handle, optional
        As for :func:`numba_softmax.softmax`.

    Returns
    -------
    O, or (O, LSE) with ``return_lse``.
    """
    kind, dtype = _check_qkv(q, k, v)
    num_splits = _check_splits(num_splits)
    *lead, sq, d = tuple(q.shape)
    lead = tuple(lead)
    sk, dv = tuple(k.shape)[-2], tuple(v.shape)[-1]
    _forward.check_head_dims(d, dv)
    o_shape, lse_shape = lead + (sq, dv), lead + (sq,)
    if out is not None:
        _check_out(out, kind, dtype, o_shape)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    stream = _arrays.as_stream(stream)

    if math.prod(lead) * sq == 0 or sk == 0:  # nothing to attend to: no kernel
        o = _arrays._full(kind, q, o_shape, 0.0, dtype)
        lse = _arrays._full(kind, q, lse_shape, -np.inf, np.dtype(np.float32))
        o = _fill(out, o, kind) if out is not None else o
        return (o, lse) if return_lse else o

    arrays = [(q, 2), (k, 2), (v, 2)] + ([(out, 2)] if out is not None else [])
    p = _split_point(arrays, kind, len(lead))
    q4, k4, v4 = (_heads(x, kind, p, 2, stream) for x in (q, k, v))

    o_dev = None  # write straight into out= when it can be viewed in place
    if out is not None and kind != "numpy" and not _arrays._is_simulator():
        strides = _fold(o_shape, _elem_strides(out, kind), p, 2)
        if strides is not None and not any(_overlaps(out, x, kind) for x in (q, k, v)):
            o_dev = _arrays._device_view(out, kind, _heads_shape(o_shape, p, 2),
                                         tuple(s * dtype.itemsize for s in strides))
    o_buf = None
    if o_dev is None:
        o_buf = _empty(kind, q, o_shape, dtype, stream)
        o_dev = _buffer_heads(o_buf, kind, p, 2)
    lse_buf = _empty(kind, q, lse_shape, np.float32, stream)
    lse_dev = _buffer_heads(lse_buf, kind, p, 1)

    small = _arrays._is_simulator()
    if num_splits == 1:
        _forward.launch(q4, k4, v4, o_dev, lse_dev, causal=causal, scale=scale,
                        stream=stream, small=small)
    else:
        _decode.launch(q4, k4, v4, o_dev, lse_dev, num_splits=num_splits, causal=causal,
                       scale=scale, stream=stream, small=small)

    lse = _give_back(lse_buf, kind, stream)
    if o_buf is None:
        o = out
    else:
        o = _give_back(o_buf, kind, stream)
        if out is not None:
            o = _fill(out, o, kind)
    return (o, lse) if return_lse else o


def merge_attention(o_a, lse_a, o_b, lse_b, *, stream=None):
    """Merge two attention results over disjoint sets of keys, on the device.

    (o_a, lse_a) is attention of some queries over keys K_a, (o_b, lse_b) over K_b; the
    result is attention over K_a ∪ K_b — ring attention's ``update_out_and_lse``, and the
    last step of split-KV decoding.  Each (O, LSE) pair is the state (m = LSE, ℓ = 1, O),
    merged with the combiner: m = max, ℓ = Σ exp(LSE − m), O = Σ exp(LSE − m)·O / ℓ.
    A side with LSE = −inf weighs exactly 0; both sides empty give O = 0, LSE = −inf.

    ``o_a``, ``o_b``: (..., S, Dv), float16 or float32, one dtype; ``lse_a``, ``lse_b``:
    (..., S), float; all the same kind.  Returns (o, lse): o in the dtype of ``o_a``,
    lse float32, the same kind as the inputs.
    """
    kinds = _check_same_kind({"o_a": (o_a, DTYPES), "lse_a": (lse_a, LSE_DTYPES),
                              "o_b": (o_b, DTYPES), "lse_b": (lse_b, LSE_DTYPES)})
    kind, dtype = kinds["o_a"]
    if kinds["o_b"][1] != dtype:
        raise TypeError(f"o_a and o_b must have one dtype, got {dtype} and {kinds['o_b'][1]}")
    sa, sb = tuple(o_a.shape), tuple(o_b.shape)
    if len(sa) < 2 or sa != sb:
        raise ValueError(f"o_a {sa} and o_b {sb} must have one shape (..., S, Dv)")
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(x.shape) != sa[:-1]:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; with o_a {sa} it must be {sa[:-1]}")
    stream = _arrays.as_stream(stream)
    lead = sa[:-2]
    if math.prod(sa[:-1]) == 0:
        o = _arrays._full(kind, o_a, sa, 0.0, dtype)
        return o, _arrays._full(kind, o_a, sa[:-1], -np.inf, np.dtype(np.float32))

    p = _split_point([(o_a, 2), (lse_a, 1), (o_b, 2), (lse_b, 1)], kind, len(lead))
    oa4, ob4 = (_heads(x, kind, p, 2, stream) for x in (o_a, o_b))
    la3, lb3 = (_heads(x, kind, p, 1, stream) for x in (lse_a, lse_b))
    o_buf = _empty(kind, o_a, sa, dtype, stream)
    lse_buf = _empty(kind, o_a, sa[:-1], np.float32, stream)
    _decode.merge_pair_launch(oa4, la3, ob4, lb3, _buffer_heads(o_buf, kind, p, 2),
                              _buffer_heads(lse_buf, kind, p, 1), stream=stream,
                              small=_arrays._is_simulator())
    return _give_back(o_buf, kind, stream), _give_back(lse_buf, kind, stream)
