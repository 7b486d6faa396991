"""hb2 — hb1 fed the way h2 is: TMA loads into a ring of stages, asked for by a producer warp.

hb1 (:mod:`.hopper_backward`) has the block's threads copy every tile between two
barriers, so the tensor cores wait for the copies — the forward's h1 ran at 65–97 TFLOP/s
for that reason and h2, fed by the copy engine, at 307–455.  Here each kernel is h2's
shape (:mod:`..attention.hopper_ws`): one consumer warpgroup and one producer warp::

    dkdv   a block: 64 keys of one (batch, K/V head)
           producer  K_j, V_j once; then for each (query head of the group, query tile i
                     that sees a key): wait until the stage is empty, Q_i, dO_i and the
                     rows' LSE·log2 e and D into it (rows padded to whole tiles first)
           consumer  wait until K_j, V_j have landed; per tile: wait until its stage is
                     full, Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ, Pᵀ and dSᵀ, dV += Pᵀ dO_i,
                     dK += dSᵀ Q_i, arrive on the stage's empty barrier
    dq     a block: 64 query rows; Q_i, dO_i once; per key tile j the rows see, K_j and
           V_j through the ring; S, dP, dS, then dQ += dS K_j

    barriers   full[s]: the producer's expect + the tile's bytes; empty[s]: 128 arrivals;
               once: the stationary tiles' bytes.  The n-th use of stage s completes
               phase n mod 2, as in h2.

The products, the packing of Pᵀ and dSᵀ into A fragments and the masks are hb1's
(:mod:`.hopper_backward_parts`).  Tensor maps (4-D, over (B, H, S, D) with the arrays'
own strides, 128-byte swizzled, rows past a sequence's end arriving as zeros) take do,
q, k, v strided or not.  Unlike hb1, products that need not wait for each other start
together and are waited for once: Sᵀ with dPᵀ, then dV with dK (Pᵀ and dSᵀ in two sets of
A fragments) — two waits a tile where hb1 has four.
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from ...runtime import launcher
from ..hw import jit, tma, tma_maps, wgmma
from ..hw.jit import LOG2E
from . import attention_backward_io as io
from ...runtime.launcher import scratch
from .hopper_backward_parts import (BM, BN, checked, ds_rows, padded_rows, products, row_terms,
                                    visible, whole, writer)

STAGES = 2
WG = 128  # the consumer warpgroup; the producer is the warp after it
THREADS = WG + 32
CHUNK = 64 * 64  # uint16 values in one 64-wide swizzled box of 64 rows
FULL_0, EMPTY_0, ONCE, N_BARS = 0, STAGES, 2 * STAGES, 2 * STAGES + 1  # the barriers' slots


@jit.device
def _barriers(bar, tid):
    """Thread 0 sets up the ring's barriers and the stationary pair's; then every thread
    passes a block barrier, so none arrives on or waits for one before it exists."""
    if tid == 0:
        for st in range(STAGES):
            tma.mbarrier_init(bar, FULL_0 + st, 1)
            tma.mbarrier_init(bar, EMPTY_0 + st, WG)
        tma.mbarrier_init(bar, ONCE, 1)
    cuda.syncthreads()


@jit.device
def _acquire(tq, tk, tv, tdo):
    """The four maps, written by the host through another proxy, made visible to TMA."""
    tma.tensormap_acquire(tq)
    tma.tensormap_acquire(tk)
    tma.tensormap_acquire(tv)
    tma.tensormap_acquire(tdo)


def _shared(d, dv):
    """Bytes of dynamic shared memory: the stationary pair and STAGES moving pairs."""
    return 2 * 64 * (d + dv) * (1 + STAGES) + 1024


@functools.cache
def dkdv_kernel(kind, out_dtype, d, dv):
    """dK, dV of 64 keys a block; grid (⌈Sk/64⌉, B·Hkv) of 160 threads."""
    qk, vdo, acc_v, acc_k, pack = products(kind, d, dv, started=True)
    wait_all = wgmma.wgmma_wait(0)
    write_k, write_v = writer(out_dtype, d), writer(out_dtype, dv)
    NS, KP, ND, NV = BN // 2, BN // 16, d // 2, dv // 2
    A_E, B_E = 64 * d, 64 * dv  # a tile of D columns, of Dv columns (uint16 values)
    STAGE = A_E + B_E
    TERMS, align = STAGES * 2 * BN, wgmma.TILE_ALIGN  # (closure values: constants to Numba)

    @jit.kernel
    def dkdv(tq, tk, tv, tdo, tl, td, dk, dv_out, n_h, sq, scale, left, right):
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3
        n_kv, sk = dk.shape[1], dk.shape[2]
        group = n_h // n_kv
        b, hk = cuda.blockIdx.y // n_kv, cuda.blockIdx.y % n_kv
        j0, shift = cuda.blockIdx.x * BM, sk - sq
        lo = 0 if right < 0 else max(0, j0 - shift - right)  # the query rows that see
        hi = sq if left < 0 else min(sq, j0 + BM - shift + left)  # a key of the block
        t0 = lo // BN
        n_qt = (hi - t0 * BN + BN - 1) // BN if hi > t0 * BN else 0
        n_tiles = group * n_qt  # (query head, query tile) pairs, head by head
        c2 = float32(scale * LOG2E)

        smem = cuda.shared.array(0, uint16)  # K_j, V_j, then STAGES × (Q_i, dO_i)
        # a stage's rows' LSE·log2 e, then their D: TMA writes them, 128-byte aligned
        terms = cuda.shared.array(TERMS, float32, alignment=align)
        bar = cuda.shared.array(N_BARS, uint64)
        k_at = ((1024 - (wgmma.address(smem, 0) & 1023)) & 1023) >> 1
        v_at = k_at + A_E
        ring = v_at + B_E
        _barriers(bar, tid)

        if warp == WG // 32:  # the producer: lane 0 issues every load
            if lane == 0 and n_tiles > 0:
                _acquire(tq, tk, tv, tdo)
                tma.tensormap_acquire(tl)
                tma.tensormap_acquire(td)
                tma.arrive_expect_tx(bar, ONCE, 2 * STAGE)
                for c in range(d // 64):
                    tma.tma_load_4d(smem, k_at + c * CHUNK, tk, 64 * c, j0, hk, b, bar, ONCE)
                for c in range(dv // 64):
                    tma.tma_load_4d(smem, v_at + c * CHUNK, tv, 64 * c, j0, hk, b, bar, ONCE)
                for it in range(n_tiles):
                    st = it % STAGES
                    if it >= STAGES:  # the consumer is done with tile it − STAGES
                        tma.wait(bar, EMPTY_0 + st, ((it // STAGES) - 1) & 1)
                    h = hk * group + it // n_qt  # the query head of this tile
                    i0 = (t0 + it % n_qt) * BN
                    at = ring + st * STAGE
                    tma.arrive_expect_tx(bar, FULL_0 + st, 2 * STAGE + 8 * BN)
                    # the tile's rows' terms, beside Q_i and dO_i: no global load waits
                    # inside the consumer's elementwise step
                    tma.tma_load_3d(terms, st * 2 * BN, tl, i0, h, b, bar, FULL_0 + st)
                    tma.tma_load_3d(terms, st * 2 * BN + BN, td, i0, h, b, bar, FULL_0 + st)
                    for c in range(d // 64):
                        tma.tma_load_4d(smem, at + c * CHUNK, tq, 64 * c, i0, h, b, bar,
                                        FULL_0 + st)
                    for c in range(dv // 64):
                        tma.tma_load_4d(smem, at + A_E + c * CHUNK, tdo, 64 * c, i0, h, b, bar,
                                        FULL_0 + st)
                last = n_tiles - 1  # stay until the last tile is read: its loads are ours
                tma.wait(bar, EMPTY_0 + last % STAGES, (last // STAGES) & 1)
            return

        s = cuda.local.array(NS, float32)  # Sᵀ, then Pᵀ: s[4j + 2rr + e] is key row rr,
        dp = cuda.local.array(NS, float32)  # query 8j + 2t + e; dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(ND, float32)
        acc_dv = cuda.local.array(NV, float32)
        pf = cuda.local.array((KP, 4), uint32)  # Pᵀ as A fragments
        pfs = cuda.local.array((KP, 4), uint32)  # dSᵀ
        for x in range(ND):
            acc_dk[x] = 0.0
        for x in range(NV):
            acc_dv[x] = 0.0
        if n_tiles > 0:
            tma.wait(bar, ONCE, 0)  # K_j and V_j have landed
        for it in range(n_tiles):
            st = it % STAGES
            h = hk * group + it // n_qt
            i0 = (t0 + it % n_qt) * BN
            at = ring + st * STAGE
            tma.wait(bar, FULL_0 + st, (it // STAGES) & 1)  # Q_i and dO_i have landed
            qk(s, smem, k_at, smem, at)  # Sᵀ = K_j Q_iᵀ, started
            vdo(dp, smem, v_at, smem, at + A_E)  # dPᵀ = V_j dO_iᵀ, started beside it
            wait_all()  # both are done: one wait for the two
            inside = i0 + BN <= sq and whole(i0, j0, shift, left, right)
            for j in range(BN // 8):
                for e in range(2):
                    col = 8 * j + 2 * t + e
                    r = i0 + col  # this column's query row: its terms, landed with Q_i
                    l2 = terms[st * 2 * BN + col]  # LSE·log2 e (+inf: no part)
                    dl = terms[st * 2 * BN + BN + col]  # D
                    for rr in range(2):
                        key = j0 + 16 * warp + g + 8 * rr
                        y = 4 * j + 2 * rr + e
                        p = math.exp2(s[y] * c2 - l2)  # Pᵀ
                        if not inside and not visible(r, key, shift, left, right):
                            p = float32(0.0)
                        s[y] = p
                        dp[y] = p * (dp[y] - dl)  # dSᵀ = Pᵀ ∘ (dPᵀ − D_i)
            pack(s, pf)
            pack(dp, pfs)
            acc_v(acc_dv, pf, smem, at + A_E)  # dV += Pᵀ dO_i, started
            acc_k(acc_dk, pfs, smem, at)  # dK += dSᵀ Q_i, started beside it
            wait_all()  # both are done: pf, pfs and the stage may be reused
            tma.arrive(bar, EMPTY_0 + st)  # this thread's products have read the stage

        write_k(dk, b, hk, j0 + 16 * warp + g, sk, acc_dk, float32(scale), t)
        write_v(dv_out, b, hk, j0 + 16 * warp + g, sk, acc_dv, float32(1.0), t)

    return dkdv


@functools.cache
def dq_kernel(kind, d, dv):
    """dQ of 64 query rows a block, into the float32 accumulator; grid (⌈Sq/64⌉, B·Hq)."""
    qk, vdo, _, acc_k, pack = products(kind, d, dv, started=True)
    wait_all = wgmma.wgmma_wait(0)
    write_q = writer(np.float32, d)
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
        _barriers(bar, tid)

        if warp == WG // 32:  # the producer
            if lane == 0 and n_tiles > 0:
                _acquire(tq, tk, tv, tdo)
                tma.arrive_expect_tx(bar, ONCE, 2 * STAGE)
                for c in range(d // 64):
                    tma.tma_load_4d(smem, q_at + c * CHUNK, tq, 64 * c, i0, h, b, bar, ONCE)
                for c in range(dv // 64):
                    tma.tma_load_4d(smem, do_at + c * CHUNK, tdo, 64 * c, i0, h, b, bar, ONCE)
                for it in range(n_tiles):
                    st = it % STAGES
                    if it >= STAGES:
                        tma.wait(bar, EMPTY_0 + st, ((it // STAGES) - 1) & 1)
                    at = ring + st * STAGE
                    tma.arrive_expect_tx(bar, FULL_0 + st, 2 * STAGE)
                    for c in range(d // 64):
                        tma.tma_load_4d(smem, at + c * CHUNK, tk, 64 * c, (t0 + it) * BN, hk, b,
                                        bar, FULL_0 + st)
                    for c in range(dv // 64):
                        tma.tma_load_4d(smem, at + A_E + c * CHUNK, tv, 64 * c, (t0 + it) * BN,
                                        hk, b, bar, FULL_0 + st)
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


def launch(do, q, k, v, o, lse, dq, dk, dv, *, causal=False, window=(-1, -1), scale=None,
           stream=0):
    """As :func:`.hopper_backward.launch`, for do, q, k, v as a tensor map takes them
    (:func:`.tma_maps.takes`: a model's transposed views do)."""
    kind, d, dvh = checked(do, q, k, v, scale)
    tma_maps.mappable(do=do, q=q, k=k, v=v)
    shared = _shared(d, dvh)

    def main(delta, dq_acc, scale, left, right):
        n_b, n_h, sq = q.shape[:3]
        n_kv, sk = k.shape[1:3]
        sp = -(-max(sq, 1) // BN) * BN  # whole tiles of per-row terms, for their maps
        l2, dl = (scratch((n_b, n_h, sp), "float32", stream, tag) for tag in ("l2", "dl"))
        if sq:
            launcher.launch(padded_rows(), (-(-sp // 128), n_b * n_h), 128, stream,
                            (lse, delta, l2, dl))
        maps, slots = tma_maps.maps([(a, 64) for a in (q, k, v, do)] + [(l2, BN), (dl, BN)],
                                    stream)
        launcher.launch(dkdv_kernel(kind, dk.dtype, d, dvh), (-(-sk // BM), n_b * n_kv), THREADS,
                        stream, (*maps, dk, dv, n_h, sq, scale, left, right), shared=shared)
        if sq:
            launcher.launch(dq_kernel(kind, d, dvh), (-(-sq // BM), n_b * n_h), THREADS, stream,
                            (*maps[:4], lse, delta, dq_acc, n_kv, sk, scale, left, right),
                            shared=shared)
        tma_maps.launched(slots, stream)

    io.launch(main, do, q, k, v, o, dq, causal=causal, window=window, scale=scale,
              stream=stream, max_head_dim=128)
