"""Warp and block combine: many threads' (m, ℓ) states folded into one, on chip.

Every softmax kernel ends its first pass the same way: each thread holds the state of
the values it read, and the block needs the state of the whole row.  Because the
combiner is associative and commutative, the threads may fold in any tree; we use the
classic two-level one (NVIDIA's reduction samples, and the CuTe kernel of the sources):

1. *warp*: a butterfly of ``shfl_xor_sync`` — after log2(32) = 5 exchanges every lane of
   the warp holds the warp's state, with no shared memory and no barrier;
2. *block*: lane 0 of each warp posts its state in shared memory, and every warp folds
   the ≤ 32 posted states with one more butterfly, so every thread ends with the block's
   state (no broadcast step needed).

Blocks are whole warps (a multiple of 32 threads, at most 1024 = 32 warps).

:func:`team_combine` is the same tree for *teams*: groups of ``team`` consecutive
threads (a multiple of 32 that divides the block) that each fold their own row — a warp
per row needs the butterfly alone (no shared memory, no barrier); a team of several
warps folds just its own warps' posted states.
"""

import math

from numba import cuda

from ..hw import jit

from ...combine import combine_device

FULL_MASK = 0xFFFFFFFF
WARP = 32


@jit.device
def warp_combine_traced(m, l, trace, level):
    """Butterfly over the 32 lanes: every lane returns the warp's (m, ℓ).  ``trace``:
    None (compiled away), or a (levels, threads, 2) array that receives each thread's
    state after each exchange, at rows ``level``, ``level`` + 1, … (example 07)."""
    offset = WARP // 2
    while offset > 0:
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, offset)
        m, l = combine_device(m, l, m_other, l_other)
        if trace is not None:
            trace[level, cuda.threadIdx.x, 0] = m
            trace[level, cuda.threadIdx.x, 1] = l
            level += 1
        offset //= 2
    return m, l


@jit.device
def warp_combine(m, l):
    """Butterfly over the 32 lanes: every lane returns the warp's (m, ℓ)."""
    return warp_combine_traced(m, l, None, 0)


@jit.device
def block_combine(m, l, m_shared, l_shared):
    """Fold every thread's (m, ℓ) into the block's; every thread returns it.

    ``m_shared``/``l_shared``: shared arrays of 32 slots in the accumulation type.
    """
    tid = cuda.threadIdx.x
    warp, lane = tid // WARP, tid % WARP
    n_warps = cuda.blockDim.x // WARP
    m, l = warp_combine(m, l)
    if lane == 0:
        m_shared[warp] = m
        l_shared[warp] = l
    if n_warps <= tid < WARP:  # empty slots hold the identity (typed by the array)
        m_shared[tid] = -math.inf
        l_shared[tid] = 0.0
    cuda.syncthreads()  # all 32 slots are written before any warp reads them
    m, l = warp_combine(m_shared[lane], l_shared[lane])
    cuda.syncthreads()  # all reads are done before a later call writes the slots again
    return m, l


@jit.device
def team_combine_traced(m, l, m_slots, l_slots, team, trace):
    """:func:`team_combine`, writing each level's states to ``trace`` unless it is None
    (a traced twin of the same source: levels 0 = each thread's own state, 1–5 the warp
    butterfly, 6–10 the butterfly over the posted warp states)."""
    if trace is not None:
        trace[0, cuda.threadIdx.x, 0] = m
        trace[0, cuda.threadIdx.x, 1] = l
    m, l = warp_combine_traced(m, l, trace, 1)
    if team <= WARP:
        return m, l  # a warp per row: the butterfly was the whole tree
    tid = cuda.threadIdx.x
    warp, lane = jit.udivmod(tid, WARP)  # (unsigned: no sign fix-ups)
    if lane == 0:
        m_slots[warp] = m
        l_slots[warp] = l
    if tid < WARP:  # the identity (−inf, 0), typed by the array
        m_slots[WARP + tid] = -math.inf
        l_slots[WARP + tid] = 0.0
    cuda.syncthreads()  # every warp's state is posted before any team reads
    warps = team // WARP  # lane k < warps reads warp k of its team; the rest the identity
    k = warp - jit.udivmod(warp, warps)[1] + lane if lane < warps else WARP + lane
    m, l = warp_combine_traced(m_slots[k], l_slots[k], trace, 6)
    cuda.syncthreads()  # all reads are done before a later call writes the slots again
    return m, l


@jit.device
def team_combine(m, l, m_slots, l_slots, team):
    """Fold the (m, ℓ) of every team of ``team`` threads; every thread returns its team's.

    ``m_slots``/``l_slots``: shared arrays of 64 slots in the accumulation type — one
    per warp, and 32 holding the identity.  ``team`` is the same for the whole block, so
    either every thread meets at the barriers or none does.
    """
    return team_combine_traced(m, l, m_slots, l_slots, team, None)
