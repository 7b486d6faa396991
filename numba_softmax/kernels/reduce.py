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
"""

import math

from numba import cuda

from . import jit

from ..combine import combine_device

FULL_MASK = 0xFFFFFFFF
WARP = 32


@jit.device
def warp_combine(m, l):
    """Butterfly over the 32 lanes: every lane returns the warp's (m, ℓ)."""
    offset = WARP // 2
    while offset > 0:
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, offset)
        m, l = combine_device(m, l, m_other, l_other)
        offset //= 2
    return m, l


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
