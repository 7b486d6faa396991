"""What goes in and out of the attention backward (:mod:`.attention_backward`): the two
small kernels around it and the launch that runs all three.

``preprocess``  D_i = rowsum(dO_i ∘ O_i) for every query row, and the row of the dQ
                accumulator zeroed — FlashAttention-2's ``flash_bwd_preprocess``.  D_i is
                Σ_j P_ij dP_ij computed without P: dP = dO Vᵀ and O = P V give
                Σ_j P_ij (dO_i · v_j) = dO_i · O_i (``docs/algorithms/backward.md``).
                8 lanes per row, a 3-step shuffle sum; reads dO and O once (2·Sq·Dv·b bytes).
``convert``     dQ = the float32 accumulator, rounded to dQ's storage type (float16 and
                bfloat16; float32 and float64 gradients accumulate in dQ itself).
``launch``      what every attention backward launches around its main kernel: the
                checks, the window, preprocess, then the main kernel, then convert.
"""

import functools
import math

from numba import cuda

from ..hw import jit
from ...runtime import launcher
from ..hw.jit import accumulator
from ...runtime.launcher import scratch

FULL_MASK = 0xFFFFFFFF
LANES = 8  # lanes per row in the preprocess kernel
THREADS = 128


@functools.cache
def preprocess(dtype):
    """Kernel: grid (⌈Sq·8/128⌉, B·H); delta (B, H, Sq) and dq_acc (B, H, Sq, D)."""
    acc, load = accumulator(dtype), jit.loader(dtype)

    @jit.kernel
    def delta_rows(do, o, delta, dq_acc):
        n_h = do.shape[1]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        row = (cuda.blockIdx.x * THREADS + cuda.threadIdx.x) // LANES
        lane = cuda.threadIdx.x % LANES
        part = acc(0.0)
        if row < do.shape[2]:
            for c in range(lane, do.shape[3], LANES):  # D_i = Σ_c dO_ic · O_ic
                part += load(do[b, h, row, c]) * load(o[b, h, row, c])
            for c in range(lane, dq_acc.shape[3], LANES):
                dq_acc[b, h, row, c] = 0.0
        offset = LANES // 2
        while offset > 0:  # the 8 lanes of a row: every lane of the warp takes part
            part += cuda.shfl_xor_sync(FULL_MASK, part, offset)
            offset //= 2
        if lane == 0 and row < do.shape[2]:
            delta[b, h, row] = part

    return delta_rows


@functools.cache
def convert(dtype):
    """Kernel: grid (⌈Sq·D/128⌉, B·H); dq = store(dq_acc), element by element."""
    store = jit.storer(dtype)

    @jit.kernel
    def round_dq(dq_acc, dq):
        n_h, d = dq.shape[1], dq.shape[3]
        b, h = cuda.blockIdx.y // n_h, cuda.blockIdx.y % n_h
        e = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if e < dq.shape[2] * d:
            dq[b, h, e // d, e % d] = store(dq_acc[b, h, e // d, e % d])

    return round_dq


def launch(main, do, q, k, v, o, dq, *, causal, window, scale, stream, max_head_dim):
    """Check the shapes, fold ``causal`` into the window (right <= 0), launch preprocess,
    then ``main(delta, dq_acc, scale, left, right)`` — the main kernel, skipped when there
    is no key (dK, dV are empty) — then convert when dQ is 16-bit (its accumulator is a
    float32 scratch buffer; float32 and float64 accumulate in dQ itself)."""
    n_b, n_h, sq, d = q.shape
    n_kv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    if not (1 <= d <= max_head_dim and 1 <= dv <= max_head_dim):
        raise ValueError(f"head dimensions must be between 1 and {max_head_dim}, got D={d}, "
                         f"Dv={dv}")
    if n_kv == 0 or n_h % n_kv:
        raise ValueError(f"q has {n_h} heads, k and v {n_kv}: a multiple is needed (GQA)")
    if n_b * n_h > 65535:
        raise ValueError(f"at most 65535 batch·heads per launch, got {n_b * n_h}")
    left, right = (int(w) for w in window)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rows = n_b * n_h * sq
    delta = scratch((n_b, n_h, max(sq, 1)), accumulator(q.dtype).name, stream, "delta")
    dq_acc = dq if dq.dtype.itemsize >= 4 else scratch((n_b, n_h, sq, d), "float32", stream, "dq")
    if rows:  # D = rowsum(dO ∘ O), the dQ accumulator zeroed
        grid = (-(-sq * LANES // THREADS), n_b * n_h)
        launcher.launch(preprocess(q.dtype), grid, THREADS, stream, (do, o, delta, dq_acc))
    if n_b * n_kv * sk:  # (with Sq = 0 the main kernel writes dK = dV = 0)
        main(delta, dq_acc, scale, left, right)
    if dq_acc is not dq and rows:  # round the accumulator into dQ
        grid = (-(-sq * d // THREADS), n_b * n_h)
        launcher.launch(convert(q.dtype), grid, THREADS, stream, (dq_acc, dq))
