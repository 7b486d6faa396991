"""v5 — FlashAttention forward: softmax(scale·Q Kᵀ) V in one pass, never the Sq×Sk matrix.

Attention is a softmax over each row of the score matrix S = scale·Q Kᵀ, followed by a
weighted sum of the rows of V.  The materialised way writes S (Sq×Sk values) to memory,
reads it back for the softmax, writes P, reads P back for P·V.  FlashAttention keeps the
online-softmax state of every query row on chip and streams K and V past it: the state is
(m, ℓ, O) — the running max, the running Σ exp(s − m), and the running Σ exp(s − m)·v —
and a tile of keys is folded into it with the combiner of :mod:`numba_softmax.combine`.

The algorithm, in the paper's notation (Dao et al., FlashAttention, Algorithm 1/2)::

    Q is cut into Tr = ⌈Sq/Br⌉ tiles Q_i of Br rows; K, V into Tc = ⌈Sk/Bc⌉ tiles of Bc rows.
    one block per (batch·head, i):
        m = −inf, ℓ = 0, O = 0                                   (per row of Q_i, on chip)
        for j in 0 … Tc−1   (causal: only the tiles that touch the visible keys)
            S    = scale · Q_i K_jᵀ              (Br×Bc, registers; masked scores are −inf)
            m'   = max(m, rowmax S)
            α    = exp(m − m'),  P = exp(S − m')   — both through ``weight``: a −inf
                                                      side weighs exactly 0, never NaN
            ℓ    = α·ℓ + rowsum P
            O    = α·O + P V_j
            m    = m'
        O_i = O / ℓ,  LSE_i = m + log ℓ    (a row that saw no key: O = 0, LSE = −inf)

Masking: a key j ≥ Sk (the ragged last tile) and, with ``causal``, a key above the
diagonal — query i sees key j iff j <= i + Sk − Sq (aligned bottom-right, as in
:mod:`numba_softmax.reference.attention`) — gets the score −inf.  Tiles that lie entirely
above the diagonal are never visited: the key loop stops at i0 + Br + Sk − Sq.  The
heaviest query tiles (the last ones) are scheduled first so that a causal grid ends evenly.

How one block does it (W warps, 32·W threads; every warp owns 4·RPL query rows)::

    lane = 8·rg + cg      rg ∈ 0…3 (row group), cg ∈ 0…7 (column group)
    rows of lane:         4·RPL·warp + rg + 4·i,  i < RPL        (RPL = rows per lane)
    S columns of lane:    cg + 8·jj,  jj < Bc/8           → a register tile RPL × Bc/8
    O columns of lane:    cg + 8·jv,  jv < ⌈Dv/8⌉         → a register tile RPL × ⌈Dv/8⌉

* Q_i (scaled) is staged once, transposed, in shared memory; each K_j tile is staged
  transposed and each V_j tile as is (float32, whatever the input type); the stride
  padding keeps every shared-memory read of the inner loops free of bank conflicts.
  Staging reads 8 values per thread into registers before writing them (:func:`stager`):
  8 loads in flight, not one.
* S = Q_i K_jᵀ is an outer product over d: per d a lane reads RPL values of Q and Bc/8
  of K and does RPL·Bc/8 fused multiply-adds.
* A row's Bc scores live in the 8 lanes of its row group: the row max is a 3-step
  ``shfl_xor_sync`` butterfly (offsets 4, 2, 1), with a max that keeps NaN
  (:func:`nan_max`).  The row *sum* can wait: every lane
  keeps the partial ℓ of its own columns, re-based by the same α as the others, and the
  8 partials are added once, at the end.
* P goes through shared memory, transposed (each warp writes and reads only its own
  rows: a ``syncwarp`` suffices), then O += P V_j is again an outer product, over the
  Bc keys: per key a lane reads RPL values of P and ⌈Dv/8⌉ of V.

Shared memory, float32: D·(Br+1) + D·(Bc+1) + Bc·8⌈Dv/8⌉ + Bc·(Br+pad) values, under the
48 KB of static shared memory; :func:`fit_tiles` picks the largest tiles that fit:
Br×Bc = 64×64 for D ≤ 32 (41 KB at D = 32), 64×32 for D ≤ 64 (41 KB), 32×16 for
D ≤ 128 (35 KB), with RPL = 4: 4 warps (128 threads) for Br = 64, 2 for Br = 32.
Compiled for sm_90 that is 100–130 registers a thread (D = 64 and D = 128), no spills,
and the inner loops are shared loads and FMAs with constant address offsets.
(``rows_per_lane=8`` cuts the shared-memory reads per FMA by a quarter to a third on paper, but at ~160
registers the compiler recomputes every address in the d loop: measure before using it.)
Head dimensions up to :data:`MAX_HEAD_DIM` (the registers of the O tile run out beyond).

FLOPs: 2·Sq·Sk·D for Q Kᵀ plus 2·Sq·Sk·Dv for P V — 4·Sq·Sk·D per (batch·head) when
Dv = D, about half of it with ``causal`` (Sq = Sk).
Bytes moved per (batch·head), b bytes per value: Q read once (Sq·D·b), O written once
(Sq·Dv·b), LSE written (4·Sq); K and V are read once per query tile, Tr·Sk·(D+Dv)·b, and
mostly served from L2 (the blocks of one head run side by side).  Never O(Sq·Sk): the
materialised version stores S (4·Sq·Sk bytes in float32: 4 GiB per head at
Sq = Sk = 32768) and moves it, and P, through memory several times.

NumPy twin: :func:`numba_softmax.reference.flash_attention` (``block_q`` = Br,
``block_k`` = Bc).  Source: the (m, ℓ, O) update derived in the sources (the online
softmax notes and the book section on FlashAttention).

The same kernel, with ``kv_chunk`` < Sk, is the first kernel of split-KV decoding
(:mod:`.decode`): block z of the grid's third axis takes the keys
[z·kv_chunk, (z+1)·kv_chunk) and writes its partial (O, LSE) to row z·B + b of ``o``
and ``lse``.
"""

import functools
import math

from numba import cuda

from ..combine import larger_device as nan_max
from ..combine import lse_device, weight_device
from . import jit, launcher
from .jit import accumulator

FULL_MASK = 0xFFFFFFFF
MAX_HEAD_DIM = 128
SHARED_BYTES = 48 * 1024  # numba's static shared memory per block
GROUP = 8  # lanes per row group: the lanes that share a query row


def _p_stride(br):
    """Row stride of the Pᵀ tile: ≡ 4 (mod 8), so that the 8 column groups of a warp hit
    8 different sets of 4 banks when they write Pᵀ (reads are 4 consecutive values)."""
    s = br
    while s % 8 != 4:
        s += 1
    return s


def split_rows(block_q, rows_per_lane=None):
    """(warps W, rows per lane RPL) for Br = block_q = 4·RPL·W query rows (default RPL:
    4 where it divides, else 2 or 1)."""
    if block_q % 4 or block_q < 4:
        raise ValueError(f"block_q must be a positive multiple of 4, got {block_q}")
    if rows_per_lane is None:  # the largest of 4, 2, 1 that tiles Br with at most 8 warps
        rows_per_lane = next((r for r in (4, 2, 1) if block_q % (4 * r) == 0
                              and block_q // (4 * r) <= 8), 4)
    if rows_per_lane not in (1, 2, 4, 8) or block_q % (4 * rows_per_lane):
        raise ValueError(f"rows_per_lane must be 1, 2, 4 or 8 and divide block_q/4; got "
                         f"rows_per_lane={rows_per_lane}, block_q={block_q}")
    warps = block_q // (4 * rows_per_lane)
    if warps > 8:
        raise ValueError(f"block_q={block_q} with rows_per_lane={rows_per_lane} needs {warps} "
                         f"warps; at most 8")
    return warps, rows_per_lane


def shared_bytes(d, dv, block_q, block_k):
    """Bytes of shared memory the kernel declares for these sizes (float32 tiles)."""
    nv = -(-dv // GROUP)
    return 4 * (d * (block_q + 1) + d * (block_k + 1) + block_k * GROUP * nv
                + block_k * _p_stride(block_q))


def check_tiles(d, dv, block_q, block_k, rows_per_lane=None):
    """ValueError unless (Br, Bc) = (block_q, block_k) is a tiling the kernel supports."""
    split_rows(block_q, rows_per_lane)
    if block_k % GROUP or block_k < GROUP:
        raise ValueError(f"block_k must be a positive multiple of {GROUP}, got {block_k}")
    need = shared_bytes(d, dv, block_q, block_k)
    if need > SHARED_BYTES:
        raise ValueError(
            f"tiles block_q={block_q}, block_k={block_k} need {need} bytes of shared memory "
            f"with D={d}, Dv={dv}; the limit is {SHARED_BYTES}"
        )


def fit_tiles(d, dv, small=False):
    """The largest (Br, Bc) whose tiles fit in shared memory; ``small``: the simulator's
    one-warp tiles (one Python thread per CUDA thread)."""
    candidates = ((16, 16), (16, 8)) if small else (
        (64, 64), (64, 32), (32, 32), (32, 16), (16, 16), (16, 8))
    for block_q, block_k in candidates:
        if shared_bytes(d, dv, block_q, block_k) <= SHARED_BYTES:
            return block_q, block_k
    raise ValueError(f"head dimensions D={d}, Dv={dv} do not fit in shared memory")


def check_head_dims(d, dv):
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(
            f"head dimensions must be between 1 and {MAX_HEAD_DIM}, got D={d} (q, k) and "
            f"Dv={dv} (v)"
        )


@functools.cache
def stager(dtype, threads, rows, cols, width, transpose, batch=8):
    """Device function: copy a tile of ``rows`` rows of a (B, H, S, cols) array into a
    shared (rows, width) array — or (width, rows) with ``transpose`` — times ``sc``, in the
    accumulator type.  Rows ≥ ``stop`` and columns ≥ ``cols`` (the padding) read as 0.

    Consecutive threads take consecutive columns (coalesced global reads); each thread
    walks the tile in steps of ``threads`` elements, carrying (row, column) along instead
    of dividing.  It reads ``batch`` values into registers before it writes any of them:
    a shared-memory store between two loads could (for the compiler) alias the second
    load's address, and would make every load wait for the one before — ``batch`` loads
    are in flight instead of one.  (Not the whole tile at once: the compiler would then
    keep every element's address in registers for the whole kernel.)
    """
    acc = accumulator(dtype)
    STEP_R, STEP_C = threads // width, threads % width

    @jit.device
    def stage(dst, src, b, h, first, stop, sc):
        tid = cuda.threadIdx.x
        r, c = tid // width, tid % width
        buf = cuda.local.array(batch, acc)
        while r < rows:  # a loop the compiler cannot unroll away: one batch at a time
            r1, c1 = r, c
            for u in range(batch):  # the batch's loads, all in flight together
                x = acc(0.0)
                if r1 < rows and first + r1 < stop and c1 < cols:
                    x = acc(src[b, h, first + r1, c1]) * sc
                buf[u] = x
                r1 += STEP_R
                c1 += STEP_C
                if c1 >= width:
                    c1 -= width
                    r1 += 1
            for u in range(batch):  # then their stores
                if r < rows:
                    if transpose:
                        dst[c, r] = buf[u]
                    else:
                        dst[r, c] = buf[u]
                r += STEP_R
                c += STEP_C
                if c >= width:
                    c -= width
                    r += 1

    return stage


@functools.cache
def kernel(dtype, d, dv, block_q, block_k, causal, rows_per_lane=None):
    """The forward kernel for one (dtype, D, Dv, Br, Bc, causal, RPL) — all compile-time.
    Returns (kernel, threads per block)."""
    acc = accumulator(dtype)
    WARPS, RPL = split_rows(block_q, rows_per_lane)
    THREADS = 32 * WARPS
    BR, BC, D, DV = block_q, block_k, d, dv
    CPL = BC // GROUP  # S columns per lane
    NV = -(-DV // GROUP)  # O columns per lane
    DVP = GROUP * NV  # V tile width, padded with zeros to a whole number of groups
    # shared tiles; the +1 / padded strides keep the inner loops free of bank conflicts
    Q_SHAPE, K_SHAPE = (D, BR + 1), (D, BC + 1)
    V_SHAPE, P_SHAPE = (BC, DVP), (BC, _p_stride(BR))
    stage_q = stager(dtype, THREADS, BR, D, D, True)
    stage_k = stager(dtype, THREADS, BC, D, D, True)
    stage_v = stager(dtype, THREADS, BC, DV, DVP, False)

    @jit.kernel
    def forward(q, k, v, o, lse, scale, kv_chunk):
        """q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv) → o (Z·B, H, Sq, Dv) and
        lse (Z·B, H, Sq); grid (Tr, B·H, Z)."""
        tid = cuda.threadIdx.x
        # bit operations, not // and %: the compiler then knows these are >= 0 and drops
        # the negative-index fix-ups from every shared-memory address in the inner loops
        warp, lane = tid >> 5, tid & 31
        rg, cg = lane >> 3, lane & (GROUP - 1)
        n_heads = q.shape[1]
        b, h = cuda.blockIdx.y // n_heads, cuda.blockIdx.y % n_heads
        z = cuda.blockIdx.z
        zb = z * q.shape[0] + b
        sq, sk = q.shape[2], k.shape[2]
        shift = sk - sq  # query i sees key j iff j <= i + shift (causal)
        tile = cuda.blockIdx.x
        if causal:
            tile = cuda.gridDim.x - 1 - tile  # the longest rows first
        i0 = tile * BR
        row0 = warp * 4 * RPL  # this warp's first row in the tile
        kv_lo = z * kv_chunk
        kv_hi = min(sk, kv_lo + kv_chunk)
        if causal:
            kv_hi = min(kv_hi, i0 + BR + shift)  # later keys are above the diagonal for every row
        sc = acc(scale)
        neg_inf = acc(-math.inf)
        zero, one = acc(0.0), acc(1.0)

        # one cuda.shared.array per line: the simulator tells them apart by line
        q_t = cuda.shared.array(Q_SHAPE, acc)  # Q_iᵀ·scale
        k_t = cuda.shared.array(K_SHAPE, acc)  # K_jᵀ
        v_s = cuda.shared.array(V_SHAPE, acc)  # V_j
        p_t = cuda.shared.array(P_SHAPE, acc)  # Pᵀ, each warp its own rows

        stage_q(q_t, q, b, h, i0, sq, sc)  # Q_i, scaled, transposed

        m = cuda.local.array(RPL, acc)  # the state (m, ℓ, O) of the lane's rows
        l = cuda.local.array(RPL, acc)  # ℓ over this lane's columns only (summed at the end)
        o_acc = cuda.local.array((RPL, NV), acc)
        s = cuda.local.array((RPL, CPL), acc)  # the lane's part of the score tile
        qv = cuda.local.array(RPL, acc)
        kv = cuda.local.array(CPL, acc)
        vv = cuda.local.array(NV, acc)
        for i in range(RPL):
            m[i] = neg_inf
            l[i] = zero
            for jv in range(NV):
                o_acc[i, jv] = zero

        for j0 in range(kv_lo, kv_hi, BC):
            cuda.syncthreads()  # every warp is done with the previous K_j, V_j before they are overwritten
            stage_k(k_t, k, b, h, j0, kv_hi, one)  # K_jᵀ; keys past the range read as 0
            stage_v(v_s, v, b, h, j0, kv_hi, one)  # V_j; zeros, not garbage: 0·p is never NaN
            cuda.syncthreads()  # K_j, V_j (and, the first time, Q_i) are complete before anyone reads them

            # S = Q_i K_jᵀ: an outer product per d over the lane's RPL × CPL tile.  (A while
            # loop, not range(): its counter is provably >= 0, so the indexing needs no
            # negative-index fix-up and the compiler unrolls it with constant offsets.)
            for i in range(RPL):
                for jj in range(CPL):
                    s[i, jj] = zero
            dd = 0
            while dd < D:
                for i in range(RPL):
                    qv[i] = q_t[dd, row0 + rg + 4 * i]
                for jj in range(CPL):
                    kv[jj] = k_t[dd, cg + GROUP * jj]
                for i in range(RPL):
                    for jj in range(CPL):
                        s[i, jj] += qv[i] * kv[jj]
                dd += 1

            # mask: the ragged last tile, and the tiles the diagonal crosses
            if j0 + BC > kv_hi or (causal and j0 + BC - 1 > i0 + shift):
                for i in range(RPL):
                    row = i0 + row0 + rg + 4 * i
                    for jj in range(CPL):
                        key = j0 + cg + GROUP * jj
                        if key >= kv_hi or (causal and key > row + shift):
                            s[i, jj] = neg_inf

            # the online update of each row's (m, ℓ, O)
            for i in range(RPL):
                mx = s[i, 0]
                for jj in range(1, CPL):
                    mx = nan_max(s[i, jj], mx)
                offset = GROUP // 2
                while offset > 0:  # the row max over its 8 lanes
                    mx = nan_max(cuda.shfl_xor_sync(FULL_MASK, mx, offset), mx)
                    offset //= 2
                m_new = nan_max(mx, m[i])
                alpha = weight_device(m[i], m_new)  # exp(m − m'), 0 when m = −inf
                part = zero
                for jj in range(CPL):
                    p = weight_device(s[i, jj], m_new)  # exp(s − m'), 0 for a masked score
                    p_t[cg + GROUP * jj, row0 + rg + 4 * i] = p
                    part += p
                l[i] = alpha * l[i] + part
                m[i] = m_new
                for jv in range(NV):
                    o_acc[i, jv] *= alpha
            cuda.syncwarp(FULL_MASK)  # the warp's P rows are written before its lanes read them

            # O += P V_j: an outer product per key over the lane's RPL × NV tile
            c = 0
            while c < BC:
                for i in range(RPL):
                    qv[i] = p_t[c, row0 + rg + 4 * i]
                for jv in range(NV):
                    vv[jv] = v_s[c, cg + GROUP * jv]
                for i in range(RPL):
                    for jv in range(NV):
                        o_acc[i, jv] += qv[i] * vv[jv]
                c += 1

        # epilogue: ℓ = Σ of the 8 lanes' partials; O / ℓ and LSE = m + log ℓ
        for i in range(RPL):
            lt = l[i]
            offset = GROUP // 2
            while offset > 0:
                lt += cuda.shfl_xor_sync(FULL_MASK, lt, offset)
                offset //= 2
            row = i0 + row0 + rg + 4 * i
            if row < sq:
                inv = acc(1.0) / lt if lt != zero else zero
                for jv in range(NV):
                    col = cg + GROUP * jv
                    if col < DV:
                        # ℓ = 0: the row saw no key → O = 0, chosen, not multiplied: its
                        # O may hold 0·NaN from a NaN in V at a key of weight 0
                        o[zb, h, row, col] = o_acc[i, jv] * inv if lt != zero else zero
                if cg == 0:
                    lse[zb, h, row] = lse_device(m[i], lt)

    return forward, THREADS


def launch(q, k, v, o, lse, *, causal=False, scale=None, block_q=None, block_k=None,
           rows_per_lane=None, kv_chunk=None, stream=0, small=False):
    """Run on 4-D device arrays q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv).

    ``o`` (Z·B, H, Sq, Dv) and ``lse`` (Z·B, H, Sq, float32) receive the result; Z = 1
    unless ``kv_chunk`` (keys per split, default Sk) cuts the keys into Z = ⌈Sk/kv_chunk⌉
    ranges, each written as a normalised partial (see :mod:`.decode`).  ``block_q``,
    ``block_k``: the tile sizes Br, Bc (default :func:`fit_tiles`); ``rows_per_lane``: RPL
    (default :func:`split_rows`).  ``small``: the simulator's one-warp tiles.
    """
    n_b, n_h, sq, d = q.shape
    sk, dv = k.shape[2], v.shape[3]
    check_head_dims(d, dv)
    if block_q is None or block_k is None:
        fq, fk = fit_tiles(d, dv, small)
        block_q, block_k = block_q or fq, block_k or fk
    check_tiles(d, dv, block_q, block_k, rows_per_lane)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kv_chunk = max(sk, 1) if kv_chunk is None else int(kv_chunk)
    if kv_chunk < 1:
        raise ValueError(f"kv_chunk must be >= 1, got {kv_chunk}")
    splits = max(1, -(-sk // kv_chunk))
    if o.shape[0] != splits * n_b or lse.shape[0] != splits * n_b:
        raise ValueError(f"o and lse need {splits}·{n_b} rows on their first axis for "
                         f"{splits} splits, got {o.shape[0]} and {lse.shape[0]}")
    if n_b * n_h > 65535 or splits > 65535:
        raise ValueError(f"at most 65535 batch·heads and splits per launch, got {n_b * n_h} "
                         f"and {splits}")
    tiles = -(-sq // block_q)
    if tiles == 0 or n_b * n_h == 0:
        return
    fwd, threads = kernel(q.dtype, d, dv, block_q, block_k, bool(causal), rows_per_lane)
    launcher.launch(fwd, (tiles, n_b * n_h, splits), threads, stream,
                    (q, k, v, o, lse, scale, kv_chunk))
