"""The split path's kernel 2 for the radix and filter splits: a row's S piece lists merged.

Each piece left its k best in the workspace, sorted best first.  The row's k best are the
k best of those S·k entries — but most of them cannot be among the k best, and a bound
says which: take the first r = ⌈k/S⌉ entries of every list (S·r ≥ k entries of the
union); their k-th best, b, ranks no better than the union's k-th, so only entries that
rank at or before b are candidates.  For logits spread over the pieces that is k to 2k
entries, not S·k (N(0, 1) logits, V 128256 in 63 pieces: ~97 of 3150 at k 50, ~151 of
8064 at k 128; a host count of twenty rows):

    bound    the S·r heads to shared memory; each counts the heads that precede it
             (:func:`numba_softmax.combine.precedes`); the one of rank k − 1 is b
    gather   every entry that b does not precede, into shared memory (an atomic counter)
    rank     each gathered entry's place = how many gathered entries precede it: the
             sorted list, as :mod:`.topk_select`'s gather ends

If more than ``cap`` entries are gathered — a row whose best values crowd into a few
pieces — or the heads pass :data:`HEADS` (S > 512 pieces), the block selects from all
S·k by radix instead (:func:`.topk_select.radix_select`, a cost that does not depend on
how the values fall).  With fewer than k real heads there is no b: every real entry is
gathered (so fewer than k are left only in a row of NaN, which is written as NaN).  The S (m, ℓ) are folded by the
combiner, and :func:`.topk_state.writer` writes the row.  Bytes: the workspace S·(k + 2)·8
read, k(b + 8) written.  NumPy twin: :func:`numba_softmax.reference.topk.softmax_topk`.
"""

import functools
import math

import numba
from numba import cuda

from ...combine import EMPTY, combine_device, precedes_device
from ..hw import jit
from ..hw.jit import accumulator
from ..rows.reduce import block_combine
from .topk_select import preceding, radix_select, select_memory
from .topk_state import writer

CAP = 1024  # gathered entries ranked by counting (8 KB of shared memory, 12 for float64)
HEADS = 512  # the bound's heads, S·⌈k/S⌉ < k + S (more: by radix)


@functools.cache
def row_merger(dtype, per_thread, threads, log, cap=CAP, most_heads=HEADS):
    """Device function ``merge_row(ws_v, ws_i, ws_m, ws_l, row, k, n, idx_bytes, values,
    indices, mem)``: the calling block (``threads`` threads) merges row ``row``'s S piece
    lists (S·k ≤ threads·per_thread entries), folds the S (m, ℓ), and writes the row —
    kernel 2, or the last piece of kernel 1 to finish (:func:`.topk_select.piece_kernel`).
    ``mem``: the kernel's :func:`.topk_select.select_memory` arrays (taken once a kernel:
    a shared array's symbol linked in twice does not link)."""
    acc = accumulator(dtype)
    select = radix_select(acc, per_thread)
    write = writer(dtype, log)

    @jit.device
    def merge_row(ws_v, ws_i, ws_m, ws_l, row, k, n, idx_bytes, values, indices, mem):
        hist, ctrl, cv, ci, sv, si, m_sh, l_sh = mem
        hv = cuda.shared.array(most_heads, acc)
        hi = cuda.shared.array(most_heads, numba.int32)
        gv = cuda.shared.array(cap, acc)
        gi = cuda.shared.array(cap, numba.int32)
        bound_v = cuda.shared.array(1, acc)
        bound_i = cuda.shared.array(2, numba.int32)  # b's index; the gather's counter
        tid = cuda.threadIdx.x
        pieces = ws_m.shape[1]
        r = -(-k // pieces)
        heads = pieces * r
        u = cuda.local.array(per_thread, acc)
        j = cuda.local.array(per_thread, numba.int32)
        # The row's S lists, read as one flat run of S·k: entry tid + c·threads is list s,
        # place t — stepped by additions, not found by a division an entry (a 64-bit
        # division is ~40 instructions, and at B 1 this one block's instructions are the
        # time), unsigned (a signed index adds negative-index arithmetic to every load)
        w, kk, most = numba.uint32(row), numba.uint32(k), numba.uint32(pieces)
        s, t = numba.uint32(tid) // kk, numba.uint32(tid) % kk
        ds, dt = numba.uint32(threads) // kk, numba.uint32(threads) % kk
        for c in range(per_thread):
            if s < most:
                u[c], j[c] = ws_v[w, s, t], ws_i[w, s, t]
            else:
                u[c], j[c] = -math.inf, EMPTY
            s, t = s + ds, t + dt
            if t >= kk:  # past the list's end: the next list
                s, t = s + numba.uint32(1), t - kk
        if heads <= most_heads:
            for q in range(tid, heads, threads):  # the first r entries of every list
                f = numba.uint32(q)
                s = f // numba.uint32(r)
                t = f - s * numba.uint32(r)
                hv[q], hi[q] = ws_v[w, s, t], ws_i[w, s, t]
        if tid == 0:
            bound_v[0], bound_i[0], bound_i[1] = -math.inf, EMPTY, 0  # b unknown: all
        m, l = acc(-math.inf), acc(0.0)
        for s in range(tid, pieces, threads):  # the S (m, ℓ), folded by the combiner
            m, l = combine_device(m, l, ws_m[row, s], ws_l[row, s])
        m, l = block_combine(m, l, m_sh, l_sh)
        cuda.syncthreads()  # the heads and b's slot are written before anyone reads them
        if heads <= most_heads:
            for q in range(tid, heads, threads):  # b: the head of rank k − 1
                if hi[q] != EMPTY and preceding(hv, hi, heads, hv[q], hi[q]) == k - 1:
                    bound_v[0], bound_i[0] = hv[q], hi[q]
        cuda.syncthreads()  # b is known before anyone gathers
        bu, bj = bound_v[0], bound_i[0]
        for c in range(per_thread):  # the candidates: every entry b does not precede
            if j[c] != EMPTY and not precedes_device(bu, bj, u[c], j[c]):
                q = cuda.atomic.add(bound_i, 1, 1)
                if q < cap:
                    gv[q], gi[q] = u[c], j[c]
        cuda.syncthreads()  # every candidate is in shared memory before any is ranked
        g = bound_i[1]
        if heads <= most_heads and g <= cap:  # (the same for every thread: no one waits alone)
            for q in range(tid, g, threads):  # its place: how many candidates precede it
                p = preceding(gv, gi, g, gv[q], gi[q])
                if p < k:
                    sv[p], si[p] = gv[q], gi[q]
            for q in range(g + tid, k, threads):  # fewer than k real entries: padding
                sv[q], si[q] = -math.inf, EMPTY
            cuda.syncthreads()  # the list is whole before any thread writes from it
        else:
            select(u, j, n - 1, idx_bytes, k, hist, ctrl, cv, ci, sv, si)  # the row's k best
        write(values, indices, row, sv, si, 0, k, m, l, tid, threads)

    return merge_row


@functools.cache
def merge_kernel(dtype, per_thread, threads, log, cap=CAP, most_heads=HEADS):
    """Kernel 2: block ``row`` runs :func:`row_merger`'s ``merge_row`` for its row."""
    merge_row = row_merger(dtype, per_thread, threads, log, cap, most_heads)
    memory = select_memory(accumulator(dtype))

    @jit.kernel(launch_bounds=threads)  # (registers for the block: ≤ 128 a thread at 512)
    def bound_merge(ws_v, ws_i, ws_m, ws_l, k, n, idx_bytes, values, indices):
        merge_row(ws_v, ws_i, ws_m, ws_l, cuda.blockIdx.x, k, n, idx_bytes, values, indices,
                  memory())

    return bound_merge
