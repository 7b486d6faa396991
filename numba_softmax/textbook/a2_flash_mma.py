"""a2 — FlashAttention forward on tensor cores: ``mma.sync`` m16n8k16, fp16 in, fp32 out.

a1's loop with both products on tensor cores.  A warp owns 16 query rows; its block's
warps share K, V tiles of Bc = 32 keys in shared memory.  ``mma_f16(c, ci, a, ai, b0, b1)``
is C (16×8, fp32) += A (16×16)·B (16×8), each lane holding a fragment (g = lane >> 2,
t = lane % 4; the full map is in ``numba_softmax.kernels.hw.mma``):

    A = Q or P (16×16)         B = K_jᵀ or V_j (16×8)     C = S or O (16×8, fp32)
            k: 2t,2t+1  2t+8,2t+9        n = g                      n: 2t   2t+1
    row g      a0          a2       k 2t,2t+1   b0       row g       c0    c1
    row g+8    a1          a3       k 2t+8,+9   b1       row g+8     c2    c3

A quad (the 4 lanes of one g) holds whole rows of S: a row max or sum is 2 shuffles.
Two S tiles side by side (keys 0–7, 8–15) are one A fragment of P, so P = exp(S − m) goes
from the accumulators straight back in (a0 = c0,c1 of tile 0; a1 = c2,c3; a2, a3 the same
of tile 1).  ℓ stays a per-lane partial sum (the quad shares m) until the end.  Bytes:
a1's in 2-byte values (O written in float32).  FLOPs: 4·BH·Sq·Sk·D, D = Dv a multiple of
16.  No causal mask: a1 shows it.  NumPy twin: ``numba_softmax.reference.flash_attention``.
Fast kernel: ``numba_softmax.kernels.attention.attention_tc`` (``attention(q, k, v)``, fp16).
Run: ``python -m numba_softmax.textbook.a2_flash_mma``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import larger_device, lse_device, weight_device
from numba_softmax.kernels.hw.mma import mma_f16, pack_f16x2

BC = 32  # keys a tile: ST = 4 S tiles of n8, PF = 2 P fragments of k16
ST, PF = BC // 8, BC // 16
_KERNELS = {}


def flash_mma(D):
    """The kernel for head dimension D: fragment counts are constants, so fragments stay
    in registers (loops over them unroll)."""
    if D in _KERNELS:
        return _KERNELS[D]
    QF, OT = D // 16, D // 8  # Q's A fragments (k16 steps), O's accumulator tiles (n8)

    @cuda.jit
    def kernel(q, k, v, o, lse, scale):
        bh, t, T, sq, sk = cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x, q.shape[1], k.shape[1]
        lane, r0 = t % 32, cuda.blockIdx.x * (T // 2) + 16 * (t // 32)  # my warp's first row
        g, tq = lane >> 2, lane & 3
        K_j = cuda.shared.array((BC, D), np.float32)
        V_j = cuda.shared.array((BC, D), np.float32)
        Qa = cuda.local.array((QF, 4), np.uint32)  # Q as A fragments, for all tiles
        S = cuda.local.array((ST, 4), np.float32)
        P = cuda.local.array((1, 4), np.uint32)
        O = cuda.local.array((OT, 4), np.float32)
        m = cuda.local.array(2, np.float32)  # rows g and g+8
        l = cuda.local.array(2, np.float32)
        for kc in range(QF):  # Q's fragments: rows g, g+8; columns 2t, 2t+1 (+8)
            for r in range(4):
                row, c = r0 + g + 8 * (r & 1), 16 * kc + 2 * tq + 8 * (r >> 1)
                Qa[kc, r] = pack_f16x2(q[bh, row, c], q[bh, row, c + 1]) if row < sq else np.uint32(0)
        for i in range(OT):
            for r in range(4):
                O[i, r] = 0.0
        for h in range(2):
            m[h], l[h] = -math.inf, 0.0
        for j0 in range(0, sk, BC):
            for e in range(t, BC * D, T):  # load K_j, V_j as float32 (zeros past Sk)
                kk, c = e // D, e % D
                ok = j0 + kk < sk
                K_j[kk, c] = k[bh, j0 + kk, c] if ok else 0.0
                V_j[kk, c] = v[bh, j0 + kk, c] if ok else 0.0
            cuda.syncthreads()  # K_j, V_j are complete before any warp reads them
            for n in range(ST):  # S = Q K_jᵀ: B = K_jᵀ, column n = key 8n + g
                for r in range(4):
                    S[n, r] = 0.0
                for kc in range(QF):
                    c = 16 * kc + 2 * tq
                    mma_f16(S, n, Qa, kc, pack_f16x2(K_j[8 * n + g, c], K_j[8 * n + g, c + 1]),
                            pack_f16x2(K_j[8 * n + g, c + 8], K_j[8 * n + g, c + 9]))
            for h in range(2):  # per row: scale, mask, m̃ = rowmax(S) over the quad
                m_tile = np.float32(-math.inf)
                for n in range(ST):
                    for r in range(2 * h, 2 * h + 2):
                        key = j0 + 8 * n + 2 * tq + (r & 1)
                        S[n, r] = S[n, r] * scale if key < sk else -math.inf
                        m_tile = larger_device(m_tile, S[n, r])
                m_tile = larger_device(m_tile, cuda.shfl_xor_sync(0xFFFFFFFF, m_tile, 1))
                m_tile = larger_device(m_tile, cuda.shfl_xor_sync(0xFFFFFFFF, m_tile, 2))
                m_new = larger_device(m[h], m_tile)
                alpha = weight_device(m[h], m_new)  # α = exp(m − m_new): re-base ℓ and O
                l[h] *= alpha
                for i in range(OT):
                    O[i, 2 * h] *= alpha
                    O[i, 2 * h + 1] *= alpha
                for n in range(ST):  # P = exp(S − m_new), in place; ℓ += my part of rowsum(P)
                    for r in range(2 * h, 2 * h + 2):
                        S[n, r] = weight_device(S[n, r], m_new)
                        l[h] += S[n, r]
                m[h] = m_new
            for kc in range(PF):  # O += P V_j: S tiles 2kc, 2kc+1 are P's A fragment
                P[0, 0] = pack_f16x2(S[2 * kc, 0], S[2 * kc, 1])
                P[0, 1] = pack_f16x2(S[2 * kc, 2], S[2 * kc, 3])
                P[0, 2] = pack_f16x2(S[2 * kc + 1, 0], S[2 * kc + 1, 1])
                P[0, 3] = pack_f16x2(S[2 * kc + 1, 2], S[2 * kc + 1, 3])
                key = 16 * kc + 2 * tq
                for i in range(OT):  # B = V_j: rows = keys 2t, 2t+1 (+8), column 8i + g
                    mma_f16(O, i, P, 0, pack_f16x2(V_j[key, 8 * i + g], V_j[key + 1, 8 * i + g]),
                            pack_f16x2(V_j[key + 8, 8 * i + g], V_j[key + 9, 8 * i + g]))
            cuda.syncthreads()  # every warp is done with K_j, V_j before the next tile lands
        for h in range(2):  # ℓ = the quad's partial sums; write O / ℓ and LSE
            l[h] += cuda.shfl_xor_sync(0xFFFFFFFF, l[h], 1)
            l[h] += cuda.shfl_xor_sync(0xFFFFFFFF, l[h], 2)
            row = r0 + g + 8 * h
            if row < sq:
                inv = np.float32(0.0) if l[h] == 0 else np.float32(1.0) / l[h]
                for i in range(OT):
                    o[bh, row, 8 * i + 2 * tq] = O[i, 2 * h] * inv
                    o[bh, row, 8 * i + 2 * tq + 1] = O[i, 2 * h + 1] * inv
                if tq == 0:
                    lse[bh, row] = lse_device(m[h], l[h])

    _KERNELS[D] = kernel
    return kernel


def launch(q, k, v, o=None, lse=None, scale=None, warps=4):
    """(O, LSE), both float32, of float16 device arrays q (BH, Sq, D), k, v (BH, Sk, D)."""
    bh, sq, d = q.shape
    if d % 16 or d > 256 or k.shape != (bh, k.shape[1], d) or v.shape != k.shape:
        raise ValueError(f"need q (BH, Sq, D), k and v (BH, Sk, D), D a multiple of 16 up to 256; "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    o = cuda.device_array((bh, sq, d), np.float32) if o is None else o
    lse = cuda.device_array((bh, sq), np.float32) if lse is None else lse
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    flash_mma(d)[((sq + 16 * warps - 1) // (16 * warps), bh), 32 * warps](q, k, v, o, lse, np.float32(scale))
    return o, lse


if __name__ == "__main__":
    from numba_softmax import attention, reference
    from numba_softmax.textbook import _main

    print("a2 flash forward (tensor cores): validate (O, LSE) against the float64 reference")
    cases = [(1, 1, 1, 16, 1), (2, 20, 40, 16, 1), (1, 33, 9, 32, 2)] if _main.SIM else \
        [(1, 1, 1, 16, 4), (4, 200, 333, 64, 4), (4, 333, 200, 128, 4), (2, 1, 1000, 64, 4)]
    for bh, sq, sk, d, warps in cases:
        q, k, v = (_main.randn(bh, s, d, dtype=np.float16) for s in (sq, sk, sk))
        o, lse = launch(*map(cuda.to_device, (q, k, v)), warps=warps)
        o_ref, lse_ref = reference.attention(q, k, v, return_lse=True)  # exact fp16 inputs
        label = f"{bh}×{sq}×{sk}×{d}, {warps} warps"  # P is rounded to fp16 before P·V
        _main.check(label + " O", o.copy_to_host(), o_ref, rtol=4e-3, atol=4e-3)
        _main.check(label + " LSE", lse.copy_to_host(), lse_ref)
    if _main.timing():
        bh, s, d = 32, 2048, 64
        q, k, v = (cuda.to_device(_main.randn(bh, s, d, dtype=np.float16)) for _ in range(3))
        o, lse = launch(q, k, v)
        _main.bench((bh, s, s, d), "2·BH·(Sq·D + Tr·Sk·2D) + 4·BH·Sq·D, Tr = Sq / 64",
                    2 * bh * (s * d + (s // 64) * s * 2 * d) + 4 * bh * s * d,
                    [("a2 flash, mma.sync (this file)", lambda: launch(q, k, v, o, lse)),
                     ("fast attention, float16", lambda: attention(q, k, v, num_splits=1))],
                    flops=4 * bh * s * s * d)
