"""v4 — split-row softmax: several blocks per row, for few, very long rows.

With one block per row, 1 row × 16M values keeps one multiprocessor busy and leaves the
other 131 idle.  Cut each row into S pieces, one block each (a grid of rows × S):

    kernel 1  block (r, s) streams piece s of row r with the online pass of
              :mod:`.online` and writes the piece's (m, ℓ) to a small workspace
              (rows × S states: 8·rows·S bytes);
    kernel 2  block (r, s) folds the S states of its row with the combiner (each thread
              a few, then the block combine — any order gives the same state) and
              normalises piece s.

Memory traffic: read 2·N·b, write N·b, plus the workspace.  The launch boundary between
the two kernels is the grid-wide barrier.  This is the online merge of the sources used
across blocks instead of across threads (and the same shape as split-KV decoding).
NumPy twin: :func:`numba_softmax.reference.merge_chunks` (chunks = pieces).
"""

import functools
import math

from numba import cuda

from ..combine import combine_device
from . import jit, launcher
from .jit import accumulator
from . import vector
from .epilogue import LOGSUMEXP, row_constant
from .online import normalise_range, stream_state
from .reduce import block_combine


@functools.cache
def kernels(dtype, threads, vpt, mode, width):
    acc = accumulator(dtype)
    fold = stream_state(dtype, threads, vpt, width)
    write = normalise_range(dtype, threads, vpt, width, mode)

    @jit.kernel
    def piece_states(x, piece, m_ws, l_ws):
        row, s, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        start = s * piece
        stop = min(start + piece, x.shape[1])
        m, l = fold(x, row, start, stop)
        m, l = block_combine(m, l, m_shared, l_shared)
        if t == 0:
            m_ws[row, s] = m
            l_ws[row, s] = l

    @jit.kernel
    def normalise(x, piece, m_ws, l_ws, y):
        row, s, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        m_shared = cuda.shared.array(32, acc)
        l_shared = cuda.shared.array(32, acc)
        m, l = acc(-math.inf), acc(0.0)
        for k in range(t, m_ws.shape[1], threads):  # the block folds the row's S states
            m, l = combine_device(m, l, m_ws[row, k], l_ws[row, k])
        m, l = block_combine(m, l, m_shared, l_shared)
        c = row_constant(m, l, acc(1.0), mode)
        if mode == LOGSUMEXP:
            if s == 0 and t == 0:
                y[row, 0] = c
            return
        start = s * piece
        write(x, y, row, start, min(start + piece, x.shape[1]), m, c)

    return piece_states, normalise


_WORKSPACES = {}


def _workspace(rows, splits, dtype, stream):
    """The (m, ℓ) workspace, allocated once per stream and dtype and grown as needed:
    a cudaMalloc per call would cost more than the kernels on small inputs.  One per
    stream, because two streams running at once must not share it."""
    try:
        handle = int(stream) if stream else 0  # a Numba stream's int() is its handle
    except TypeError:
        handle = id(stream)  # the simulator's streams have none
    key = (dtype, handle)
    need = 2 * rows * splits
    buf = _WORKSPACES.get(key)
    if buf is None or buf.shape[0] < need:
        buf = _WORKSPACES[key] = cuda.device_array(max(need, 4096), dtype=dtype, stream=stream)
    return (buf[: rows * splits].reshape(rows, splits),
            buf[rows * splits : need].reshape(rows, splits))


def launch(x, y, mode, threads=256, vpt=8, splits=None, stream=0, num_sms=132):
    """Run on (rows, n) device arrays; ``splits`` pieces per row (default: about eight
    blocks per multiprocessor, each piece at least one chunk of T·VPT)."""
    rows, n = x.shape
    chunk = threads * vpt
    if splits is None:
        splits = max(1, min(-(-n // chunk), -(-8 * num_sms // rows)))
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    width = vector.vector_width(x) if mode == LOGSUMEXP else vector.vector_width(x, y)
    vpt = max(vpt, width)
    chunk = threads * vpt
    piece = -(-n // splits)
    piece = -(-piece // chunk) * chunk  # whole chunks: every piece starts vector-aligned
    splits = -(-n // piece)  # no empty trailing pieces
    m_ws, l_ws = _workspace(rows, splits, "float64" if x.dtype.itemsize == 8 else "float32", stream)
    piece_states, normalise = kernels(x.dtype, threads, vpt, mode, width)
    launcher.launch(piece_states, (rows, splits), threads, stream, (x, piece, m_ws, l_ws))
    launcher.launch(normalise, (rows, splits), threads, stream, (x, piece, m_ws, l_ws, y))
