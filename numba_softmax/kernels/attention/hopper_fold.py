"""One key tile folded into a warpgroup's 64 rows on ``wgmma``: the steps h1 and h2 share.

A warpgroup's accumulators hold S = Q Kⱼᵀ for its 64 query rows: lane ``4·g + t`` of warp
w holds rows 16w + g and 16w + g + 8, columns 8j + 2t and 8j + 2t + 1 of every 8-column
block j (:mod:`..hw.wgmma` draws the map) — the ``mma.sync`` pattern, so a row's values
sit in one quad of lanes, as in :mod:`.tc_fold`.  For each of its two rows a lane takes

    m' = max(m, rowmax S)        its own 2·Bc/8 values, then its quad's (2 shuffles)
    α  = exp(scale·(m − m'))     P = exp(scale·(S − m'))      (the combiner's weights)
    ℓ  = α·ℓ + Σ P,  O = α·O     the lane's own columns; the quad sums ℓ once, at the end

and P, rounded to 16 bits, becomes the A fragments of O += P Vⱼ in registers (keys
16kk … 16kk+15 are accumulator blocks 2kk and 2kk+1).  Shared memory holds Q and Kⱼ as
64-wide 128-byte-swizzled chunks (K-major), and Vⱼ either transposed (K-major, Dv rows of
the tile's keys) or as it lies in memory (N-major: ``trans_b``).

    products(kind, d, dv, bn, bm, v_n_major) → (scores, accumulate)
        scores(s, q_s, q_at, k_s, k_at)          S = Q Kⱼᵀ: D/16 wgmma m64n{bn}k16, one group
        accumulate(acc, pf, v_s, v_at)           O += P Vⱼ: bn/16 wgmma m64n{dv}k16, A = pf
    issued(…) → the same two products started and committed, not waited for
    online(kind, dv, bn) → update(s, m, l, acc, pf, j0, row, lim_all, causal, sk, shift, sc, c2, t)
    steps(kind, dv, bn) → (weigh, rescale, pack): update's three steps, apart
    finish(out_dtype, dv) → done(o, lse, b, h, row, sq, m, l, acc, sc, t)

``issued`` and ``steps`` are for a warpgroup that overlaps the softmax of tile j with
the product P_{j−1} V_{j−1} (FlashAttention-3's intra-warpgroup pipelining: start S_j,
start O += P_{j−1} V_{j−1}, wait for S_j alone, weigh it, wait for the rest, then
rescale O and pack P_j).

``q_at`` … are element offsets into the uint16 shared arrays (1024-byte aligned there).
NumPy twin: :func:`numba_softmax.reference.attention`.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from ...combine import lse_device, weight_device
from ..hw import jit, wgmma
from ..hw.mma import for_dtype, max_nan

FULL = 0xFFFFFFFF
SW = wgmma.SWIZZLE_128B


@functools.cache
def issued(kind, d, dv, bn, bm, v_n_major):
    """``(start_scores, start_accumulate)``: the two products of a tile started, each
    one committed group, not waited for (see the module docstring)."""
    mma_s, mma_o = wgmma.wgmma_ss(bn, kind), wgmma.wgmma_rs(dv, kind, v_n_major)
    KS, KP = d // 16, bn // 16
    Q_CHUNK, K_CHUNK = bm * 64, bn * 64  # uint16 values in one 64-wide swizzled chunk
    # Vⱼ's descriptor: transposed (K-major), 8-row groups 1024 bytes apart, k16 steps 32
    # bytes on; N-major, 64-column blocks bn·128 bytes apart, k16 steps 16 rows = 2048 on
    V_LBO, V_STEP = (bn * 128, 2048) if v_n_major else (16, 32)

    @jit.device
    def start_scores(s, q_s, q_at, k_s, k_at):
        wgmma.wgmma_fence()  # the accumulators were last written by ordinary code
        for st in range(KS):  # 4 k16 steps to a 64-wide chunk
            da = wgmma.advance(wgmma.descriptor(q_s, q_at + (st >> 2) * Q_CHUNK, 16, 1024, SW),
                               32 * (st & 3))
            db = wgmma.advance(wgmma.descriptor(k_s, k_at + (st >> 2) * K_CHUNK, 16, 1024, SW),
                               32 * (st & 3))
            mma_s(s, da, db, 1 if st > 0 else 0)
        wgmma.wgmma_commit()

    @jit.device
    def start_accumulate(acc, pf, v_s, v_at):
        wgmma.wgmma_fence()
        for kk in range(KP):
            dv_desc = wgmma.advance(wgmma.descriptor(v_s, v_at, V_LBO, 1024, SW), V_STEP * kk)
            mma_o(acc, pf, kk, dv_desc, 1)
        wgmma.wgmma_commit()

    return start_scores, start_accumulate


@functools.cache
def products(kind, d, dv, bn, bm, v_n_major):
    """The two products of a tile, each waited for (see the module docstring)."""
    start_scores, start_accumulate = issued(kind, d, dv, bn, bm, v_n_major)
    wait = wgmma.wgmma_wait(0)

    @jit.device
    def scores(s, q_s, q_at, k_s, k_at):
        start_scores(s, q_s, q_at, k_s, k_at)
        wait()

    @jit.device
    def accumulate(acc, pf, v_s, v_at):
        start_accumulate(acc, pf, v_s, v_at)
        wait()

    return scores, accumulate


@functools.cache
def online(kind, dv, bn):
    """``update(s, m, l, acc, pf, j0, row, lim_all, causal, sk, shift, sc, c2, t)``: mask
    the tile at keys j0 … (keys ≥ ``lim_all``, and for ``causal`` past the lane's rows'
    diagonals; ``row`` is the lane's first row), fold it into (m, ℓ, O) and leave P in
    ``pf`` as A fragments."""
    weigh, rescale, pack = steps(kind, dv, bn)

    @jit.device
    def update(s, m, l, acc, pf, j0, row, lim_all, causal, sk, shift, sc, c2, t):
        alpha = cuda.local.array(2, float32)
        weigh(s, m, l, alpha, j0, row, lim_all, causal, sk, shift, sc, c2, t)
        rescale(acc, alpha)
        pack(s, pf)

    return update


@functools.cache
def steps(kind, dv, bn):
    """``(weigh, rescale, pack)``, the steps of :func:`online`'s update:
    ``weigh(s, m, l, alpha, j0, row, lim_all, causal, sk, shift, sc, c2, t)`` masks S,
    folds it into (m, ℓ), leaves P in ``s`` and each row's α in ``alpha``;
    ``rescale(acc, alpha)``: O = α·O; ``pack(s, pf)``: P → A fragments in ``pf``."""
    _, pack2 = for_dtype(np.float16 if kind == "f16" else np.uint16)

    @jit.device
    def weigh(s, m, l, alpha, j0, row, lim_all, causal, sk, shift, sc, c2, t):
        zero, neg_inf = float32(0.0), float32(-math.inf)
        for rr in range(2):
            lim = lim_all  # keys < lim are visible to this row
            if causal:
                lim = min(sk, row + 8 * rr + shift + 1)
            if j0 + bn > lim:  # a tile crossing the row's edge: mask element by element
                for j in range(bn // 8):
                    for e in range(2):
                        if j0 + 8 * j + 2 * t + e >= lim:
                            s[4 * j + 2 * rr + e] = neg_inf
            mx = s[2 * rr]
            for j in range(bn // 8):
                for e in range(2):
                    mx = max_nan(s[4 * j + 2 * rr + e], mx)
            mx = max_nan(cuda.shfl_xor_sync(FULL, mx, 1), mx)  # the quad: 4 lanes
            mx = max_nan(cuda.shfl_xor_sync(FULL, mx, 2), mx)  # hold a row
            m_new = max_nan(mx, m[rr])
            a = weight_device(m[rr] * sc, m_new * sc)  # 0 from −inf
            mc = zero if m_new == neg_inf else m_new * c2  # (every s −inf: P = 0)
            part = zero
            for j in range(bn // 8):
                for e in range(2):
                    p = math.exp2(s[4 * j + 2 * rr + e] * c2 - mc)
                    s[4 * j + 2 * rr + e] = p
                    part += p
            l[rr] = a * l[rr] + part
            m[rr] = m_new
            alpha[rr] = a

    @jit.device
    def rescale(acc, alpha):
        for rr in range(2):
            for j in range(dv // 8):
                acc[4 * j + 2 * rr] *= alpha[rr]
                acc[4 * j + 2 * rr + 1] *= alpha[rr]

    @jit.device
    def pack(s, pf):
        # P → A fragments: keys 16kk … 16kk+15 are accumulator blocks 2kk and 2kk+1
        for kk in range(bn // 16):
            for r in range(4):
                n = 2 * kk + (r >> 1)
                pf[kk, r] = pack2(s[4 * n + 2 * (r & 1)], s[4 * n + 2 * (r & 1) + 1])

    return weigh, rescale, pack


@functools.cache
def finish(out_dtype, dv):
    """``done(o, lse, b, h, row, sq, m, l, acc, sc, t)``: O / ℓ once and LSE = scale·m +
    log ℓ for the lane's rows ``row`` and ``row`` + 8 (those < sq); ℓ = 0: the row saw no
    key → O = 0, chosen (its O may hold 0·NaN), LSE = −inf."""
    store = jit.storer(out_dtype)

    @jit.device
    def done(o, lse, b, h, row, sq, m, l, acc, sc, t):
        zero = float32(0.0)
        for rr in range(2):
            lt = l[rr]
            lt += cuda.shfl_xor_sync(FULL, lt, 1)
            lt += cuda.shfl_xor_sync(FULL, lt, 2)
            r = row + 8 * rr
            if r < sq:
                inv = float32(1.0) / lt if lt != zero else zero
                for j in range(dv // 8):
                    for e in range(2):
                        x = acc[4 * j + 2 * rr + e] * inv if lt != zero else zero
                        o[b, h, r, 8 * j + 2 * t + e] = store(x)
                if t == 0:
                    lse[b, h, r] = lse_device(m[rr] * sc, lt)

    return done
