"""The sorted lists' kernels of fused softmax + top-k (:mod:`.topk` plans and launches
them): a warp or a block per row, and the split path's two kernels by lists — kernel 1
writes each piece's state (its k best by the warps' lists, and its (m, ℓ)), kernel 2
merges a row's S states by :func:`.topk_state.pieces_state` — or the last piece of a row
to finish merges them in the same launch.  The radix split
(:mod:`.topk_select`, :mod:`.topk_merge`) is the default for a few rows (B 1 … 32); these
pieces, merged by the last, are the default from a quarter of the multiprocessors' count
of rows, and in two kernels they serve sampling's perturbed values (:mod:`.sample`).
Bytes and the algorithm: :mod:`.topk`'s docstring.
"""

import functools

import numba
from numba import cuda

from ...draws import row_key_device
from ..hw import jit
from ..rows.chunk import pow2_floor
from ..hw.jit import accumulator
from ..rows.sync import last_to_finish
from .topk_state import WARP, block_memory, keep_piece, pieces_state, row_state, writer


def max_splits(dtype, k):
    """Pieces the split merge can hold in shared memory: lists of ⌈k/32⌉·32 entries, at
    most 4096 entries (32 KB), 2048 for float64; a power of two."""
    entries = 4096 if accumulator(dtype) == numba.float32 else 2048
    return pow2_floor(entries // (WARP * -(-k // WARP)))


@functools.cache
def kernel(dtype, threads, vpt, width, slots, warp_rows, log, scaled=True):
    """The one-kernel path: a warp or a block per row (``scaled=False``: T = 1, u = x)."""
    acc = accumulator(dtype)
    state = row_state(dtype, threads, vpt, width, slots, warp_rows, False, scaled)
    write = writer(dtype, log)
    lists = threads // WARP
    memory = block_memory(acc, lists * WARP * slots)

    @jit.kernel
    def softmax_topk(x, k, inv_t, values, indices):
        sv, si, m_sh, l_sh = memory()
        tid = cuda.threadIdx.x
        if warp_rows:
            row, first, step = cuda.blockIdx.x * lists + tid // WARP, tid % WARP, WARP
            if row >= x.shape[0]:
                return  # a whole warp past the last row; no one waits for it
        else:
            row, first, step = cuda.blockIdx.x, tid, threads
        m, l, base = state(x, row, 0, x.shape[1], k, inv_t, numba.uint64(0), sv, si, m_sh, l_sh)
        write(values, indices, row, sv, si, base, k, m, l, first, step)

    return softmax_topk


@functools.cache
def piece_kernel(dtype, threads, vpt, width, slots, perturb, log=None, lists=None):
    """Split path, kernel 1: block (row, s) writes the state of piece s to the workspace
    (with ``perturb``, of u + Gumbel noise: see :mod:`.sample`).  With ``log`` (True or
    False: the output's form) the last of a row's pieces to finish merges the row's S ≤
    ``lists`` states itself, as kernel 2 would: one launch (extra arguments: int32
    tickets, zero, one a row; values; indices)."""
    acc = accumulator(dtype)
    state = row_state(dtype, threads, vpt, width, slots, False, perturb)
    memory = block_memory(acc, threads * slots)

    @jit.device
    def piece_state(x, k, inv_t, seed, piece, ws_v, ws_i, ws_m, ws_l):
        sv, si, m_sh, l_sh = memory()
        row, s, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        key = row_key_device(seed, row) if perturb else seed
        start = s * piece
        stop = min(start + piece, x.shape[1])
        m, l, _ = state(x, row, start, stop, k, inv_t, key, sv, si, m_sh, l_sh)
        keep_piece(ws_v, ws_i, ws_m, ws_l, row, s, sv, si, k, m, l, tid, threads)

    if log is None:
        @jit.kernel
        def piece_states(x, k, inv_t, seed, piece, ws_v, ws_i, ws_m, ws_l):
            piece_state(x, k, inv_t, seed, piece, ws_v, ws_i, ws_m, ws_l)

        return piece_states

    merge_row = row_merge(dtype, slots, log, threads, lists)

    @jit.kernel
    def pieces_merged(x, k, inv_t, seed, piece, ws_v, ws_i, ws_m, ws_l, tickets, values,
                      indices):
        piece_state(x, k, inv_t, seed, piece, ws_v, ws_i, ws_m, ws_l)
        row = cuda.blockIdx.x
        if last_to_finish(tickets, row, cuda.gridDim.y):  # the row's S states are all written
            merge_row(ws_v, ws_i, ws_m, ws_l, row, k, values, indices)

    return pieces_merged


@functools.cache
def row_merge(dtype, slots, log, threads, lists=None):
    """Device function ``merge_row(ws_v, ws_i, ws_m, ws_l, row, k, values, indices)``: a
    block of ``threads`` merges row ``row``'s piece states (at most ``lists``, a power of
    two; default :func:`max_splits`: its shared memory) and writes its top k — kernel
    2's work, or the last piece's (:func:`piece_kernel`)."""
    acc = accumulator(dtype)
    lists = lists or max_splits(dtype, WARP * slots)
    state = pieces_state(acc, lists, threads, slots)
    write = writer(dtype, log)
    memory = block_memory(acc, lists * WARP * slots)

    @jit.device
    def merge_row(ws_v, ws_i, ws_m, ws_l, row, k, values, indices):
        sv, si, m_sh, l_sh = memory()
        m, l = state(ws_v, ws_i, ws_m, ws_l, row, k, sv, si, m_sh, l_sh)
        write(values, indices, row, sv, si, 0, k, m, l, cuda.threadIdx.x, threads)

    return merge_row


@functools.cache
def merge_kernel(dtype, slots, log, threads):
    """Split path, kernel 2: block ``row`` merges the row's piece states (at most
    :func:`max_splits`) and writes."""
    merge_row = row_merge(dtype, slots, log, threads)

    @jit.kernel
    def merge_pieces(ws_v, ws_i, ws_m, ws_l, k, values, indices):
        merge_row(ws_v, ws_i, ws_m, ws_l, cuda.blockIdx.x, k, values, indices)

    return merge_pieces
