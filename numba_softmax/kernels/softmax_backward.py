"""Softmax and log_softmax backward: dx from the forward's output y and the gradient dy.

    softmax      dx = y ∘ (dy − c),        c = Σ_j y_j·dy_j     (Jacobian diag(y) − y yᵀ)
    log_softmax  dx = dy − exp(y) ∘ c,     c = Σ_j dy_j         (exp(y) = p; Jacobian I − 1 pᵀ)

Like the forward, each row needs one reduction before any output is written — but here it
is a *plain sum*, with no running max.  The forward needs m because it exponentiates
unbounded logits (e^x overflows for x ≳ 89 in float32) and so keeps every partial sum
relative to the largest value seen, re-basing it when a larger one comes.  The backward
sums products of values the forward already normalised: 0 <= y <= 1 (softmax) and
0 <= exp(y) <= 1 (log_softmax), times finite gradients; nothing can overflow that dy
itself does not, so there is nothing to re-base.  In the combiner's terms every state has
the same m = 0, its weights are exp(0) = 1, and combine((0, a), (0, b)) = (0, a + b): the
block reduction below is the very warp/block combine of :mod:`.reduce`, fed m = 0.

Three forms, picked by :func:`plan` (the launch configuration):

    one pass   the row fits on chip: T threads hold VPT values of y *and* dy each in
               registers (a warp per row for short rows, several rows to a block; a block
               per row up to T·VPT values).  Read y, dy once, write dx once: 3·N·b bytes,
               the minimum.
    two pass   the row does not fit: pass 1 streams it for c (reading dy, and y for
               softmax), pass 2 re-reads y and dy and writes dx — walking the chunks in
               *reverse*, so the chunks pass 1 read last, still in L2, are re-read first.
               At most 5·N·b bytes from DRAM for softmax, 4·N·b for log_softmax.
    split      few long rows: S blocks per row, each sums its piece into a workspace
               (rows × S), then a second kernel adds the S partials and writes its piece.

Storage types: float16, bfloat16 (uint16 bits), float32, float64; values are loaded into a
raw local array of the storage type (16-byte vectors from :mod:`.vector` where aligned)
and converted with :func:`.jit.loader` — accumulation in float32 (float64 for float64).
NumPy twins: :func:`numba_softmax.reference.softmax_backward`, ``log_softmax_backward``.
"""

import functools
import math
from typing import NamedTuple

import numba
import numpy as np
from numba import cuda

from . import jit, launcher, vector
from .launcher import scratch
from .epilogue import SOFTMAX
from .fused import _pow2_at_least
from .jit import accumulator
from .reduce import block_combine, warp_combine

MAX_VPT = 16  # values of *each* tensor a thread holds in one pass (two tensors: 32 registers)
CHUNK_VPT = 8  # values per thread per chunk in the two-pass and split forms


@jit.device
def term(y, dy, mode):
    """What the row sums: y·dy (softmax) or dy (log_softmax)."""
    return y * dy if mode == SOFTMAX else dy


@jit.device
def grad(y, dy, c, mode):
    """dx for one value, given the row's sum c."""
    if mode == SOFTMAX:
        return y * (dy - c)
    return dy - math.exp(y) * c  # y = −inf (p = 0) gives dx = dy


def _raw(dtype):
    return numba.from_dtype(np.dtype(dtype))  # uint16 for bfloat16 bits


@functools.cache
def io(dtype, vpt, width, row_threads):
    """Device functions ``load(a, row, base, stop, t, v)`` — thread t's VPT values of row
    ``row`` from column ``base`` on (W at a time, coalesced, 0 past ``stop``) into ``v``
    in the accumulator type — and ``store(v, a, row, base, stop, t)``, its inverse."""
    raw_t = _raw(dtype)
    load_row, store_row = vector.row_io(width)
    to_acc, to_raw = jit.loader(dtype), jit.storer(dtype)

    @jit.device
    def load(a, row, base, stop, t, v):
        raw = cuda.local.array(vpt, raw_t)
        for i in range(vpt // width):  # all vector loads issued before any value is used
            load_row(a, row, base + (t + i * row_threads) * width, stop, raw, i * width, raw_t(0))
        for i in range(vpt):
            v[i] = to_acc(raw[i])

    @jit.device
    def store(v, a, row, base, stop, t):
        raw = cuda.local.array(vpt, raw_t)
        for i in range(vpt):
            raw[i] = to_raw(v[i])
        for i in range(vpt // width):
            store_row(a, row, base + (t + i * row_threads) * width, stop, raw, i * width)

    return load, store


# --- one pass: the row on chip ------------------------------------------------------------
@functools.cache
def one_pass(dtype, mode, threads, vpt, row_threads, width):
    """The one-pass kernel: ``row_threads`` = 32 is a warp per row (``threads``/32 rows a
    block, shuffles only), ``row_threads`` = ``threads`` a block per row."""
    acc = accumulator(dtype)
    rows_per_block = threads // row_threads
    load, store = io(dtype, vpt, width, row_threads)

    @jit.kernel
    def backward_one_pass(dy, y, dx):
        row = cuda.blockIdx.x * rows_per_block + cuda.threadIdx.x // row_threads
        t = cuda.threadIdx.x % row_threads
        n = y.shape[1]
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        yv = cuda.local.array(vpt, acc)  # this thread's y and dy: registers (unrolled)
        gv = cuda.local.array(vpt, acc)
        if row_threads == 32 and row >= y.shape[0]:
            return  # a whole warp past the last row: no one waits for it
        load(y, row, 0, n, t, yv)  # 1. read y and dy once
        load(dy, row, 0, n, t, gv)
        zero = acc(0.0)
        c = zero  # 2. this thread's part of c = Σ term
        for i in range(vpt):
            c += term(yv[i], gv[i], mode)
        if row_threads == 32:  # 3. the row's c: the combiner with every m = 0 is a sum
            _, c = warp_combine(zero, c)
        else:
            _, c = block_combine(zero, c, m_shared, l_shared)
        for i in range(vpt):  # 4. dx from the values still in registers, written once
            yv[i] = grad(yv[i], gv[i], c, mode)
        store(yv, dx, row, 0, n, t)

    return backward_one_pass


# --- two passes and split: rows longer than the chip holds --------------------------------
@functools.cache
def passes(dtype, mode, threads, width):
    """Device functions over a range [start, stop) of a row, in chunks of T·CHUNK_VPT:
    ``partial`` — this thread's Σ term (pass 1); ``write`` — dx given c, chunks in reverse
    (pass 2).  ``start`` must be a multiple of W."""
    acc = accumulator(dtype)
    vpt = max(CHUNK_VPT, width)
    chunk = threads * vpt
    load, store = io(dtype, vpt, width, threads)

    @jit.device
    def partial(dy, y, row, start, stop):
        t = cuda.threadIdx.x
        yv = cuda.local.array(vpt, acc)
        gv = cuda.local.array(vpt, acc)
        c = acc(0.0)
        for base in range(start, stop, chunk):
            load(dy, row, base, stop, t, gv)
            if mode == SOFTMAX:  # log_softmax sums dy alone: y is not read in pass 1
                load(y, row, base, stop, t, yv)
            for i in range(vpt):
                c += term(yv[i], gv[i], mode)
        return c

    @jit.device
    def write(dy, y, dx, row, start, stop, c):
        t = cuda.threadIdx.x
        yv = cuda.local.array(vpt, acc)
        gv = cuda.local.array(vpt, acc)
        last = (stop - start - 1) // chunk
        for q in range(last, -1, -1):  # the chunks pass 1 read last are the likeliest in L2
            base = start + q * chunk
            load(y, row, base, stop, t, yv)
            load(dy, row, base, stop, t, gv)
            for i in range(vpt):
                yv[i] = grad(yv[i], gv[i], c, mode)
            store(yv, dx, row, base, stop, t)

    return partial, write


@functools.cache
def two_pass(dtype, mode, threads, width):
    """The two-pass kernel: one block per row."""
    acc = accumulator(dtype)
    partial, write = passes(dtype, mode, threads, width)

    @jit.kernel
    def backward_two_pass(dy, y, dx):
        row = cuda.blockIdx.x
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        n = y.shape[1]
        c = partial(dy, y, row, 0, n)  # pass 1: stream the row for c
        _, c = block_combine(acc(0.0), c, m_shared, l_shared)
        write(dy, y, dx, row, 0, n, c)  # pass 2: re-read, write dx

    return backward_two_pass


@functools.cache
def split(dtype, mode, threads, width):
    """The split kernels: block (row, s) takes piece s of the row."""
    acc = accumulator(dtype)
    partial, write = passes(dtype, mode, threads, width)

    @jit.kernel
    def piece_sums(dy, y, piece, ws):
        row, s = cuda.blockIdx.x, cuda.blockIdx.y
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        start = s * piece
        c = partial(dy, y, row, start, min(start + piece, y.shape[1]))
        _, c = block_combine(acc(0.0), c, m_shared, l_shared)
        if cuda.threadIdx.x == 0:
            ws[row, s] = c

    @jit.kernel
    def piece_write(dy, y, dx, piece, ws):
        row, s = cuda.blockIdx.x, cuda.blockIdx.y
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        c = acc(0.0)
        for k in range(cuda.threadIdx.x, ws.shape[1], threads):  # the row's S partial sums
            c += ws[row, k]
        _, c = block_combine(acc(0.0), c, m_shared, l_shared)
        start = s * piece
        write(dy, y, dx, row, start, min(start + piece, y.shape[1]), c)

    return piece_sums, piece_write


# --- launch configuration -----------------------------------------------------------------
class Plan(NamedTuple):
    """How a (rows, n) problem is run: ``form`` is "warp" or "block" (one pass), "two_pass"
    or "split"; ``threads`` per block; ``vpt`` values per thread (one pass); ``splits``
    pieces per row (split)."""

    form: str
    threads: int
    vpt: int = 0
    splits: int = 1


def max_vpt(dtype, warp=False):
    """Values of *each* tensor one thread may hold in the one-pass kernel: ``MAX_VPT`` (58
    registers a thread in a block of 1024, float32), half for float64; twice that for a
    warp per row, whose small blocks may use more registers."""
    vpt = MAX_VPT if np.dtype(dtype).itemsize <= 4 else MAX_VPT // 2
    return 2 * vpt if warp else vpt


def plan(rows, n, dtype, width, max_threads, sms):
    """The form and sizes for (rows, n): a warp per row while 32·VPT values hold it; a
    block per row while ``max_threads``·VPT do; else two passes, or split for fewer rows
    than half the multiprocessors."""
    whole = lambda v: max(_pow2_at_least(v), width)  # noqa: E731  (a whole number of vectors)
    if n <= 32 * max_vpt(dtype, warp=True):
        return Plan("warp", 32 * max(1, min(4, max_threads // 32)), whole(-(-n // 32)))
    for threads in (64, 128, 256, 512, 1024):
        if threads <= max_threads and n <= threads * max_vpt(dtype):
            return Plan("block", threads, whole(-(-n // threads)))
    threads = 1024
    while threads > max_threads:
        threads //= 2
    if rows >= sms // 2:
        return Plan("two_pass", threads)
    chunk = threads * max(CHUNK_VPT, width)
    return Plan("split", threads, splits=max(1, min(-(-n // chunk), -(-4 * sms // rows))))


def kernels_for(p, dtype, mode, width):
    """The compiled kernel(s) of a plan, in launch order."""
    if p.form in ("warp", "block"):
        row_threads = 32 if p.form == "warp" else p.threads
        return (one_pass(dtype, mode, p.threads, p.vpt, row_threads, width),)
    if p.form == "two_pass":
        return (two_pass(dtype, mode, p.threads, width),)
    return split(dtype, mode, p.threads, width)


def launch(mode, dy, y, dx, stream=0, plan_=None):
    """dx from (dy, y): three (rows, n) device arrays of one storage dtype (float16,
    uint16 = bfloat16, float32, float64), any strides; ``mode`` SOFTMAX or LOG_SOFTMAX.
    ``plan_``: a :class:`Plan` to force (tests, timing); default :func:`plan`, sized to the
    compiled kernels' own thread limits."""
    rows, n = y.shape
    if rows == 0 or n == 0:
        return
    width = vector.vector_width(dy, y, dx)
    limits = launcher.device_limits()
    max_threads = limits.max_threads
    while True:
        p = plan_ or plan(rows, n, y.dtype, width, max_threads, limits.sms)
        ks = kernels_for(p, y.dtype, mode, width)
        args, ws = [(dy, y, dx)], None
        if p.form == "split":
            chunk = p.threads * max(CHUNK_VPT, width)
            piece = -(-n // p.splits)
            piece = -(-piece // chunk) * chunk  # whole chunks: every piece starts aligned
            splits = -(-n // piece)  # no empty trailing pieces
            ws = scratch((rows, splits), accumulator(y.dtype).name, stream, "row sums")
            args = [(dy, y, piece, ws), (dy, y, dx, piece, ws)]
        fits = min(launcher.max_threads(k, a) for k, a in zip(ks, args))
        if plan_ is not None or p.threads <= fits:
            break
        max_threads = fits  # registers allow fewer threads: plan again within them
    if p.form in ("warp", "block") and (32 if p.form == "warp" else p.threads) * p.vpt < n:
        raise ValueError(f"the one-pass form holds {p.vpt} values a thread; a row of {n} "
                         f"does not fit")
    grid = -(-rows // (p.threads // 32)) if p.form == "warp" else rows
    if ws is not None:
        grid = (rows, ws.shape[1])
    for k, a in zip(ks, args):
        launcher.launch(k, grid, p.threads, stream, a)
