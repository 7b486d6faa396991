"""The textbook's rungs (``numba_softmax/textbook/``) against the float64 NumPy references.

Each rung is checked on an irregular shape and a single value; the rungs that fold states
(s3 online, s5 split, d1 split-KV) with Hypothesis: any block size or split count, rows of
−inf, ±inf and NaN give what the reference gives.  Sizes are the simulator's (tiny); on a
GPU the same tests run as they are.
"""

import ast
import importlib
import math
import runpy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numba import cuda

from numba_softmax import reference as R
from numba_softmax import textbook
from numba_softmax.textbook import _main
from numba_softmax.textbook import (a1_flash, a2_flash_mma, b1_softmax_backward, b2_flash_backward,
                                    d1_split_kv, s1_naive, s2_three_pass, s3_online, s4_fused, s5_split)

from _helpers import ROOT, SIMULATOR

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # simulator: inf − inf, 0/0
FOLDER = ROOT / "numba_softmax" / "textbook"
TOL = dict(rtol=1e-4, atol=1e-6, equal_nan=True)  # float32 against float64
SOFTMAX = {"s1_naive": s1_naive.launch, "s2_three_pass": lambda x: s2_three_pass.launch(x, threads=32),
           "s3_online": lambda x: s3_online.launch(x, threads=32), "s4_fused": s4_fused.launch,
           "s5_split": lambda x: s5_split.launch(x, splits=3, threads=32)}
SAFE = [name for name in SOFTMAX if name != "s1_naive"]
RNG = np.random.default_rng(7)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def run(launch, *arrays, **options):
    """Launch on copies of host arrays; the result(s) back on the host."""
    out = launch(*map(cuda.to_device, arrays), **options)
    return tuple(a.copy_to_host() for a in out) if isinstance(out, tuple) else out.copy_to_host()


# --- the ladder itself --------------------------------------------------------------------
ALLOWED = {"math", "numpy", "numba", "numba.cuda", "numba_softmax.combine"}


def test_the_table_of_contents_names_every_rung_and_each_stays_short():
    files = sorted(p.stem for p in FOLDER.glob("*.py") if not p.stem.startswith("_"))
    assert sorted(textbook.RUNGS) == files
    for name in files:
        assert f"\n    {name} " in textbook.__doc__, name
        lines = (FOLDER / f"{name}.py").read_text(encoding="utf-8").splitlines()
        assert len(lines) <= 160, f"{name}: {len(lines)} lines"


@pytest.mark.parametrize("name", textbook.RUNGS)
def test_a_rung_imports_only_numba_math_numpy_and_the_combiner(name):
    """Outside its ``__main__`` (host plumbing: the reference, the fast kernel, timing)."""
    tree = ast.parse((FOLDER / f"{name}.py").read_text(encoding="utf-8"))
    allowed = ALLOWED | ({"numba_softmax.kernels.hw.mma"} if name == "a2_flash_mma" else set())
    for node in tree.body:  # the module's top level: the __main__ block is an `if`
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= allowed, (name, ast.dump(node))
        elif isinstance(node, ast.ImportFrom):
            assert node.module in allowed, (name, node.module)


def test_a_rungs_main_validates_on_the_simulator_and_skips_the_timing(capsys):
    runpy.run_module("numba_softmax.textbook.s1_naive", run_name="__main__")
    said = capsys.readouterr().out
    assert said.count("  ok  ") == len(_main.SHAPES) and "naive gives [nan" in said
    assert ("timing skipped" in said) == SIMULATOR and ("GB/s" in said) != SIMULATOR


# --- softmax: s1 … s5 ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 37), (1, 1)])
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_rungs_match_the_reference(name, shape):
    x = randn(*shape)
    np.testing.assert_allclose(run(SOFTMAX[name], x), R.softmax(x), **TOL)


def test_naive_overflows_where_the_safe_rung_does_not():
    x = randn(1, 8)
    x[0, 3] = 100.0  # exp(100) > the float32 maximum
    naive, safe = run(SOFTMAX["s1_naive"], x), run(SOFTMAX["s2_three_pass"], x)
    assert np.isnan(naive[0, 3]) and (naive[0, np.arange(8) != 3] == 0).all()
    np.testing.assert_allclose(safe, R.softmax(x), **TOL)
    assert safe[0, 3] == pytest.approx(1.0)


SPECIAL = np.array([[-np.inf] * 9,  # sees nothing: NaN, as torch.softmax
                    [0.0, np.inf, 1.0, -np.inf, 2.0, 0.0, 0.0, 0.0, 0.0],  # +inf: NaN
                    [1.0, 2.0, np.nan, 3.0, -np.inf, 0.0, 0.0, 0.0, 0.0],  # NaN: NaN
                    [-np.inf, 1.0, -np.inf, 2.0, -np.inf, 3.0, -np.inf, -np.inf, -np.inf],
                    [1000.0, 1001.0, 999.0, 1000.5, -1000.0, 1000.0, 1002.0, 998.0, 1000.0]],
                   dtype=np.float32)


@pytest.mark.parametrize("name", SAFE)
def test_special_rows_give_what_the_reference_gives(name):
    got, want = run(SOFTMAX[name], SPECIAL), R.softmax(SPECIAL)
    assert np.isnan(want[:3]).all() and np.isfinite(want[3:]).all()
    np.testing.assert_allclose(got, want, **TOL)


values = st.one_of(st.floats(-20, 20, width=32), st.floats(-20, 20, width=32),
                   st.sampled_from([-math.inf, math.inf, math.nan]))
rows = hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 70)), elements=values)


@given(rows, st.sampled_from([32, 64]))
def test_online_gives_the_reference_for_any_block_size(x, threads):
    np.testing.assert_allclose(run(s3_online.launch, x, threads=threads), R.softmax(x), **TOL)


@given(rows, st.integers(1, 6))
def test_split_gives_the_reference_for_any_piece_count(x, splits):
    got = run(s5_split.launch, x, splits=splits, threads=32)
    np.testing.assert_allclose(got, R.softmax(x), **TOL)


def test_online_and_split_on_an_irregular_shape():
    x = randn(37, 1128) * np.float32(4.0)
    want = R.softmax(x)
    np.testing.assert_allclose(run(s3_online.launch, x, threads=32), want, **TOL)
    np.testing.assert_allclose(run(s5_split.launch, x[:3], splits=5, threads=32), want[:3], **TOL)


def test_fused_refuses_a_row_its_registers_cannot_hold():
    assert s4_fused.threads_for(1) == 32 and s4_fused.threads_for(16 * 64 + 1) == 128
    with pytest.raises(ValueError, match="holding the row"):
        s4_fused.launch(cuda.device_array((1, 16 * 1024 + 1), np.float32))
    with pytest.raises(ValueError, match="power of 2"):
        s3_online.launch(cuda.device_array((1, 8), np.float32), threads=48)
    with pytest.raises(ValueError, match="splits"):
        s5_split.launch(cuda.device_array((1, 8), np.float32), splits=0)


# --- attention: a1, a2, d1 ------------------------------------------------------------------
def attention_inputs(bh, sq, sk, d, dtype=np.float32):
    return randn(bh, sq, d, dtype=dtype), randn(bh, sk, d, dtype=dtype), randn(bh, sk, d, dtype=dtype)


@pytest.mark.parametrize("sq, sk, causal", [(20, 37, False), (20, 12, True)])
def test_flash_forward_matches_the_reference(sq, sk, causal):
    """Causal with Sq > Sk: the first rows see no key (O = 0, LSE = −inf)."""
    q, k, v = attention_inputs(1, sq, sk, 8)
    o, lse = run(a1_flash.launch, q, k, v, causal=causal)
    o_ref, lse_ref = R.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(o, o_ref, **TOL)
    np.testing.assert_allclose(lse, lse_ref, **TOL)
    assert (np.isneginf(lse) == np.isneginf(lse_ref)).all() and np.isneginf(lse_ref).any() == causal


def test_flash_forward_on_tensor_cores_matches_the_reference():
    q, k, v = attention_inputs(1, 20, 37, 16, np.float16)
    o, lse = run(a2_flash_mma.launch, q, k, v, warps=1)
    o_ref, lse_ref = R.attention(q, k, v, return_lse=True)  # the fp16 inputs, exactly
    np.testing.assert_allclose(o, o_ref, rtol=4e-3, atol=4e-3)  # P rounded to fp16 for P·V
    np.testing.assert_allclose(lse, lse_ref, **TOL)
    with pytest.raises(ValueError, match="multiple of 16"):
        a2_flash_mma.launch(*map(cuda.to_device, attention_inputs(1, 2, 2, 8, np.float16)))


@given(st.integers(1, 2), st.integers(1, 40), st.integers(1, 5), st.booleans())
def test_split_kv_gives_the_reference_for_any_split_count(sq, sk, splits, causal):
    q, k, v = attention_inputs(1, sq, sk, 4)
    o, lse = run(d1_split_kv.launch, q, k, v, splits=splits, causal=causal, threads=32)
    o_ref, lse_ref = R.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(o, o_ref, **TOL)
    np.testing.assert_allclose(lse, lse_ref, **TOL)


def test_split_kv_propagates_nan_and_gives_unseen_rows_zero():
    q, k, v = attention_inputs(1, 3, 9, 4)
    q[0, 0, 1] = np.nan  # row 0: every score NaN
    v[0, 1, 2] = np.nan  # key 1: NaN in every row that sees it
    o, lse = run(d1_split_kv.launch, q, k, v, splits=4, causal=True, threads=32)
    o_ref, lse_ref = R.attention(q, k, v, causal=True, return_lse=True)
    assert np.isnan(o_ref[0, 0]).all() and np.isnan(o_ref[0, 1:, 2]).all()
    np.testing.assert_allclose(o, o_ref, **TOL)
    np.testing.assert_allclose(lse, lse_ref, **TOL)


# --- backward: b1, b2 -----------------------------------------------------------------------
def test_softmax_backward_matches_the_reference():
    y, dy = R.softmax(randn(3, 37)).astype(np.float32), randn(3, 37)
    y[2, 5] = np.nan  # a NaN makes its row's D, and the row, NaN
    got = run(b1_softmax_backward.launch, dy, y, threads=32)
    want = R.softmax_backward(dy, y)
    assert np.isnan(want[2]).all() and np.isfinite(want[:2]).all()
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("sq, sk, causal", [(20, 37, False), (20, 12, True)])
def test_flash_backward_matches_the_reference(sq, sk, causal):
    q, k, v = attention_inputs(1, sq, sk, 8)
    do = randn(1, sq, 8)
    o, lse = (a.astype(np.float32) for a in R.attention(q, k, v, causal=causal, return_lse=True))
    got = run(b2_flash_backward.launch, do, q, k, v, o, lse, causal=causal)
    want = R.attention_backward(do, q, k, v, o, lse, causal=causal)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_every_rung_is_importable_as_a_module():
    for name in textbook.RUNGS:
        assert callable(importlib.import_module(f"numba_softmax.textbook.{name}").launch)
