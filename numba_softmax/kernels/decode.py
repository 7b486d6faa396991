"""v6 — split-KV attention (flash-decoding) and the merge of partial attention results.

When a decoder generates one token, Sq is 1 (or a few), and the FlashAttention grid of
:mod:`.attention` — one block per (batch·head, tile of query rows) — is B·H blocks: too few
to fill 132 multiprocessors while each block walks a KV cache of 100k keys alone.  Cut the
keys instead:

    kernel 1  the forward kernel of :mod:`.attention` with a third grid axis: block
              (i, bh, z) attends to the keys [z·C, (z+1)·C) only and writes that range's
              normalised partial (O_z, LSE_z) to a float32 workspace
              (Z·B·H·Sq·(Dv + 1) values — small: Sq is small);
    kernel 2  ``merge_splits`` folds the Z partials of each query row.

An (O, LSE) pair *is* an attention state: (m = LSE, ℓ = 1, O) — "all the weight of this
key range, measured relative to exp(LSE)".  So the merge is the combiner once more::

    (m, ℓ) = fold of combine(·, ·, LSE_z, 1) over z      m = max LSE_z, ℓ = Σ exp(LSE_z − m)
    O      = Σ_z exp(LSE_z − m) · O_z / ℓ,   LSE = m + log ℓ

A range that one row cannot see (causal) has LSE_z = −inf and weighs exactly 0; a row
that sees nothing at all gets O = 0 and LSE = −inf.  The combiner is associative and
commutative, so the result depends neither on where the cuts fall nor on the order of
the merge (up to float rounding) — the tests check both.

``merge_pair`` is the same fold for two results held in separate arrays: the pairwise
step of ring attention (the sources' ``update_out_and_lse``), where each device attends
to a rotating block of keys and merges the result into its running (O, LSE).

Memory traffic of kernel 2: read Z·(Dv + 1)·4 bytes per query row, write Dv·b + 4.
NumPy twins: :func:`numba_softmax.reference.split_kv_attention` and
:func:`numba_softmax.reference.merge_attention`.
"""

import functools
import math

import numpy as np
from numba import cuda

from ..combine import combine_device, lse_device, weight_device
from . import attention as forward
from . import jit, launcher
from .jit import accumulator

MERGE_WARPS = 4  # rows per block in the merge kernels: one warp per query row


@functools.cache
def _merge_kernels(dtype, warps):
    acc = accumulator(dtype)

    @jit.kernel
    def merge_splits(o_ws, lse_ws, o, lse):
        """o_ws (Z·B, H, Sq, Dv), lse_ws (Z·B, H, Sq) → o (B, H, Sq, Dv), lse (B, H, Sq).
        Grid (⌈Sq/W⌉, B·H); warp w of block (x, bh) merges query row x·W + w."""
        warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
        n_b, n_h = o.shape[0], o.shape[1]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        row = cuda.blockIdx.x * warps + warp
        if row >= o.shape[2]:
            return
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
            o[b, h, row, c] = x * inv
        if lane == 0:
            lse[b, h, row] = lse_device(m, l)

    @jit.kernel
    def merge_pair(o_a, lse_a, o_b, lse_b, o, lse):
        """(o_a, lse_a) ⊕ (o_b, lse_b) → (o, lse); all (B, H, S, Dv) and (B, H, S).
        ``o``, ``lse`` may be ``o_a``, ``lse_a`` (ring attention updates in place)."""
        warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
        n_h = o.shape[1]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        row = cuda.blockIdx.x * warps + warp
        if row >= o.shape[2]:
            return
        one, zero = acc(1.0), acc(0.0)
        la, lb = acc(lse_a[b, h, row]), acc(lse_b[b, h, row])
        m, l = combine_device(la, one, lb, one)
        w_a, w_b = weight_device(la, m), weight_device(lb, m)  # the factors ℓ was re-based by
        inv = one / l if l != zero else zero
        for c in range(lane, o.shape[3], 32):
            o[b, h, row, c] = (w_a * acc(o_a[b, h, row, c]) + w_b * acc(o_b[b, h, row, c])) * inv
        cuda.syncwarp(0xFFFFFFFF)  # every lane has read lse_a before it may be overwritten
        if lane == 0:
            lse[b, h, row] = lse_device(m, l)

    return merge_splits, merge_pair


def _merge_grid(o, warps):
    n_b, n_h, s = o.shape[0], o.shape[1], o.shape[2]
    if n_b * n_h > 65535:  # grid y, as in the forward kernel
        raise ValueError(f"at most 65535 batch·heads per launch, got {n_b * n_h}")
    return (-(-s // warps), n_b * n_h), 32 * warps


_WORKSPACES = {}


def _workspace(shape, dv, stream):
    """The float32 partials (O: shape + (Dv,), LSE: shape), allocated once per stream and
    grown as needed (a cudaMalloc per call would cost more than decoding one token); one
    per stream, because two streams running at once must not share it."""
    key = int(stream) if stream else 0  # a Numba stream's int() is its handle
    n = shape[0] * shape[1] * shape[2]
    need = n * (dv + 1)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.shape[0] < need:
        buf = _WORKSPACES[key] = cuda.device_array(max(need, 4096), dtype=np.float32, stream=stream)
    return buf[: n * dv].reshape(*shape, dv), buf[n * dv : need].reshape(*shape)


def split_chunk(sk, num_splits, block_k):
    """Keys per split: ⌈Sk / num_splits⌉ rounded up to whole tiles of ``block_k`` keys
    (so no split ends in a ragged tile but the last).  May give fewer splits than asked."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    chunk = -(-sk // num_splits)
    return max(block_k, -(-chunk // block_k) * block_k)


def decode_block_q(sq):
    """Query tile for split-KV: the smallest one-warp tile (4, 8 or 16 rows) holding Sq rows
    (decoding has Sq = 1 … a few), else None: the forward kernel's default."""
    for block_q in (4, 8, 16):
        if sq <= block_q:
            return block_q
    return None


def launch(q, k, v, o, lse, *, num_splits, causal=False, scale=None, block_q=None,
           block_k=None, rows_per_lane=None, kv_chunk=None, stream=0, small=False):
    """Split-KV attention on 4-D device arrays (as :func:`.attention.launch`); ``o``
    (B, H, Sq, Dv) and ``lse`` (B, H, Sq, float32) receive the merged result.

    The keys are cut into ``num_splits`` ranges of whole tiles (:func:`split_chunk`), or
    into ranges of exactly ``kv_chunk`` keys when that is given.
    """
    n_b, n_h, sq, d = q.shape
    sk, dv = k.shape[2], v.shape[3]
    if block_q is None:
        block_q = decode_block_q(sq)
    if block_k is None:
        block_k = forward.fit_tiles(d, dv, small)[1]
    if kv_chunk is None:
        kv_chunk = split_chunk(sk, num_splits, block_k)
    splits = max(1, -(-sk // kv_chunk))
    o_ws, lse_ws = _workspace((splits * n_b, n_h, sq), dv, stream)
    forward.launch(q, k, v, o_ws, lse_ws, causal=causal, scale=scale, block_q=block_q,
                   block_k=block_k, rows_per_lane=rows_per_lane, kv_chunk=kv_chunk,
                   stream=stream, small=small)
    merge_splits_launch(o_ws, lse_ws, o, lse, stream=stream, small=small)


def merge_splits_launch(o_ws, lse_ws, o, lse, stream=0, small=False):
    """Fold the Z = o_ws.shape[0] / B partials of every query row (kernel 2)."""
    if o.shape[0] * o.shape[1] * o.shape[2] == 0:
        return
    warps = 1 if small else MERGE_WARPS
    grid, threads = _merge_grid(o, warps)
    launcher.launch(_merge_kernels(np.dtype(np.float32), warps)[0], grid, threads, stream,
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
