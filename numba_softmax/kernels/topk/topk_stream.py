"""One pass over a piece of a row: each thread's (m, ℓ), each warp's top-k list.

The first step of the top-k state (:mod:`.topk_state`): the values are read once, in
chunks of W-wide vector loads, the next chunk's loads in flight while one is folded;
every value goes into its thread's online-softmax state and is offered to its warp's list
(:mod:`.topk_list`) only if it reaches the gate — θ, or the block's floor where the
warps of a block share a range.
"""

import functools
import math

import numba
from numba import cuda

from ...combine import EMPTY, combine_device, larger_device, precedes_device, weight_device
from ...draws import gumbel_device
from ..hw import jit, vector
from ..rows import pairs, vector_chunk
from ..hw.jit import accumulator, exp
from .topk_list import BUFFER, WARP, warp_list
from ..hw.warp import ballot, shfl, shfl2


@functools.cache
def loads(dtype, vpt, width):
    """How a thread holds the chunk it loads: (fetch, value, held type, slots, pad).

    ``fetch(x, row, base, stop, t, team, h, pad)`` loads thread t's VPT values of the
    chunk at x[row, base:] — its i-th W-wide vector at base + (t + i·team)·W, as
    :mod:`.chunk` lays a chunk out — into the thread's held array h, ``pad`` past
    ``stop`` (a whole chunk with no test a vector; :func:`.chunk.ops`); ``value(h, i)``
    is value i in the accumulator type.  Float16 and bfloat16 in 16-byte vectors are held as
    the vectors' 32-bit words, two values a register, loaded by one 16-byte load
    (:func:`.vector.words`): NVPTX splits a vector of eight 16-bit values into two 8-byte
    loads, each of which touches every sector of the warp's 512 bytes and uses half of
    it (``docs/algorithms/topk.md``, "16-bit rows: one 16-byte load, not two").  Other
    cases hold one stored value a slot."""
    if not pairs.packed(dtype, width):
        stored = vector.storage_type(dtype)
        load, (load_row, _) = jit.loader(dtype), vector.raw_row_io(width)
        bf16 = jit.storage(dtype) == jit.BFLOAT16  # stored as uint16 bits: −inf is 0xFF80
        # −inf past the row's end; float16's as a float32, converted where it is stored: a
        # float16 constant in a kernel is emitted as ``i16 -inf``, which NVVM rejects
        # (ERROR_INVALID_IR: every strided float16 top-k failed to compile on a GPU)
        pad = stored(0xFF80) if bf16 else accumulator(dtype)(-math.inf)

        @jit.device
        def value(h, i):
            return load(h[i])

        return (vector_chunk.chunked(load_row, vector_chunk.strided(width, vpt // width)[0], vpt, width),
                value, stored, vpt, pad)

    U32 = numba.uint32
    to_acc, to_bits = jit.bits_loader(dtype), jit.bits_storer(dtype)
    bf16 = jit.storage(dtype) == jit.BFLOAT16
    load_words = vector.words()[0]

    @jit.device
    def bits(x, row, j, stop, pad):
        """The stored bits of x[row, j] (float16: exact through float32), ``pad`` past stop."""
        if j >= stop:
            return pad
        return U32(x[row, j]) if bf16 else U32(to_bits(numba.float32(x[row, j])))

    @jit.device
    def fetch(x, row, j, stop, h, offset, pad):
        if j + width <= stop:
            load_words(x, row, j, h, offset // 2)
        else:  # the row's ragged end, value by value
            for k in range(width // 2):
                h[offset // 2 + k] = (bits(x, row, j + 2 * k, stop, pad)
                                      | bits(x, row, j + 2 * k + 1, stop, pad) << U32(16))

    @jit.device
    def value(h, i):
        w = h[i // 2]
        return to_acc(numba.uint16(w >> U32(16) if i % 2 else w & U32(0xFFFF)))

    whole = vector_chunk.strided(width, vpt // width, words=True)[0]
    return vector_chunk.chunked(fetch, whole, vpt, width), value, U32, vpt // 2, U32(pairs.pad_bits(dtype, -math.inf))



# How far past the running m a chunk's max may be before the state is rescaled
# (FlashAttention-4's conditional rescaling; docs/algorithms/topk.md): ℓ's terms
# stay below e¹⁶ ≈ 9·10⁶ — or e³² where m + 16 rounds up (float32 |m| ≥ 2²⁸).
LAG = 16.0


@functools.cache
def stream(dtype, vpt, width, slots, perturb, shared_floor, scaled=True):
    """Device function: one thread's (m, ℓ) over its values of x[row, start:stop] and its
    warp's top-k list (lv/li: ``slots`` entries per lane).  ``t``: the thread's place among
    the R threads streaming the range (whole warps).  With ``perturb`` the list ranks
    u_j + G_j (Gumbel noise from ``key``: sampling), while (m, ℓ) stays that of u.

    The common chunk costs per value a multiply, a max, an exp and an add (the max and
    the sum in four interleaved chains), and one comparison a chunk: its largest
    u against the gate, the larger of θ and the floor (with ``perturb``, each value's);
    the next chunk's loads are in flight meanwhile.  ℓ is summed against a *lagging*
    reference — the m of the chunks before — so the exponentials need not wait for the
    chunk's max (the stream is latency-bound); m moves, and the state is rescaled, only
    when a chunk's max passes it by more than ``LAG``.  Indices are formed only for a chunk
    with candidates, and the −inf/NaN bookkeeping of :func:`combine.weight` only for a
    chunk with no finite value.  The first chunk seeds the list: each lane's best
    ``slots`` values, offered all at once
    (``seed``), so that θ starts at the k-th of the lanes' best instead of −inf, when
    every value would be a candidate.  A chunk's candidates are each lane's bits of i,
    handed on lowest i first (``pick``: u[i] from registers).  With one slot (k ≤ 32)
    they are inserted in turn, lane by lane (:func:`.topk_list.warp_list`'s ``insert``),
    θ rising after each; with more they are appended to the warp's buffer (bv/bi[bbase :
    bbase + BUFFER], shared memory — each lane at its place after a scan of the lanes'
    counts) and merged 32 at a time (``flush``), after which θ and the gate rise.
    (Inserting in turn is the faster at one slot, buffering at two or more:
    ``docs/algorithms/topk.md``, "Measured".)

    With ``shared_floor`` the warps of a block stream one range and share a floor in
    ``floor_sh[0]``: the largest θ any warp has published.  Each warp's θ is the k-th best
    of values of the range, so no value below the floor can be among the range's k best,
    and no warp inserts one — the block inserts about as often as one warp streaming the
    whole range would, not once per warp.

    ``scaled=False`` (a launch at T = 1) takes u = x: no multiply by 1/T a value."""
    acc = accumulator(dtype)
    fetch, value, held, slots_held, pad = loads(dtype, vpt, width)
    insert, offer, flush, threshold, _ = warp_list(acc, slots)
    serial = slots == 1
    lag = acc(LAG)
    gumbel = gumbel_device(acc)

    @jit.device
    def merge(lv, li, k, bv, bi, bbase, count, lane):
        """The buffer's ``count`` candidates into the list; returns the new θ."""
        cuda.syncwarp()  # the buffer is written before other lanes read it
        flush(lv, li, bv, bi, bbase, count, lane)
        cuda.syncwarp()  # … and read before it is written again
        return threshold(lv, li, k)

    @jit.device
    def index(base, t, R, i):
        """The column of a thread's i-th value of the chunk at ``base``."""
        return base + (t + (i // width) * R) * width + i % width

    @jit.device
    def pick(u, i):
        """u[i] for an i known only at run time, as a tree of selects on i's bits: u
        stays in registers (u[i] itself would move u to local memory)."""
        v = cuda.local.array(vpt, acc)
        for s in range(vpt):
            v[s] = u[s]
        n, bit = vpt, 0
        while n > 1:  # (a loop of fixed trip count: unrolled, v in registers)
            take = (i >> numba.uint32(bit)) & numba.uint32(1) != 0
            for s in range(n // 2):
                v[s] = v[2 * s + 1] if take else v[2 * s]
            if n % 2:
                v[n // 2] = v[n - 1]
            n, bit = (n + 1) // 2, bit + 1
        return v[0]

    @jit.device
    def chains(w, largest):
        """The largest (or the sum) of w[0 : vpt] in four interleaved chains, joined
        pairwise: about a quarter of the dependent steps of one chain.  (One loop of a
        fixed trip count: unrolled, w stays in registers.)"""
        for i in range(4, vpt):
            w[i % 4] = max(w[i % 4], w[i]) if largest else w[i % 4] + w[i]
        if vpt >= 4:
            if largest:
                return max(max(w[0], w[1]), max(w[2], w[3]))
            return (w[0] + w[1]) + (w[2] + w[3])
        r = w[0]
        for i in range(1, vpt):
            r = max(r, w[i]) if largest else r + w[i]
        return r

    @jit.device
    def seed(u, base, t, R, stop, lv, li, lane):
        """Offer each lane's best ``slots`` values of the chunk to the list, all 32 lanes'
        at once (``offer``: a bitonic merge a slot), and mark them NaN in u (never a
        candidate again).  θ is then the k-th of the lanes' best, and the chunk's other
        values are candidates only if they reach it — a few, where every value of a first
        chunk would be one against an empty list."""
        tv = cuda.local.array(slots, acc)
        tj = cuda.local.array(slots, numba.int32)
        ti = cuda.local.array(slots, numba.int32)
        for s in range(slots):
            tv[s], tj[s], ti[s] = -math.inf, EMPTY, -1
        for i in range(vpt):  # the lane's best ``slots``, by insertion (in registers)
            j = index(base, t, R, i)
            cu, cj, ci = u[i], numba.int32(j if j < stop else EMPTY), numba.int32(i)
            for s in range(slots):
                if precedes_device(cu, cj, tv[s], tj[s]):
                    tv[s], cu = cu, tv[s]
                    tj[s], cj = cj, tj[s]
                    ti[s], ci = ci, ti[s]
        for s in range(slots):
            offer(lv, li, tv[s], tj[s], lane)
        for i in range(vpt):
            for s in range(slots):
                if ti[s] == i:
                    u[i] = acc(math.nan)

    @jit.device
    def fold(x, row, start, stop, k, inv_t, key, t, R, lv, li, floor_sh, bv, bi, bbase):
        lane = t % WARP
        raw = cuda.local.array(slots_held, held)  # the chunk being folded, as loaded
        nxt = cuda.local.array(slots_held, held)  # the next chunk's loads, in flight
        u = cuda.local.array(vpt, acc)
        uc = cuda.local.array(vpt, acc)  # a chunk with candidates: u, indexed by a runtime i
        w = cuda.local.array(vpt, acc)  # the chains' scratch
        wl = cuda.local.array(vpt, acc)  # exp(u − m) against the lagging m
        for s in range(slots):
            lv[s] = -math.inf
            li[s] = EMPTY
        th_u, th_j = acc(-math.inf), numba.int32(EMPTY)  # θ of an empty list
        count = numba.int32(0)  # candidates in the buffer
        floor = acc(-math.inf)
        m, l = acc(-math.inf), acc(0.0)
        step = R * vpt
        fetch(x, row, start, stop, t, R, nxt, pad)  # the first chunk's loads (−inf past the end)
        for base in range(start, stop, step):
            for i in range(slots_held):
                raw[i] = nxt[i]
            if base + step < stop:  # the next chunk's loads, in flight while this one folds
                fetch(x, row, base + step, stop, t, R, nxt, pad)
            # u = x / T (u = x at T = 1)
            for i in range(vpt):
                u[i] = value(raw, i) * inv_t if scaled else value(raw, i)
                w[i] = u[i]
            # ℓ against the lagging reference m (the chunks before), started before this
            # chunk's max m_c is known.  (u − m first: exact for u near m, where
            # u·log2e − m·log2e as one FMA rounds m·log2e — to inf near the largest float)
            for i in range(vpt):
                wl[i] = exp(u[i] - m)
            l_lag = chains(wl, False)
            m_chunk = chains(w, True)
            top = m_chunk  # (a NaN may hide a value here: its row's ℓ is NaN, its output NaN)
            # kept while m_c ≤ m + LAG: ℓ += Σ exp(u − m), m unchanged (a select, so the
            # sums above stay ahead of the branch); else — the first chunk, m_c past
            # m + LAG, a NaN or +inf, m not finite — (m_c, ℓ_c) and the online step
            lagged = m > -math.inf and m < math.inf and m_chunk <= m + lag
            l = l + l_lag if lagged else l
            if not lagged:
                l_chunk = acc(0.0)
                if m_chunk > -math.inf:  # a NaN in u makes ℓ_c NaN, as combine's does
                    for i in range(vpt):  # (jit.exp: where the simulator's max let a NaN
                        w[i] = exp(u[i] - m_chunk)  # hide the max, u − m_c overflows Python's)
                    l_chunk = chains(w, False)
                else:  # no finite value: −inf everywhere, or a NaN the max let go
                    for i in range(vpt):
                        m_chunk = larger_device(m_chunk, u[i])
                    for i in range(vpt):
                        l_chunk += weight_device(u[i], m_chunk)
                m, l = combine_device(m, l, m_chunk, l_chunk)
            if perturb:
                for i in range(vpt):
                    j = index(base, t, R, i)
                    if j < stop:
                        u[i] += gumbel(key, j)
            # the warp's k best: the first chunk seeds the list with each lane's best;
            # then a vote on u ≥ gate, the candidates inserted or buffered and merged
            if base == start:
                seed(u, base, t, R, stop, lv, li, lane)
                th_u, th_j = threshold(lv, li, k)
            if shared_floor:
                if lane == 0:  # publish θ, read the floor: one shared atomic a warp
                    floor = cuda.atomic.max(floor_sh, 0, th_u)
                floor = max(shfl(floor, 0), th_u)
            gate = max(floor, th_u)
            hit = top >= gate  # (the chunk's largest u; perturbed values are each compared)
            if perturb:
                hit = False
                for i in range(vpt):
                    hit = hit or u[i] >= gate
            if ballot(hit) != 0:
                bits = numba.uint32(0)  # this lane's candidates, bit i for u[i] (each
                for i in range(vpt):  # result cast back: uint32 ∘ uint32 is uint64 in Numba)
                    if u[i] >= gate:
                        bits = numba.uint32(bits | (1 << i))
                if serial:  # one slot (k ≤ 32): each candidate inserted in turn
                    lanes = ballot(bits != 0)
                    while lanes != 0:  # the lowest lane's lowest i (the same turns in every lane)
                        src = cuda.ffs(lanes) - 1
                        i = numba.uint32(max(cuda.ffs(bits), 1) - 1)  # (a lane with none: 0, never sent)
                        j = index(base, t, R, i)
                        cu, cj = shfl2(pick(u, i), numba.int32(j if j < stop else EMPTY), src)
                        insert(lv, li, k, cu, cj, lane)  # (no place once θ has passed it)
                        if lane == src:
                            bits = numba.uint32(bits & (bits - numba.uint32(1)))
                        lanes = ballot(bits != 0)
                    th_u, th_j = threshold(lv, li, k)
                else:  # candidates to the buffer, merged 32 at a time
                    mine = numba.int32(cuda.popc(bits))
                    # an inclusive scan of the lanes' counts (strides 1 … 16), kept in int32:
                    # Numba's int32 + int32 is int64, two shuffles a step
                    before = mine
                    for e in range(5):
                        other = shfl(before, max(lane - (1 << e), 0))
                        if lane >= 1 << e:
                            before = numba.int32(before + other)
                    total = shfl(before, WARP - 1)
                    before = numba.int32(before - mine)
                    if count + total <= BUFFER:  # the common case: each lane writes its own
                        q = numba.uint32(bbase + count + before)  # (unsigned: no negative-index code)
                        while bits != 0:  # lowest i first; as many turns as the busiest lane has
                            i = numba.uint32(cuda.ffs(bits) - 1)
                            bits = numba.uint32(bits & (bits - numba.uint32(1)))
                            j = index(base, t, R, i)
                            bv[q] = pick(u, i)
                            bi[q] = j if j < stop else EMPTY
                            q += numba.uint32(1)
                        count = numba.int32(count + total)
                    else:  # (while the lists fill) in order of i, merging whenever full
                        below = (numba.uint32(1) << numba.uint32(lane)) - numba.uint32(1)
                        for i in range(vpt):  # (a loop the compiler keeps: uc[i] in local memory)
                            uc[i] = u[i]
                        for i in range(vpt):
                            mask = ballot(uc[i] >= gate)
                            if mask != 0:
                                if uc[i] >= gate:  # its place: after those of the lanes before it
                                    j = index(base, t, R, i)
                                    q = bbase + count + cuda.popc(mask & below)
                                    bv[q] = uc[i]
                                    bi[q] = j if j < stop else EMPTY
                                count = numba.int32(count + cuda.popc(mask))
                                if count >= WARP:
                                    th_u, th_j = merge(lv, li, k, bv, bi, bbase, count, lane)
                                    count = numba.int32(0)
                                    gate = max(floor, th_u)
                    if count >= WARP:
                        th_u, th_j = merge(lv, li, k, bv, bi, bbase, count, lane)
                        count = numba.int32(0)
        if not serial and count > 0:
            merge(lv, li, k, bv, bi, bbase, count, lane)
        return m, l

    return fold
