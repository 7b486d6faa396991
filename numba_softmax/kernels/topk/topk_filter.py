"""Top-k of long rows by a threshold filter: stream the row once, keep only what can win.

After a block has seen some of its row, its k-th best value so far, θ, is a bar every later
value must clear to matter — and few do: on a row in random order the i-th value clears
it with probability about k/i, so a row of n values offers about k·(1 + ln(n/k))
candidates in all (≈ 400 for k = 50, n = 128256), whatever the threads do.  So a block
streams its row (or its piece of one) chunk by chunk:

    stream     chunk by chunk, the next chunk's loads flying while this one is processed:
               u = x/T folded into the thread's (m, ℓ) by the combiner; the values that
               precede θ = (the k-th best value so far, its index) go into the warp's own
               segment of a shared buffer (a ballot, then each lane's rank among its
               warp's candidates: no atomics, the count a register of the warp); one
               barrier a chunk asks whether any warp's segment may not hold another chunk
    compact    if so (after the first chunk, when θ was −inf, always): the radix select
               (:mod:`.topk_select`, reading the buffer in place: the registers stay free
               for the loads in flight) keeps the buffer's k best, sorted, dealt back to
               the warps' segments in turn; θ becomes the k-th
    end        a last compaction; the block's (m, ℓ); the k winners written (a whole row)
               or the piece's state to the workspace for :func:`.topk_merge.merge_kernel`

A segment holds a chunk's worth of its warp's values and its share of the k best, so no
order of the values can overflow it; a row in random order offers ~k·ln(chunks) more
candidates after the first chunk and compacts a few times, an ascending row (each value
a candidate) after every chunk — still right, only slower.  Bytes: read N·b once; write
k(b + 8) per row (split: the workspace, S·(k + 2)·8).
NumPy twin: :func:`numba_softmax.reference.topk.softmax_topk`.
"""

import functools
import math

import numba
import numpy as np
from numba import cuda

from ...combine import EMPTY, combine_device, larger_device, precedes_device, weight_device
from ..hw import jit
from ..hw.jit import accumulator
from ..rows.reduce import block_combine
from .topk_select import MAX_K, radix_select, select_memory
from .topk_state import keep_piece, writer
from .topk_stream import loads
from ..hw.warp import ballot

WARP = 32


def chunk_values(dtype, width):
    """Values a thread loads per chunk: 8 (two 16-byte loads of float32, one of a 16-bit
    type; 16 were the slower), at least the vector width."""
    return max(8, width)


MAX_BUFFER_BYTES = 40 * 1024  # with the select's ~4.5 KB: under the 48 KB of static shared memory


def segment(warps, per_thread):
    """A warp's entries: its share of the k best and a chunk of its own values, rounded
    to whole rows of 32 (so the compaction's select reads seg/32 entries a thread)."""
    return WARP * (-(-MAX_K // (warps * WARP)) + per_thread)


def buffer_bytes(threads, per_thread, dtype):
    """Shared bytes of the buffer (value + int32 index an entry), a segment per warp."""
    warps = threads // WARP
    return warps * segment(warps, per_thread) * (np.dtype(str(accumulator(dtype))).itemsize + 4)


@functools.cache
def filter_kernel(dtype, threads, per_thread, width, log):
    """Block (row, s) streams x[row, s·piece : (s + 1)·piece]; with one piece a row it
    writes the row's k outputs, else the piece's state to the workspace."""
    acc = accumulator(dtype)
    fetch, value, held, slots_held, pad = loads(dtype, per_thread, width)  # 16-bit: in pairs
    span, warps = threads * per_thread, threads // WARP  # values a chunk; warps a block
    seg = segment(warps, per_thread)
    cap = warps * seg
    room = seg - WARP * per_thread  # a segment holding more than this may overflow next chunk
    select = radix_select(acc, seg // WARP, strided=True)  # cap = threads · seg/32 entries
    memory = select_memory(acc)
    write = writer(dtype, log)

    @jit.device
    def compact(bv, bi, count, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th, ti):
        """The k best of every segment's entries, sorted into sv/si, dealt back to the
        segments in turn (entry r to warp r mod warps); θ = the k-th.  Returns the calling
        warp's new count.  Every thread calls it; it ends with a barrier."""
        tid = cuda.threadIdx.x
        w = tid // WARP
        for q in range(w * seg + count + tid % WARP, (w + 1) * seg, WARP):
            bv[q], bi[q] = -math.inf, EMPTY  # a warp's unused slots: no entry
        select(bv, bi, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si)  # its barriers order this
        for r in range(tid, k, threads):
            bv[(r % warps) * seg + r // warps], bi[(r % warps) * seg + r // warps] = sv[r], si[r]
        if tid == 0:
            th[0], ti[0] = sv[k - 1], si[k - 1]
        cuda.syncthreads()  # the segments and θ are new before anyone reads or appends
        return (k - w + warps - 1) // warps

    @jit.kernel(launch_bounds=(threads, max(1, 512 // threads)))  # 128 registers: 512 threads an SM
    def filter_topk(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l, values, indices):
        hist, ctrl, cv, ci, sv, si, m_sh, l_sh = memory()
        bv = cuda.shared.array(cap, acc)
        bi = cuda.shared.array(cap, numba.int32)
        th = cuda.shared.array(1, acc)  # θ: the k-th best value so far …
        ti = cuda.shared.array(1, numba.int32)  # … and its index
        row, s, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        lane, w = numba.uint32(tid % WARP), tid // WARP
        below = (numba.uint32(1) << lane) - numba.uint32(1)  # the lanes before this one
        start = s * piece
        stop = min(start + piece, x.shape[1])
        ahead = cuda.local.array(slots_held, held)
        u = cuda.local.array(per_thread, acc)
        fetch(x, row, start, stop, tid, threads, ahead, pad)  # the first chunk's loads
        if tid == 0:  # θ = (−inf, EMPTY): before the first compaction every value is a candidate
            th[0], ti[0] = -math.inf, EMPTY
        m, l, count = acc(-math.inf), acc(0.0), 0
        cuda.syncthreads()  # θ is set before anyone reads it
        for base in range(start, stop, span):
            # u = x / T, then the next chunk's loads are issued: in flight meanwhile
            mc = acc(-math.inf)
            for c in range(per_thread):
                jc = base + (tid + (c // width) * threads) * width + c % width
                u[c] = value(ahead, c) * inv_t if jc < stop else acc(-math.inf)
                mc = larger_device(mc, u[c])
            fetch(x, row, base + span, stop, tid, threads, ahead, pad)
            # the chunk's (m, ℓ), folded into the thread's by the combiner
            lc = acc(0.0)
            for c in range(per_thread):
                lc += weight_device(u[c], mc)
            m, l = combine_device(m, l, mc, lc)
            # filter: the values that precede θ join the warp's segment
            tv, tj = th[0], ti[0]
            for c in range(per_thread):
                jc = base + (tid + (c // width) * threads) * width + c % width
                keep = jc < stop and precedes_device(u[c], jc, tv, tj)
                votes = ballot(keep)
                if keep:
                    q = w * seg + count + cuda.popc(votes & below)
                    bv[q], bi[q] = u[c], jc
                count += cuda.popc(votes)
            # every warp's candidates are in; compact if a segment may not hold the next chunk
            if cuda.syncthreads_or(numba.int32(count > room)):
                count = compact(bv, bi, count, stop - 1, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th, ti)
        compact(bv, bi, count, stop - 1, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th, ti)
        m, l = block_combine(m, l, m_sh, l_sh)  # the piece's (m, ℓ)
        if ws_m.shape[1] == 1:  # the whole row: its k outputs
            write(values, indices, row, sv, si, 0, k, m, l, tid, threads)
            return
        keep_piece(ws_v, ws_i, ws_m, ws_l, row, s, sv, si, k, m, l, tid, threads)

    return filter_topk
