"""Staging tiles of K and V into shared memory for the tensor-core kernels.

A block of the tensor-core attention kernel (:mod:`.attention_tc`) copies each tile of
Bc keys (a (Bc, D) slab of K and one of V) into shared memory, where every warp reads
its mma operands with ``ldmatrix``; in the decode kernel (:mod:`.decode_tc`) each warp
copies tiles of its own the same way (``per_warp``).  The copy is ``cp.async``
(:mod:`.mma`): 16 bytes per instruction straight from global to shared memory, without
passing through
registers, and *asynchronously* — the thread issues the copies of the next tile and
goes on computing with the current one (double buffering); ``cp_async_wait`` and a
barrier later make the data visible.  Layout in shared memory::

    row r of the tile (key key0 + r):  [ D values | zeros up to a multiple of 16 | 8 pad ]

The zeros make D a whole number of mma k-steps (they meet zeros in Q); the 8 values of
padding shift consecutive rows by 16 bytes, so the 8 row addresses of an ``ldmatrix``
fall in 8 different bank groups (no bank conflicts).  Rows past ``hi`` (the ragged last
tile, the end of a sequence or of a split) are zero-filled and never read from memory.

Rows whose addresses are not 16-byte aligned (:func:`aligned` says) are copied value by
value through registers instead: slower, same result.
"""

import functools

import numba
from numba import cuda

from ...runtime.sim import simulator_enabled
from ..hw import jit
from ..hw.mma import cp_async16, for_dtype

PAD = 8  # 16 bytes of padding per shared row: ldmatrix's 8 row addresses hit 8 bank groups


def up16(n):
    """``n`` rounded up to a multiple of 16: a row's values, padded to whole mma k-steps."""
    return -(-n // 16) * 16


@functools.cache
def stager(dtype, threads, rows, cols, width, stride, vec, per_warp=False):
    """Device function: ``rows`` rows from key0 of src (S, cols) → shared rows of ``stride``
    values from ``base`` (``width`` columns, a multiple of 8).  Rows ≥ hi and columns ≥
    cols become zeros.  ``vec``: 16-byte cp.async copies (asynchronous: complete after
    cp_async_wait); else plain 2-byte loads and stores.  ``per_warp``: each warp copies a
    tile of its own (``threads`` = 32, thread = lane), as the decode kernel's warps do.

    Thread ``tid`` keeps one 16-byte column chunk and steps down the rows, ⌊threads /
    chunks⌋ rows a pass (threads past the last whole row idle), so a copy costs a
    compare and an address, nothing more (the division-per-copy loop this replaced in the
    decode kernel was ~35 instructions a copy, most of that kernel's).  A loop, not
    unrolled: the copies run asynchronously anyway, and an unrolled one would keep every
    copy's addresses in registers for the whole kernel."""
    chunks = width // 8
    total = rows * chunks
    whole_rows = threads >= chunks
    step = threads // chunks  # rows per pass when whole_rows; threads ≥ step·chunks idle
    load, pack = jit.loader(dtype), for_dtype(dtype)[1]
    zero = numba.float32(0.0)

    I32 = numba.int32  # (every result cast back: Numba's int32 ∘ int32 is int64)

    @jit.device
    def copy(smem, dst, src, key, c, hi):
        ok = key < hi and c < cols
        if vec:  # (an address inside the array even where nothing is read)
            cp_async16(smem, dst, src, I32(min(key, I32(hi - 1))), I32(c if c < cols else 0), ok)
        else:
            for e in range(8):
                x = zero
                if ok and c + e < cols:
                    x = load(src[key, c + e])
                smem[dst + e] = numba.uint16(pack(x, zero) & 0xFFFF)

    @jit.device
    def stage(smem, base, src, key0, hi):
        # 32-bit counters, keys and offsets (keys and shared offsets are far below 2³¹):
        # in int64 a copy cost 27 instructions, ~12 of them the high halves
        tid = I32(cuda.threadIdx.x & 31 if per_warp else cuda.threadIdx.x)
        k0, h = I32(key0), I32(hi)
        if whole_rows:
            r, c = I32(tid // chunks), I32(8 * (tid % chunks))
            dst = I32(base + r * stride + c)
            while r < rows and tid < step * chunks:
                copy(smem, dst, src, I32(k0 + r), c, h)
                r = I32(r + step)
                dst = I32(dst + step * stride)
        else:
            idx = tid
            while idx < total:
                r = I32(idx // chunks)
                c = I32(8 * (idx - r * chunks))
                copy(smem, I32(base + r * stride + c), src, I32(k0 + r), c, h)
                idx = I32(idx + threads)

    return stage


def aligned(a):
    """K or V may be staged with 16-byte cp.async: unit last stride, D a multiple of 8,
    every other stride a multiple of 16 bytes, a 16-byte aligned base."""
    size = a.dtype.itemsize
    if a.strides[3] != size and a.shape[3] > 1 or a.shape[3] % 8:
        return False
    if any(s % 16 for s, n in zip(a.strides[:3], a.shape[:3]) if n > 1):
        return False
    return simulator_enabled() or a.__cuda_array_interface__["data"][0] % 16 == 0
