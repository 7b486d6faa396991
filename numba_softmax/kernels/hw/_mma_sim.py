"""The CUDA simulator's twin of :mod:`.mma`: the same names, emulated lane by lane.

Used only under ``NUMBA_ENABLE_CUDASIM=1`` (the simulator cannot run inline PTX).  A
warp-wide instruction becomes one :func:`~numba_softmax.runtime.sim.warp_exchange`: every lane
posts its registers, and every lane then builds *its own* part of the result from the
posted values, following the fragment layout drawn in :mod:`.mma`.  Operands are the
exact fp16/bf16 values the registers hold (products of two of them are exact in
float64); each output is rounded once to float32, as the tensor cores accumulate.
"""

import math
import struct
import threading

import numpy as np

from ...runtime.sim import lane_id, warp_exchange
from .jit import f32_to_bf16


def f16_pair(word):
    """The two fp16 values packed in a uint32 (lower half first), as Python floats."""
    return struct.unpack("<2e", struct.pack("<I", word))


def bf16_pair(word):
    return struct.unpack("<2f", struct.pack("<2I", (word & 0xFFFF) << 16, word & 0xFFFF0000))


def _mma(decode):
    def mma(c, ci, a, ai, b0, b1):
        lanes = warp_exchange(([int(x) for x in a[ai, :4]], int(b0), int(b1)))
        lane = lane_id()
        g, t = lane >> 2, lane & 3
        quad = lanes[4 * g : 4 * g + 4]  # the lanes holding rows g and g+8 of A
        rows = [[x for r in (first, first + 2) for lq in quad for x in decode(lq[0][r])]
                for first in (0, 1)]  # row g: a0 then a2 of each lane; row g+8: a1, a3
        cols = [[x for reg in (1, 2) for lq in lanes[4 * n : 4 * n + 4] for x in decode(lq[reg])]
                for n in (2 * t, 2 * t + 1)]  # column n of B: the quad n's b0, then b1
        for r in range(4):  # c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
            products = [x * y for x, y in zip(rows[r >> 1], cols[r & 1])]  # exact in double
            if all(math.isfinite(p) for p in products):
                dot = math.fsum(products)
            else:  # ±inf or NaN: IEEE arithmetic, as the tensor cores (fsum raises on inf − inf)
                dot = sum(products)
            c[ci, r] = np.float32(float(c[ci, r]) + dot)

    return mma


mma_f16, mma_bf16 = _mma(f16_pair), _mma(bf16_pair)


def _word(lo, hi):
    return np.uint32(int(lo) | (int(hi) << 16))


def pack_f16x2(lo, hi):
    return _word(np.float16(np.float32(lo)).view(np.uint16),
                 np.float16(np.float32(hi)).view(np.uint16))


def pack_bf16x2(lo, hi):
    return _word(f32_to_bf16(np.float32(lo)), f32_to_bf16(np.float32(hi)))


def _ldmatrix(trans):
    def ldmatrix(smem, i):
        rows = warp_exchange(int(i))  # lane L: the address of row L % 8 of tile L // 8
        lane = lane_id()
        g, t = lane >> 2, lane & 3
        if trans:  # register r: tile r's rows 2t, 2t+1 at column g
            return tuple(_word(smem[rows[8 * r + 2 * t] + g], smem[rows[8 * r + 2 * t + 1] + g])
                         for r in range(4))
        return tuple(_word(smem[rows[8 * r + g] + 2 * t], smem[rows[8 * r + g] + 2 * t + 1])
                     for r in range(4))

    return ldmatrix


ldmatrix_x4, ldmatrix_x4_trans = _ldmatrix(False), _ldmatrix(True)


def _bits(value):
    """The 16 bits of a stored fp16 (or of bfloat16 bits, already a uint16)."""
    return value.view(np.uint16) if isinstance(value, np.float16) else np.uint16(value)


def cp_async16(smem, i, src, row, col, ok):
    for e in range(8):  # synchronous here: the copy is complete when the call returns
        smem[i + e] = _bits(src[row, col + e]) if ok else 0


def st_shared_b32(smem, i, word):
    smem[i], smem[i + 1] = int(word) & 0xFFFF, int(word) >> 16


_RED = threading.Lock()  # the lanes are threads: their adds must not interleave


def red_add_v2(arr, i, j, r, c, x, y):
    with _RED:
        arr[i, j, r, c] += np.float32(x)
        arr[i, j, r, c + 1] += np.float32(y)


def red_add_v4(arr, i, j, r, c, v, o):
    with _RED:
        for e in range(4):
            arr[i, j, r, c + e] += v[o + e]


def cp_async_commit():
    pass


def cp_async_wait_all():
    pass


def cp_async_wait(n):
    return cp_async_wait_all
