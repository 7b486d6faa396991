"""a2 — FlashAttention-2 forward on tensor cores (fp16 / bf16 in, float32 accumulation).

The same fold as :mod:`.attention` — per query row a state (m, ℓ, O), each tile of keys
merged in with the combiner — with both matrix products on ``mma.sync`` (:mod:`.mma`)::

    one block = W warps = Br = 16·W query rows of one (sequence, head); warp w owns 16 rows
        Q_w → registers, as A fragments (loaded once)
        for each key tile j of Bc keys (only those some row of the block can see):
            K_j, V_j → shared memory (cp.async, two buffers: tile j+1 lands during tile j)
            S = Q_w K_jᵀ            mma: D/16 × Bc/8 per warp, S in accumulator fragments
            m' = max(m, rowmax S)   per lane over its 2·Bc/8 values, then the quad (2 shuffles)
            P = exp(scale·(S − m')), α = exp(scale·(m − m'))   (the combiner's weights)
            ℓ = α·ℓ + rowsum P      the lane's own columns; the quad sums once, at the end
            O = α·O + P V_j         P rounded to fp16/bf16 *in registers* is the A operand
        O / ℓ (one division), LSE = scale·m + log ℓ; rows that saw no key: O = 0, LSE = −inf

Masks, all "query i sees key j" of :func:`numba_softmax.reference.visible` with
d = j − (i + Sk − Sq): causal ⇒ d ≤ 0; ``window=(left, right)``: −left ≤ d ≤ right.  A
block visits only keys in [lo, hi): the union of its rows' windows, cut to the split's
range; keys outside it are never read (tiles past ``hi`` are zero-filled in shared
memory).  Inside [lo, hi) only the tiles that cross a window edge are masked, element by
element.  GQA: query head h reads K/V head h // (Hq / Hkv) — never copied.  Varlen:
sequence b owns rows cu[b] : cu[b+1] of (1, H, total, D) arrays.  Split-KV: grid axis z
takes keys [z·C, (z+1)·C) and writes a normalised partial to row z·B + b of o and lse.

FLOPs 4·Sq·Sk·D per (batch·head) (Dv = D), half with causal; bytes: Q, O once; K, V once
per query tile (from L2 mostly).  Step-by-step derivation: ``docs/algorithms/tensor_cores.md``.
NumPy twin: :func:`numba_softmax.reference.attention`.  Sources: Dao, FlashAttention-2
(Algorithm 1, and ``softmax.h``'s quad all-reduce); the (m, ℓ, O) update of the sources.
"""

import functools
import math

import numba
import numpy as np
from numba import cuda

from ...runtime.sim import simulator_enabled
from ...combine import lse_device
from ...runtime import counters, launcher
from ..hw import jit
from ..hw.jit import LOG2E
from ..hw.mma import cp_async_commit, cp_async_wait_all, for_dtype
from . import score_mods
from .staging import PAD, aligned, stager, up16
from .tc_fold import fresh, lane_rows, tile_fold, tile_scores

FULL = 0xFFFFFFFF
MAX_HEAD_DIM = 256
class Tiles:
    """A launch configuration: ``warps`` W (Br = 16·W query rows), ``block_k`` Bc keys per
    tile, ``stages``: 1 or 2 shared-memory buffers (2: double-buffered), ``min_blocks``:
    blocks per multiprocessor the compiler must fit (launch bounds; 0: none, None: 3 for
    D <= 64 with the default tiles, where it costs no spills)."""

    def __init__(self, d, dv, warps=None, block_k=None, stages=2, min_blocks=None, small=False):
        if small:  # the simulator: one warp, one 16×16 tile per mma step
            warps, block_k = warps or 1, block_k or 16
        self.warps = warps or 4
        self.block_k = block_k or (64 if max(d, dv) <= 128 else 32)
        if min_blocks is None:  # D <= 64: 163 registers instead of 172, 3 blocks a SM, not 2
            min_blocks = 3 if max(d, dv) <= 64 and self.warps == 4 and self.block_k <= 64 else 0
        self.stages, self.min_blocks = stages, min_blocks or None
        if self.warps not in (1, 2, 4, 8) or self.block_k % 16 or not 16 <= self.block_k <= 256:
            raise ValueError(f"warps must be 1, 2, 4 or 8 and block_k a multiple of 16 "
                             f"up to 256, got warps={self.warps}, block_k={self.block_k}")
        if stages not in (1, 2):
            raise ValueError(f"stages must be 1 or 2, got {stages}")
        self.dp, self.dvp = up16(d), up16(dv)
        self.shared = 2 * stages * self.block_k * (self.dp + self.dvp + 2 * PAD)
        if self.shared > launcher.device_limits().shared_optin and not simulator_enabled():
            raise ValueError(f"tiles warps={self.warps}, block_k={self.block_k}, "
                             f"stages={stages} need {self.shared} bytes of shared memory")


@functools.cache
def kernel(dtype, out_dtype, d, dv, warps, block_k, stages, vec, min_blocks=None,
           softcap_on=False, alibi_on=False):
    """The forward kernel for one configuration (all compile-time; masks, varlen and the
    split are run-time arguments).  ``min_blocks``: ask the compiler to fit that many
    blocks on a multiprocessor (launch bounds: fewer registers); ``softcap_on``,
    ``alibi_on``: the score modifications (:mod:`.score_mods`).  Returns (kernel,
    threads per block)."""
    MODS = softcap_on or alibi_on
    setup_mods = score_mods.setup(numba.float32, alibi_on, 1.0)
    f32, u32 = numba.float32, numba.uint32
    mma, pack = for_dtype(dtype)
    load, store = jit.loader(dtype), jit.storer(out_dtype)
    W, BC, THREADS = warps, block_k, 32 * warps
    DP, DVP = up16(d), up16(dv)
    KD, NB, KB, NV = DP // 16, BC // 8, BC // 16, DVP // 8  # fragments: Q k-steps, S/P/O tiles
    KS, VS = DP + PAD, DVP + PAD  # shared row strides (16-bit values)
    TILE = BC * (KS + VS)  # one stage: K_j, then V_j
    stage_k = stager(dtype, THREADS, BC, d, DP, KS, vec)
    stage_v = stager(dtype, THREADS, BC, dv, DVP, VS, vec)
    fold = tile_fold(dtype, NB, NV, KB, BC, KS, VS)
    scores = tile_scores(dtype, NB, KD, KS)
    modify_frag = score_mods.fragment_modifier(softcap_on, alibi_on, NB)

    @jit.kernel(launch_bounds=(THREADS, min_blocks) if min_blocks else None)
    def forward(q, k, v, o, lse, cu_q, cu_k, scale, kv_chunk, left, right):
        """q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) → o (Z·B, Hq, Sq, Dv),
        lse (Z·B, Hq, Sq); grid (B·Hq·Tr, 1, Z).  Varlen: B = 1, S = all rows.  With a
        score modification ``scale`` is (scale, softcap, slopes)."""
        if MODS:
            scale, cap, slopes = scale
        warp, lane = cuda.threadIdx.x >> 5, cuda.threadIdx.x & 31
        g, t = lane >> 2, lane & 3  # this lane's place in every fragment (mma.py)
        n_h = q.shape[1]
        varlen = cu_q.shape[0] > 1  # (without varlen, a dummy of one element)
        n_seq = cu_q.shape[0] - 1 if varlen else q.shape[0]
        n_tq = cuda.gridDim.x // (n_seq * n_h)
        bh, tile = cuda.blockIdx.x // n_tq, cuda.blockIdx.x % n_tq
        b, h = bh // n_h, bh % n_h
        hk = h // (n_h // k.shape[1])  # GQA: the K/V head this query head reads
        if varlen:
            bq, q_off, k_off = 0, cu_q[b], cu_k[b]
            sq, sk = cu_q[b + 1] - q_off, cu_k[b + 1] - k_off
        else:
            bq, q_off, k_off = b, 0, 0
            sq, sk = q.shape[2], k.shape[2]
        if right >= 0:
            tile = n_tq - 1 - tile  # the longest rows first: the grid ends evenly
        i0 = tile * 16 * W
        if i0 >= sq:
            return  # varlen: a sequence shorter than the longest
        ob = cuda.blockIdx.z * q.shape[0] + bq  # the output row of this split
        # this (sequence, head)'s rows: 2-D views, row 0 = the sequence's first
        q_s, k_s, v_s = q[bq, h, q_off:], k[bq, hk, k_off:], v[bq, hk, k_off:]
        o_s, lse_s = o[ob, h, q_off:], lse[ob, h, q_off:]
        shift = sk - sq  # key j's distance past row i's diagonal: d = j − (i + shift)
        lo = cuda.blockIdx.z * kv_chunk  # [lo, hi): the keys some row of the block sees
        hi = min(sk, lo + kv_chunk)
        if left >= 0:
            lo = max(lo, i0 + shift - left)
        if right >= 0:
            hi = min(hi, min(i0 + 16 * W, sq) + shift + right)
        n_tiles = (hi - lo + BC - 1) // BC if hi > lo else 0
        zero, neg_inf = f32(0.0), f32(-math.inf)
        sc = f32(abs(scale))
        c2 = sc * f32(LOG2E)  # exp(sc·x) = exp2(c2·x)
        sign = f32(-1.0) if scale < 0 else f32(1.0)  # sc·(sign·Q)Kᵀ = scale·QKᵀ
        if MODS:  # the scores become modified base-e scores: the fold weighs them unscaled
            x_sc, sc, c2 = sc, f32(1.0), f32(LOG2E)
            cap32, slope = setup_mods(cap, slopes, b, h)

        # Q_w → A fragments: a0 (row g, cols 2t, 2t+1), a1 (row g+8), a2, a3 (cols + 8)
        row_a = i0 + 16 * warp + g  # this lane's rows: row_a and row_a + 8
        qf = cuda.local.array((KD, 4), u32)
        for kk in range(KD):
            for r in range(4):
                row, col = row_a + 8 * (r & 1), 16 * kk + 2 * t + 8 * (r >> 1)
                x0, x1 = zero, zero
                if row < sq:
                    if col < d:
                        x0 = load(q_s[row, col]) * sign
                    if col + 1 < d:
                        x1 = load(q_s[row, col + 1]) * sign
                qf[kk, r] = pack(x0, x1)

        m = cuda.local.array(2, f32)  # the state of rows row_a (index 0) and row_a + 8 (1)
        l = cuda.local.array(2, f32)  # ℓ over this lane's columns only (the quad sums at the end)
        of = cuda.local.array((NV, 4), f32)  # O: Dv/8 accumulator tiles
        s = cuda.local.array((NB, 4), f32)  # S, then P: Bc/8 accumulator tiles
        pf = cuda.local.array((KB, 4), u32)  # P as A fragments: Bc/16 of them
        fresh(m, l, of)
        k_lane, v_lane = lane_rows(lane, KS, VS)  # where ldmatrix reads for this lane

        smem = cuda.shared.array(0, numba.uint16)  # stages × (K_j: Bc×KS, V_j: Bc×VS)
        if stages == 2 and n_tiles > 0:  # the first tile's copies start before the loop
            stage_k(smem, 0, k_s, lo, hi)
            stage_v(smem, BC * KS, v_s, lo, hi)
            cp_async_commit()
        for it in range(n_tiles):
            j0 = lo + it * BC
            base = (it & 1) * TILE if stages == 2 else 0
            if stages == 1:
                cuda.syncthreads()  # every warp is done with tile j−1 before it is overwritten
                stage_k(smem, 0, k_s, j0, hi)
                stage_v(smem, BC * KS, v_s, j0, hi)
                cp_async_commit()
            cp_async_wait_all()  # this thread's copies of tile j are complete
            cuda.syncthreads()  # everyone's are; and every warp is done with tile j−1
            if stages == 2 and it + 1 < n_tiles:  # so tile j+1 may go to its buffer now,
                nxt = TILE - base  # and lands while tile j is used
                stage_k(smem, nxt, k_s, j0 + BC, hi)
                stage_v(smem, nxt + BC * KS, v_s, j0 + BC, hi)
                cp_async_commit()

            scores(s, qf, smem, base, k_lane)  # S = Q_w K_jᵀ on tensor cores
            if MODS:  # soft-cap, ALiBi: before the mask
                modify_frag(s, x_sc, row_a, j0 + 2 * t, shift, cap32, slope)

            # mask: only tiles that cross hi or a window edge, element by element
            if j0 + BC > hi or (left >= 0 and j0 < i0 + 16 * W - 1 + shift - left) \
                    or (right >= 0 and j0 + BC - 1 > i0 + shift + right):
                for rr in range(2):
                    diag = row_a + 8 * rr + shift  # the row sees keys [k_lo, k_hi)
                    k_lo = diag - left if left >= 0 else 0
                    k_hi = min(hi, diag + right + 1) if right >= 0 else hi
                    for n in range(NB):
                        for e in range(2):
                            key = j0 + 8 * n + 2 * t + e
                            if key < k_lo or key >= k_hi:
                                s[n, 2 * rr + e] = neg_inf

            # the online update of (m, ℓ, O) for the lane's two rows; O += P V_j
            fold(s, m, l, of, pf, sc, c2, smem, base, v_lane)

        # O / ℓ once; ℓ = 0: the row saw no key → O = 0, chosen (its O may hold 0·NaN),
        # except in a split's partial, whose 0·NaN the merge weighs as one pass would
        partial = cuda.gridDim.z > 1
        for rr in range(2):
            lt = l[rr]
            lt += cuda.shfl_xor_sync(FULL, lt, 1)
            lt += cuda.shfl_xor_sync(FULL, lt, 2)
            row = row_a + 8 * rr
            if row < sq:
                inv = f32(1.0) / lt if lt != zero else zero
                for n in range(NV):
                    for e in range(2):
                        col = 8 * n + 2 * t + e
                        if col < dv:
                            x = of[n, 2 * rr + e] * inv if lt != zero or partial else zero
                            o_s[row, col] = store(x)
                if t == 0:
                    lse_s[row] = lse_device(m[rr] * sc, lt)

    return forward, THREADS


def _no_seqlens():
    """cu_seqlens when there are none (one element: the kernel reads none)."""
    return counters.placeholder(1, np.int32)


def _sequences(q, cu_q, cu_k, max_seqlen_q):
    """(cu_q, cu_k, sequences, rows of the longest) for the kernel's arguments."""
    if cu_q is None and cu_k is None:
        return _no_seqlens(), _no_seqlens(), q.shape[0], q.shape[2]
    if cu_q is None or cu_k is None or q.shape[0] != 1 or cu_q.ndim != 1 \
            or cu_q.shape != cu_k.shape or cu_q.dtype != np.int32 or cu_k.dtype != np.int32:
        raise ValueError("varlen needs cu_seqlens_q and cu_seqlens_k, int32 arrays of B+1 "
                         "offsets, and q, k, v of shape (1, H, total, D)")
    if max_seqlen_q is None:  # a device-to-host copy: pass it to avoid one
        max_seqlen_q = int(np.max(np.diff(cu_q.copy_to_host()), initial=0))
    return cu_q, cu_k, cu_q.shape[0] - 1, int(max_seqlen_q)


def check_head_dims(d, dv):
    """ValueError unless 1 <= D, Dv <= :data:`MAX_HEAD_DIM`."""
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(f"head dimensions must be between 1 and {MAX_HEAD_DIM}, got D={d} "
                         f"(q, k) and Dv={dv} (v)")


def launch(q, k, v, o, lse, *, causal=False, window=(-1, -1), scale=None, kv_chunk=None,
           cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, stream=0, small=False,
           softcap=0.0, alibi=None, **tile_options):
    """Run on 4-D device arrays q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv),
    all float16 or all uint16 (bfloat16 bits); Hq a multiple of Hkv; 1 ≤ D, Dv ≤ 256.
    ``softcap``, ``alibi``: as :func:`.attention.launch`.

    ``o`` (Z·B, Hq, Sq, Dv; q's dtype, or float32) and ``lse`` (Z·B, Hq, Sq, float32)
    receive the result; Z = 1 unless ``kv_chunk`` cuts the keys into Z = o.shape[0] / B
    ranges of that many keys, each written as a normalised partial (merge them with
    :func:`.merge.merge_splits_launch`).  Varlen: ``cu_seqlens_q``, ``cu_seqlens_k``
    int32 device arrays (B+1 offsets; the caller guarantees 0 ≤ cu[0] ≤ … ≤ cu[B] ≤ the
    arrays' rows), q, k, v, o, lse are (1, H, total, ·), ``max_seqlen_q`` sizes the grid.
    Any strides; K and V are staged with cp.async when :func:`.staging.aligned` (else
    value by value, slower).  ``tile_options``: those of :class:`Tiles`.
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D, got {q.shape}, {k.shape}, {v.shape}")
    n_b, n_h, sq, d = q.shape
    _, n_kv, sk, dv = v.shape
    if k.shape != (n_b, n_kv, sk, d) or v.shape[0] != n_b or n_kv < 1 or n_h % n_kv:
        raise ValueError(f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}")
    if not (q.dtype == k.dtype == v.dtype) or o.dtype not in (q.dtype, np.float32) \
            or lse.dtype != np.float32:
        raise TypeError(f"q, k, v need one dtype, o that dtype or float32, lse float32; got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}, {o.dtype}, {lse.dtype}")
    for_dtype(q.dtype)  # TypeError unless float16 or bfloat16 bits
    check_head_dims(d, dv)
    cu_q, cu_k, n_seq, rows = _sequences(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale != 0.0):
        raise ValueError(f"scale must be finite and nonzero, got {scale}")
    left, right = (int(x) for x in window)
    if causal:  # causal is the right window edge d <= 0
        right = 0 if right < 0 else min(right, 0)
    splits = 1 if kv_chunk is None else o.shape[0] // n_b
    kv_chunk = max(sk, 1) if kv_chunk is None else int(kv_chunk)
    if kv_chunk < 1 or (cu_seqlens_q is None and splits != max(1, -(-sk // kv_chunk))):
        raise ValueError(f"kv_chunk={kv_chunk} must be >= 1 and o, lse need one row per "
                         f"split and sequence on their first axis, got {o.shape[0]}")
    if o.shape != (splits * n_b, n_h, sq, dv) or lse.shape != (splits * n_b, n_h, sq):
        raise ValueError(f"o must be {(splits * n_b, n_h, sq, dv)} and lse "
                         f"{(splits * n_b, n_h, sq)}, got {o.shape} and {lse.shape}")
    tiles = Tiles(d, dv, small=small, **tile_options)
    blocks = n_seq * n_h * -(-rows // (16 * tiles.warps))
    if blocks == 0:
        return
    if blocks >= 2**31 or splits > 65535:
        raise ValueError(f"{blocks} blocks and {splits} splits: at most 2**31 - 1 and 65535")
    fwd, threads = kernel(q.dtype, o.dtype, d, dv, tiles.warps, tiles.block_k, tiles.stages,
                          aligned(k) and aligned(v), tiles.min_blocks,
                          *score_mods.flags(softcap, alibi))
    scale = score_mods.runtime(scale, softcap, alibi)
    launcher.launch(fwd, (blocks, 1, splits), threads, stream,
                    (q, k, v, o, lse, cu_q, cu_k, scale, kv_chunk, left, right),
                    shared=tiles.shared)
