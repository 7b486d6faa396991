"""a1 — FlashAttention forward on CUDA cores: O = softmax(scale·QKᵀ) V, never forming S.

A block takes Br query rows and a group of G threads a row; K and V stream through
shared memory in tiles of Bc keys (Tc = ⌈Sk / Bc⌉ tiles).  Lane g of a row's group takes
keys g, g + G, … of each tile and keeps its own state (m, ℓ, O) — O = Σ exp(s − m)·v,
unnormalised — updated tile by tile (FlashAttention-2's loop, the paper's names):

    S = scale · q K_jᵀ (masked: −inf)        m̃ = rowmax(S)
    m_new = max(m, m̃)                       α = exp(m − m_new)
    P = exp(S − m_new)                       ℓ ← α·ℓ + rowsum(P),  O ← α·O + P V_j

then the group's G states merge by ``combine`` (O re-based by the same two weights), in
a butterfly of shuffles, and O / ℓ and LSE = m + log ℓ are written.  Bytes (HBM): Q and
O once, K and V once a query tile — 4·BH·(Sq·D + Tr·Sk·(D + Dv) + Sq·Dv), Tr = ⌈Sq / Br⌉.
FLOPs: 2·BH·Sq·Sk·(D + Dv).  A row that sees no key (causal, Sq > Sk) gets O = 0,
LSE = −inf: ``weight`` gives exp(−inf − (−inf)) the value 0, never NaN.
NumPy twin: ``numba_softmax.reference.flash_attention``.  Fast kernel:
``numba_softmax.kernels.attention.attention`` (``attention(q, k, v)``, float32).
Run: ``python -m numba_softmax.textbook.a1_flash``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import combine_device, larger_device, lse_device, weight_device

BR, G, BC = 16, 4, 32  # query rows a block, threads a row, keys a tile
KEYS = BC // G  # keys of a tile a thread takes
D_MAX = 128  # the largest head dimension (D and Dv)
ROW = D_MAX + 1  # a K/V row in shared memory, padded: a group's G lanes read G rows at once,
# and rows D_MAX + 1 floats apart start in different banks (D_MAX apart: all in one)


@cuda.jit
def flash_forward(q, k, v, o, lse, scale, causal):
    bh, t = cuda.blockIdx.y, cuda.threadIdx.x
    row, g = cuda.blockIdx.x * BR + t // G, t % G  # my query row, my lane in its group
    sq, sk, d, dv = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    width = max(d, dv)
    K_j = cuda.shared.array((BC, ROW), np.float32)
    V_j = cuda.shared.array((BC, ROW), np.float32)
    q_i = cuda.local.array(D_MAX, np.float32)
    O = cuda.local.array(D_MAX, np.float32)
    S = cuda.local.array(KEYS, np.float32)
    for c in range(d):
        q_i[c] = q[bh, row, c] * scale if row < sq else 0.0
    for c in range(dv):
        O[c] = 0.0
    m, l = np.float32(-math.inf), np.float32(0.0)  # the identity: no key seen yet
    last = min(cuda.blockIdx.x * BR + BR, sq) - 1 + sk - sq  # the block's last visible key
    for j0 in range(0, sk, BC):
        if causal and j0 > last:
            break  # this tile and all later ones lie above the diagonal for every row
        for e in range(t, BC * width, BR * G):  # load K_j, V_j (zeros past Sk)
            kk, c = e // width, e % width
            ok = j0 + kk < sk
            if c < d:
                K_j[kk, c] = k[bh, j0 + kk, c] if ok else 0.0
            if c < dv:
                V_j[kk, c] = v[bh, j0 + kk, c] if ok else 0.0
        cuda.syncthreads()  # K_j, V_j are complete before anyone reads them
        m_tile = np.float32(-math.inf)
        for i in range(KEYS):  # S = scale·q K_jᵀ on my keys; m̃ = rowmax(S)
            key = j0 + g + i * G
            s = np.float32(0.0)
            for c in range(d):
                s += q_i[c] * K_j[g + i * G, c]
            if key >= sk or (causal and key > row + sk - sq):
                s = np.float32(-math.inf)
            S[i] = s
            m_tile = larger_device(m_tile, s)
        m_new = larger_device(m, m_tile)  # m_new = max(m, m̃)
        alpha = weight_device(m, m_new)  # α = exp(m − m_new): re-base ℓ and O
        l *= alpha
        for c in range(dv):
            O[c] *= alpha
        for i in range(KEYS):  # P = exp(S − m_new); ℓ += rowsum(P); O += P V_j
            p = weight_device(S[i], m_new)
            l += p
            for c in range(dv):
                O[c] += p * V_j[g + i * G, c]
        m = m_new
        cuda.syncthreads()  # all are done with K_j, V_j before the next tile overwrites them
    lane = 1
    while lane < G:  # the group's G states merge: (m, ℓ) by combine, O by its weights
        m_b, l_b = cuda.shfl_xor_sync(0xFFFFFFFF, m, lane), cuda.shfl_xor_sync(0xFFFFFFFF, l, lane)
        m_ab, l = combine_device(m, l, m_b, l_b)
        w_a, w_b = weight_device(m, m_ab), weight_device(m_b, m_ab)
        for c in range(dv):
            O[c] = w_a * O[c] + w_b * cuda.shfl_xor_sync(0xFFFFFFFF, O[c], lane)
        m, lane = m_ab, lane * 2
    if row < sq:  # lane g writes columns g, g + G, …: O / ℓ (0 where no key was seen)
        inv = np.float32(0.0) if l == 0 else np.float32(1.0) / l
        for c in range(g, dv, G):
            o[bh, row, c] = O[c] * inv
        if g == 0:
            lse[bh, row] = lse_device(m, l)


def launch(q, k, v, o=None, lse=None, causal=False, scale=None):
    """(O, LSE) of float32 device arrays q (BH, Sq, D), k (BH, Sk, D), v (BH, Sk, Dv)."""
    (bh, sq, d), dv = q.shape, v.shape[2]
    if max(d, dv) > D_MAX or k.shape != (bh, k.shape[1], d) or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"need q (BH, Sq, D), k (BH, Sk, D), v (BH, Sk, Dv), D, Dv <= {D_MAX}; "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    o = cuda.device_array((bh, sq, dv), np.float32) if o is None else o
    lse = cuda.device_array((bh, sq), np.float32) if lse is None else lse
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    flash_forward[((sq + BR - 1) // BR, bh), BR * G](q, k, v, o, lse, np.float32(scale), causal)
    return o, lse


if __name__ == "__main__":
    from numba_softmax import attention, reference
    from numba_softmax.textbook import _main

    print("a1 flash forward (CUDA cores): validate (O, LSE) against the float64 reference")
    cases = [(1, 1, 1, 1, False), (2, 20, 40, 8, False), (1, 20, 12, 8, True)] if _main.SIM else \
        [(1, 1, 1, 1, False), (4, 200, 333, 64, False), (4, 333, 200, 128, True), (2, 1, 1000, 80, True)]
    for bh, sq, sk, d, causal in cases:
        q, k, v = _main.randn(bh, sq, d), _main.randn(bh, sk, d), _main.randn(bh, sk, d)
        o, lse = (a.copy_to_host() for a in launch(*map(cuda.to_device, (q, k, v)), causal=causal))
        o_ref, lse_ref = reference.attention(q, k, v, causal=causal, return_lse=True)
        label = f"{bh}×{sq}×{sk}×{d}{' causal' if causal else ''}"
        _main.check(label + " O", o, o_ref)
        _main.check(label + " LSE", lse, lse_ref)
    if _main.timing():
        bh, s, d = 32, 2048, 64
        q, k, v = (cuda.to_device(_main.randn(bh, s, d)) for _ in range(3))
        o, lse = launch(q, k, v)
        tr = (s + BR - 1) // BR
        _main.bench((bh, s, s, d), "4·BH·(Sq·D + Tr·Sk·2D + Sq·D)", 4 * bh * (2 * s * d + tr * s * 2 * d),
                    [("a1 flash, CUDA cores (this file)", lambda: launch(q, k, v, o, lse)),
                     ("fast attention, float32", lambda: attention(q, k, v, num_splits=1))],
                    flops=4 * bh * s * s * d)
