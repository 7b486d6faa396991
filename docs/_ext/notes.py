"""The sources' own forms, run: the numbers behind ``sources.md`` (seeds 000 and 001 here;
the merges of seed 002, seed 004's tree and the GPU's FMA in ``notes_merge.py``).

Each ``*_data`` function computes (the tests in ``tests/test_sources_notes.py`` assert on
it); each ``*_md`` function formats the same numbers for a page (``computed.py`` puts
them where a page says ``% computed: notes.NAME``).  Everything is NumPy on the host,
float32 where the source computes in float32.
"""

import glob
import math
import os

import numpy as np

from numba_softmax.combine import combine_np
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
    rows = [("fused (the row on chip)", f"{mn:,} = MN", f"{mn:,} = MN", f"{2 * mn:,}", "1.00"),
            ("seed 001's online, as the emulation counted", f"{loaded:,} = {loaded // mn}MN",
             f"{stored:,} = MN", f"{loaded + stored:,}", f"{(loaded + stored) / (2 * mn):.2f}")]
    return _table(["kernel", "values read", "values written", "total", "× fused"], rows) + (
        f"\n\nM × N = {x.shape[0]} × {x.shape[1]}, chunks of 1024 (the last one ragged).")
