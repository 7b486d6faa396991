"""t2 — sampling one token per row, in one read of the logits, reproducible from a seed.

The decoder's last step: temperature → top-k → top-p → draw.  With ``top_k`` it is the
fused top-k of :mod:`.topk` with a different ending — the row's sorted top-k list stays in
shared memory and one thread draws from it:

    pass    (m, ℓ) and the k best of u = x / T, exactly as :mod:`.topk`
    draw    w_r = exp(u_r − u_0) over the list (the top-k renormalised), cut to the
            smallest prefix of mass ≥ top_p, then the inverse CDF at the row's uniform
            number (:func:`numba_softmax.draws.draw`)

With ``top_k=None`` (the whole vocabulary) there is no list to cut, and a full inverse CDF
would need a second pass and a prefix sum over the row.  Instead the Gumbel-max trick:
argmax_j (u_j + G_j), with G_j independent Gumbel noise, is distributed exactly as
softmax(u).  An argmax is the top-1 list, so this is the same kernel with k = 1 and each
value perturbed as it is read (G_j from the counter-based hash of (seed, row, j)); still
one pass, and the split path for B = 1 works unchanged.  ``top_p < 1`` needs the sorted
list, so it needs ``top_k``.

Draws depend only on (seed, row): the row's key (:func:`numba_softmax.draws.row_key`).
The integer hash is bit-identical everywhere; the float arithmetic after it (float32
``exp``/``log`` on the GPU, double on the simulator and in the NumPy twin) may round a
draw that falls within ~1e-6 of a boundary between two tokens to the other one.
A row with no softmax (NaN, +inf, all −inf) gets the token −1.
Memory traffic: read N·b once, write 8 bytes per row.
NumPy twin: :func:`numba_softmax.reference.topk.sample`.
"""

import functools

import numpy as np
from numba import cuda

from ...draws import MASK64, draw_device, row_key_device, uniform_device
from ..hw import jit, vector
from ...runtime import launcher
from ..hw.jit import accumulator
from .topk import WARP, check_row, choose, fit, merge_threads, pieces, workspace
from .topk_rows import max_splits, piece_kernel
from .topk_state import block_memory, pieces_state, row_state


@functools.cache
def chooser(dtype, perturb):
    """Device function: the token of a row from its list (k entries at ``base``)."""
    acc = accumulator(dtype)

    @jit.device
    def pick(sv, si, base, k, l, top_p, key):
        if not l > 0:
            return -1  # no softmax: NaN or +inf in the row, or all −inf
        if perturb:
            return si[base]  # Gumbel-max: the top-1 of u + G
        return si[base + draw_device(sv, base, k, top_p, acc(uniform_device(key)))]

    return pick


@functools.cache
def kernel(dtype, threads, vpt, width, slots, warp_rows, perturb):
    """The one-kernel path: a warp or a block per row, one token per row."""
    acc = accumulator(dtype)
    state = row_state(dtype, threads, vpt, width, slots, warp_rows, perturb)
    pick = chooser(dtype, perturb)
    lists = threads // WARP
    memory = block_memory(acc, lists * WARP * slots)

    @jit.kernel
    def sample(x, k, inv_t, top_p, seed, tokens):
        sv, si, m_sh, l_sh = memory()
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.x * lists + tid // WARP if warp_rows else cuda.blockIdx.x
        if warp_rows and row >= x.shape[0]:
            return  # a whole warp past the last row; no one waits for it
        key = row_key_device(seed, row)
        m, l, base = state(x, row, 0, x.shape[1], k, inv_t, key, sv, si, m_sh, l_sh)
        if tid % (WARP if warp_rows else threads) == 0:
            tokens[row] = pick(sv, si, base, k, l, top_p, key)

    return sample


@functools.cache
def merge_kernel(dtype, slots, perturb, threads):
    """Split path, kernel 2: merge a row's piece states, then draw (kernel 1 is
    :func:`.topk_rows.piece_kernel`, perturbed for the whole-vocabulary draw)."""
    acc = accumulator(dtype)
    lists = max_splits(dtype, WARP * slots)
    state = pieces_state(acc, lists, threads, slots)
    pick = chooser(dtype, perturb)
    memory = block_memory(acc, lists * WARP * slots)

    @jit.kernel
    def merge_sample(ws_v, ws_i, ws_m, ws_l, k, top_p, seed, tokens):
        sv, si, m_sh, l_sh = memory()
        row = cuda.blockIdx.x
        m, l = state(ws_v, ws_i, ws_m, ws_l, row, k, sv, si, m_sh, l_sh)
        if cuda.threadIdx.x == 0:
            tokens[row] = pick(sv, si, 0, k, l, top_p, row_key_device(seed, row))

    return merge_sample


def launch(x, tokens, *, top_k, top_p=1.0, temperature=1.0, seed=0, stream=0, plan=None):
    """tokens[r] = one draw from row r of ``x`` (see the module docstring).

    ``x``: (rows, V) device array, float16 / bfloat16 (uint16) / float32 / float64, any
    strides; ``tokens``: (rows,) int64.  ``top_k``: 1 … min(V, 128), or None for the whole
    vocabulary (then ``top_p`` must be 1).  The caller checks ``temperature`` (finite, > 0),
    ``top_p`` (0 < p ≤ 1) and that ``seed`` is an integer (taken mod 2**64).
    """
    rows, n = x.shape
    perturb = top_k is None
    if perturb and top_p < 1:
        raise ValueError("top_p < 1 needs top_k: the nucleus is cut from the sorted top-k list")
    k = 1 if perturb else top_k
    check_row(n, k)
    acc = np.dtype(str(accumulator(x.dtype)))
    inv_t, top_p, seed = acc.type(1.0 / temperature), acc.type(top_p), np.uint64(int(seed) & MASK64)
    width = vector.vector_width(x)
    p = plan or choose(rows, n, k, x.dtype, width, launcher.device_limits())
    slots = -(-k // WARP)
    vpt = max(p.vpt, width) // width * width
    if p.splits == 1:
        args = (x, k, inv_t, top_p, seed, tokens)
        kern, threads = fit(lambda t: kernel(x.dtype, t, vpt, width, slots, p.warp_rows, perturb),
                            p.threads, args)
        grid = -(-rows // (threads // WARP)) if p.warp_rows else rows
        launcher.launch(kern, grid, threads, stream, args)
        return
    piece, splits = pieces(n, min(p.splits, max_splits(x.dtype, k)), width)
    ws = workspace(rows, splits, k, acc, stream)
    args = (x, k, inv_t, seed, piece) + ws
    kern, threads = fit(lambda t: piece_kernel(x.dtype, t, vpt, width, slots, perturb), p.threads, args)
    launcher.launch(kern, (rows, splits), threads, stream, args)
    threads = merge_threads()
    merge = merge_kernel(x.dtype, slots, perturb, threads)
    launcher.launch(merge, rows, threads, stream, ws + (k, top_p, seed, tokens))
