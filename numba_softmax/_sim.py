"""What the CUDA simulator lacks, supplied only when it is on (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs each CUDA thread as a Python thread and has no warp shuffles.  The
kernels here call ``cuda.shfl_xor_sync`` (the butterfly in :mod:`.kernels.reduce`); under
the simulator this module teaches the fake ``cuda`` module that call, so the *same*
kernel source runs in both places.  Nothing here is used on a real GPU.

The emulation assumes what every kernel in this package guarantees: all threads of the
block reach a shuffle together with a full mask (blocks are whole warps).  Each thread
posts its value on a per-block board, the block meets at a barrier, each thread reads
its partner's value, and the block meets again before the board is reused.
"""

import threading



def _shfl_xor_sync(self, mask, value, lane_mask):
    me = threading.current_thread()
    board = me._manager.__dict__.setdefault("_shfl_board", {})
    board[me.thread_id] = value
    me.syncthreads()  # every lane has posted its value
    partner = me.thread_id ^ lane_mask  # lane_mask < 32: the partner is in the same warp
    result = board.get(partner, value)
    me.syncthreads()  # every lane has read before anyone posts the next value
    return result


def install():
    """Add the missing warp primitives to the simulator's fake ``cuda`` module (idempotent)."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    if not hasattr(FakeCUDAModule, "shfl_xor_sync"):
        FakeCUDAModule.shfl_xor_sync = _shfl_xor_sync
