"""Merging states, run: seed 002's LSE forms and ring update beside the combiner, seed
004's per-thread recurrence and tree, and the combiner as the GPU's FMA rounds it — the
numbers behind ``sources.md`` and the FMA note of ``algorithms/reduction.md``.

As in ``notes.py``: ``*_data`` computes, ``*_md`` formats for ``% computed: notes.NAME``.
NumPy on the host, float32 where the source computes in float32, except :func:`ring_data`,
which also runs the package's device merge (``merge_attention``).
"""

import numpy as np

from numba_softmax.combine import combine_np, lse_np
from numba_softmax.reference import online_state, trees

from notes import F32, _g, _table


# --- seed 002: the LSE merge ------------------------------------------------------------
LSE_PAIRS = [(0.5, 1.0), (0.0, 20.0), (3.0, -20.0), (0.0, -20.0), (0.0, 100.0), (10.0, 100.0),
             (-np.inf, 3.0), (-np.inf, -np.inf)]


def lse_forms(lse0, lse1):
    """float32: (typo as printed, seed 002's code, log1p form, the combiner, exact)."""
    a, b = F32(lse0), F32(lse1)
    with np.errstate(all="ignore"):
        typo = a + np.log(F32(1) + np.exp(b - np.exp(a)))
        code = a + np.log(F32(1) + np.exp(b - a))
        log1p = a + np.log1p(np.exp(b - a))
    m, l = combine_np(np.array([a]), np.array([F32(1)]), np.array([b]), np.array([F32(1)]))
    comb = F32(lse_np(m, l)[0])
    exact = np.logaddexp(np.float64(lse0), np.float64(lse1))
    return typo, code, log1p, comb, exact


def lse_md():
    rows = []
    for a, b in LSE_PAIRS:
        forms = lse_forms(a, b)
        rows.append((_g(a, 4), _g(b, 4), *(_g(v, 8) for v in forms)))
    return _table(["lse₀", "lse₁", "as printed: log(1 + exp(lse₁ − exp(lse₀)))",
                   "seed 002's code: log(1 + exp(lse₁ − lse₀))", "log1p(exp(lse₁ − lse₀))",
                   "the combiner", "exact (float64)"], rows)


def seed002_update(out, lse, block_out, block_lse):
    """Seed 002's ``_update_out_and_lse`` in float32 (NumPy for torch), as printed."""
    with np.errstate(all="ignore"):
        new_lse = lse + np.log(F32(1) + np.exp(block_lse - lse))
        out = np.exp(lse - new_lse)[..., None] * out + np.exp(block_lse - new_lse)[..., None] * block_out
    return out.astype(F32), new_lse.astype(F32)


RING_PAIRS = [(0.0, 1.0), (0.0, 100.0), (-np.inf, 0.0), (-np.inf, -np.inf)]


def ring_data():
    """(seed 002's update, the package's device merge) for O_a = [1, 0], O_b = [0, 1]."""
    import numba_softmax as ns

    la = np.array([a for a, _ in RING_PAIRS], F32)
    lb = np.array([b for _, b in RING_PAIRS], F32)
    oa = np.tile(np.array([1, 0], F32), (len(la), 1))
    ob = np.tile(np.array([0, 1], F32), (len(la), 1))
    mine = ns.merge_attention(oa, la, ob, lb)
    return seed002_update(oa, la, ob, lb), (np.asarray(mine[0]), np.asarray(mine[1]))


def ring_md():
    (so, sl), (mo, ml) = ring_data()
    rows = [(_g(a, 4), _g(b, 4), f"[{_g(so[i, 0], 4)}, {_g(so[i, 1], 4)}]", _g(sl[i], 6),
             f"[{_g(mo[i, 0], 4)}, {_g(mo[i, 1], 4)}]", _g(ml[i], 6))
            for i, (a, b) in enumerate(RING_PAIRS)]
    return _table(["lse_a", "lse_b", "seed 002: out", "seed 002: lse", "`merge_attention`: out",
                   "`merge_attention`: lse"], rows)


# --- seed 004 and the GPU's rounding --------------------------------------------------
def seed004_literal(values):
    """Seed 004's per-thread recurrence exactly as written (no identity guard), float32."""
    m, s = F32(-np.inf), F32(0)
    with np.errstate(invalid="ignore"):
        for x in np.asarray(values, F32):
            m_new = max(m, x)
            s = F32(s * np.exp(F32(m - m_new)) + np.exp(F32(x - m_new)))
            m = m_new
    return m, s


def seed004_md(values=(-np.inf, -np.inf, 0.5, 1.0)):
    m, s = seed004_literal(values)
    cm, cl = online_state(np.asarray(values, F32), block=1, dtype=F32)
    shown = ", ".join(_g(v, 3) for v in values)
    return (f"For the values [{shown}] the recurrence as written ends with (m, s) = "
            f"({_g(m, 6)}, {_g(s, 6)}); folded with the combiner, ({_g(cm, 6)}, {_g(cl, 6)}).")


def seed004_reached(threads):
    """The slots whose state reaches slot 0 in seed 004's loop ``offset = THREADS // 2;
    while offset > 0: slot[t] ⊕= slot[t + offset] for t < offset; offset //= 2``."""
    holds = [{t} for t in range(threads)]
    offset = threads // 2
    while offset > 0:
        for t in range(offset):
            holds[t] = holds[t] | holds[t + offset]
        offset //= 2
    return holds[0]


def fma_data(seed=3, warps=2000):
    """A pair of lane states whose two merge orders round differently under FMA, and the
    butterfly over many random warps: (example, fraction of warps whose lanes disagree on
    ℓ, the largest spread in ulps, whether m always agrees)."""
    rng = np.random.default_rng(seed)
    m = (2 * rng.standard_normal((warps, 32))).astype(F32)
    l = (1 + 31 * rng.random((warps, 32))).astype(F32)
    ab = trees.combine_fma32(m[:, 0], l[:, 0], m[:, 1], l[:, 1])[1]
    ba = trees.combine_fma32(m[:, 1], l[:, 1], m[:, 0], l[:, 0])[1]
    i = int(np.flatnonzero(ab != ba)[0])
    example = (m[i, 0], l[i, 0], m[i, 1], l[i, 1], ab[i], ba[i])
    bm, bl = trees.butterfly(m, l, trees.combine_fma32)
    spread = (bl.max(axis=1) - bl.min(axis=1)) / np.spacing(bl.min(axis=1))
    return example, float((spread > 0).mean()), float(spread.max()), bool((bm == bm[:, :1]).all())


def fma_md():
    (ma, la, mb, lb, ab, ba), frac, spread, m_same = fma_data()
    bits = lambda v: f"`{np.asarray(v, F32).view(np.uint32):08x}`"  # noqa: E731
    return "\n".join([
        _table(["", "lane a computes a ⊕ b", "lane b computes b ⊕ a"],
               [("states", f"a = ({_g(ma, 7)}, {_g(la, 7)})", f"b = ({_g(mb, 7)}, {_g(lb, 7)})"),
                ("ℓ = fma(own ℓ, own w, other ℓ·other w)", _g(ab), _g(ba)),
                ("bits", bits(ab), bits(ba))]),
        "",
        f"Over {2000} random warps run through the emulated butterfly, the 32 lanes end with "
        f"different ℓ in {100 * frac:.0f} % of the warps, at most {spread:.0f} ulp apart; "
        f"m {'agrees in every lane of every warp' if m_same else 'DISAGREES'}.",
    ])
