"""b1 — softmax and log_softmax backward: dx from the forward's output y and the gradient dy.

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

Three forms, picked by :func:`.softmax_backward_launch.plan` (the launch configuration,
which :mod:`.softmax_backward_launch` holds with the one launch function):

    one pass   the row fits on chip: T threads hold VPT values of y *and* dy each in
               registers (a warp per row for short rows, several rows to a block; a block
               per row up to T·VPT values; on sm_90 a *cluster* of up to 8 blocks per row,
               whose blocks post their sums into each other's shared memory and add them
               in one order — rows up to 131072 float32 or, held in pairs, 262144
               float16/bfloat16 values; where the device runs clusters of 16
               (non-portable cluster sizes, sm_90), up to 16 blocks of 512 threads
               holding twice the float32 values: rows up to 262144 float32).  Read y,
               dy once, write dx once: 3·N·b bytes, the minimum.
    two pass   the row does not fit: pass 1 streams it for c (reading dy, and y for
               softmax), pass 2 re-reads y and dy and writes dx — walking the chunks in
               *reverse*, so the chunks pass 1 read last, still in L2, are re-read first.
               At most 5·N·b bytes from DRAM for softmax, 4·N·b for log_softmax.
    split      few long rows: S blocks per row, each sums its piece into a workspace
               (rows × S), then a second kernel adds the S partials and writes its piece.

Storage types: float16, bfloat16 (uint16 bits), float32, float64; values are held in
registers as stored — in a block or a cluster float16 and bfloat16 two to a 32-bit
register where rows take 16-byte vectors (:mod:`.pairs`: twice the values in the same
registers, and twice the bytes in flight), but not in a warp per row (a lane holding
that many values in pairs falls far behind a block whose threads hold a few each:
docs/algorithms/backward.md) — and converted where used; accumulation in float32
(float64 for float64).
NumPy twins: :func:`numba_softmax.reference.softmax_backward`, ``log_softmax_backward``.
"""

import functools
import math

from numba import cuda

from ...runtime import sim
from ..rows import dsmem, pairs
from ..hw import jit
from ..rows.epilogue import SOFTMAX
from ..hw.jit import accumulator
from ..rows.reduce import block_combine, warp_combine

MAX_VPT = 16  # values of *each* tensor a thread holds in one pass (two tensors: 32 registers)
MAX_CLUSTER = 16  # blocks a cluster: 8 on every sm_90 device, 16 where it allows (non-portable)
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


@functools.cache
def io(dtype, vpt, width, row_threads):
    """Device functions ``load(a, row, base, stop, t, v)`` — thread t's VPT values of row
    ``row`` from column ``base`` on (W at a time, coalesced, 0 past ``stop``) into ``v``
    in the accumulator type — and ``store(v, a, row, base, stop, t)``, its inverse."""
    slot, slots, hold, get, put, give, _ = pairs.holder(dtype, vpt, width, row_threads,
                                                         pack=False)

    @jit.device
    def load(a, row, base, stop, t, v):
        raw = cuda.local.array(slots, slot)
        hold(a, row, base, stop, t, raw)
        for i in range(vpt):
            v[i] = get(raw, i)

    @jit.device
    def store(v, a, row, base, stop, t):
        raw = cuda.local.array(slots, slot)
        for i in range(vpt):
            put(raw, i, v[i])
        give(raw, a, row, base, stop, t)

    return load, store


# --- one pass: the row on chip ------------------------------------------------------------
@functools.cache
def one_pass(dtype, mode, threads, vpt, row_threads, width, size=1, pack=True):
    """The one-pass kernel: ``row_threads`` = 32 is a warp per row (``threads``/32 rows a
    block, shuffles only), ``row_threads`` = ``threads`` a block per row, and ``size`` > 1
    a thread-block *cluster* of ``size`` blocks per row (sm_90), each holding a piece of
    ``threads``·VPT values, whose sums meet in each other's shared memory (:mod:`.dsmem`).
    ``pack``: float16 / bfloat16 two to a register (:mod:`.pairs`; the launch configuration
    asks for it in a block or a cluster, not in a warp per row)."""
    acc = accumulator(dtype)
    rows_per_block = threads // row_threads
    piece = threads * vpt
    # y and dy held as stored (float16 and bfloat16 two to a register if ``pack``)
    slot, slots, hold, get, put, give, renew = pairs.holder(dtype, vpt, width, row_threads,
                                                            pack=pack)

    @jit.kernel
    def backward_one_pass(dy, y, dx):
        if size > 1:
            dsmem.arrive()  # this block has started (a peer may write into it after wait())
        b = dsmem.rank(size) if size > 1 else 0  # the block's piece of its row
        row = (cuda.blockIdx.x // size if size > 1 else
               cuda.blockIdx.x * rows_per_block + cuda.threadIdx.x // row_threads)
        t = cuda.threadIdx.x % row_threads
        n = y.shape[1]
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        c_posted = cuda.shared.array(MAX_CLUSTER, acc)  # slot r: block r's sum (a cluster)
        yv = cuda.local.array(slots, slot)  # this thread's y and dy: registers (unrolled)
        gv = cuda.local.array(slots, slot)
        dxv = cuda.local.array(slots, slot)
        if row_threads == 32 and row >= y.shape[0]:
            return  # a whole warp past the last row: no one waits for it
        base = b * piece
        hold(y, row, base, n, t, yv)  # 1. read y and dy once
        hold(dy, row, base, n, t, gv)
        zero = acc(0.0)
        c = zero  # 2. this thread's part of c = Σ term
        for i in range(vpt):
            c += term(get(yv, i), get(gv, i), mode)
        if row_threads == 32:  # 3. the row's c: the combiner with every m = 0 is a sum
            _, c = warp_combine(zero, c)
        else:
            _, c = block_combine(zero, c, m_shared, l_shared)
        if size > 1:  # 3b. a cluster: each block's sum into slot b of every block
            dsmem.wait()  # every block of the cluster has started: its slots exist
            if t < size:
                dsmem.store_remote(c_posted, b, t, size, c)
            dsmem.sync()  # every sum is in every block (no remote store after this)
            c = c_posted[0]
            for r in range(1, size):  # the same order in every block: the same c, bit for bit
                c += c_posted[r]
        renew(yv)  # (unpack y and dy afresh below: pairs.py says why)
        renew(gv)
        for i in range(vpt):  # 4. dx from the values still in registers, written once
            put(dxv, i, grad(get(yv, i), get(gv, i), c, mode))
        give(dxv, dx, row, base, n, t)

    return sim.cooperative(backward_one_pass) if size > 1 else backward_one_pass


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
