"""s6 — a row held on chip: one block per row, the row parked in shared memory.
One read and one write per element, for rows far longer than registers hold.

The fused kernel (s4) keeps a row in registers: at most 1024 threads × 16 values, 64 KB
of float32.  A multiprocessor also has up to 227 KB of shared memory a block may opt in
to (sm_90), so a row of up to ~58 000 float32 (116 000 float16) values fits in one block:

    pass 1  the block reads the row in chunks of T·VPT values (16-byte vectors, all of a
            chunk's loads in flight), each thread folds its values into its running
            (m, ℓ) — the online step of s3 — and *parks* them in shared memory;
    combine the block's (m, ℓ): warp butterfly, then across warps (:mod:`.reduce`);
    pass 2  each thread takes its parked values back, normalises them, writes them.

A thread parks its values in a stretch of its own — its j-th value at
``held[t·S + j]``, S an odd stride — so the warp's 32 stores of one step hit 32
different banks (4-byte values), every address is a constant offset from one register,
and only the thread that parked a value ever reads it back: no barrier is needed
between the passes, nor between rows.  Values are parked in the row's own dtype
(float16 and bfloat16 take half the room of their float32 accumulators).

Memory traffic: read N·b, write N·b — the minimum, as for s4.  Shared memory per block:
T·S·b, N·b rounded up to T·W values plus one value per thread; a row longer than one
block's shared memory does not fit and is refused (``group`` splits it over several
blocks, :mod:`.group`).  T is a compile-time constant here, like the fused kernel's
team: the addresses of a chunk's vectors are then constant offsets.
NumPy twin: :func:`numba_softmax.reference.softmax`.
"""

import functools
import math
from typing import NamedTuple

import numba
from numba import cuda

from ...combine import combine_device
from ..rows import chunk, pairs, vector_chunk
from ..hw import jit, vector
from ...runtime import launcher
from ..rows.epilogue import LOGSUMEXP, row_constant
from .online import VECTORS, stream_state
from ..rows.reduce import team_combine

STATIC_SHARED = 1024  # bytes of shared memory a kernel here uses besides the parked row
U = numba.uint64  # held's indices: unsigned, so Numba adds no negative-index wraparound
U32 = numba.uint32


@functools.cache
def parker(vectors, per_vector, width):
    """Device function ``park(held, j, src, base, stop, t, team)``: thread t parks the
    ``vectors`` vectors of a chunk it loaded at ``base`` — ``per_vector`` slots of
    ``src`` each, vector i covering ``width`` values from base + (t + i·team)·width — at
    ``held[j + …]``, the vectors that lie inside the range only."""

    @jit.device
    def park(held, j, src, base, stop, t, team):
        for i in range(vectors):
            if base + (t + i * team) * width < stop:
                for k in range(per_vector):
                    held[j + U(i * per_vector + k)] = src[i * per_vector + k]

    return park


@functools.cache
def keeper(dtype, vpt, width):
    """Device function ``keep(x, row, start, stop, held, stride, t, team) -> (m, ℓ)``: pass
    1 over x[row, start:stop] that also parks thread t's values in ``held`` (shared
    memory) at ``held[t·stride + j]``, j = 0, 1, …  The values are parked as loaded — a
    16-bit value's own bits, not its float32 rounded back (the same bits: it came from
    them)."""
    acc = jit.accumulator(dtype)
    io = chunk.ops(dtype, vpt, width)
    load_row, _ = vector.raw_row_io(width)
    fetch = vector_chunk.chunked(load_row, vector_chunk.strided(width, vpt // width)[0], vpt, width)
    to_acc = jit.loader(dtype)
    raw = vector.storage_type(dtype)
    fill = pairs.pad_bits(dtype, -math.inf) if raw == numba.uint16 else -math.inf  # −inf, stored
    vectors = vpt // width
    park = parker(vectors, width, width)

    @jit.device
    def keep(x, row, start, stop, held, stride, t, team):
        bits = cuda.local.array(vpt, raw)  # a chunk as stored
        v = cuda.local.array(vpt, acc)  # … and as the accumulator's type
        m, l = acc(-math.inf), acc(0.0)
        base, j = start, U(t * stride)  # thread t's next place in held (unsigned: below)
        pad = raw(fill)  # past the end: −inf, as stored
        while base < stop:
            fetch(x, row, base, stop, t, team, bits, pad)  # its loads before any value is used
            for i in range(vpt):
                v[i] = to_acc(bits[i])
            m_chunk, l_chunk = io.state(v)
            m, l = combine_device(m, l, m_chunk, l_chunk)  # the online step, per chunk
            park(held, j, bits, base, stop, t, team)  # the vectors inside the range, on chip
            base += team * vpt
            j += U(vpt)
        return m, l

    return keep


@functools.cache
def writer(dtype, vpt, width, mode):
    """Device function ``write_held(y, row, start, stop, held, stride, t, team, m, c)``:
    pass 2 of y[row, start:stop] from the values :func:`keeper` parked."""
    acc = jit.accumulator(dtype)
    io = chunk.ops(dtype, vpt, width)
    to_acc = jit.loader(dtype)
    vectors = vpt // width

    @jit.device
    def write_held(y, row, start, stop, held, stride, t, team, m, c):
        v = cuda.local.array(vpt, acc)
        base, j = start, U(t * stride)
        while base < stop:
            for i in range(vectors):  # thread t's own parked values: no barrier needed
                inside = base + (t + i * team) * width < stop
                for k in range(width):
                    v[i * width + k] = to_acc(held[j + U(i * width + k)]) if inside else m
            io.normalise(v, m, c, mode)
            io.store(y, row, base, stop, t, team, v)
            base += team * vpt
            j += U(vpt)

    return write_held


@functools.cache
def paired(dtype, vpt, width, team, mode):
    """(keep, write_held) for a 16-bit row parked *in pairs* (:func:`.chunk.held`): the
    16-byte vectors' own 32-bit words, two values a word, ``held`` a uint32 array and
    ``stride`` in words — one 32-bit store and load per two values, none of the values
    rounded back to storage; the arrays are passed as their uint16 bits
    (:func:`.pairs.bits`).  Same calls as :func:`keeper` and :func:`writer`; ``team``
    must be the kernel's compile-time team."""
    acc = jit.accumulator(dtype)
    hd = chunk.held(dtype, vpt, width, team, True)
    words, vectors, per_vector = hd.slots, vpt // width, width // 2
    park = parker(vectors, per_vector, width)

    @jit.device
    def keep(x, row, start, stop, held, stride, t, team_):
        h = cuda.local.array(words, hd.slot)  # a chunk's words, in registers
        m, l = acc(-math.inf), acc(0.0)
        base, j = start, U(t * stride)
        while base < stop:
            hd.load(x, row, base, stop, t, h)  # −inf past the end
            m_chunk, l_chunk = hd.state(h)
            m, l = combine_device(m, l, m_chunk, l_chunk)  # the online step, per chunk
            park(held, j, h, base, stop, t, team)  # the vectors' words
            base += team * vpt
            j += U(words)
        return m, l

    @jit.device
    def write_held(y, row, start, stop, held, stride, t, team_, m, c):
        h = cuda.local.array(words, hd.slot)
        base, j = start, U(t * stride)
        while base < stop:
            for i in range(vectors):  # thread t's own words: no barrier needed
                inside = base + (t + i * team) * width < stop
                for k in range(per_vector):  # (past the end: never written)
                    h[i * per_vector + k] = held[j + U(i * per_vector + k)] if inside else U32(0)
            hd.write(h, y, row, base, stop, t, m, c, mode)
            base += team * vpt
            j += U(words)

    return keep, write_held


def paired_stride(n, threads, width):
    """:func:`stride_for` in 32-bit words for a range parked in pairs: an odd count."""
    words = -(-n // (threads * width)) * width // 2
    return words + 1 - words % 2


@functools.cache
def kernel(dtype, vpt, mode, width, threads):
    acc = jit.accumulator(dtype)
    fold = stream_state(dtype, vpt, width)
    keep = keeper(dtype, vpt, width)
    write_held = writer(dtype, vpt, width, mode)
    store = jit.storer(dtype)
    raw = vector.storage_type(dtype)

    @jit.kernel
    def onchip(x, y, stride):
        row, t, T = cuda.blockIdx.x, cuda.threadIdx.x, threads
        n = x.shape[1]
        held = cuda.shared.array(0, raw)  # the row, on chip (dynamic shared memory)
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        if mode == LOGSUMEXP:
            m, l = fold(x, row, 0, n, t, T)  # only (m, ℓ) is needed: nothing to keep
        else:
            m, l = keep(x, row, 0, n, held, stride, t, T)  # pass 1: read once, fold, park
        m, l = team_combine(m, l, m_slots, l_slots, T)  # the row's state
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0:
                y[row, 0] = store(c)
            return
        write_held(y, row, 0, n, held, stride, t, T, m, c)  # pass 2: from shared memory

    return onchip


class Plan(NamedTuple):
    """The on-chip launch: a block of ``threads`` per row, ``shared`` bytes, each thread
    parking its values ``stride`` apart."""

    kernel: object
    grid: int
    threads: int
    stride: int
    shared: int


def stride_for(n, threads, width):
    """Values a thread parks for a range of n values, padded to an odd count (the
    stride between threads' stretches: conflict-free banks)."""
    per_thread = -(-n // (threads * width)) * width
    return per_thread + 1 - per_thread % 2


def fit_threads(make, x, y, threads, args):
    """``(kernel, threads)``: the kernel ``make(threads)`` for the largest power of two
    ≤ ``threads`` that the compiled kernel can launch (:func:`.launcher.max_threads`)."""
    threads = chunk.pow2_floor(threads)
    while True:
        k = make(threads)
        limit = launcher.max_threads(k, args)
        if threads <= limit or threads <= 32:
            return k, threads
        threads = chunk.pow2_floor(limit)


def configure(x, y, mode, threads=None, vpt=None, shared=None):
    """The launch: one block per row of 512 threads (fewer if the compiled kernel cannot
    launch that many, or ``threads`` asks for fewer); ``shared`` caps the bytes a block
    may park (default: the device's opt-in limit).  A row that does not fit raises
    ``ValueError``."""
    rows, n = x.shape
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    vpt = max(vpt or VECTORS * vector.width_for(x.dtype), width)
    k, threads = fit_threads(lambda t: kernel(x.dtype, vpt, mode, width, t), x, y,
                             threads or 512, (x, y, 1))
    stride = stride_for(n, threads, width)
    need = 0 if mode == LOGSUMEXP else threads * stride * x.dtype.itemsize
    cap = launcher.device_limits().shared_optin - STATIC_SHARED if shared is None else shared
    if need > cap:
        raise ValueError(
            f"onchip holds a row in one block's shared memory: a row of {n} values needs "
            f"{need} bytes, the limit is {cap}; use method='group' (or 'online', 'split')")
    return Plan(k, rows, threads, stride, need)


def launch(x, y, mode, threads=None, vpt=None, shared=None, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    plan = configure(x, y, mode, threads, vpt, shared)
    launcher.launch(plan.kernel, plan.grid, plan.threads, stream, (x, y, plan.stride),
                    shared=plan.shared)
