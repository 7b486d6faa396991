"""hb2 — hb1 fed the way h2 is: TMA loads into a ring of stages, asked for by a producer warp.

hb1 (:mod:`.hopper_backward`) has the block's threads copy every tile between two
barriers, so the tensor cores wait for the copies, as the forward's h1 did before h2 fed
it by the copy engine (docs/algorithms/hopper.md).  Here each kernel is h2's shape
(:mod:`..attention.hopper_ws`): one consumer warpgroup and one producer warp::

    dkdv   a block: 64 keys of one (batch, K/V head)
           producer  K_j, V_j once; then for each (query head of the group, query tile i
                     that sees a key): wait until the stage is empty, Q_i, dO_i and the
                     rows' LSE·log2 e and D into it (rows padded to whole tiles first)
           consumer  wait until K_j, V_j have landed; per tile: wait until its stage is
                     full, Sᵀ = K_j Q_iᵀ, dPᵀ = V_j dO_iᵀ, Pᵀ and dSᵀ, dV += Pᵀ dO_i,
                     dK += dSᵀ Q_i, arrive on the stage's empty barrier; with
                     ``fused`` (D 64) also dSᵀ into a shared tile, dS_i's rows back
                     from it transposed (``ldmatrix.trans``), dQ_i = dS_i K_j, added
                     to dQ's float32 accumulator (``red.global.add``)
    dq     (not with ``fused``; :mod:`.hopper_backward_dq`) 64 query rows a block; Q_i,
           dO_i once; per key tile j the rows see, K_j and V_j through the ring; S, dP,
           dS, then dQ += dS K_j

    the ring's barriers and shared memory: :mod:`.hopper_backward_ring`

The products, the packing of Pᵀ and dSᵀ into A fragments and the masks are hb1's
(:mod:`.hopper_backward_parts`).  Tensor maps (4-D, over (B, H, S, D) with the arrays'
own strides, 128-byte swizzled, rows past a sequence's end arriving as zeros) take do,
q, k, v strided or not.  Unlike hb1, products that need not wait for each other start
together and are waited for once: Sᵀ with dPᵀ, then dV with dK (Pᵀ and dSᵀ in two sets of
A fragments) — two waits a tile where hb1 has four.

Why dQ may join the dK/dV kernel (``fused``): a separate dQ kernel computes S and dP again,
seven products a tile pair where one kernel needs five (FlashAttention-3's shape).  A lane
holds dSᵀ by key rows, and dQ_i = dS_i K_j needs dS by query rows, so dSᵀ goes through
shared memory: each thread stores its part, arrives on the ``ds`` barrier, and once all 128
have, each warp reads its 16 query rows back transposed.  Two tiles alternate, so a tile is
written while the one before may still be read.  Several key blocks add to one row of dQ, so
the adds are atomic.  Only at D 64: at D 128 the dK/dV kernel already takes 240 registers,
and dQ's 64 more would spill.  Two kernels are the default: each row of dQ written once, and
the form whose speed the docs have measured (docs/algorithms/hopper.md).
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from ...runtime import launcher
from ...runtime.launcher import scratch
from ...runtime.sim import simulator_enabled
from ..hw import jit, mma, tma, tma_maps, wgmma
from ..hw.jit import LOG2E
from . import attention_backward_io as io
from .hopper_backward_dq import dq_kernel
from .hopper_backward_parts import (BM, BN, adder, checked, padded_rows, products, visible, whole,
                                    writer)
from .hopper_backward_ring import (DS, EMPTY_0, FULL_0, N_BARS, ONCE, STAGES, THREADS, WG, acquire,
                                   barriers, pair_loader, shared)

DS_LD = BN + 8  # the dSᵀ tile's row stride (uint16): 144 bytes, so that the 8 rows one
# ldmatrix phase reads, and the 8 rows one warp's store writes, fall in different banks


@functools.cache
def dkdv_kernel(kind, out_dtype, d, dv, fused=False):
    """dK, dV of 64 keys a block; grid (⌈Sk/64⌉, B·Hkv) of 160 threads.  ``fused`` (D 64):
    dQ too, added to the float32 accumulator."""
    qk, vdo, acc_v, acc_k, pack = products(kind, d, dv, started=True)
    wait_all = wgmma.wgmma_wait(0)
    write_k, write_v, add_q = writer(out_dtype, d), writer(out_dtype, dv), adder(d)
    load_pair = pair_loader(d, dv)
    NS, KP, ND, NV = BN // 2, BN // 16, d // 2, dv // 2
    NQ, DSB = (ND, 2 * BN * DS_LD) if fused else (1, 2)  # dQ_i's accumulator, two dSᵀ tiles
    A_E, B_E = 64 * d, 64 * dv  # a tile of D columns, of Dv columns (uint16 values)
    STAGE = A_E + B_E
    TERMS, align = STAGES * 2 * BN, wgmma.TILE_ALIGN  # (closure values: constants to Numba)

    @jit.kernel
    def dkdv(tq, tk, tv, tdo, tl, td, dk, dv_out, dq_acc, n_h, sq, scale, left, right):
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
        dsb = cuda.shared.array(DSB, uint16, alignment=align)  # dSᵀ: keys × queries, twice
        k_at = ((1024 - (wgmma.address(smem, 0) & 1023)) & 1023) >> 1
        v_at = k_at + A_E
        ring = v_at + B_E
        barriers(bar, tid)

        if warp == WG // 32:  # the producer: lane 0 issues every load
            if lane == 0 and n_tiles > 0:
                acquire(tq, tk, tv, tdo)
                tma.tensormap_acquire(tl)
                tma.tensormap_acquire(td)
                tma.arrive_expect_tx(bar, ONCE, 2 * STAGE)
                load_pair(smem, k_at, tk, tv, j0, hk, b, bar, ONCE)  # K_j, then V_j at v_at
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
                    load_pair(smem, at, tq, tdo, i0, h, b, bar, FULL_0 + st)  # Q_i, dO_i
                last = n_tiles - 1  # stay until the last tile is read: its loads are ours
                tma.wait(bar, EMPTY_0 + last % STAGES, (last // STAGES) & 1)
            return

        s = cuda.local.array(NS, float32)  # Sᵀ, then Pᵀ: s[4j + 2rr + e] is key row rr,
        dp = cuda.local.array(NS, float32)  # query 8j + 2t + e; dPᵀ, then dSᵀ
        acc_dk = cuda.local.array(ND, float32)
        acc_dv = cuda.local.array(NV, float32)
        pf = cuda.local.array((KP, 4), uint32)  # Pᵀ as A fragments
        pfs = cuda.local.array((KP, 4), uint32)  # dSᵀ
        dsf = cuda.local.array((KP, 4), uint32)  # dS_i's rows of the warp's queries (fused)
        acc_dq = cuda.local.array(NQ, float32)  # dQ_i of this key block (fused)
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
            buf = (it & 1) * BN * DS_LD  # tile it's dSᵀ buffer (fused)
            if fused:  # dSᵀ → shared: row key, column query (before wgmma reads pfs)
                for kk in range(KP):
                    for r in range(4):
                        key = 16 * warp + g + 8 * (r & 1)
                        col = 16 * kk + 8 * (r >> 1) + 2 * t
                        mma.st_shared_b32(dsb, buf + key * DS_LD + col, pfs[kk, r])
                tma.arrive(bar, DS)  # this thread's part of tile it is in
            acc_v(acc_dv, pf, smem, at + A_E)  # dV += Pᵀ dO_i, started
            acc_k(acc_dk, pfs, smem, at)  # dK += dSᵀ Q_i, started beside it
            if fused:
                tma.wait(bar, DS, it & 1)  # every thread's part is in: the tile is whole
                for kk in range(KP):  # lane L names row L % 8 of 8×8 block L // 8: keys
                    blk = lane >> 3  # 16kk + 8(blk >> 1) …, queries 16·warp + 8(blk & 1) …
                    key = 16 * kk + 8 * (blk >> 1) + (lane & 7)
                    x = mma.ldmatrix_x4_trans(dsb, buf + key * DS_LD + 16 * warp + 8 * (blk & 1))
                    for r in range(4):
                        dsf[kk, r] = x[r]
                for x in range(NQ):
                    acc_dq[x] = 0.0
                acc_k(acc_dq, dsf, smem, k_at)  # dQ_i = dS_i K_j, started beside them
            wait_all()  # all are done: pf, pfs, dsf and the stage may be reused
            tma.arrive(bar, EMPTY_0 + st)  # this thread's products have read the stage
            if fused:  # other key blocks add to the same rows
                add_q(dq_acc, b, h, i0 + 16 * warp + g, sq, acc_dq, float32(scale), t)

        write_k(dk, b, hk, j0 + 16 * warp + g, sk, acc_dk, float32(scale), t)
        write_v(dv_out, b, hk, j0 + 16 * warp + g, sk, acc_dv, float32(1.0), t)

    return dkdv


def launch(do, q, k, v, o, lse, dq, dk, dv, *, causal=False, window=(-1, -1), scale=None,
           stream=0, fused=False):
    """As :func:`.hopper_backward.launch`, for do, q, k, v as a tensor map takes them
    (:func:`.tma_maps.takes`: a model's transposed views do).  ``fused`` (D 64 only): dQ
    added by the dK/dV kernel, no dQ kernel (above)."""
    kind, d, dvh = checked(do, q, k, v, scale)
    if fused and d != 64:
        raise ValueError(f"fused: the one-kernel form takes D 64 only, got D {d}")
    tma_maps.mappable(do=do, q=q, k=k, v=v)
    size = shared(d, dvh)

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
        one = fused and _addable(dq_acc)
        launcher.launch(dkdv_kernel(kind, dk.dtype, d, dvh, one), (-(-sk // BM), n_b * n_kv),
                        THREADS, stream, (*maps, dk, dv, dq_acc, n_h, sq, scale, left, right),
                        shared=size)
        if sq and not one:
            launcher.launch(dq_kernel(kind, d, dvh), (-(-sq // BM), n_b * n_h), THREADS, stream,
                            (*maps[:4], lse, delta, dq_acc, n_kv, sk, scale, left, right),
                            shared=size)
        tma_maps.launched(slots, stream)

    io.launch(main, do, q, k, v, o, dq, causal=causal, window=window, scale=scale,
              stream=stream, max_head_dim=128)


def _addable(acc):
    """Whether two-column atomic adds reach ``acc``: float32 with 8-byte-aligned pairs (the
    io module's scratch accumulator is; a float64 or oddly strided dQ goes to the dQ kernel)."""
    return (acc.dtype == np.float32 and acc.strides[-1] == 4
            and all(x % 8 == 0 for x in acc.strides[:-1])
            and (simulator_enabled() or acc.__cuda_array_interface__["data"][0] % 8 == 0))
