"""hb2's ring (:mod:`.hopper_backward_ws`, :mod:`.hopper_backward_dq`): what both of its
kernels share — the block's shape, the barriers' slots, their set-up and the shared memory.

A block is one consumer warpgroup (128 threads) and one producer warp after it.  The
producer loads tiles by TMA into ``STAGES`` stages; the consumer reads them::

    full[s]    the producer's expect + the tile's bytes: stage s has landed
    empty[s]   128 arrivals: the consumer's products have read stage s
    once       the stationary tiles' bytes (K_j, V_j or Q_i, dO_i)
    ds         128 arrivals: every consumer thread has written its part of a tile's dSᵀ
               (the fused dK/dV/dQ kernel only)

Every pair of tiles goes in by :func:`pair_loader`: D columns, then Dv columns after them.

The n-th use of stage s completes phase n mod 2 of full[s] and empty[s], as in the
forward (:mod:`..attention.hopper_ws`); the n-th tile completes phase n mod 2 of ds.
"""

import functools

from numba import cuda

from ..hw import jit, tma

STAGES = 2
WG = 128  # the consumer warpgroup; the producer is the warp after it
THREADS = WG + 32
CHUNK = 64 * 64  # uint16 values in one 64-wide swizzled box of 64 rows
FULL_0, EMPTY_0, ONCE, DS = 0, STAGES, 2 * STAGES, 2 * STAGES + 1  # the barriers' slots
N_BARS = 2 * STAGES + 2


@jit.device
def barriers(bar, tid):
    """Thread 0 sets up every barrier; then every thread passes a block barrier, so none
    arrives on or waits for one before it exists."""
    if tid == 0:
        for st in range(STAGES):
            tma.mbarrier_init(bar, FULL_0 + st, 1)
            tma.mbarrier_init(bar, EMPTY_0 + st, WG)
        tma.mbarrier_init(bar, ONCE, 1)
        tma.mbarrier_init(bar, DS, WG)
    cuda.syncthreads()


@jit.device
def acquire(tq, tk, tv, tdo):
    """The four maps, written by the host through another proxy, made visible to TMA."""
    tma.tensormap_acquire(tq)
    tma.tensormap_acquire(tk)
    tma.tensormap_acquire(tv)
    tma.tensormap_acquire(tdo)


@functools.cache
def pair_loader(d, dv):
    """``load(smem, at, ta, tb, row, h, b, bar, slot)``: 64 rows from ``row`` of head h,
    batch b of ta (D columns) at smem[at] and of tb (Dv columns) right after it, as
    64-wide boxes, landing on barrier ``slot`` — a stationary pair or a stage's."""
    @jit.device
    def load(smem, at, ta, tb, row, h, b, bar, slot):
        for c in range(d // 64):
            tma.tma_load_4d(smem, at + c * CHUNK, ta, 64 * c, row, h, b, bar, slot)
        for c in range(dv // 64):
            tma.tma_load_4d(smem, at + 64 * d + c * CHUNK, tb, 64 * c, row, h, b, bar, slot)

    return load


def shared(d, dv):
    """Bytes of dynamic shared memory: the stationary pair and STAGES moving pairs, and
    room to align the first to 1024 bytes (the 128-byte swizzle's period)."""
    return 2 * 64 * (d + dv) * (1 + STAGES) + 1024
