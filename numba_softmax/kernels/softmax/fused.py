"""s4 — fused softmax: the row stays on chip.  One read and one write per element.

A team of T threads per row (:mod:`.chunk`), each holding VPT values in registers: the
whole row is one chunk of up to T·VPT values.  Thread t owns the vectors starting at
x[t·W], x[(t + T)·W], … (coalesced: at each step the warp reads 32 neighbouring 16-byte
vectors).  Short rows (≤ 32·VPT) get one *warp* each — several rows per block, reduced
with shuffles alone, no shared memory and no barrier; longer rows a team of several
warps, up to the whole block.

    1. load     each thread reads its VPT values once, into registers;
    2. state    each thread folds them into its own (m, ℓ): m = max, ℓ = Σ exp(x − m)
                (float32 softmax keeps each exp(x − m) in place of x);
    3. combine  the team's states fold into the row's (m, ℓ): a warp butterfly, then
                (for a team of several warps) one more across them (:mod:`.reduce`);
    4. write    each thread normalises the values it still holds: exp(x − m)/ℓ (from
                the kept exps, one multiply a value: exp(x − m_t) · exp(m_t − m)/ℓ).

Memory traffic: read N·b, write N·b bytes for N values of b bytes — the minimum, half of
the three-pass kernel's 3 reads + 1 write (4·N·b).  (Source: the CuTe kernel of the
sources, one block per row with a per-thread online state and a shared-memory tree.)
NumPy twin: :func:`numba_softmax.reference.softmax`.

Rows longer than T·VPT do not fit in registers: use ``onchip`` (shared memory too),
``group``, ``online`` or ``split``.
"""

import functools

import numpy as np
from numba import cuda

from ..rows import chunk, pairs
from ..hw import jit, vector
from ...runtime import launcher
from ..rows.epilogue import LOGSUMEXP, SOFTMAX, row_constant
from ..rows.reduce import team_combine_traced

MAX_VPT = 32  # values per thread held in registers; beyond this they would spill
WARP = 32


TRACE_LEVELS = 11  # the tree's levels in a trace: own state, 5 warp steps, 5 block steps


@functools.cache
def kernel(dtype, vpt, mode, width, team, trace=False, pack=True, registers=None):
    """The fused kernel (x, y); with ``trace`` its traced twin (x, y, tr): the same source,
    also writing every level of the block's tree to tr (TRACE_LEVELS, threads, 2).
    ``pack``: float16 / bfloat16 rows held two values a register (:func:`.chunk.held`;
    the arrays are then passed as their uint16 bits, :func:`configure`).  ``registers``:
    the cap of a float32 softmax kernel (default :data:`REGISTERS`; :data:`WIDE`)."""
    acc = jit.accumulator(dtype)
    hd = chunk.held(dtype, vpt, width, team, pack)
    slots, slot = hd.slots, hd.slot  # (compile-time constants for the register array)
    paired = pack and pairs.packed(dtype, width)
    keep = mode == SOFTMAX and np.dtype(dtype) == np.float32  # exps kept: see below
    keep_pairs = mode == SOFTMAX and paired  # 16-bit pairs' exps kept in float32
    options = compile_options(keep or keep_pairs, paired, registers)
    store = jit.storer(dtype)
    io = chunk.ops(dtype, vpt, width, whole=False)  # (the team is a constant: see fused_rows)
    kept = vpt if keep_pairs else 1  # float32 exps beside the pairs (1: none, compiled away)

    # float32 softmax keeps exp(v − m_t) in place of v (m_t: the thread's own max), so the
    # write is one multiply a value — one exp a value, not two (log-softmax and logsumexp
    # need no exps kept): the second exp would cost a special-function instruction a value
    # on the path of a kernel that is otherwise bound by memory.  16-bit values held in
    # pairs keep theirs too, in a float32 array e: the pairs die as e fills, so e takes the
    # registers the float32 row would (ptxas: no more registers, no spills, a third fewer
    # MUFU than with the second exp).  Measured: docs/algorithms/fused.md, "Float32: the
    # exps kept in place".
    if keep:
        @jit.device
        def thread_state(h, e):
            return io.exps(h)

        @jit.device
        def write(h, e, y, row, n, t, m_t, m, c):
            io.rescale(h, m_t, m, c)  # exp(v − m)/ℓ = exp(v − m_t) · exp(m_t − m)/ℓ
            io.store(y, row, 0, n, t, team, h)
    elif keep_pairs:
        @jit.device
        def thread_state(h, e):
            return hd.exps(h, e)

        @jit.device
        def write(h, e, y, row, n, t, m_t, m, c):
            hd.rescale(e, y, row, 0, n, t, m_t, m, c)  # the same, from e, packed to store
    else:
        @jit.device
        def thread_state(h, e):
            return hd.state(h)

        @jit.device
        def write(h, e, y, row, n, t, m_t, m, c):
            hd.write(h, y, row, 0, n, t, m, c, mode)  # exp(v − m)/ℓ, the exp taken again

    @jit.device
    def fused_rows(x, y, tr):
        # team: a compile-time constant here (unlike the streaming kernels): every vector
        # address is then a constant offset, which saves ~14 registers a thread — and
        # registers are where this kernel keeps the row.
        row, t, n = chunk.team_row(x, team)
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        h = cuda.local.array(slots, slot)  # this thread's values as stored, in registers
        e = cuda.local.array(kept, acc)  # their exps, where pairs keep them

        hd.load(x, row, 0, n, t, h)  # 1. load: the row is one chunk
        m_t, l = thread_state(h, e)  # 2. this thread's state: its max, then Σ exp(v − max)
        m, l = team_combine_traced(m_t, l, m_slots, l_slots, team, tr)  # 3. the row's state
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if t == 0 and row < x.shape[0]:
                y[row, 0] = store(c)
            return
        write(h, e, y, row, n, t, m_t, m, c)  # 4. exp(v − m)/ℓ from registers, written once

    if trace:
        @jit.kernel
        def fused_traced(x, y, tr):
            fused_rows(x, y, tr)

        return fused_traced

    @jit.kernel(**options)
    def fused(x, y):
        fused_rows(x, y, None)  # None: the trace writes are compiled away

    return fused


REGISTERS = 64
"""Registers a thread of a kernel holding its values in pairs or its float32 exps: 1024
threads a multiprocessor, whatever the team.  (Left alone, ptxas gives a float16 row held
in pairs at 512 × 32 more registers than that — one block a multiprocessor, half the
bytes in flight; held to fewer, so that three blocks fit, it spills.)  The cap is
``max_registers``, not launch bounds: bounds of 448 threads × 2 blocks allow 72
registers, with which ptxas spilled 76 bytes where 64 spill none.  Measured:
docs/algorithms/fused.md, "Measured"."""


WIDE = ((4096, 8, 32), (12288, 16, 40))
"""Float32 softmax rows longer than 2048 values: (longest row, values a thread, registers).
Up to 12288 values, a row that is a power of two long or not a whole number of 1024-value
pieces gets a wider team than :func:`default_team`'s (8 or 16 values a thread, not 32),
held to fewer registers, so that a multiprocessor keeps more warps resident.  Rows of
whole 1024-value pieces other than a power of two lost by it, so they keep the default
team.  The
measurements and the ``ncu`` profile behind them: ``docs/algorithms/fused.md``, "Wide
float32 teams"."""


def compile_options(keep, pack, registers=None):
    """``cuda.jit`` options of the kernel: ``registers`` (default :data:`REGISTERS`) where
    it holds kept exps or pairs, else none (ptxas chooses)."""
    return dict(max_registers=registers or REGISTERS) if keep or pack else {}


def wide_team(n, dtype, mode):
    """(team, registers) of :data:`WIDE` for a float32 softmax row of n values, or None."""
    if mode != SOFTMAX or np.dtype(dtype) != np.float32 or n <= 2048:
        return None
    if n % 1024 == 0 and n & (n - 1):  # whole pieces, not a power of two: the default's
        return None
    for longest, vpt, registers in WIDE:
        if n <= longest:
            return WARP * -(-n // (WARP * vpt)), registers
    return None


def configure(x, y, mode, threads=None, vpt=None, rows_per_block=None, max_threads=None,
              pack=None):
    """The launch: ``threads`` per row (a team; default: the smallest whole number of
    warps that holds the row at :func:`max_vpt` values a thread — a warp up to 1024
    float32 values, :func:`default_team`; most float32 softmax rows of 2049 … 12288 values
    a wider team held to fewer registers, :func:`wide_team`, where the device takes it), the
    fewest values per thread that hold the row, ``rows_per_block`` teams per block
    (default: one, so a block is one team).  The team never exceeds the compiled kernel's own limit
    (:func:`.launcher.max_threads`), capped by ``max_threads``; a row that does not fit
    raises ``ValueError``.  ``pack`` (default: where :func:`.pairs.packed`; False: never):
    float16 / bfloat16 held two to a register, the same values a thread in half the
    registers (:data:`REGISTERS`).  (A warp a row runs in blocks of one warp, which the
    multiprocessor packs more tightly than blocks of four; a team holds as many values a
    thread as it can, so the fewest threads hold a row: docs/algorithms/fused.md,
    "Measured".)"""
    rows, n = x.shape
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    pack = pairs.packed(x.dtype, width) and pack is not False
    cap = (max_threads or 1024) // WARP * WARP
    team = min(threads or default_team(n, x.dtype), cap)
    wide = None if threads or vpt else wide_team(n, x.dtype, mode)
    registers = None
    if wide is not None and wide[0] <= cap:
        team, registers = wide
    while True:
        fit = max(vpt or fit_vpt(n, team, x.dtype), width)
        if team * fit < n or fit % width or fit > max_vpt(team, x.dtype):
            raise ValueError(
                f"fused keeps a row on chip: at most threads·vpt = {team}·{fit} = "
                f"{team * fit} values, got a row of {n}; use method='onchip', 'group', "
                f"'online' or 'split'"
            )
        k = kernel(x.dtype, fit, mode, width, team, pack=pack, registers=registers)
        args = (x, y) if not pack else pairs.bits(x, y) if mode != LOGSUMEXP else (pairs.bits(x)[0], y)
        limit = min(cap, launcher.max_threads(k, args)) // WARP * WARP  # (whole warps)
        if team <= limit:
            break
        if registers is not None:  # a wide team the device does not take: the default's
            team, registers = min(default_team(n, x.dtype), cap), None
            continue
        team = limit  # the kernel's registers allow fewer threads: more values each
    per_block = rows_per_block or 1
    block = team * min(per_block, max(1, limit // team))
    k = kernel(x.dtype, fit, mode, width, team, pack=pack, registers=registers)
    return chunk.TeamPlan(k, -(-rows // (block // team)), block, team, args)


def launch(x, y, mode, threads=None, vpt=None, stream=0, rows_per_block=None, max_threads=None,
           pack=None):
    """Run on (rows, n) device arrays; ``y`` is (rows, n), or (rows, 1) for logsumexp
    (arguments as :func:`configure`)."""
    chunk.run(configure(x, y, mode, threads, vpt, rows_per_block, max_threads, pack), stream)


def max_vpt(threads, dtype=np.float32):
    """Values one thread may hold: ``MAX_VPT`` (half as many float64), or half of that in
    a team of more than 512 threads, where the register file (64K per multiprocessor)
    leaves each thread 64 registers.  (16-bit values held in pairs take half the
    registers, but 64 a thread spill: docs/algorithms/fused.md, "16-bit rows".)"""
    most = MAX_VPT * 32 // jit.accumulator(dtype).bitwidth
    return most if threads <= 512 else most // 2


def max_row(max_threads, dtype=np.float32):
    """The longest row the fused kernel takes with teams of at most ``max_threads``."""
    return max(t * max_vpt(t, dtype) for t in (32, 64, 128, 256, 512, 1024) if t <= max_threads)


def default_team(n, dtype=np.float32, exact=True):
    """The smallest team that holds a row of n values at :func:`max_vpt` values a thread:
    a whole number of warps up to 512 threads (``exact``), else a power of two (32 …
    1024).  The fewer threads hold a row, the more rows a multiprocessor holds at once
    (:func:`fill`): 10240 float32 values take 320 threads × 32, three blocks a
    multiprocessor, where 512 × 32 (62.5 % of the slots used) fit two."""
    most = max_vpt(WARP, dtype)
    team = WARP * max(1, -(-n // (WARP * most)))
    if exact and team <= 512:
        return team
    team = WARP
    while team < 1024 and team * max_vpt(team, dtype) < n:
        team *= 2
    return team


def fill(n, dtype=np.float32):
    """The share of the values a multiprocessor could hold in registers that rows of n
    values fill in teams of :func:`default_team`: blocks a multiprocessor (1024 threads at 64
    registers, :data:`REGISTERS`) × n, over 1024 × :func:`max_vpt`.  A memory-bound
    kernel's rate follows the bytes a multiprocessor has in flight, which ``auto``
    (:func:`.methods.choose`) reads from this: 16384 float32 values (2 blocks of 512)
    fill 100 %, 14336 (2 of 448) 87.5 %, 12288 (2 of 384) 75 %, 10240 (3 of 320)
    93.75 %."""
    team = default_team(n, dtype)
    return max(1, 1024 // team) * n / (1024 * max_vpt(WARP, dtype))


def fit_vpt(n, threads, dtype=np.float32):
    """The smallest power-of-two values-per-thread that holds a row of n; ValueError if
    even :func:`max_vpt` does not."""
    most = max_vpt(threads, dtype)
    vpt = 1
    while threads * vpt < n and vpt < most:
        vpt *= 2
    if threads * vpt < n:
        raise ValueError(
            f"a row of {n} values does not fit on chip (at most {threads}·{most} = "
            f"{threads * most} with {threads} threads); use method='onchip', "
            f"'group', 'online' or 'split'"
        )
    return vpt
