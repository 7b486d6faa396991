"""Top-k of long rows by a threshold filter: stream the row once, keep only what can win.

After a block has seen some of its row, its k-th best value so far, θ, is a bar every later
value must clear to matter — and few do: on a row in random order the i-th value clears
it with probability about k/i, so a row of n values offers about k·(1 + ln(n/k))
candidates in all (≈ 400 for k = 50, n = 128256), whatever the threads do.  So a block
streams its row (or its piece of one) chunk by chunk:

    stream     each thread loads its values of the next chunk (W-wide loads, one chunk
               ahead, so the loads of chunk c + 1 fly while chunk c is processed); u = x/T
               folded into the thread's (m, ℓ) by the combiner
    filter     a value that precedes θ = (the k-th best value, its index) goes into a
               shared buffer; a warp's candidates take their slots with one atomic
               (a ballot, then each lane's rank among the warp's)
    compact    when the buffer may not hold another chunk: the radix select
               (:mod:`.topk_select`) keeps its k best, sorted; θ becomes the k-th
    end        a last compaction; the block's (m, ℓ); the k winners written (a whole row)
               or the piece's state to the workspace for :func:`.topk_select.merge_kernel`

The buffer holds two chunks and the k best, so the first compaction comes after two
chunks, and a random row needs no other before the end: the work per value is a load, an
exp and one comparison, and the kernel runs at the speed of its loads.  An adversarial
row (ascending values: each one is a candidate) compacts after every chunk and is still
right.  Bytes: read N·b once; write k(b + 8) per row (split: the workspace, S·(k + 2)·8).
NumPy twin: :func:`numba_softmax.reference.topk.softmax_topk`.
"""

import functools
import math

import numba
import numpy as np
from numba import cuda

from ..combine import EMPTY, combine_device, larger_device, precedes_device, weight_device
from . import jit, vector
from .jit import accumulator
from .reduce import block_combine
from .topk_select import MAX_K, radix_select, select_memory
from .topk_state import writer
from .warp import ballot, shfl

WARP = 32


def chunk_values(dtype, width):
    """Values a thread loads per chunk: 8 (two 16-byte loads of float32, one of a 16-bit
    type), 4 for float64 — the buffer of 2 chunks + k stays under 48 KB of shared memory."""
    return max(4 if accumulator(dtype) == numba.float64 else 8, width)


def capacity(threads, per_thread):
    """Buffer entries: two chunks and the k best."""
    return MAX_K + 2 * threads * per_thread


@functools.cache
def filter_kernel(dtype, threads, per_thread, width, log):
    """Block (row, s) streams x[row, s·piece : (s + 1)·piece]; with one piece a row it
    writes the row's k outputs, else the piece's state to the workspace."""
    acc = accumulator(dtype)
    bf16 = jit.storage(dtype) == jit.BFLOAT16
    stored = numba.uint16 if bf16 else numba.from_dtype(np.dtype(dtype))
    load = jit.loader(dtype)
    load_row, _ = vector.raw_row_io(width)
    chunk = threads * per_thread
    cap = capacity(threads, per_thread)
    per_select = -(-cap // threads)  # buffer entries a thread holds while compacting
    select = radix_select(acc, per_select)
    memory = select_memory(acc)
    write = writer(dtype, log)

    @jit.device
    def compact(bv, bi, shared, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th_v):
        """The buffer's k best, sorted, back into it; θ = the k-th (every thread calls)."""
        tid = cuda.threadIdx.x
        u = cuda.local.array(per_select, acc)
        j = cuda.local.array(per_select, numba.int32)
        count = shared[0]
        for c in range(per_select):
            q = tid + c * threads
            u[c], j[c] = (bv[q], bi[q]) if q < count else (acc(-math.inf), EMPTY)
        select(u, j, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si)  # ends with a barrier
        for r in range(tid, k, threads):
            bv[r], bi[r] = sv[r], si[r]
        if tid == 0:
            shared[0], shared[1] = k, si[k - 1]
            th_v[0] = sv[k - 1]
        cuda.syncthreads()  # the buffer, its count and θ are new before anyone appends

    @jit.kernel(launch_bounds=(threads, max(1, 512 // threads)))  # 128 registers: 512 threads an SM
    def filter_topk(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l, values, indices):
        hist, ctrl, cv, ci, sv, si, m_sh, l_sh = memory()
        bv = cuda.shared.array(cap, acc)
        bi = cuda.shared.array(cap, numba.int32)
        shared = cuda.shared.array(2, numba.int32)  # the buffer's count; θ's index
        th_v = cuda.shared.array(1, acc)  # θ's value
        row, s, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        lane = numba.uint32(tid % WARP)
        below = (numba.uint32(1) << lane) - numba.uint32(1)  # the lanes before this one
        start = s * piece
        stop = min(start + piece, x.shape[1])
        if tid == 0:  # an empty buffer; θ = (−inf, EMPTY): everything is a candidate
            shared[0], shared[1] = 0, EMPTY
            th_v[0] = -math.inf
        raw = cuda.local.array(per_thread, stored)
        ahead = cuda.local.array(per_thread, stored)
        u = cuda.local.array(per_thread, acc)
        for i in range(per_thread // width):  # the first chunk's loads
            load_row(x, row, start + (tid + i * threads) * width, stop, ahead, i * width, stored(0))
        m, l = acc(-math.inf), acc(0.0)
        cuda.syncthreads()  # the empty buffer and θ are set before the first append
        for base in range(start, stop, chunk):
            for c in range(per_thread):  # this chunk's values; the next chunk's loads fly
                raw[c] = ahead[c]
            for i in range(per_thread // width):
                load_row(x, row, base + chunk + (tid + i * threads) * width, stop, ahead,
                         i * width, stored(0))
            # u = x / T; the chunk's (m, ℓ) folded into the thread's by the combiner
            mc = acc(-math.inf)
            for c in range(per_thread):
                jc = base + (tid + (c // width) * threads) * width + c % width
                u[c] = load(raw[c]) * inv_t if jc < stop else acc(-math.inf)
                mc = larger_device(mc, u[c])
            lc = acc(0.0)
            for c in range(per_thread):
                lc += weight_device(u[c], mc)
            m, l = combine_device(m, l, mc, lc)
            # filter: the values that precede θ go into the buffer, a warp's at once
            tv, ti = th_v[0], shared[1]
            for c in range(per_thread):
                jc = base + (tid + (c // width) * threads) * width + c % width
                keep = jc < stop and precedes_device(u[c], jc, tv, ti)
                votes = ballot(keep)
                first = 0
                if lane == 0 and votes != 0:
                    first = cuda.atomic.add(shared, 0, cuda.popc(votes))
                first = shfl(first, 0)  # the warp's first slot
                if keep:
                    q = first + cuda.popc(votes & below)
                    bv[q], bi[q] = u[c], jc
            cuda.syncthreads()  # the chunk's candidates are in before the count is read
            full = shared[0] > cap - chunk  # the next chunk might not fit
            cuda.syncthreads()  # every thread has read the count before the next chunk adds
            if full:
                compact(bv, bi, shared, stop - 1, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th_v)
        compact(bv, bi, shared, stop - 1, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th_v)
        m, l = block_combine(m, l, m_sh, l_sh)  # the piece's (m, ℓ)
        if ws_m.shape[1] == 1:  # the whole row: its k outputs
            write(values, indices, row, sv, si, 0, k, m, l, tid, threads)
            return
        for r in range(tid, k, threads):
            ws_v[row, s, r] = sv[r]
            ws_i[row, s, r] = si[r]
        if tid == 0:
            ws_m[row, s] = m
            ws_l[row, s] = l

    return filter_topk
