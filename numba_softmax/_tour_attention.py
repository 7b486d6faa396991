"""The attention stop of ``numba-softmax tour``: the (m, ℓ, O) state at work, then the
flash kernel against materialised attention.

1. One query row walks the key tiles.  After each tile of Bc keys the running state is
   printed: m (the largest score so far), ℓ (Σ exp(s − m) so far) and |O| (the norm of
   Σ exp(s − m)·v so far).  Each tile's own state is merged in with the combiner — exactly
   the update the kernel does per tile — and at the end O/ℓ is the attention output and
   m + log ℓ its log-sum-exp, equal to the materialised answer.
2. A small batch through the device kernel (:func:`numba_softmax.attention`) and through
   materialised attention (the whole score matrix, NumPy): the max error of each against
   a float64 reference, the bytes of the score matrix that the flash kernel never
   allocates, and the time of each (the flash kernel's by the benchmark's timer; on the
   simulator no time is shown: it would measure Python threads).

Runs on the GPU, or (tiny sizes) on the CUDA simulator.
"""

import math
import time

import numpy as np
from numba import cuda

from .runtime.sim import simulator_enabled
from . import reference as R
from .bench.timing import seconds
from .combine import IDENTITY, combine_output_np, lse_np, weight_np
from .kernels.attention.attention import fit_tiles


def _row_walk(echo, rng, sk=40, d=16, block_k=8):
    q = rng.standard_normal(d)
    k = rng.standard_normal((sk, d))
    v = rng.standard_normal((sk, d))
    scale = 1.0 / math.sqrt(d)
    echo(f"   a. one query row, {sk} keys in tiles of Bc = {block_k} (D = {d}); the state after each tile:")
    echo("      keys        m          ℓ        |O|")
    m, l, o = np.float64(IDENTITY[0]), np.float64(IDENTITY[1]), np.zeros(d)
    for j0 in range(0, sk, block_k):
        s = scale * (k[j0 : j0 + block_k] @ q)  # the tile's scores
        m_t = s.max()
        p = weight_np(s, m_t)  # the tile's own state (m_t, Σp, Σp·v) ...
        m, l, o = combine_output_np(m, l, o, m_t, p.sum(), p @ v[j0 : j0 + block_k])  # ... merged in
        echo(f"      {j0:3d}–{min(j0 + block_k, sk) - 1:<3d} {m:9.4f} {l:10.4f} {np.linalg.norm(o):10.4f}")
    out, lse = o / l, lse_np(m, l)
    ref, ref_lse = R.attention(q[None], k, v, return_lse=True)
    err = float(np.abs(out - ref[0]).max())
    echo("      (where m jumps, the ℓ and O so far are re-based by the factor exp(m_old − m_new) < 1)")
    echo(f"      O/ℓ: max |O/ℓ − materialised| = {err:.1e};  LSE = m + log ℓ = {float(lse):.6f} "
         f"(materialised {float(ref_lse[0]):.6f})")
    return err


def _batch(echo, rng, sim):
    from .attention import attention

    bh, s, d = (2, 32, 16) if sim else (8, 2048, 64)
    q, k, v = (rng.standard_normal((bh, s, d)).astype(np.float32) for _ in range(3))
    echo(f"   b. a batch of {bh} heads, Sq = Sk = {s}, D = {d}, float32, causal:")
    ref = R.attention(q, k, v, causal=True)

    q_d, k_d, v_d = (cuda.to_device(x) for x in (q, k, v))  # time the kernel, not copies
    flash = attention(q_d, k_d, v_d, causal=True).copy_to_host()
    flash_ms = "—" if sim else \
        f"{seconds(lambda: attention(q_d, k_d, v_d, causal=True), sim, repeat=5) * 1e3:9.2f}"

    t = time.perf_counter()
    scores = (q @ np.swapaxes(k, -1, -2)) / np.float32(math.sqrt(d))
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, np.float32(-np.inf))
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    materialised = (p / p.sum(axis=-1, keepdims=True)) @ v
    t_mat = time.perf_counter() - t

    e_flash = float(np.abs(flash - ref).max())
    e_mat = float(np.abs(materialised - ref).max())
    score_bytes = scores.nbytes
    flash_name = "flash (simulated device)" if sim else "flash (device)"
    block_q, block_k = fit_tiles(d, d, small=sim)
    echo(f"      {flash_name:<25} max error {e_flash:.1e}  {flash_ms:>9} ms   "
         f"memory: O and LSE only ({flash.nbytes + 4 * bh * s} bytes)")
    q16, k16, v16 = (cuda.to_device(x.astype(np.float16)) for x in (q, k, v))
    tc = attention(q16, k16, v16, causal=True).copy_to_host().astype(np.float64)
    tc_ms = "—" if sim else \
        f"{seconds(lambda: attention(q16, k16, v16, causal=True), sim, repeat=5) * 1e3:9.2f}"
    echo(f"      {'float16, tensor cores':<25} max error {float(np.abs(tc - ref).max()):.1e}  "
         f"{tc_ms:>9} ms   the same fold on mma.sync (P rounded to float16 in registers)")
    echo(f"      {'materialised (NumPy)':<25} max error {e_mat:.1e}  {t_mat * 1e3:9.2f} ms   "
         f"score matrix: {score_bytes} bytes (and P as much again)")
    echo(f"      The score matrix grows as Sq·Sk: at Sq = Sk = 32768 it is "
         f"{4 * 32768 ** 2 / 2 ** 30:.0f} GiB per head in float32;")
    echo(f"      the flash kernel holds one {block_q}×{block_k} tile of it per block, on chip.")
    return e_flash, e_mat


def tour_attention(echo=print, seed=2024):
    """Print the attention tour; returns the max errors (row walk, flash, materialised)."""
    rng = np.random.default_rng(seed)
    sim = simulator_enabled()
    echo("   Attention is a softmax over each row of scale·Q Kᵀ, then a weighted sum of V's rows;")
    echo("   FlashAttention keeps each query row's (m, ℓ, O) on chip and never forms Q Kᵀ.")
    e_row = _row_walk(echo, rng)
    e_flash, e_mat = _batch(echo, rng, sim)
    return e_row, e_flash, e_mat
