"""The two score modifications of the attention kernels, flash-attn's: soft-capping and ALiBi.

    x ← softcap·tanh(x / softcap)          ``softcap`` > 0
    x ← x − slope·|i + Sk − Sq − j|         ``alibi``: one slope per (sequence, query head)

applied to the scaled score x = scale·q_i·k_j of every key a tile holds, before the mask
and the online update (NumPy twin: :func:`numba_softmax.reference.scores`).

Each is a compile-time specialisation of the kernel factories (their ``softcap_on``,
``alibi_on`` arguments): with both off a kernel is the one it was without them — same
arguments, same code — and with either on, the kernel's scale argument becomes the
tuple (scale, softcap, slopes) that :func:`runtime` builds, unpacked on entry, so no
kernel grows an argument it does not use.  The backward kernels rebuild the modified
score from s the same way (:func:`grad_modifier`) and need one more factor, its
derivative: ALiBi adds a constant (d/dx = 1), and d/dx of c·tanh(x / c) is
1 − tanh²(x / c) = 1 − (x' / c)², x' the capped score.  The modification itself is
:func:`modifier`'s device function, which takes the score in whatever base the kernel
keeps it: the CUDA-core kernels hold base-2 scores (x·log₂e), and
c·tanh(x / c) and x − s·|δ| in base 2 are the same functions with c and s times log₂e.
"""

import functools
import math

import numba
import numpy as np

from ...runtime import counters
from ..hw import jit

__all__ = ["tanh", "modifier", "runtime", "flags", "slope_row", "setup", "tile_modifier",
           "fragment_modifier", "rows_modifier", "grad_modifier", "transposed_grad_modifier", "LOG2E"]
LOG2E = 1.0 / math.log(2.0)


def flags(softcap, alibi):
    """(softcap_on, alibi_on) of a launch's runtime values: the factories' keys."""
    return bool(softcap), alibi is not None


def runtime(scale, softcap, alibi):
    """The kernel's scale argument: ``scale`` itself with both options off, else the
    tuple (scale, softcap, slopes) — slopes a float32 (1 or B, Hq) device array, a
    one-element placeholder when ALiBi is off (never read then)."""
    if not softcap and alibi is None:
        return scale
    slopes = counters.placeholder(2, np.float32) if alibi is None else alibi
    return (float(scale), float(softcap), slopes)


@jit.device
def slope_row(slopes, b):
    """The row of ``slopes`` (1 or B, Hq) for sequence ``b``: one row serves every b."""
    return b if slopes.shape[0] > 1 else 0


@functools.cache
def tanh(acc, fast):
    """Device function tanh(y) in ``acc``.  Under fastmath, ``math.tanh`` of a float32 is
    the hardware's tanh.approx (relative error near 2⁻¹¹): close enough beside fp16/bf16
    inputs (``fast``), not for float32 attention, which takes −expm1(−2y) / (2 + expm1(−2y))
    for y ≥ 0 instead, a few ulps (expm1 has no approximate form)."""
    two = acc(2.0)

    @jit.device
    def tanh_of(y):
        if fast:
            return math.tanh(y)
        e = math.expm1(-two * abs(y))  # in (−1, 0]
        r = -e / (two + e)
        return r if y >= 0 else -r

    return tanh_of


@functools.cache
def modifier(acc, softcap_on, alibi_on, fast=False):
    """Device function ``modify(x, cap, slope, dist) -> x'`` in the accumulator type
    ``acc``: x a scaled score, ``cap`` the soft-cap, ``slope`` the head's slope and
    ``dist`` = i + Sk − Sq − j (an integer), all in the kernel's base; ``fast``: the
    hardware tanh (:func:`tanh`), for the fp16/bf16 tensor-core kernels."""
    one = acc(1.0)
    tanh_of = tanh(acc, fast)

    @jit.device
    def modify(x, cap, slope, dist):
        if softcap_on:
            x = cap * tanh_of(x * (one / cap))
        if alibi_on:
            x -= slope * acc(abs(dist))
        return x

    return modify


@functools.cache
def setup(acc, alibi_on, factor):
    """Device function ``setup(cap, slopes, b, h) -> (cap, slope)`` of sequence b, head h,
    in the accumulator type, both times ``factor`` (log₂e for base-2 scores, else 1)."""

    @jit.device
    def setup_mods(cap, slopes, b, h):
        slope = acc(slopes[slope_row(slopes, b), h] * factor) if alibi_on else acc(0.0)
        return acc(cap * factor), slope

    return setup_mods


@functools.cache
def tile_modifier(acc, softcap_on, alibi_on, rpl, cpl, group):
    """``modify_tile(s, r0, j0, shift, cap2, slope2)`` for the CUDA-core forward's register
    tile (:mod:`.flash_tiles`: rows r0 + 4·i, i < ``rpl``, keys j0 + ``group``·jj,
    jj < ``cpl``; base-2 scores): every score of the tile modified in place."""
    modify = modifier(acc, softcap_on, alibi_on)

    @jit.device
    def modify_tile(s, r0, j0, shift, cap2, slope2):
        for i in range(rpl):
            for jj in range(cpl):
                t = i * cpl + jj
                s[t] = modify(s[t], cap2, slope2, r0 + 4 * i + shift - (j0 + group * jj))

    return modify_tile


@jit.device
def _lane_rows_shared(row, slope, rr):
    """The forward's lane: rows row and row + 8 of one query head."""
    return row + 8 * rr, slope


@jit.device
def _lane_rows_own(row_i, slope, rr):
    """The decode kernel's lane: two packed rows, each its own query index and slope."""
    return row_i[rr], slope[rr]


@functools.cache
def _fragment(softcap_on, alibi_on, nb, lane_row):
    f32 = numba.float32
    modify = modifier(f32, softcap_on, alibi_on, True)

    @jit.device
    def modify_frag(s, sc, row, key0, shift, cap, slope):
        for rr in range(2):
            for n in range(nb):
                for e in range(2):
                    i, sl = lane_row(row, slope, rr)
                    x = s[n, 2 * rr + e] * sc
                    s[n, 2 * rr + e] = modify(x, cap, sl, i + shift - (key0 + 8 * n + e))

    return modify_frag


def fragment_modifier(softcap_on, alibi_on, nb):
    """``modify_frag(s, sc, row, key0, shift, cap, slope)`` for an ``mma`` accumulator tile
    of unscaled scores (:mod:`.tc_fold`: ``nb`` column blocks × 4; the lane's rows row and
    row + 8, keys key0 + 8·n + e): each becomes the modified base-e score of sc·s."""
    return _fragment(softcap_on, alibi_on, nb, _lane_rows_shared)


def rows_modifier(softcap_on, alibi_on, nb):
    """``modify_rows(s, sc, row_i, key0, shift, cap, slope)``: :func:`fragment_modifier` for
    the tensor-core decode kernel (:mod:`..decode.decode_tc`), whose two rows of a lane are
    packed rows of different query heads and indices: row rr is query ``row_i[rr]`` of a
    head of slope ``slope[rr]``."""
    return _fragment(softcap_on, alibi_on, nb, _lane_rows_own)


@functools.cache
def grad_modifier(acc, softcap_on, alibi_on, fast=False):
    """Device function ``modify_grad(x, cap, slope, dist) -> (x', g)``: :func:`modifier`'s
    x' and its derivative g = dx'/dx — 1 − (capped / cap)² with the soft-cap (the capped
    score rebuilt from x: tanh recomputed), else 1 (ALiBi's bias is a constant)."""
    cap_only, bias = modifier(acc, softcap_on, False, fast), modifier(acc, False, alibi_on)
    one = acc(1.0)

    @jit.device
    def modify_grad(x, cap, slope, dist):
        x = cap_only(x, cap, slope, dist)
        g = one
        if softcap_on:
            r = x * (one / cap)
            g = one - r * r
        return bias(x, cap, slope, dist), g

    return modify_grad


@functools.cache
def transposed_grad_modifier(softcap_on, alibi_on, nb):
    """``modify_t(s, dp, rows, buf, sc, key, i0, shift, t, cap, slopes, b, h)`` for the
    tensor-core backward's transposed accumulator tiles of unscaled scores (keys the rows:
    the lane's keys key and key + 8; queries the columns, i0 + 8·n + 2·t + e, n < ``nb``)
    of sequence b, query head h: sc·s becomes the modified base-e score, and dPᵀ becomes
    (dPᵀ − D)·g, D = rows[buf, 1, ·] by column, so that dSᵀ = Pᵀ ∘ dPᵀ."""
    f32 = numba.float32
    modify, setup_mods = grad_modifier(f32, softcap_on, alibi_on, True), setup(f32, alibi_on, 1.0)

    @jit.device
    def modify_t(s, dp, rows, buf, sc, key, i0, shift, t, cap, slopes, b, h):
        cap, slope = setup_mods(cap, slopes, b, h)
        for rr in range(2):
            for n in range(nb):
                for e in range(2):
                    col = 8 * n + 2 * t + e
                    x, g = modify(s[n, 2 * rr + e] * sc, cap, slope, i0 + col + shift - (key + 8 * rr))
                    s[n, 2 * rr + e] = x
                    dp[n, 2 * rr + e] = (dp[n, 2 * rr + e] - rows[buf, 1, col]) * g

    return modify_t
