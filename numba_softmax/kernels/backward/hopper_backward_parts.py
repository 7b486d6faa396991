"""What hb1 and hb2 (:mod:`.hopper_backward`, :mod:`.hopper_backward_ws`) share: the tile
sizes, the masks, the dQ kernels' elementwise step, the products, the writer of a lane's
accumulator rows and the launches' argument checks.

``visible``, ``whole``      the window's mask: of one (query, key), of a whole tile pair
``row_term(s)``, ``ds_rows`` a query row's LSE and D (a lane's two rows), dS = P ∘ (dP − D)
``padded_rows``             hb2's per-row terms as rows a tensor map loads (a kernel)
``products``                the four ``wgmma`` products and the packer, waited for or started
``writer``, ``adder``       a lane's two accumulator rows, scaled, into memory; added to it
``checked``                 dtype, head dims and scale of a launch
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from ..attention import hopper_fold
from ..attention.hopper import HEAD_DIMS
from ..hw import jit, mma
from ..hw.jit import LOG2E

BM, BN = 64, 64  # rows a block (one warpgroup), rows of a loop tile


@jit.device
def visible(i, j, shift, left, right):
    """Query i sees key j: −left ≤ j − (i + shift) ≤ right (−1: no bound that side)."""
    dist = j - i - shift
    return (left < 0 or dist >= -left) and (right < 0 or dist <= right)


@jit.device
def whole(i0, j0, shift, left, right):
    """Every query of i0 … i0+63 sees every key of j0 … j0+63."""
    return ((left < 0 or j0 - (i0 + BM - 1) - shift >= -left)
            and (right < 0 or j0 + BN - 1 - i0 - shift <= right))


@jit.device
def row_term(lse, delta, b, h, r, sq):
    """Query row r's terms: (LSE·log2 e, D); (+inf, 0) for a row past Sq, and +inf for a
    row of LSE −inf (it saw no key): such a row takes no part (P = exp2(… − inf) = 0)."""
    x = lse[b, h, r] if r < sq else -math.inf
    return (x * float32(LOG2E) if x != -math.inf else math.inf,
            delta[b, h, r] if r < sq else float32(0.0))


@jit.device
def row_terms(lse, delta, b, h, row, sq, l2, dl):
    """The dQ kernels' per-row terms (:func:`row_term`) of the lane's query rows ``row``
    and ``row`` + 8, into l2 and dl."""
    for rr in range(2):
        l2[rr], dl[rr] = row_term(lse, delta, b, h, row + 8 * rr, sq)


@functools.cache
def padded_rows():
    """Kernel: grid (⌈Sp/128⌉, B·H) of 128 threads.  hb2's dK/dV kernel loads each query
    tile's LSE and D with its Q and dO tiles, by TMA, so it needs them as whole rows a map
    describes: l2[b, h, r], dl[b, h, r] = :func:`row_term` of row r, each row padded to
    Sp, a multiple of the tile (and so of 16 bytes, a map's row stride)."""
    @jit.kernel
    def pad(lse, delta, l2, dl):
        n_h, sq = lse.shape[1], lse.shape[2]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        r = cuda.blockIdx.x * 128 + cuda.threadIdx.x
        if r < l2.shape[2]:
            l2[b, h, r], dl[b, h, r] = row_term(lse, delta, b, h, r, sq)

    return pad


@jit.device
def ds_rows(s, dp, l2, dl, c2, row, j0, t, sk, shift, left, right, inside):
    """dS = P ∘ (dP − D) into ``dp`` for the lane's rows ``row``, ``row`` + 8 and the key
    tile at ``j0`` (the S layout: dp[4j + 2rr + e] is row rr, key 8j + 2t + e), with
    P = exp2(c2·S − LSE·log2 e) and 0 where a key is past Sk or unseen (``inside``: every
    key of the tile seen by every row of the block)."""
    for rr in range(2):
        r = row + 8 * rr
        for j in range(BN // 8):
            for e in range(2):
                x, key = 4 * j + 2 * rr + e, j0 + 8 * j + 2 * t + e
                p = math.exp2(s[x] * c2 - l2[rr])  # P
                if not inside and not (key < sk and visible(r, key, shift, left, right)):
                    p = float32(0.0)
                dp[x] = p * (dp[x] - dl[rr])  # dS = P ∘ (dP − D)


@functools.cache
def products(kind, d, dv, started=False):
    """The four products and the packer both kernels use: (Sᵀ-like on D, dPᵀ-like on Dv,
    += · (·, Dv), += · (·, D), pack).  ``started``: each product only started, as one
    committed group, and not waited for (hb2 waits for two at once)."""
    made = hopper_fold.issued if started else hopper_fold.products
    qk, acc_v = made(kind, d, dv, BN, BM, True)
    vdo, acc_k = made(kind, dv, d, BN, BM, True)
    return qk, vdo, acc_v, acc_k, hopper_fold.steps(kind, dv, BN)[2]


@functools.cache
def writer(out_dtype, width):
    """``write(out, b, h, row, limit, acc, factor, t)``: the lane's two rows ``row`` and
    ``row`` + 8 (those < ``limit``) of a ``width``-column accumulator (the wgmma layout:
    acc[4j + 2rr + e] is row rr, column 8j + 2t + e), times ``factor``, into out[b, h]."""
    store = jit.storer(out_dtype)

    @jit.device
    def write(out, b, h, row, limit, acc, factor, t):
        for rr in range(2):
            if row + 8 * rr < limit:
                for j in range(width // 8):
                    for e in range(2):
                        out[b, h, row + 8 * rr, 8 * j + 2 * t + e] = store(
                            acc[4 * j + 2 * rr + e] * factor)

    return write


@functools.cache
def adder(width):
    """``add(out, b, h, row, limit, acc, factor, t)``: as :func:`writer`'s ``write``, but
    added to a float32 ``out`` (atomically, two columns an instruction: another block adds
    to the same rows), its rows 8-byte aligned."""
    @jit.device
    def add(out, b, h, row, limit, acc, factor, t):
        for rr in range(2):
            if row + 8 * rr < limit:
                for j in range(width // 8):
                    mma.red_add_v2(out, b, h, row + 8 * rr, 8 * j + 2 * t,
                                   acc[4 * j + 2 * rr] * factor, acc[4 * j + 2 * rr + 1] * factor)

    return add


def checked(do, q, k, v, scale):
    """The checks both backwards' launches share; returns (kind, D, Dv)."""
    if q.dtype not in (np.float16, np.uint16) or not (do.dtype == q.dtype == k.dtype == v.dtype):
        raise TypeError(f"do, q, k, v must all be float16 or all uint16 (bfloat16 bits), got "
                        f"{do.dtype}, {q.dtype}, {k.dtype}, {v.dtype}")
    d, dv = q.shape[3], v.shape[3]
    if d not in HEAD_DIMS or dv not in HEAD_DIMS:
        raise ValueError(f"D and Dv must be 64 or 128, got {d} and {dv}")
    if scale is not None and not (math.isfinite(scale) and scale != 0.0):
        raise ValueError(f"scale must be finite and nonzero, got {scale}")
    return ("f16" if q.dtype == np.float16 else "bf16"), d, dv
