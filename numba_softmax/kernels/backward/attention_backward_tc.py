"""b3 — FlashAttention-2 backward on tensor cores (fp16 / bf16 in, float32 accumulation).

The backward of :mod:`.attention_backward` — P rebuilt from the saved LSE, Dao's
Algorithm 2 — with its five matrix products on ``mma.sync`` (:mod:`.mma`)::

    preprocess   D_i = rowsum(dO_i ∘ O_i); the dQ accumulator zeroed  (attention_backward_io)
    one block = W warps = Bc = 16·W keys of one (batch, K/V head); warp w owns 16 keys
        K_j, V_j → shared memory, once; dK_w = dV_w = 0 in accumulator fragments
        for every query head of the group (GQA), every tile i of Br query rows that sees K_j:
            Q_i, dO_i, LSE_i, D_i → shared memory (cp.async, two buffers: tile i+1 lands
                                     while tile i is used)
            Sᵀ   = K_w Q_iᵀ               the scores transposed: the warp's keys are the rows
            Pᵀ   = exp(scale·Sᵀ − LSE_i)  LSE along the columns; 0 where masked
            dPᵀ  = V_w dO_iᵀ
            dSᵀ  = Pᵀ ∘ (dPᵀ − D_i)
            dV_w += Pᵀ dO_i               Pᵀ rounded to fp16/bf16 in registers is the A
            dK_w += dSᵀ Q_i               operand, as the forward's P — no shared memory
            dSᵀ → shared memory; barrier
            dQ_i += scale · dS K_j        each warp a 16-row × 16·c slice, dS read back
                                          transposed (ldmatrix.trans); float32 atomic adds
        write dK_j = scale·dK, dV_j
    convert      dQ = the accumulator rounded to fp16 / bf16             (attention_backward_io)

**Why the scores transposed.**  With keys as the mma rows, Pᵀ and dSᵀ come out of the
accumulators exactly as the A operands of dV += Pᵀ dO and dK += dSᵀ Q need them (two
adjacent n8 tiles are one k16 fragment, :mod:`.mma`), so the two sums that live for the
whole block never leave the registers.  Only dSᵀ goes through shared memory, once, for
dQ, whose rows are the queries.  (FlashAttention-2 computes S = Q Kᵀ and transposes P
and dS through shared memory instead; its tiles are larger than one warp's.)

**dQ by atomic adds**, as in :mod:`.attention_backward`: the last bits of dQ depend on
the order the adds land; two values an instruction on sm_90 (``red.global.add.v2.f32``,
which older targets lack), one on sm_80/sm_86/sm_89.  They are not what the time goes
to: the kernel with the adds left out is barely faster (docs/algorithms/backward.md,
"Measured").  Masks, GQA and the windows as there: query i sees key j iff
−left ≤ j − (i + Sk − Sq) ≤ right; only tiles that cross an edge are masked element by
element; rows that saw no key (LSE = −inf) and padding rows have P = 0.  ``softcap``,
``alibi`` (:mod:`..attention.score_mods`, compile-time): scale·Sᵀ modified before the
mask, dPᵀ − D times the soft-cap's derivative.

FLOPs 10·Sq·Sk·D per (batch·query head) (five products; half with causal); K, V read
once, Q, dO once per key tile (mostly from L2), dQ added once per key tile.  NumPy twin:
:func:`numba_softmax.reference.attention_backward`.  Derivation: ``docs/algorithms/backward.md``.
"""

import functools
import math

import numba
from numba import cuda

from ..hw import jit
from ..hw.jit import LOG2E
from ..hw.mma import (cp_async_commit, cp_async_wait_all, for_dtype, ldmatrix_x4,
                      ldmatrix_x4_trans, red_add_v2, st_shared_b32)
from ..attention import score_mods
from ..attention.staging import PAD, stager, up16

@functools.cache
def kernel(dtype, d, dv, warps, block_q, vec, pairs, softcap_on=False, alibi_on=False):
    """The backward kernel for one configuration (masks are run-time arguments).
    ``pairs``: dQ added two values at a time (``red.global.add.v2.f32``, sm_90; D even);
    ``softcap_on``, ``alibi_on``: :mod:`.score_mods`.  Returns (kernel, threads per block)."""
    MODS = softcap_on or alibi_on
    f32, u16 = numba.float32, numba.uint16
    mma, pack = for_dtype(dtype)
    store = jit.storer(dtype)
    W, BR, THREADS = warps, block_q, 32 * warps
    BC = 16 * W
    DP, DVP = up16(d), up16(dv)
    KD, KV = DP // 16, DVP // 16  # k-steps over D and over Dv
    NB, KB = BR // 8, BR // 16  # Sᵀ / dPᵀ accumulator tiles; k-steps over the queries
    ND, NV = DP // 8, DVP // 8  # dK, dV accumulator tiles
    KS, VS, PS = DP + PAD, DVP + PAD, BR + PAD  # shared row strides (16-bit values)
    R = BR // 16  # 16-row slices of dQ_i: warps w, w + R, … share slice w % R
    SPLIT = W // R
    CH = -(-KD // SPLIT)  # 16-column chunks of dQ per warp
    NQ = 2 * CH  # its accumulator tiles
    K0 = 0  # shared memory, 16-bit values: K_j, V_j, Q_i ×2, dO_i ×2, dSᵀ
    V0 = K0 + BC * KS
    Q0, QSZ = V0 + BC * VS, BR * KS
    O0, OSZ = Q0 + 2 * QSZ, BR * VS
    S0 = O0 + 2 * OSZ
    stage_k = stager(dtype, THREADS, BC, d, DP, KS, vec)
    stage_v = stager(dtype, THREADS, BC, dv, DVP, VS, vec)
    stage_q = stager(dtype, THREADS, BR, d, DP, KS, vec)
    stage_o = stager(dtype, THREADS, BR, dv, DVP, VS, vec)
    inf = f32(math.inf)
    I32 = numba.int32  # row, key and tile counters (every result cast back: Numba's
    # int32 ∘ int32 is int64, whose divisions and compares cost twice or more)
    PAIRS = pairs and d % 2 == 0  # dQ rows 8-byte aligned: red.global.add.v2 (sm_90)
    modify_t = score_mods.transposed_grad_modifier(softcap_on, alibi_on, NB)

    @jit.device
    def stage_rows(smem, rows, q, do, lse, delta, b, h, i0, buf):
        """Q_i, dO_i → buffer ``buf`` (asynchronous), and LSE_i·log2 e (+inf where the row
        saw no key, or is past Sq: P = 0 there) and D_i (plain stores: seen after the
        next barrier)."""
        sq = I32(q.shape[2])
        stage_q(smem, Q0 + buf * QSZ, q[b, h], i0, sq)
        stage_o(smem, O0 + buf * OSZ, do[b, h], i0, sq)
        cp_async_commit()
        tid = I32(cuda.threadIdx.x)
        if tid < BR:
            x, y = inf, f32(0.0)
            row = I32(i0 + tid)
            if row < sq:
                lv = f32(lse[b, h, row])
                if lv != -inf:
                    x = lv * f32(LOG2E)
                y = f32(delta[b, h, row])
            rows[buf, 0, tid] = x
            rows[buf, 1, tid] = y

    @jit.kernel
    def backward(do, q, k, v, lse, delta, dq_acc, dk, dv_out, scale, left, right):
        """grid (Tc, B·Hkv); q, do (B, Hq, Sq, ·), k, v, dk, dv (B, Hkv, Sk, ·), lse and
        delta (B, Hq, Sq), dq_acc (B, Hq, Sq, D) float32, zeroed; ``scale``: (scale,
        softcap, slopes) with a score modification."""
        if MODS:
            scale, cap, slopes = scale
        warp, lane = I32(cuda.threadIdx.x >> 5), I32(cuda.threadIdx.x & 31)
        g, t = I32(lane >> 2), I32(lane & 3)  # this lane's place in every fragment (mma.py)
        n_kv = k.shape[1]
        group = I32(q.shape[1] // n_kv)
        b, hkv = cuda.blockIdx.y // n_kv, cuda.blockIdx.y % n_kv
        sq, sk = I32(q.shape[2]), I32(k.shape[2])
        lft, rgt = I32(left), I32(right)  # (−1: no edge)
        shift = I32(sk - sq)  # query i sees key j iff −left <= j − (i + shift) <= right
        j0 = I32(cuda.blockIdx.x * BC)
        kw = I32(16 * warp)  # the warp's keys: j0 + kw … j0 + kw + 15
        i_lo, i_hi = I32(0), sq  # the query rows that see some key of this tile
        if rgt >= 0:
            i_lo = I32(max(0, j0 - shift - rgt))
        if lft >= 0:
            i_hi = I32(min(sq, min(j0 + BC, sk) + lft - shift))
        n_qt = I32((i_hi - i_lo + BR - 1) // BR) if i_hi > i_lo else I32(0)
        n_it = I32(group * n_qt)  # (query head, query tile) pairs, one after the other
        zero, sc = f32(0.0), f32(scale)
        # exp(scale·s − LSE) = exp2(c2·s − LSE·log2 e); MODS: s is the modified scale·s
        c2 = f32(LOG2E) if MODS else sc * f32(LOG2E)
        hidden = -inf if c2 > zero else inf  # c2·hidden = −inf

        s = cuda.local.array((NB, 4), f32)  # Sᵀ, then Pᵀ
        dp = cuda.local.array((NB, 4), f32)  # dPᵀ, then dSᵀ
        pf = cuda.local.array((KB, 4), numba.uint32)  # Pᵀ or dSᵀ as A fragments
        af = cuda.local.array((1, 4), numba.uint32)  # one A fragment read from shared memory
        dk_acc = cuda.local.array((ND, 4), f32)  # dK_w, dV_w: for the whole block
        dv_acc = cuda.local.array((NV, 4), f32)
        dqf = cuda.local.array((NQ, 4), f32)  # this warp's slice of dQ_i
        for n in range(ND):
            for r in range(4):
                dk_acc[n, r] = zero
        for n in range(NV):
            for r in range(4):
                dv_acc[n, r] = zero
        # ldmatrix row addresses (lane L: row L % 8 of 8×8 tile L // 8).  A of the warp's
        # keys: tiles (keys, d), (keys+8, d), (keys, d+8), (keys+8, d+8); B of rows stored
        # (n, k): (n, k), (n, k+8), (n+8, k), (n+8, k+8); B of rows stored (k, n), read
        # transposed: (k, n), (k+8, n), (k, n+8), (k+8, n+8)
        a_row = I32(kw + (lane & 7) + 8 * ((lane >> 3) & 1))
        a_col = I32(8 * (lane >> 4))
        nk_row, nk_col = I32((lane & 7) + 8 * (lane >> 4)), I32(8 * ((lane >> 3) & 1))
        kn_row, kn_col = I32((lane & 7) + 8 * ((lane >> 3) & 1)), I32(8 * (lane >> 4))
        rs, c_first = I32(warp % R), I32(warp // R)  # this warp's dQ slice: rows, first 16-column chunk

        smem = cuda.shared.array(0, u16)  # K_j, V_j, Q_i ×2, dO_i ×2, dSᵀ (offsets above)
        rows = cuda.shared.array((2, 2, BR), f32)  # per buffer: LSE_i·log2 e, D_i
        if n_it > 0:  # K_j, V_j and the first query tile: one group of copies
            stage_k(smem, K0, k[b, hkv], j0, sk)
            stage_v(smem, V0, v[b, hkv], j0, sk)
            stage_rows(smem, rows, q, do, lse, delta, b, hkv * group, i_lo, 0)
        hq, qt = I32(0), I32(0)  # tile it: query head hkv·group + hq, its tile qt
        it = I32(0)
        while it < n_it:
            buf = I32(it & 1)
            h = hkv * group + hq
            i0 = I32(i_lo + qt * BR)
            qb, ob = I32(Q0 + buf * QSZ), I32(O0 + buf * OSZ)
            qt, it = I32(qt + 1), I32(it + 1)  # the next pair: a head's tiles, then the next head
            if qt == n_qt:
                qt, hq = I32(0), I32(hq + 1)
            cp_async_wait_all()  # this thread's copies of tile i have landed
            cuda.syncthreads()  # everyone's have; and every warp is done with tile i−1
            if it < n_it:  # so tile i+1 may go to the other buffer, landing meanwhile
                stage_rows(smem, rows, q, do, lse, delta, b, hkv * group + hq,
                           I32(i_lo + qt * BR), I32(1 - buf))

            # Sᵀ = K_w Q_iᵀ and dPᵀ = V_w dO_iᵀ: one A fragment a k-step, B two query tiles
            for n in range(NB):
                for r in range(4):
                    s[n, r] = zero
                    dp[n, r] = zero
            for kk in range(KD):
                af[0, 0], af[0, 1], af[0, 2], af[0, 3] = ldmatrix_x4(
                    smem, K0 + a_row * KS + a_col + 16 * kk)
                for n2 in range(NB // 2):
                    b0, b1, b2, b3 = ldmatrix_x4(smem, qb + (16 * n2 + nk_row) * KS + nk_col + 16 * kk)
                    mma(s, 2 * n2, af, 0, b0, b1)
                    mma(s, 2 * n2 + 1, af, 0, b2, b3)
            for kk in range(KV):
                af[0, 0], af[0, 1], af[0, 2], af[0, 3] = ldmatrix_x4(
                    smem, V0 + a_row * VS + a_col + 16 * kk)
                for n2 in range(NB // 2):
                    b0, b1, b2, b3 = ldmatrix_x4(smem, ob + (16 * n2 + nk_row) * VS + nk_col + 16 * kk)
                    mma(dp, 2 * n2, af, 0, b0, b1)
                    mma(dp, 2 * n2 + 1, af, 0, b2, b3)

            if MODS:  # Sᵀ → modified scores; dPᵀ → (dPᵀ − D)·dx/dS
                modify_t(s, dp, rows, buf, sc, I32(j0 + kw + g), i0, shift, t, cap, slopes, b, h)
            # mask: only tiles that cross Sk or a window edge, element by element (a
            # masked score s makes c2·s = −inf, whatever the sign of the scale)
            j_end, lag = I32(j0 + BC), I32(i0 + shift)
            if not (j_end <= sk and (rgt < 0 or I32(j_end - 1 - lag) <= rgt)
                    and (lft < 0 or I32(j0 - lag - (BR - 1)) >= I32(-lft))):
                for rr in range(2):
                    key = I32(j0 + kw + g + 8 * rr)
                    for n in range(NB):
                        for e in range(2):
                            dd = I32(key - lag - (8 * n + 2 * t + e))
                            if key >= sk or (rgt >= 0 and dd > rgt) or (lft >= 0 and dd < I32(-lft)):
                                s[n, 2 * rr + e] = hidden
            # Pᵀ = exp(scale·Sᵀ − LSE) and dSᵀ = Pᵀ ∘ (dPᵀ − D), LSE and D by column
            for rr in range(2):
                for n in range(NB):
                    for e in range(2):
                        col = 8 * n + 2 * t + e
                        p = math.exp2(s[n, 2 * rr + e] * c2 - rows[buf, 0, col])
                        s[n, 2 * rr + e] = p
                        dp[n, 2 * rr + e] = p * (dp[n, 2 * rr + e] if MODS  # (dPᵀ − D)·dx/dS: MODS
                                                 else dp[n, 2 * rr + e] - rows[buf, 1, col])

            # dV_w += Pᵀ dO_i: accumulator tiles 2kb, 2kb+1 of Pᵀ are A fragment kb
            for kb in range(KB):
                for r in range(4):
                    n = 2 * kb + (r >> 1)
                    pf[kb, r] = pack(s[n, 2 * (r & 1)], s[n, 2 * (r & 1) + 1])
            for kb in range(KB):
                for n2 in range(NV // 2):
                    b0, b1, b2, b3 = ldmatrix_x4_trans(
                        smem, ob + (16 * kb + kn_row) * VS + kn_col + 16 * n2)
                    mma(dv_acc, 2 * n2, pf, kb, b0, b1)
                    mma(dv_acc, 2 * n2 + 1, pf, kb, b2, b3)
            # dK_w += dSᵀ Q_i (times scale once, at the end); dSᵀ → shared memory for dQ
            for kb in range(KB):
                for r in range(4):
                    n = 2 * kb + (r >> 1)
                    pf[kb, r] = pack(dp[n, 2 * (r & 1)], dp[n, 2 * (r & 1) + 1])
                    st_shared_b32(smem, S0 + (kw + g + 8 * (r & 1)) * PS + 16 * kb
                                  + 8 * (r >> 1) + 2 * t, pf[kb, r])
            for kb in range(KB):
                for n2 in range(ND // 2):
                    b0, b1, b2, b3 = ldmatrix_x4_trans(
                        smem, qb + (16 * kb + kn_row) * KS + kn_col + 16 * n2)
                    mma(dk_acc, 2 * n2, pf, kb, b0, b1)
                    mma(dk_acc, 2 * n2 + 1, pf, kb, b2, b3)
            cuda.syncthreads()  # dSᵀ of every warp is in shared memory

            # dQ_i += scale · dS K_j: A = dS read transposed from dSᵀ, B = K_j (k = keys)
            for n in range(NQ):
                for r in range(4):
                    dqf[n, r] = zero
            for kb in range(W):
                af[0, 0], af[0, 1], af[0, 2], af[0, 3] = ldmatrix_x4_trans(
                    smem, S0 + (16 * kb + nk_row) * PS + 16 * rs + nk_col)
                for ci in range(CH):
                    c = c_first + ci * SPLIT
                    if c < KD:
                        b0, b1, b2, b3 = ldmatrix_x4_trans(
                            smem, K0 + (16 * kb + kn_row) * KS + kn_col + 16 * c)
                        mma(dqf, 2 * ci, af, 0, b0, b1)
                        mma(dqf, 2 * ci + 1, af, 0, b2, b3)
            for ci in range(CH):  # two adjacent columns a lane: one vector add (PAIRS)
                c = c_first + ci * SPLIT
                for rr in range(2):
                    row = I32(i0 + 16 * rs + g + 8 * rr)
                    if c < KD and row < sq:
                        for hh in range(2):
                            col = 16 * c + 8 * hh + 2 * t
                            x0 = dqf[2 * ci + hh, 2 * rr] * sc
                            x1 = dqf[2 * ci + hh, 2 * rr + 1] * sc
                            if PAIRS:
                                if col < d:
                                    red_add_v2(dq_acc, b, h, row, col, x0, x1)
                            else:
                                if col < d:
                                    cuda.atomic.add(dq_acc, (b, h, row, col), x0)
                                if col + 1 < d:
                                    cuda.atomic.add(dq_acc, (b, h, row, col + 1), x1)

        for rr in range(2):  # dK_j = scale·Σ dSᵀQ and dV_j = Σ PᵀdO: written once
            key = I32(j0 + kw + g + 8 * rr)
            if key < sk:
                for n in range(ND):
                    for e in range(2):
                        if 8 * n + 2 * t + e < d:
                            dk[b, hkv, key, 8 * n + 2 * t + e] = store(dk_acc[n, 2 * rr + e] * sc)
                for n in range(NV):
                    for e in range(2):
                        if 8 * n + 2 * t + e < dv:
                            dv_out[b, hkv, key, 8 * n + 2 * t + e] = store(dv_acc[n, 2 * rr + e])

    return backward, THREADS
