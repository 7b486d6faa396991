"""The CUDA simulator's twin of :mod:`.wgmma`: the same names, emulated thread by thread.

Used only under ``NUMBA_ENABLE_CUDASIM=1``.  A descriptor is a :class:`Descriptor`, an int
holding the real 64-bit encoding whose start address is the byte offset in its shared
array (the array stands for a 1024-byte aligned one, as on the device), and which also
carries that array.  A wgmma from shared memory needs no exchange: every thread reads A
and B through the descriptors and computes its own N/2 outputs at the places the map in
:mod:`.wgmma` gives them.  With A from registers, warp w's lanes post their A fragments
(:func:`~numba_softmax.runtime.sim.warp_exchange`): rows 16w … 16w+15 are that warp's.
Products of fp16/bf16 values are exact in float64; each output is rounded once to
float32.  Fences, groups and ``setmaxnreg`` do nothing here: the multiply is complete when
the call returns.
"""

import math
import threading

import numpy as np

from ...runtime.sim import lane_id, warp_exchange
from ._mma_sim import bf16_pair, f16_pair
from .wgmma import WIDTH, encode, swizzle


class Descriptor(int):
    """A wgmma matrix descriptor that remembers the shared array it points into."""

    def __new__(cls, value, smem):
        self = super().__new__(cls, int(value))
        self.smem = smem
        return self

    def __add__(self, other):
        return Descriptor(int(self) + int(other), self.smem)


def descriptor(smem, i, lbo, sbo, layout):
    return Descriptor(encode(2 * int(i), lbo, sbo, layout), smem)


def address(smem, i):
    """smem[i]'s byte address: the simulator's shared arrays stand for 1024-byte aligned ones."""
    return 2 * int(i)


def advance(desc, nbytes):
    return desc + (int(nbytes) >> 4)


def element_address(desc, row, k):
    """The byte address of element (row, k) of the K-major tile ``desc`` describes."""
    desc = int(desc)
    start, lbo = (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4
    sbo, layout = ((desc >> 32) & 0x3FFF) << 4, desc >> 62
    if layout == 0:  # 8×8 core matrices of 128 contiguous bytes
        return start + (row // 8) * sbo + (k // 8) * lbo + (row % 8) * 16 + (k % 8) * 2
    width = WIDTH[layout]
    return swizzle(start + (row // 8) * sbo + (row % 8) * width + 2 * k, width)


def n_major_address(desc, n, k):
    """The byte address of element (n, k) of an N-major B (``trans_b``; 128-byte swizzle):
    64-column blocks LBO apart, k-rows 128 bytes apart, groups of 8 k-rows SBO apart."""
    desc = int(desc)
    start, lbo = (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4
    sbo, layout = ((desc >> 32) & 0x3FFF) << 4, desc >> 62
    if layout != 1:
        raise NotImplementedError("an N-major B is emulated with the 128-byte swizzle only")
    return swizzle(start + (n // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + 2 * (n % 64))


def _read(desc, rows, decode, trans=False):
    """rows × 16 values (float) of the tile, as the tensor cores read them."""
    bits = desc.smem
    address = n_major_address if trans else element_address
    out = []
    for r in rows:
        words = [int(bits[address(desc, r, k) // 2]) for k in range(16)]
        out.append([decode(words[k] | (words[k + 1] << 16))[e]
                    for k in range(0, 16, 2) for e in (0, 1)])
    return out


def _dot(x, y):
    products = [p * q for p, q in zip(x, y)]
    if all(math.isfinite(p) for p in products):
        return math.fsum(products)
    return sum(products)


def _place():
    """(warp rank in the warpgroup, g, t) of the calling thread."""
    tid = threading.current_thread().thread_id
    lane = tid % 32
    return (tid // 32) % 4, lane >> 2, lane & 3


def _accumulate(c, n, rows, b, scale_d):
    """c[4j + r] (+)= rows[r >> 1] · column 8j + 2t + (r & 1) of B."""
    _, _, t = _place()
    for j in range(n // 8):
        for r in range(4):
            dot = _dot(rows[r >> 1], b[8 * j + 2 * t + (r & 1)])
            old = float(c[4 * j + r]) if scale_d else 0.0
            c[4 * j + r] = np.float32(old + dot)


def _check(n, kind):
    if n % 8 or not 8 <= n <= 256 or kind not in ("f16", "bf16"):
        raise ValueError(f"wgmma m64nNk16 takes N = 8 … 256 (a multiple of 8) and kind "
                         f"f16 or bf16, got n={n}, kind={kind!r}")
    return f16_pair if kind == "f16" else bf16_pair


def wgmma_ss(n, kind, trans_b=False):
    decode = _check(n, kind)

    def wgmma(c, da, db, scale_d):
        w, g, _ = _place()
        rows = _read(da, (16 * w + g, 16 * w + g + 8), decode)
        _accumulate(c, n, rows, _read(db, range(n), decode, trans_b), scale_d)

    return wgmma


def wgmma_rs(n, kind, trans_b=False):
    decode = _check(n, kind)

    def wgmma(c, a, ai, db, scale_d):
        lanes = warp_exchange([int(x) for x in a[ai, :4]])
        g = lane_id() >> 2
        quad = lanes[4 * g:4 * g + 4]  # row g: a0 then a2 of each lane; row g+8: a1, a3
        rows = [[x for reg in (first, first + 2) for lq in quad for x in decode(lq[reg])]
                for first in (0, 1)]
        _accumulate(c, n, rows, _read(db, range(n), decode, trans_b), scale_d)

    return wgmma


def _nothing():
    pass


wgmma_fence = wgmma_commit = _nothing


def wgmma_wait(n):
    return _nothing


def _setmaxnreg(n):
    if n % 8 or not 24 <= n <= 256:
        raise ValueError(f"setmaxnreg takes a multiple of 8 in 24 … 256, got {n}")
    return _nothing


setmaxnreg_inc = setmaxnreg_dec = _setmaxnreg
