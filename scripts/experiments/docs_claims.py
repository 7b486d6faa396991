#!/usr/bin/env python
"""The docs' claims about the GPU's rounding, checked on a GPU; and the walk of one row.

    python scripts/experiments/docs_claims.py            # prints; with $OUT set, also writes
                                                 # $OUT/walk-<device>.txt for docs/benchmarks/

1. ``algorithms/reduction.md``: the compiled combiner is ℓ = fma(ℓ_a, w_a, ℓ_b·w_b), so
   a ⊕ b and b ⊕ a can differ in the last bit, and after ``warp_combine`` the 32 lanes
   agree on m exactly but on ℓ only to a few ulps.  Counted on fresh random states, each
   result checked against float64 first.
2. ``caveats.md``: denormals are flushed — softmax of the float32 row [0, −100] is [1, 0]
   with every method (PyTorch: [1, 3.8e-44]); float64 keeps the denormal.
3. ``textbook/2-online.md``: the walk of one softmax row and one attention row, computed here.

Prints one line per check and exits non-zero if a check fails (a docs claim is then
wrong).  Nothing is timed: these are statements about rounding.  ~30 s on an H100, most
of it JIT compilation.
"""

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from numba import cuda  # noqa: E402

import numba_softmax as ns  # noqa: E402
from numba_softmax.combine import combine_device, combine_np  # noqa: E402
from numba_softmax.kernels.hw import jit
from numba_softmax.runtime import launcher  # noqa: E402
from numba_softmax.kernels.rows.reduce import warp_combine  # noqa: E402

F32 = np.float32
FAILED = []


def check(ok, what):
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILED.append(what)


@jit.kernel
def _pairs(m_a, l_a, m_b, l_b, l_ab, l_ba):
    i = cuda.grid(1)
    if i < m_a.shape[0]:
        l_ab[i] = combine_device(m_a[i], l_a[i], m_b[i], l_b[i])[1]
        l_ba[i] = combine_device(m_b[i], l_b[i], m_a[i], l_a[i])[1]


@jit.kernel
def _warps(m, l, m_out, l_out):
    i = cuda.grid(1)
    mm, ll = warp_combine(m[i], l[i])
    m_out[i] = mm
    l_out[i] = ll


def fma_claims(rng, n=1 << 20, warps=1 << 14):
    print("1. the combiner's FMA (reduction.md)")
    m = (2 * rng.standard_normal((2, n))).astype(F32)
    l = (1 + 31 * rng.random((2, n))).astype(F32)
    l_ab, l_ba = (cuda.to_device(np.full(n, np.nan, F32)) for _ in range(2))  # poisoned
    args = (*(cuda.to_device(a) for a in (m[0], l[0], m[1], l[1])), l_ab, l_ba)
    launcher.launch(_pairs, (n + 255) // 256, 256, 0, args)
    ab, ba = l_ab.copy_to_host(), l_ba.copy_to_host()
    ref = combine_np(m[0].astype(np.float64), l[0].astype(np.float64),
                     m[1].astype(np.float64), l[1].astype(np.float64))[1]
    check(np.allclose(ab, ref, rtol=1e-5) and np.allclose(ba, ref, rtol=1e-5),
          "a ⊕ b and b ⊕ a match float64 to 1e-5")
    differ = int((ab != ba).sum())
    gap = float((np.abs(ab - ba) / np.spacing(np.minimum(ab, ba))).max())
    check(differ > 0, f"a ⊕ b != b ⊕ a in {differ} of {n} pairs (largest gap {gap:.0f} ulp)")

    m = (2 * rng.standard_normal((warps, 32))).astype(F32)
    l = (1 + 31 * rng.random((warps, 32))).astype(F32)
    m_out, l_out = (cuda.to_device(np.full(m.size, np.nan, F32)) for _ in range(2))
    launcher.launch(_warps, warps, 32, 0, (cuda.to_device(m.ravel()), cuda.to_device(l.ravel()),
                                           m_out, l_out))
    mo, lo = m_out.copy_to_host().reshape(m.shape), l_out.copy_to_host().reshape(m.shape)
    ref_m = m.max(axis=1)
    ref_l = (l.astype(np.float64) * np.exp(m.astype(np.float64) - ref_m[:, None])).sum(axis=1)
    check((mo == ref_m[:, None]).all(), "after warp_combine every lane holds the exact max")
    check(np.allclose(lo, ref_l[:, None], rtol=1e-5), "every lane's ℓ matches float64 to 1e-5")
    spread = (lo.max(axis=1) - lo.min(axis=1)) / np.spacing(lo.min(axis=1))
    frac = float((spread > 0).mean())
    check(0 < frac and spread.max() <= 8, f"lanes disagree on ℓ in {100 * frac:.1f} % of "
          f"{warps} warps, at most {spread.max():.0f} ulp apart (the page: a few ulps)")


def ftz_claims():
    print("2. denormals flushed (caveats.md)")
    x = np.array([[0.0, -100.0]], F32)
    for method in ("three_pass", "fused", "online", "split"):
        p = np.asarray(ns.softmax(x, method=method))
        check(p[0, 0] == 1 and p[0, 1] == 0, f"{method:10s} float32 softmax([0, −100]) = "
              f"[{p[0, 0]:.6g}, {p[0, 1]:.3g}]")
    p64 = np.asarray(ns.softmax(x.astype(np.float64)))
    check(p64[0, 1] > 0, f"float64 keeps it: {p64[0, 1]:.3g}")
    try:
        import torch

        t = torch.softmax(torch.tensor(x, device="cuda"), -1).cpu().numpy()
        print(f"       torch.softmax float32: [{t[0, 0]:.6g}, {t[0, 1]:.3g}]")
    except Exception as err:  # torch missing or without CUDA
        print(f"       (torch not compared: {type(err).__name__})")


def main():
    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name
    print(f"docs claims on {name}")
    fma_claims(np.random.default_rng(int.from_bytes(os.urandom(4), "little")))
    ftz_claims()
    print("3. the walk of one row (textbook/2-online.md)")
    import walk

    text = walk.markdown()
    print(text)
    out = os.environ.get("OUT")
    if out:
        path = Path(out) / f"walk-{walk.slug(name)}.txt"
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} (commit it as docs/benchmarks/{path.name})")
    print("DOCS CLAIMS:", "PASS" if not FAILED else f"FAIL ({len(FAILED)})")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

