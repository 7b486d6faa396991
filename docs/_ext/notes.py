"""The sources' own forms, run: the numbers behind ``sources.md`` and the FMA note of
``algorithms/reduction.md``.

Each ``*_data`` function computes (the tests in ``tests/test_sources_notes.py`` assert on
it); each ``*_md`` function formats the same numbers for a page (``computed.py`` puts
them where a page says ``% computed: notes.NAME``).  Everything is NumPy on the host —
float32 where the source computes in float32 — except :func:`ring_md`, which also runs
the package's device merge.
"""

import glob
import math
import os

import numpy as np

from numba_softmax.combine import combine_np, lse_np
from numba_softmax.reference import online_state, trees

F32 = np.float32


def _g(v, digits=9):
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+∞" if v > 0 else "−∞"
    return f"{v:.{digits}g}".replace("-", "−")


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _ulps(a, b):
    """Distance of float32 a from the float64 value b, in units of a's last place."""
    return (float(a) - float(b)) / float(np.spacing(F32(abs(float(b)))))


# --- seed 000: "bit-equal in any order" -----------------------------------------------
def order_data(seed=0, n=1024, chunk=32):
    """One float32 row's 32 chunk states folded in four orders (float32 throughout)."""
    x = (3 * np.random.default_rng(seed).standard_normal(n)).astype(F32)
    m_c, l_c = online_state(x.reshape(-1, chunk), block=chunk, dtype=F32)  # max, then Σ
    ref = float(np.exp(x.astype(np.float64) - x.max()).sum())
    perm = np.random.default_rng(seed + 1).permutation(len(m_c))
    orders = {"left to right": np.arange(len(m_c)), "right to left": np.arange(len(m_c))[::-1],
              "a shuffled order": perm}
    out = {}
    for name, order in orders.items():
        m, l = F32(-np.inf), F32(0)
        for k in order:
            m, l = combine_np(m, l, m_c[k], l_c[k])
        out[name] = (F32(m), F32(l))
    out["pairwise tree"] = tuple(F32(v) for v in trees.halving_tree(m_c, l_c))
    return x, out, ref


def order_md():
    x, out, ref = order_data()
    rows = [(name, _g(m, 7), _g(l), f"`{np.asarray(l, F32).view(np.uint32):08x}`",
             f"{_ulps(l, ref):+.1f}".replace("-", "−")) for name, (m, l) in out.items()]
    return _table(["order of the 32 merges", "m", "ℓ (float32)", "ℓ's bits", "ulps from exact"],
                  rows) + f"\n\nExact (float64, the whole row): ℓ = {_g(ref, 12)}."


def sweep_data(seed=0, n=1024, blocks=(1, 2, 8, 32, 128, 512, 1024)):
    """Seed 000's block-size sweep, in float32 and in its own order of operations:
    sequential sums (as its C loops), naive = max, Σ, divide; online = per-block (m, ℓ)."""
    z = (3 * np.random.default_rng(seed).standard_normal(n)).astype(F32)

    def seq_sum(v):  # float32, left to right, like `sum += expf(...)` in C
        return np.cumsum(v, dtype=F32)[-1]

    with np.errstate(over="ignore"):
        m = z.max()
        naive_l = seq_sum(np.exp(z - m))
        naive = np.exp(z - m) / naive_l
        rows = []
        for b in blocks:
            m_run, l_run = F32(-np.inf), F32(0)
            for s in range(0, n, b):
                blk = z[s : s + b]
                mb = blk.max()
                lb = seq_sum(np.exp(blk - mb))
                mn = max(m_run, mb)
                l_run = F32(l_run * np.exp(F32(m_run - mn)) + lb * np.exp(F32(mb - mn)))
                m_run = mn
            p = np.exp(z - m_run) / l_run
            rows.append((b, float(np.abs(p - naive).max()), float(seq_sum(p)),
                         bool(l_run == naive_l), bool(m_run == m)))
    return rows


def sweep_md():
    rows = [(b, f"{d:.2e}", f"{s:.6f}", "yes" if le else "no", "yes" if me else "no")
            for b, d, s, le, me in sweep_data()]
    return _table(["block B", "max ∣online − naive∣", "Σp", "ℓ bit-equal to naive", "m bit-equal"],
                  rows)


# --- seed 000: sizes and FLOPs ---------------------------------------------------------
SIZES = [  # (who, claim, N, bytes per value, what the source says)
    ("seed 000", "N×N scores, float32", 65536, 4, "16 GB"),
    ("seed 000", "N×N scores, bfloat16", 65536, 2, "4 GB"),
    ("seed 003", "T×T weights, FP16, per head", 32000, 2, "≈ 2 GB"),
    ("these docs", "Sq×Sk scores, float32, per head", 32768, 4, "4 GiB"),
]


def sizes_md():
    rows = [(who, what, f"{n:,}", f"{n}² × {b} = {n * n * b:,}", f"{n * n * b / 2**30:.2f} GiB",
             said) for who, what, n, b, said in SIZES]
    return _table(["source", "matrix", "N", "bytes", "is", "the source says"], rows)


def macs(sq, sk, d, dv):
    """Multiply-adds of materialised attention, counted by running it on all-ones matrices:
    every entry of ones(Sq, D) @ ones(D, Sk) is D products, so the sum is Sq·Sk·D."""
    qk = (np.ones((sq, d)) @ np.ones((d, sk))).sum()
    pv = (np.ones((sq, sk)) @ np.ones((sk, dv))).sum()
    return int(qk), int(pv)


def csv_flops_rows():
    """Attention rows of the committed benchmark CSVs: (rows checked, rows whose flops
    column is 4·B·H·Sq·Sk·D, halved with causal)."""
    import csv

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
    total = ok = 0
    for path in sorted(glob.glob(os.path.join(here, "*.csv"))):
        with open(path, encoding="utf-8") as f:
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
        for r in rows:
            if r.get("suite") != "attention" or not r.get("flops"):
                continue
            b, h, sq, sk, d = (int(r[c]) for c in ("B", "H", "Sq", "Sk", "D"))
            want = 4 * b * h * sq * sk * d // (2 if r.get("causal") == "True" else 1)
            total += 1
            ok += int(float(r["flops"]) == want)
    return total, ok


def flops_md():
    sq, sk, d = 6, 10, 4
    qk, pv = macs(sq, sk, d, d)
    n, hd = 65536, 128
    total, ok = csv_flops_rows()
    lines = [
        f"Counted by running materialised attention on all-ones matrices with Sq = {sq}, "
        f"Sk = {sk}, D = Dv = {d}: $QK^\\top$ takes {qk} multiply-adds, $PV$ {pv}; "
        f"{qk + pv} multiply-adds are {2 * (qk + pv)} FLOPs $= 4 S_q S_k D$ "
        f"({4 * sq * sk * d}), not $2 S_q S_k D$ ({2 * sq * sk * d}).",
        "",
        f"At N = 65536, D = {hd}: $2N^2D$ = {2 * n * n * hd:.3g}, but $4N^2D$ = "
        f"{4 * n * n * hd:.3g} FLOPs per head.",
    ]
    if total:
        lines += ["", f"The committed benchmark counts the same way: {ok} of its {total} attention "
                  "rows have flops $= 4 B H S_q S_k D$ (half of it with `causal`)."]
    return "\n".join(lines)


# --- seed 001: "the same memory traffic as the fused kernel" --------------------------
def seed001_online(x, block=1024):
    """Seed 001's Triton kernel, emulated chunk by chunk in float32, counting the values
    it loads and stores (masked lanes move nothing).  Returns (y, loaded, stored)."""
    x = np.asarray(x, F32)
    y = np.empty_like(x)
    loaded = stored = 0
    for r in range(x.shape[0]):
        m, d = F32(-np.inf), F32(0)
        for s in range(0, x.shape[1], block):  # pass 1: accumulate (m, d) over chunks
            c = x[r, s : s + block]
            loaded += c.size
            m_new = max(m, c.max())
            d = F32(d * np.exp(F32(m - m_new)) + np.exp(c - m_new).sum(dtype=F32))
            m = m_new
        for s in range(0, x.shape[1], block):  # pass 2: normalise
            c = x[r, s : s + block]
            loaded += c.size
            y[r, s : s + block] = np.exp(c - m) / d
            stored += c.size
    return y, loaded, stored


def traffic_data(rows=4, n=5000, block=1024):
    x = np.random.default_rng(1).standard_normal((rows, n)).astype(F32)
    y, loaded, stored = seed001_online(x, block)
    return x, y, loaded, stored


def traffic_md():
    x, y, loaded, stored = traffic_data()
    mn = x.size
    rows = [("fused (row on chip)", "MN", "MN", f"{2 * mn:,}", "1.00"),
            ("seed 001's online, as the emulation counted", f"{loaded:,} = {loaded // mn}MN",
             f"{stored:,} = MN", f"{loaded + stored:,}", f"{(loaded + stored) / (2 * mn):.2f}")]
    return _table(["kernel", "values read", "values written", "total", "× fused"], rows) + (
        f"\n\nM × N = {x.shape[0]} × {x.shape[1]}, chunks of 1024 (the last one ragged).")


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
