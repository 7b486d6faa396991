"""b2 — FlashAttention-2 backward on CUDA cores: (dQ, dK, dV) from O, LSE and dO.

P is never stored: it is rebuilt tile by tile from the forward's LSE, P = exp(S − LSE).
The softmax backward (b1) row by row needs D_i = Σ_j P_ij·dP_ij, which is rowsum(dO ∘ O)
— one number a query row, computed before the main loop:

    preprocess  D_i = rowsum(dO_i ∘ O_i); dQ ← 0                 read 2·BH·Sq·Dv·4 bytes
    main        a block a tile of Bc keys, a thread a key j (k_j, v_j, dK_j, dV_j in
                registers); for each query tile i of Br rows (Tr tiles), in shared memory:
                    S_ij = scale·q_i·k_j,  P_ij = exp(S_ij − LSE_i)   (masked: 0)
                    dV_j += P_ij·dO_i,     dP_ij = dO_i·v_j
                    dS_ij = P_ij·(dP_ij − D_i),  dK_j += scale·dS_ij·q_i
                    dQ_i += scale·dS_i: K_j    (added atomically: every key block adds)

Bytes: Q, dO, LSE, D read once a key block (Tc = ⌈Sk / Bc⌉ times), K and V read and dK,
dV written once, dQ added Tc times.  FLOPs: 2·BH·Sq·Sk·(3·D + 2·Dv) — five products.
A row that saw no key (LSE = −inf, all its scores masked) has P = 0: no NaN, no gradient.
NumPy twin: ``numba_softmax.reference.attention_backward``.  Fast kernel:
``numba_softmax.kernels.backward.attention_backward`` (``attention_backward``, float32).
Run: ``python -m numba_softmax.textbook.b2_flash_backward``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import weight_device

BR, BC = 16, 32  # query rows a tile, keys a block (a thread each)
D_MAX = 128  # the largest head dimension (D and Dv)


@cuda.jit
def preprocess(do, o, D, dq):
    i, bh = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, cuda.blockIdx.y
    if i < o.shape[1]:
        acc = np.float32(0.0)
        for c in range(o.shape[2]):  # D_i = rowsum(dO_i ∘ O_i)
            acc += do[bh, i, c] * o[bh, i, c]
        D[bh, i] = acc
        for c in range(dq.shape[2]):  # dQ starts at 0: the main kernel only adds
            dq[bh, i, c] = 0.0


@cuda.jit
def flash_backward(q, k, v, do, lse, D, dq, dk, dv, scale, causal):
    bh, t, j0 = cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockIdx.x * BC
    j, sq, sk, d, e_v = j0 + t, q.shape[1], k.shape[1], q.shape[2], v.shape[2]  # j: my key
    Q_i = cuda.shared.array((BR, D_MAX), np.float32)
    dO_i = cuda.shared.array((BR, D_MAX), np.float32)
    K_j = cuda.shared.array((BC, D_MAX), np.float32)
    dS = cuda.shared.array((BR, BC), np.float32)
    L_i = cuda.shared.array(BR, np.float32)
    D_i = cuda.shared.array(BR, np.float32)
    v_j = cuda.local.array(D_MAX, np.float32)
    dK = cuda.local.array(D_MAX, np.float32)
    dV = cuda.local.array(D_MAX, np.float32)
    for c in range(d):  # my key's row of K (shared: dQ needs every key's); dK_j ← 0
        K_j[t, c] = k[bh, j, c] if j < sk else 0.0
        dK[c] = 0.0
    for c in range(e_v):  # my key's row of V; dV_j ← 0
        v_j[c] = v[bh, j, c] if j < sk else 0.0
        dV[c] = 0.0
    for i0 in range(0, sq, BR):
        if causal and i0 + BR - 1 + sk - sq < j0:
            continue  # every row of this tile lies before the block's first key
        for e in range(t, BR * D_MAX, BC):  # load Q_i, dO_i (zeros past Sq)
            r, c = e // D_MAX, e % D_MAX
            ok = i0 + r < sq
            if c < d:
                Q_i[r, c] = q[bh, i0 + r, c] if ok else 0.0
            if c < e_v:
                dO_i[r, c] = do[bh, i0 + r, c] if ok else 0.0
        if t < BR:
            L_i[t] = lse[bh, i0 + t] if i0 + t < sq else 0.0
            D_i[t] = D[bh, i0 + t] if i0 + t < sq else 0.0
        cuda.syncthreads()  # the tile (and, the first time, K_j) is complete before use
        for r in range(BR):
            row = i0 + r
            s = np.float32(0.0)
            for c in range(d):  # S_ij = scale·q_i·k_j
                s += Q_i[r, c] * K_j[t, c]
            s *= scale
            if j >= sk or row >= sq or (causal and j > row + sk - sq):
                s = np.float32(-math.inf)
            p = weight_device(s, L_i[r])  # P_ij = exp(S_ij − LSE_i): 0 where masked
            dp = np.float32(0.0)
            for c in range(e_v):  # dV_j += P_ij·dO_i;  dP_ij = dO_i·v_j
                dV[c] += p * dO_i[r, c]
                dp += dO_i[r, c] * v_j[c]
            ds = p * (dp - D_i[r])  # dS_ij = P_ij·(dP_ij − D_i)
            for c in range(d):  # dK_j += scale·dS_ij·q_i
                dK[c] += scale * ds * Q_i[r, c]
            dS[r, t] = ds
        cuda.syncthreads()  # the dS tile is complete before dQ reads it
        for e in range(t, BR * d, BC):  # dQ_i += scale·dS K_j, atomically
            r, c = e // d, e % d
            if i0 + r < sq:
                acc = np.float32(0.0)
                for kk in range(BC):
                    acc += dS[r, kk] * K_j[kk, c]
                cuda.atomic.add(dq, (bh, i0 + r, c), scale * acc)
        cuda.syncthreads()  # all are done with Q_i, dO_i, dS before the next tile lands
    if j < sk:
        for c in range(d):
            dk[bh, j, c] = dK[c]
        for c in range(e_v):
            dv[bh, j, c] = dV[c]


def launch(do, q, k, v, o, lse, causal=False, scale=None, grads=None):
    """(dQ, dK, dV) of float32 device arrays: q, o, do (BH, Sq, D|Dv), k, v (BH, Sk, D|Dv)
    and the forward's lse (BH, Sq).  ``grads``: (dq, dk, dv) to write into."""
    (bh, sq, d), (sk, e_v) = q.shape, v.shape[1:]
    if max(d, e_v) > D_MAX or k.shape != (bh, sk, d) or o.shape != (bh, sq, e_v) \
            or do.shape != o.shape:
        raise ValueError(f"need q (BH, Sq, D), k (BH, Sk, D), v (BH, Sk, Dv), o and do (BH, Sq, Dv), "
                         f"D, Dv <= {D_MAX}; got {q.shape}, {k.shape}, {v.shape}, {o.shape}, {do.shape}")
    dq, dk, dv = grads or (cuda.device_array_like(q), cuda.device_array_like(k), cuda.device_array_like(v))
    D = cuda.device_array((bh, sq), np.float32)
    scale = np.float32(1.0 / math.sqrt(d) if scale is None else scale)
    preprocess[((sq + 127) // 128, bh), 128](do, o, D, dq)
    flash_backward[((sk + BC - 1) // BC, bh), BC](q, k, v, do, lse, D, dq, dk, dv, scale, causal)
    return dq, dk, dv


if __name__ == "__main__":
    from numba_softmax import attention, attention_backward, reference
    from numba_softmax.textbook import _main

    print("b2 flash backward: validate (dQ, dK, dV) against the float64 reference")
    cases = [(1, 1, 1, 1, False), (2, 20, 40, 8, False), (1, 20, 12, 8, True)] if _main.SIM else \
        [(1, 1, 1, 1, False), (4, 200, 333, 64, False), (4, 333, 200, 128, True)]
    for bh, sq, sk, d, causal in cases:
        q, k, v, do = (_main.randn(bh, s, d) for s in (sq, sk, sk, sq))
        o, lse = (a.astype(np.float32) for a in reference.attention(q, k, v, causal=causal, return_lse=True))
        got = launch(*map(cuda.to_device, (do, q, k, v, o, lse)), causal=causal)
        want = reference.attention_backward(do, q, k, v, o, lse, causal=causal)
        for name, g, w in zip(("dQ", "dK", "dV"), got, want):
            _main.check(f"{bh}×{sq}×{sk}×{d}{' causal' if causal else ''} {name}", g.copy_to_host(), w)
    if _main.timing():
        bh, s, d = 16, 2048, 64
        q, k, v, do = (cuda.to_device(_main.randn(bh, s, d)) for _ in range(4))
        o, lse = attention(q, k, v, return_lse=True)
        grads = launch(do, q, k, v, o, lse)
        _main.bench((bh, s, s, d), "read Q, K, V, O, dO, write dQ, dK, dV: 4·BH·S·8D",
                    4 * bh * s * 8 * d,
                    [("b2 flash backward (this file)", lambda: launch(do, q, k, v, o, lse, grads=grads)),
                     ("fast attention_backward", lambda: attention_backward(do, q, k, v, o, lse))],
                    flops=2 * bh * s * s * 5 * d)
