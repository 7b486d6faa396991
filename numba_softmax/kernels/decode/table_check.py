"""Checking a paged cache's block table where it lives.

A paged kernel (:mod:`.paged`, :mod:`.append`) reads K/V rows at block ``table[b, p //
block_size]``: a block id outside the pool, or a length beyond the table row, would be a
read (or, for append, a write) out of bounds.  So every call checks first that

    0 <= cache_seqlens[b]   and   cache_seqlens[b] + new_tokens <= max_blocks · block_size
    table[b, j] in 0 … num_blocks − 1 for each block j a used position falls in

(later entries are not read and may be anything, e.g. −1).

Copying a device table to the host to look at it would cost a synchronous copy of the
whole table and a Python loop over its rows on every call of a decode step that is
itself short.  Here the check is one small kernel on the caller's stream — one block
strides over the lengths and then over the table's entries, each finding lowers a shared
minimum (the first bad sequence, the first bad entry in C order) — and the host reads
back four numbers.  A paged decode queues its kernel right behind the check and reads
the numbers after it (:func:`launch`, then :func:`read`): the call waits once, for both.
:func:`numba_softmax.block_tables.tables` turns the numbers into a ``ValueError`` that names
the entry (and checks NumPy tables with NumPy).
"""

import functools
import threading

import numpy as np
from numba import cuda, int64

from ...runtime import driver, launcher, sim
from ..hw import jit

THREADS = 256
LOCK = threading.Lock()  # launch … read: the numbers' workspace is shared per stream
_HOST = {}  # (stream handle, context) -> (page-locked array, its address, the device's)


@functools.cache
def kernel():
    @jit.kernel
    def check(table, seqlens, n_blocks, block_size, new_tokens, found):
        """found ← (first bad b, its length, first bad flat entry b·W + j, its id); B and
        B·W mean none."""
        first = cuda.shared.array(2, int64)
        tid, step = cuda.threadIdx.x, cuda.blockDim.x
        n_b, width = table.shape[0], table.shape[1]
        if tid == 0:
            first[0], first[1] = n_b, n_b * width
        cuda.syncthreads()  # the sentinels are in place before any thread lowers them
        cap = int64(width) * block_size
        for b in range(tid, n_b, step):  # each length: non-negative, within its row
            n = int64(seqlens[b])
            if n < 0 or n + new_tokens > cap:
                cuda.atomic.min(first, 0, b)
        for f in range(tid, n_b * width, step):  # each entry a used position falls in
            b, j = f // width, f % width
            end = min(max(int64(seqlens[b]) + new_tokens, 0), cap)
            if j * block_size < end:
                blk = table[b, j]
                if blk < 0 or blk >= n_blocks:
                    cuda.atomic.min(first, 1, f)
        cuda.syncthreads()  # every thread's findings are in
        if tid == 0:
            b, f = first[0], first[1]
            found[0], found[2] = b, f
            found[1] = seqlens[b] if b < n_b else 0
            found[3] = table[f // width, f % width] if f < n_b * width else 0

    return check


def launch(table, lengths, num_blocks, block_size, new_tokens=0, stream=0):
    """Queue the check of device arrays ``table`` (B, W) and ``lengths`` (B,) on ``stream``
    (one block); its four numbers land in the stream's workspace for :func:`read`.  Hold
    :data:`LOCK` from here to the read: the workspace is one per stream."""
    threads = min(THREADS, launcher.device_limits().max_threads)
    found = launcher.scratch((4,), np.int64, stream, "table_check")
    launcher.launch(kernel(), 1, threads, stream,
                    (table, lengths, np.int64(num_blocks), np.int64(block_size),
                     np.int64(new_tokens), found))


def read(stream=0):
    """The four numbers of the last check queued on ``stream``: waits for the stream.  On
    a GPU one asynchronous copy into page-locked memory kept per (stream, context), then a
    wait for the stream: the driver's copy, without the new array and the device look-ups
    that Numba's ``copy_to_host`` adds to every call."""
    if sim.simulator_enabled() or driver.cu is None:
        host = launcher.scratch((4,), np.int64, stream, "table_check").copy_to_host(stream=stream)
        if stream:
            stream.synchronize()
        return tuple(int(v) for v in host)
    handle = int(stream) if stream else 0
    slot = (handle, driver.current_context())
    copy = _HOST.get(slot)
    if copy is None:  # (the workspace of four int64 never grows: its address stays)
        host = cuda.pinned_array(4, np.int64)
        found = launcher.scratch((4,), np.int64, stream, "table_check")
        copy = _HOST[slot] = (host, host.ctypes.data, found.__cuda_array_interface__["data"][0])
    host, dst, src = copy
    for err in (driver.cu.cuMemcpyDtoHAsync(dst, src, 32, handle)[0], driver.cu.cuStreamSynchronize(handle)[0]):
        if err != driver.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"reading the block table check back failed: {err!r}")
    return tuple(host.tolist())


def findings(table, lengths, num_blocks, block_size, new_tokens=0, stream=0):
    """(first bad b, its length, first bad flat entry, its id) of int32 device arrays
    ``table`` (B, W) and ``lengths`` (B,): :func:`launch`, then :func:`read`, under the
    lock.  (NumPy tables are checked with NumPy: :func:`numba_softmax.block_tables.table_findings`.)"""
    if table.shape[0] == 0:
        return 0, 0, 0, 0
    with LOCK:  # the four numbers live in a per-stream workspace: one check at a time
        launch(table, lengths, num_blocks, block_size, new_tokens, stream)
        return read(stream)
