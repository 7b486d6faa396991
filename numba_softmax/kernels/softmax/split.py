"""s5 — split-row softmax: several blocks per row, for few, very long rows.

With one block per row, 1 row × 16M values keeps one multiprocessor busy and leaves every
other one idle.  Cut each row into S pieces, one block each (a grid of rows × S):

    kernel 1  block (r, s) streams piece s of row r with the online pass of
              :mod:`.online` and writes the piece's (m, ℓ) to a small workspace
              (rows × S states: 8·rows·S bytes);
    kernel 2  block (r, s) folds the S states of its row with the combiner (each thread
              a few, then the block combine — any order gives the same state) and
              normalises piece s.  The pieces go in reverse order: the blocks that
              start first take the pieces kernel 1 read last, the likeliest still in L2.

Memory traffic: read 2·N·b, write N·b, plus the workspace — less where the re-read
hits L2 (up to its size — tens of MB on a data-centre GPU — of the last pieces read).
The launch boundary between the two kernels is the grid-wide barrier.  This is the
online merge of the sources used across blocks instead of across threads (and the same
shape as split-KV decoding).
NumPy twin: :func:`numba_softmax.reference.merge_chunks` (chunks = pieces).
"""

import functools
import math
from typing import NamedTuple

from numba import cuda

from ...combine import combine_device
from ..rows import chunk
from ..hw import jit, vector
from ...runtime import launcher
from ..rows.epilogue import LOGSUMEXP, row_constant
from .online import VECTORS, normalise_range, stream_state
from ..rows.reduce import team_combine
from ..rows.sync import load_relaxed2


@functools.cache
def posted_folder(dtype):
    """Device function ``fold_posted(m_ws, l_ws, i, count, t, team, m_slots, l_slots)``:
    the (m, ℓ) of the ``count`` states posted in row i of the workspace — each thread
    folds a few, then the block's tree (any order gives the same state); every thread
    returns it.  The states are read from L2 (:func:`.sync.load_relaxed2`): the group
    kernel reads them in the same launch that wrote them."""
    acc = jit.accumulator(dtype)

    @jit.device
    def fold_posted(m_ws, l_ws, i, count, t, team, m_slots, l_slots):
        m, l = acc(-math.inf), acc(0.0)
        k = t
        while k < count:
            m, l = combine_device(m, l, load_relaxed2(m_ws, i, k), load_relaxed2(l_ws, i, k))
            k += team
        return team_combine(m, l, m_slots, l_slots, team)

    return fold_posted


@functools.cache
def kernels(dtype, vpt, mode, width):
    acc = jit.accumulator(dtype)
    fold = stream_state(dtype, vpt, width)
    write = normalise_range(dtype, vpt, width, mode)
    fold_posted = posted_folder(dtype)
    store = jit.storer(dtype)

    @jit.kernel
    def piece_states(x, piece, m_ws, l_ws):
        row, s, t, T = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        start = s * piece
        m, l = fold(x, row, start, min(start + piece, x.shape[1]), t, T)
        m, l = team_combine(m, l, m_slots, l_slots, T)
        if t == 0:
            m_ws[row, s] = m
            l_ws[row, s] = l

    @jit.kernel
    def normalise(x, piece, m_ws, l_ws, y):
        row, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        s = cuda.gridDim.y - 1 - cuda.blockIdx.y  # the piece read last, first
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        m, l = fold_posted(m_ws, l_ws, row, m_ws.shape[1], t, T, m_slots, l_slots)  # S states
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if s == 0 and t == 0:
                y[row, 0] = store(c)
            return
        start = s * piece
        write(x, y, row, start, min(start + piece, x.shape[1]), t, T, m, c)

    return piece_states, normalise


def workspace(rows, splits, dtype, stream):
    """The (m, ℓ) workspace of (rows, splits) states: a :func:`.launcher.workspace`, kept
    per stream and dtype and grown as needed (a cudaMalloc per call would cost more than
    the kernels on small inputs; the group kernel uses it too, :mod:`.group`)."""
    buf = launcher.workspace("split states", 2 * rows * splits, dtype, stream)
    return (buf[: rows * splits].reshape(rows, splits),
            buf[rows * splits : 2 * rows * splits].reshape(rows, splits))


class Plan(NamedTuple):
    """The split launch: ``splits`` pieces of ``piece`` values per row, ``threads`` each."""

    kernels: tuple
    grid: tuple
    threads: int
    piece: int
    splits: int


def configure(x, y, mode, threads=None, vpt=None, splits=None, num_sms=None, stream=0):
    """The launch: blocks of 256 threads (at most the compiled kernels' own limit,
    :func:`.launcher.max_threads`, capped by ``threads``), ``splits`` pieces per row
    (default: about eight blocks per multiprocessor, each piece at least one chunk of
    T·VPT values, pieces whole chunks so that each starts vector-aligned)."""
    rows, n = x.shape
    if splits is not None and splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    vpt = max(vpt or VECTORS * vector.width_for(x.dtype), width)
    pair = kernels(x.dtype, vpt, mode, width)
    m_ws, l_ws = workspace(1, 1, workspace_dtype(x.dtype), stream)  # (typed as at launch)
    limit = min(launcher.max_threads(pair[0], (x, 0, m_ws, l_ws)),
                launcher.max_threads(pair[1], (x, 0, m_ws, l_ws, y)), threads or 256)
    threads = chunk.pow2_floor(limit)
    size = threads * vpt
    if splits is None:
        sms = num_sms or launcher.device_limits().sms
        splits = max(1, min(-(-n // size), -(-8 * sms // rows)))
    piece = -(-n // splits)
    piece = -(-piece // size) * size  # whole chunks: every piece starts vector-aligned
    splits = -(-n // piece)  # no empty trailing pieces
    return Plan(pair, (rows, splits), threads, piece, splits)


def workspace_dtype(dtype):
    """The (m, ℓ) states' dtype: the accumulator's (float64 for float64, else float32)."""
    return "float64" if jit.accumulator(dtype).bitwidth == 64 else "float32"


def launch(x, y, mode, threads=None, vpt=None, splits=None, stream=0, num_sms=None):
    """Run on (rows, n) device arrays (arguments as :func:`configure`)."""
    plan = configure(x, y, mode, threads, vpt, splits, num_sms, stream)
    rows = x.shape[0]
    m_ws, l_ws = workspace(rows, plan.splits, workspace_dtype(x.dtype), stream)
    piece_states, normalise = plan.kernels
    launcher.launch(piece_states, plan.grid, plan.threads, stream, (x, plan.piece, m_ws, l_ws))
    launcher.launch(normalise, plan.grid, plan.threads, stream, (x, plan.piece, m_ws, l_ws, y))
