"""The merge of partial attention results: Z key ranges of one query row, or two results.

An (O, LSE) pair over a range of keys *is* an attention state: (m = LSE, ℓ = 1, O) — "all
the weight of this range, measured relative to exp(LSE)".  So merging is the combiner once
more::

    (m, ℓ) = fold of combine(·, ·, LSE_z, 1) over z      m = max LSE_z, ℓ = Σ exp(LSE_z − m)
    O      = Σ_z exp(LSE_z − m) · O_z / ℓ,   LSE = m + log ℓ

A range that one row cannot see has LSE_z = −inf and weighs exactly 0; a row that sees
nothing at all gets O = 0 and LSE = −inf.  The combiner is associative and commutative,
so the result depends neither on where the cuts fall nor on the order of the merge (up to
float rounding).

``merge_splits`` folds the Z partials that split-KV's first kernel wrote (the forward
kernel of :mod:`numba_softmax.kernels.attention.attention` with ``kv_chunk``); ``merge_pair`` is the same fold for two
results held in separate arrays: the pairwise step of ring attention (the sources'
``update_out_and_lse``).  One warp per query row, lanes along Dv (coalesced); the rows
of all (batch, head) pairs are numbered along one grid axis, so any batch·heads runs.

Memory traffic of ``merge_splits``: read Z·(Dv + 1)·4 bytes per query row, write
Dv·b + 4.  NumPy twins: :func:`numba_softmax.reference.split_kv_attention` and
:func:`numba_softmax.reference.merge_attention`.
"""

import functools
import math

import numpy as np
from numba import cuda

from ...combine import combine_device, lse_device, weight_device
from ..hw import jit
from ...runtime import launcher
from ..hw.jit import accumulator

MERGE_WARPS = 4  # rows per block: one warp per query row


@functools.cache
def _merge_kernels(dtype, warps):
    acc = accumulator(dtype)
    store = jit.storer(dtype)
    load = jit.loader(dtype)

    @jit.device
    def which_row(o):
        """(b, h, row) of this warp's query row; rows past the last give b = −1."""
        n_b, n_h, n_s = o.shape[0], o.shape[1], o.shape[2]
        g = cuda.blockIdx.x * warps + cuda.threadIdx.x // 32
        if g >= n_b * n_h * n_s:
            return -1, 0, 0
        return g // (n_h * n_s), (g // n_s) % n_h, g % n_s

    @jit.kernel
    def merge_splits(o_ws, lse_ws, o, lse):
        """o_ws (Z·B, H, Sq, Dv), lse_ws (Z·B, H, Sq) → o (B, H, Sq, Dv), lse (B, H, Sq)."""
        lane = cuda.threadIdx.x % 32
        b, h, row = which_row(o)
        if b < 0:
            return
        n_b = o.shape[0]
        splits = o_ws.shape[0] // n_b
        one, zero = acc(1.0), acc(0.0)
        m, l = acc(-math.inf), zero  # the identity
        for z in range(splits):  # every lane folds the row's Z states itself
            m, l = combine_device(m, l, acc(lse_ws[z * n_b + b, h, row]), one)
        inv = one / l if l != zero else zero  # ℓ = 0: no range saw a key → O = 0
        for c in range(lane, o.shape[3], 32):  # lanes along Dv: coalesced
            x = zero
            for z in range(splits):
                w = weight_device(acc(lse_ws[z * n_b + b, h, row]), m)
                x += w * acc(o_ws[z * n_b + b, h, row, c])
            # no range saw a key: O = 0, chosen (a partial may hold 0·NaN)
            o[b, h, row, c] = store(x * inv if l != zero else zero)
        if lane == 0:
            lse[b, h, row] = lse_device(m, l)

    @jit.kernel
    def merge_pair(o_a, lse_a, o_b, lse_b, o, lse):
        """(o_a, lse_a) ⊕ (o_b, lse_b) → (o, lse); all (B, H, S, Dv) and (B, H, S).
        ``o``, ``lse`` may be ``o_a``, ``lse_a`` (ring attention updates in place)."""
        lane = cuda.threadIdx.x % 32
        b, h, row = which_row(o)
        if b < 0:
            return
        one, zero = acc(1.0), acc(0.0)
        la, lb = acc(lse_a[b, h, row]), acc(lse_b[b, h, row])
        m, l = combine_device(la, one, lb, one)
        w_a, w_b = weight_device(la, m), weight_device(lb, m)  # the factors ℓ was re-based by
        inv = one / l if l != zero else zero
        for c in range(lane, o.shape[3], 32):
            x = w_a * load(o_a[b, h, row, c]) + w_b * load(o_b[b, h, row, c])
            o[b, h, row, c] = store(x * inv)
        cuda.syncwarp(0xFFFFFFFF)  # every lane has read lse_a before it may be overwritten
        if lane == 0:
            lse[b, h, row] = lse_device(m, l)

    return merge_splits, merge_pair


def _merge_grid(o, warps):
    rows = o.shape[0] * o.shape[1] * o.shape[2]
    return (-(-rows // warps),), 32 * warps


def merge_splits_launch(o_ws, lse_ws, o, lse, stream=0, small=False):
    """Fold the Z = o_ws.shape[0] / B float32 partials of every query row into ``o``
    (dtype of the result) and ``lse``."""
    if o.shape[0] * o.shape[1] * o.shape[2] == 0:
        return
    warps = 1 if small else MERGE_WARPS
    grid, threads = _merge_grid(o, warps)
    launcher.launch(_merge_kernels(np.dtype(o.dtype), warps)[0], grid, threads, stream,
                    (o_ws, lse_ws, o, lse))


def merge_pair_launch(o_a, lse_a, o_b, lse_b, o, lse, stream=0, small=False):
    """(o, lse) ← merge of two partial results over disjoint key sets; 4-D/3-D device
    arrays (B, H, S, Dv) and (B, H, S).  ``o``/``lse`` may be ``o_a``/``lse_a``."""
    if o.shape[0] * o.shape[1] * o.shape[2] == 0:
        return
    warps = 1 if small else MERGE_WARPS
    grid, threads = _merge_grid(o, warps)
    launcher.launch(_merge_kernels(np.dtype(o_a.dtype), warps)[1], grid, threads, stream,
                    (o_a, lse_a, o_b, lse_b, o, lse))


# --- split-KV on the forward kernel: many query rows per K/V head -------------------------------
def partials(shape, dv, stream):
    """The float32 split partials O (shape + (dv,)) and LSE (shape): launcher workspaces."""
    return (launcher.scratch(tuple(shape) + (dv,), np.float32, stream, "split.o"),
            launcher.scratch(tuple(shape), np.float32, stream, "split.lse"))


def split_chunk(sk, num_splits, block_k):
    """Keys per split: ⌈Sk / num_splits⌉ rounded up to whole tiles of ``block_k`` keys
    (the forward kernel's splits).  May give fewer splits than asked."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    chunk = -(-sk // num_splits)
    return max(block_k, -(-chunk // block_k) * block_k)


def split_forward(q, k, v, o, lse, *, num_splits=None, kv_chunk=None, stream=0, small=False,
                  **options):
    """Split-KV in two kernels: a forward kernel — on tensor cores for float16/bfloat16
    (:mod:`numba_softmax.kernels.attention.attention_tc`), else :mod:`numba_softmax.kernels.attention.attention`
    — writes one float32 partial per key range (``kv_chunk`` keys each, or ``num_splits``
    ranges of whole tiles), then :func:`merge_splits_launch` folds them into ``o``, ``lse``."""
    from . import attention, attention_tc

    tiles = {"block_q", "block_k", "rows_per_lane"} & set(options)  # the CUDA-core kernel's
    two_bytes = np.dtype(q.dtype).itemsize == 2 and options.get("scale") != 0
    forward = attention_tc if two_bytes and not (small or tiles) else attention

    n_b, n_h, sq, d = q.shape
    sk, dv = k.shape[2], v.shape[3]
    if kv_chunk is None:
        block_k = options.get("block_k") or attention.fit_tiles(d, dv, small)[1]
        kv_chunk = split_chunk(sk, num_splits or 1, block_k)
    splits = max(1, -(-sk // kv_chunk))
    o_ws, lse_ws = partials((splits * n_b, n_h, sq), dv, stream)
    forward.launch(q, k, v, o_ws, lse_ws, kv_chunk=kv_chunk, stream=stream, small=small, **options)
    merge_splits_launch(o_ws, lse_ws, o, lse, stream=stream, small=small)
