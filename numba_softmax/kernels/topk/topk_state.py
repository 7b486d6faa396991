"""The top-k state on chip: (m, ℓ) per thread, the k best per warp, merged per block.

The state of :func:`numba_softmax.combine.combine_topk` — (m, ℓ, the k best values and
their indices) — built for a piece of a row, one read of the values:

1. *thread*: each thread streams its values chunk by chunk (VPT per chunk, W-wide vector
   loads, u = x / T) and folds them into its own (m, ℓ), exactly as the online kernel does.
2. *warp*: the warp keeps one top-k list spread over its 32 lanes — lane i holds places
   i, i + 32, … (a power of two ≥ ⌈k/32⌉ per lane), in registers — and θ, the list's
   k-th entry.  A value is a candidate only if it reaches the gate, the larger of θ and
   the block's floor (:func:`.topk_stream.stream`); after the first few chunks almost none does, so
   the common cost per value is one comparison.  With one entry a lane (k ≤ 32) each
   candidate is inserted in turn, all lanes together: place p = how many entries rank
   before it (a vote), then every entry after p moves one lane on (a shuffle).  With
   more, the candidates wait in a shared buffer and are merged 32 at a time by a bitonic
   sort and merge across the lanes (``flush``).  Per-thread lists (the paper's
   ``TopK<K>`` sorted by insertion) would cost 2k registers per thread; a warp's list
   costs two a slot — k = 64 costs four.
3. *block*: each warp writes its list to shared memory and the lists are merged pairwise
   in log2(warps) rounds; each entry finds its place in the merged list on its own — its
   place in its list plus its rank in the partner list (:func:`combine.rank`, a binary
   search) — exactly :func:`combine.combine_topk`, its loop run by all threads at once.

Ties go to the lower index and NaN never enters a list (:func:`combine.precedes`), so the
result does not depend on which thread, warp or block saw which value.  The kernels that
use this (:mod:`.topk`, :mod:`.sample`) add only what they write (:func:`writer`: a row's
k outputs from its list and (m, ℓ), also the end of :mod:`.topk_merge` and
:mod:`.topk_filter`).
"""

import functools
import math

import numba
from numba import cuda

from ...combine import combine_device, precedes_device, weight_device
from ..hw import jit
from ..rows.chunk import pow2_ceil
from ..hw.jit import accumulator
from ..rows.reduce import block_combine, warp_combine
from .topk_list import BUFFER, WARP, warp_list
from .topk_stream import stream


U32 = numba.uint32  # list places: unsigned, so no index pays for negative-index arithmetic


@jit.device
def place_in(u, j, values, indices, start, k, ties):
    """:func:`combine.rank` on the device, in unsigned arithmetic (``start``, ``k``: U32):
    how many entries of the sorted list values[start : start + k] precede (u, j) — with
    ``ties``, also those equal to it; log2(k) + 1 reads.  (Signed 64-bit steps and indices
    cost ~3× the instructions, and a block's merge runs one of these an entry a round.)"""
    lo, hi = U32(0), k
    while lo < hi:
        mid = (lo + hi) >> U32(1)
        a, b = values[start + mid], indices[start + mid]
        if precedes_device(a, b, u, j) or (ties and a == u and b == j):
            lo = mid + U32(1)
        else:
            hi = mid
    return lo


@functools.cache
def merge_lists(acc, per_thread):
    """Device function: merge the n_lists sorted lists of k entries in sv/si[0 : n·k]
    pairwise, in place, into the first; the block's ``threads`` threads take part, each
    moving ``per_thread`` entries a round (per_thread·threads ≥ n_lists·k)."""

    @jit.device
    def merge(sv, si, n_lists, k, tid, threads):
        mu = cuda.local.array(per_thread, acc)
        mj = cuda.local.array(per_thread, numba.int32)
        dest = cuda.local.array(per_thread, numba.uint32)
        kk, lists, gone = U32(k), U32(n_lists), U32(0xFFFFFFFF)
        d = U32(1)
        while d < lists:  # round d: list a (a % 2d = 0) takes in list a + d
            for e in range(per_thread):
                q = U32(tid + e * threads)
                lst = q // kk
                r = q - lst * kk
                dest[e] = gone
                if lst < lists and lst & (d - U32(1)) == U32(0):
                    mu[e], mj[e] = sv[q], si[q]
                    if lst & (d + d - U32(1)) == U32(0):  # from list a: before equal entries of b
                        if lst + d < lists:
                            s = r + place_in(mu[e], mj[e], sv, si, (lst + d) * kk, kk, False)
                            dest[e] = lst * kk + s if s < kk else gone
                    else:  # from list b = a + d, moving into a
                        s = r + place_in(mu[e], mj[e], sv, si, (lst - d) * kk, kk, True)
                        dest[e] = (lst - d) * kk + s if s < kk else gone
            cuda.syncthreads()  # every entry knows its place before any entry moves
            for e in range(per_thread):
                if dest[e] != gone:
                    sv[dest[e]] = mu[e]
                    si[dest[e]] = mj[e]
            cuda.syncthreads()  # the merged lists are whole before the next round reads them
            d += d

    return merge


@functools.cache
def block_memory(acc, entries):
    """Device function ``memory()`` → (sv, si, m_sh, l_sh): a block's shared memory for
    ``entries`` list entries (values, int32 indices) and its (m, ℓ) tree (32 slots each).
    Called once per kernel."""

    @jit.device
    def memory():
        sv = cuda.shared.array(entries, acc)
        si = cuda.shared.array(entries, numba.int32)
        m_sh = cuda.shared.array(WARP, acc)
        l_sh = cuda.shared.array(WARP, acc)
        return sv, si, m_sh, l_sh

    return memory


@functools.cache
def row_state(dtype, threads, vpt, width, slots, warp_rows, perturb, scaled=True):
    """Device function ``state(x, row, start, stop, k, inv_t, key, sv, si, m_sh, l_sh)``
    → (m, ℓ, base): the state of x[row, start:stop], its list left in sv/si[base : base+k].

    ``warp_rows``: each warp is a row of its own (rows of a block: threads/32; base = warp·k;
    no barrier; the lanes of the warp may then read the list); else the whole block
    streams the range and merges its warps' lists (base = 0; any thread may read it).
    ``scaled=False``: u = x (T = 1; :func:`.topk_stream.stream`).
    """
    acc = accumulator(dtype)
    regs = pow2_ceil(slots)  # the list's entries a lane: a power of two (a bitonic merge)
    # (m, ℓ) and the warp's list; a shared floor only where a block has more than two warps:
    # at two it cost more than it saved (topk.md, "What stops B 1024")
    fold = stream(dtype, vpt, width, regs, perturb, not warp_rows and threads // WARP > 2, scaled)
    dump = warp_list(acc, regs)[-1]
    merge = merge_lists(acc, slots)
    buffered = threads // WARP * BUFFER

    @jit.device
    def state(x, row, start, stop, k, inv_t, key, sv, si, m_sh, l_sh):
        tid = cuda.threadIdx.x
        warp, lane = tid // WARP, tid % WARP
        lv = cuda.local.array(regs, acc)
        li = cuda.local.array(regs, numba.int32)
        floor_sh = cuda.shared.array(1, acc)  # the block's floor (see stream)
        bv = cuda.shared.array(buffered, acc)  # each warp's candidates
        bi = cuda.shared.array(buffered, numba.int32)
        if warp_rows:
            m, l = fold(x, row, start, stop, k, inv_t, key, lane, WARP, lv, li, floor_sh, bv, bi,
                        warp * BUFFER)
            dump(lv, li, k, sv, si, warp * k, lane)
            cuda.syncwarp()  # the warp's list is in shared memory before its lanes read it
            m, l = warp_combine(m, l)
            return m, l, warp * k
        if tid == 0:
            floor_sh[0] = -math.inf
        cuda.syncthreads()  # the floor is set before any warp publishes to it
        m, l = fold(x, row, start, stop, k, inv_t, key, tid, threads, lv, li, floor_sh, bv, bi,
                    warp * BUFFER)
        dump(lv, li, k, sv, si, warp * k, lane)
        cuda.syncthreads()  # every warp's list is written before the merge reads them
        merge(sv, si, threads // WARP, k, tid, threads)
        m, l = block_combine(m, l, m_sh, l_sh)
        return m, l, 0

    return state


@jit.device
def keep_piece(ws_v, ws_i, ws_m, ws_l, row, s, sv, si, k, m, l, tid, threads):
    """A piece's k best (sv, si[0 : k]) and its (m, ℓ) to the workspace slot (row, s)
    that :func:`pieces_state` reads back (the split path's first kernel); every thread
    of the block calls it."""
    for r in range(tid, k, threads):
        ws_v[row, s, r] = sv[r]
        ws_i[row, s, r] = si[r]
    if tid == 0:
        ws_m[row, s] = m
        ws_l[row, s] = l


@functools.cache
def pieces_state(acc, lists, threads, slots):
    """Device function ``state(ws_v, ws_i, ws_m, ws_l, row, k, sv, si, m_sh, l_sh)``
    → (m, ℓ): the merge of a row's S piece states (S ≤ ``lists``) from the workspace, the
    list left in sv/si[0 : k] (the split path's second kernel)."""
    merge = merge_lists(acc, -(-lists * WARP * slots // threads))

    @jit.device
    def state(ws_v, ws_i, ws_m, ws_l, row, k, sv, si, m_sh, l_sh):
        tid = cuda.threadIdx.x
        n = ws_m.shape[1]
        w, kk = U32(row), U32(k)
        for q in range(tid, n * k, threads):  # the S lists, side by side
            f = U32(q)
            s = f // kk
            sv[f] = ws_v[w, s, f - s * kk]
            si[f] = ws_i[w, s, f - s * kk]
        m, l = acc(-math.inf), acc(0.0)
        for s in range(tid, n, threads):  # the S (m, ℓ), folded by the combiner
            m, l = combine_device(m, l, ws_m[row, s], ws_l[row, s])
        m, l = block_combine(m, l, m_sh, l_sh)  # (its barriers also order the lists' writes)
        merge(sv, si, n, k, tid, threads)
        return m, l

    return state


@functools.cache
def writer(dtype, log):
    """Device function: the k outputs of a row from its list and (m, ℓ)."""
    acc = accumulator(dtype)
    store = jit.storer(dtype)

    @jit.device
    def write(values, indices, row, sv, si, base, k, m, l, first, step):
        good = l > 0  # ℓ is NaN (NaN or +inf in the row) or 0 (all −inf): no softmax
        c = acc(0.0)
        if good:
            c = math.log(l) if log else acc(1.0) / l
        for r in range(first, k, step):
            if good:
                u = sv[base + r]
                values[row, r] = store((u - m) - c if log else weight_device(u, m) * c)
                indices[row, r] = si[base + r]
            else:  # torch: softmax is NaN everywhere; topk of NaNs, ties to the lower index
                values[row, r] = store(acc(math.nan))
                indices[row, r] = r

    return write
