"""hb2's dQ kernel (not run with ``fused``, where the dK/dV kernel adds dQ itself:
:mod:`.hopper_backward_ws`): 64 query rows a block, Q_i and dO_i loaded once, then each
key tile j the rows see, K_j and V_j, through the ring (:mod:`.hopper_backward_ring`)::

    producer  Q_i, dO_i once; per key tile: wait until the stage is empty, K_j, V_j into it
    consumer  per key tile: S = Q_i K_jᵀ, dP = dO_i V_jᵀ (started together, one wait),
              dS = P ∘ (dP − D_i), dQ += dS K_j; then scale·dQ into the float32 accumulator

It computes S and dP again (the dK/dV kernel computed Sᵀ and dPᵀ): two products a tile
more than one kernel needs, the price of writing each row of dQ once, with no atomics.
"""

import functools

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from ..hw import jit, tma, wgmma
from ..hw.jit import LOG2E
from .hopper_backward_ring import (EMPTY_0, FULL_0, N_BARS, ONCE, STAGES, WG, acquire, barriers,
                                   pair_loader)
from .hopper_backward_parts import BM, BN, ds_rows, products, row_terms, whole, writer


@functools.cache
def dq_kernel(kind, d, dv):
    """dQ of 64 query rows a block, into the float32 accumulator; grid (⌈Sq/64⌉, B·Hq)."""
    qk, vdo, _, acc_k, pack = products(kind, d, dv, started=True)
    wait_all = wgmma.wgmma_wait(0)
    write_q = writer(np.float32, d)
    load_pair = pair_loader(d, dv)
    NS, KP, ND = BN // 2, BN // 16, d // 2
    A_E, B_E = 64 * d, 64 * dv
    STAGE = A_E + B_E

    @jit.kernel
    def dq(tq, tk, tv, tdo, lse, delta, dq_acc, n_kv, sk, scale, left, right):
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3
        n_h, sq = dq_acc.shape[1], dq_acc.shape[2]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        hk = h // (n_h // n_kv)
        i0, shift = cuda.blockIdx.x * BM, sk - sq
        lo = 0 if left < 0 else max(0, i0 + shift - left)  # the keys some row sees
        hi = sk if right < 0 else min(sk, i0 + BM + shift + right)
        t0 = lo // BN
        n_tiles = (hi - t0 * BN + BN - 1) // BN if hi > t0 * BN else 0
        c2 = float32(scale * LOG2E)

        smem = cuda.shared.array(0, uint16)  # Q_i, dO_i, then STAGES × (K_j, V_j)
        bar = cuda.shared.array(N_BARS, uint64)
        q_at = ((1024 - (wgmma.address(smem, 0) & 1023)) & 1023) >> 1
        do_at = q_at + A_E
        ring = do_at + B_E
        barriers(bar, tid)

        if warp == WG // 32:  # the producer
            if lane == 0 and n_tiles > 0:
                acquire(tq, tk, tv, tdo)
                tma.arrive_expect_tx(bar, ONCE, 2 * STAGE)
                load_pair(smem, q_at, tq, tdo, i0, h, b, bar, ONCE)  # Q_i, then dO_i at do_at
                for it in range(n_tiles):
                    st = it % STAGES
                    if it >= STAGES:
                        tma.wait(bar, EMPTY_0 + st, ((it // STAGES) - 1) & 1)
                    at = ring + st * STAGE
                    tma.arrive_expect_tx(bar, FULL_0 + st, 2 * STAGE)
                    load_pair(smem, at, tk, tv, (t0 + it) * BN, hk, b, bar, FULL_0 + st)
                last = n_tiles - 1
                tma.wait(bar, EMPTY_0 + last % STAGES, (last // STAGES) & 1)
            return

        s = cuda.local.array(NS, float32)  # S, then P: s[4j + 2rr + e] is row rr, key 8j + 2t + e
        dp = cuda.local.array(NS, float32)  # dP, then dS
        acc = cuda.local.array(ND, float32)  # dQ
        pf = cuda.local.array((KP, 4), uint32)
        l2 = cuda.local.array(2, float32)  # the lane's rows' LSE·log2 e (+inf: no part)
        dl = cuda.local.array(2, float32)  # and D
        for x in range(ND):
            acc[x] = 0.0
        row_terms(lse, delta, b, h, i0 + 16 * warp + g, sq, l2, dl)
        if n_tiles > 0:
            tma.wait(bar, ONCE, 0)  # Q_i and dO_i have landed
        for it in range(n_tiles):
            st = it % STAGES
            j0 = (t0 + it) * BN
            at = ring + st * STAGE
            tma.wait(bar, FULL_0 + st, (it // STAGES) & 1)  # K_j and V_j have landed
            qk(s, smem, q_at, smem, at)  # S = Q_i K_jᵀ, started
            vdo(dp, smem, do_at, smem, at + A_E)  # dP = dO_i V_jᵀ, started beside it
            wait_all()  # both are done
            inside = j0 + BN <= sk and whole(i0, j0, shift, left, right)
            ds_rows(s, dp, l2, dl, c2, i0 + 16 * warp + g, j0, t, sk, shift, left, right, inside)
            pack(dp, pf)
            acc_k(acc, pf, smem, at)  # dQ += dS K_j, started
            wait_all()  # done: pf and the stage may be reused
            tma.arrive(bar, EMPTY_0 + st)

        write_q(dq_acc, b, h, i0 + 16 * warp + g, sq, acc, float32(scale), t)

    return dq
