"""Warp votes and shuffles from any lane: what a warp-wide top-k list needs.

:mod:`.reduce` folds (m, ℓ) with butterflies (``shfl_xor_sync``); a top-k list kept across
the 32 lanes of a warp (:mod:`.topk_state`) needs two more primitives:

    ballot(p)            the 32 lanes' predicates as the bits of one unsigned word (lane
                         i → bit i; numba's own ``ballot_sync`` is signed)
    shfl(v, src)         every lane receives lane ``src``'s v
    shfl2(a, b, src)     two values from the same lane (one exchange on the simulator)
    peers(v)             the lanes whose v equals this lane's, as bits (``match.any``):
                         lanes adding to one shared counter add once, by their lowest lane

All lanes of the warp must call them together (full mask; whole warps).  The CUDA
simulator has none of them: under it the same names are emulations on the simulated
warp's barrier (:mod:`numba_softmax.runtime.sim`), used only there; the kernels' source is the
same.
"""

import numba
from numba import cuda

from ...runtime.sim import simulator_enabled
from . import jit

FULL_MASK = 0xFFFFFFFF
WARP = 32

if simulator_enabled():
    # one board and one round counter a warp for every kind of exchange: this module's,
    # the butterfly's ``shfl_xor_sync`` and the mma emulation's all take turns on
    # :func:`numba_softmax.runtime.sim.warp_exchange` (two counters of their own could let a
    # lane read a board another kind of exchange was still writing)
    from ...runtime.sim import warp_exchange as _exchange

    def ballot(p):
        word = 0
        for lane, bit in enumerate(_exchange(bool(p))):
            if bit:
                word |= 1 << lane
        return word

    def shfl(v, src):
        return _exchange(v)[src]

    def shfl2(a, b, src):
        return _exchange((a, b))[src]

    def peers(v):
        word = 0
        for lane, other in enumerate(_exchange(v)):
            if other == v:
                word |= 1 << lane
        return word

else:

    @jit.device
    def ballot(p):
        # numba's ballot_sync returns a *signed* int32: lane 31's vote would make it
        # negative, and widened to int64 (as ``mask &= mask - 1`` does) it would grow 32
        # more set bits.  The word of bits is unsigned.
        return numba.uint32(cuda.ballot_sync(FULL_MASK, p))

    @jit.device
    def shfl(v, src):
        return cuda.shfl_sync(FULL_MASK, v, src)

    @jit.device
    def shfl2(a, b, src):
        return cuda.shfl_sync(FULL_MASK, a, src), cuda.shfl_sync(FULL_MASK, b, src)

    @jit.device
    def peers(v):
        return numba.uint32(cuda.match_any_sync(FULL_MASK, numba.int32(v)))
