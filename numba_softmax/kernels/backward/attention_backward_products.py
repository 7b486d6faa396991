"""The five matrix products of the CUDA-core attention backward (:mod:`.attention_backward`),
each one thread's register tile of a product of two shared-memory tiles, read 16 bytes at
a time (``ld.shared.v4.f32``; two float64).

Three shapes of product, by which axis the sum runs along::

    along(t, …)     t[i, j] += Σ_d A[r_i, d]·B[c_j, d]     S = Q Kᵀ, dP = dO Vᵀ
                    both operands contiguous along d: per VW values of d, rows + cols
                    vector loads feed VW·rows·cols FMAs
    down(t, …)      t[a, c] += Σ_k A[k, κ_a]·B[k, col_c]   dV = Pᵀ dO, dK = dSᵀ Q
                    the thread's κ_a are consecutive in a row of A (one vector) and its
                    columns come in vectors of VV: per k, a few vector loads feed
                    rows·cols FMAs
    across(t, …)    t[i, c] += Σ_k A[r_i, k]·B[k, col_c]   dQ = dS K
                    A contiguous along k (vectors of VW), B a row of vectors per k

A thread's columns of a D-wide tile: ``col(cg, c) = VV·cg + 8·VV·(c // VV) + c % VV``, so
the 8 column groups of a row read 8·VV consecutive values at once (one bank wavefront).
The b2 kernel once read every operand 4 bytes at a time: at D = 128 (tiles 32 × 32) that was
0.64 shared loads a multiply-add, where this is about 0.17 (``docs/algorithms/backward.md``,
"Vector reads").  Callers keep every address a multiple of the vector width
(:func:`.attention_backward.layout` pads the strides).
"""

import functools

from numba import cuda

from ..hw import jit
from ..attention import tileio
from ..hw.jit import accumulator

GROUP = 8  # column groups per warp: lanes that share a row


def vector_width(dtype):
    """Values of the accumulator type in 16 bytes: 4 float32, 2 float64."""
    return 16 // (accumulator(dtype).bitwidth // 8)


def column_vector(n_cols, vw):
    """VV: consecutive columns a lane reads at once, the largest of 4, 2, 1 that divides
    its ``n_cols`` columns and fits 16 bytes."""
    return next(w for w in (4, 2, 1) if n_cols % w == 0 and w <= vw)


@functools.cache
def along(dtype, rows, cols):
    """``along(t, sm, n, a0, a_row, b0, b_col)``: t[i, j] += Σ_{d < n} sm[a0 + i·a_row + d]
    · sm[b0 + j·b_col + d]; n a multiple of the vector width (the tiles are zero padded)."""
    acc, vw = accumulator(dtype), vector_width(dtype)
    load, n_a = tileio.shared_load(vw), rows * vw  # (a compile-time size for the array)

    @jit.device
    def product(t, sm, n, a0, a_row, b0, b_col):
        a = cuda.local.array(n_a, acc)
        b = cuda.local.array(vw, acc)
        d = 0
        while d < n:  # a while loop: its counter is provably >= 0
            for i in range(rows):
                load(sm, a0 + i * a_row + d, a, i * vw)
            for j in range(cols):
                load(sm, b0 + j * b_col + d, b, 0)
                for i in range(rows):
                    for e in range(vw):
                        t[i, j] += a[i * vw + e] * b[e]
            d += vw

    return product


@functools.cache
def down(dtype, rows, cols, vv):
    """``down(t, sm, n, a0, a_k, b0, b_k)``: t[a, c] += Σ_{k < n} sm[a0 + k·a_k + a]
    · sm[b0 + k·b_k + col(0, c)]; ``rows`` consecutive values of A a row (vectors of up to
    16 bytes: a0 aligned to them), B's columns in vectors of ``vv`` from b0 = the lane's
    first column."""
    acc, vw = accumulator(dtype), vector_width(dtype)
    aw = column_vector(rows, vw)
    load_a, load_b = tileio.shared_load(aw), tileio.shared_load(vv)

    @jit.device
    def product(t, sm, n, a0, a_k, b0, b_k):
        a = cuda.local.array(rows, acc)
        b = cuda.local.array(cols, acc)
        k = 0
        while k < n:
            for u in range(rows // aw):
                load_a(sm, a0 + k * a_k + aw * u, a, aw * u)
            for u in range(cols // vv):
                load_b(sm, b0 + k * b_k + GROUP * vv * u, b, vv * u)
            for i in range(rows):
                for c in range(cols):
                    t[i, c] += a[i] * b[c]
            k += 1

    return product


@functools.cache
def across(dtype, rows, cols, vv):
    """``across(t, sm, n, a0, a_row, b0, b_k)``: t[i, c] += Σ_{k < n} sm[a0 + i·a_row + k]
    · sm[b0 + k·b_k + col(0, c)]; n a multiple of the vector width."""
    acc, vw = accumulator(dtype), vector_width(dtype)
    load_a, load_b, n_a = tileio.shared_load(vw), tileio.shared_load(vv), rows * vw

    @jit.device
    def product(t, sm, n, a0, a_row, b0, b_k):
        a = cuda.local.array(n_a, acc)
        b = cuda.local.array(cols, acc)
        k = 0
        while k < n:
            for i in range(rows):
                load_a(sm, a0 + i * a_row + k, a, i * vw)
            for e in range(vw):
                for u in range(cols // vv):
                    load_b(sm, b0 + (k + e) * b_k + GROUP * vv * u, b, vv * u)
                for i in range(rows):
                    for c in range(cols):
                        t[i, c] += a[i * vw + e] * b[c]
            k += vw

    return product
