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
× 64 keys is D/16 instructions instead of a warp's 4·D/16 ``mma`` per 16 rows.  Here the
block's threads copy each tile themselves, 16 bytes a load (V transposed on the way, value
by value, unless ``v_n_major``), between barriers; h2 (:mod:`.hopper_ws`) has the copy
engine do it, fed by a producer warp.  The fold of a tile is :mod:`.hopper_fold`.

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

from ...runtime import launcher
from ..hw import jit, vector, wgmma
from ..hw.jit import LOG2E
from ..hw.tma import fence_proxy_async
from . import hopper_fold
from .staging import aligned

BM, BN, THREADS = 64, 64, 128  # query rows a block (one warpgroup), keys a tile
HEAD_DIMS = (64, 128)
ALIGN = wgmma.TILE_ALIGN  # (a module global: Numba takes it as the constant it must be)


@functools.cache
def kernel(kind, out_dtype, d, dv, vec=1, v_n_major=False):
    """The forward kernel for fp16 (``kind`` "f16") or bf16 ("bf16") inputs given as
    uint16 bits, output ``out_dtype`` (float16, uint16 = bf16 bits, or float32);
    ``vec`` 8: q, k, v are read 16 bytes at a time (:func:`.staging.aligned`), else 1;
    ``v_n_major``: V_j is stored as it lies in memory and read N-major by the second
    product (``trans_b``), instead of transposed on the way into shared memory."""
    load = vector.io(vec)[0]
    QV, KV, VV = d // vec, d // vec, dv // vec  # vectors a row
    scores, accumulate = hopper_fold.products(kind, d, dv, BN, BM, v_n_major)
    update, done = hopper_fold.online(kind, dv, BN), hopper_fold.finish(out_dtype, dv)
    NS, NO, KP = BN // 2, dv // 2, BN // 16  # S, O registers a lane; P's k16 steps
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
            m[rr], l[rr] = -math.inf, 0.0
        for j in range(NO):
            acc[j] = 0.0

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

            scores(s, sq_s, 0, sk_s, 0)  # S = Q K_jᵀ
            update(s, m, l, acc, pf, j0, i0 + 16 * warp + g, hi, causal, sk, shift, sc, c2, t)
            accumulate(acc, pf, sv_s, 0)  # O += P V_j

        done(o, lse, b, h, i0 + 16 * warp + g, sq, m, l, acc, sc, t)

    return forward


def checked(q, k, v, o, lse, scale):
    """The shared checks of the wgmma kernels' launches: 4-D q, k, v of one fp16 / bf16
    dtype, Hq a multiple of Hkv, D and Dv 64 or 128, o and lse of the result's shapes, a
    finite nonzero scale (None: 1/sqrt(D)).  Returns (B, Hq, Sq, D, Hkv, Sk, Dv, scale)."""
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
    return n_b, n_h, sq, d, n_kv, sk, dv, scale


def launch(q, k, v, o, lse, *, causal=False, scale=None, stream=0, v_n_major=False):
    """Run on 4-D device arrays q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv),
    all float16 or all uint16 (bfloat16 bits), Hq a multiple of Hkv, D and Dv 64 or 128;
    ``o`` (B, Hq, Sq, Dv: q's dtype or float32) and ``lse`` (B, Hq, Sq, float32) receive
    the result.  Any strides.  Needs sm_90 (or the simulator).  ``v_n_major``: see
    :func:`kernel`."""
    n_b, n_h, sq, d, n_kv, sk, dv, scale = checked(q, k, v, o, lse, scale)
    kind = "f16" if q.dtype == np.float16 else "bf16"
    bits = [a.view(np.uint16) if kind == "f16" else a for a in (q, k, v)]
    blocks = n_b * n_h * -(-sq // BM)
    if blocks == 0:
        return
    fwd = kernel(kind, o.dtype, d, dv, 8 if all(aligned(a) for a in bits) else 1,
                 bool(v_n_major))
    launcher.launch(fwd, (blocks,), THREADS, stream, (*bits, o, lse, scale, bool(causal)))
