"""t1 — fused softmax + top-k: the k most probable tokens of each row in one read of the logits.

``torch.topk(torch.softmax(x / T, -1), k)`` reads the row three times and writes it once
(max, sum, normalise, then a radix select over the probabilities).  Milakov & Gimelshein
(2018, §5) fold the top-k into the online normaliser: one pass keeps (m, ℓ, the k best
values and their indices), and only the k winners are ever normalised:

    pass    u = x / T; each thread folds its values into (m, ℓ); each warp keeps its k
            best in a list across its lanes; the block merges its warps' lists
            (:mod:`.topk_state`: the top-k combiner run by threads, warps and a block)
    write   p_r = exp(u_r − m)/ℓ — or log p_r = (u_r − m) − log ℓ — for the k winners,
            sorted descending, and their int64 indices

Four layouts (:func:`choose`):

* *a warp per row* for short rows (no barrier at all);
* *a block per row* for long rows when there are enough of them to fill the device;
* *the threshold filter* (:mod:`.topk_filter`), a block per row keeping only what beats
  its k-th best so far — only for a plan that asks for it: since the warps' lists share
  a floor and buffer their candidates it is no faster at any size timed (B 64–256);
* *split*: few long rows (B = 1 in decoding) cut into S pieces, one block each; kernel 1
  writes each piece's state (m, ℓ, k values, k indices) to a workspace, kernel 2 merges a
  row's S states and writes.  The launch boundary is the grid-wide barrier — or
  (``Plan.fused``) the last piece of a row to finish merges it in the same launch (an
  atomic ticket: :func:`.sync.last_to_finish`).  For a few rows (B 1 … 32) both kernels
  select by radix (:mod:`.topk_select`: a cost that does not follow k), in two launches
  (fused was the slower there); from a quarter of the multiprocessors' count of rows,
  a row's 2–4 pieces keep the sorted lists (:mod:`.topk_rows`,
  :func:`.topk_state.pieces_state`) and merge in the last piece (faster than a second
  kernel: ``docs/algorithms/topk.md``, "Where the last piece does merge").  Sampling's
  perturbed values keep the lists' two kernels.

Memory traffic: read N·b once; write k·(b + 8) per row (+ the split workspace, S·k·8 per
row).  Values come out in the input's dtype (probabilities; bfloat16 as uint16 bits),
indices as int64.  Ties go to the lower index; a row holding NaN or +inf, or of all −inf,
gives NaN values at indices 0 … k − 1.  NumPy twin: :func:`numba_softmax.reference.topk.softmax_topk`.
"""

from typing import NamedTuple

import numpy as np

from ...runtime import counters, launcher
from . import topk_filter, topk_merge, topk_select
from ..hw import vector
from ..hw.jit import accumulator
from ..rows.chunk import pow2_ceil as _pow2_at_least
from .topk_rows import kernel, max_splits, merge_kernel, piece_kernel
from .topk_select import MAX_K  # 128: a warp's list holds ⌈k/32⌉ ≤ 4 entries per lane
from .topk_state import WARP

MERGE_THREADS = 512  # the split path's merge block (at most)
RADIX_MERGE_THREADS = 512  # the radix merge's block: its S·k entries in registers …
RADIX_MERGE_PER_THREAD = 16  # … at most this many a thread (choose keeps S·k below)
# (512 threads beat 1024, 256 and 128 for k ≥ 50: docs/algorithms/topk.md, "Selection by
# radix")
RADIX_BLOCKS = 2  # radix pieces per multiprocessor at once (~90 registers a thread) …
RADIX_WAVES = 2  # … and at most two such waves (beyond, the lists are the faster)
WAVE_THREADS = 512  # a radix split whose pieces fit one wave: blocks of 512 threads
# holding 4 (else 8, 16) values a thread — 16-bit values (one 8-wide vector a thread) in
# half the threads, the same pieces, rather than 512 threads holding half-empty vectors
# (docs/algorithms/topk.md, "Measured")
LISTS_SPLIT_THREADS = 512  # the pieces' block where rows are a quarter to one per SM


class Plan(NamedTuple):
    """A launch configuration: a warp per row, or ``threads`` per block (row or piece);
    ``vpt`` values per thread per chunk; ``splits`` pieces per row (1: no split);
    ``radix``: the split path selects by radix (:mod:`.topk_select`; a piece is then held
    whole, ⌈piece/threads⌉ values a thread) instead of by sorted lists; ``filter``: a
    block streams its row or piece past a threshold (:mod:`.topk_filter`); ``fused``
    (the radix and the lists' splits): the last piece of a row to finish merges the row,
    in the same launch."""

    warp_rows: bool
    threads: int
    vpt: int
    splits: int = 1
    radix: bool = False
    filter: bool = False
    fused: bool = False


def choose(rows, n, k, dtype, width, limits, radix=False):
    """The layout for a (rows, n) problem on a device with ``limits``.

    Short rows (≤ 4 chunks of a warp): a warp per row.  Long rows, at least one per
    multiprocessor: a block per row of as few warps (2 … 8) as give the device ~12 warps
    per multiprocessor — each warp still fills its own list, and at B 1024 the registers
    hold one wave only at two warps a row.  Fewer rows: split each row into pieces (blocks
    of 256 threads, 512 for a handful of rows: shorter per-warp insertion chains), enough
    for ~16 warps per multiprocessor, as many as the merge's shared memory holds.
    With ``radix`` (plain top-k; the sampler's perturbed pass keeps the lists) the split
    selects by radix instead: pieces of 512 threads × 4 values held in registers (8, 16;
    16-bit values: 256 × 8) where every piece gets a multiprocessor of its own; else of
    256 threads × 8 values (16 where more pieces would not run in two waves); the merge's
    S·k entries must fit its registers; where nothing fits, the lists.  (``Plan.fused``,
    the merge in the same launch, is never chosen here: it was no faster than two
    kernels, ``docs/algorithms/topk.md``, "Selection by radix".)
    With ``radix`` and between a quarter of and as many rows as multiprocessors: the
    lists, each row in ⌊SMs/rows⌋ pieces of :data:`LISTS_SPLIT_THREADS` (one wave: a
    piece a multiprocessor; rounding up to a second wave loses), each piece about 2
    chunks of its block or more, the last piece of a row merging it (``fused``: less
    than a second kernel in every case timed).  With that merge, pieces of 1.95 chunks
    win too, where two kernels had lost.  The figures: ``docs/algorithms/topk.md``,
    "Where the last piece does merge".
    """
    sms, max_threads = limits.sms, min(limits.max_threads, 512)
    vpt = min(4 * width, 16) if width > 1 else 8  # 16 keeps float16 in registers
    if n <= 4 * WARP * vpt:
        return Plan(True, min(128, max_threads), vpt)
    if radix and max(2, sms // 4) <= rows < sms:
        threads = min(LISTS_SPLIT_THREADS, max_threads)
        per = 2 * threads * vpt  # ≥ 2 chunks a piece, less an eighth of one (V 32000)
        splits = max(1, min(sms // rows, (n + per // 16) // per))
        return Plan(False, threads, vpt, splits, fused=splits > 1)
    if rows >= sms:
        warps = max(2, min(8, _pow2_at_least(-(-12 * sms // rows))))
        return Plan(False, min(WARP * warps, max_threads), vpt)
    if radix:
        cap = min(RADIX_MERGE_THREADS, limits.max_threads) * RADIX_MERGE_PER_THREAD
        threads = min(WAVE_THREADS, max_threads)
        for per in (4, 8, 16):  # every piece a multiprocessor of its own …
            splits = -(-n // (threads * per))
            if rows * splits <= sms and splits * k <= cap:  # … a thread whole vectors: 16-bit
                return Plan(False, threads * per // max(per, width), max(per, width), splits, True)
        threads = min(256, max_threads)
        for per in (8, 16):  # (32 a thread would take ~210 registers)
            splits = -(-n // (threads * per))
            if rows * splits <= RADIX_WAVES * RADIX_BLOCKS * sms and splits * k <= cap:
                return Plan(False, threads, per, splits, True)
    threads = min(512 if 4 * rows < sms else 256, max_threads)
    splits = min(max_splits(dtype, k), -(-16 * sms * WARP // (rows * threads)), -(-n // (threads * width)))
    return Plan(False, threads, vpt, max(splits, 1))


# --- host side ---------------------------------------------------------------------------
def check_row(n, k):
    """The kernels' limits on k and the row length (the public API checks k by name)."""
    if not 1 <= k <= min(n, MAX_K):
        raise ValueError(f"k must be in 1 … min(V, {MAX_K}) = {min(n, MAX_K)}; got {k}")
    if n >= 2**31 - 1:
        raise ValueError(f"rows of at most 2**31 - 2 values (int32 indices on chip); got {n}")


def workspace(rows, splits, k, acc_dtype, stream):
    """The piece states (values, indices, m, ℓ) of (rows, splits): carved from
    :func:`.launcher.workspace` buffers kept per stream and dtype (a cudaMalloc per call
    would cost more than the kernels)."""
    need = rows * splits * (k + 2)
    bufs = (launcher.workspace("topk states", need, np.dtype(acc_dtype), stream),
            launcher.workspace("topk indices", need, np.int32, stream))
    f, i = bufs
    a, b = rows * splits * k, rows * splits
    return (f[:a].reshape(rows, splits, k), i[:a].reshape(rows, splits, k),
            f[a : a + b].reshape(rows, splits), f[a + b : a + 2 * b].reshape(rows, splits))


def fit(build, threads, args):
    """``build(threads)`` with threads halved until the compiled kernel can launch them:
    half, rounded up to whole warps (the lists vote by warps), so 96 becomes 64."""
    while threads > WARP and threads > launcher.max_threads(build(threads), args):
        threads = -(-(threads // 2) // WARP) * WARP
    return build(threads), threads


def pieces(n, splits, width):
    """Piece length (a multiple of the vector width, so every piece starts aligned) and
    the number of non-empty pieces."""
    piece = -(-(-(-n // splits)) // width) * width
    return piece, -(-n // piece)


def launch(x, k, values, indices, *, temperature=1.0, log=False, stream=0, plan=None):
    """values[r, :k], indices[r, :k] = the top-k of softmax(x[r] / temperature).

    ``x``: (rows, V) device array, float16 / bfloat16 (uint16) / float32 / float64, any
    strides.  ``values``: (rows, k), x's dtype (probabilities, or log-probabilities with
    ``log``).  ``indices``: (rows, k) int64.  The caller checks ``temperature`` (finite,
    > 0); k is checked here (1 ≤ k ≤ min(V, 128)).  ``plan``: a :class:`Plan` to force a
    layout (tests, tuning); default :func:`choose`.
    """
    rows, n = x.shape
    check_row(n, k)
    acc = np.dtype(str(accumulator(x.dtype)))
    inv_t = acc.type(1.0 / temperature)
    width = vector.vector_width(x)
    p = plan or choose(rows, n, k, x.dtype, width, launcher.device_limits(), True)
    if p.threads % WARP:  # the lists, the radix scan and the ranks vote by whole warps
        raise ValueError(f"a top-k plan's threads must be a multiple of {WARP}; got {p.threads}")
    slots = -(-k // WARP)
    vpt = max(p.vpt, width) // width * width
    if p.filter:
        return _launch_filter(x, k, inv_t, values, indices, log, p, width, stream)
    if p.splits == 1 and not p.radix:
        args = (x, k, inv_t, values, indices)
        scaled = bool(inv_t != 1)  # (at T = 1 the stream skips its multiply a value)
        kern, threads = fit(lambda t: kernel(x.dtype, t, vpt, width, slots, p.warp_rows, log,
                                             scaled), p.threads, args)
        grid = -(-rows // (threads // WARP)) if p.warp_rows else rows
        launcher.launch(kern, grid, threads, stream, args)
        return
    if p.radix:
        return _launch_radix(x, k, inv_t, values, indices, log, p, width, stream)
    piece, splits = pieces(n, min(p.splits, max_splits(x.dtype, k)), width)
    ws = workspace(rows, splits, k, acc, stream)
    args = (x, k, inv_t, np.uint64(0), piece) + ws
    merged = p.fused and splits > 1  # the last piece of a row merges it: no kernel 2
    if merged:
        args += (counters.tickets(rows, stream, "topk list tickets"), values, indices)
    kern, threads = fit(lambda t: piece_kernel(x.dtype, t, vpt, width, slots, False,
                                               *((log, _pow2_at_least(splits)) if merged else ())),
                        p.threads, args)
    launcher.launch(kern, (rows, splits), threads, stream, args)
    if not merged:
        threads = merge_threads()
        merge = merge_kernel(x.dtype, slots, log, threads)
        launcher.launch(merge, rows, threads, stream, ws + (k, values, indices))


def merge_threads(radix=False):
    """Threads of the split merge block (the simulator's small blocks there)."""
    most = RADIX_MERGE_THREADS if radix else MERGE_THREADS
    return min(most, launcher.device_limits().max_threads)


def _launch_radix(x, k, inv_t, values, indices, log, p, width, stream):
    """The split path by radix select (:mod:`.topk_select`): kernel 1 per piece, kernel 2
    per row — or, with ``p.fused``, kernel 1 alone, its last piece of a row merging the
    row.  Each holds its entries in registers: ⌈piece/threads⌉ values (a multiple of W)
    a thread, and ⌈S·k/threads⌉ (a power of two) in the merge."""
    rows, n = x.shape
    piece, splits = pieces(n, p.splits, width)
    ws = workspace(rows, splits, k, np.dtype(str(accumulator(x.dtype))), stream)
    args = (x, k, inv_t, piece, topk_select.index_bytes(piece - 1)) + ws
    per_piece = lambda t: -(-piece // (t * width)) * width  # noqa: E731
    then = lambda t: None  # noqa: E731
    if p.fused and splits > 1:
        args += (counters.tickets(rows, stream, "topk tickets"), topk_select.index_bytes(n - 1),
                 values, indices)
        then = lambda t: _row_merger(x, k, log, splits, t)  # noqa: E731
    kern, threads = fit(lambda t: topk_select.piece_kernel(x.dtype, t, per_piece(t), width, then(t)),
                        p.threads, args)
    launcher.launch(kern, (rows, splits), threads, stream, args)
    if not (p.fused and splits > 1):
        _radix_merge(x, k, values, indices, log, splits, ws, stream)


def _row_merger(x, k, log, splits, threads):
    """The merge of a row's S piece states by a block of ``threads`` (:mod:`.topk_merge`):
    ⌈S·k/threads⌉ entries a thread, a power of two."""
    per = _pow2_at_least(-(-splits * k // threads))
    return topk_merge.row_merger(x.dtype, per, threads, log, topk_merge.CAP, topk_merge.HEADS)


def _launch_filter(x, k, inv_t, values, indices, log, p, width, stream):
    """The threshold filter (:mod:`.topk_filter`): a block per row writes the row; with
    pieces, a block per piece writes its state and the radix merge folds them."""
    rows, n = x.shape
    piece, splits = pieces(n, p.splits, width)
    per = max(p.vpt, width) // width * width
    if topk_filter.buffer_bytes(p.threads, per, x.dtype) > topk_filter.MAX_BUFFER_BYTES:
        raise ValueError(f"a filter plan of {p.threads} threads × {per} values overflows its "
                         f"buffer's shared memory ({topk_filter.MAX_BUFFER_BYTES} bytes)")
    ws = workspace(rows, splits, k, np.dtype(str(accumulator(x.dtype))), stream)
    args = (x, k, inv_t, piece, topk_select.index_bytes(piece - 1)) + ws + (values, indices)
    kern, threads = fit(lambda t: topk_filter.filter_kernel(x.dtype, t, per, width, log),
                        p.threads, args)
    launcher.launch(kern, (rows, splits), threads, stream, args)
    if splits > 1:
        _radix_merge(x, k, values, indices, log, splits, ws, stream)


def _radix_merge(x, k, values, indices, log, splits, ws, stream):
    """Kernel 2 of the radix and filter splits: a block per row merges its S piece states
    (:mod:`.topk_merge`)."""
    n = x.shape[1]
    args = ws + (k, n, topk_select.index_bytes(n - 1), values, indices)
    per_merge = lambda t: _pow2_at_least(-(-splits * k // t))  # noqa: E731
    merge, threads = fit(lambda t: topk_merge.merge_kernel(x.dtype, per_merge(t), t, log,
                                                             topk_merge.CAP, topk_merge.HEADS),
                         merge_threads(True), args)
    launcher.launch(merge, x.shape[0], threads, stream, args)
