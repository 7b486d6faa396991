"""Block reduction trees in NumPy: the sources' CuTe kernel (seed 004) and this project's.

Both fold the T per-thread (m, ℓ) states of a block into the block's state with the
combiner; they differ in who merges with whom, where the states wait, and what it costs::

    seed 004 (CuTe DSL)        every thread posts (m, s) to a T-slot shared array (T = 512);
                               offsets T/2, T/4, …, 1: thread t < offset merges slot
                               t + offset into slot t, then a barrier — log2 T = 9 levels,
                               2·T·4 bytes of shared memory; every thread reads slot 0.
    this project (reduce.py)   a warp butterfly (five shfl_xor exchanges: no shared memory,
                               no barrier); lane 0 of each warp posts to one of 32 slots;
                               every warp runs the butterfly over the 32 slots — 2 barriers,
                               2·32·4 bytes; every thread ends with the state.

The per-thread states differ as well: seed 004 folds its values one by one with the
online recurrence (two exp per value), the fused kernel takes the max of its values first
and sums against it (one exp per value).  Both are :func:`.softmax.online_state`, with
``block=1`` and ``block=len`` respectively, and agree to rounding.

:func:`combine_fma32` is the combiner as the GPU rounds it.  With FMA contraction (the
project's fast-math flags) ptxas receives ``ℓ = fma(ℓ_a, w_a, ℓ_b·w_b)``: the product of
the *first* side is kept exact inside the fused multiply-add, the second is rounded first.
So a ⊕ b and b ⊕ a — what two butterfly partners compute — can differ in the last bit.
"""

import numpy as np

from ..combine import IDENTITY, combine_np, weight_np

__all__ = ["halving_tree", "butterfly", "block_tree", "fma32", "combine_fma32"]

WARP = 32


def halving_tree(m, l, combine=combine_np):
    """Seed 004's shared-memory tree over the last axis (T slots, T a power of two):
    offset = T/2, …, 1, slot t ← slot t ⊕ slot t + offset for t < offset.  Returns slot
    0's state, which every thread of the block then reads."""
    m, l = np.array(m), np.array(l)
    slots = m.shape[-1]
    if slots < 1 or slots & (slots - 1):
        raise ValueError(f"the halving tree needs a power-of-two number of slots, got {slots} "
                         "(with any other count it silently drops slots)")
    offset = slots // 2
    while offset > 0:  # one level, then cute.arch.barrier()
        m[..., :offset], l[..., :offset] = combine(m[..., :offset], l[..., :offset],
                                                   m[..., offset : 2 * offset],
                                                   l[..., offset : 2 * offset])
        offset //= 2
    return m[..., 0], l[..., 0]


def butterfly(m, l, combine=combine_np):
    """One warp's ``shfl_xor_sync`` butterfly over the last axis (32 lanes): at offsets
    16, 8, 4, 2, 1 lane i merges its own state with lane i XOR offset's, in that order
    (own ⊕ partner's).  Returns every lane's state."""
    m, l = np.asarray(m), np.asarray(l)
    if m.shape[-1] != WARP:
        raise ValueError(f"a warp has {WARP} lanes, got {m.shape[-1]}")
    partner = np.arange(WARP)
    offset = WARP // 2
    while offset > 0:
        p = partner ^ offset
        m, l = combine(m, l, m[..., p], l[..., p])
        offset //= 2
    return m, l


def block_tree(m, l, combine=combine_np):
    """This project's ``block_combine`` over the last axis (T threads, a multiple of 32):
    the warp butterfly, lane 0 of each warp posting to 32 slots (the rest hold the
    identity), and the butterfly again over the slots.  Returns every thread's state."""
    m, l = np.asarray(m), np.asarray(l)
    threads = m.shape[-1]
    if threads % WARP or not WARP <= threads <= WARP * WARP:
        raise ValueError(f"a block is 1 to 32 whole warps, got {threads} threads")
    lead = m.shape[:-1]
    warps = threads // WARP
    wm, wl = butterfly(m.reshape(*lead, warps, WARP), l.reshape(*lead, warps, WARP), combine)
    slot_m = np.full((*lead, WARP), IDENTITY[0], dtype=wm.dtype)
    slot_l = np.full((*lead, WARP), IDENTITY[1], dtype=wl.dtype)
    slot_m[..., :warps], slot_l[..., :warps] = wm[..., 0], wl[..., 0]  # lane 0 posts
    bm, bl = butterfly(slot_m, slot_l, combine)  # every warp runs the same butterfly
    return np.tile(bm, warps), np.tile(bl, warps)  # thread t holds lane t % 32's result


def fma32(a, b, c):
    """float32 fused multiply-add a·b + c, rounded once.  Emulated in float64: the float32
    product is exact there, the sum is rounded to float64 and then to float32 (that double
    rounding can differ from a true FMA only in rare halfway cases)."""
    a, b, c = (np.asarray(v, dtype=np.float64) for v in (a, b, c))
    with np.errstate(invalid="ignore"):
        return (a * b + c).astype(np.float32)


def combine_fma32(m_a, l_a, m_b, l_b):
    """The combiner in float32 as compiled with FMA contraction: the same m and weights as
    :func:`numba_softmax.combine.combine_np`, and ℓ = fma(ℓ_a, w_a, ℓ_b·w_b)."""
    m_a, l_a = np.asarray(m_a, dtype=np.float32), np.asarray(l_a, dtype=np.float32)
    m_b, l_b = np.asarray(m_b, dtype=np.float32), np.asarray(l_b, dtype=np.float32)
    m = np.where((m_a > m_b) | np.isnan(m_a), m_a, m_b)
    w_a, w_b = weight_np(m_a, m), weight_np(m_b, m)
    return m, fma32(l_a, w_a, l_b * w_b)
