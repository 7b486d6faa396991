"""Argument checks shared by the public functions (attention, inference, backward, top-k).

Each check takes a caller's argument (and its name where several arguments share the
check) and returns it in the form the call goes on with — a bool, a float, a
``(left, right)`` pair, a :class:`~.arrays.kinds.Described` array — or raises a
``TypeError`` (the wrong type, kind or dtype) or a ``ValueError`` (a value or a shape out
of range) that names the argument.  A call runs every check before it copies or launches
anything, and no check modifies its argument.

Arrays are described once per call: a check that describes an array takes ``facts``,
what the launch plan's look-up already read of it (:func:`.plans.seen`), and the
descriptions it returns travel on to the views, the ``out=`` handling and the plan's
recorder.  A paged cache's block tables are checked by :mod:`.block_tables` (its three
checks are importable from here too).
"""

import math
import numbers
import operator

import numpy as np

from .arrays import kinds, layout, ops
from .arrays.rows import check_dtype
from .kernels.topk.topk import MAX_K

__all__ = ["ATTENTION_DTYPES", "described", "described_all", "flag", "scale", "window",
           "num_splits", "integer", "real", "temperature", "top_k", "top_p", "qkv", "out",
           "merge_pair", "attention_grads", "packed_qkv", "offsets", "max_seqlen", "softcap",
           "alibi_slopes"]

ATTENTION_DTYPES = (np.dtype(np.float16), kinds.BFLOAT16, np.dtype(np.float32))
I32 = np.dtype(np.int32)


# --- arrays -------------------------------------------------------------------------------
def described(x, name, facts=None):
    """``kinds.describe(x)``, its ``TypeError`` (not an array) naming the argument."""
    try:
        return kinds.describe(x, facts=facts)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None


def described_all(named, allowed, facts=None):
    """The arrays ``named`` ({name: array}) described, by name: one kind for all, each
    dtype in ``allowed`` (a tuple, or {name: tuple}).  ``facts``: what the plan look-up
    read of each, in the same order (or None)."""
    facts = facts or (None,) * len(named)
    out, first = {}, None
    for (name, x), f in zip(named.items(), facts, strict=True):
        d = described(x, name, f)
        check_dtype(d, name, allowed[name] if isinstance(allowed, dict) else allowed)
        if first is not None and d.kind != out[first].kind:
            raise TypeError(f"{first} and {name} must be the same kind of array, got "
                            f"{out[first].kind} and {d.kind}")
        first = first or name
        out[name] = d
    return out


def out(x, like, dtype, shape, facts=None):
    """A user's ``out=`` for a result of ``dtype`` and ``shape``, described: the same kind
    as the described input ``like``, and no two of its elements at one address."""
    d = described(x, "out", facts)
    if d.kind != like.kind:
        raise TypeError(f"out must be the same kind of array as the inputs ({like.kind}), got {d.kind}")
    if d.dtype != dtype:
        raise TypeError(f"out has dtype {d.dtype}; the result has dtype {dtype}")
    if tuple(d.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(d.shape)}; the result has shape {tuple(shape)}")
    if not d.on_host and layout.overlaps_itself(d.shape, d.strides):
        raise ValueError("out has elements that share memory (a zero or interleaved stride); "
                         "it cannot be written")
    return d


# --- options ------------------------------------------------------------------------------
def flag(value, name):
    """``value`` as a bool: True or False (NumPy's too), nothing else."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def scale(value, d):
    """The score scale as a float: a finite real number, or None for 1/sqrt(``d``)."""
    if value is None:  # (D = 0 is refused by the head-dimension check that follows)
        return 1.0 / math.sqrt(d) if d > 0 else 1.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"scale must be a finite real number or None, got {value!r}")
    return float(value)


def window(value):
    """A sliding window ``(left, right)`` of ints, −1 for an unbounded side (and any
    negative number read as −1); None: (−1, −1)."""
    if value is None:
        return (-1, -1)
    try:
        left, right = value
        left, right = (int(w) if isinstance(w, numbers.Integral) and not isinstance(w, bool)
                       else None for w in (left, right))
    except (TypeError, ValueError):
        left = right = None
    if left is None or right is None:
        raise TypeError(f"window must be None or a pair of ints (left, right), got {value!r}")
    return (max(left, -1), max(right, -1))


def softcap(value):
    """The score soft-cap as a float: None or 0 (off, 0.0), else finite and > 0."""
    c = 0.0 if value is None else real(value, "softcap")
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"softcap must be finite and >= 0 (0 or None: off), got {c}")
    return c


def alibi_slopes(x, lead):
    """ALiBi slopes (any kind of array, float32, finite): shape (Hq,) or ``lead`` — q's
    leading axes down to its heads, (B, Hq) for a (B, Hq, Sq, D) q.  Returns them as a
    float32 (1 or B, Hq) NumPy copy (read on the host, where they are checked), or None."""
    if x is None:
        return None
    d = described(x, "alibi_slopes")
    check_dtype(d, "alibi_slopes", (np.dtype(np.float32),))
    if not lead or tuple(d.shape) not in ((lead[-1],), tuple(lead)):
        raise ValueError(f"alibi_slopes has shape {tuple(d.shape)}; with q's heads {tuple(lead)} "
                         f"it must be ({lead[-1] if lead else 'Hq'},) or {tuple(lead)}")
    host = np.array(ops.to_numpy(x), np.float32).reshape(-1, lead[-1])
    if not np.isfinite(host).all():
        raise ValueError("alibi_slopes must be finite")
    return host


def num_splits(value):
    """None, or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"num_splits must be an integer or None, got {value!r}")
    if value < 1:
        raise ValueError(f"num_splits must be >= 1, got {value}")
    return int(value)


def integer(value, name):
    """``value`` as an int: any integer (``operator.index``), not a bool."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


def real(value, name):
    """``value`` as a float: any real number, not a bool."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def temperature(value):
    """A softmax temperature: finite and > 0."""
    t = real(value, "temperature")
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be finite and > 0; got {t}")
    return t


def top_k(value, n, name="k"):
    """How many of ``n`` values a top-k keeps: 1 … min(n, the kernels' limit)."""
    k = integer(value, name)
    if not 1 <= k <= n:
        raise ValueError(f"{name} must be in 1 … {n} (the length of the axis); got {k}")
    if k > MAX_K:
        raise ValueError(f"{name} must be at most {MAX_K} (the fused top-k keeps the list "
                         f"on chip); got {k}")
    return k


def top_p(value):
    """A nucleus mass: 0 < p <= 1."""
    p = real(value, "top_p")
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1]; got {p}")
    return p


# --- attention's shapes -----------------------------------------------------------------
def qkv(q, k, v, facts=None):
    """q (..., Hq, Sq, D), k (..., Hkv, Sk, D), v (..., Hkv, Sk, Dv): one kind, one
    attention dtype, leading axes equal but for K/V heads dividing Q's.  Returns the
    three descriptions."""
    ds = described_all({"q": q, "k": k, "v": v}, ATTENTION_DTYPES, facts)
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


def merge_pair(o_a, lse_a, o_b, lse_b, facts=None):
    """Two attention results (o (..., S, Dv), lse (..., S)) to merge: one kind, one
    dtype for the o's, shapes that agree.  Returns the descriptions by name."""
    lse_dtypes = kinds.FLOATS
    ds = described_all({"o_a": o_a, "lse_a": lse_a, "o_b": o_b, "lse_b": lse_b},
                       {"o_a": ATTENTION_DTYPES, "o_b": ATTENTION_DTYPES,
                        "lse_a": lse_dtypes, "lse_b": lse_dtypes}, facts)
    da, db = ds["o_a"], ds["o_b"]
    if db.dtype != da.dtype:
        raise TypeError(f"o_a and o_b must have one dtype, got {da.dtype} and {db.dtype}")
    sa, sb = da.shape, db.shape
    if len(sa) < 2 or sa != sb:
        raise ValueError(f"o_a {sa} and o_b {sb} must have one shape (..., S, Dv)")
    for name in ("lse_a", "lse_b"):
        if ds[name].shape != sa[:-1]:
            raise ValueError(f"{name} has shape {ds[name].shape}; with o_a {sa} it must be {sa[:-1]}")
    return ds


def attention_grads(do, q, k, v, o, lse, facts=None):
    """The arrays of attention's backward: do, q, k, v, o of one float dtype, lse any
    float, one kind; q (..., Hq, Sq, D), k (..., Hkv, Sk, D), v (..., Hkv, Sk, Dv),
    o and do (..., Hq, Sq, Dv), lse (..., Hq, Sq).  Returns the descriptions by name."""
    names = ("do", "q", "k", "v", "o")
    ds = described_all(dict(zip(names, (do, q, k, v, o))) | {"lse": lse},
                       {**{n: kinds.FLOATS for n in names}, "lse": kinds.FLOATS}, facts)
    dtype = ds["q"].dtype
    odd = [n for n in ("do", "k", "v", "o") if ds[n].dtype != dtype]
    if odd:
        raise TypeError(f"do, q, k, v and o must have one dtype; q has {dtype}, "
                        + ", ".join(f"{n} {ds[n].dtype}" for n in odd))
    shapes = {n: ds[n].shape for n in names}
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
    if ds["lse"].shape != qs[:-1]:
        raise ValueError(f"lse has shape {ds['lse'].shape}; with q {qs} it must be {qs[:-1]}")
    return ds


# --- packed (varlen) batches ---------------------------------------------------------------
def packed_qkv(q, k, v):
    """Packed q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv): one kind and
    attention dtype, Hkv dividing Hq.  Returns the three descriptions."""
    ds = described_all({"q": q, "k": k, "v": v}, ATTENTION_DTYPES)
    dq, dk, dv = ds["q"], ds["k"], ds["v"]
    if dq.ndim != 3 or dk.ndim != 3 or dv.ndim != 3:
        raise ValueError(f"q, k, v are packed (total, H, D), got q {dq.shape}, k {dk.shape}, v {dv.shape}")
    if not dq.dtype == dk.dtype == dv.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {dq.dtype}, {dk.dtype} and {dv.dtype}")
    (_, hq, d), (_, hkv, _) = dq.shape, dk.shape
    if dk.shape[:2] != dv.shape[:2] or dk.shape[2] != d or hkv < 1 or hq % hkv:
        raise ValueError(f"q {dq.shape}, k {dk.shape}, v {dv.shape}: k and v need one (total_k, "
                         f"Hkv), Hkv dividing q's heads, and q's head dimension")
    return dq, dk, dv


def offsets(x, total, name):
    """Sequence offsets ``x`` (int32, any kind): B + 1 values from 0, non-decreasing, at
    most ``total``.  Returns (its description, the values as int64 NumPy)."""
    d = described(x, name)
    check_dtype(d, name, (I32,))
    cu = np.asarray(ops.to_numpy(x), np.int64)
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] > total:
        raise ValueError(f"{name} must be non-decreasing offsets from 0 to at most {total} "
                         f"(B + 1 values), got {cu.tolist()[:8]}{'…' if cu.size > 8 else ''}")
    return d, cu


def max_seqlen(given, longest, name):
    """A caller's bound on the longest sequence: None, or an int >= ``longest``."""
    if given is None:
        return
    if isinstance(given, bool) or not isinstance(given, numbers.Integral):
        raise TypeError(f"{name} must be an integer or None, got {given!r}")
    if given < longest:
        raise ValueError(f"{name} = {given} but a sequence has {longest}")
