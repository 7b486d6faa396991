"""Top-k of long rows by a threshold filter: stream the row once, keep only what can win.

After a block has seen some of its row, its k-th best value so far, θ, is a bar every later
value must clear to matter — and few do: on a row in random order the i-th value clears
it with probability about k/i, so a row of n values offers about k·(1 + ln(n/k))
candidates in all (≈ 400 for k = 50, n = 128256), whatever the threads do.  So a block
streams its row (or its piece of one) chunk by chunk:

    first      each thread loads its values of the first chunk (W-wide loads); u = x/T
               folded into the thread's (m, ℓ); the radix select (:mod:`.topk_select`)
               picks the chunk's k best straight from the registers: θ = (the k-th best
               value, its index) is set before any buffer is used
    stream     chunk by chunk, the next chunk's loads flying while this one is processed:
               the values that precede θ go into the warp's own segment of a shared
               buffer (a ballot, then each lane's rank among its warp's candidates: no
               atomics, the count a register of the warp); one barrier a chunk asks
               whether any warp's segment may not hold another chunk
    compact    if so: the radix select keeps the buffer's k best, sorted, dealt back to
               the warps' segments in turn; θ becomes the k-th
    end        a last compaction; the block's (m, ℓ); the k winners written (a whole row)
               or the piece's state to the workspace for :func:`.topk_select.merge_kernel`

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

from ..combine import EMPTY, combine_device, larger_device, precedes_device, weight_device
from . import jit, vector
from .jit import accumulator
from .reduce import block_combine
from .topk_select import MAX_K, radix_select, select_memory
from .topk_state import writer
from .warp import ballot

WARP = 32


def chunk_values(dtype, width):
    """Values a thread loads per chunk: 16 (four 16-byte loads of float32, two of a 16-bit
    type), 8 for float64."""
    return max(8 if accumulator(dtype) == numba.float64 else 16, width)


MAX_BUFFER_BYTES = 40 * 1024  # with the select's ~4.5 KB: under the 48 KB of static shared memory


def buffer_bytes(threads, per_thread, dtype):
    """Shared bytes of the buffer: a chunk and the k best (value + int32 index each), in
    one segment per warp."""
    warps = threads // WARP
    return warps * segment(warps, per_thread) * (np.dtype(str(accumulator(dtype))).itemsize + 4)


def segment(warps, per_thread):
    """A warp's entries: its share of the k best and a chunk of its own values."""
    return -(-MAX_K // warps) + WARP * per_thread


@functools.cache
def filter_kernel(dtype, threads, per_thread, width, log):
    """Block (row, s) streams x[row, s·piece : (s + 1)·piece]; with one piece a row it
    writes the row's k outputs, else the piece's state to the workspace."""
    acc = accumulator(dtype)
    bf16 = jit.storage(dtype) == jit.BFLOAT16
    stored = numba.uint16 if bf16 else numba.from_dtype(np.dtype(dtype))
    load = jit.loader(dtype)
    load_row, _ = vector.raw_row_io(width)
    span, warps = threads * per_thread, threads // WARP  # values a chunk; warps a block
    seg = segment(warps, per_thread)
    cap = warps * seg
    per_select = -(-cap // threads)  # buffer entries a thread holds while compacting
    select_first = radix_select(acc, per_thread)
    select = radix_select(acc, per_select)
    memory = select_memory(acc)
    write = writer(dtype, log)

    @jit.device
    def deal(bv, bi, sv, si, k, th, ti):
        """The sorted k best dealt to the warps' segments in turn (entry r to warp r mod
        warps); θ = the k-th.  Returns the calling warp's count.  Ends with a barrier."""
        tid = cuda.threadIdx.x
        for r in range(tid, k, threads):
            w = r % warps
            bv[w * seg + r // warps], bi[w * seg + r // warps] = sv[r], si[r]
        if tid == 0:
            th[0], ti[0] = sv[k - 1], si[k - 1]
        cuda.syncthreads()  # the segments and θ are new before anyone reads or appends
        w = tid // WARP
        return (k - w + warps - 1) // warps

    @jit.device
    def next_chunk(x, row, base, stop, ahead, raw, u, inv_t):
        """u = this chunk's values / T (−inf past the end) from ``ahead``, whose loads
        are then issued for the next chunk; returns the chunk's (m, ℓ) of this thread."""
        tid = cuda.threadIdx.x
        for c in range(per_thread):
            raw[c] = ahead[c]
        for i in range(per_thread // width):  # the next chunk's loads: in flight meanwhile
            load_row(x, row, base + span + (tid + i * threads) * width, stop, ahead,
                     i * width, stored(0))
        mc = acc(-math.inf)
        for c in range(per_thread):
            jc = base + (tid + (c // width) * threads) * width + c % width
            u[c] = load(raw[c]) * inv_t if jc < stop else acc(-math.inf)
            mc = larger_device(mc, u[c])
        lc = acc(0.0)
        for c in range(per_thread):
            lc += weight_device(u[c], mc)
        return mc, lc

    @jit.device
    def compact(bv, bi, count, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th, ti):
        """The k best of every segment's entries, sorted into sv/si and dealt back."""
        tid = cuda.threadIdx.x
        counts = cuda.shared.array(32, numba.int32)
        if tid % WARP == 0:
            counts[tid // WARP] = count
        cuda.syncthreads()  # every warp's count is posted before any entry is read
        uu = cuda.local.array(per_select, acc)
        jj = cuda.local.array(per_select, numba.int32)
        for c in range(per_select):
            q = tid + c * threads
            w = q // seg
            if q < cap and q - w * seg < counts[w]:
                uu[c], jj[c] = bv[q], bi[q]
            else:
                uu[c], jj[c] = acc(-math.inf), EMPTY
        select(uu, jj, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si)  # ends with a barrier
        return deal(bv, bi, sv, si, k, th, ti)

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
        top = stop - 1
        raw = cuda.local.array(per_thread, stored)
        ahead = cuda.local.array(per_thread, stored)
        u = cuda.local.array(per_thread, acc)
        j = cuda.local.array(per_thread, numba.int32)
        for i in range(per_thread // width):  # the first chunk's loads
            load_row(x, row, start + (tid + i * threads) * width, stop, ahead, i * width, stored(0))
        # first chunk: (m, ℓ), and its k best selected from the registers → θ
        m, l = next_chunk(x, row, start, stop, ahead, raw, u, inv_t)
        for c in range(per_thread):
            jc = start + (tid + (c // width) * threads) * width + c % width
            j[c] = jc if jc < stop else EMPTY
        select_first(u, j, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si)
        count = deal(bv, bi, sv, si, k, th, ti)
        for base in range(start + span, stop, span):
            mc, lc = next_chunk(x, row, base, stop, ahead, raw, u, inv_t)
            m, l = combine_device(m, l, mc, lc)  # the thread's (m, ℓ), folded on
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
            if cuda.syncthreads_or(numba.int32(count > seg - WARP * per_thread)):
                count = compact(bv, bi, count, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th, ti)
        count = compact(bv, bi, count, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si, th, ti)
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
