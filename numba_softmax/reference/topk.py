"""Softmax + top-k and sampling in NumPy, float64: the twins of the top-k and sample kernels.

    softmax_topk          the k largest probabilities of softmax(x / T), sorted, and their
                          indices: torch.topk(torch.softmax(x / T, -1), k)
    sample_probabilities  the exact distribution a sampler draws from: temperature → top-k
                          (renormalised) → top-p (the smallest prefix of mass ≥ p)
    sample                the draws themselves, with the kernels' counter-based hash: the
                          same seed gives the same tokens as the kernels

All work along the last axis.  The row state is the top-k extension of the combiner
(:func:`numba_softmax.combine.topk_state_np`): ties go to the lower index; a row holding
NaN or +inf, or of all −inf, has no softmax (torch gives NaN everywhere), so its k values
are NaN and its indices 0, 1, …, k − 1 (the top-k of an all-NaN row, ties to the lower
index), and its sampled token is −1.
"""

import numpy as np

from .. import draws
from ..combine import EMPTY, topk_state_np, weight_np

__all__ = ["softmax_topk", "sample_probabilities", "sample", "gumbel_bits"]


def _state(x, k, temperature):
    u = np.asarray(x, dtype=np.float64) / temperature
    m, l, values, indices = topk_state_np(u, k)
    return u, m, l, values, indices, ~(l > 0)  # bad: ℓ NaN (NaN, +inf) or 0 (all −inf)


def softmax_topk(x, k, temperature=1.0, log=False):
    """(values, indices): the k largest of softmax(x / T) (or of log_softmax) along the
    last axis, sorted descending; indices int64."""
    _, m, l, values, indices, bad = _state(x, k, temperature)
    with np.errstate(invalid="ignore", divide="ignore"):
        if log:
            p = (values - m[..., None]) - np.log(l)[..., None]
        else:
            p = weight_np(values, m[..., None]) / l[..., None]
    p = np.where(bad[..., None], np.nan, p)
    indices = np.where(bad[..., None], np.arange(k), indices)
    return p, indices


def _cut(values, top_p):
    """Weights w_r = exp(u_r − u_0) of a sorted list and the top-p prefix length n."""
    w = weight_np(values, values[..., :1])
    mass = np.cumsum(w, axis=-1)
    n = 1 + np.sum(mass < top_p * mass[..., -1:], axis=-1)
    return w, np.minimum(n, values.shape[-1])


def sample_probabilities(x, top_k=None, top_p=1.0, temperature=1.0):
    """The distribution over the V tokens that ``sample`` draws from (rows with no softmax:
    all NaN).  ``top_k=None``: the whole vocabulary (then ``top_p`` must be 1)."""
    x = np.asarray(x, dtype=np.float64)
    V = x.shape[-1]
    k = V if top_k is None else top_k
    _, _, _, values, indices, bad = _state(x, k, temperature)
    w, n = _cut(values, top_p)
    w = np.where(np.arange(k) < n[..., None], w, 0.0)
    p = np.zeros(x.shape)
    with np.errstate(invalid="ignore"):  # rows with no softmax: 0/0, overwritten below
        np.put_along_axis(p, np.where(indices == EMPTY, 0, indices), w / w.sum(-1, keepdims=True), -1)
    return np.where(bad[..., None], np.nan, p)


def gumbel_bits(key, j):
    """:func:`numba_softmax.draws.bits` for arrays of keys and counters (uint64, wrapping;
    broadcast)."""
    z = np.asarray(key, dtype=np.uint64) + np.uint64(draws.PHI) * (np.asarray(j, dtype=np.uint64) + np.uint64(1))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample(x, top_k=None, top_p=1.0, temperature=1.0, seed=0):
    """One token per row (int64, −1 for a row with no softmax), drawn as the kernels draw:
    the row's key from (seed, row) (rows counted in C order over the leading axes), then
    with ``top_k``: :func:`numba_softmax.draws.draw` on the sorted top-k list with the row's
    uniform; without: argmax_j (u_j + G_j), Gumbel noise G_j from the key and j."""
    x = np.asarray(x, dtype=np.float64)
    lead, V = x.shape[:-1], x.shape[-1]
    u = x.reshape(-1, V) / temperature
    keys = np.array([draws.row_key(seed, r) for r in range(u.shape[0])], dtype=np.uint64)
    l = topk_state_np(u, 1)[1]  # ℓ of the unperturbed rows: 0 or NaN means no softmax
    if top_k is None:  # Gumbel-max: the top-1 of u + G
        b = (gumbel_bits(keys[:, None], np.arange(V)) >> np.uint64(32)).astype(np.float64)
        w = np.minimum((b + 0.5) * 2.0**-32, 0.99999994)
        u = u - np.log(-np.log1p(-w))
    values, indices = topk_state_np(u, 1 if top_k is None else top_k)[2:]
    tokens = np.full(u.shape[0], -1, dtype=np.int64)
    for r in np.flatnonzero(l > 0):
        place = 0 if top_k is None else draws.draw(values[r], 0, top_k, top_p, draws.uniform(int(keys[r])))
        tokens[r] = indices[r, place]
    return tokens.reshape(lead)
