"""b2 — FlashAttention-2 backward: dQ, dK, dV from the saved LSE, never the Sq×Sk matrix.

The forward kept one number per query row, LSE = m + log ℓ — its final (m, ℓ) state
folded into one value — and that is all the backward needs to rebuild any tile of
P = softmax(scale·QKᵀ) exactly: P = exp(scale·QKᵀ − LSE).  (The derivation of
dS = P ∘ (dP − D) and why D = rowsum(dO ∘ O) replaces the row sums of P ∘ dP:
``docs/algorithms/backward.md``.)  In the order of Dao's FlashAttention-2, Algorithm 2::

    preprocess   D_i = rowsum(dO_i ∘ O_i)  for every query row; dQ accumulator = 0
    one block per (batch·kv-head, key tile j):   K_j, V_j staged once; dK_j = dV_j = 0
        for every query head h of the group (GQA), every query tile i that sees K_j:
            S   = scale · Q_i K_jᵀ            (masked: −inf)
            P   = exp(S − LSE_i)              (0 where masked, and in rows that saw no key)
            dV_j += Pᵀ dO_i
            dP  = dO_i V_jᵀ
            dS  = P ∘ (dP − D_i)
            dK_j += scale · dSᵀ Q_i
            dQ_i += scale · dS K_j            (atomic adds to a float32 accumulator)
        write dK_j, dV_j
    convert      dQ = accumulator (float16/bfloat16 only; float32/64 accumulate in dQ itself)

**dQ by atomic adds**, not a second kernel that recomputes S, P, dP and dS per query tile
(14 instead of 10 units of Br·Bc·D work): on CUDA cores the FMAs are the bottleneck; the
price is that dQ's last bits depend on the order the adds land.  **dK, dV of grouped
heads by a loop** over the group's query heads: summed on chip, written once.

Work per (batch·query head): 10·Sq·Sk·D FLOPs (2.5× the forward's 4·Sq·Sk·D), about half
with ``causal`` (hidden tiles are never visited).  K, V are read once, Q, dO once per key
tile (mostly from L2).  fp32 FMAs on CUDA cores, float16 and bfloat16 loaded into float32
(the public API sends those to the tensor-core version, :mod:`.attention_backward_tc`).

Thread layout (W warps; lane = 8·rg + cg, rg < 4 row groups, cg < 8 column groups)::

    S, dP, dQ  rows  4·RPL·warp + rg + 4·i          (i < RPL)   Br = 4·RPL·W
    S, dP      keys  cg + 8·jj                      (jj < Bc/8)
    dK, dV     keys  4·KPL·warp + KPL·rg + a        (a < KPL)   Bc = 4·KPL·W
    dK, dV, dQ cols  VV·cg + 8·VV·(c // VV) + c % VV (c < ⌈D/8⌉; VV = 4, 2 or 1)

Every tile lives once in (dynamic) shared memory, row-major, and every operand of the
five products is read 16 bytes at a time (:mod:`.attention_backward_products`): Q, dO, K,
V along d with strides ⌈D/8⌉·8 + VW (VW values in 16 bytes; the stride/VW odd, so the 8
keys or 4 rows a warp reads at once start in different bank groups), P and dS with stride
Bc + VW, a lane's keys of dK, dV consecutive in a row of P or dS and its columns in
vectors of VV.  LSE and D come from global memory (L1), so that 32 × 32 tiles at D = 128
take 75 KB and three blocks still fit a multiprocessor.  The tiles arrive 16 bytes a load
where the arrays allow it (:func:`.flash_tiles.stager`, the forward's), and on sm_90 a lane adds
its 4 consecutive dQ columns in one ``red.global.add.v4.f32``: fewer instructions a
multiply-add, which is what bounds the kernel (``docs/algorithms/backward.md``, "Vector
reads").  ``softcap``, ``alibi`` (:mod:`..attention.score_mods`, compile-time as in the
forward): S is rebuilt and modified, x = c·tanh(S / c) − slope·abs(i + Sk − Sq − j), P =
exp(x − LSE), and dS gets the factor dx/dS = 1 − tanh²(S / c).  NumPy twin:
:func:`numba_softmax.reference.attention_backward`.
"""

import functools
import math

import numba
from numba import cuda

from ...combine import weight_device
from . import attention_backward_io as io
from . import attention_backward_products as products
from ..hw import jit
from ...runtime import launcher
from ..attention import score_mods, tileio
from ..hw.jit import accumulator
from ..attention.flash_tiles import stager
from .attention_backward_tiles import check_tiles, fit_tiles, layout, strides
from .attention_backward_tiles import pad8 as _pad8
from ..hw.mma import red_add_v4

MAX_HEAD_DIM = 128
GROUP = products.GROUP  # column groups per warp: lanes that share a row


@functools.cache
def kernel(dtype, d, dv, block_q, block_k, warps, vec=1, red4=False, softcap_on=False,
           alibi_on=False):
    """The main backward kernel for one (dtype, D, Dv, Br, Bc, W, values a global load,
    dQ added 4 values an instruction, score modifications): all compile-time."""
    acc, store = accumulator(dtype), jit.storer(dtype)
    MODS = softcap_on or alibi_on
    setup_mods = score_mods.setup(acc, alibi_on, 1.0)  # base-e scores
    modify_grad = score_mods.grad_modifier(acc, softcap_on, alibi_on)
    BR, BC, T = block_q, block_k, 32 * warps
    RPL, KPL, CPL = BR // (4 * warps), BC // (4 * warps), BC // GROUP
    ND, NV = _pad8(d) // GROUP, _pad8(dv) // GROUP
    VW = products.vector_width(dtype)
    VD, VV = products.column_vector(ND, VW), products.column_vector(NV, VW)  # column vectors
    DL, DVL = -(-d // VW) * VW, -(-dv // VW) * VW  # the d loops, in whole vectors
    QS, VS, PS = strides(d, dv, BC, VW)
    (Q0, O0, K0, V0, P0, S0), _ = layout(d, dv, BR, BC, VW)
    stage = lambda rows, n, st: stager(dtype, T, rows, n, st, vec, span=_pad8(n))  # noqa: E731
    stage_q, stage_o = stage(BR, d, QS), stage(BR, dv, VS)
    stage_k, stage_v = stage(BC, d, QS), stage(BC, dv, VS)
    rows_x_keys = products.along(dtype, RPL, CPL)
    keys_x_d, keys_x_dv = products.down(dtype, KPL, ND, VD), products.down(dtype, KPL, NV, VV)
    rows_x_d = products.across(dtype, RPL, ND, VD)
    RED4 = red4 and VD == 4  # a lane's 4 consecutive dQ columns: one red.global.add.v4

    @jit.kernel
    def backward(do, q, k, v, lse, delta, dq_acc, dk, dv_out, scale, left, right):
        """grid (Tc, B·Hkv); q, do (B, Hq, Sq, ·), k, v, dk, dv (B, Hkv, Sk, ·), lse and
        delta (B, Hq, Sq), dq_acc (B, Hq, Sq, D) zeroed; ``left``/``right``: the window
        (−1: unbounded; causal is right = 0).  With a score modification ``scale`` is
        (scale, softcap, slopes)."""
        if MODS:
            scale, cap, slopes = scale
        tid = cuda.threadIdx.x
        warp, lane = (tid >> 5) & 31, tid & 31  # masks: the compiler then knows both are >= 0
        rg, cg = lane >> 3, lane & (GROUP - 1)
        n_kv = k.shape[1]
        group = q.shape[1] // n_kv
        b, hkv = cuda.blockIdx.y // n_kv, cuda.blockIdx.y % n_kv
        sq, sk = q.shape[2], k.shape[2]
        shift = sk - sq  # query i sees key j iff −left <= j − (i + shift) <= right
        j0 = cuda.blockIdx.x * BC
        row0, key0 = warp * 4 * RPL, warp * 4 * KPL + KPL * rg  # the lane's first row, key
        sc, zero, one, inf = acc(scale), acc(0.0), acc(1.0), acc(math.inf)
        sm = cuda.shared.array(0, acc)  # all tiles, flat (see layout())
        i_lo, i_hi = 0, sq  # the query rows that see some key of this tile
        if right >= 0:
            i_lo = max(0, j0 - shift - right)
        if left >= 0:
            i_hi = min(sq, min(j0 + BC, sk) + left - shift)

        s = cuda.local.array((RPL, CPL), acc)  # S, then P (registers)
        dp = cuda.local.array((RPL, CPL), acc)
        dk_acc = cuda.local.array((KPL, ND), acc)  # dK_j, dV_j: on chip for the whole block
        dv_acc = cuda.local.array((KPL, NV), acc)
        dq_t = cuda.local.array((RPL, ND), acc)
        dq_v = cuda.local.array(4, acc)  # (RED4: one vector of dQ_i's columns)
        xa = cuda.local.array(RPL, acc)  # each row's LSE and D
        xc = cuda.local.array(RPL, acc)
        lo = cuda.local.array(RPL, numba.int64)  # each row's visible keys in the tile
        hi = cuda.local.array(RPL, numba.int64)
        for a in range(KPL):
            for c in range(ND):
                dk_acc[a, c] = zero
            for c in range(NV):
                dv_acc[a, c] = zero
        stage_k(sm, K0, k, b, hkv, j0, sk, sc)  # scale·K_j, V_j: once; keys ≥ Sk: 0
        stage_v(sm, V0, v, b, hkv, j0, sk, one)

        for h in range(hkv * group, (hkv + 1) * group):  # the query heads of this K/V head
            if MODS:
                cap_h, slope_h = setup_mods(cap, slopes, b, h)
            for i0 in range(i_lo, i_hi, BR):
                cuda.syncthreads()  # every warp is done with the last Q_i, dO_i, P, dS
                stage_q(sm, Q0, q, b, h, i0, sq, one)
                stage_o(sm, O0, do, b, h, i0, sq, one)
                # each row's LSE and D, from global memory (the 8 lanes of a row read one
                # value); LSE = −inf (a row that saw no key) and rows ≥ Sq: +inf, so P = 0
                for i in range(RPL):
                    row = i0 + row0 + rg + 4 * i
                    xa[i], xc[i] = inf, zero
                    if row < sq:
                        xc[i] = delta[b, h, row]
                        if lse[b, h, row] != -inf:
                            xa[i] = acc(lse[b, h, row])
                cuda.syncthreads()  # Q_i, dO_i (and K_j, V_j) are complete

                # S = Q_i (scale·K_j)ᵀ and dP = dO_i V_jᵀ: products over d
                for i in range(RPL):
                    for jj in range(CPL):
                        s[i, jj] = zero
                        dp[i, jj] = zero
                rows_x_keys(s, sm, DL, Q0 + (row0 + rg) * QS, 4 * QS, K0 + cg * QS, GROUP * QS)
                rows_x_keys(dp, sm, DVL, O0 + (row0 + rg) * VS, 4 * VS, V0 + cg * VS, GROUP * VS)

                # P = exp(S − LSE), 0 outside the row's visible keys [lo, hi] of this tile;
                # dS = P ∘ (dP − D); both to shared memory
                for i in range(RPL):
                    row = i0 + row0 + rg + 4 * i
                    lo[i], hi[i] = 0, min(BC, sk - j0) - 1  # keys ≥ Sk: masked
                    if right >= 0:
                        hi[i] = min(hi[i], row + shift + right - j0)
                    if left >= 0:
                        lo[i] = max(lo[i], row + shift - left - j0)
                for i in range(RPL):
                    for jj in range(CPL):
                        c = cg + GROUP * jj
                        if MODS:  # S → the modified score x, and dx/dS
                            s[i, jj], gr = modify_grad(s[i, jj], cap_h, slope_h,
                                                       i0 + row0 + rg + 4 * i + shift - j0 - c)
                        val = s[i, jj] if lo[i] <= c and c <= hi[i] else -inf
                        s[i, jj] = weight_device(val, xa[i])  # P: exp(S − LSE); −inf weighs 0
                        dp[i, jj] = s[i, jj] * (dp[i, jj] - xc[i])  # dS
                        if MODS:  # dS with respect to S itself
                            dp[i, jj] *= gr
                for i in range(RPL):
                    for jj in range(CPL):
                        sm[P0 + (row0 + rg + 4 * i) * PS + cg + GROUP * jj] = s[i, jj]
                        sm[S0 + (row0 + rg + 4 * i) * PS + cg + GROUP * jj] = dp[i, jj]
                cuda.syncthreads()  # P and dS are complete: every warp reads every row

                # dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i (times scale once, at the end):
                # products over the Br rows
                keys_x_dv(dv_acc, sm, BR, P0 + key0, PS, O0 + VV * cg, VS)
                keys_x_d(dk_acc, sm, BR, S0 + key0, PS, Q0 + VD * cg, QS)

                # dQ_i += dS (scale·K_j): a product over the Bc keys, added atomically
                for i in range(RPL):
                    for c in range(ND):
                        dq_t[i, c] = zero
                rows_x_d(dq_t, sm, BC, S0 + (row0 + rg) * PS, 4 * PS, K0 + VD * cg, QS)
                for i in range(RPL):
                    r = i0 + row0 + rg + 4 * i
                    if RED4:
                        for u in range(ND // 4):
                            if r < sq and 4 * cg + 32 * u < d:
                                for e in range(4):
                                    dq_v[e] = dq_t[i, 4 * u + e]
                                red_add_v4(dq_acc, b, h, r, 4 * cg + 32 * u, dq_v, 0)
                    else:
                        for c in range(ND):
                            col = VD * cg + GROUP * VD * (c // VD) + c % VD
                            if r < sq and col < d:
                                cuda.atomic.add(dq_acc, (b, h, r, col), dq_t[i, c])

        for a in range(KPL):  # dK_j = scale·Σ dSᵀQ and dV_j: written once
            key = j0 + key0 + a
            if key < sk:
                for c in range(ND):
                    col = VD * cg + GROUP * VD * (c // VD) + c % VD
                    if col < d:
                        dk[b, hkv, key, col] = store(dk_acc[a, c] * sc)
                for c in range(NV):
                    col = VV * cg + GROUP * VV * (c // VV) + c % VV
                    if col < dv:
                        dv_out[b, hkv, key, col] = store(dv_acc[a, c])

    return backward, T


def launch(do, q, k, v, o, lse, dq, dk, dv, *, causal=False, window=(-1, -1), scale=None,
           stream=0, small=False, tiles=None, softcap=0.0, alibi=None):
    """dQ, dK, dV into ``dq``, ``dk``, ``dv`` from 4-D device arrays: q, o, do, dq
    (B, Hq, Sq, ·); k, v, dk, dv (B, Hkv, Sk, ·) with Hq a multiple of Hkv; lse (B, Hq, Sq)
    float32/64 (the forward's).  One storage dtype for q, k, v, o, do, dq, dk, dv: float16,
    uint16 (bfloat16), float32, float64; any strides.  ``window=(left, right)``: −1 is
    unbounded; ``causal`` adds right <= 0.  ``tiles``: (Br, Bc, W) to force (default
    :func:`fit_tiles`; ``small``: the simulator's).  ``softcap`` (> 0: on) and ``alibi``
    (float32 slopes (1 or B, Hq) on the device, or None): :mod:`..attention.score_mods`."""
    d, dvh = q.shape[3], v.shape[3]
    acc_name = accumulator(q.dtype).name

    def main(delta, dq_acc, scale, left, right):
        block_q, block_k, warps = tiles or fit_tiles(d, dvh, q.dtype.itemsize, small)
        check_tiles(block_q, block_k, warps)
        vec = tileio.global_width([do, q, k, v], (d, dvh))  # 16-byte loads where allowed
        red4 = (acc_name == "float32" and tuple(launcher.device_limits().cc) >= (9, 0)
                and tileio.global_width([dq_acc], (d,)) == 4)  # red.global.add.v4: sm_90
        bwd, threads = kernel(q.dtype, d, dvh, block_q, block_k, warps, vec, red4,
                              *score_mods.flags(softcap, alibi))
        scale = score_mods.runtime(scale, softcap, alibi)
        value = 8 if acc_name == "float64" else 4
        shared = layout(d, dvh, block_q, block_k, 16 // value)[1] * value
        launcher.launch(bwd, (-(-k.shape[2] // block_k), k.shape[0] * k.shape[1]), threads,
                        stream, (do, q, k, v, lse, delta, dq_acc, dk, dv, scale, left, right),
                        shared=shared)

    io.launch(main, do, q, k, v, o, dq, causal=causal, window=window, scale=scale,
              stream=stream, max_head_dim=MAX_HEAD_DIM)
