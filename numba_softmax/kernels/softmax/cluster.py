"""s8 — a row held on chip by a thread-block cluster: rows a few multiprocessors long.

``onchip`` (s6) parks a row in one block's shared memory; a row of 65536 float32 values
(256 KB) is more than a multiprocessor has.  ``group`` (s7) cuts it over blocks that meet
through a counter in global memory — an atomic, a spin on L2, a fence: microseconds a
row in which the block moves no bytes (the same kernel with the group barrier removed,
wrong but timed, runs measurably faster: docs/algorithms/cluster.md).  Hopper (sm_90)
launches blocks in *clusters* that the hardware runs at once on one GPC, whose blocks
may write into each other's shared memory and meet at a hardware barrier.  Here a
cluster of ``size`` blocks takes one row, and no byte of the exchange touches global memory:

    1. read      block b parks x[row, b·piece : (b + 1)·piece] in its shared memory and
                 folds it into (m_b, ℓ_b) — ``onchip``'s pass 1 on a piece;
    2. exchange  thread r < size writes (m_b, ℓ_b) into slot b of block r's shared memory
                 (:mod:`.dsmem`), and the cluster meets at its barrier;
    3. combine   every block folds the ``size`` slots in the same order with the combiner:
                 the row's (m, ℓ), bit for bit the same in every block;
    4. write     each block normalises its parked piece and writes it — pass 2, from chip.

A block may hold its piece in *registers* instead (``fused``'s way: T threads × VPT
values, the state taken with ``exps`` so that the write is one multiply a value,
:mod:`.chunk`): 8 blocks of 1024 threads × 32 values hold 262 144 float32 values — rows
whose shared-memory pieces would be 128 KB, where a piece that large leaves one block a
multiprocessor and the registers' form is the faster.  float32 rows take registers
wherever full blocks of 1024 threads × 32 values hold them and the rows make 8 waves of
such blocks (:func:`configure`): a register piece is read once and written from where it
was read, with no shared-memory stores between.  The fewer a cluster's blocks, the
faster.  Neither
fewer, larger pieces (registers and shared memory together) nor a persistent grid of
clusters walking rows with the next piece in flight did better.  16-bit rows park in
shared memory below :data:`SHARED_PIECE_MAX` (their register pieces were the slower).
The figures behind each choice: docs/algorithms/cluster.md, "Measured".

Memory traffic: read N·b, write N·b (the minimum); shared memory a block: its piece,
padded as ``onchip`` pads a row (none for pieces in registers).  No persistent loop and
no cooperative launch: a grid of rows × size blocks, and the hardware schedules whole
clusters as multiprocessors free up.
Pieces of ~32 KB (8192 float32 values) in blocks of 256 threads: each thread parks 32
values, ~6 blocks share a multiprocessor (:func:`configure`); at most 8 blocks a cluster
(the portable limit), so rows up to ~2 MB; ``auto`` uses it up to 512 KB (float32 rows
of 131072), where pieces stay ≤ 64 KB, and up to 1 MB in registers.  sm_90 and newer only.
NumPy twin: :func:`numba_softmax.reference.merge_chunks` (chunks = pieces).
"""

import functools
import math
from typing import NamedTuple

import numba
import numpy as np
from numba import cuda

from ...runtime import launcher, sim
from ...combine import combine_device
from ..rows import chunk, dsmem, pairs
from ..hw import jit, vector
from . import onchip
from ..rows.epilogue import LOGSUMEXP, row_constant, SOFTMAX
from .online import stream_state, VECTORS
from ..rows.reduce import team_combine

MAX_SIZE = 8  # blocks a cluster (the portable cluster size)
PIECE_BYTES = 32 * 1024  # a block's piece, aimed at: ~6 blocks a multiprocessor
VALUES_PER_THREAD = 32  # threads = piece / this (256 for a 32 KB float32 piece)
BYTES_16 = 256  # … and piece bytes / this for 16-bit pieces (held in pairs; narrower blocks
# ran the faster: docs/algorithms/cluster.md, "Measured")
REGISTER_VPT = 32  # float32 values a thread holds when its block's piece is in registers
REGISTER_WAVES = 8  # float32 register pieces (a block a multiprocessor) where the rows
# give at least this many waves of them (the threshold: docs/algorithms/cluster.md)
SHARED_PIECE_MAX = 64 * 1024  # larger pieces go to registers where they fit (a larger
# shared-memory piece leaves one block a multiprocessor, with nothing to cover its waits)


@functools.cache
def kernel(dtype, vpt, mode, width, threads, size, in_registers=False, pack=False):
    """The cluster kernel (x, y, piece, stride).  ``pack`` (shared-memory pieces of a
    16-bit row in 16-byte vectors): the piece parked in pairs (:func:`.onchip.paired`),
    ``stride`` in 32-bit words, x and y passed as their uint16 bits."""
    acc = jit.accumulator(dtype)
    fold = stream_state(dtype, vpt, width)
    regs = in_registers and mode != LOGSUMEXP  # the piece in registers, not shared memory
    if pack and not regs and mode != LOGSUMEXP:
        keep, write_held = onchip.paired(dtype, vpt, width, threads, mode)
        raw = numba.uint32
    else:
        keep = onchip.keeper(dtype, vpt, width)
        write_held = onchip.writer(dtype, vpt, width, mode)
        raw = vector.storage_type(dtype)
    io = chunk.ops(dtype, vpt, width)
    store = jit.storer(dtype)

    # registers for full multiprocessors (32 a thread), where ptxas needs no more; a piece
    # held in registers gets 64 (1024 threads a multiprocessor)
    lean = mode != LOGSUMEXP and np.dtype(dtype).itemsize == 4 and not regs
    @jit.kernel(launch_bounds=(threads, max(1, (2048 if lean else 1024) // threads)))
    def cluster(x, y, piece, stride):
        dsmem.arrive()  # this block has started (a peer may write into it after wait())
        b = dsmem.rank(size)
        row = cuda.blockIdx.x // size
        t, T = cuda.threadIdx.x, threads
        n = x.shape[1]
        held = cuda.shared.array(0, raw)  # this block's piece of the row, on chip
        v = cuda.local.array(vpt, acc)  # … or in registers: T·VPT values (unrolled)
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        m_posted = cuda.shared.array(MAX_SIZE, acc)  # slot r: block r's (m_r, ℓ_r)
        l_posted = cuda.shared.array(MAX_SIZE, acc)
        h0 = b * piece
        h1 = min(h0 + piece, n)
        # 1. read: park the piece and fold it
        if mode == LOGSUMEXP:
            m, l = fold(x, row, h0, h1, t, T)  # nothing to keep for one number
        elif regs:
            io.load(x, row, h0, h1, t, T, v, acc(-math.inf))  # the piece is one chunk
            m, l = io.exps(v) if mode == SOFTMAX else io.state(v)  # (exps kept: :mod:`.chunk`)
        else:
            m, l = keep(x, row, h0, h1, held, stride, t, T)
        m_own = m
        m, l = team_combine(m, l, m_slots, l_slots, T)  # the block's (m_b, ℓ_b)
        dsmem.wait()  # every block of the cluster has started: its slots exist
        # 2. exchange: (m_b, ℓ_b) into slot b of every block of the cluster
        if t < size:
            dsmem.store_remote(m_posted, b, t, size, m)
            dsmem.store_remote(l_posted, b, t, size, l)
        dsmem.sync()  # every block's state is in every block's slots (and no block
        # writes into a peer after this: a block may now finish and leave)
        # 3. combine: the row's (m, ℓ), folded in the same order by every block
        m, l = m_posted[0], l_posted[0]
        for r in range(1, size):
            m, l = combine_device(m, l, m_posted[r], l_posted[r])
        c = row_constant(m, l, acc(1.0), mode)
        # 4. write from chip
        if mode == LOGSUMEXP:
            if b == 0 and t == 0:
                y[row, 0] = store(c)
        elif regs:
            if mode == SOFTMAX:
                io.rescale(v, m_own, m, c)
            else:
                io.normalise(v, m, c, mode)
            io.store(y, row, h0, h1, t, T, v)
        else:
            write_held(y, row, h0, h1, held, stride, t, T, m, c)

    return sim.cooperative(cluster)  # (the simulator runs a cluster's blocks at once)


class Plan(NamedTuple):
    """The cluster launch: clusters of ``size`` blocks of ``threads``, one a row; each
    block parks ``piece`` values, each thread's ``stride`` apart (``shared`` bytes);
    ``bits``: the arrays are passed as their uint16 bits (a piece parked in pairs)."""

    kernel: object
    size: int
    threads: int
    piece: int
    stride: int
    shared: int
    bits: bool = False


def supported(limits):
    """Whether the device of ``limits`` launches thread-block clusters (sm_90 and up)."""
    return tuple(limits.cc) >= (9, 0)


def cut(n, itemsize, unit, size=None):
    """(size, piece) for rows of n values: the fewest blocks (at most :data:`MAX_SIZE`)
    whose pieces of whole ``unit``s stay within :data:`PIECE_BYTES`, or ``size``."""
    units = -(-n // unit)
    if size is None:
        size = min(MAX_SIZE, max(1, -(-n * itemsize // PIECE_BYTES)))
    return size, -(-units // size) * unit


def threads_for(piece, itemsize, cap):
    """Threads for a piece: one per :data:`VALUES_PER_THREAD` float32-sized values, or
    :data:`BYTES_16` bytes of a 16-bit piece (a power of two, 256 … ``cap``)."""
    want = piece * itemsize // (4 * VALUES_PER_THREAD if itemsize >= 4 else BYTES_16)
    threads = 256
    while threads < min(want, cap):
        threads *= 2
    return min(threads, cap)


def register_cut(n, dtype, width, cap, threads=None, size=None, vpt=None):
    """(size, threads, vpt) that hold rows of n values in the registers of a cluster's
    blocks, at most :data:`MAX_SIZE` blocks of at most :data:`REGISTER_VPT` float32-sized
    values a thread, the fewest values a thread for its threads (a power of two): the
    most threads (the fewest blocks) among those whose threads are full, else the fewest
    threads (256 … ``cap``); each given argument is kept.  None if none does."""
    most = REGISTER_VPT * 32 // jit.accumulator(dtype).bitwidth
    cuts = []
    for t in (threads,) if threads else (256, 512, 1024):
        s = size or -(-n // (t * (vpt or most)))
        if t > cap or s > MAX_SIZE:
            continue
        v = vpt or max(width, chunk.pow2_ceil(-(-n // (s * t))))
        if v <= most and v % width == 0 and s * t * v >= n:
            cuts.append(((size or -(-n // (t * v))), t, v))
    full = [c for c in cuts if c[2] == most and vpt is None]
    return full[-1] if full else cuts[0] if cuts else None


def configure(x, y, mode, threads=None, vpt=None, shared=None, size=None, registers=None):
    """The launch: each block's piece parked in shared memory — the row cut into ``size``
    pieces (default :func:`cut`), or held in registers (``registers`` True, else
    ``ValueError``; None: float32 rows wherever :func:`register_cut` finds a cut of full
    blocks of 1024 threads and the rows give :data:`REGISTER_WAVES` waves of them, else
    where shared-memory pieces would pass :data:`SHARED_PIECE_MAX` and a cut is found;
    False: never);
    blocks of :func:`threads_for` threads (or ``threads``), at most ``shared`` bytes a
    block (default: the device's opt-in limit).  ``ValueError`` on a device without
    clusters or a row whose pieces do not fit."""
    limits = launcher.device_limits()
    if not supported(limits):
        raise ValueError(f"method='cluster' needs thread-block clusters (compute capability "
                         f"9.0 or newer); this device is {limits.cc}: use method='group'")
    if size is not None and not 1 <= size <= MAX_SIZE:
        raise ValueError(f"size must be 1 … {MAX_SIZE}; got {size}")
    rows, n = x.shape
    itemsize = x.dtype.itemsize
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    cap = limits.max_threads
    fit = register_cut(n, x.dtype, width, cap, threads, size, vpt)
    full = x.dtype == np.float32 and fit and fit[1] == 1024 and fit[2] == REGISTER_VPT
    if registers is None and not (full and rows * fit[0] >= REGISTER_WAVES * limits.sms):
        # shared memory, unless its pieces would pass SHARED_PIECE_MAX
        pieces = cut(n, itemsize, (threads or 256) * width, size)[1] * itemsize
        registers = None if pieces > SHARED_PIECE_MAX else False
    room = cap
    while registers is not False and mode != LOGSUMEXP:
        if room != cap:  # (the first pass: the cut above, made with the same arguments)
            fit = register_cut(n, x.dtype, width, room, threads, size, vpt)
        if fit is None:
            break
        k = kernel(x.dtype, fit[2], mode, width, fit[1], fit[0], True)
        limit = launcher.max_threads(k, (x, y, 1, 1))  # (its launch bounds ask for fit[1])
        if fit[1] <= limit:
            return Plan(k, fit[0], fit[1], fit[1] * fit[2], 0, 0)
        room = chunk.pow2_floor(limit)  # fewer threads, if that still holds the row
    if registers and mode != LOGSUMEXP:  # (logsumexp holds nothing: it streams its piece)
        raise ValueError(f"a row of {n} values does not fit the registers of {MAX_SIZE} "
                         f"blocks of threads {threads or cap}; use registers=None")
    vpt = max(vpt or VECTORS * vector.width_for(x.dtype), width)
    pack = mode != LOGSUMEXP and pairs.packed(x.dtype, width) and pairs.packed(y.dtype, width)
    size, piece = cut(n, itemsize, (threads or 256) * width, size)
    want = threads or threads_for(piece, itemsize, cap)
    k, threads = onchip.fit_threads(lambda t: kernel(x.dtype, vpt, mode, width, t, size, pack=pack),
                                    x, y, want, (pairs.bits(x, y) if pack else (x, y)) + (1, 1))
    size, piece = cut(n, itemsize, threads * width, size)
    if pack:  # 32-bit words of two values each
        stride = onchip.paired_stride(piece, threads, width)
        need = threads * stride * 4
    else:
        stride = onchip.stride_for(piece, threads, width)
        need = 0 if mode == LOGSUMEXP else threads * stride * itemsize
    room = limits.shared_optin - onchip.STATIC_SHARED if shared is None else shared
    if need > room:
        raise ValueError(
            f"cluster holds a row in {size} blocks' shared memory: a row of {n} values needs "
            f"{need} bytes a block, the limit is {room}; use method='group' (or 'online')")
    return Plan(k, size, threads, piece, stride, need, pack)


def launch(x, y, mode, threads=None, vpt=None, shared=None, size=None, registers=None, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    plan = configure(x, y, mode, threads, vpt, shared, size, registers)
    arrays = pairs.bits(x, y) if plan.bits else (x, y)
    launcher.launch(plan.kernel, x.shape[0] * plan.size, plan.threads, stream,
                    arrays + (plan.piece, plan.stride), shared=plan.shared, cluster=plan.size)
