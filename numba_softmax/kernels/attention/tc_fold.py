"""One key tile folded into a warp's rows on tensor cores: the steps that the
FlashAttention-2 forward (:mod:`.attention_tc`) and the decode kernel (:mod:`.decode_tc`)
share — the lane's ``ldmatrix`` rows (:func:`lane_rows`), its rows' empty state
(:func:`fresh`), S = Q Kⱼᵀ (:func:`tile_scores`) and the fold (:func:`tile_fold`).

A warp holds S = Q Kⱼᵀ for its 16 query rows in ``mma`` accumulator fragments: lane
``4·g + t`` holds rows g and g + 8, columns 2t and 2t + 1 of each of the tile's Bc/8
column blocks.  For each of its two rows the lane takes

    m' = max(m, rowmax S)       its own values, then the quad's (two shuffles)
    α  = exp(scale·(m − m'))    P = exp(scale·(S − m'))      (the combiner's weights)
    ℓ  = α·ℓ + Σ P               the lane's own columns; the quad sums once, at the end
    O  = α·O + P Vⱼ              P rounded to fp16 / bf16 in registers: the A operand

and Vⱼ's B fragments come from shared memory by ``ldmatrix.trans``.  Derivation:
``docs/algorithms/tensor_cores.md``.  NumPy twin: :func:`numba_softmax.reference.attention`.
"""

import functools
import math

import numba
from numba import cuda

from ...combine import weight_device
from ..hw import jit
from ..hw.mma import for_dtype, ldmatrix_x4, ldmatrix_x4_trans, max_nan

FULL = 0xFFFFFFFF


@jit.device
def fresh(m, l, of):
    """The lane's two rows' state before any key: m = −inf, ℓ = 0, O = 0."""
    for rr in range(2):
        m[rr], l[rr] = -math.inf, 0.0
    for n in range(of.shape[0]):
        for r in range(4):
            of[n, r] = 0.0


@jit.device
def lane_rows(lane, ks, vs):
    """The shared-memory offsets (k_lane, v_lane) that ``ldmatrix`` reads for this lane:
    lane L points at row L % 8 of 8×8 tile L // 8 — of K (rows of ``ks`` values) the tiles
    (keys, d), (keys, d+8), (keys+8, d), (keys+8, d+8); of V (rows of ``vs``), transposed,
    (keys, c), (keys+8, c), (keys, c+8), (keys+8, c+8)."""
    k_lane = ((lane & 7) + 8 * (lane >> 4)) * ks + 8 * ((lane >> 3) & 1)
    v_lane = ((lane & 7) + 8 * ((lane >> 3) & 1)) * vs + 8 * (lane >> 4)
    return k_lane, v_lane


@functools.cache
def tile_scores(dtype, nb, kd, ks):
    """``scores(s, qf, smem, base, k_lane)``: S = Q Kⱼᵀ into ``s`` (nb column blocks × 4),
    from the warp's Q fragments ``qf`` (kd k-steps) and Kⱼ at ``smem[base …]`` in rows of
    ``ks`` 16-bit values."""
    f32 = numba.float32
    mma, _ = for_dtype(dtype)

    @jit.device
    def scores(s, qf, smem, base, k_lane):
        # S = Q_w K_jᵀ: one ldmatrix.x4 = B fragments of two key tiles at one k-step
        for n in range(nb):
            for r in range(4):
                s[n, r] = f32(0.0)
        for n2 in range(nb // 2):
            for kk in range(kd):
                b0, b1, b2, b3 = ldmatrix_x4(smem, base + k_lane + 16 * n2 * ks + 16 * kk)
                mma(s, 2 * n2, qf, kk, b0, b1)
                mma(s, 2 * n2 + 1, qf, kk, b2, b3)

    return scores


@functools.cache
def tile_fold(dtype, nb, nv, kb, bc, ks, vs):
    """``fold(s, m, l, of, pf, sc, c2, smem, base, v_lane)``: fold S (``s``: nb column
    blocks × 4 values) into the lane's (m, ℓ) (``m``, ``l``: 2 each) and O (``of``: nv
    blocks × 4), through ``pf`` (kb k16 A fragments of P).  ``sc`` = abs(scale), ``c2`` =
    sc·log₂e; Vⱼ lies at ``smem[base + bc·ks …]`` in rows of ``vs`` 16-bit values, read
    from the lane's ``v_lane``."""
    f32 = numba.float32
    mma, pack = for_dtype(dtype)

    @jit.device
    def fold(s, m, l, of, pf, sc, c2, smem, base, v_lane):
        zero, neg_inf = f32(0.0), f32(-math.inf)
        # the online update of (m, ℓ, O) for the lane's two rows
        for rr in range(2):
            mx = s[0, 2 * rr]
            for n in range(nb):
                for e in range(2):
                    mx = max_nan(s[n, 2 * rr + e], mx)
            mx = max_nan(cuda.shfl_xor_sync(FULL, mx, 1), mx)  # the quad: 4 lanes
            mx = max_nan(cuda.shfl_xor_sync(FULL, mx, 2), mx)  # hold a row
            m_new = max_nan(mx, m[rr])
            alpha = weight_device(m[rr] * sc, m_new * sc)  # exp(scale·(m − m')), 0 from −inf
            # P = exp(scale·(S − m')): the combiner's weight with its −inf test hoisted
            # out of the row (m' = −inf only when every s is −inf: then P = exp2(−inf) = 0)
            mc = zero if m_new == neg_inf else m_new * c2
            part = zero
            for n in range(nb):
                for e in range(2):
                    p = math.exp2(s[n, 2 * rr + e] * c2 - mc)
                    s[n, 2 * rr + e] = p
                    part += p
            l[rr] = alpha * l[rr] + part
            m[rr] = m_new
            for n in range(nv):
                of[n, 2 * rr] *= alpha
                of[n, 2 * rr + 1] *= alpha

        # P → A fragments in registers: S tiles 2kb and 2kb+1 are one k16 fragment
        for k in range(kb):
            for r in range(4):
                n = 2 * k + (r >> 1)
                pf[k, r] = pack(s[n, 2 * (r & 1)], s[n, 2 * (r & 1) + 1])
        # O += P V_j: ldmatrix.x4.trans = B fragments of two Dv tiles at one k-step
        for k in range(kb):
            for n2 in range(nv // 2):
                b0, b1, b2, b3 = ldmatrix_x4_trans(smem, base + bc * ks + v_lane + 16 * k * vs + 16 * n2)
                mma(of, 2 * n2, pf, k, b0, b1)
                mma(of, 2 * n2 + 1, pf, k, b2, b3)

    return fold
