"""The copies of the tensor-core decode kernel (:mod:`.decode_tc`): a warp's K/V tile into
its shared buffer, from the dense arrays or from a paged pool through the block table.

Three layouts (:data:`.decode_tc.LAYOUTS`): "dense", (B, Hkv, Sk, ·) rows; "pages", a pool
whose every tile lies inside one block — one table entry a tile, and the tile copies like
a dense one; "rows", a pool read row by row, each row's block from the table.  The table
entries a copy needs are read ahead of it (:func:`copies`' ``advance``), a tile or 32
tiles early, so that no copy waits on a table load.
"""

import functools

from numba import int32

from ..attention.staging import PAD, stager, up16
from ..hw import jit
from ..hw.mma import cp_async16
from ..hw.warp import shfl, shfl2


@functools.cache
def copies(dtype, d, dv, block_k, layout):
    """``(tile_pages, stage, advance)`` for one kernel configuration of :mod:`.decode_tc`
    (``layout``: one of its LAYOUTS): the table entries of a warp's copies, the copy of one
    tile into the warp's buffer, and the entries of its next copies."""
    paged, whole = layout != "dense", layout == "pages"
    BC = block_k
    DP, DVP = up16(d), up16(dv)
    KS, VS = DP + PAD, DVP + PAD  # shared row strides (16-bit values)

    @jit.device
    def entry(table, b, key, n_blocks, bs, page_shift):
        """Paged: the pool block of position ``key`` of sequence b, table[b, key // bs] —
        clamped to the table's row (a position past it: the row's last entry) and to the
        pool, never to the sequence's length, so the load need not wait for it."""
        page = key >> page_shift if page_shift >= 0 else jit.udivmod(key, bs)[0]
        return min(max(table[b, min(page, table.shape[1] - 1)], 0), n_blocks - 1)

    @jit.device
    def tile_pages(table, b, key0, step, halves, n_blocks, bs, page_shift, lane):
        """Paged: the pool blocks of keys key0 + lane·step and key0 + (lane + 32)·step
        (the second only with ``halves`` 2), one table entry a lane, in one load for the
        whole warp.  step 1: a tile's rows (a tile across pages); step Z·W·Bc: the warp's
        next 32 tiles, each inside one page.  Dense: nothing."""
        pg0, pg1 = int32(0), int32(0)
        if paged:
            pg0 = entry(table, b, key0 + lane * step, n_blocks, bs, page_shift)
            if halves > 1:
                pg1 = entry(table, b, key0 + (lane + 32) * step, n_blocks, bs, page_shift)
        return pg0, pg1

    # a warp's copy of a K or V tile: each lane one 16-byte column chunk, down the rows
    stage_k = stager(dtype, 32, BC, d, DP, KS, True, per_warp=True)
    stage_v = stager(dtype, 32, BC, dv, DVP, VS, True, per_warp=True)

    if paged:
        @jit.device
        def scattered(smem, base, x, n, width, stride, hk, key0, e, pg0, pg1, page_shift, lane):
            """A tile whose keys lie in several blocks of the pool x: row r's block is in
            lane r % 32's pg0 (pg1 for r ≥ 32), for position p: block table[b, p // bs],
            row p % bs.  16 bytes a lane per copy; keys ≥ e and columns ≥ n become zeros."""
            chunks, bs = width // 8, x.shape[1]
            for idx in range(lane, BC * chunks, 32):  # the same trip count in every lane
                r = idx // chunks
                c = 8 * (idx - r * chunks)
                key = min(key0 + r, e - 1)
                blk0, blk1 = shfl2(pg0, pg1, r & 31)
                row = (key & ((1 << page_shift) - 1) if page_shift >= 0
                       else jit.udivmod(key, bs)[1])
                cp_async16(smem, base + r * stride + c, x[blk1 if r >= 32 else blk0, :, hk],
                           row, min(c, n - 8), key0 + r < e and c < n)

        @jit.device
        def stage(smem, at, k, v, b, hk, key0, e, pg0, pg1, page_shift, lane, tile):
            """The warp copies K and V of keys key0 … key0 + Bc − 1 (its tile number
            ``tile``) from the pools into its buffer at ``at``.  Layout "pages" (every tile
            inside one block): lane tile % 32 holds the block id, and the tile copies like a
            dense one; "rows": row by row (:func:`scattered`)."""
            if whole:
                blk = shfl(pg0, tile & 31)  # (every lane shuffles: a warp-wide instruction)
                row0 = key0 & ((1 << page_shift) - 1)
                stage_k(smem, at, k[blk, :, hk], row0, row0 + e - key0)
                stage_v(smem, at + BC * KS, v[blk, :, hk], row0, row0 + e - key0)
            else:
                scattered(smem, at, k, d, DP, KS, hk, key0, e, pg0, pg1, page_shift, lane)
                scattered(smem, at + BC * KS, v, dv, DVP, VS, hk, key0, e, pg0, pg1, page_shift,
                          lane)
    else:
        @jit.device
        def stage(smem, at, k, v, b, hk, key0, e, pg0, pg1, page_shift, lane, tile):
            """The warp copies rows key0 … key0 + Bc − 1 of K[b, hk] and V[b, hk] into its
            buffer at ``at``; rows ≥ e and columns past D become zeros."""
            stage_k(smem, at, k[b, hk], key0, e)
            stage_v(smem, at + BC * KS, v[b, hk], key0, e)

    @jit.device
    def advance(pg0, pg1, table, b, key0, tile, count, step, n_blocks, bs, page_shift, lane):
        """Paged, after the warp staged its tile ``tile`` (keys from key0): the table
        entries its next copies need.  "pages": pg0 holds the blocks of the warp's
        tiles 32c … 32c + 31, pg1 those of the next 32 (``step`` keys apart) — at the end
        of a batch pg1 moves up and the batch after it is loaded, 32 tiles before its
        first copy.  "rows": the rows of the next tile, a tile ahead.  (A table load a
        tile ahead had held every copy back by its latency.)  Dense: nothing."""
        if paged:
            if whole:
                if (tile & 31) == 31:
                    pg0 = pg1
                    if tile + 33 < count:
                        pg1 = tile_pages(table, b, key0 + 33 * step, step, 1, n_blocks, bs,
                                         page_shift, lane)[0]
            elif tile + 1 < count:
                pg0, pg1 = tile_pages(table, b, key0 + step, 1, 2 if BC > 32 else 1, n_blocks,
                                      bs, page_shift, lane)
        return pg0, pg1

    return tile_pages, stage, advance
