"""s7 — a row held on chip by a group of blocks: rows too long for one multiprocessor.

A row of 1M float32 values is 4 MB; one multiprocessor holds at most ~227 KB.  Cut the
row into ``size`` pieces and give each to a block of a *group* that keeps its piece in
shared memory, as s6 (:mod:`.onchip`) keeps a whole row:

    1. read     block b of the group reads its piece, folds it into (m_b, ℓ_b) and parks
                it in shared memory — then streams its share of whatever does not fit
                on chip (``spill``), folding it too;
    2. exchange thread 0 posts (m_b, ℓ_b) in a small workspace and the group meets at a
                barrier (:func:`.sync.group_barrier`: a counter in global memory);
    3. combine  every block folds the group's ``size`` posted states with the combiner:
                the row's (m, ℓ), the same in every block (any order, any tree);
    4. write    each block normalises its spilled share (re-read: it was read last, so
                the likeliest still in L2) and then its parked piece, from chip.

The grid is *persistent*: exactly as many blocks as fit on the device at once, in groups
of ``size``; group g takes rows g, g + groups, …, and its blocks never leave.  A block
waits only for the blocks of its own group, so different groups run out of step and the
memory system always has work.  Waiting for other blocks is safe only if they are all
running: the kernel is a cooperative launch (it calls ``cuda.cg.this_grid()``), which
the driver refuses unless every block fits at once — never a hang.

Memory traffic: read N·b, write N·b while the row fits in the group's shared memory
(``size`` × a quarter of a multiprocessor's shared memory, four blocks a multiprocessor:
the whole chip holds tens of MB);
beyond that read the spilled part
twice (``spill``·size·b more, less what the re-read finds in L2), plus 8·size² bytes of
workspace per row.  The docs chapter draws the exchange.
NumPy twin: :func:`numba_softmax.reference.merge_chunks` (chunks = pieces).
"""

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda

from ...runtime import launcher, sim
from ...combine import combine_device
from ..hw import jit, vector
from . import onchip, split
from ..rows.epilogue import LOGSUMEXP, row_constant
from .online import normalise_range, stream_state, VECTORS
from ..rows.reduce import team_combine
from ..rows.sync import group_barrier

THREADS = 256  # threads per block
BLOCKS_PER_SM = 4  # ptxas keeps the kernel to 64 registers a thread for this


@functools.cache
def kernel(dtype, vpt, mode, width, threads, spills=True):
    acc = jit.accumulator(dtype)
    fold = stream_state(dtype, vpt, width)
    write = normalise_range(dtype, vpt, width, mode)
    keep = onchip.keeper(dtype, vpt, width)
    write_held = onchip.writer(dtype, vpt, width, mode)
    fold_posted = split.posted_folder(dtype)
    store = jit.storer(dtype)
    raw = vector.storage_type(dtype)

    @jit.kernel(launch_bounds=(threads, BLOCKS_PER_SM))  # registers for four blocks an SM
    def group(x, y, size, piece, spill, stride, m_ws, l_ws, counters):
        cuda.cg.this_grid()  # a cooperative launch: every block resident, or no launch
        groups = cuda.gridDim.x // size
        g, b = cuda.blockIdx.x // size, cuda.blockIdx.x % size  # group g, its block b
        t, T = cuda.threadIdx.x, threads
        n = x.shape[1]
        held = cuda.shared.array(0, raw)  # this block's piece of the row, on chip
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        h0 = b * piece  # held: x[row, h0:h1]; spilled: x[row, s0:s1]
        h1 = min(h0 + piece, n)
        s0 = size * piece + b * spill
        s1 = min(s0 + spill, n)
        it, row = 0, g
        while row < x.shape[0]:
            # 1. read: the piece kept on chip, then the spilled share streamed
            if mode == LOGSUMEXP:
                m, l = fold(x, row, h0, h1, t, T)  # nothing to keep for one number
            else:
                m, l = keep(x, row, h0, h1, held, stride, t, T)
            if spills:  # (compile-time: a row that fits on chip skips this code)
                m_s, l_s = fold(x, row, s0, s1, t, T)
                m, l = combine_device(m, l, m_s, l_s)
            m, l = team_combine(m, l, m_slots, l_slots, T)  # the block's (m_b, ℓ_b)
            # 2. exchange: post (m_b, ℓ_b), meet the group.  Two alternating sets of
            # slots: a block may post row k + 1's state while a slower one still reads
            # row k's, but not row k + 2's before everyone has passed barrier k + 1.
            slot = (it % 2) * groups + g
            if t == 0:
                m_ws[slot, b] = m
                l_ws[slot, b] = l
            group_barrier(counters, g, size)
            # 3. combine: the row's (m, ℓ) from the group's posted states
            m, l = fold_posted(m_ws, l_ws, slot, size, t, T, m_slots, l_slots)
            c = row_constant(m, l, acc(1.0), mode)
            if mode == LOGSUMEXP:
                if b == 0 and t == 0:
                    y[row, 0] = store(c)
            else:
                # 4. write: the spilled share first (likeliest in L2), then from chip
                if spills:
                    write(x, y, row, s0, s1, t, T, m, c)
                write_held(y, row, h0, h1, held, stride, t, T, m, c)
            it += 1
            row += groups

    return sim.cooperative(group)


class Plan(NamedTuple):
    """The group launch: ``groups`` groups of ``size`` blocks of ``threads``; each block
    parks ``piece`` values (``shared`` bytes, each thread's ``stride`` apart) and
    streams ``spill`` more."""

    kernel: object
    size: int
    groups: int
    threads: int
    piece: int
    spill: int
    stride: int
    shared: int


def split_row(rows, n, unit, capacity, blocks):
    """(size, groups, piece, spill) for rows of n values: each block parks ``piece``
    values (a multiple of ``unit``, at most ``capacity``) and streams ``spill`` more;
    ``blocks`` can run at once.  Pure arithmetic, so the tests can check it.

    Picks the group size that the simplest cost model says is quickest: the grid runs
    ``⌈rows / groups⌉`` waves, in each of which a block moves its piece twice (read,
    write) and its spill three times (read, re-read, write), and the few-blocks-per-row
    end prefers the smaller group (fewer states to exchange) on a tie.
    """
    units = -(-n // unit)  # the row in whole vectors-per-thread
    cap_units = capacity // unit
    if cap_units < 1 or blocks < 1:
        raise ValueError(f"a block must hold at least {unit} values; capacity {capacity}")
    smallest = -(-units // cap_units)  # the fewest blocks that hold the row on chip
    best = None
    for size in range(min(smallest, blocks), min(blocks, max(smallest, units)) + 1):
        groups = min(blocks // size, rows)
        held = min(cap_units, -(-units // size))
        spilled = -(-max(0, units - size * held) // size)
        cost = -(-rows // groups) * (2 * held + 3 * spilled)
        if best is None or cost < best[0]:
            best = (cost, size, groups, held, spilled)
    _, size, groups, held, spilled = best
    return size, groups, held * unit, spilled * unit


def counters(size, groups, stream):
    """The groups' barrier counters: one set per stream and group size, zeros when made and
    never reset (:mod:`.sync`: each only ever holds multiples of its group's size between
    launches); a :func:`.launcher.workspace`."""
    return launcher.workspace(f"group counters {size}", max(groups, 64), np.int64, stream,
                              zeroed=True)


def configure(x, y, mode, threads=None, vpt=None, shared=None, blocks=None, stream=0):
    """The launch: blocks of ``THREADS`` (fewer if the compiled kernel cannot launch that
    many, or ``threads`` asks for fewer), ``BLOCKS_PER_SM`` on each multiprocessor, each
    with its share of the shared memory (``shared`` caps it: the tests shrink it);
    ``blocks`` caps how many run at once (default: as many as the device holds,
    :func:`.launcher.max_cooperative_blocks`)."""
    rows, n = x.shape
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    vpt = max(vpt or VECTORS * vector.width_for(x.dtype), width)
    m_ws, l_ws = split.workspace(1, 1, split.workspace_dtype(x.dtype), stream)
    args = (x, y, 1, 1, 1, 1, m_ws, l_ws, counters(1, 1, stream))  # typed as at launch
    k, threads = onchip.fit_threads(lambda t: kernel(x.dtype, vpt, mode, width, t), x, y,
                                    threads or THREADS, args)
    itemsize = x.dtype.itemsize
    unit = threads * width  # a vector for every thread
    capacity, resident = _capacity(k, args, threads, itemsize, unit, shared, blocks)
    size, groups, piece, spill = split_row(rows, n, unit, capacity, resident)
    if not spill:  # the row fits on chip: the kernel without the streaming code
        k = kernel(x.dtype, vpt, mode, width, threads, spills=False)
    stride = onchip.stride_for(piece, threads, width)
    need = 0 if mode == LOGSUMEXP else threads * stride * itemsize
    return Plan(k, size, groups, threads, piece, spill, stride, need)


def held_per_row(rows, n, itemsize, limits):
    """Values of a row the group holds on chip on ``limits``' device with the default
    launch (``THREADS`` threads, 16-byte vectors, ``BLOCKS_PER_SM`` blocks on every
    multiprocessor): the traffic model's arithmetic, no kernel needed."""
    unit = THREADS * (16 // itemsize)
    cap = (min(limits.shared_optin, limits.shared_per_sm // BLOCKS_PER_SM) - onchip.STATIC_SHARED)
    values = (cap // itemsize - 2 * THREADS) // unit * unit
    size, _, piece, _ = split_row(rows, n, unit, values, BLOCKS_PER_SM * limits.sms)
    return min(n, size * piece)


def _capacity(k, args, threads, itemsize, unit, shared, blocks):
    """(values a block may park, blocks resident at once): with ``BLOCKS_PER_SM`` blocks
    sharing each multiprocessor's shared memory (or, if that many do not fit, one)."""
    limits = launcher.device_limits()
    for per_sm in (BLOCKS_PER_SM, 1):
        cap = min(limits.shared_optin, limits.shared_per_sm // per_sm) - onchip.STATIC_SHARED
        if shared is not None:
            cap = min(cap, shared)
        values = (cap // itemsize - 2 * threads) // unit * unit  # less the padding
        if values < unit:
            continue
        stride = onchip.stride_for(values, threads, unit // threads)
        resident = launcher.max_cooperative_blocks(k, args, threads, threads * stride * itemsize)
        if blocks is not None:
            resident = min(resident, blocks)
        if resident >= per_sm * limits.sms or (per_sm == 1 and resident >= 1):
            return values, resident
    raise ValueError(f"{k.__name__}: no block of {threads} threads fits on this device")


def launch(x, y, mode, threads=None, vpt=None, shared=None, blocks=None, stream=0):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp."""
    plan = configure(x, y, mode, threads, vpt, shared, blocks, stream)
    m_ws, l_ws = split.workspace(2 * plan.groups, plan.size, split.workspace_dtype(x.dtype), stream)
    args = (x, y, plan.size, plan.piece, plan.spill, plan.stride, m_ws, l_ws,
            counters(plan.size, plan.groups, stream))
    launcher.launch(plan.kernel, plan.size * plan.groups, plan.threads, stream, args,
                    shared=plan.shared)
