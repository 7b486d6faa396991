"""What goes in and out of the attention backward (:mod:`.attention_backward`): its tile
stager and the two small kernels around it.

``stager``      a device function: a tile of a (B, H, S, D) array into shared memory, in
                the accumulator type, ``batch`` loads in flight per thread.
``preprocess``  D_i = rowsum(dO_i ∘ O_i) for every query row, and the row of the dQ
                accumulator zeroed — FlashAttention-2's ``flash_bwd_preprocess``.  D_i is
                Σ_j P_ij dP_ij computed without P: dP = dO Vᵀ and O = P V give
                Σ_j P_ij (dO_i · v_j) = dO_i · O_i (``docs/algorithms/backward.md``).
                8 lanes per row, a 3-step shuffle sum; reads dO and O once (2·Sq·Dv·b bytes).
``convert``     dQ = the float32 accumulator, rounded to dQ's storage type (float16 and
                bfloat16; float32 and float64 gradients accumulate in dQ itself).
"""

import functools

from numba import cuda

from . import jit
from .jit import accumulator

FULL_MASK = 0xFFFFFFFF
LANES = 8  # lanes per row in the preprocess kernel
THREADS = 128


@functools.cache
def stager(dtype, threads, rows, width, batch=8):
    """Device function ``stage(sm, off, stride, src, b, h, first, stop, cols, sc)``: rows
    [first, first + rows) of src[b, h], times ``sc``, into sm[off + r·stride + c],
    c < ``width``, in the accumulator type; rows ≥ ``stop`` and columns ≥ ``cols`` read
    as 0.  ``batch`` loads are issued before their stores (a store between two loads
    could alias the second, and would serialise them)."""
    acc, load = accumulator(dtype), jit.loader(dtype)
    total = rows * width

    @jit.device
    def stage(sm, off, stride, src, b, h, first, stop, cols, sc):
        buf = cuda.local.array(batch, acc)
        e0 = cuda.threadIdx.x
        while e0 < total:
            for u in range(batch):  # the batch's loads, in flight together
                e = e0 + u * threads
                r, c = e // width, e % width
                x = acc(0.0)
                if e < total and first + r < stop and c < cols:
                    x = load(src[b, h, first + r, c]) * sc
                buf[u] = x
            for u in range(batch):  # then their stores
                e = e0 + u * threads
                if e < total:
                    sm[off + (e // width) * stride + e % width] = buf[u]
            e0 += batch * threads

    return stage


@functools.cache
def preprocess(dtype):
    """Kernel: grid (⌈Sq·8/128⌉, B·H); delta (B, H, Sq) and dq_acc (B, H, Sq, D)."""
    acc, load = accumulator(dtype), jit.loader(dtype)

    @jit.kernel
    def delta_rows(do, o, delta, dq_acc):
        n_h = do.shape[1]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        row = (cuda.blockIdx.x * THREADS + cuda.threadIdx.x) // LANES
        lane = cuda.threadIdx.x % LANES
        part = acc(0.0)
        if row < do.shape[2]:
            for c in range(lane, do.shape[3], LANES):  # D_i = Σ_c dO_ic · O_ic
                part += load(do[b, h, row, c]) * load(o[b, h, row, c])
            for c in range(lane, dq_acc.shape[3], LANES):
                dq_acc[b, h, row, c] = 0.0
        offset = LANES // 2
        while offset > 0:  # the 8 lanes of a row: every lane of the warp takes part
            part += cuda.shfl_xor_sync(FULL_MASK, part, offset)
            offset //= 2
        if lane == 0 and row < do.shape[2]:
            delta[b, h, row] = part

    return delta_rows


@functools.cache
def convert(dtype):
    """Kernel: grid (⌈Sq·D/128⌉, B·H); dq = store(dq_acc), element by element."""
    store = jit.storer(dtype)

    @jit.kernel
    def round_dq(dq_acc, dq):
        n_h, d = dq.shape[1], dq.shape[3]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        e = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if e < dq.shape[2] * d:
            dq[b, h, e // d, e % d] = store(dq_acc[b, h, e // d, e % d])

    return round_dq
