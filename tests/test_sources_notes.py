"""What the docs say about the sources, and about the GPU's rounding, computed and asserted.

``docs/sources.md`` and the FMA note of ``docs/algorithms/reduction.md`` show tables that
``docs/_ext/notes.py`` and ``notes_merge.py`` compute while the docs build; this module
checks the claims the text makes of them.  It also checks seed 004's shared-memory tree
against this package's warp-butterfly tree (``reference/trees.py``) and, where NVVM is
installed, the PTX the combiner compiles to.  Host-only NumPy, except the ring merge (the device merge kernel,
on the simulator) and the PTX check (a subprocess that compiles without a GPU).
"""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from numba_softmax import reference as R
from numba_softmax.reference import trees

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import notes  # noqa: E402
import notes_merge  # noqa: E402

F32 = np.float32


def ulps(a, b):
    """|a − b| in units of the last place of float32 b."""
    return abs(float(a) - float(b)) / float(np.spacing(F32(abs(float(b)))))


# --- seed 000 -------------------------------------------------------------------------
def test_merge_orders_agree_on_m_exactly_and_on_l_only_to_rounding():
    x, out, exact = notes.order_data()
    ms = {float(m) for m, _ in out.values()}
    ls = {np.asarray(l, F32).view(np.uint32).item() for _, l in out.values()}
    assert ms == {float(x.max())}  # a max never rounds
    assert len(ls) >= 2, "the page says the orders disagree on ℓ's last bits"
    assert all(ulps(l, exact) <= 2 for _, l in out.values())


def test_block_size_sweep_is_not_bit_equal_but_within_round_off():
    rows = notes.sweep_data()
    assert all(m_equal for *_, m_equal in rows)
    assert any(not l_equal for *_, l_equal, _ in rows)
    assert all(diff < 1e-6 and abs(total - 1) < 1e-5 for _, diff, total, _, _ in rows)
    assert any(diff > 0 for _, diff, *_ in rows)


def test_score_matrix_sizes():
    assert 65536**2 * 2 == 8 * 2**30  # bfloat16 at N = 64K: 8 GiB, not 4 GB
    assert 65536**2 * 4 == 16 * 2**30
    table = notes.sizes_md()
    assert "8.00 GiB" in table and "16.00 GiB" in table


def test_attention_flops_are_4_sq_sk_d():
    sq, sk, d = 6, 10, 4
    qk, pv = notes.macs(sq, sk, d, d)
    assert (qk, pv) == (sq * sk * d, sq * sk * d)
    assert 2 * (qk + pv) == 4 * sq * sk * d
    total, ok = notes.csv_flops_rows()
    assert ok == total


# --- seed 001 -------------------------------------------------------------------------
def test_seed001_online_reads_twice():
    x, y, loaded, stored = notes.traffic_data()
    assert loaded == 2 * x.size and stored == x.size  # 3MN, against the fused kernel's 2MN
    np.testing.assert_allclose(y, R.softmax(x), rtol=0, atol=1e-6)


# --- seed 002 -------------------------------------------------------------------------
def test_seed002_lse_forms():
    for a, b in notes_merge.LSE_PAIRS:
        typo, code, log1p, comb, exact = notes_merge.lse_forms(a, b)
        if math.isinf(exact):  # both sides empty: only the combiner keeps −inf
            assert comb == exact and math.isnan(code) and math.isnan(log1p)
            continue
        tol = np.spacing(F32(max(1.0, abs(exact))))  # float32 rounding of max(1, |lse|)
        assert abs(comb - exact) <= tol, (a, b, comb, exact)  # the combiner: every row
        if a == -np.inf:  # an empty side: −inf + inf
            assert math.isnan(code) and math.isnan(log1p)
        elif b - a > 88.8:  # exp leaves float32
            assert code == np.inf and log1p == np.inf
        else:
            assert abs(code - exact) <= tol and abs(log1p - exact) <= tol
    for a, b in notes_merge.LSE_PAIRS:  # the printed form: wrong wherever lse₁ matters
        typo, *_, exact = notes_merge.lse_forms(a, b)
        if np.isfinite(a) and b >= a:
            assert abs(typo - exact) > 0.5, (a, b, typo, exact)
    _, code, log1p, comb, exact = notes_merge.lse_forms(0.0, -20.0)
    assert code == 0 and comb == 0 and ulps(log1p, exact) <= 1  # only log1p keeps 2e-9 at 0


def test_seed002_ring_update_beside_merge_attention():
    (so, sl), (mo, ml) = notes_merge.ring_data()
    pairs = notes_merge.RING_PAIRS
    i = pairs.index((0.0, 100.0))
    assert sl[i] == np.inf and (so[i] == 0).all()  # seed 002: O = 0, LSE = +inf
    assert ml[i] == 100 and abs(mo[i, 1] - 1) < 1e-6 and mo[i, 0] < 1e-30
    i = pairs.index((-np.inf, 0.0))
    assert np.isnan(sl[i]) and np.isnan(so[i]).all()
    assert ml[i] == 0 and (mo[i] == [0, 1]).all()
    i = pairs.index((-np.inf, -np.inf))
    assert ml[i] == -np.inf and (mo[i] == 0).all()
    i = pairs.index((0.0, 1.0))
    np.testing.assert_allclose(so[i], mo[i], rtol=1e-6)
    assert abs(sl[i] - ml[i]) < 1e-6


# --- seed 004, and the GPU's rounding -------------------------------------------------
def test_seed004_recurrence_without_identity_guard_gives_nan():
    m, s = notes_merge.seed004_literal([-np.inf, -np.inf, 0.5, 1.0])
    assert m == 1.0 and np.isnan(s)
    m, l = R.online_state(np.array([-np.inf, -np.inf, 0.5, 1.0]), block=1)
    assert m == 1.0 and math.isclose(l, 1 + math.exp(-0.5))


def test_seed004_halving_drops_slots_unless_power_of_two():
    assert notes_merge.seed004_reached(512) == set(range(512))
    reached = notes_merge.seed004_reached(384)
    assert len(reached) == 256 and 2 not in reached
    with pytest.raises(ValueError, match="power-of-two"):
        trees.halving_tree(np.zeros(384), np.ones(384))


@pytest.mark.parametrize("threads, dtype", [(32, np.float64), (128, np.float32), (512, np.float32),
                                            (512, np.float64)])
def test_seed004_tree_and_this_tree_give_the_same_state(threads, dtype):
    rng = np.random.default_rng(threads)
    per_thread = 5
    x = (4 * rng.standard_normal((6, threads * per_thread))).astype(dtype)
    x[0, :] = -np.inf  # a row of −inf: the identity
    x[1, rng.random(x.shape[1]) < 0.5] = -np.inf  # masked values, some threads empty
    x[2, : threads * per_thread // 2] = -np.inf
    x[3] *= 50  # large spreads: many re-basings
    values = x.reshape(6, per_thread, threads).transpose(0, 2, 1)  # thread t: x[t + v·T]
    m_rec, l_rec = R.online_state(values, block=1, dtype=dtype)  # seed 004: value by value
    m_max, l_max = R.online_state(values, block=per_thread, dtype=dtype)  # max first, then Σ
    np.testing.assert_array_equal(m_rec, m_max)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(l_rec, l_max, rtol=rtol)
    hm, hl = trees.halving_tree(m_rec, l_rec)  # seed 004's shared-memory tree
    bm, bl = trees.block_tree(m_max, l_max)  # the warp butterfly and 32 slots
    ref_m, ref_l = R.online_state(x.astype(np.float64), block=x.shape[1])
    for m, l in ((hm, hl), (bm[:, 0], bl[:, 0])):
        np.testing.assert_array_equal(m, ref_m)
        np.testing.assert_allclose(l, ref_l, rtol=rtol)
    assert (bm == bm[:, :1]).all() and (bl == bl[:, :1]).all()  # without FMA, all agree


def test_fma32_rounds_once():
    a = F32(1 + 2**-12)
    assert F32(a * a) - F32(1 + 2**-11) == 0  # the product alone rounds the 2^-24 away
    assert trees.fma32(a, a, -F32(1 + 2**-11)) == F32(2**-24)  # the FMA keeps it


def test_fma_combine_is_not_symmetric_but_m_always_agrees():
    (ma, la, mb, lb, ab, ba), frac, spread, m_same = notes_merge.fma_data()
    assert ab != ba and ulps(ab, ba) == 1
    m1, l1 = trees.combine_fma32(ma, la, mb, lb)
    m2, l2 = trees.combine_fma32(mb, lb, ma, la)
    assert m1 == m2 and l1 == ab and l2 == ba
    assert m_same and 0 < frac < 1 and 1 <= spread <= 8


PTX_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    import types
    import numba.cuda.dispatcher as disp
    disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from numba import cuda, float32
    from numba_softmax.combine import FASTMATH, combine_device

    def k(m_a, l_a, m_b, l_b, m_out, l_out):
        i = cuda.grid(1)
        m_out[i], l_out[i] = combine_device(m_a[i], l_a[i], m_b[i], l_b[i])

    try:
        ptx, _ = cuda.compile_ptx(k, (float32[:],) * 6, cc=(9, 0), fastmath=FASTMATH)
    except Exception as err:  # no NVVM here
        print(type(err).__name__, err)
        sys.exit(77)
    print(ptx)
""")


def test_combiner_ptx_has_the_asymmetric_fma_and_flushes_denormals():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode == 77:
        pytest.skip(f"no NVVM to compile PTX: {proc.stdout.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ptx = proc.stdout
    import re

    mul = re.search(r"mul\.ftz\.f32\s+(%f\d+), %f\d+, %f\d+;", ptx)
    assert mul, "ℓ_b·w_b is no longer a separate float32 product"
    assert re.search(r"fma\.rn\.ftz\.f32\s+%f\d+, %f\d+, %f\d+, " + re.escape(mul.group(1)) + ";",
                     ptx), "ℓ is no longer fma(ℓ_a, w_a, ℓ_b·w_b)"
    assert "ex2.approx.ftz.f32" in ptx  # fast exp, denormals flushed
    page = (ROOT / "docs" / "algorithms" / "reduction.md").read_text(encoding="utf-8")
    assert "fma.rn.ftz.f32" in page and "mul.ftz.f32" in page
