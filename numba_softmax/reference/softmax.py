"""Softmax in pure NumPy: one function per algorithm in the sources, float64 by default.

These are the twins of the kernels in :mod:`numba_softmax.kernels` and the oracles of
the tests.  Every function works along the last axis of an array of any leading shape.
The streaming variants fold states with :func:`numba_softmax.combine.combine_np`, the
vectorised twin of the combiner the kernels use.

    naive        p_i = exp(x_i) / Σ_j exp(x_j)                    overflows for x ≳ 89 (fp32)
    safe         m = max_j x_j;  ℓ = Σ_j exp(x_j − m);  p_i = exp(x_i − m) / ℓ   (3 passes)
    online       one pass keeps (m, ℓ), merging block by block; a second pass normalises
    chunks       softmax each chunk, keep (p, m, ℓ) or (p, lse); merge into the whole row

Ring attention's pairwise ``update_out_and_lse`` lives with attention
(:func:`numba_softmax.reference.attention.update_out_and_lse`).
"""

import numpy as np

from ..combine import IDENTITY, combine_np, lse_np, weight_np

__all__ = [
    "naive_softmax",
    "softmax",
    "log_softmax",
    "logsumexp",
    "online_state",
    "online_softmax",
    "chunk_softmax",
    "merge_chunks",
    "merge_chunks_lse",
]


def _as_float(x, dtype):
    x = np.asarray(x)
    return x.astype(dtype or np.result_type(x.dtype, np.float64), copy=False)


def naive_softmax(x, dtype=np.float64):
    """exp(x) / Σ exp(x): the textbook formula.  Kept to show why the max is subtracted:
    exp overflows to inf for large inputs and inf / inf is NaN."""
    x = _as_float(x, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)


def softmax(x, dtype=np.float64):
    """Safe softmax, three passes over the row: max, sum of exp(x − m), normalise.

    Pass 1:  m = max_j x_j
    Pass 2:  ℓ = Σ_j exp(x_j − m)
    Pass 3:  p_i = exp(x_i − m) / ℓ

    −inf entries give 0; a row of all −inf, or one holding NaN or +inf, gives NaN
    (``torch.softmax`` semantics); an empty row gives an empty result.
    """
    x = _as_float(x, dtype)
    m, l = _block_state(x)  # passes 1 and 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return weight_np(x, m[..., None]) / l[..., None]  # pass 3


def log_softmax(x, dtype=np.float64):
    """log p_i = (x_i − m) − log ℓ.  NaN rows exactly where :func:`softmax` has them."""
    x = _as_float(x, dtype)
    m, l = _block_state(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (x - m[..., None]) - np.log(l)[..., None]


def logsumexp(x, dtype=np.float64):
    """log Σ_j exp(x_j) = m + log ℓ; −inf for an empty row or a row of −inf, +inf for a
    row holding +inf (and no NaN), NaN for a row holding NaN."""
    x = _as_float(x, dtype)
    return lse_np(*_block_state(x))


def online_state(x, block=1, dtype=np.float64):
    """Pass 1 of online softmax: the row's (m, ℓ), streamed ``block`` values at a time.

    Each block is reduced to its own state (max, Σ exp(x − max)) and merged into the
    running state with the combiner:

        m_new = max(m, m_blk);   ℓ_new = ℓ·exp(m − m_new) + ℓ_blk·exp(m_blk − m_new)

    ``block=1`` is Milakov & Gimelshein's per-element recurrence.  Returns (m, ℓ) with
    the row axis dropped.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    x = _as_float(x, dtype)
    m = np.full(x.shape[:-1], IDENTITY[0], dtype=x.dtype)
    l = np.full(x.shape[:-1], IDENTITY[1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block):
        m, l = combine_np(m, l, *_block_state(x[..., start : start + block]))
    return m, l


def _block_state(xb):
    """(max, Σ exp(x − max)) of each row of a block: the state of a chunk of values."""
    with np.errstate(invalid="ignore"):
        m_blk = xb.max(axis=-1) if xb.shape[-1] else np.full(xb.shape[:-1], -np.inf)
        return m_blk, weight_np(xb, m_blk[..., None]).sum(axis=-1)


def online_softmax(x, block=1, dtype=np.float64):
    """Two-pass online softmax: :func:`online_state` (pass 1), then p_i = exp(x_i − m)/ℓ.

    Equal to :func:`softmax` for every ``block`` (the block-size sweep of the sources)."""
    x = _as_float(x, dtype)
    m, l = online_state(x, block)
    with np.errstate(invalid="ignore", divide="ignore"):
        return weight_np(x, m[..., None]) / l[..., None]


def chunk_softmax(x, cuts, dtype=np.float64):
    """Softmax each chunk x[..., cuts[k]:cuts[k+1]] on its own.

    ``cuts`` are the interior cut points (sorted, may repeat: empty chunks are allowed).
    Returns a list of (p, m, ℓ) per chunk, p being the chunk's *local* softmax.  A chunk
    of only −inf has no softmax of its own (0/0); it is kept as p = 0 with the identity
    state (−inf, 0), so that it weighs exactly nothing in a merge.
    """
    x = _as_float(x, dtype)
    bounds = [0, *cuts, x.shape[-1]]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        m, l = _block_state(x[..., lo:hi])
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(l[..., None] == 0, 0.0, weight_np(x[..., lo:hi], m[..., None]) / l[..., None])
        out.append((p, m, l))
    return out


def merge_chunks(chunks, order=None):
    """The global softmax from per-chunk (p, m, ℓ), merged in any ``order``:

        m = max_k m_k;   ℓ = Σ_k ℓ_k·exp(m_k − m);   p = p_k · ℓ_k·exp(m_k − m) / ℓ

    The chunk states are folded with the combiner in the given order (a permutation of
    chunk indices); the pieces are concatenated back in row order.
    """
    order = range(len(chunks)) if order is None else order
    m, l = IDENTITY
    for k in order:
        m, l = combine_np(m, l, chunks[k][1], chunks[k][2])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.concatenate(
            [p * (lk * weight_np(mk, m) / l)[..., None] for p, mk, lk in chunks], axis=-1
        )


def merge_chunks_lse(chunks):
    """The same merge in log-sum-exp form: lse_k = m_k + log ℓ_k and

        p = p_k · exp(lse_k − lse),   lse = log Σ_k exp(lse_k)

    An LSE is the state (lse_k, 1), so the combiner computes lse too.
    """
    lses = [lse_np(mk, lk) for _, mk, lk in chunks]
    m, l = IDENTITY
    for lk in lses:
        m, l = combine_np(m, l, lk, np.ones_like(lk))
    total = lse_np(m, l)
    return np.concatenate(
        [p * weight_np(lk, total)[..., None] for (p, _, _), lk in zip(chunks, lses)], axis=-1
    )
