"""d1 — split-KV decoding (flash-decoding): the keys cut into S ranges, partials merged.

Decoding asks for a few query rows against a long cache of Sk keys: a block a query row
would leave the GPU idle.  Cut the keys into S ranges, a block each:

    kernel 1  block (s, i, bh): query row i against keys [lo_s, hi_s)
              thread t folds keys lo_s + t, lo_s + t + T, … one at a time:
                  s = scale·q·k_j,  m' = max(m, s),  α = exp(m − m'),  p = exp(s − m')
                  ℓ ← α·ℓ + p,  O ← α·O + p·v_j
              block tree: T states (m, ℓ, O) → 1 by combine, O by the same weights;
              write the normalised partial O_s = O / ℓ and LSE_s = m + log ℓ
    kernel 2  block (i, bh): merge the S partials — (O_s, LSE_s) is the state
              (m, ℓ, O) = (LSE_s, 1, O_s) — by combine; write O / ℓ and LSE

Bytes: read K and V once, 4·BH·Sk·(D + Dv) for Sq = 1, plus partials 4·BH·Sq·S·(Dv + 1)
written and read.  FLOPs: 2·BH·Sq·Sk·(D + Dv).  A range with no visible key has
LSE_s = −inf and weighs exactly 0 in the merge; a row with none gets O = 0, LSE = −inf.
Caveat: a thread reads its key's whole row, so a warp's 32 reads hit 32 rows at once (not
coalesced); a1's tiles in shared memory are the remedy.
NumPy twin: ``numba_softmax.reference.split_kv_attention``.  Fast kernel:
``numba_softmax.kernels.decode.decode`` (``attention(q, k, v, num_splits=S)``).
Run: ``python -m numba_softmax.textbook.d1_split_kv``.
"""

import math

import numpy as np
from numba import cuda

from numba_softmax.combine import combine_device, larger_device, lse_device, weight_device

THREADS = 64  # threads a block: a power of 2, at most the tree's size
D_MAX = 128  # the largest head dimension (D and Dv)


@cuda.jit
def partials(q, k, v, o_s, lse_s, scale, causal):
    s_, i, bh = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z  # key range s, query row i
    t, T = cuda.threadIdx.x, cuda.blockDim.x
    sq, sk, d, dv, S = q.shape[1], k.shape[1], q.shape[2], v.shape[2], cuda.gridDim.x
    m_tree = cuda.shared.array(THREADS, np.float32)
    l_tree = cuda.shared.array(THREADS, np.float32)
    O_tree = cuda.shared.array((THREADS, D_MAX), np.float32)
    O = cuda.local.array(D_MAX, np.float32)
    for c in range(dv):
        O[c] = 0.0
    m, l = np.float32(-math.inf), np.float32(0.0)  # the identity: no key seen yet
    lo, hi = s_ * sk // S, (s_ + 1) * sk // S  # keys [lo, hi) are range s
    if causal:
        hi = min(hi, i + sk - sq + 1)  # query i sees keys up to i + Sk − Sq
    for j in range(lo + t, hi, T):  # fold key j: the online step, with O
        s = np.float32(0.0)
        for c in range(d):
            s += q[bh, i, c] * k[bh, j, c]
        s *= scale
        m_new = larger_device(m, s)
        alpha, p = weight_device(m, m_new), weight_device(s, m_new)
        l = alpha * l + p
        for c in range(dv):
            O[c] = alpha * O[c] + p * v[bh, j, c]
        m = m_new
    m_tree[t], l_tree[t] = m, l
    for c in range(dv):
        O_tree[t, c] = O[c]
    cuda.syncthreads()  # every thread's state is posted before the tree reads it
    half = T // 2
    while half > 0:  # block tree: slot t ← combine(slot t, slot t + half)
        if t < half:
            m_ab, l_ab = combine_device(m_tree[t], l_tree[t], m_tree[t + half], l_tree[t + half])
            w_a, w_b = weight_device(m_tree[t], m_ab), weight_device(m_tree[t + half], m_ab)
            for c in range(dv):
                O_tree[t, c] = w_a * O_tree[t, c] + w_b * O_tree[t + half, c]
            m_tree[t], l_tree[t] = m_ab, l_ab
        cuda.syncthreads()  # this level is complete before the next one reads it
        half //= 2
    m, l = m_tree[0], l_tree[0]
    inv = np.float32(0.0) if l == 0 else np.float32(1.0) / l
    for c in range(t, dv, T):  # the range's normalised partial: O_s = O / ℓ
        o_s[bh, i, s_, c] = O_tree[0, c] * inv
    if t == 0:
        lse_s[bh, i, s_] = lse_device(m, l)


@cuda.jit
def merge(o_s, lse_s, o, lse):
    i, bh, t, T = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
    S, dv = o_s.shape[2], o_s.shape[3]
    for c in range(t, dv, T):  # each thread its columns of O
        m, l, acc = np.float32(-math.inf), np.float32(0.0), np.float32(0.0)
        for s_ in range(S):  # (m, ℓ, O) ← combine((m, ℓ, O), (LSE_s, 1, O_s))
            m_ab, l = combine_device(m, l, lse_s[bh, i, s_], np.float32(1.0))
            acc = weight_device(m, m_ab) * acc + weight_device(lse_s[bh, i, s_], m_ab) * o_s[bh, i, s_, c]
            m = m_ab
        o[bh, i, c] = np.float32(0.0) if l == 0 else acc / l
        if c == 0:
            lse[bh, i] = lse_device(m, l)


def launch(q, k, v, o=None, lse=None, splits=4, causal=False, scale=None, threads=THREADS):
    """(O, LSE) of float32 device arrays q (BH, Sq, D), k (BH, Sk, D), v (BH, Sk, Dv),
    the keys cut into ``splits`` ranges."""
    (bh, sq, d), dv = q.shape, v.shape[2]
    if max(d, dv) > D_MAX or k.shape != (bh, k.shape[1], d) or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"need q (BH, Sq, D), k (BH, Sk, D), v (BH, Sk, Dv), D, Dv <= {D_MAX}; "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    if splits < 1:
        raise ValueError(f"splits must be at least 1, got {splits}")
    if threads < 1 or threads > THREADS or threads & (threads - 1):
        raise ValueError(f"threads must be a power of 2 up to {THREADS}, got {threads}")
    o = cuda.device_array((bh, sq, dv), np.float32) if o is None else o
    lse = cuda.device_array((bh, sq), np.float32) if lse is None else lse
    o_s = cuda.device_array((bh, sq, splits, dv), np.float32)
    lse_s = cuda.device_array((bh, sq, splits), np.float32)
    scale = np.float32(1.0 / math.sqrt(d) if scale is None else scale)
    partials[(splits, sq, bh), threads](q, k, v, o_s, lse_s, scale, causal)
    merge[(sq, bh), 32](o_s, lse_s, o, lse)
    return o, lse


if __name__ == "__main__":
    from numba_softmax import attention, reference
    from numba_softmax.textbook import _main

    print("d1 split-KV decoding: validate (O, LSE) against the float64 reference, any split count")
    cases = [(1, 1, 1, 1, False), (2, 1, 70, 8, False), (1, 3, 40, 8, True)] if _main.SIM else \
        [(1, 1, 1, 1, False), (32, 1, 4099, 128, False), (8, 4, 1000, 64, True)]
    for bh, sq, sk, d, causal in cases:
        q, k, v = _main.randn(bh, sq, d), _main.randn(bh, sk, d), _main.randn(bh, sk, d)
        o_ref, lse_ref = reference.attention(q, k, v, causal=causal, return_lse=True)
        for splits in (1, 5) if _main.SIM else (1, 7, 64):
            o, lse = launch(*map(cuda.to_device, (q, k, v)), splits=splits, causal=causal)
            label = f"{bh}×{sq}×{sk}×{d}{' causal' if causal else ''}, {splits} splits"
            _main.check(label + " O", o.copy_to_host(), o_ref)
            _main.check(label + " LSE", lse.copy_to_host(), lse_ref)
    if _main.timing():
        bh, sk, d, splits = 32, 1 << 15, 128, 16  # one query row a head against a long cache
        q, k, v = (cuda.to_device(_main.randn(bh, s, d)) for s in (1, sk, sk))
        o, lse = launch(q, k, v, splits=splits)
        _main.bench((bh, 1, sk, d), "read K and V once: 4·BH·Sk·2D", 4 * bh * sk * 2 * d, [
            ("d1 split-KV (this file), 16 splits", lambda: launch(q, k, v, o, lse, splits=splits)),
            ("fast decode, 16 splits", lambda: attention(q, k, v, num_splits=splits))],
            flops=4 * bh * sk * d)
