"""What the CUDA simulator lacks, supplied only when it is on (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs each CUDA thread as a Python thread, one block after another, and has
no warp shuffles.  The kernels here call ``cuda.shfl_xor_sync`` (the butterfly in
:mod:`.kernels.rows.reduce`), ``cuda.syncwarp`` (the attention kernel) and ``cuda.nanosleep``
(the group barrier), and one kernel (:mod:`.kernels.softmax.group`) has blocks that wait for each
other; under the simulator this module teaches the fake ``cuda`` module those things, so
the *same* kernel source runs in both places.  Nothing here is used on a real GPU.

**Shuffles.**  A shuffle is warp-synchronous: the 32 lanes of a warp exchange values
together.  The emulation gives each simulated warp a barrier and two boards: every lane
posts its value on the board of this round, the warp meets at the barrier, and each lane
reads its partner's value.  Rounds alternate between the boards: a lane can post on a
board again only after the *next* barrier, which the slowest reader of that board
reaches only once it has read — one barrier per shuffle, not two.  Like the hardware's
full-mask shuffle, it needs every lane of the warp to take part (the kernels here use
whole warps).  A lane that has returned no longer counts; a lane that raises (the
simulator raises where a GPU gives inf or NaN) fails the launch with its error, and its
warp's waiting lanes are released (:func:`lane_done`) — a fuzz case once hung CI there.

**Blocks, and cooperative grids**: :mod:`.sim_blocks` — how the simulator runs a
block (barriers instead of a polling loop), a cooperative kernel's blocks all at once
(:func:`cooperative` marks one), and device-function calls without a lock each.
"""

import threading

from .sim_blocks import Barrier, cooperative

__all__ = ["simulator_enabled", "cooperative", "warp_exchange", "lane_id", "install"]

WARP = 32


_SIM = []


def simulator_enabled():
    """True when numba runs kernels on the CUDA simulator (fixed when numba is imported,
    so asked once: the launch-plan path calls this on every call)."""
    if not _SIM:
        from numba.cuda.core import config

        _SIM.append(bool(config.ENABLE_CUDASIM))
    return _SIM[0]


_lock = threading.Lock()


# --- warp shuffles --------------------------------------------------------------------
class _Warp:
    """Two boards, used in turn, and one barrier: a lane may post to the next board while
    a slower one still reads the last, and cannot get round to this board again before
    every lane has passed the next barrier — one barrier round per exchange, not two."""

    def __init__(self, lanes):
        self.boards = ([None] * lanes, [None] * lanes)
        self.barrier = Barrier(lanes)


def _warp_of(me):
    """The boards and barrier of the calling thread's warp (made on first use, without
    the lanes that have already returned)."""
    manager = me._manager
    warp = me.thread_id // WARP
    with _lock:
        warps = manager.__dict__.setdefault("_warps", {})
        if warp not in warps:
            block = 1
            for d in manager._block_dim:
                block *= d
            gone = manager.__dict__.get("_ns_gone", {}).get(warp, 0)
            warps[warp] = _Warp(min(WARP, block - warp * WARP) - gone)
            if manager.__dict__.get("_ns_failed"):
                warps[warp].barrier.broken = True
        return warps[warp]


def lane_done(me, failed):
    """A simulated thread has returned (``failed``: with an exception).  Its warp's
    barrier counts it no more; after a failure every warp's barrier releases its waiters
    with an error — so a lane that raised (the simulator raises where a GPU computes an
    inf or a NaN: ``math.log(0.0)``, an overflowing ``math.exp``) surfaces as that error,
    not as its warp waiting for it forever."""
    manager = me._manager
    warp = me.thread_id // WARP
    with _lock:
        warps = manager.__dict__.setdefault("_warps", {})
        gone = manager.__dict__.setdefault("_ns_gone", {})
        gone[warp] = gone.get(warp, 0) + 1
        if failed:
            manager._ns_failed = True
        mine, everyone = warps.get(warp), list(warps.values())
    if failed:
        for w in everyone:
            w.barrier.abort()
    elif mine is not None:
        mine.barrier.leave()


def _exchange(value):
    """Post ``value`` on this round's board, meet the warp, return the board."""
    me = threading.current_thread()
    warp = _warp_of(me)
    rnd = me.__dict__.get("_ns_round", 0)
    me._ns_round = rnd + 1
    board = warp.boards[rnd % 2]
    board[me.thread_id % WARP] = value
    warp.barrier.wait()  # every lane has posted this round's value
    return board


def _shfl_xor_sync(self, mask, value, lane_mask):
    board = _exchange(value)
    partner = (threading.current_thread().thread_id % WARP) ^ lane_mask
    return board[partner] if partner < len(board) else value


def warp_exchange(value):
    """Every lane of the calling simulated warp posts ``value``; each gets back the list
    of all lanes' values (index = lane).  The building block of warp-level emulations
    (e.g. a matrix-multiply-accumulate whose operands are spread over the warp's lanes).
    Like a shuffle, every lane of the warp must take part."""
    return list(_exchange(value))


def lane_id():
    """The calling simulated thread's lane in its warp."""
    return threading.current_thread().thread_id % WARP


def _syncwarp(self, mask=0xFFFFFFFF):
    """``cuda.syncwarp``: the lanes of the calling thread's warp meet (full mask only)."""
    _warp_of(threading.current_thread()).barrier.wait()


def install():
    """Add the missing primitives to the simulator's fake ``cuda`` module and run its
    blocks as :mod:`.sim_blocks` does (idempotent).

    Also shortens the interpreter's thread switch interval, so that a thread spinning
    in a Python loop (a kernel waiting on a counter) gives way within 0.5 ms.
    """
    import sys

    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    from . import sim_blocks

    sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
    FakeCUDAModule.shfl_xor_sync = _shfl_xor_sync
    FakeCUDAModule.syncwarp = _syncwarp
    sim_blocks.install()
