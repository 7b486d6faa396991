"""The CUDA simulator's twin of :mod:`.tma`: mbarriers and tile loads, emulated.

Used only under ``NUMBA_ENABLE_CUDASIM=1``.  An mbarrier's whole state lives in its
64-bit shared word, as on the device (the layout is this twin's own)::

    bit 63: phase │ bits 42–62: transaction bytes + 2²⁰ │ 21–41: expected │ 0–20: pending

changed under one lock (the simulated threads are Python threads).  ``tma_load_2d`` copies
the box when issued — rows and columns outside the array read as zeros, the 128-byte
swizzle applied to the box's byte offsets, as to a 1024-byte aligned destination — then
completes its bytes on the barrier.  A tensor map is 16 uint64 words naming a host array
registered by :func:`encode_tiled` (word 0: a tag, word 1: its number, words 2–4: box
rows, box columns, swizzle).  ``wait`` spins, giving the other threads the interpreter.
"""

import threading
import time

import numpy as np

from .tma import SWIZZLE_128B, check_box, pitches_of
from .wgmma import swizzle as _swizzle

_LOCK = threading.Lock()
_MAPS = []
_TAG = 0x544D4150  # "TMAP"
_FIELD = (1 << 21) - 1
_BIAS = 1 << 20


def _pack(phase, tx, expected, pending):
    return np.uint64((phase << 63) | ((tx + _BIAS) << 42) | (expected << 21) | pending)


def _unpack(word):
    word = int(word)
    return word >> 63, ((word >> 42) & _FIELD) - _BIAS, (word >> 21) & _FIELD, word & _FIELD


def state(bar, i):
    """(phase, transaction bytes, expected arrivals, pending arrivals) of bar[i]."""
    return _unpack(bar[i])


def mbarrier_init(bar, i, count):
    if not 1 <= int(count) < _FIELD:
        raise ValueError(f"count: 1 … {_FIELD - 1} arrivals, got {count}")
    with _LOCK:
        bar[i] = _pack(0, 0, int(count), int(count))


def _update(bar, i, arrivals, tx):
    phase, have, expected, pending = _unpack(bar[i])
    have, pending = have + tx, pending - arrivals
    if pending < 0:
        raise RuntimeError("mbarrier: more arrivals than expected in one phase")
    if pending == 0 and have == 0:  # the phase completes: the next one begins
        phase, pending = phase ^ 1, expected
    bar[i] = _pack(phase, have, expected, pending)


def arrive_expect_tx(bar, i, nbytes):
    with _LOCK:
        _update(bar, i, 1, int(nbytes))


def arrive(bar, i):
    with _LOCK:
        _update(bar, i, 1, 0)


def complete_tx(bar, i, nbytes):
    """What the copy engine does as bytes land (no arrival)."""
    with _LOCK:
        _update(bar, i, 0, -int(nbytes))


def try_wait(bar, i, parity):
    with _LOCK:
        return _unpack(bar[i])[0] != (int(parity) & 1)


def wait(bar, i, parity):
    while not try_wait(bar, i, parity):
        time.sleep(0)


def encode_tiled(array, box_rows, box_cols, swizzle=0):
    """The simulator's tensor map: 16 uint64 words naming ``array`` (kept, not copied)."""
    check_box(array, box_rows, box_cols, swizzle)
    pitches_of(array)  # what the driver would refuse, refused here too
    with _LOCK:
        _MAPS.append(array)
        number = len(_MAPS) - 1
    words = np.zeros(16, np.uint64)
    words[:5] = (_TAG, number, box_rows, box_cols, swizzle)
    return words


def _bits(values):
    return values.view(np.uint16) if values.dtype.itemsize == 2 else values


def tma_load_3d(smem, j, tmap, col, row, plane, bar, i):
    """One plane of a 3-D map's array: rows past it read as zeros, as a box of depth 1."""
    array = _map(tmap)
    if array.ndim != 3:
        raise ValueError("tmap: tma_load_3d needs the map of a 3-D array")
    p = int(plane)
    _load(smem, j, tmap, array[p] if 0 <= p < array.shape[0] else array[0, :0, :0], col, row,
          bar, i)


def tma_load_4d(smem, j, tmap, col, row, h, b, bar, i):
    """Plane [b, h] of a 4-D map's array: rows past it read as zeros."""
    array = _map(tmap)
    if array.ndim != 4:
        raise ValueError("tmap: tma_load_4d needs the map of a 4-D array")
    hh, bb = int(h), int(b)
    inside = 0 <= bb < array.shape[0] and 0 <= hh < array.shape[1]
    _load(smem, j, tmap, array[bb, hh] if inside else array[0, 0, :0, :0], col, row, bar, i)


def _map(tmap):
    if int(tmap[0]) != _TAG:
        raise ValueError("tmap: not a tensor map made by encode_tiled")
    return _MAPS[int(tmap[1])]


def tma_load_2d(smem, j, tmap, col, row, bar, i):
    array = _map(tmap)
    if array.ndim != 2:
        raise ValueError("tmap: tma_load_2d needs the map of a 2-D array")
    _load(smem, j, tmap, array, col, row, bar, i)


def _load(smem, j, tmap, array, col, row, bar, i):
    rows, cols, sw = (int(tmap[n]) for n in (2, 3, 4))
    box = np.zeros((rows, cols), array.dtype)
    r0, c0 = int(row), int(col)
    rs, cs = slice(max(r0, 0), max(min(r0 + rows, array.shape[0]), 0)), \
        slice(max(c0, 0), max(min(c0 + cols, array.shape[1]), 0))
    part = np.asarray(array[rs, cs])
    box[rs.start - r0:rs.start - r0 + part.shape[0], cs.start - c0:cs.start - c0 + part.shape[1]] = part
    flat = _bits(box).reshape(-1)
    size = box.dtype.itemsize
    if sw == SWIZZLE_128B:
        at = np.array([_swizzle(b) // size for b in range(0, flat.size * size, size)])
    else:
        at = np.arange(flat.size)
    for n in range(flat.size):
        smem[int(j) + int(at[n])] = flat[n]
    complete_tx(bar, i, flat.size * size)


def fence_proxy_async():
    pass


def tensormap_acquire(tmap):
    pass


prefetch_tensormap = tensormap_acquire
