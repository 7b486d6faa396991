"""Attention in pure NumPy, float64: materialised, blockwise (FlashAttention), split-KV.

    O = softmax(scale · Q Kᵀ + mask) V,     Q: (..., Sq, D), K: (..., Sk, D), V: (..., Sk, Dv)

Which keys a query sees (:func:`visible`): with the diagonal aligned bottom-right,
d = j − (i + Sk − Sq) is key j's distance past query i's diagonal; ``causal`` keeps
d <= 0 (PyTorch's ``is_causal`` when Sq == Sk), a sliding ``window=(left, right)`` keeps
−left <= d <= right (−1: unbounded on that side) — flash-attn's ``window_size``.  A query
row that sees no key gets O = 0 and LSE = −inf, never NaN.

Grouped-query attention (GQA/MQA): K and V may have fewer heads than Q (axis −3);
query head h reads key/value head h // (Hq // Hkv).  These are the twins of :mod:`numba_softmax.kernels.attention.attention`
and :mod:`numba_softmax.kernels.decode.decode`.

Two modifications of the scaled scores, flash-attn's (:func:`scores`), before the mask:
``softcap`` > 0 gives s ← softcap·tanh(s / softcap); ``alibi_slopes`` (Hq,) or (..., Hq)
adds −slope_h·abs(i + Sk − Sq − j) to query i's score of key j.
"""

import math

import numpy as np

from ..combine import IDENTITY, combine_output_np, lse_np, weight_np

__all__ = [
    "attention",
    "attention_varlen",
    "flash_attention",
    "split_kv_attention",
    "merge_attention",
    "update_out_and_lse",
    "visible",
    "scores",
]


def _prepare(q, k, v, scale):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v need the same rank >= 2, got {q.shape}, {k.shape}, {v.shape}")
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3] and k.shape[-3] == v.shape[-3] \
            and k.shape[-3] > 0 and q.shape[-3] % k.shape[-3] == 0:  # GQA: share K/V heads
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or not (
        q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
    ):
        raise ValueError(f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return q, k, v, scale


def _visible(i, j, sq, sk):
    """Query i sees key j (bottom-right causal alignment)."""
    return j <= i + (sk - sq)


def visible(sq, sk, causal=False, window=(-1, -1)):
    """The (Sq, Sk) boolean mask: query i sees key j.

    d = j − (i + Sk − Sq); ``causal``: d <= 0; ``window=(left, right)``: −left <= d <= right,
    a negative bound meaning unbounded on that side.  Both may be combined."""
    left, right = window
    d = np.arange(sk)[None, :] - (np.arange(sq)[:, None] + (sk - sq))
    ok = np.ones((sq, sk), dtype=bool)
    if causal:
        ok &= d <= 0
    if left >= 0:
        ok &= d >= -left
    if right >= 0:
        ok &= d <= right
    return ok


def scores(q, k, scale, softcap=0.0, alibi_slopes=None):
    """The scores of q (..., Sq, D) against k (..., Sk, D), float64: scale·q·k, then
    softcap·tanh(· / softcap) if ``softcap`` > 0, then −slope·abs(i + Sk − Sq − j) with
    ``alibi_slopes`` ((Hq,) or the leading axes of q down to the heads, (..., Hq)) —
    flash-attn's order and definition, for causal and non-causal alike."""
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        sq, sk = s.shape[-2], s.shape[-1]
        dist = np.abs(np.arange(sq)[:, None] + (sk - sq) - np.arange(sk)[None, :])
        s = s - np.asarray(alibi_slopes, np.float64)[..., None, None] * dist
    return s


def _finish(m, l, o, return_lse):
    """O / ℓ and LSE = m + log ℓ; rows that saw nothing (ℓ = 0) get O = 0, LSE = −inf."""
    with np.errstate(invalid="ignore", divide="ignore"):  # ℓ = 0 → 0, ℓ = NaN → NaN
        out = np.where(l[..., None] == 0, 0.0, o / np.where(l == 0, 1.0, l)[..., None])
    return (out, lse_np(m, l)) if return_lse else out


def attention(q, k, v, causal=False, scale=None, return_lse=False, window=(-1, -1),
              softcap=0.0, alibi_slopes=None):
    """Materialised attention: the whole (Sq, Sk) score matrix, then safe softmax, then PV.

    ``window=(left, right)``, GQA (fewer K/V heads on axis −3), ``softcap`` and
    ``alibi_slopes`` (:func:`scores`) as in the module docstring."""
    q, k, v, scale = _prepare(q, k, v, scale)
    sq, sk = q.shape[-2], k.shape[-2]
    s = scores(q, k, scale, softcap, alibi_slopes)
    if causal or tuple(window) != (-1, -1):
        s = np.where(visible(sq, sk, causal, window), s, -np.inf)
    m = s.max(axis=-1) if sk else np.full(s.shape[:-1], -np.inf)
    p = weight_np(s, m[..., None])
    return _finish(m, p.sum(axis=-1), p @ v, return_lse)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, window=(-1, -1),
                     scale=None, return_lse=False, softcap=0.0, alibi_slopes=None):
    """Attention over a packed batch of sequences of different lengths (flash-attn's varlen).

    q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv): sequence b owns the rows
    cu_seqlens_q[b] … cu_seqlens_q[b+1] of q and cu_seqlens_k[b] … cu_seqlens_k[b+1] of k
    and v, and attends only to its own keys (causal and window aligned bottom-right within
    it).  Returns o (total_q, Hq, Dv) and, with ``return_lse``, LSE (Hq, total_q) —
    flash-attn's ``softmax_lse`` layout.  An empty sequence owns no rows; a sequence with
    no keys gets O = 0, LSE = −inf.  ``alibi_slopes``: (Hq,) or (B, Hq), row b for
    sequence b."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    cu_q, cu_k = (np.asarray(c, dtype=np.int64) for c in (cu_seqlens_q, cu_seqlens_k))
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or len(cu_q) != len(cu_k) or len(cu_q) < 1:
        raise ValueError(f"need packed (total, H, D) arrays and two cu_seqlens of one length, "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}, {len(cu_q)} and {len(cu_k)} offsets")
    out = np.zeros(q.shape[:2] + (v.shape[-1],))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        heads = [np.swapaxes(x, 0, 1) for x in (q[rows], k[keys], v[keys])]  # (H, S, D)
        sl = None if slopes is None else slopes[b] if slopes.ndim == 2 else slopes
        o_b, lse_b = attention(*heads, causal=causal, scale=scale, return_lse=True, window=window,
                               softcap=softcap, alibi_slopes=sl)
        out[rows], lse[:, rows] = np.swapaxes(o_b, 0, 1), lse_b
    return (out, lse) if return_lse else out


def flash_attention(q, k, v, causal=False, scale=None, block_q=64, block_k=64, return_lse=False):
    """FlashAttention's forward pass: never more than one (block_q, block_k) score tile.

    For each tile of Br = ``block_q`` query rows keep a running state per row,
    m (max score), ℓ (Σ exp(s − m)) and O (Σ exp(s − m)·v).  For each tile of
    Bc = ``block_k`` keys:  S = scale·Q_i K_jᵀ (masked), and the tile's own state
    (rowmax S, Σ exp(S − rowmax), exp(S − rowmax) V_j) is merged in with the combiner.
    Tiles that lie entirely above the causal diagonal are skipped.  At the end
    O ← O / ℓ and LSE = m + log ℓ.
    """
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got block_q={block_q}, block_k={block_k}")
    q, k, v, scale = _prepare(q, k, v, scale)
    sq, sk = q.shape[-2], k.shape[-2]
    lead = q.shape[:-2]
    out, lse = np.zeros(lead + (sq, v.shape[-1])), np.zeros(lead + (sq,))
    for i0 in range(0, sq, block_q):
        qi = q[..., i0 : i0 + block_q, :]
        br = qi.shape[-2]
        m = np.full(lead + (br,), IDENTITY[0])
        l = np.full(lead + (br,), IDENTITY[1])
        o = np.zeros(lead + (br, v.shape[-1]))
        rows = np.arange(i0, i0 + br)[:, None]
        for j0 in range(0, sk, block_k):
            if causal and not _visible(i0 + br - 1, j0, sq, sk):
                break  # this tile and all later ones lie above the diagonal
            kj, vj = k[..., j0 : j0 + block_k, :], v[..., j0 : j0 + block_k, :]
            s = scale * (qi @ np.swapaxes(kj, -1, -2))
            if causal:
                cols = np.arange(j0, j0 + kj.shape[-2])[None, :]
                s = np.where(_visible(rows, cols, sq, sk), s, -np.inf)
            m_t = s.max(axis=-1)
            p = weight_np(s, m_t[..., None])
            m, l, o = combine_output_np(m, l, o, m_t, p.sum(axis=-1), p @ vj)
        out[..., i0 : i0 + br, :], lse[..., i0 : i0 + br] = _finish(m, l, o, True)
    return (out, lse) if return_lse else out


def split_kv_attention(q, k, v, splits, causal=False, scale=None, return_lse=False, order=None):
    """Flash-decoding: attention over key ranges cut at ``splits`` (interior cut points),
    one partial (O_s, LSE_s) per range, merged with :func:`merge_attention` in ``order``."""
    q, k, v, scale = _prepare(q, k, v, scale)
    sq, sk = q.shape[-2], k.shape[-2]
    bounds = [0, *splits, sk]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        s = scale * (q @ np.swapaxes(k[..., lo:hi, :], -1, -2))
        if causal:
            s = np.where(_visible(np.arange(sq)[:, None], np.arange(lo, hi)[None, :], sq, sk), s, -np.inf)
        m = s.max(axis=-1) if hi > lo else np.full(s.shape[:-1], -np.inf)
        p = weight_np(s, m[..., None])
        parts.append(_finish(m, p.sum(axis=-1), p @ v[..., lo:hi, :], True))
    order = range(len(parts)) if order is None else order
    out, lse = None, None
    for idx in order:
        o_s, lse_s = parts[idx]
        out, lse = (o_s, lse_s) if out is None else merge_attention(out, lse, o_s, lse_s)
    return (out, lse) if return_lse else out


def merge_attention(o_a, lse_a, o_b, lse_b):
    """Merge two normalised partial attention results over disjoint key sets.

    An (O, LSE) pair is the state m = LSE, ℓ = 1, O; after the combiner,
    O = (w_a·O_a + w_b·O_b) / ℓ and LSE = m + log ℓ.  Both sides empty → O = 0, LSE = −inf.
    """
    lse_a, lse_b = np.asarray(lse_a, dtype=np.float64), np.asarray(lse_b, dtype=np.float64)
    m, l, o = combine_output_np(lse_a, np.ones_like(lse_a), o_a, lse_b, np.ones_like(lse_b), o_b)
    return _finish(m, l, o, True)  # an LSE of −inf weighs 0, so two empty sides give ℓ = 0


def update_out_and_lse(out, lse, block_out, block_lse):
    """Ring attention's pairwise step (the sources' ``update_out_and_lse``).

    The sources write it with the logistic function σ::

        out ← σ(lse − lse_b)·out + σ(lse_b − lse)·out_b,   lse ← lse + log(1 + exp(lse_b − lse))

    The two σ's are exactly the combiner's weights exp(lse − lse_new) and
    exp(lse_b − lse_new), so this *is* :func:`merge_attention`; through the combiner an
    empty side (lse = −inf) weighs 0 instead of producing NaN.
    """
    return merge_attention(out, lse, block_out, block_lse)
