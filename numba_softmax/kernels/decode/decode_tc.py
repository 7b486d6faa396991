"""d3 — split-KV decoding on tensor cores: every warp its own keys, its own copy pipeline.

The decode kernel of :mod:`.decode` reads the cache at half the device's rate: with one
query row per head, each lane's share of a score is 8 products, summed over the 16 lanes
of a key by a 4-step shuffle butterfly, so shuffles, exponentials and the O update cost
more instructions per byte than the memory system lets pass.  Here the products run on
``mma.sync`` (:mod:`.mma`), as in the forward kernel (:mod:`.attention_tc`), but with the
roles of the warps turned round::

    one block = W warps, the ≤ 16 packed query rows of one K/V head (GQA: the group's
                Hq/Hkv heads × Sq rows, row pr = i·group + g), split z of the keys:
                the rounds z, z + Z, z + 2Z, … of W·Bc keys (rounds dealt in turn)
        Q → registers, as A fragments, in every warp (rows past the last are zeros)
        warp w takes tile w of each of the block's rounds, Bc keys, and alone:
            K_j, V_j → the warp's own shared buffers (cp.async, ``stages`` deep: the
                       copies of the next stages − 1 tiles are in flight during tile j;
                       :func:`.staging.stager`, a lane per column chunk)
            S = Q K_jᵀ;  m' = max(m, rowmax S);  P = exp(scale·(S − m'))
            ℓ = α·ℓ + rowsum P;   O = α·O + P V_j        (P stays in registers)
        the W states (m, ℓ, O) meet in shared memory, folded by the combiner
        (:func:`.decode_merge.fold_shared`); with Z > 1 the block writes a partial and the
        last of the Z blocks folds them (:func:`.decode_merge.merge_when_last`)

A warp waits only for its own copies (``cp.async.wait_group``, then ``__syncwarp``): no
block-wide barrier in the loop, so a warp whose data has landed never waits for a slow
one, and the bytes in flight per multiprocessor — W·(stages − 1) tiles per block — are
what keeps a memory-bound kernel at the memory's rate.  Rows 4 … 15 of the mma are
padding with GQA 32/8 (four query heads per K/V head): the tensor cores have that much to
spare, the memory does not.

Rounds dealt in turn rather than Z contiguous ranges: a tile's place then needs no
sequence length, so a paged kernel reads its first table entries while seqlens[b] is
still on its way, and no 64-bit division of the length by Z waits before the first copy
(``kv_chunk``: a split's own range, round after round).  The K/V row of key p comes from
the dense (B, Hkv, Sk, D) arrays or from the pool through the block table (position p →
block table[b, p // bs], row p % bs): :data:`LAYOUTS`.
Causal, windows and Sq > 1 (speculative decoding) are the masks of :mod:`.visible`,
applied only to tiles that cross an edge.  fp16 / bf16; D and Dv multiples of 8 (the
16-byte copies); the dispatch (:mod:`.decode_launch`) sends everything else to
:mod:`.decode`.  Memory traffic and NumPy twins: as :mod:`.decode`.
"""

import functools
import math

import numba
from numba import cuda, int32, int64

from . import decode_tc_pages
from .decode_merge import block_of, fold_shared, merge_when_last, row_of
from ..attention.staging import PAD, up16
from ..attention import score_mods
from ..attention.tc_fold import fresh, lane_rows, tile_fold, tile_scores
from ..hw import jit
from ..hw.jit import LOG2E
from ..attention import visible as vis
from ..hw.mma import cp_async_commit, cp_async_wait, for_dtype

FULL = 0xFFFFFFFF
ROWS = 16  # packed query rows of a block: the mma's M
# where a tile's K/V rows come from: the dense (B, Hkv, Sk, D) arrays; a paged pool whose
# tiles each lie inside one block ("pages": bs = 2^s ≥ Bc, every split's tiles starting on
# a multiple of Bc — :func:`.decode_launch.layout` decides); a pool read row by row ("rows")
LAYOUTS = ("dense", "pages", "rows")


@functools.cache
def kernel(dtype, d, dv, rows, warps, block_k, stages, layout, softcap_on=False,
           alibi_on=False):
    """The kernel for one configuration; ``rows`` ≤ 16 packed rows per block (the fold's
    size); ``layout`` one of :data:`LAYOUTS`; ``softcap_on``, ``alibi_on``: the score
    modifications (:mod:`..attention.score_mods`).  Its arguments are :func:`.decode.kernel`'s."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    paged, whole = layout != "dense", layout == "pages"
    f32, u32 = numba.float32, numba.uint32
    mma, pack = for_dtype(dtype)
    load = jit.loader(dtype)
    W, BC, ST, RB = warps, block_k, stages, rows
    DP, DVP = up16(d), up16(dv)
    KD, NB, KB, NV = DP // 16, BC // 8, BC // 16, DVP // 8  # Q k-steps; S, P, O tiles
    KS, VS = DP + PAD, DVP + PAD  # shared row strides (16-bit values)
    TILE = BC * (KS + VS)  # one stage of one warp: K_j, then V_j
    N_STATE = W * RB  # the fold's states (a shared array's size must be a constant)
    wait_tile = cp_async_wait(ST - 1)  # tile j's group, with ST − 1 later ones in flight
    finish = fold_shared(dtype, dv, DVP, RB, W)
    merge_z = merge_when_last(dtype, dv, RB, W)
    fold = tile_fold(dtype, NB, NV, KB, BC, KS, VS)
    scores = tile_scores(dtype, NB, KD, KS)
    MODS = softcap_on or alibi_on
    modify_rows = score_mods.rows_modifier(softcap_on, alibi_on, NB)
    setup_mods = score_mods.setup(f32, alibi_on, 1.0)

    tile_pages, stage, advance = decode_tc_pages.copies(dtype, d, dv, BC, layout)

    @jit.kernel
    def decode(q, k, v, o, lse, o_ws, lse_ws, counters, table, seqlens, scale, left, right,
               kv_chunk, splits, n_chunks, page_shift):
        if MODS:
            scale, cap, slopes = scale
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3  # this lane's place in every fragment (mma.py)
        n_kv = k.shape[2] if paged else k.shape[1]
        rc, z, hk, b = block_of(n_chunks, splits, n_kv)  # (row chunk, split, K/V head, batch)
        group, sq = q.shape[1] // n_kv, q.shape[2]
        n_blocks, bs = k.shape[0], k.shape[1]  # (paged: the pool)
        # the tiles of split z, in rounds of W tiles (one a warp, adjacent keys): with
        # kv_chunk its kv_chunk keys from a0, round after round; else the Z splits are
        # dealt the rounds of the rows' keys in turn — split z takes rounds z, z + Z, … —
        # so a tile's place needs no sequence length (a0 = 0 unless a window moves it)
        if kv_chunk > 0:
            a0, first, stride = z * kv_chunk, int64(0), int64(1)
        else:
            a0, first, stride = int64(0), int64(z), int64(splits)
        u0 = first * W + warp  # the warp's first tile: tiles u0, u0 + stride·W, …
        step = stride * (W * BC)  # keys from one of the warp's tiles to its next
        # paged: the blocks of the warp's first copies (:func:`advance`), read before
        # seqlens[b] has arrived — "pages": those of its first 32 tiles (and of the next
        # 32); "rows": the rows of its first tile
        sk = int64(seqlens[b]) if paged else int64(k.shape[2])  # (its load issued first)
        pg0, pg1 = int32(0), int32(0)
        if paged and table.shape[1] > 0:
            more = a0 + u0 * BC + 32 * step < int64(table.shape[1]) * bs  # a 33rd tile fits
            pg0, pg1 = tile_pages(table, b, a0 + u0 * BC, step if whole else 1,
                                  (2 if more else 1) if whole else (2 if BC > 32 else 1),
                                  n_blocks, bs, page_shift, lane)
        if paged:  # clamped to the table row: an unchecked length reads nothing outside it
            sk = min(max(sk, 0), int64(table.shape[1]) * bs)
        shift = sk - sq  # the Sq queries are the last Sq positions
        n_rows = group * sq
        pr0 = rc * RB  # the block's packed rows pr0 … pr0 + RB − 1
        i_first = jit.udivmod(pr0, group)[0]
        i_last = jit.udivmod(min(pr0 + RB, n_rows) - 1, group)[0]
        lo, hi = vis.key_range(i_first, i_last, shift, left, right, 0, sk)
        if kv_chunk > 0:  # the split's keys [a, e): seen by the rows, inside its chunk
            a, e = max(lo, a0), min(hi, a0 + kv_chunk)
        else:
            a, e = lo, hi
        zero, neg_inf = f32(0.0), f32(-math.inf)
        sc = f32(abs(scale))
        c2 = sc * f32(LOG2E)  # exp(sc·x) = exp2(c2·x)
        sign = f32(-1.0) if scale < 0 else f32(1.0)  # sc·(sign·Q)Kᵀ = scale·QKᵀ
        x_sc, cap32 = sc, zero
        if MODS:  # the scores become modified base-e scores: the fold weighs them unscaled
            sc, c2 = f32(1.0), f32(LOG2E)

        # the first ST − 1 of the warp's tiles: copies started before anything else
        smem = cuda.shared.array(0, numba.uint16)  # W × stages × (K_j: Bc×KS, V_j: Bc×VS)
        mine = warp * ST * TILE  # this warp's buffers
        n_tiles = (e - a + BC - 1) // BC if e > a else 0
        count = int64(0)  # the warp's tiles: u0, u0 + stride·W, … below n_tiles
        if n_tiles > u0:
            count = jit.udivmod(n_tiles - u0 + stride * W - 1, stride * W)[0]
        key_w = a + u0 * BC  # the warp's first key; its tile it starts at key_w + it·step
        if paged and not whole and count > 0 and a != a0:  # a window moved the tiles
            pg0, pg1 = tile_pages(table, b, key_w, 1, 2 if BC > 32 else 1, n_blocks, bs,
                                  page_shift, lane)
        for it in range(ST - 1):
            if it < count:
                key0, at = key_w + it * step, mine + it * TILE
                stage(smem, at, k, v, b, hk, key0, e, pg0, pg1, page_shift, lane, it)
                pg0, pg1 = advance(pg0, pg1, table, b, key0, it, count, step, n_blocks, bs,
                                   page_shift, lane)
            cp_async_commit()  # (an empty group where there is no tile: the count stays right)
        # Q → A fragments: a0 (row g, cols 2t, 2t+1), a1 (row g+8), a2, a3 (cols + 8);
        # loaded while the first tiles' copies are in flight
        qf = cuda.local.array((KD, 4), u32)
        row_i = cuda.local.array(2, int64)  # the query index of the lane's rows g, g + 8
        slope = cuda.local.array(2, f32)  # ALiBi: the slope of each row's query head
        for rr in range(2):
            pr = pr0 + g + 8 * rr
            h, i = row_of(pr, hk, group)  # (once a row: a division)
            row_i[rr] = i
            if MODS:
                cap32, slope[rr] = setup_mods(cap, slopes, b, h)
            for kk in range(KD):
                for half in range(2):
                    col = 16 * kk + 2 * t + 8 * half
                    x0, x1 = zero, zero
                    if pr - pr0 < RB and pr < n_rows and col < d:  # (d even: col + 1 < d)
                        x0, x1 = load(q[b, h, i, col]) * sign, load(q[b, h, i, col + 1]) * sign
                    qf[kk, rr + 2 * half] = pack(x0, x1)
        m = cuda.local.array(2, f32)  # the state of rows g (index 0) and g + 8 (1)
        l = cuda.local.array(2, f32)  # ℓ over this lane's columns (the quad sums at the end)
        of = cuda.local.array((NV, 4), f32)  # O: Dv/8 accumulator tiles
        s = cuda.local.array((NB, 4), f32)  # S, then P
        pf = cuda.local.array((KB, 4), u32)  # P as A fragments
        fresh(m, l, of)
        k_lane, v_lane = lane_rows(lane, KS, VS)  # where ldmatrix reads for this lane

        for it in range(count):
            j0 = key_w + it * step
            nxt = it + ST - 1  # its buffer held tile it − 1, which every lane is done with
            if nxt < count:
                key0, at = key_w + nxt * step, mine + (nxt % ST) * TILE
                stage(smem, at, k, v, b, hk, key0, e, pg0, pg1, page_shift, lane, nxt)
                pg0, pg1 = advance(pg0, pg1, table, b, key0, nxt, count, step, n_blocks, bs,
                                   page_shift, lane)
            cp_async_commit()
            wait_tile()  # this lane's copies of tile it have landed …
            cuda.syncwarp(FULL)  # … and every lane's: the warp may read the buffer
            base = mine + (it % ST) * TILE

            scores(s, qf, smem, base, k_lane)  # S = Q K_jᵀ on tensor cores
            if MODS:  # soft-cap, ALiBi: before the mask
                modify_rows(s, x_sc, row_i, j0 + 2 * t, shift, cap32, slope)

            # mask: only tiles that cross e or a band edge, element by element
            if j0 + BC > e or vis.band_edge(j0, j0 + BC - 1, i_first, i_last, shift, left, right):
                for rr in range(2):
                    for n in range(NB):
                        for c in range(2):
                            key = j0 + 8 * n + 2 * t + c
                            if key >= e or not vis.sees(row_i[rr], key, shift, left, right):
                                s[n, 2 * rr + c] = neg_inf

            # the online update of (m, ℓ, O) for the lane's two rows; O += P V_j
            fold(s, m, l, of, pf, sc, c2, smem, base, v_lane)
            cuda.syncwarp(FULL)  # every lane is done with the buffer before it is refilled

        # the W warps' states → shared memory (the staging buffers' bytes, now free)
        cuda.syncthreads()  # every warp is done with its buffers
        f_s = cuda.shared.array(N_STATE, f32)  # m·scale of each warp's rows, then its factor
        l_s = cuda.shared.array(N_STATE, f32)
        o_s = cuda.shared.array(0, f32)  # W·RB·DVP: each warp's O (unnormalised)
        for rr in range(2):
            lt = l[rr]
            lt += cuda.shfl_xor_sync(FULL, lt, 1)  # ℓ: the quad's columns
            lt += cuda.shfl_xor_sync(FULL, lt, 2)
            row = g + 8 * rr
            if row < RB:
                at = u32(warp * RB + row)  # (unsigned indices: no negative-index fix-ups)
                if t == 0:
                    f_s[at], l_s[at] = m[rr] * sc, lt
                for n in range(NV):
                    for c in range(2):
                        o_s[at * u32(DVP) + u32(8 * n + c) + u32(2 * t)] = of[n, 2 * rr + c]
        cuda.syncthreads()  # every warp's state is in shared memory
        finish(f_s, l_s, o_s, o, lse, o_ws, lse_ws, z, splits, b, hk, group, pr0, n_rows)
        if splits > 1:  # the last block of the Z to finish merges the partials
            merge_z(counters, (b * n_kv + hk) * n_chunks + rc, o_ws, lse_ws, o, lse, splits,
                    b, hk, group, pr0, n_rows)

    return decode
