"""The public attention API: ``attention`` and ``merge_attention`` on any array kind.

Each call: a launch plan? replay it (:mod:`.plans`) — else validate every argument →
see each (..., H, S, D) array as a (B, H, S, D) device array (:mod:`.arrays.heads`) →
launch → hand the results back as the kind of array that came in (NumPy in → NumPy out;
CuPy, PyTorch CUDA tensors and Numba device arrays → the same kind, on the same device).
"""

import math
import os

import numpy as np

from . import checks, plans
from .arrays import heads, kinds, layout, ops
from .arrays.rows import check_alias
from .runtime import launcher
from .kernels.attention import attention as _forward
from .kernels.attention import attention_tc as _tensor_cores
from .kernels.attention import hopper_ws as _hopper
from .kernels.attention import merge as _merge
from .kernels.hw import tma_maps as _maps
from .kernels.decode import decode_launch as _decode

__all__ = ["attention", "merge_attention"]

F32 = np.dtype(np.float32)
# the configuration of the wgmma kernel (:mod:`.kernels.attention.hopper_ws`) that one-pass
# fp16/bf16 calls take on sm_90: "auto" (the default) h6 at D = Dv = 128, h7 at D = Dv = 64
# and h5 otherwise (D 64 with Dv 128 or the reverse), for q, k, v a tensor map takes
# (docs/algorithms/hopper.md says why); a name of hopper_ws.CONFIGS that one wherever it
# applies, strided inputs copied for it; "off" keeps every call on mma.sync
HOPPER = os.environ.get("NUMBA_SOFTMAX_HOPPER", "auto")
HOPPER_SETTINGS = ("auto", "off") + tuple(_hopper.CONFIGS)


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
              num_splits=None, softcap=None, alibi_slopes=None, out=None, stream=None):
    """Scaled dot-product attention, FlashAttention-style: O = softmax(scale·Q Kᵀ) V.

    The Sq×Sk score matrix is never formed: one pass over K and V per tile of queries
    keeps each query row's online-softmax state (m, ℓ, O) on chip
    (:mod:`numba_softmax.kernels.attention.attention`; float16/bfloat16 on tensor cores:
    ``mma.sync``, or on Hopper (sm_90) the warp-specialized ``wgmma`` kernel of
    :mod:`~numba_softmax.kernels.attention.hopper_ws` where it applies — D and Dv 64 or
    128, one pass, no window or score modification, and by default q, k, v as its tensor
    maps take them: each row's values next to each other, other strides multiples of 16
    bytes, 16-byte aligned addresses — contiguous arrays and a model's transposed views
    do; anything else stays on ``mma.sync``, since copying it each call costs more host
    time than the kernel saves.  ``NUMBA_SOFTMAX_HOPPER=off`` keeps Hopper on ``mma.sync``;
    ``h2`` … ``h7`` pick one configuration of the kernel where it applies, other inputs
    copied for it; ``auto`` (the default) takes h6 at D = Dv = 128, h7 at D = Dv = 64 and h5
    otherwise).

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
    softcap : float or None
        > 0: each scaled score s becomes softcap·tanh(s / softcap) (flash-attn's
        ``softcap``; Gemma 2 uses 50), before the mask.  None or 0: off.
    alibi_slopes : array or None
        ALiBi: float32, shape (Hq,) or q's leading axes (B, Hq); query i's score of key j
        gets −slope_h·abs(i + Sk − Sq − j) added (after the soft-cap), flash-attn's
        definition.  Any array kind (read on the host, checked finite); never modified.
    return_lse : bool
        Also return LSE = log Σ_j exp(s_j) over the (modified) scores s_j = scale·q·k_j,
        shape (..., Hq, Sq), float32.
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
    stream = ops.as_stream(stream)
    # HOPPER is in the key: a plan recorded under one setting is not replayed under another
    options = (causal, window, scale, return_lse, num_splits, softcap, HOPPER)
    plan_key, plan, ptrs = None, None, None  # slopes are read on the host each call: no plan
    if alibi_slopes is None:
        plan_key, plan, ptrs = plans.lookup(("attention",) + options, (q, k, v, out), stream)
    if plan is not None:
        return plan((q, k, v, out), stream, ptrs)

    seen = plans.seen(plan_key, ptrs, 4)  # what the look-up read: each array described once
    dq, dk, dv = checks.qkv(q, k, v, seen[:3])
    causal = checks.flag(causal, "causal")
    return_lse = checks.flag(return_lse, "return_lse")
    window = checks.window(window)
    splits = checks.num_splits(num_splits)
    softcap = checks.softcap(softcap)
    slopes = checks.alibi_slopes(alibi_slopes, dq.shape[:-2])
    *lead, sq, d = dq.shape
    sk, d_v = dk.shape[-2], dv.shape[-1]
    scale = checks.scale(scale, d)
    kernel = kernel_for(dq.dtype, scale)
    kernel.check_head_dims(d, d_v)
    o_shape, lse_shape = tuple(lead) + (sq, d_v), tuple(lead) + (sq,)
    target = checks.out(out, dq, dq.dtype, o_shape, seen[3]) if out is not None else None
    kind = dq.kind

    if math.prod(lead) * sq == 0 or sk == 0:  # nothing to attend to: no kernel
        o = ops.full(kind, o_shape, 0.0, dq.dtype, like=q)
        lse = ops.full(kind, lse_shape, -np.inf, F32, like=q)
        o = _fill(target, o, stream) if target is not None else o
        return (o, lse) if return_lse else o

    with plans.Recorder(plan_key, (q, k, v, out), stream, (dq, dk, dv, target)) as rec:
        q4, k4, v4 = (heads.view(x, 2, stream) for x in (dq, dk, dv))
        o4 = None
        if target is not None and not _overlaps_any(target, (dq, dk, dv)):
            o4 = heads.out_view(target, 2)
        o_buf = None
        if o4 is None:
            o_buf, o4 = heads.output(kind, o_shape, dq.dtype, q, 2, stream)
        lse_bufs, lse4 = heads.lse_output(kind, lse_shape, q, return_lse, stream)
        small = plans.simulator_enabled()
        if splits is None and not _decode.few_rows(q4, k4):
            splits = 1  # chosen: enough query tiles to fill the device, one pass
        mods = dict(softcap=softcap, alibi=None if slopes is None else ops.to_device(slopes, stream))
        hopper = None
        if splits == 1 and kernel is _tensor_cores:
            hopper = hopper_config(d, d_v, window, softcap, slopes, (q4, k4, v4))
        if hopper is not None:  # what no tensor map describes is copied (named settings)
            q4, k4, v4 = (a if _maps.takes(a) else heads.view(x, 2, stream, copy=True)
                          for x, a in ((dq, q4), (dk, k4), (dv, v4)))
            _hopper.launch(q4, k4, v4, o4, lse4, causal=causal, scale=scale, stream=stream,
                           config=hopper)
        elif splits == 1:
            kernel.launch(q4, k4, v4, o4, lse4, causal=causal, window=window, scale=scale,
                          stream=stream, small=small, **mods)
        else:  # split-KV: num_splits ranges of keys, or (None) as many as pay
            _decode.launch(q4, k4, v4, o4, lse4, num_splits=splits, causal=causal,
                           window=window, scale=scale, stream=stream, small=small, **mods)
        if target is not None and o_buf is not None:
            _fill(target, ops.to_user(kind, o_buf, stream, dq.dtype), stream)
        if o_buf is None or target is not None:
            return rec.done(heads.LseOnly(kind), *lse_bufs, out=out)
        return rec.done(heads.Result(kind, dq.dtype), o_buf, *lse_bufs)


def kernel_for(dtype, scale):
    """float16 / bfloat16 run on tensor cores (:mod:`.kernels.attention.attention_tc`); float32 on
    CUDA cores (:mod:`.kernels.attention.attention`), exact in float32 — as does a zero scale, which
    the tensor-core kernel's scaled-exponent form cannot take."""
    return _forward if dtype == F32 or scale == 0 else _tensor_cores


def hopper_config(d, d_v, window, softcap, slopes, arrays):
    """The configuration of the wgmma kernel a one-pass fp16/bf16 call runs on (see
    ``HOPPER``), or None (mma.sync): on an sm_90 GPU (not the simulator), D and Dv 64 or
    128 (a named configuration: those it takes), no window or score modification; under
    "auto" only where a tensor map describes the device views ``arrays`` (q, k, v) as they
    are (:func:`.tma_maps.takes`; a copy costs more host time than the kernel saves).  An unknown
    ``NUMBA_SOFTMAX_HOPPER`` is a ValueError naming it."""
    if not _on_hopper():
        return None
    if window != (-1, -1) or softcap or slopes is not None:
        return None
    if d not in _hopper.HEAD_DIMS or d_v not in _hopper.HEAD_DIMS:
        return None
    if HOPPER == "auto":  # h6's turns pay where the products are long (D = Dv = 128),
        if not all(map(_maps.takes, arrays)):  # h7's taller block where they are short
            return None
        return {128: "h6", 64: "h7"}[d] if d == d_v else "h5"
    return HOPPER if _hopper.takes(HOPPER, d, d_v) else None


def _on_hopper():
    """Whether the wgmma kernels may run at all: ``NUMBA_SOFTMAX_HOPPER`` not "off" (an
    unknown setting is a ValueError naming it), an sm_90 GPU, not the simulator."""
    if HOPPER not in HOPPER_SETTINGS:
        raise ValueError(f"NUMBA_SOFTMAX_HOPPER must be one of {HOPPER_SETTINGS}, got {HOPPER!r}")
    return (HOPPER != "off" and not plans.simulator_enabled()
            and launcher.device_limits().cc == (9, 0))


def hopper_setting():
    """``NUMBA_SOFTMAX_HOPPER`` as it stands (the backward's plan key holds it too)."""
    return HOPPER


def hopper_backward(d, d_v, softcap, slopes, arrays):
    """Whether a fp16/bf16 attention backward runs on hb2
    (:mod:`.kernels.backward.hopper_backward_ws`) rather than ``mma.sync``: an sm_90 GPU
    (not the simulator), ``NUMBA_SOFTMAX_HOPPER`` not "off", D and Dv 64 or 128, no score
    modification (windows it masks), and tensor maps that describe the device views
    ``arrays`` (do, q, k, v) as they are — never a copy."""
    if not _on_hopper():
        return False
    if softcap or slopes is not None:
        return False
    if d not in _hopper.HEAD_DIMS or d_v not in _hopper.HEAD_DIMS:
        return False
    return all(map(_maps.takes, arrays))


def _fill(target, result, stream):
    """Copy a finished O into the user's ``out=`` (described); returns ``out``."""
    if target.on_host:
        np.copyto(target.obj, result)
        return target.obj
    src = kinds.describe(result, target.kind)
    layout.device_copy(src, src.shape, src.strides, target, target.strides, stream)
    return target.obj


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
    stream = ops.as_stream(stream)
    plan_key, plan, ptrs = plans.lookup(("merge_attention",), (o_a, lse_a, o_b, lse_b, None),
                                        stream)
    if plan is not None:
        return plan((o_a, lse_a, o_b, lse_b, None), stream, ptrs)
    ds = checks.merge_pair(o_a, lse_a, o_b, lse_b, plans.seen(plan_key, ptrs, 4))
    da, sa = ds["o_a"], ds["o_a"].shape
    kind = da.kind
    if math.prod(sa[:-1]) == 0:
        o = ops.full(kind, sa, 0.0, da.dtype, like=o_a)
        return o, ops.full(kind, sa[:-1], -np.inf, F32, like=o_a)

    described = tuple(ds[n] for n in ("o_a", "lse_a", "o_b", "lse_b")) + (None,)
    with plans.Recorder(plan_key, (o_a, lse_a, o_b, lse_b, None), stream, described) as rec:
        oa4, ob4 = (heads.view(ds[n], 2, stream) for n in ("o_a", "o_b"))
        la3, lb3 = (heads.view(ds[n], 1, stream) for n in ("lse_a", "lse_b"))
        o_buf, o4 = heads.output(kind, sa, da.dtype, o_a, 2, stream)
        lse_buf, lse3 = heads.output(kind, sa[:-1], F32, o_a, 1, stream)
        _merge.merge_pair_launch(oa4, la3, ob4, lb3, o4, lse3, stream=stream,
                                  small=plans.simulator_enabled())
        return rec.done(heads.Result(kind, da.dtype), o_buf, lse_buf)
