"""The (m, ℓ) monoid: the one idea every kernel in this package folds.

A row's *state* is a pair (m, ℓ): the largest value seen so far, and the sum of
exp(x − m) over the values seen so far.  Two states describing disjoint parts of a
row merge into the state of their union::

    m = max(m_a, m_b)
    ℓ = ℓ_a · exp(m_a − m) + ℓ_b · exp(m_b − m)

The identity is (−inf, 0): "nothing seen yet".  A single value x is the state (x, 1).
In exact arithmetic the merge is associative and commutative, so any chunking of a
row, any order and any reduction tree give the same (m, ℓ) — which is why a thread, a
warp, a block, a grid of blocks or a ring of GPUs may each fold a piece and merge the
pieces afterwards (sources: Milakov & Gimelshein's online normaliser, and the chunk
update derived in the FlashAttention notes).

Attention adds a vector O (the running Σ exp(s − m)·v) to the state; it is re-based by
the very same factors (:func:`combine_output_np`).  :func:`weight` forms those factors
for the references and most kernels; the tensor-core and CUDA-core FlashAttention
kernels form the same factor inline as ``exp2((m − m')·log2 e)`` on scores already
scaled by log2 e (one multiply fewer a score), with the same care for m = −inf.

Care points, each handled exactly once, here:

* exp(−inf − (−inf)) is NaN.  A side whose m is −inf (the identity, or a chunk of
  −inf values) has weight exactly 0 and the NaN is never formed.  Its m is never
  replaced by 0 either: that "fix" is a known FlashAttention bug.
* A NaN anywhere makes m and ℓ NaN, a +inf makes ℓ NaN, in any order of merging:
  ``torch.softmax`` gives a NaN row for both.
* The functions are written once, in plain Python, and serve three masters: the NumPy
  references call them, ``cuda.jit(device=True)`` compiles the *same* source for every
  kernel (the ``*_device`` names below), and the Hypothesis tests target both.
  They use only arithmetic on their arguments, so a float32 state stays float32 on the
  device.
"""

import math
import types

import numpy as np
from numba import cuda

__all__ = [
    "IDENTITY",
    "weight",
    "larger",
    "combine",
    "lse",
    "combine_np",
    "weight_np",
    "lse_np",
    "combine_output_np",
    "EMPTY",
    "precedes",
    "rank",
    "offer",
    "combine_topk",
    "topk_state_np",
    "combine_topk_np",
]

IDENTITY = (-math.inf, 0.0)
"""The state of an empty set of values."""

FASTMATH = {"contract", "afn", "arcp"}
"""How every device function and kernel here is compiled: fast ``exp`` (``ex2.approx``),
``log`` and reciprocal, and FMA contraction — but *not* the ``nnan``/``ninf`` flags of
``fastmath=True``, which would let the compiler delete the −inf and NaN handling above.
Device functions carry their own flag: a kernel's fastmath does not reach into them."""


def weight(m_i, m):
    """exp(m_i − m): the factor that re-bases a state kept relative to m_i onto m ≥ m_i.

    A side at −inf (the identity, or a masked score) weighs exactly 0; the NaN of
    exp(−inf − (−inf)) is never formed.  exp(m_i) *is* that 0 (m_i is −inf there), and
    it keeps the result in m_i's float type on the device.
    """
    if m_i > -math.inf:
        return math.exp(m_i - m)
    return math.exp(m_i)  # m_i is −inf (→ 0) or NaN (→ NaN, which must propagate)


def larger(a, b):
    """max(a, b), but a NaN on either side wins, whatever the order (``a != a``: NaN).

    Python's ``max`` and a plain ``a if a > b else b`` both drop a NaN in one of the two
    places; the row max of every kernel, and the combiner, use this instead."""
    return a if (a > b or a != a) else b


def combine(m_a, l_a, m_b, l_b):
    """Merge two (m, ℓ) states into the state of their union.

    ``combine(m, l, x, 1)`` is the per-element online-softmax step: fold value x into
    the running state.  Returns ``(m, l)``.

    >>> combine(0.0, 1.0, 1.0, 1.0)   # the states of [0] and [1] → the state of [0, 1]
    (1.0, 1.3678794411714423)
    """
    m = larger(m_a, m_b)
    return m, l_a * weight(m_a, m) + l_b * weight(m_b, m)


def lse(m, l):
    """log Σ exp(x) = m + log ℓ of a state (its log-sum-exp).

    −inf for the identity (ℓ = 0 happens only with m = −inf), +inf when a +inf was seen
    (ℓ is NaN then, but the sum is plainly +inf, as ``torch.logsumexp`` says).
    """
    if l == 0:
        return m  # −inf; log(0) would raise on the simulator and in plain Python
    if m == math.inf:
        return m
    return m + math.log(l)


# --- device twins: the same source, compiled by numba.cuda for every kernel -----------
def device_twin(fn, **device_helpers):
    """Compile ``fn``'s own code object for the device, with the helpers it calls bound
    to *their* device twins (a device function can only call device functions)."""
    scope = {**fn.__globals__, **device_helpers}
    clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    return cuda.jit(device=True, fastmath=FASTMATH)(clone)


weight_device = device_twin(weight)
larger_device = device_twin(larger)
combine_device = device_twin(combine, weight=weight_device, larger=larger_device)
lse_device = device_twin(lse)


# --- vectorised twins for the NumPy references (tests prove them equal to the above) --
def weight_np(m_i, m):
    """:func:`weight` over arrays."""
    m_i, m = np.asarray(m_i), np.asarray(m)
    with np.errstate(invalid="ignore"):  # −inf − (−inf) is formed here, then discarded
        return np.exp(np.where(m_i > -np.inf, m_i - m, m_i))


def combine_np(m_a, l_a, m_b, l_b):
    """:func:`combine` over arrays (broadcasting), same rules, same NaN propagation."""
    m_a, m_b = np.asarray(m_a), np.asarray(m_b)
    m = np.where((m_a > m_b) | np.isnan(m_a), m_a, m_b)
    return m, l_a * weight_np(m_a, m) + l_b * weight_np(m_b, m)


def lse_np(m, l):
    """:func:`lse` over arrays."""
    m, l = np.asarray(m), np.asarray(l)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((l == 0) | (m == np.inf), m, m + np.log(np.where(l == 0, 1.0, l)))


def combine_output_np(m_a, l_a, o_a, m_b, l_b, o_b):
    """Merge two (m, ℓ, O) attention states; O = Σ exp(s − m)·v is unnormalised and has
    one more (last) axis than m and ℓ.  O is re-based by exactly the factors ℓ is::

        m = max(m_a, m_b);  ℓ = w_a·ℓ_a + w_b·ℓ_b;  O = w_a·O_a + w_b·O_b,  w = exp(m_side − m)

    The kernels apply the same two :func:`weight` factors to the O they keep in registers.
    """
    m, l = combine_np(m_a, l_a, m_b, l_b)
    w_a, w_b = weight_np(m_a, m)[..., None], weight_np(m_b, m)[..., None]
    return m, l, w_a * o_a + w_b * o_b


# --- the top-k extension: (m, ℓ, the k best values, their indices) ----------------------
# A row's top-k state adds to (m, ℓ) the k best values seen so far and their indices, as a
# list sorted best first.  Two states merge into the state of their union: (m, ℓ) by
# combine(), the lists by keeping the k best of both (combine_topk).  "Best" is one total
# order (precedes), so the merged list is a function of the set of values alone: any
# chunking, order or tree gives the same list, indices included.  The softmax of the k
# winners then needs nothing else: p_r = exp(u_r − m)/ℓ (Milakov & Gimelshein, §5).

EMPTY = 2**31 - 1
"""The index of an empty slot of a top-k list (its value is −inf): after every real index,
so a real −inf value ranks before it, and two empty slots are equal."""


def precedes(u_a, j_a, u_b, j_b):
    """(u_a, j_a) ranks before (u_b, j_b): the larger value first, equal values by the lower
    index.  A NaN precedes nothing and nothing precedes it, so it never enters a list (its
    row's (m, ℓ) is NaN, and the kernels write the whole row as NaN).  (``|`` and ``&``,
    not ``or`` and ``and``: on the device both sides are cheap, and a short circuit is a
    branch — two in every compare-exchange of a sorting network.)"""
    return (u_a > u_b) | ((u_a == u_b) & (j_a < j_b))


def rank(u, j, values, indices, start, k, ties):
    """How many entries of the sorted list values[start : start + k] precede (u, j) — with
    ``ties``, also those equal to it.  A binary search: log2(k) + 1 reads."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi) // 2
        a, b = values[start + mid], indices[start + mid]
        if precedes(a, b, u, j) or (ties and a == u and b == j):
            lo = mid + 1
        else:
            hi = mid
    return lo


def offer(values, indices, u, j):
    """Fold one value u at index j into a sorted top-k list, in place: the per-element step
    of the paper's algorithm (an insertion sort that keeps k entries).  A value that does
    not beat the k-th entry — and a NaN — leaves the list as it is."""
    k = values.shape[0]
    if not precedes(u, j, values[k - 1], indices[k - 1]):
        return
    r = k - 1
    while r > 0 and precedes(u, j, values[r - 1], indices[r - 1]):
        values[r] = values[r - 1]
        indices[r] = indices[r - 1]
        r -= 1
    values[r] = u
    indices[r] = j


def combine_topk(m_a, l_a, values_a, indices_a, m_b, l_b, values_b, indices_b, values, indices):
    """Merge two top-k states (lists sorted, k entries each) into ``values``/``indices``
    (k entries, not aliasing the inputs); returns the merged (m, ℓ).

    Entry r of one list lands at place r + (how many entries of the other list rank before
    it), the entries of ``a`` before equal ones of ``b`` (equal entries are empty slots):
    every entry's place is computed on its own, which is how the kernels merge in parallel.
    Places ≥ k fall off.
    """
    k = values.shape[0]
    for r in range(k):
        s = r + rank(values_a[r], indices_a[r], values_b, indices_b, 0, k, False)
        if s < k:
            values[s] = values_a[r]
            indices[s] = indices_a[r]
    for r in range(k):
        s = r + rank(values_b[r], indices_b[r], values_a, indices_a, 0, k, True)
        if s < k:
            values[s] = values_b[r]
            indices[s] = indices_b[r]
    return combine(m_a, l_a, m_b, l_b)


precedes_device = device_twin(precedes)
rank_device = device_twin(rank, precedes=precedes_device)
offer_device = device_twin(offer, precedes=precedes_device)
combine_topk_device = device_twin(combine_topk, rank=rank_device, combine=combine_device)


def topk_state_np(u, k, start=0):
    """The top-k state (m, ℓ, values, indices) of the values along the last axis of ``u``
    (their indices counted from ``start``):
    the vectorised twin of folding every value with :func:`offer` and :func:`combine`.
    NaN values stay out of the list; missing entries are empty slots (−inf, EMPTY)."""
    u = np.asarray(u, dtype=np.float64)
    n = u.shape[-1]
    with np.errstate(invalid="ignore"):
        m = u.max(axis=-1) if n else np.full(u.shape[:-1], -np.inf)
        l = weight_np(u, m[..., None]).sum(axis=-1)
    j = np.broadcast_to(np.arange(start, start + n), u.shape)
    return (m, l) + _best(u, j, k)


def combine_topk_np(a, b):
    """:func:`combine_topk` over arrays: states (m, ℓ, values, indices) with leading axes."""
    m, l = combine_np(a[0], a[1], b[0], b[1])
    return (m, l) + _best(np.concatenate([a[2], b[2]], -1), np.concatenate([a[3], b[3]], -1),
                          a[2].shape[-1])


def _best(u, j, k):
    """The k entries of (u, j) that rank first, in order, padded with empty slots; a NaN
    is an empty slot (it never enters a list)."""
    nan = np.isnan(u)
    u, j = np.where(nan, -np.inf, u), np.where(nan, EMPTY, j)
    order = np.lexsort((j, -u), axis=-1)[..., :k]
    values, indices = np.take_along_axis(u, order, -1), np.take_along_axis(j, order, -1)
    pad = k - values.shape[-1]
    if pad > 0:
        values = np.concatenate([values, np.full(values.shape[:-1] + (pad,), -np.inf)], -1)
        indices = np.concatenate([indices, np.full(indices.shape[:-1] + (pad,), EMPTY)], -1)
    return values, indices.astype(np.int64)
