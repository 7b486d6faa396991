"""Values a thread holds in registers, as stored — float16 and bfloat16 two to a register.

A kernel that keeps a row in registers (the one-pass row backward holds VPT values of y
*and* dy a thread) is limited by registers, not bytes: 32 registers hold 16 float32
values of each tensor, 64 KB a block of 1024 threads.  Held as 16-bit values, 32 float16
would take 32 registers each too — the compiler gives every 16-bit value a register of
its own — so a float16 block moved half the bytes a float32 one did, with the same
registers, and half the bytes in flight (docs/algorithms/backward.md).  Held as the
16-byte vectors' own 32-bit words, two values a register, the same 32 registers hold
32 values of each tensor: the same bytes as float32.

:func:`holder` gives a kernel the register array's type and length and four device
functions, for either layout::

    load(a, row, base, stop, t, h)   thread t's VPT values of a[row, base:] (W at a time,
                                     coalesced, ``pad`` past ``stop``) into h
    get(h, i) -> value               value i in the accumulator type (float32)
    put(h, i, value)                 value i, rounded to storage (i = 0, 1, 2, … in order:
                                     an even i starts a word, the odd one completes it)
    renew(h)                         h, made opaque to the compiler: call it between two
                                     passes of ``get`` over h (see below)
    store(h, a, row, base, stop, t)  h back to a[row, base:], inverse of ``load``

Pairs need 16-byte vectors (W = 8: unit column stride, aligned rows); the arrays are
then uint16 bits (float16 viewed as such by the caller, :func:`packed`), converted by
``cvt`` (:func:`.jit.bits_loader`).  Every other case holds one value a slot.

A kernel that reads every value twice — a sum first, then an output from each value and
the sum — would, left alone, have the compiler unpack each pair once and keep all 2·VPT
unpacked values alive across the reduction between (it sees the same expression twice):
more registers than the float32 kernel.  ``renew`` passes each word through
:func:`.ptx.opaque_u32`, so the second pass unpacks afresh from the words.
"""

import functools
from typing import NamedTuple

import numba
import numpy as np

from ..hw import jit, vector
from ..hw.ptx import opaque_u32

U32 = numba.uint32
WIDTH = 8  # 16-bit values in a 16-byte vector


class Holder(NamedTuple):
    slot: object  # numba type of the register array
    slots: int  # its length, for VPT values
    load: object
    get: object
    put: object
    store: object
    renew: object


def packed(dtype, width):
    """Whether ``dtype`` values at vector width ``width`` are held two to a register."""
    return np.dtype(dtype).itemsize == 2 and width == WIDTH


def bits(*arrays):
    """The arrays as a kernel holding pairs takes them: float16 viewed as its uint16 bits
    (bfloat16 already is); others as they are."""
    return tuple(a.view(np.uint16) if a.dtype == np.float16 else a for a in arrays)


def pad_bits(dtype, pad):
    """The stored form of ``pad`` for a 16-bit ``dtype`` (float16 or bfloat16): its bits."""
    if jit.storage(dtype) == jit.BFLOAT16:
        return int(np.array([pad], np.float32).view(np.uint32)[0] >> 16)  # (±inf, 0: exact)
    return int(np.array([pad], np.float16).view(np.uint16)[0])


@functools.cache
def holder(dtype, vpt, width, row_threads, pack=True, pad=0.0, one_test=False):
    """The :class:`Holder` for VPT values of ``dtype`` a thread, ``row_threads`` threads a
    row (their vectors interleaved: thread t's i-th at base + (t + i·row_threads)·W);
    ``pack`` False holds one value a slot even where pairs are possible; ``pad``: the
    value held past the row's end (0 for a sum, −inf for a max and a sum of exps).

    ``one_test``: a chunk that lies inside the row is tested once, not once a vector,
    and each vector is then a constant offset from the first (``row_threads`` is a
    compile-time constant).  The forward's held rows ask for it (:func:`.chunk.held`).
    The row backward does not: with it, ptxas gives its kernels more registers and the
    512-thread cluster blocks fit fewer to a multiprocessor (docs/algorithms/backward.md,
    "Measured")."""
    if not (pack and packed(dtype, width)):
        return _singles(dtype, vpt, width, row_threads, pad, one_test)
    to_acc, to_bits = jit.bits_loader(dtype), jit.bits_storer(dtype)
    fill = U32(pad_bits(dtype, pad))
    load_words, store_words = vector.words()
    step = row_threads * WIDTH

    @jit.device
    def load(a, row, base, stop, t, h):
        if one_test and base + row_threads * vpt <= stop:  # a whole chunk: no test a vector
            for i in range(vpt // WIDTH):  # all vector loads issued before any value is used
                load_words(a, row, base + t * WIDTH + i * step, h, i * 4)
            return
        for i in range(vpt // WIDTH):
            j = base + t * WIDTH + i * step
            if j + WIDTH <= stop:
                load_words(a, row, j, h, i * 4)
            else:  # the row's ragged end: value by value, the pad past it
                for k in range(4):
                    lo = U32(a[row, j + 2 * k]) if j + 2 * k < stop else fill
                    hi = U32(a[row, j + 2 * k + 1]) if j + 2 * k + 1 < stop else fill
                    h[i * 4 + k] = lo | hi << U32(16)

    @jit.device
    def get(h, i):
        w = h[i // 2]
        return to_acc(numba.uint16(w >> U32(16) if i % 2 else w & U32(0xFFFF)))

    @jit.device
    def put(h, i, value):
        bits = U32(to_bits(value))
        if i % 2:
            h[i // 2] |= bits << U32(16)
        else:
            h[i // 2] = bits

    @jit.device
    def store(h, a, row, base, stop, t):
        if one_test and base + row_threads * vpt <= stop:  # a whole chunk: no test a vector
            for i in range(vpt // WIDTH):
                store_words(a, row, base + t * WIDTH + i * step, h, i * 4)
            return
        for i in range(vpt // WIDTH):
            j = base + t * WIDTH + i * step
            if j + WIDTH <= stop:
                store_words(a, row, j, h, i * 4)
            else:
                for k in range(4):
                    w = h[i * 4 + k]
                    if j + 2 * k < stop:
                        a[row, j + 2 * k] = numba.uint16(w & U32(0xFFFF))
                    if j + 2 * k + 1 < stop:
                        a[row, j + 2 * k + 1] = numba.uint16(w >> U32(16))

    @jit.device
    def renew(h):
        for k in range(vpt // 2):
            h[k] = opaque_u32(h[k])

    return Holder(U32, vpt // 2, load, get, put, store, renew)


def _singles(dtype, vpt, width, row_threads, pad, one_test):
    """One value a slot, in the storage type (uint16 bits for bfloat16); ``one_test`` as in
    :func:`holder`."""
    raw_t = numba.from_dtype(np.dtype(dtype))
    load_row, store_row = vector.raw_row_io(width)
    whole_load, whole_store = vector.io(width)
    to_acc, to_raw = jit.loader(dtype), jit.storer(dtype)
    fill = pad_bits(dtype, pad) if jit.storage(dtype) == jit.BFLOAT16 else pad

    @jit.device
    def load(a, row, base, stop, t, h):
        if one_test and base + row_threads * vpt <= stop:  # a whole chunk: no test a vector
            for i in range(vpt // width):  # all vector loads issued before any value is used
                whole_load(a, row, base + (t + i * row_threads) * width, h, i * width)
            return
        for i in range(vpt // width):
            load_row(a, row, base + (t + i * row_threads) * width, stop, h, i * width, raw_t(fill))

    @jit.device
    def get(h, i):
        return to_acc(h[i])

    @jit.device
    def put(h, i, value):
        h[i] = to_raw(value)

    @jit.device
    def store(h, a, row, base, stop, t):
        if one_test and base + row_threads * vpt <= stop:
            for i in range(vpt // width):
                whole_store(a, row, base + (t + i * row_threads) * width, h, i * width)
            return
        for i in range(vpt // width):
            store_row(a, row, base + (t + i * row_threads) * width, stop, h, i * width)

    @jit.device
    def renew(h):
        pass  # values held one to a slot are used as they are: nothing to unpack twice

    return Holder(raw_t, vpt, load, get, put, store, renew)
