"""Tensor maps on the device for a TMA kernel's launch: encoded once, uploaded without
stopping the host.

A map (:func:`.tma.encode_tiled`) depends only on the pointer, shape, dtype and box it
describes, so each is encoded and copied to the device once while it stays among the
last :data:`SLOTS` used.  The copy goes from *pinned* host memory, asynchronously on the
launch's stream: a copy from ordinary (pageable) memory — ``cuda.to_device`` — makes the
host wait for the GPU to drain, so a model whose buffers move from call to call
(activations come and go) would stop the host at every new map and lose the overlap of
its host work with the GPU's.  Slots live in one device array; a slot is written again
only after the kernels that read it have run (an event recorded after each launch that
uses it, waited for before the slot is reused, which with 256 slots is long past).

    maps(specs, stream) → (device maps, slots)   specs: (array, box rows) pairs of
                                                 (B, H, S, D) device arrays, strided or
                                                 not, or (B, H, S) rows of per-row terms
    launched(slots, stream)                      after the launch that reads them
    takes(a) → bool, mappable(name=a, …)         whether a map describes a device array
                                                 (a ValueError naming the one it does not)

A launch plan (:mod:`numba_softmax.plans`) replays a routed call without this module's
caller: each map is noted as made from its array (:func:`.runtime.record.derived`), and a
replay asks the pool for the map of the new pointer (same shape, strides and dtype: the
plan's key fixed them) — found in its slot, or encoded into the next.

Under the CUDA simulator a map names its array object (:mod:`._tma_sim`): made afresh
each call, nothing cached.
"""

import numpy as np
from numba import cuda

from ...runtime import record
from ...runtime.sim import simulator_enabled
from . import tma

SLOTS = 256
WORDS = 16  # a map is 128 bytes


def takes(a):
    """Whether a tensor map describes the device array ``a``: values next to each other
    along its last axis, every other stride a positive multiple of 16 bytes
    (:func:`.tma.pitches_of`), a 16-byte aligned address."""
    try:
        tma.pitches_of(a)
    except ValueError:
        return False
    face = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return face["data"][0] % 16 == 0


def mappable(**arrays):
    """A ValueError naming the first of ``arrays`` that no tensor map describes."""
    for name, a in arrays.items():
        if not takes(a):
            raise ValueError(f"{name}: a tensor map needs values next to each other along the "
                             f"last axis, other strides positive multiples of 16 bytes and a "
                             f"16-byte aligned address, got strides {a.strides}")


def _encoded(a, rows):
    if a.ndim == 3:  # (B, H, S) float32 terms of each row: boxes of ``rows`` values
        return tma.encode_tiled(a, 1, rows, tma.NONE)
    return tma.encode_tiled(a, rows, 64, tma.SWIZZLE_128B)  # 4-D: any strides a map takes


class _Pool:
    """The slots of one CUDA context: device words, pinned host words, events."""

    def __init__(self):
        self.device = cuda.device_array((SLOTS, WORDS), np.uint64)
        self.views = [self.device[i] for i in range(SLOTS)]
        self.addresses = ([] if simulator_enabled() else  # (the pool's maps on a GPU)
                          [v.__cuda_array_interface__["data"][0] for v in self.views])
        self.host = cuda.pinned_array((SLOTS, WORDS), np.uint64)
        # (the simulator's events take no arguments; its pool serves tests of the ring)
        self.events = [cuda.event() if simulator_enabled() else cuda.event(timing=False)
                       for _ in range(SLOTS)]
        self.slot_of, self.key_of, self.next = {}, [None] * SLOTS, 0

    def slot(self, key, array, rows, stream, taken=()):
        """The slot holding ``key``'s map, written first if it is not there; ``taken``:
        slots this launch reads already, never the one rewritten."""
        if key in self.slot_of:
            return self.slot_of[key]
        i = self.next
        while i in taken:
            i = (i + 1) % SLOTS
        self.next = (i + 1) % SLOTS
        if self.key_of[i] is not None:
            del self.slot_of[self.key_of[i]]
        self.events[i].synchronize()  # the kernels that read slot i (and its copy) are done
        self.host[i] = _encoded(array, rows)
        self.views[i].copy_to_device(self.host[i], stream=stream)  # pinned: no wait
        self.slot_of[key], self.key_of[i] = i, key
        return i


_POOLS = {}  # CUDA context -> _Pool


class _Like:
    """What :func:`.tma.encode_tiled` reads of an array, at another address."""

    def __init__(self, ptr, shape, strides, dtype):
        self.shape, self.strides, self.dtype, self.ndim = shape, strides, dtype, len(shape)
        self.__cuda_array_interface__ = {"data": (ptr, False)}


def _remake(pool, shape, strides, dtype, rows):
    """A replay's maker of the map of an array like this one at a new address."""
    def remake(ptr, stream, taken):
        key = (ptr, shape, strides, str(dtype), rows)
        i = pool.slot_of.get(key)  # a map in its slot already: nothing to build
        if i is None:
            i = pool.slot(key, _Like(ptr, shape, strides, dtype), rows, _stream(stream), taken)
        taken.append(i)
        return pool.addresses[i], lambda stream: pool.events[i].record(_stream(stream))
    return remake


def _stream(stream):
    return stream if stream else cuda.default_stream()


def maps(specs, stream=0):
    """The device tensor maps of ``specs`` ((array, box rows) pairs: (B, H, S, D) views,
    :func:`.tma.pitches_of`'s strides) with 64-column, 128-byte-swizzled boxes, read by
    ``tma_load_4d(…, col, row, h, b, …)`` — or of (B, H, S) rows of per-row terms, boxes
    of ``rows`` values not swizzled, read by ``tma_load_3d(…, s, h, b, …)`` — and the
    slots they occupy (None on the simulator)."""
    if simulator_enabled():
        return [cuda.to_device(_encoded(a, rows)) for a, rows in specs], None
    ctx = id(cuda.current_context())  # (a Context is not hashable)
    pool = _POOLS.get(ctx)
    if pool is None:
        pool = _POOLS[ctx] = _Pool()
    s, slots = _stream(stream), []
    for a, rows in specs:
        ptr = a.__cuda_array_interface__["data"][0]
        key = (ptr, a.shape, a.strides, str(a.dtype), rows)
        slots.append(pool.slot(key, a, rows, s, slots))
        record.derived(pool.addresses[slots[-1]], ptr,
                       _remake(pool, a.shape, a.strides, a.dtype, rows))
    return [pool.views[i] for i in slots], slots


def launched(slots, stream=0):
    """Mark ``slots`` as read by the launch just queued on ``stream``."""
    if slots is None:
        return
    pool, s = _POOLS[id(cuda.current_context())], _stream(stream)
    for i in slots:
        pool.events[i].record(s)
