"""h1 — attention forward on Hopper's warpgroup MMA: ``wgmma`` for S = Q Kᵀ and O += P V.

a2's loop (:mod:`.attention_tc`) with both products moved from ``mma.sync`` — a warp,
16×8×16 a step, operands in registers — to ``wgmma`` (:mod:`..hw.wgmma`): a warpgroup of
four warps, 64×N×16 a step, B (and here A of the first product) read from shared memory by
the tensor cores themselves::

    one block = one warpgroup (128 threads) = 64 query rows of one (batch, head)
        Q (64×D) → shared memory, 128-byte swizzled: the K-major A of S = Q K_jᵀ
        for each key tile j of 64 keys some row of the block can see:
            K_j (64×D) → shared memory, swizzled: the K-major B of S = Q K_jᵀ
            V_j (64×Dv) → shared memory *transposed*, Dv×64: the K-major B of O += P V_j
            S = Q K_jᵀ      D/16 wgmma m64n64k16, one group; S in the accumulators
            m' = max(m, rowmax S)   a row's 16 values a lane, then its quad (2 shuffles)
            P = exp(scale·(S − m')),  α = exp(scale·(m − m'))
            ℓ = α·ℓ + rowsum P,  O = α·O
            O += P V_j      4 wgmma m64nDvk16, P from registers: a wgmma accumulator's
                            layout is the A fragment's (``mma.sync``'s, repeated), so P
                            rounded to 16 bits feeds the next product without shared memory
        O / ℓ once; LSE = scale·m + log ℓ; rows that saw no key: O = 0, LSE = −inf

Why it departs from a2: a warpgroup's product is 4× a warp's, and the tensor cores read K
and V straight from shared memory (no ``ldmatrix`` into registers first), so S for 64 rows
× 64 keys is D/16 instructions instead of a warp's 4·D/16 ``mma`` per 16 rows.  What it
does not do yet, and FlashAttention-3 does: K and V arrive by TMA (:mod:`..hw.tma`) into
several buffers while a producer warp waits on ``mbarrier``\\ s, and two consumer
warpgroups overlap one's softmax with the other's products.  Here the block's threads
copy each tile themselves, 16 bytes a load (V transposed on the way, value by value),
between barriers.

Masks: causal, bottom-right aligned (query i sees keys j ≤ i + Sk − Sq); keys past Sk are
zero-filled in shared memory and masked.  GQA: query head h reads K/V head h // (Hq/Hkv).
D and Dv are 64 or 128 (Q and K are stored as 64-wide swizzled chunks); fp16 or bf16.
NumPy twin: :func:`numba_softmax.reference.attention`.  Under the CUDA simulator the
wgmma and fence calls are :mod:`..hw._wgmma_sim`'s: the same kernel source.
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint16, uint32

from ...combine import lse_device, weight_device
from ...runtime import launcher
from ..hw import jit, vector, wgmma
from ..hw.jit import LOG2E
from ..hw.mma import for_dtype, max_nan
from ..hw.tma import fence_proxy_async
from .staging import aligned

FULL = 0xFFFFFFFF
BM, BN, THREADS = 64, 64, 128  # query rows a block (one warpgroup), keys a tile
HEAD_DIMS = (64, 128)
SW = wgmma.SWIZZLE_128B
ALIGN = wgmma.TILE_ALIGN  # (a module global: Numba takes it as the constant it must be)


@functools.cache
def kernel(kind, out_dtype, d, dv, vec=1, v_n_major=False):
    """The forward kernel for fp16 (``kind`` "f16") or bf16 ("bf16") inputs given as
    uint16 bits, output ``out_dtype`` (float16, uint16 = bf16 bits, or float32);
    ``vec`` 8: q, k, v are read 16 bytes at a time (:func:`.staging.aligned`), else 1;
    ``v_n_major``: V_j is stored as it lies in memory and read N-major by the second
    product (``trans_b``), instead of transposed on the way into shared memory."""
    _, pack = for_dtype(np.float16 if kind == "f16" else np.uint16)
    store = jit.storer(out_dtype)
    load = vector.io(vec)[0]
    QV, KV, VV = d // vec, d // vec, dv // vec  # vectors a row
    mma_s, wait = wgmma.wgmma_ss(BN, kind), wgmma.wgmma_wait(0)
    mma_o = wgmma.wgmma_rs(dv, kind, v_n_major)
    # V_j's descriptor: transposed (K-major), 8-row groups 1024 bytes apart, k16 steps 32
    # bytes on; N-major, 64-column blocks BN·128 bytes apart, k16 steps 16 rows = 2048 on
    V_LBO, V_STEP = (BN * 128, 2048) if v_n_major else (16, 32)
    KS, NS, NO, KP = d // 16, BN // 2, dv // 2, BN // 16  # k-steps; S, O registers; P's k-steps
    Q_CHUNK, K_CHUNK = BM * 64, BN * 64  # uint16 values in one 64-wide swizzled chunk
    Q_SIZE, K_SIZE, V_SIZE = BM * d, BN * d, dv * BN

    @jit.kernel
    def forward(q, k, v, o, lse, scale, causal):
        """q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) as uint16 bits →
        o (B, Hq, Sq, Dv), lse (B, Hq, Sq); grid B·Hq·⌈Sq/64⌉ blocks of 128 threads."""
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3  # this lane's rows 16·warp + g (+8), columns 2t (+1)
        n_h, sq, sk = q.shape[1], q.shape[2], k.shape[2]
        n_tq = (sq + BM - 1) // BM
        bh, tile = cuda.blockIdx.x // n_tq, cuda.blockIdx.x % n_tq
        b, h = bh // n_h, bh % n_h
        hk = h // (n_h // k.shape[1])  # GQA: the K/V head this query head reads
        i0, shift = tile * BM, sk - sq  # query i sees keys j < i + shift + 1 when causal
        hi = min(sk, i0 + BM + shift) if causal else sk  # keys the block's rows can see
        n_tiles = (hi + BN - 1) // BN if hi > 0 else 0
        zero, neg_inf = float32(0.0), float32(-math.inf)
        sc = float32(abs(scale))
        c2 = sc * float32(LOG2E)  # exp(sc·x) = exp2(c2·x)
        flip = uint16(0x8000) if scale < 0 else uint16(0)  # scale·QKᵀ = sc·(−Q)Kᵀ

        sq_s = cuda.shared.array(Q_SIZE, uint16, alignment=ALIGN)
        sk_s = cuda.shared.array(K_SIZE, uint16, alignment=ALIGN)
        sv_s = cuda.shared.array(V_SIZE, uint16, alignment=ALIGN)
        buf = cuda.local.array(vec, uint16)  # one vector: vec values of a row
        q_h, k_h, v_h = q[b, h], k[b, hk], v[b, hk]  # this head's rows
        # Q → shared memory once, chunk c // 64 of 64 columns, rows past Sq zero; a
        # vector's values stay together under the swizzle (it moves 16-byte chunks)
        for idx in range(tid, BM * QV, THREADS):
            r, c = idx // QV, (idx % QV) * vec
            if i0 + r < sq:
                load(q_h, i0 + r, c, buf, 0)
            for e in range(vec):
                sq_s[(c >> 6) * Q_CHUNK + wgmma.swizzle128(r, c & 63) + e] = \
                    buf[e] ^ flip if i0 + r < sq else uint16(0)

        m = cuda.local.array(2, float32)  # rows 16·warp + g (index 0) and + 8 (1)
        l = cuda.local.array(2, float32)  # ℓ over this lane's columns (the quad sums at the end)
        s = cuda.local.array(NS, float32)  # S, then P: s[4j + 2rr + e] is row rr, key 8j + 2t + e
        acc = cuda.local.array(NO, float32)  # O, laid out as S with Dv columns
        pf = cuda.local.array((KP, 4), uint32)  # P as A fragments, one per 16 keys
        for rr in range(2):
            m[rr], l[rr] = neg_inf, zero
        for j in range(NO):
            acc[j] = zero

        for it in range(n_tiles):
            j0 = it * BN
            cuda.syncthreads()  # every wgmma of tile j−1 has read K and V (waited for)
            for idx in range(tid, BN * KV, THREADS):  # K_j: rows of keys, as Q
                r, c = idx // KV, (idx % KV) * vec
                if j0 + r < sk:
                    load(k_h, j0 + r, c, buf, 0)
                for e in range(vec):
                    sk_s[(c >> 6) * K_CHUNK + wgmma.swizzle128(r, c & 63) + e] = \
                        buf[e] if j0 + r < sk else uint16(0)
            for idx in range(tid, BN * VV, THREADS):  # V_j: as K, or transposed (row c
                r, c = idx // VV, (idx % VV) * vec  # holds column c; reads along c coalesced)
                if j0 + r < sk:
                    load(v_h, j0 + r, c, buf, 0)
                for e in range(vec):
                    x = buf[e] if j0 + r < sk else uint16(0)
                    if v_n_major:
                        sv_s[(c >> 6) * K_CHUNK + wgmma.swizzle128(r, c & 63) + e] = x
                    else:
                        sv_s[wgmma.swizzle128(c + e, r)] = x
            fence_proxy_async()  # this thread's stores, ordered before the tensor cores' reads
            cuda.syncthreads()  # every thread's stores are in (and Q's, the first time)

            # S = Q K_jᵀ: D/16 k-steps, 4 to a 64-wide chunk, one group
            wgmma.wgmma_fence()  # the accumulators were last written by ordinary code
            for st in range(KS):
                da = wgmma.advance(wgmma.descriptor(sq_s, (st >> 2) * Q_CHUNK, 16, 1024, SW),
                                   32 * (st & 3))
                db = wgmma.advance(wgmma.descriptor(sk_s, (st >> 2) * K_CHUNK, 16, 1024, SW),
                                   32 * (st & 3))
                mma_s(s, da, db, 1 if st > 0 else 0)
            wgmma.wgmma_commit()
            wait()

            # the online update of (m, ℓ, O) for the lane's two rows
            for rr in range(2):
                lim = hi  # keys < lim are visible to this row
                if causal:
                    lim = min(sk, i0 + 16 * warp + g + 8 * rr + shift + 1)
                if j0 + BN > lim:  # a tile crossing the row's edge: mask element by element
                    for j in range(BN // 8):
                        for e in range(2):
                            if j0 + 8 * j + 2 * t + e >= lim:
                                s[4 * j + 2 * rr + e] = neg_inf
                mx = s[2 * rr]
                for j in range(BN // 8):
                    for e in range(2):
                        mx = max_nan(s[4 * j + 2 * rr + e], mx)
                mx = max_nan(cuda.shfl_xor_sync(FULL, mx, 1), mx)  # the quad: 4 lanes
                mx = max_nan(cuda.shfl_xor_sync(FULL, mx, 2), mx)  # hold a row
                m_new = max_nan(mx, m[rr])
                alpha = weight_device(m[rr] * sc, m_new * sc)  # 0 from −inf
                mc = zero if m_new == neg_inf else m_new * c2  # (every s −inf: P = 0)
                part = zero
                for j in range(BN // 8):
                    for e in range(2):
                        p = math.exp2(s[4 * j + 2 * rr + e] * c2 - mc)
                        s[4 * j + 2 * rr + e] = p
                        part += p
                l[rr] = alpha * l[rr] + part
                m[rr] = m_new
                for j in range(dv // 8):
                    acc[4 * j + 2 * rr] *= alpha
                    acc[4 * j + 2 * rr + 1] *= alpha

            # P → A fragments: keys 16kk … 16kk+15 are accumulator blocks 2kk and 2kk+1
            for kk in range(KP):
                for r in range(4):
                    n = 2 * kk + (r >> 1)
                    pf[kk, r] = pack(s[4 * n + 2 * (r & 1)], s[4 * n + 2 * (r & 1) + 1])
            # O += P V_j: 4 k-steps over the tile's keys, B = V_jᵀ (Dv rows of 64 keys)
            wgmma.wgmma_fence()
            for kk in range(KP):
                dv_desc = wgmma.advance(wgmma.descriptor(sv_s, 0, V_LBO, 1024, SW), V_STEP * kk)
                mma_o(acc, pf, kk, dv_desc, 1)
            wgmma.wgmma_commit()
            wait()

        # O / ℓ once; ℓ = 0: the row saw no key → O = 0, chosen (its O may hold 0·NaN)
        for rr in range(2):
            lt = l[rr]
            lt += cuda.shfl_xor_sync(FULL, lt, 1)
            lt += cuda.shfl_xor_sync(FULL, lt, 2)
            row = i0 + 16 * warp + g + 8 * rr
            if row < sq:
                inv = float32(1.0) / lt if lt != zero else zero
                for j in range(dv // 8):
                    for e in range(2):
                        x = acc[4 * j + 2 * rr + e] * inv if lt != zero else zero
                        o[b, h, row, 8 * j + 2 * t + e] = store(x)
                if t == 0:
                    lse[b, h, row] = lse_device(m[rr] * sc, lt)

    return forward


def launch(q, k, v, o, lse, *, causal=False, scale=None, stream=0, v_n_major=False):
    """Run on 4-D device arrays q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv),
    all float16 or all uint16 (bfloat16 bits), Hq a multiple of Hkv, D and Dv 64 or 128;
    ``o`` (B, Hq, Sq, Dv: q's dtype or float32) and ``lse`` (B, Hq, Sq, float32) receive
    the result.  Any strides.  Needs sm_90 (or the simulator).  ``v_n_major``: see
    :func:`kernel`."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D, got {q.shape}, {k.shape}, {v.shape}")
    n_b, n_h, sq, d = q.shape
    _, n_kv, sk, dv = v.shape
    if k.shape != (n_b, n_kv, sk, d) or v.shape[0] != n_b or n_kv < 1 or n_h % n_kv:
        raise ValueError(f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}")
    if d not in HEAD_DIMS or dv not in HEAD_DIMS:
        raise ValueError(f"D and Dv must be 64 or 128, got {d} and {dv}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (np.float16, np.uint16):
        raise TypeError(f"q, k, v must all be float16 or all uint16 (bfloat16 bits), got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if o.shape != (n_b, n_h, sq, dv) or o.dtype not in (q.dtype, np.float32) \
            or lse.shape != (n_b, n_h, sq) or lse.dtype != np.float32:
        raise ValueError(f"o must be {(n_b, n_h, sq, dv)} of {q.dtype} or float32 and lse "
                         f"{(n_b, n_h, sq)} float32, got {o.shape} {o.dtype}, {lse.shape} "
                         f"{lse.dtype}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale != 0.0):
        raise ValueError(f"scale must be finite and nonzero, got {scale}")
    kind = "f16" if q.dtype == np.float16 else "bf16"
    bits = [a.view(np.uint16) if kind == "f16" else a for a in (q, k, v)]
    blocks = n_b * n_h * -(-sq // BM)
    if blocks == 0:
        return
    fwd = kernel(kind, o.dtype, d, dv, 8 if all(aligned(a) for a in bits) else 1,
                 bool(v_n_major))
    launcher.launch(fwd, (blocks,), THREADS, stream, (*bits, o, lse, scale, bool(causal)))
