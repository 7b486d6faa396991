"""d1 — split-KV decoding (flash-decoding) with grouped-query heads, merged in the same kernel.

A decoder producing a token has, per (batch, query head), Sq = 1 query row (or a few) and a
KV cache of Sk keys.  The FlashAttention grid of :mod:`numba_softmax.kernels.attention.attention` would give each
(batch, head) one block walking the whole cache alone — B·H blocks, a fraction of the
multiprocessors — and, with grouped-query attention, every query head of a group would
read the same K/V head again.  Decoding is memory-bound: its speed is the rate at which
the cache is read.  This kernel reads each K/V head once and spreads the reading over the
whole device:

* **GQA packed**: one block takes a K/V head and all the query rows that read it — the
  group's Hq/Hkv heads × Sq rows, numbered i·group + g (up to ``rows`` of them; more go
  to further row chunks).  Query head h reads K/V head h // (Hq/Hkv).
* **Split-KV**: the keys a block's rows can see (causal, window: :mod:`.visible`) are cut
  into Z ranges, one block each — Z chosen from B·Hkv and how many blocks the device holds
  at once (:func:`.decode_launch.choose_splits`), so that a batch of one still fills every
  multiprocessor.
* **Lanes along D**: a key row of D values is read by LPK lanes, 8 values each (one
  16-byte load for float16/bfloat16, two for float32), so a warp reads 32/LPK whole rows
  per load, coalesced; U keys per lane are loaded before any is used (U·2 loads in
  flight).  The score q·k is summed over the LPK lanes with a shuffle butterfly; every
  lane of the key keeps the (m, ℓ) of its rows and the O of its 8 columns.
* **Merged in place**: the key slots of a warp fold their states with shuffles, the warps
  through shared memory (:func:`fold_warps`), each with the combiner.  With Z > 1 each block
  writes its normalised partial (O_z, LSE_z); the last of the Z blocks to finish (an
  atomic ticket after a memory fence) folds the Z partials of its rows
  (:mod:`.decode_merge`) — one kernel launch, no second kernel.

The K/V row of a key comes from a dense (B, Hkv, Sk, D) array or, with ``paged``, from a
block pool through a block table (:mod:`.paged`): the one compile-time difference.

Memory traffic: K and V read once, Sk·(D + Dv)·b bytes per (batch, K/V head) — the
figure of merit is this over the kernel time; the partials add Z·rows·(Dv + 1)·4·2.
NumPy twins: :func:`numba_softmax.reference.split_kv_attention`,
:func:`~numba_softmax.reference.attention` (GQA, windows).
"""

import functools
import math

import numpy as np
from numba import cuda, int64

from ...combine import weight_device
from ..hw import jit, shuffle
from ..attention import score_mods, tileio
from ..attention import visible as vis
from .decode_merge import block_of, fold_warps, merge_when_last, row_of
from ..hw.jit import accumulator
from ..hw.ptx import nan_max

FULL_MASK = 0xFFFFFFFF
VALUES_PER_LANE = 8  # EPL: D-values of a key row each lane reads
MAX_ROWS = 4  # query rows one block takes (more: further row chunks)
MAX_HEAD_DIM = 256
WARPS = 8


def lanes(dtype, d, dv):
    """(LPK lanes per key, KPW keys per warp, U keys a lane loads at once)."""
    need = -(-max(d, dv) // VALUES_PER_LANE)
    lpk = 1
    while lpk < need:
        lpk *= 2
    return lpk, 32 // lpk, 4 if np.dtype(dtype).itemsize <= 2 else 2  # 8 16-byte loads a lane


@functools.cache
def kernel(dtype, d, dv, rows, warps, paged, width, softcap_on=False, alibi_on=False):
    """The decode kernel for one (dtype, D, Dv, rows per block, warps, layout, vector width,
    score modifications: :mod:`..attention.score_mods`, whose ``scale`` tuple it then takes)."""
    acc = accumulator(dtype)
    MODS = softcap_on or alibi_on
    modify = score_mods.modifier(acc, softcap_on, alibi_on)
    setup_mods = score_mods.setup(acc, alibi_on, 1.0)
    LPK, KPW, U = lanes(dtype, d, dv)
    EPL, RB = VALUES_PER_LANE, rows
    KS = warps * KPW  # key slots of a block: each step reads U·KS keys
    NV = EPL // width  # vector loads per key row per lane
    N_Q, N_KV, N_S = RB * EPL, U * EPL, RB * U
    load = tileio.global_load(width)
    swap_s, swap_state = shuffle.exchange(N_S), shuffle.exchange3(RB, RB, N_Q)
    fold_w = fold_warps(dtype, LPK, dv, rows, warps)
    merge_z = merge_when_last(dtype, dv, rows, warps)

    @jit.device
    def row_slots(x, i0, i1, i2, t, lim, buf, at):
        """buf[at …] ← the lane's EPL values of row x[i0, i1, i2, :lim] (0 past lim)."""
        for nv in range(NV):
            col = t * EPL + nv * width
            if col < lim:
                load(x, i0, i1, i2, col, buf, at + nv * width)
            else:
                for e in range(width):
                    buf[at + nv * width + e] = acc(0.0)

    @jit.kernel
    def decode(q, k, v, o, lse, o_ws, lse_ws, counters, table, seqlens, scale, left, right,
               kv_chunk, splits, n_chunks, page_shift):
        if MODS:
            scale, cap, slopes = scale
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        slot, t = warp * KPW + lane // LPK, lane & (LPK - 1)  # key slot; lane within the key
        n_kv = k.shape[2] if paged else k.shape[1]
        rc, z, hk, b = block_of(n_chunks, splits, n_kv)  # (row chunk, split, K/V head, batch)
        group, sq = q.shape[1] // n_kv, q.shape[2]
        n_rows = group * sq
        pr0 = rc * RB  # the block's packed rows pr0 … pr0 + RB − 1: query i = pr // group
        qv = cuda.local.array(N_Q, acc)  # the lane's 8 values of each row's q: loads first,
        row_i = cuda.local.array(RB, int64)  # in flight with (paged) the length's, below
        slope = cuda.local.array(RB, acc)  # ALiBi: the slope of each row's query head
        cap_a = acc(0.0)
        for r in range(RB):
            pr = pr0 + r
            h, row_i[r] = row_of(pr, hk, group)
            if MODS:
                cap_a, slope[r] = setup_mods(cap, slopes, b, h)
            if pr < n_rows:
                row_slots(q, b, h, row_i[r], t, d, qv, r * EPL)
            else:
                for c in range(EPL):
                    qv[r * EPL + c] = acc(0.0)
        if paged:  # clamped to the table row: an unchecked length reads nothing outside it
            sk = min(max(int64(seqlens[b]), 0), int64(table.shape[1]) * k.shape[1])
        else:
            sk = int64(k.shape[2])
        shift = sk - sq  # the Sq queries are the last Sq positions
        i_first = jit.udivmod(pr0, group)[0]
        i_last = jit.udivmod(min(pr0 + RB, n_rows) - 1, group)[0]
        lo, hi = vis.key_range(i_first, i_last, shift, left, right, 0, sk)
        if kv_chunk > 0:  # splits of exactly kv_chunk positions
            a, e = max(lo, z * kv_chunk), min(hi, z * kv_chunk + kv_chunk)
        else:  # Z even shares of the keys the rows see
            per = -(-max(hi - lo, 0) // splits)
            a = lo + z * per
            e = min(hi, a + per)

        sc = acc(scale)  # applied to the scores: q's loads need not land before the loop starts
        m = cuda.local.array(RB, acc)  # each row's state (m, ℓ, O) over this slot's keys
        l = cuda.local.array(RB, acc)
        ov = cuda.local.array(N_Q, acc)  # O: the lane's 8 columns of each row
        kb = cuda.local.array(N_KV, acc)  # U keys' rows of K and V
        vb = cuda.local.array(N_KV, acc)
        s = cuda.local.array(N_S, acc)
        s_o = cuda.local.array(N_S, acc)  # a partner lane's values, in the butterflies
        m_o = cuda.local.array(RB, acc)
        l_o = cuda.local.array(RB, acc)
        o_o = cuda.local.array(N_Q, acc)
        for r in range(RB):
            m[r], l[r] = acc(-math.inf), acc(0.0)
        for c in range(N_Q):
            ov[c] = acc(0.0)

        j = a
        while j < e:
            # load U keys' rows of K and V (all in flight before any is used)
            for u in range(U):
                key = j + u * KS + slot
                if key < e:
                    i0, i1, i2 = b, hk, key  # dense: k[b, hk, key]
                    if paged:  # position → (block, row): table[b, key // bs], key % bs
                        if page_shift >= 0:
                            i0, i1 = table[b, key >> page_shift], key & ((1 << page_shift) - 1)
                        else:
                            i0, i1 = table[b, key // k.shape[1]], key % k.shape[1]
                        i0 = min(max(i0, 0), k.shape[0] - 1)  # never outside the pool
                        i2 = hk
                    row_slots(k, i0, i1, i2, t, d, kb, u * EPL)
                    row_slots(v, i0, i1, i2, t, dv, vb, u * EPL)
                else:
                    for c in range(EPL):
                        kb[u * EPL + c] = acc(0.0)
                        vb[u * EPL + c] = acc(0.0)
            # S = q·k: this lane's 8 products, then the sum over the key's LPK lanes
            for r in range(RB):
                for u in range(U):
                    x_s = acc(0.0)
                    for c in range(EPL):
                        x_s += qv[r * EPL + c] * kb[u * EPL + c]
                    s[r * U + u] = x_s * sc
            offset = LPK // 2
            while offset > 0:  # butterfly: every lane of the key ends with the full sums
                swap_s(s, s_o, offset)
                for c in range(N_S):
                    s[c] += s_o[c]
                offset //= 2
            if MODS:  # soft-cap, ALiBi: the scaled scores, before the mask
                for r in range(RB):
                    for u in range(U):
                        key = j + u * KS + slot
                        s[r * U + u] = modify(s[r * U + u], cap_a, slope[r], row_i[r] + shift - key)
            # mask: keys past the range, and those outside a row's band
            if j + U * KS > e or vis.band_edge(j, j + U * KS - 1, i_first, i_last, shift, left, right):
                for r in range(RB):
                    for u in range(U):
                        key = j + u * KS + slot
                        if key >= e or not vis.sees(row_i[r], key, shift, left, right):
                            s[r * U + u] = acc(-math.inf)
            # the online update of each row's (m, ℓ, O)
            for r in range(RB):
                mx = s[r * U]
                for u in range(1, U):
                    mx = nan_max(s[r * U + u], mx)
                m_new = nan_max(mx, m[r])
                alpha = weight_device(m[r], m_new)  # exp(m − m'), 0 when m = −inf
                part = acc(0.0)
                for u in range(U):
                    p = weight_device(s[r * U + u], m_new)
                    s[r * U + u] = p
                    part += p
                l[r] = alpha * l[r] + part
                m[r] = m_new
                for c in range(EPL):
                    x_o = alpha * ov[r * EPL + c]
                    for u in range(U):
                        x_o += s[r * U + u] * vb[u * EPL + c]
                    ov[r * EPL + c] = x_o
            j += U * KS

        # the key slots of a warp: fold their states (butterfly over the slots)
        offset = LPK
        while offset < 32:
            swap_state(m, l, ov, m_o, l_o, o_o, offset)
            for r in range(RB):
                m_n = nan_max(m[r], m_o[r])
                w_a, w_b = weight_device(m[r], m_n), weight_device(m_o[r], m_n)
                m[r], l[r] = m_n, w_a * l[r] + w_b * l_o[r]
                for c in range(EPL):
                    ov[r * EPL + c] = w_a * ov[r * EPL + c] + w_b * o_o[r * EPL + c]
            offset *= 2
        # the warps, through shared memory: the block's (O, LSE) → o, lse or the partials
        fold_w(m, l, ov, t, o, lse, o_ws, lse_ws, z, splits, b, hk, group, pr0, n_rows)

        if splits > 1:  # the last block of the Z to finish merges the partials
            merge_z(counters, (b * n_kv + hk) * n_chunks + rc, o_ws, lse_ws, o, lse, splits,
                    b, hk, group, pr0, n_rows)

    return decode
