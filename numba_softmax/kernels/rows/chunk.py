"""A chunk of a row: the values one team of threads holds in registers at a time.

Every softmax kernel here walks its rows the same way.  A *team* of ``team`` threads
(a warp, several warps, or the whole block — a multiple of 32 that divides the block)
works on one row; a block of T threads holds T / team teams, so short rows get several
to a block and long rows a block each.  The team reads the row in *chunks* of
team·VPT values; thread t of the team holds VPT of them, as VPT/W vectors of W::

    vector i of thread t  =  x[row, base + (t + i·team)·W  …  + W)      i < VPT/W

so at every step the team's threads read neighbouring 16-byte vectors (coalesced), and
all of a thread's loads are issued before any value is used (the memory system sees
them at once).  Places past the row's end hold a pad (−inf: weight 0).  A chunk that
lies inside the row — every chunk but a row's last — is tested once, not once a
vector, and its vectors' addresses are one address plus multiples of team·W
(:mod:`.vector_chunk`): in 16 bits these kernels had been paying more in addressing
than in arithmetic (``docs/algorithms/online.md``, *What 16-bit rows cost*).

:func:`ops` gives the device functions built on that layout — load a chunk, its
state (max, then Σ exp(v − max): one ``exp`` per value, no re-basing inside a thread),
normalise it in registers, store it — and :func:`team_row` says which row and place
a thread has.  A kernel that keeps its chunk in registers until the row's (m, ℓ) is known
may take the state with ``exps`` instead, which leaves exp(v − m_own) in place of each
value, and write softmax with ``rescale``: one multiply a value by exp(m_own − m)/ℓ
instead of a second ``exp`` (the cluster's register pieces gained by it:
docs/algorithms/cluster.md, "Measured").  :func:`held` is the same for a chunk kept as
stored — float16 and bfloat16 two to a register — which the fused kernel holds.
"""

import functools
import math
from typing import NamedTuple

from numba import cuda

from ..hw import jit, vector
from ...runtime import launcher
from . import pairs, vector_chunk
from .epilogue import base, element
from ..hw.ptx import nan_max


class Ops(NamedTuple):
    load: object  # load(x, row, base, stop, t, team, v, pad)
    state: object  # state(v) -> (max, Σ exp(v − max))
    normalise: object  # normalise(v, m, c, mode): v[i] = output(v[i])
    store: object  # store(y, row, base, stop, t, team, v)
    exps: object  # exps(v) -> state(v), leaving v[i] = exp(v[i] − max)
    rescale: object  # rescale(v, m_own, m, c): softmax from exps(v)


@functools.cache
def ops(dtype, vpt, width, whole=True):
    """The chunk device functions for ``dtype`` rows, VPT values per thread, W per vector.
    A chunk inside the row is tested once either way.  ``whole`` (default) then addresses
    its vectors from one address (:mod:`.vector_chunk`); False addresses each vector on
    its own — for a kernel whose team is a compile-time constant (:mod:`.fused`), where
    each vector's address is already a constant offset from the first."""
    acc = jit.accumulator(dtype)
    load_row, store_row = vector.row_io(width, dtype)
    whole_load, whole_store = vector_chunk.converted(width, dtype, vpt)
    vector_load, vector_store = vector.whole_io(width, dtype)

    @jit.device
    def vectors(x, row, j, step, v):  # (a constant team: each vector a constant offset)
        for i in range(vpt // width):
            vector_load(x, row, j + i * step, v, i * width)

    # load(x, row, base, stop, t, team, v, pad): one test a whole chunk, every load, then
    # the values
    load = vector_chunk.chunked(load_row, whole_load if whole else vectors, vpt, width)

    @jit.device
    def state(v):
        m = acc(-math.inf)
        for i in range(vpt):
            m = nan_max(m, v[i])  # a NaN is kept (one max.NaN instruction for float32)
        b = base(m, acc(0.0))
        l = acc(0.0)
        for i in range(vpt):
            l += math.exp(v[i] - b)  # against the chunk's own max: one exp per value
        return m, l

    @jit.device
    def normalise(v, m, c, mode):
        b = base(m, acc(0.0))  # one test a chunk, not one a value
        for i in range(vpt):
            v[i] = element(v[i], b, c, mode)

    @jit.device
    def store(y, row, base, stop, t, team, v):
        if base + team * vpt <= stop:
            if whole:
                whole_store(y, row, base + t * width, team * width, v)
            else:
                for i in range(vpt // width):
                    vector_store(y, row, base + (t + i * team) * width, v, i * width)
        else:
            for i in range(vpt // width):
                store_row(y, row, base + (t + i * team) * width, stop, v, i * width)

    @jit.device
    def exps(v):
        m = acc(-math.inf)
        for i in range(vpt):
            m = nan_max(m, v[i])
        b = base(m, acc(0.0))
        l = acc(0.0)
        for i in range(vpt):
            v[i] = math.exp(v[i] - b)  # kept: the output is this times one factor
            l += v[i]
        return m, l

    @jit.device
    def rescale(v, m_own, m, c):
        # exp(x − m)/ℓ = exp(x − m_own) · exp(m_own − m) · (1/ℓ): one multiply a value.
        # m_own = −inf (every value −inf) gives 0 (NaN for a row of −inf: c = inf)
        f = math.exp(m_own - base(m, acc(0.0))) * c
        for i in range(vpt):
            v[i] *= f

    return Ops(load, state, normalise, store, exps, rescale)


class Held(NamedTuple):
    slot: object  # numba type of the register array h (uint32 words: two 16-bit values)
    slots: int  # its length for VPT values
    load: object  # load(x, row, base, stop, t, h): the chunk as stored, −inf past stop
    state: object  # state(h) -> (max, Σ exp(v − max))
    write: object  # write(h, y, row, base, stop, t, m, c, mode): the outputs, stored
    exps: object  # exps(h, e) -> state(h), leaving e[i] = exp(v_i − max) in float32
    rescale: object  # rescale(e, y, row, base, stop, t, m_own, m, c): softmax from exps


@functools.cache
def held(dtype, vpt, width, team, pack=True):
    """:func:`ops` for a chunk held *as stored* (:mod:`.pairs`): float16 and bfloat16 two to
    a 32-bit register where the row takes 16-byte vectors, so that a thread holds as many
    bytes of a 16-bit row as of a float32 one in the same registers; other types one value
    a slot, as :func:`ops` holds them.  Each value is converted where it is used: once
    for the max, once for the sum, once for the output — two ``exp`` a value; or, with
    ``exps`` and ``rescale``, the sum's exps kept in a float32 array for the output (one
    ``exp`` a value, in the registers the pairs give up as it fills)."""
    acc = jit.accumulator(dtype)
    slot, slots, hold, get, put, give, renew = pairs.holder(dtype, vpt, width, team, pack,
                                                            -math.inf, one_test=True)

    @jit.device
    def state(h):
        m = acc(-math.inf)
        for i in range(vpt):
            m = nan_max(m, get(h, i))
        renew(h)  # unpack afresh for the sum (pairs.py: else every value stays unpacked)
        b = base(m, acc(0.0))
        s = acc(0.0)
        for i in range(vpt):
            s += math.exp(get(h, i) - b)
        return m, s

    @jit.device
    def write(h, y, row, base_, stop, t, m, c, mode):
        renew(h)  # (the team's reduction lay between: unpack afresh)
        out = cuda.local.array(slots, slot)
        b = base(m, acc(0.0))
        for i in range(vpt):  # (a word of h dies as its second value is read)
            put(out, i, element(get(h, i), b, c, mode))
        give(out, y, row, base_, stop, t)

    @jit.device
    def exps(h, e):
        m = acc(-math.inf)
        for i in range(vpt):
            m = nan_max(m, get(h, i))
        renew(h)
        b = base(m, acc(0.0))
        s = acc(0.0)
        for i in range(vpt):  # (a word of h dies as its second value is read)
            e[i] = math.exp(get(h, i) - b)  # kept: the output is this times one factor
            s += e[i]
        return m, s

    @jit.device
    def rescale(e, y, row, base_, stop, t, m_own, m, c):
        # as ops' rescale: exp(v − m)/ℓ = exp(v − m_own) · exp(m_own − m)/ℓ
        f = math.exp(m_own - base(m, acc(0.0))) * c
        out = cuda.local.array(slots, slot)
        for i in range(vpt):
            put(out, i, e[i] * f)
        give(out, y, row, base_, stop, t)

    return Held(slot, slots, hold, state, write, exps, rescale)


@jit.device
def team_row(x, team):
    """(row, t, n) of the calling thread: its team's row, its place in the team, and the
    row's length — 0 for a team past the last row, which then reads and writes nothing
    but still meets its block at every barrier."""
    # (unsigned 32-bit: Numba's int64 ``//`` and ``%`` carry Python's sign fix-ups)
    per_block = jit.udivmod(cuda.blockDim.x, team)[0]
    team_in_block, t = jit.udivmod(cuda.threadIdx.x, team)
    row = cuda.blockIdx.x * per_block + team_in_block
    n = x.shape[1] if row < x.shape[0] else 0
    return row, t, n


class TeamPlan(NamedTuple):
    """A team kernel's launch: ``kernel[grid, block](*args)``, ``team`` threads per row."""

    kernel: object
    grid: int
    block: int
    team: int
    args: tuple


def pow2_floor(n):
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def pow2_ceil(n):
    p = 1
    while p < n:
        p *= 2
    return p


def team_plan(make, x, y, mode, vpt, threads=None, min_block=128, chunks=1):
    """The launch of ``make(dtype, vpt, mode, width)`` — a kernel taking (x, y, team) —
    on (rows, n) arrays: a team as wide as covers the row in ``chunks`` chunks, 32 to the
    block limit, and blocks of at least ``min_block`` threads (several teams each).  The
    block limit is the compiled kernel's own (:func:`.launcher.max_threads`: its
    registers decide), capped by ``threads``, and rounded down to a power of two so that
    teams divide blocks."""
    from .epilogue import LOGSUMEXP

    rows, n = x.shape
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    vpt = max(vpt, width)
    if vpt % width:
        raise ValueError(f"values per thread must be whole {width}-value vectors; got {vpt}")
    k = make(x.dtype, vpt, mode, width)
    args = (x, y, 0)
    limit = launcher.max_threads(k, args)
    if threads is not None:
        limit = min(limit, threads)
    limit = pow2_floor(limit)
    if limit < 32:
        raise ValueError(f"{k.__name__}: a block must hold at least one warp; got {limit} threads")
    team = min(max(32, pow2_ceil(-(-n // (chunks * vpt)))), limit)
    block = min(max(team, min_block), limit)
    grid = max(1, -(-rows // (block // team)))
    return TeamPlan(k, grid, block, team, (x, y, team))


def fills_device(x):
    """Whether x has a row for every multiprocessor: a launch may then give each row a
    narrower team (more rows to a block) without leaving multiprocessors idle."""
    return x.shape[0] >= launcher.device_limits().sms


def run(plan, stream=0):
    """Launch a :class:`TeamPlan` (through the one launcher)."""
    launcher.launch(plan.kernel, plan.grid, plan.block, stream, plan.args)
