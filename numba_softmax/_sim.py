"""What the CUDA simulator lacks, supplied only when it is on (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs each CUDA thread as a Python thread and has no warp shuffles.  The
kernels here call ``cuda.shfl_xor_sync`` (the butterfly in :mod:`.kernels.reduce`) and
``cuda.syncwarp`` (the attention kernel); under the simulator this module teaches the
fake ``cuda`` module those calls, so the *same* kernel source runs in both places.
Nothing here is used on a real GPU.

A shuffle is warp-synchronous: the 32 lanes of a warp exchange values together.  The
emulation gives each simulated warp two boards, used in turn, and a barrier: every lane
posts its value, the warp meets at the barrier, each lane reads its partner's value (the
next exchange posts on the other board).  Like the hardware's full-mask shuffle, it
needs every lane of the warp to take part (the kernels here use whole warps).
:func:`warp_exchange` is the same step for any warp-wide instruction: the tensor-core
emulation of :mod:`.kernels.mma` is built on it.
"""

import threading

WARP = 32


def simulator_enabled():
    """True when numba runs kernels on the CUDA simulator."""
    from numba.cuda.core import config

    return bool(config.ENABLE_CUDASIM)


_lock = threading.Lock()


class _Warp:
    """Two boards, used in turn, and one barrier: a lane may post to the next board while
    a slower one still reads the last, and cannot get round to this board again before
    every lane has passed the next barrier — one barrier round per exchange, not two."""

    def __init__(self, lanes):
        self.boards = ([None] * lanes, [None] * lanes)
        self.barrier = threading.Barrier(lanes)


def _warp_of(me):
    """The boards and barrier of the calling thread's warp (made on first use)."""
    warp = getattr(me, "_sim_warp", None)
    if warp is None:
        warp = me._sim_warp = _new_warp_of(me)
        me._sim_phase = 0
    return warp


def _new_warp_of(me):
    manager = me._manager
    warp = me.thread_id // WARP
    with _lock:
        warps = manager.__dict__.setdefault("_warps", {})
        if warp not in warps:
            block = 1
            for d in manager._block_dim:
                block *= d
            warps[warp] = _Warp(min(WARP, block - warp * WARP))
        return warps[warp]


def _post(me, value):
    """Post ``value`` on the warp's current board, meet the warp, return the board."""
    warp = _warp_of(me)
    board = warp.boards[me._sim_phase]
    me._sim_phase ^= 1
    board[me.thread_id % WARP] = value
    warp.barrier.wait()  # every lane has posted
    return board


def _shfl_xor_sync(self, mask, value, lane_mask):
    me = threading.current_thread()
    board = _post(me, value)
    partner = (me.thread_id % WARP) ^ lane_mask
    return board[partner] if partner < len(board) else value


def warp_exchange(value):
    """Every lane of the calling simulated warp posts ``value``; each gets back the list
    of all lanes' values (index = lane).  The building block of warp-level emulations
    (e.g. a matrix-multiply-accumulate whose operands are spread over the warp's lanes).
    Like a shuffle, every lane of the warp must take part."""
    return list(_post(threading.current_thread(), value))


def lane_id():
    """The calling simulated thread's lane in its warp."""
    return threading.current_thread().thread_id % WARP


def _syncwarp(self, mask=0xFFFFFFFF):
    """``cuda.syncwarp``: the lanes of the calling thread's warp meet (full mask only)."""
    _warp_of(threading.current_thread()).barrier.wait()


def _locked_shared_array(array):
    """The simulator finds a block's static shared array by the source line that declares
    it, with a look-up-then-insert that two threads can interleave: each then holds an
    array of its own.  The same look-up, under a lock: every thread gets the same array."""
    import sys

    import numpy as np

    def shared_array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic: one buffer, no look-up
            return array(self, shape, dtype, alignment)
        from numba.cuda import types
        from numba.cuda.np import numpy_support

        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with _lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    shared_array.locked = True
    return shared_array


def install():
    """Add the missing warp primitives to the simulator's fake ``cuda`` module (idempotent).

    Also shortens the interpreter's thread switch interval: the simulator's block
    manager polls in a busy loop, and with the default 5 ms interval every barrier
    round waits out one slice per simulated thread (measured: 5x slower).
    """
    import sys

    from numba.cuda.simulator.kernelapi import FakeCUDAModule, FakeCUDAShared

    sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
    if not hasattr(FakeCUDAModule, "shfl_xor_sync"):
        FakeCUDAModule.shfl_xor_sync = _shfl_xor_sync
    if not hasattr(FakeCUDAModule, "syncwarp"):
        FakeCUDAModule.syncwarp = _syncwarp
    if not getattr(FakeCUDAShared.array, "locked", False):
        FakeCUDAShared.array = _locked_shared_array(FakeCUDAShared.array)
