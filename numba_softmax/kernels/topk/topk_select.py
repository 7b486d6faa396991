"""Top-k by radix select: the split path's two kernels (few long rows, B = 1 in decoding).

A warp's sorted list (:mod:`.topk_state`) takes its candidates one at a time, a warp-wide
step each, and a list of k over n values sees about k(1 + ln(n/k)) of them: the time
follows k.  A radix select costs about the same for any k.  Each entry gets an unsigned
*key* in the order of :func:`numba_softmax.combine.precedes` — the value's bits (sign bit
flipped, negatives inverted, −0 as +0), then the index reversed (the lower index ranks
first) — so no two keys are equal; NaN and empty slots take no part.  Then, byte by byte
from the most significant:

    round   a 256-bin histogram (shared-memory atomics, one per warp and bin: the lanes
            with the same byte add their count once) of the next byte of the keys that
            still match the threshold's bytes so far; one warp scans it from the top for
            the bin where the count reaches the entries still needed — the next byte of
            the k-th key.  Done when that bin holds exactly the entries still needed:
            usually after 2–3 of the value's 4 bytes (8 for float64); ties at the
            threshold go on into the index's bytes (the lower indices win).
    gather  the entries whose key is ≥ the threshold's bytes — exactly min(k, entries),
            in shared memory (an atomic counter) — and each finds its place by counting
            those that precede it (≤ k comparisons): the sorted list.

Kernel 1 (here), block (row, s): the piece's values are read once into registers
(``threads`` × ``per_thread``, W-wide loads), folded into (m, ℓ) and the block's,
selected; it writes the piece's state (m, ℓ, k values, k indices) to the workspace like
:func:`.topk_rows.piece_kernel`.  Kernel 2 (:mod:`.topk_merge`), block row: the S lists merged
by a bound, or by this select where the bound prunes too little.  Bytes: read N·b; the
workspace S·(k + 2)·8 written and read; write k(b + 8).  Rounds: at most 4 (float64: 8) value bytes + the index bytes, two
barriers each.  NumPy twin: :func:`numba_softmax.reference.topk.softmax_topk`.
"""

import functools
import math

import numba
import numpy as np
from numba import cuda

from ...runtime.sim import simulator_enabled
from ...combine import EMPTY, larger_device, precedes_device, weight_device
from ..hw import jit
from ..hw.jit import accumulator
from ..rows.reduce import block_combine
from ..rows.sync import last_to_finish
from .topk_state import keep_piece
from .topk_stream import loads
from ..hw.warp import peers, shfl

WARP = 32
MAX_K = 128  # the longest list: the shared buffers of the gather and the sorted list
BINS = 256  # one byte of the key per round
PER_LANE = BINS // WARP  # bins summed by each lane of the scanning warp
HIST = 2 * BINS  # two histograms, used in turn

if simulator_enabled():  # the simulator's libdevice has no bit casts: NumPy views instead

    def _bits32(u):
        return np.array([u], np.float32).view(np.uint32)[0]

    def _bits64(u):
        return np.array([u], np.float64).view(np.uint64)[0]

else:
    from numba.cuda import libdevice

    def _bits32(u):
        return numba.uint32(libdevice.float_as_int(numba.float32(u)))

    def _bits64(u):
        return numba.uint64(libdevice.double_as_longlong(numba.float64(u)))


def index_bytes(top):
    """Bytes of the reversed index ``top − j`` (0 ≤ top − j ≤ top): the rounds past the
    value's bytes that ties at the threshold may need."""
    return max(1, -(-int(top).bit_length() // 8))


@functools.cache
def order_key(acc):
    """(key type, its bits, device function key(u)): u's place in the order of the values
    as an unsigned integer, 0 for NaN (which takes no part)."""
    kt = numba.uint64 if acc == numba.float64 else numba.uint32
    nbits = 64 if acc == numba.float64 else 32
    bits = jit.device(_bits64 if nbits == 64 else _bits32)
    sign, ones = kt(1 << (nbits - 1)), kt((1 << nbits) - 1)
    magnitude, inf = kt((1 << (nbits - 1)) - 1), kt(0x7FF << 52 if nbits == 64 else 0xFF << 23)

    @jit.device
    def key(u):
        b = bits(u)
        if (b & magnitude) > inf:
            return kt(0)  # NaN
        if (b & magnitude) == kt(0):
            return sign  # −0 ranks as +0 (they are equal values: the index decides)
        if b & sign:
            return b ^ ones  # negative: the larger magnitude ranks lower
        return b | sign

    return kt, nbits, key


@jit.device
def preceding(v, i, n, u, j):
    """How many of the n entries v/i[0 : n] precede (u, j): a sorted list's place by
    counting.  Every thread of a warp reads entry f at once (a broadcast); the index is
    unsigned and 32-bit, so each step is two loads, a compare and an add — a signed
    Python int would add 64-bit negative-index arithmetic to every step (~23 instructions
    a step, on a chain that one warp runs while the block waits at its barrier)."""
    p = numba.int32(0)
    f, stop = numba.uint32(0), numba.uint32(n)
    while f < stop:
        p += numba.int32(1) if precedes_device(v[f], i[f], u, j) else numba.int32(0)
        f += numba.uint32(1)
    return p


@functools.cache
def radix_select(acc, per_thread, strided=False):
    """Device function ``select(u, j, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si)``: the
    k best of the entries (u[c], j[c]), c < ``per_thread``, that the block's threads hold
    (j = EMPTY: no entry), sorted into sv/si[0 : k] and padded with (−inf, EMPTY).  Indices
    satisfy top − idx < 256**idx_bytes.  Every thread of the block calls it.  With
    ``strided``, u and j are shared arrays and a thread's entries are u[tid + c·threads]
    (those past the end: none) — a select that keeps nothing in registers."""
    kt, nbits, key = order_key(acc)
    value_bytes = nbits // 8
    byte = kt(0xFF)

    @jit.device
    def scan(hist, h, need, ctrl):
        """Warp 0: ctrl = (the k-th key's next byte, entries still needed in its bin,
        done: the bin holds exactly those) from hist[h : h + 256]."""
        lane = cuda.threadIdx.x
        first = h + PER_LANE * lane
        own = 0
        for q in range(PER_LANE):
            own += hist[first + q]
        incl = own
        d = 1
        while d < WARP:  # suffix sums: incl = the count in bins ≥ PER_LANE·lane
            other = shfl(incl, min(lane + d, WARP - 1))
            if lane + d < WARP:
                incl += other
            d *= 2
        need = min(need, shfl(incl, 0))  # fewer entries than k: all of them
        above = incl - own  # the count in the bins above this lane's
        if need == 0 and lane == 0:
            ctrl[0], ctrl[1], ctrl[2] = 0, 0, 1
        elif above < need <= incl:  # this lane's bins hold the k-th key's byte
            q = PER_LANE - 1
            while above + hist[first + q] < need:
                above += hist[first + q]
                q -= 1
            ctrl[0], ctrl[1] = PER_LANE * lane + q, need - above
            ctrl[2] = 1 if hist[first + q] == need - above else 0

    @jit.device
    def entry(u, j, c, tid, threads):
        """A thread's c-th entry: (its key — the value's bytes, 0 for none —, u, j)."""
        i = tid + c * threads if strided else c
        if i >= u.shape[0] or j[i] == EMPTY:
            return kt(0), acc(-math.inf), EMPTY
        return key(u[i]), u[i], j[i]

    @jit.device
    def select(u, j, top, idx_bytes, k, hist, ctrl, cv, ci, sv, si):
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        lane = numba.uint32(tid % WARP)
        for q in range(tid, HIST, threads):
            hist[q] = 0
        if tid == 0:
            ctrl[3] = 0  # the gather's counter
        pv, mv, pi, mi = kt(0), kt(0), kt(0), kt(0)  # the threshold's bytes so far, masks
        need, rnd, last = k, 0, value_bytes + idx_bytes - 1
        cuda.syncthreads()  # both histograms are zero before the first round counts
        while True:
            h = (rnd % 2) * BINS  # the histograms alternate: one counts, one is zeroed
            shift = kt(8 * (value_bytes - 1 - rnd) if rnd < value_bytes else 8 * (last - rnd))
            for c in range(per_thread):  # count the next byte of the keys still in play
                vk, _, jc = entry(u, j, c, tid, threads)  # the index's bytes: top − j
                bin_ = -1  # (not in play)
                if vk != kt(0) and (vk & mv) == pv:
                    ik = kt(top - jc)
                    if (ik & mi) == pi:
                        w = vk if rnd < value_bytes else ik
                        bin_ = numba.int32((w >> shift) & byte)
                same = peers(bin_)  # the warp's lanes counting into the same bin …
                if bin_ >= 0 and (same & ((numba.uint32(1) << lane) - numba.uint32(1))) == 0:
                    cuda.atomic.add(hist, h + bin_, cuda.popc(same))  # … add once, by the lowest
            for q in range(tid, BINS, threads):  # last round's, for the next round
                hist[BINS - h + q] = 0
            cuda.syncthreads()  # the histogram is complete before warp 0 scans it
            if tid < WARP:
                scan(hist, h, need, ctrl)
            cuda.syncthreads()  # the threshold's byte is published before anyone reads it
            b, need, done = kt(ctrl[0]), ctrl[1], ctrl[2]
            if rnd < value_bytes:  # the threshold's prefix grows by one byte
                pv, mv = pv | (b << shift), mv | (byte << shift)
            else:
                pi, mi = pi | (b << shift), mi | (byte << shift)
            if done != 0 or rnd == last:
                break
            rnd += 1
        for c in range(per_thread):  # gather the chosen: key prefix ≥ the threshold's
            vk, uc, jc = entry(u, j, c, tid, threads)
            v = vk & mv
            if vk != kt(0) and (v > pv or (v == pv and (kt(top - jc) & mi) >= pi)):
                q = cuda.atomic.add(ctrl, 3, 1)
                cv[q], ci[q] = uc, jc
        cuda.syncthreads()  # every chosen entry is in shared memory before any is ranked
        n = ctrl[3]
        for q in range(tid, k, threads):  # its place: how many chosen entries precede it
            if q < n:
                cu, cj = cv[q], ci[q]
                p = preceding(cv, ci, n, cu, cj)
                sv[p], si[p] = cu, cj
            else:
                sv[q], si[q] = -math.inf, EMPTY
        cuda.syncthreads()  # the list is whole before any thread reads it

    return select


@functools.cache
def select_memory(acc):
    """Device function ``memory()`` → (hist, ctrl, cv, ci, sv, si, m_sh, l_sh): the two
    histograms, the scan's results, the gather and the sorted list, the (m, ℓ) tree."""

    @jit.device
    def memory():
        hist = cuda.shared.array(HIST, numba.int32)
        ctrl = cuda.shared.array(4, numba.int32)
        cv = cuda.shared.array(MAX_K, acc)
        ci = cuda.shared.array(MAX_K, numba.int32)
        sv = cuda.shared.array(MAX_K, acc)
        si = cuda.shared.array(MAX_K, numba.int32)
        m_sh = cuda.shared.array(WARP, acc)
        l_sh = cuda.shared.array(WARP, acc)
        return hist, ctrl, cv, ci, sv, si, m_sh, l_sh

    return memory


@functools.cache
def piece_kernel(dtype, threads, per_thread, width, then=None):
    """Kernel 1: block (row, s) writes the state of x[row, s·piece : (s + 1)·piece]
    (piece ≤ threads·per_thread) to the workspace.  With ``then`` (a
    :func:`.topk_merge.row_merger` of ``threads`` threads) the last of a row's pieces to
    finish merges the row's S states itself: one launch, no kernel 2 (extra arguments:
    int32 tickets, zero, one a row; the row's index bytes; values; indices)."""
    acc = accumulator(dtype)
    fetch, value, held, slots_held, pad = loads(dtype, per_thread, width)  # 16-bit: in pairs
    select = radix_select(acc, per_thread)
    memory = select_memory(acc)

    @jit.device
    def piece_state(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l, mem):
        hist, ctrl, cv, ci, sv, si, m_sh, l_sh = mem
        row, s, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        start = s * piece
        stop = min(start + piece, x.shape[1])
        raw = cuda.local.array(slots_held, held)
        u = cuda.local.array(per_thread, acc)
        j = cuda.local.array(per_thread, numba.int32)
        fetch(x, row, start, stop, tid, threads, raw, pad)  # the piece, read once: W-wide, coalesced
        m = acc(-math.inf)
        for c in range(per_thread):  # u = x / T; past the end: no entry
            jc = start + (tid + (c // width) * threads) * width + c % width
            j[c] = jc if jc < stop else EMPTY
            u[c] = value(raw, c) * inv_t if jc < stop else acc(-math.inf)
            m = larger_device(m, u[c])  # a NaN is kept
        l = acc(0.0)
        for c in range(per_thread):
            l += weight_device(u[c], m)
        m, l = block_combine(m, l, m_sh, l_sh)  # the piece's (m, ℓ)
        select(u, j, stop - 1, idx_bytes, k, hist, ctrl, cv, ci, sv, si)  # its k best
        keep_piece(ws_v, ws_i, ws_m, ws_l, row, s, sv, si, k, m, l, tid, threads)

    if then is None:
        @jit.kernel
        def radix_piece_states(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l):
            piece_state(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l, memory())

        return radix_piece_states

    @jit.kernel
    def radix_pieces_merged(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l,
                            tickets, row_bytes, values, indices):
        mem = memory()  # one set of the select's shared arrays for both (see row_merger)
        piece_state(x, k, inv_t, piece, idx_bytes, ws_v, ws_i, ws_m, ws_l, mem)
        row = cuda.blockIdx.x
        if last_to_finish(tickets, row, cuda.gridDim.y):  # the row's S states are all written
            then(ws_v, ws_i, ws_m, ws_l, row, k, x.shape[1], row_bytes, values, indices, mem)

    return radix_pieces_merged
