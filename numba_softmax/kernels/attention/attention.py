"""a1 — FlashAttention forward on CUDA cores: softmax(scale·Q Kᵀ) V in one pass, never the Sq×Sk matrix.

Attention is a softmax over each row of the score matrix S = scale·Q Kᵀ, followed by a
weighted sum of the rows of V.  The materialised way writes S (Sq×Sk values) to memory,
reads it back for the softmax, writes P, reads P back for P·V.  FlashAttention keeps the
online-softmax state of every query row on chip and streams K and V past it: the state is
(m, ℓ, O) — the running max, the running Σ exp(s − m), and the running Σ exp(s − m)·v —
and a tile of keys is folded into it with the combiner of :mod:`numba_softmax.combine`.

The algorithm, in the paper's notation (Dao et al., FlashAttention, Algorithm 1/2)::

    Q is cut into Tr = ⌈Sq/Br⌉ tiles Q_i of Br rows; K, V into tiles K_j, V_j of Bc rows.
    one block per (batch, head, i):
        m = −inf, ℓ = 0, O = 0                                   (per row of Q_i, on chip)
        for each key tile j that a row of Q_i can see:
            S    = scale · Q_i K_jᵀ              (Br×Bc, registers; masked scores are −inf)
            m'   = max(m, rowmax S)
            α    = exp(m − m'),  P = exp(S − m')   — both through ``weight``: a −inf
                                                      side weighs exactly 0, never NaN
            ℓ    = α·ℓ + rowsum P
            O    = α·O + P V_j
            m    = m'
        O_i = O / ℓ,  LSE_i = m + log ℓ    (a row that saw no key: O = 0, LSE = −inf)

Which keys a query sees (:mod:`.visible`, flash-attn's rule, aligned bottom-right): with
d = j − (i + Sk − Sq), ``causal`` keeps d <= 0 and ``window=(left, right)`` keeps
−left <= d <= right.  The key loop runs only over the band of keys the tile's rows see;
tiles the band's edge crosses get their scores masked, the others are not tested.  With
``causal`` the heaviest query tiles are scheduled first, so that the grid ends evenly.

Every thread computes a register tile — the classic SIMT matrix-multiply step: lane
(rg, cg) of a warp holds the scores of RPL rows × CPL columns and the output of the same
RPL rows × NPL columns (:mod:`.flash_tiles` draws the map).  Per 4 values of d it reads
RPL + CPL float4 from shared memory and does 4·RPL·CPL fused multiply-adds (RPL = CPL = 8:
16 loads feed 256 FMAs).  A row's Bc scores live in the 8 lanes of its row group: the row
max is a 3-step ``shfl_xor_sync`` butterfly; the row sum waits — every lane keeps the ℓ of
its own columns, re-based by the same α, and the 8 partials are added once, at the end.
P goes through shared memory (each warp writes and reads only its own rows).  Scores are
kept in base 2 (Q is staged times scale·log2 e), so exp(s − m) is one ``ex2``, and the
NaN-keeping row max is one ``max.NaN.f32`` (:mod:`.ptx`); LSE returns to base e at the end.

Also in the one kernel (runtime arguments, uniform over a block — no extra compilations):
grouped-query attention (query head h reads key/value head h // (Hq/Hkv), never
expanded: the heads of a group are neighbours in the grid and share K, V tiles through
L2); packed variable-length batches (``cu_seqlens``: sequence b owns rows
cu[b] … cu[b+1] of a (1, H, total, D) view); and key-range splits (``kv_chunk``: the
first kernel of split-KV, :mod:`.decode.decode`).  The grid is one axis of Tr·B·Hq blocks (no
65535 ceiling on batch·heads) and one axis of splits.  Compile-time options: soft-capping
and ALiBi (:mod:`.score_mods`), applied to each tile's scores before its mask.

FLOPs: 2·Sq·Sk·D for Q Kᵀ plus 2·Sq·Sk·Dv for P V — 4·Sq·Sk·D per (batch·head) when
Dv = D, about half of it with ``causal`` (Sq = Sk).
Bytes moved per (batch·head), b bytes per value: Q read once (Sq·D·b), O written once
(Sq·Dv·b), LSE written (4·Sq); K and V are read once per query tile, Tr·Sk·(D+Dv)·b,
mostly served from L2.  Never O(Sq·Sk).

NumPy twins: :func:`numba_softmax.reference.flash_attention` (``block_q`` = Br,
``block_k`` = Bc), :func:`~numba_softmax.reference.attention` (windows, GQA) and
:func:`~numba_softmax.reference.attention_varlen`.  Source: the (m, ℓ, O) update derived
in the sources (the online softmax notes and the book section on FlashAttention).
"""

import functools
import math

from numba import cuda, int64

from ...combine import lse_device
from ...runtime import launcher
from ..hw import jit
from . import score_mods, tileio
from . import visible as vis
from .flash_tiles import (GROUP, check_tiles, fit_tiles, grid_of, layout, shared_bytes, split_rows,
                          stager)
from ..hw.jit import accumulator
from ..hw.ptx import nan_max

FULL_MASK = 0xFFFFFFFF
MAX_HEAD_DIM = 128
LOG2E, LN2 = 1.0 / math.log(2.0), math.log(2.0)


def check_head_dims(d, dv):
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(
            f"head dimensions must be between 1 and {MAX_HEAD_DIM}, got D={d} (q, k) and "
            f"Dv={dv} (v)"
        )


@functools.cache
def kernel(dtype, d, dv, block_q, block_k, rows_per_lane=None, width=1, out_dtype=None,
           softcap_on=False, alibi_on=False):
    """The forward kernel for one (dtype, D, Dv, Br, Bc, RPL, global vector width, dtype of
    o — float32 for split partials, score modifications) — all compile-time.  Returns
    (kernel, threads)."""
    acc = accumulator(dtype)
    MODS = softcap_on or alibi_on
    store_o = jit.storer(dtype if out_dtype is None else out_dtype)
    WARPS, RPL = split_rows(block_q, rows_per_lane)
    THREADS = 32 * WARPS
    BR, BC = block_q, block_k
    CPL = BC // GROUP  # S columns per lane
    L = layout(d, dv, BR, BC)
    NPL, VV, DP, CP, DVP = L.npl, L.vv, L.dp, L.cp, L.dvp
    stage_q = stager(dtype, THREADS, BR, d, DP, width)
    stage_k = stager(dtype, THREADS, BC, d, DP, width)
    stage_v = stager(dtype, THREADS, BC, dv, DVP, width)
    load4, load_v = tileio.shared_load(4), tileio.shared_load(VV)
    store1 = tileio.shared_store(1)
    N_O, N_S, N_A = RPL * NPL, RPL * CPL, 4 * RPL  # register tile sizes
    setup_mods = score_mods.setup(acc, alibi_on, LOG2E)
    modify_tile = score_mods.tile_modifier(acc, softcap_on, alibi_on, RPL, CPL, GROUP)

    @jit.kernel
    def forward(q, k, v, o, lse, cu_q, cu_k, varlen, n_tiles, scale, kv_chunk, left, right,
                reverse):
        """q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) → o (Z·B, Hq, Sq, Dv),
        lse (Z·B, Hq, Sq); grid (Tr·B·Hq, Z).  ``varlen``: B = 1 and the sequences are
        cut by cu_q, cu_k (int32, B'+1).  With a score modification, ``scale`` is
        (scale, softcap, slopes)."""
        if MODS:
            scale, cap, slopes = scale
        tid = cuda.threadIdx.x
        # bit operations, not // and %: the compiler then knows these are >= 0 and drops
        # the negative-index fix-ups from the shared-memory addresses
        warp, lane = tid >> 5, tid & 31
        rg, cg = lane >> 3, lane & (GROUP - 1)
        n_heads = q.shape[1]
        tile, bh = cuda.blockIdx.x % n_tiles, cuda.blockIdx.x // n_tiles
        h, b = bh % n_heads, bh // n_heads
        if reverse:
            tile = n_tiles - 1 - tile  # causal: the longest rows first
        i0 = tile * BR
        ab, q_start, k_start, sq, sk = b, 0, 0, q.shape[2], k.shape[2]
        if varlen:  # sequence b: rows cu[b] … cu[b+1] of the packed axis
            ab, q_start, k_start = 0, int64(cu_q[b]), int64(cu_k[b])
            sq, sk = int64(cu_q[b + 1]) - q_start, int64(cu_k[b + 1]) - k_start
        if i0 >= sq:
            return  # a tile past this sequence's end (the grid is sized for the longest)
        hk = h // (n_heads // k.shape[1])  # GQA: this query head's key/value head
        zb = cuda.blockIdx.y * q.shape[0] + ab
        shift = sk - sq  # key j lies j − (i + shift) past query i's diagonal
        i_last = min(i0 + BR, sq) - 1
        z0 = cuda.blockIdx.y * kv_chunk
        partial = cuda.gridDim.y > 1  # split-KV: this block writes one range's partial
        lo, hi = vis.key_range(i0, i_last, shift, left, right, z0, min(sk, z0 + kv_chunk))
        row0 = warp * 4 * RPL  # this warp's first row in the tile
        sc, one, zero, ln2 = acc(scale * LOG2E), acc(1.0), acc(0.0), acc(LN2)
        neg_inf = acc(-math.inf)
        if MODS:  # in base 2, as the scores
            cap2, slope2 = setup_mods(cap, slopes, b, h)

        smem = cuda.shared.array(0, acc)  # Q_i, K_j, V_j, P at the offsets of the layout
        stage_q(smem, L.q0, q, ab, h, q_start + i0, q_start + sq, sc)  # Q_i·scale·log2 e

        m = cuda.local.array(RPL, acc)  # the state (m, ℓ, O) of the lane's rows
        l = cuda.local.array(RPL, acc)  # ℓ over this lane's columns only (summed at the end)
        o_acc = cuda.local.array(N_O, acc)
        s = cuda.local.array(N_S, acc)  # the lane's register tile of S
        a_frag = cuda.local.array(N_A, acc)  # 4 consecutive Q (or P) values per row
        k_frag = cuda.local.array(4, acc)
        v_frag = cuda.local.array(NPL, acc)
        for i in range(RPL):
            m[i] = neg_inf
            l[i] = zero
            for jv in range(NPL):
                o_acc[i * NPL + jv] = zero
        q_row = L.q0 + (row0 + rg) * DP  # where the lane's first row starts, in each tile
        k_row = L.k0 + cg * DP
        p_row = L.p0 + (row0 + rg) * CP
        v_col = L.v0 + VV * cg

        j0 = lo
        while j0 < hi:
            cuda.syncthreads()  # every warp is done with the previous K_j, V_j before they are overwritten
            stage_k(smem, L.k0, k, ab, hk, k_start + j0, k_start + hi, one)  # keys past hi read as 0
            stage_v(smem, L.v0, v, ab, hk, k_start + j0, k_start + hi, one)  # zeros, not garbage: 0·p is never NaN
            cuda.syncthreads()  # K_j, V_j (and, the first time, Q_i) are complete before anyone reads them

            # S = Q_i K_jᵀ: per 4 values of d, RPL + CPL float4 reads, 4·RPL·CPL FMAs
            for t in range(N_S):
                s[t] = zero
            dd = 0
            while dd < L.d4:  # a while loop: its counter is provably >= 0
                for i in range(RPL):
                    load4(smem, q_row + 4 * i * DP + dd, a_frag, 4 * i)
                for jj in range(CPL):
                    load4(smem, k_row + GROUP * jj * DP + dd, k_frag, 0)
                    for i in range(RPL):
                        for e in range(4):
                            s[i * CPL + jj] += a_frag[4 * i + e] * k_frag[e]
                dd += 4

            if MODS:  # soft-cap, ALiBi: every score of the tile, before the mask
                modify_tile(s, i0 + row0 + rg, j0 + cg, shift, cap2, slope2)

            # mask: the ragged last tile, and the tiles the band's edge crosses
            if j0 + BC > hi or vis.band_edge(j0, j0 + BC - 1, i0, i_last, shift, left, right):
                for i in range(RPL):
                    row = i0 + row0 + rg + 4 * i
                    for jj in range(CPL):
                        key = j0 + cg + GROUP * jj
                        if key >= hi or not vis.sees(row, key, shift, left, right):
                            s[i * CPL + jj] = neg_inf

            # the online update of each row's (m, ℓ, O); P → shared memory.  Scores are in
            # base 2 (Q was scaled by log2 e): exp(s − m) is one ex2 of s − m.
            for i in range(RPL):
                mx = s[i * CPL]
                for jj in range(1, CPL):
                    mx = nan_max(s[i * CPL + jj], mx)
                offset = GROUP // 2
                while offset > 0:  # the row max over its 8 lanes
                    mx = nan_max(cuda.shfl_xor_sync(FULL_MASK, mx, offset), mx)
                    offset //= 2
                m_new = nan_max(mx, m[i])
                # a row that has seen no key yet (m' = −inf) subtracts 0, not −inf: its
                # scores are all −inf and weigh 0, and its m stays −inf
                base = m_new if m_new != neg_inf else zero
                alpha = math.exp2(m[i] - base)  # exp(m − m'): 0 when m = −inf
                part = zero
                for jj in range(CPL):
                    s[i * CPL + jj] = math.exp2(s[i * CPL + jj] - base)  # P = exp(S − m'): 0 if masked
                    part += s[i * CPL + jj]
                    store1(smem, p_row + 4 * i * CP + cg + GROUP * jj, s, i * CPL + jj)
                l[i] = alpha * l[i] + part
                m[i] = m_new
                for jv in range(NPL):
                    o_acc[i * NPL + jv] *= alpha
            cuda.syncwarp(FULL_MASK)  # the warp's P rows are written before its lanes read them

            # O += P V_j: per 4 keys, RPL float4 of P, then per key NPL values of V
            c = 0
            while c < BC:
                for i in range(RPL):
                    load4(smem, p_row + 4 * i * CP + c, a_frag, 4 * i)
                for e in range(4):
                    for jv in range(NPL // VV):
                        load_v(smem, v_col + (c + e) * DVP + GROUP * VV * jv, v_frag, VV * jv)
                    for i in range(RPL):
                        for jv in range(NPL):
                            o_acc[i * NPL + jv] += a_frag[4 * i + e] * v_frag[jv]
                c += 4
            j0 += BC

        # epilogue: ℓ = Σ of the 8 lanes' partials; O / ℓ and LSE = m + log ℓ
        for i in range(RPL):
            lt = l[i]
            offset = GROUP // 2
            while offset > 0:
                lt += cuda.shfl_xor_sync(FULL_MASK, lt, offset)
                offset //= 2
            row = i0 + row0 + rg + 4 * i
            if row < sq:
                inv = one / lt if lt != zero else zero
                for jv in range(NPL):
                    col = VV * cg + GROUP * VV * (jv // VV) + jv % VV
                    if col < dv:
                        # ℓ = 0: the row saw no key → O = 0, chosen (its O may hold 0·NaN);
                        # a split's partial keeps that 0·NaN for the merge to weigh
                        x = o_acc[i * NPL + jv] * inv if lt != zero or partial else zero
                        o[zb, h, q_start + row, col] = store_o(x)
                if cg == 0:  # back to base e: LSE = m·ln 2 + log ℓ
                    lse[zb, h, q_start + row] = lse_device(m[i] * ln2, lt)

    return forward, THREADS


def launch(q, k, v, o, lse, *, causal=False, window=(-1, -1), scale=None, kv_chunk=None,
           cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, stream=0, small=False,
           block_q=None, block_k=None, rows_per_lane=None, softcap=0.0, alibi=None):
    """Run on 4-D device arrays q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv);
    Hq a multiple of Hkv (GQA/MQA).

    ``o`` (Z·B, Hq, Sq, Dv), dtype of q, and ``lse`` (Z·B, Hq, Sq, float32) receive the
    result; Z = 1 unless ``kv_chunk`` (keys per split) cuts the keys into
    Z = ⌈Sk/kv_chunk⌉ ranges, each written as a normalised partial (see :mod:`.decode.decode`).
    ``window=(left, right)``, ``causal``: :mod:`.visible`.  Varlen: int32 device arrays
    ``cu_seqlens_q``, ``cu_seqlens_k`` (B'+1 offsets, non-decreasing — the caller checks)
    with q, k, v, o, lse the (1, H, total, ·) views of packed (total, H, ·) tensors and
    ``max_seqlen_q`` the longest query sequence (it sizes the grid).  Tiles: ``block_q``,
    ``block_k`` (Br, Bc; default :func:`fit_tiles`), ``rows_per_lane`` (RPL).
    ``small``: the simulator's 2-warp tiles.  ``softcap`` (> 0: on) and ``alibi`` (float32
    slopes (1 or B, Hq) on the device, or None): :mod:`.score_mods`.
    """
    n_b, n_h, sq, d = q.shape
    n_kv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    check_head_dims(d, dv)
    if n_kv < 1 or n_h % n_kv or v.shape[1] != n_kv:
        raise ValueError(f"q has {n_h} heads, k {n_kv} and v {v.shape[1]}: k and v need one "
                         f"number of heads that divides q's")
    if block_q is None or block_k is None:
        fq, fk = fit_tiles(d, dv, small)
        block_q, block_k = block_q or fq, block_k or fk
    check_tiles(d, dv, block_q, block_k, rows_per_lane)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    left, right = vis.bounds(causal, window)
    kv_chunk, splits, n_batch, rows, cu_q, cu_k = grid_of(n_b, sq, sk, o, lse, kv_chunk,
                                                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q)
    varlen = cu_seqlens_q is not None
    tiles = -(-rows // block_q)
    blocks = tiles * n_batch * n_h
    if blocks == 0:
        return
    if blocks > 2**31 - 1:
        raise ValueError(f"{blocks} blocks exceed the grid's 2³¹ − 1")
    width = tileio.global_width([q, k, v], (d, dv))
    fwd, threads = kernel(q.dtype, d, dv, block_q, block_k, rows_per_lane, width, o.dtype,
                          *score_mods.flags(softcap, alibi))
    scale = score_mods.runtime(scale, softcap, alibi)
    reverse = right < vis.UNBOUNDED and left >= vis.UNBOUNDED  # causal-like: the last tiles see most keys
    launcher.launch(fwd, (blocks, splits), threads, stream,
                    (q, k, v, o, lse, cu_q, cu_k, varlen, tiles, scale, kv_chunk, left, right,
                     reverse), shared=shared_bytes(d, dv, block_q, block_k))
