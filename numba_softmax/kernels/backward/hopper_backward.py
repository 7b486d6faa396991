"""hb1 — the attention backward on Hopper's warpgroup MMA: every product on ``wgmma``.

b3's gradients (:mod:`.attention_backward_tc`), with P rebuilt from the forward's LSE and
D = rowsum(dO ∘ O) (:mod:`.attention_backward_io`), in two kernels of one warpgroup each::

    dkdv: one block = 64 keys of one (batch, K/V head); K_j, V_j → shared memory once
        for each query head of the group, each query tile i of 64 rows that sees a key:
            Q_i, dO_i → shared memory; LSE_i, D_i → shared rows
            Sᵀ  = K_j Q_iᵀ          D/16 wgmma m64n64k16 (A = K_j, B = Q_i: K-major)
            dPᵀ = V_j dO_iᵀ         Dv/16 of them (A = V_j, B = dO_i)
            Pᵀ  = exp(scale·Sᵀ − LSE_i)      masked entries 0
            dSᵀ = Pᵀ ∘ (dPᵀ − D_i)
            dV += Pᵀ dO_i            4 wgmma m64nDvk16: A = Pᵀ from registers,
                                    B = dO_i read N-major (the tile as it lies)
            dK += dSᵀ Q_i            the same with dSᵀ and Q_i
        dK = scale·dK, dV → memory
    dq: one block = 64 query rows of one (batch, head); Q_i, dO_i → shared memory once
        for each key tile j the rows see:  S = Q_i K_jᵀ, dP = dO_i V_jᵀ, dS as above,
            dQ += dS K_j                     (K_j read N-major)
        dQ = scale·dQ → the float32 accumulator (rounded by the io module)

Every product reads its tiles from one copy in shared memory: a tile stored as 64-wide
128-byte-swizzled chunks is the K-major operand of one product and the N-major operand
(``trans_b``) of another (:mod:`..hw.wgmma` draws both), so nothing is transposed.  And
the accumulator of Sᵀ is, rounded to 16 bits, the A operand of dV += Pᵀ dO — the
forward's trick of P from registers (:mod:`..attention.hopper_fold`) done on the
transposed scores.

Why it departs from b3: b3 is one kernel (K/V stationary, dQ summed with atomic adds),
five ``mma.sync`` products on warps of 16 rows.  Splitting dQ into its own kernel costs
two products more (S and dP again) but needs no atomics and no transposed operand: the
step to a warp-specialized form (TMA loads, a producer warp) is then the forward's
(:mod:`..attention.hopper_ws`).  Here the block's threads copy the tiles, as h1 does.

Masks: the window −left ≤ j − (i + Sk − Sq) ≤ right (−1: unbounded; causal is right 0),
keys past Sk and rows past Sq (zero in shared memory, P = 0), rows of LSE −inf (saw no
key: gradients 0).  GQA: dK, dV sum over a K/V head's query heads.  D and Dv 64 or 128;
fp16 or bf16 (uint16 bits).  No soft-capping or ALiBi (b3 takes those).  NumPy twin:
:func:`numba_softmax.reference.attention_backward`.
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint16, uint32

from ...runtime import launcher
from ..attention.staging import aligned
from ..hw import jit, vector, wgmma
from ..hw.jit import LOG2E
from ..hw.tma import fence_proxy_async
from . import attention_backward_io as io
from .hopper_backward_parts import (BM, BN, checked, ds_rows, products, row_terms, visible,
                                    whole, writer)

THREADS = 128  # one warpgroup
CHUNK = 64 * 64  # uint16 values in one 64-wide swizzled chunk of a 64-row tile


@functools.cache
def _stager(vec, width):
    """``stage(smem, at, src, r0, limit, flip, tid)``: rows r0 … r0+63 of the 2-D ``src``
    (``width`` columns) into 64-wide swizzled chunks at smem[at]; rows ≥ ``limit`` zero;
    every value xor ``flip``."""
    load = vector.io(vec)[0]
    W = width // vec  # vectors a row

    @jit.device
    def stage(smem, at, src, r0, limit, flip, tid):
        buf = cuda.local.array(vec, uint16)
        for idx in range(tid, 64 * W, THREADS):
            r, c = idx // W, (idx % W) * vec
            inside = r0 + r < limit
            if inside:
                load(src, r0 + r, c, buf, 0)
            for e in range(vec):  # a vector's values stay together under the swizzle
                smem[at + (c >> 6) * CHUNK + wgmma.swizzle128(r, c & 63) + e] = \
                    buf[e] ^ flip if inside else uint16(0)

    return stage


def _shared(d, dv):
    """Dynamic shared memory: four 64-row tiles (two of D columns, two of Dv), 16-bit,
    and 1024 bytes to align the first to the swizzle's 1024-byte atom."""
    return 2 * 64 * 2 * (d + dv) + 1024


@functools.cache
def dkdv_kernel(kind, out_dtype, d, dv, vec):
    """dK, dV of 64 keys a block; grid (⌈Sk/64⌉, B·Hkv) of 128 threads."""
    stage_d, stage_v = _stager(vec, d), _stager(vec, dv)
    qk, vdo, acc_v, acc_k, pack = products(kind, d, dv)
    write_k, write_v = writer(out_dtype, d), writer(out_dtype, dv)
    NS, KP = BN // 2, BN // 16  # S registers a lane; P's k16 steps
    ND, NV = d // 2, dv // 2  # dK, dV registers a lane
    inf = math.inf

    @jit.kernel
    def dkdv(do, q, k, v, lse, delta, dk, dv_out, scale, left, right):
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3  # this lane's keys 16·warp + g (+8), queries 2t (+1)
        n_h, sq, n_kv, sk = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
        group = n_h // n_kv
        b, hk = cuda.blockIdx.y // n_kv, cuda.blockIdx.y % n_kv
        j0, shift = cuda.blockIdx.x * BM, sk - sq
        # the query rows that see some key of the block
        lo = 0 if right < 0 else max(0, j0 - shift - right)
        hi = sq if left < 0 else min(sq, j0 + BM - shift + left)
        c2 = float32(scale * LOG2E)  # exp(scale·s − LSE) = exp2(c2·s − LSE·log2 e)

        smem = cuda.shared.array(0, uint16)  # K_j, V_j, Q_i, dO_i
        k_at = ((1024 - (wgmma.address(smem, 0) & 1023)) & 1023) >> 1  # 1024-byte aligned
        v_at = k_at + BM * d
        q_at = v_at + BM * dv
        do_at = q_at + BN * d
        lse_s = cuda.shared.array(BN, float32)  # LSE_i·log2 e (+inf: the row takes no part)
        dl_s = cuda.shared.array(BN, float32)  # D_i
        s = cuda.local.array(NS, float32)  # Sᵀ, then Pᵀ: s[4j + 2rr + e] is key row rr,
        dp = cuda.local.array(NS, float32)  # query 8j + 2t + e; dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(ND, float32)
        acc_dv = cuda.local.array(NV, float32)
        pf = cuda.local.array((KP, 4), uint32)  # Pᵀ, then dSᵀ, as A fragments
        for x in range(d // 2):
            acc_dk[x] = 0.0
        for x in range(dv // 2):
            acc_dv[x] = 0.0
        stage_d(smem, k_at, k[b, hk], j0, sk, uint16(0), tid)  # K_j, V_j: once
        stage_v(smem, v_at, v[b, hk], j0, sk, uint16(0), tid)

        for h in range(hk * group, hk * group + group):  # GQA: the group's query heads
            for i0 in range((lo // BN) * BN, hi, BN):
                cuda.syncthreads()  # every product of the last tile has read Q_i and dO_i
                stage_d(smem, q_at, q[b, h], i0, sq, uint16(0), tid)
                stage_v(smem, do_at, do[b, h], i0, sq, uint16(0), tid)
                if tid < BN:
                    r = i0 + tid
                    x = lse[b, h, r] if r < sq else -inf
                    lse_s[tid] = x * float32(LOG2E) if x != -inf else inf
                    dl_s[tid] = delta[b, h, r] if r < sq else 0.0
                fence_proxy_async()  # this thread's stores, before the tensor cores' reads
                cuda.syncthreads()  # every thread's stores are in (K_j, V_j the first time)

                qk(s, smem, k_at, smem, q_at)  # Sᵀ = K_j Q_iᵀ
                vdo(dp, smem, v_at, smem, do_at)  # dPᵀ = V_j dO_iᵀ
                inside = i0 + BN <= sq and whole(i0, j0, shift, left, right)
                for rr in range(2):
                    key = j0 + 16 * warp + g + 8 * rr
                    for j in range(BN // 8):
                        for e in range(2):
                            x, col = 4 * j + 2 * rr + e, 8 * j + 2 * t + e
                            p = math.exp2(s[x] * c2 - lse_s[col])  # Pᵀ
                            if not inside and not visible(i0 + col, key, shift, left, right):
                                p = float32(0.0)
                            s[x] = p
                            dp[x] = p * (dp[x] - dl_s[col])  # dSᵀ = Pᵀ ∘ (dPᵀ − D_i)
                pack(s, pf)
                acc_v(acc_dv, pf, smem, do_at)  # dV += Pᵀ dO_i
                pack(dp, pf)
                acc_k(acc_dk, pf, smem, q_at)  # dK += dSᵀ Q_i

        write_k(dk, b, hk, j0 + 16 * warp + g, sk, acc_dk, float32(scale), t)
        write_v(dv_out, b, hk, j0 + 16 * warp + g, sk, acc_dv, float32(1.0), t)

    return dkdv


@functools.cache
def dq_kernel(kind, d, dv, vec):
    """dQ of 64 query rows a block, into the float32 accumulator; grid (⌈Sq/64⌉, B·Hq)."""
    stage_d, stage_v = _stager(vec, d), _stager(vec, dv)
    qk, vdo, acc_v, acc_k, pack = products(kind, d, dv)
    write_q = writer(np.float32, d)
    NS, KP, ND = BN // 2, BN // 16, d // 2

    @jit.kernel
    def dq(do, q, k, v, lse, delta, dq_acc, scale, left, right):
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3  # this lane's rows 16·warp + g (+8), keys 2t (+1)
        n_h, sq, n_kv, sk = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        hk = h // (n_h // n_kv)  # GQA: the K/V head this query head reads
        i0, shift = cuda.blockIdx.x * BM, sk - sq
        # the keys some row of the block sees
        lo = 0 if left < 0 else max(0, i0 + shift - left)
        hi = sk if right < 0 else min(sk, i0 + BM + shift + right)
        c2 = float32(scale * LOG2E)

        smem = cuda.shared.array(0, uint16)  # Q_i, dO_i, K_j, V_j
        q_at = ((1024 - (wgmma.address(smem, 0) & 1023)) & 1023) >> 1
        do_at = q_at + BM * d
        k_at = do_at + BM * dv
        v_at = k_at + BN * d
        s = cuda.local.array(NS, float32)  # S, then P; s[4j + 2rr + e]: row rr, key 8j + 2t + e
        dp = cuda.local.array(NS, float32)  # dP, then dS
        acc = cuda.local.array(ND, float32)  # dQ, laid out as S with D columns
        pf = cuda.local.array((KP, 4), uint32)  # dS as A fragments
        l2 = cuda.local.array(2, float32)  # the lane's rows' LSE·log2 e (+inf: no part)
        dl = cuda.local.array(2, float32)  # and D
        for x in range(d // 2):
            acc[x] = 0.0
        row_terms(lse, delta, b, h, i0 + 16 * warp + g, sq, l2, dl)
        stage_d(smem, q_at, q[b, h], i0, sq, uint16(0), tid)  # Q_i, dO_i: once
        stage_v(smem, do_at, do[b, h], i0, sq, uint16(0), tid)

        for j0 in range((lo // BN) * BN, hi, BN):
            cuda.syncthreads()  # every product of the last tile has read K_j and V_j
            stage_d(smem, k_at, k[b, hk], j0, sk, uint16(0), tid)
            stage_v(smem, v_at, v[b, hk], j0, sk, uint16(0), tid)
            fence_proxy_async()  # this thread's stores, before the tensor cores' reads
            cuda.syncthreads()  # every thread's stores are in (Q_i, dO_i the first time)

            qk(s, smem, q_at, smem, k_at)  # S = Q_i K_jᵀ
            vdo(dp, smem, do_at, smem, v_at)  # dP = dO_i V_jᵀ
            inside = j0 + BN <= sk and whole(i0, j0, shift, left, right)
            ds_rows(s, dp, l2, dl, c2, i0 + 16 * warp + g, j0, t, sk, shift, left, right, inside)
            pack(dp, pf)
            acc_k(acc, pf, smem, k_at)  # dQ += dS K_j

        write_q(dq_acc, b, h, i0 + 16 * warp + g, sq, acc, float32(scale), t)

    return dq


def launch(do, q, k, v, o, lse, dq, dk, dv, *, causal=False, window=(-1, -1), scale=None,
           stream=0):
    """dQ, dK, dV into ``dq``, ``dk``, ``dv`` (q's, k's, v's shapes and dtype) from 4-D
    device arrays do, q, k, v, o (all float16 or all uint16 = bfloat16 bits), lse
    (B, Hq, Sq) float32; D and Dv 64 or 128; a nonzero ``scale`` (None: 1/sqrt(D)).
    Needs sm_90 (or the simulator)."""
    kind, d, dvh = checked(do, q, k, v, scale)
    vec = 8 if all(aligned(x) for x in (q, k, v, do)) else 1
    shared = _shared(d, dvh)

    def main(delta, dq_acc, scale, left, right):
        bits = [a.view(np.uint16) for a in (do, q, k, v)]
        n_b, n_h, sq = q.shape[:3]
        n_kv, sk = k.shape[1:3]
        launcher.launch(dkdv_kernel(kind, dk.dtype, d, dvh, vec), (-(-sk // BM), n_b * n_kv),
                        THREADS, stream, (*bits, lse, delta, dk, dv, scale, left, right),
                        shared=shared)
        if sq:
            launcher.launch(dq_kernel(kind, d, dvh, vec), (-(-sq // BM), n_b * n_h), THREADS,
                            stream, (*bits, lse, delta, dq_acc, scale, left, right),
                            shared=shared)

    io.launch(main, do, q, k, v, o, dq, causal=causal, window=window, scale=scale,
              stream=stream, max_head_dim=128)
