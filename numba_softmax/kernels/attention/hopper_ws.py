"""h2 … h7 — h1 fed the way Hopper moves data: TMA, a ring of mbarriers, a producer.

h1 (:mod:`.hopper`) copies every tile with the block's own threads between two barriers,
so the tensor cores wait for the copies and the copies for the tensor cores.  Here one
warp does nothing but ask the copy engine (:mod:`..hw.tma`) for tiles, into two stages
of shared memory, while the warpgroup computes on the other — FlashAttention-3's warp
specialization, with one consumer warpgroup::

    warps 0–3  consumers (one warpgroup, 64 query rows): wait until stage j mod 2 is
               full, fold K_j, V_j into (m, ℓ, O) as h1 does (:mod:`.hopper_fold`), then
               arrive on the stage's "empty" barrier: done reading it
    warp 4     producer, lane 0: Q once; then for each tile j, wait until its stage is
               empty (the consumers released tile j − 2), expect its bytes on the stage's
               "full" barrier and start the TMA loads of K_j and V_j into it

    barriers   full[s]: 1 arrival (the producer's expect) + the tile's bytes landing
               empty[s]: 128 arrivals (every consumer thread)      q: Q's bytes
    phases     the n-th use of stage s completes phase n mod 2: a waiter passes parity
               (j div 2) mod 2 for tile j

TMA lands a tile as it lies in memory, 128-byte swizzled: Q and K_j are the K-major
operands of S = Q K_jᵀ, and V_j is read N-major by O += P V_j (``trans_b``).  The loads
use 4-D tensor maps over (B, H, S, D) with the arrays' own strides, so a model's
transposed views load as they lie; a box is one (batch, head) plane's rows, and rows
past a sequence's end arrive as zeros.

h3 is the same source in another configuration (:data:`CONFIGS`): two consumer
warpgroups of 64 rows each share every K/V tile (128 query rows a block, half the copies
a row), tiles of 128 keys (``wgmma m64n128k16``), and a whole producer warpgroup that
gives its registers to the consumers with ``setmaxnreg`` (40 kept, 232 taken; the kernel
is built for their mean, 168, so the pool balances).  What FlashAttention-3 adds beyond
it: inside one warpgroup, the softmax of tile j under the product of tile j − 1 — h4
(and h5, on three stages): start S_j, start O += P_{j−1} V_{j−1}, wait for S_j alone,
weigh it while the second product runs, then wait, rescale O and pack P_j; and between
the two consumers, turns (its "ping-pong") — h6, h5 with each consumer issuing its
products only on its turn and handing the turn over once they are issued, so one's
softmax runs while the other's products have the tensor cores::

    consumer w, every tile:  wait turn[w] │ start S_j, start P_{j−1} V_{j−1} │
                             arrive on turn[1 − w] │ wait for S_j; softmax; …

    turn[w]    128 arrivals (the other consumer's threads); consumer 1 arrives on
               turn[0] once at the start, so consumer 0 goes first; the k-th wait of
               consumer w passes parity k mod 2

FlashAttention-3 takes turns on named barriers (``bar.sync`` / ``bar.arrive``); here they
are two more mbarriers, the primitive this package already has (with its simulator twin).

h7 is h5 with a taller block, FlashAttention-3's tile at D 64: three consumer warpgroups
(192 query rows) on each 128-key tile.  At D 64 a consumer's products take half the time
they take at D 128 while its softmax does not, so the turns of h6 hide nothing there;
a third consumer puts more products in flight on every K/V tile instead.  The register
file holds it only with D 64 tiles: 32 registers kept by the producer and 160 taken by
each consumer (32·128 + 3·160·128 = 65,536).

Needs: q, k, v as a tensor map takes them (:func:`.tma_maps.takes`), D and Dv 64 or 128,
fp16 or bf16.  Sources: Shah et al.,
FlashAttention-3 (2024), sections 3.1 (warp specialization, the producer/consumer ring).
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from ...runtime import launcher
from ..hw import jit, tma, tma_maps, wgmma
from ..hw.jit import LOG2E
from . import hopper_fold
from .hopper import HEAD_DIMS, checked

CONFIGS = {  # name: (consumer warpgroups, keys a tile, registers: producer, consumers,
    #                   the softmax under the products, stages, the consumers' turns)
    "h2": (1, 64, None, False, 2, False),
    "h3": (2, 128, (40, 232), False, 2, False),
    "h4": (2, 128, (40, 232), True, 2, False),
    "h5": (2, 128, (40, 232), True, 3, False),
    "h6": (2, 128, (40, 232), True, 3, True),
    "h7": (3, 128, (32, 160), True, 3, False),
}
ONLY = {"h7": (64,)}  # the head dims a configuration takes, where not both of HEAD_DIMS
WG = 128  # threads of a warpgroup, and query rows of a consumer: 64 (two rows a thread)


def takes(config, d, dv):
    """Whether configuration ``config`` runs head dims D = ``d``, Dv = ``dv``: h7's three
    consumers fit the register file only with D 64 tiles."""
    dims = ONLY.get(config, HEAD_DIMS)
    return d in dims and dv in dims


def taking(d, dv):
    """The configurations that run head dims D = ``d``, Dv = ``dv`` (:func:`takes`)."""
    return [c for c in CONFIGS if takes(c, d, dv)]


def shape(config):
    """(BM query rows a block, BN keys a tile, threads a block) of a configuration."""
    consumers, bn, regs = CONFIGS[config][:3]
    return 64 * consumers, bn, WG * consumers + (WG if regs else 32)


@functools.cache
def kernel(kind, out_dtype, d, dv, config="h2"):
    """The warp-specialized forward for fp16 (``kind`` "f16") or bf16 ("bf16") tiles,
    output ``out_dtype``, in configuration ``config`` (:data:`CONFIGS`).  Returns (kernel,
    bytes of dynamic shared memory)."""
    consumers, bn, regs, OVERLAP, STAGES, TURNS = CONFIGS[config]
    BM, BN, THREADS = shape(config)
    scores, accumulate = hopper_fold.products(kind, d, dv, BN, 64, True)
    update, done = hopper_fold.online(kind, dv, BN), hopper_fold.finish(out_dtype, dv)
    start_scores, start_accumulate = hopper_fold.issued(kind, d, dv, BN, 64, True)
    weigh, rescale, pack = hopper_fold.steps(kind, dv, BN)
    wait_one, wait_all = wgmma.wgmma_wait(1), wgmma.wgmma_wait(0)
    NS, NO, KP = BN // 2, dv // 2, BN // 16

    @jit.device
    def softmax(s, m, l, alpha, j0, row, hi, causal, sk, shift, sc, c2, t, negative):
        if negative:  # scale·QKᵀ = sc·(−QKᵀ)
            for j in range(NS):
                s[j] = -s[j]
        weigh(s, m, l, alpha, j0, row, hi, causal, sk, shift, sc, c2, t)

    Q_CHUNK, KV_CHUNK = 64 * 64, BN * 64  # uint16 values in one 64-wide swizzled box
    Q_ELEMS, K_ELEMS, V_ELEMS = BM * d, BN * d, BN * dv
    STAGE = K_ELEMS + V_ELEMS
    TILE_BYTES = 2 * STAGE
    FULL_0, EMPTY_0, Q_BAR = 0, STAGES, 2 * STAGES  # the barriers' slots
    TURN_0 = 2 * STAGES + 1  # h6: turn[w], 128 arrivals: the other consumer has issued
    N_BARS = 2 * STAGES + 1 + (2 if TURNS else 0)
    PRODUCER = WG * consumers // 32  # the producer's first warp
    if regs:  # every thread starts with the mean of the budgets (168 for h3, 128 for h7):
        # what the producer gives back is exactly what the consumers take from the pool
        start = (regs[0] + consumers * regs[1]) // (consumers + 1)
        options = dict(launch_bounds=(THREADS, 1), max_registers=start)
        shrink, grow = wgmma.setmaxnreg_dec(regs[0]), wgmma.setmaxnreg_inc(regs[1])
    else:
        options, shrink, grow = {}, None, None

    @jit.kernel(**options)
    def forward(tq, tk, tv, o, lse, n_kv, sk, scale, causal):
        """tq, tk, tv: tensor maps of q, k, v as (B, H, S, D); o (B, Hq, Sq, Dv), lse
        (B, Hq, Sq); grid B·Hq·⌈Sq/BM⌉ blocks of THREADS threads."""
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        g, t = lane >> 2, lane & 3
        n_h, sq = o.shape[1], o.shape[2]
        n_tq = (sq + BM - 1) // BM
        bh, tile = cuda.blockIdx.x // n_tq, cuda.blockIdx.x % n_tq
        if causal:  # a head's last query tiles see the most keys: they start first, so that
            tile = n_tq - 1 - tile  # the short ones fill in behind them at the grid's end
        b, h = bh // n_h, bh % n_h
        hk = h // (n_h // n_kv)  # GQA: the K/V head this query head reads
        i0, shift = tile * BM, sk - sq
        hi = min(sk, i0 + BM + shift) if causal else sk  # keys the block's rows can see
        n_tiles = (hi + BN - 1) // BN if hi > 0 else 0

        smem = cuda.shared.array(0, uint16)  # Q, then STAGES × (K_j, V_j)
        bar = cuda.shared.array(N_BARS, uint64)
        # the swizzle reads absolute addresses: every tile starts on a 1024-byte boundary
        q_at = ((1024 - (wgmma.address(smem, 0) & 1023)) & 1023) >> 1
        if tid == 0:
            for st in range(STAGES):
                tma.mbarrier_init(bar, FULL_0 + st, 1)
                tma.mbarrier_init(bar, EMPTY_0 + st, WG * consumers)
            tma.mbarrier_init(bar, Q_BAR, 1)
            if TURNS:
                tma.mbarrier_init(bar, TURN_0, WG)
                tma.mbarrier_init(bar, TURN_0 + 1, WG)
        cuda.syncthreads()  # the barriers exist before anyone arrives on or waits for them

        if warp >= PRODUCER:  # the producer: one lane issues every load
            if regs:
                shrink()  # a warpgroup that only issues copies gives its registers away
            if warp == PRODUCER and lane == 0 and n_tiles > 0:
                tma.tensormap_acquire(tq)  # the maps were written by the host, through
                tma.tensormap_acquire(tk)  # another proxy than the copy engine's
                tma.tensormap_acquire(tv)
                tma.arrive_expect_tx(bar, Q_BAR, Q_ELEMS * 2)
                for w in range(consumers):  # each consumer's 64 rows, 64 columns a box
                    for c in range(d // 64):
                        tma.tma_load_4d(smem, q_at + w * 64 * d + c * Q_CHUNK, tq, 64 * c,
                                        i0 + 64 * w, h, b, bar, Q_BAR)
                for it in range(n_tiles):
                    st = it % STAGES
                    if it >= STAGES:  # the consumers are done with tile it − STAGES
                        tma.wait(bar, EMPTY_0 + st, ((it // STAGES) - 1) & 1)
                    at = q_at + Q_ELEMS + st * STAGE
                    tma.arrive_expect_tx(bar, FULL_0 + st, TILE_BYTES)
                    for c in range(d // 64):
                        tma.tma_load_4d(smem, at + c * KV_CHUNK, tk, 64 * c, it * BN, hk, b,
                                        bar, FULL_0 + st)
                    for c in range(dv // 64):
                        tma.tma_load_4d(smem, at + K_ELEMS + c * KV_CHUNK, tv, 64 * c,
                                        it * BN, hk, b, bar, FULL_0 + st)
                last = n_tiles - 1  # stay until the last tile is read: its loads are ours
                tma.wait(bar, EMPTY_0 + last % STAGES, (last // STAGES) & 1)
            return

        # a consumer warpgroup: 64 query rows, wg·64 … into the block's
        if regs:
            grow()  # the registers the producer gave up: S, O and P stay in registers
        wg, wwarp = warp >> 2, warp & 3
        my_q = q_at + wg * 64 * d
        sc = float32(abs(scale))
        c2 = sc * float32(LOG2E)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        s = cuda.local.array(NS, float32)
        acc = cuda.local.array(NO, float32)
        pf = cuda.local.array((KP, 4), uint32)
        for rr in range(2):
            m[rr], l[rr] = -math.inf, 0.0
        for j in range(NO):
            acc[j] = 0.0
        row = i0 + 64 * wg + 16 * wwarp + g
        if n_tiles > 0:
            tma.wait(bar, Q_BAR, 0)  # Q has landed
        if OVERLAP:  # the softmax of tile j under the tensor cores' P_{j−1} V_{j−1}
            alpha = cuda.local.array(2, float32)  # each row's α
            turn = 0  # h6: this consumer's turns so far
            if TURNS and wg == 1 and n_tiles > 0:
                tma.arrive(bar, TURN_0)  # consumer 0 issues first
            if n_tiles > 0:  # tile 0: S_0 alone
                tma.wait(bar, FULL_0, 0)
                if TURNS:  # my turn: the other consumer's products are issued
                    tma.wait(bar, TURN_0 + wg, turn & 1)
                start_scores(s, smem, my_q, smem, q_at + Q_ELEMS)
                if TURNS:  # the other's turn: its products queue behind mine
                    tma.arrive(bar, TURN_0 + 1 - wg)
                    turn += 1
                wait_all()
                softmax(s, m, l, alpha, 0, row, hi, causal, sk, shift, sc, c2, t, scale < 0)
                rescale(acc, alpha)
                pack(s, pf)
            for it in range(1, n_tiles):
                st, before = it % STAGES, (it - 1) % STAGES
                at = q_at + Q_ELEMS + st * STAGE
                tma.wait(bar, FULL_0 + st, (it // STAGES) & 1)  # K_j and V_j have landed
                if TURNS:
                    tma.wait(bar, TURN_0 + wg, turn & 1)
                start_scores(s, smem, my_q, smem, at)  # S_j = Q K_jᵀ, started
                start_accumulate(acc, pf, smem, q_at + Q_ELEMS + before * STAGE + K_ELEMS)
                if TURNS:  # while this softmax runs, the other's products have the cores
                    tma.arrive(bar, TURN_0 + 1 - wg)
                    turn += 1
                wait_one()  # S_j is done (groups complete in order); P_{j−1} V_{j−1} runs on
                softmax(s, m, l, alpha, it * BN, row, hi, causal, sk, shift, sc, c2, t, scale < 0)
                wait_all()  # P_{j−1} V_{j−1} is done: O may be rescaled, pf rewritten
                tma.arrive(bar, EMPTY_0 + before)  # the stage of tile j − 1 is read
                rescale(acc, alpha)
                pack(s, pf)
            last = (n_tiles - 1) % STAGES
            if n_tiles > 0:  # the last tile's O += P V
                if TURNS:
                    tma.wait(bar, TURN_0 + wg, turn & 1)
                start_accumulate(acc, pf, smem, q_at + Q_ELEMS + last * STAGE + K_ELEMS)
                if TURNS:
                    tma.arrive(bar, TURN_0 + 1 - wg)
            # waits on every path, none inside a branch: where ptxas cannot prove a product
            # finished before its registers are read, it serializes every wgmma of the kernel
            wait_all()
            if n_tiles > 0:
                tma.arrive(bar, EMPTY_0 + last)
            done(o, lse, b, h, row, sq, m, l, acc, sc, t)
            return
        for it in range(n_tiles):
            st = it % STAGES
            at = q_at + Q_ELEMS + st * STAGE
            tma.wait(bar, FULL_0 + st, (it // STAGES) & 1)  # K_j and V_j have landed
            scores(s, smem, my_q, smem, at)  # S = Q K_jᵀ
            if scale < 0:  # scale·QKᵀ = sc·(−QKᵀ)
                for j in range(NS):
                    s[j] = -s[j]
            update(s, m, l, acc, pf, it * BN, row, hi, causal, sk, shift, sc, c2, t)
            accumulate(acc, pf, smem, at + K_ELEMS)  # O += P V_j
            tma.arrive(bar, EMPTY_0 + st)  # this thread's wgmmas have read the stage
        done(o, lse, b, h, row, sq, m, l, acc, sc, t)

    return forward, 2 * (Q_ELEMS + STAGES * STAGE) + 1024


def launch(q, k, v, o, lse, *, causal=False, scale=None, stream=0, config="h2"):
    """Run on 4-D device arrays q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv),
    rows of contiguous values and other strides multiples of 16 bytes (what a tensor map
    takes: a model's transposed views do), from 16-byte aligned addresses, all float16
    or all uint16 (bfloat16 bits), Hq a multiple of Hkv,
    D and Dv 64 or 128; ``o`` (B, Hq, Sq, Dv: q's dtype or float32) and ``lse``
    (B, Hq, Sq, float32) receive the result.  ``config``: "h2" … "h7"
    (:data:`CONFIGS`; h7 D and Dv 64 only).  Needs sm_90 (or the simulator)."""
    n_b, n_h, sq, d, n_kv, sk, dv, scale = checked(q, k, v, o, lse, scale)
    tma_maps.mappable(q=q, k=k, v=v)
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
    if not takes(config, d, dv):
        raise ValueError(f"config {config!r} takes D and Dv {ONLY[config]}, got {d} and {dv}")
    bm, bn, threads = shape(config)
    blocks = n_b * n_h * -(-sq // bm)
    if blocks == 0:
        return
    kind = "f16" if q.dtype == np.float16 else "bf16"
    fwd, shared = kernel(kind, o.dtype, d, dv, config)
    maps, slots = tma_maps.maps(((q, 64), (k, bn), (v, bn)), stream)
    launcher.launch(fwd, (blocks,), threads, stream,
                    (*maps, o, lse, n_kv, sk, scale, bool(causal)), shared=shared)
    tma_maps.launched(slots, stream)
