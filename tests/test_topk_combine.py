"""The top-k combiner: laws on the host, any chunking / order / tree on the device; the
top-k references and the counter-based draws they share with the kernels."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from numba_softmax import draws
from numba_softmax.combine import (EMPTY, combine, combine_topk, combine_topk_np, offer, precedes,
                                   topk_state_np)
from numba_softmax.kernels.topk import fold_topk
from numba_softmax import reference as R
from numba_softmax.reference import topk as RT

from _helpers import sized

# few distinct values, so that ties are common; −inf and NaN among them
value = st.one_of(st.integers(-3, 3).map(float), st.sampled_from([-math.inf, math.nan, 0.5, 1e4]))


def empty(k):
    return -math.inf, 0.0, np.full(k, -np.inf), np.full(k, EMPTY, dtype=np.int64)


def fold(xs, start, k):
    """The state of xs (indices from start) by the per-element recurrence."""
    m, l, v, i = empty(k)
    for j, x in enumerate(xs, start):
        m, l = combine(m, l, x, 1.0)
        offer(v, i, x, j)
    return m, l, v, i


def merge(a, b):
    k = len(a[2])
    v, i = np.empty(k), np.empty(k, dtype=np.int64)
    m, l = combine_topk(*a, *b, v, i)
    return m, l, v, i


def same(s, t, rtol=1e-12):
    (m1, l1, v1, i1), (m2, l2, v2, i2) = s, t
    assert m1 == m2 or (math.isnan(m1) and math.isnan(m2))
    assert math.isclose(l1, l2, rel_tol=rtol) or (math.isnan(l1) and math.isnan(l2))
    np.testing.assert_array_equal(v1, v2)
    np.testing.assert_array_equal(i1, i2)


# --- host: the laws ----------------------------------------------------------------------
@given(st.lists(value, min_size=1, max_size=40), st.integers(1, 8), st.data())
def test_any_chunking_and_tree_gives_the_whole_rows_state(xs, k, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(xs)), max_size=5)))
    bounds = [0, *cuts, len(xs)]
    states = [fold(xs[a:b], a, k) for a, b in zip(bounds[:-1], bounds[1:])]
    order = data.draw(st.permutations(range(len(states))))
    states = [states[o] for o in order]
    while len(states) > 1:  # adjacent pairs merged at random places, either way round
        p = data.draw(st.integers(0, len(states) - 2))
        a, b = states[p], states[p + 1]
        states[p : p + 2] = [merge(a, b) if data.draw(st.booleans()) else merge(b, a)]
    m, l, v, i = topk_state_np(np.array(xs), k)
    same(states[0], (float(m), float(l), v, i))


def test_ties_go_to_the_lower_index_and_nan_never_enters():
    assert precedes(1.0, 3, 1.0, 5) and not precedes(1.0, 5, 1.0, 3)
    assert not precedes(math.nan, 0, -math.inf, 9) and not precedes(-math.inf, 9, math.nan, 0)
    assert precedes(-math.inf, 4, -math.inf, EMPTY)  # a real −inf beats an empty slot
    m, l, v, i = fold([2.0, math.nan, 2.0, -math.inf, 5.0], 0, 4)
    assert math.isnan(m) and math.isnan(l)
    np.testing.assert_array_equal(i, [4, 0, 2, 3])


def test_identity_is_exact():
    a = fold([3.0, 1.0, 3.0], 0, 2)
    same(merge(a, empty(2)), a)
    same(merge(empty(2), a), a)


@given(st.lists(st.lists(value, min_size=6, max_size=6), min_size=1, max_size=5), st.integers(1, 6))
def test_vectorised_twins_equal_the_scalar_combiner(rows, k):
    x = np.array(rows)
    a, b = topk_state_np(x[:, :3], k), topk_state_np(x[:, 3:], k, start=3)
    m, l, v, i = combine_topk_np(a, b)
    for r in range(len(rows)):
        same(merge(*[tuple(s[r] for s in t) for t in (a, b)]), (m[r], l[r], v[r], i[r]))


# --- the device: any chunking, any order, any tree --------------------------------------
@st.composite
def device_problem(draw):
    n = draw(st.integers(1, sized(12, 200)))
    n_rows = draw(st.integers(1, sized(3, 40)))
    x = np.array(draw(st.lists(st.lists(value, min_size=n, max_size=n), min_size=n_rows,
                               max_size=n_rows)))
    if draw(st.booleans()):
        x[draw(st.integers(0, n_rows - 1))] = -np.inf  # an all −inf row
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=sized(4, 30))))
    slots = list(draw(st.permutations(range(len(cuts) + 1))))
    merges = []
    while len(slots) > 1:
        i = draw(st.integers(0, len(slots) - 2))
        merges.append((slots[i], slots[i + 1]))
        del slots[i + 1]
    return x, cuts, merges, slots[0], draw(st.integers(1, sized(6, 64)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@given(problem=device_problem())
def test_device_fold_any_chunking_order_and_tree(dtype, problem):
    x, cuts, merges, root, k = problem
    x = x.astype(dtype)
    states = fold_topk.chunk_states(cuda.to_device(x), cuts, k)
    m, l, v, i = (a.copy_to_host()[:, 0] for a in fold_topk.fold_tree(*states, merges, root))
    m_ref, l_ref, v_ref, i_ref = topk_state_np(x.astype(np.float64), k)
    np.testing.assert_array_equal(m, m_ref.astype(dtype))  # the max is exact, NaN kept
    np.testing.assert_array_equal(v, v_ref.astype(dtype))  # the list is exact, ties too
    np.testing.assert_array_equal(i, i_ref)
    np.testing.assert_allclose(l, l_ref, rtol=1e-12 if dtype == np.float64 else 2e-5)


# --- references --------------------------------------------------------------------------
def test_reference_is_topk_of_the_softmax():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 40))
    for t, log in [(1.0, False), (0.3, True)]:
        v, i = RT.softmax_topk(x, 6, temperature=t, log=log)
        p = (R.log_softmax if log else R.softmax)(x / t)
        order = np.argsort(-p, axis=-1, kind="stable")[:, :6]
        np.testing.assert_array_equal(i, order)
        np.testing.assert_allclose(v, np.take_along_axis(p, order, -1), rtol=1e-12)


def test_reference_rows_without_softmax_are_nan_at_indices_0_to_k():
    x = np.array([[0.0, np.nan, 1.0], [-np.inf] * 3, [np.inf, 0.0, 1.0], [0.0, -np.inf, -np.inf]])
    v, i = RT.softmax_topk(x, 3)
    assert np.isnan(v[:3]).all() and (i[:3] == [0, 1, 2]).all()
    np.testing.assert_array_equal(v[3], [1.0, 0.0, 0.0])  # −inf entries: probability 0
    np.testing.assert_array_equal(i[3], [0, 1, 2])


# --- draws -------------------------------------------------------------------------------
def test_uniform_is_exact_in_float32_and_inside_the_unit_interval():
    for seed, row in [(0, 0), (1, 2), (2**64 - 1, 10**6), (-5, 3)]:
        u = draws.uniform(draws.row_key(seed, row))
        assert 0 < u < 1 and float(np.float32(u)) == u


def test_hash_twins_agree_and_seeds_rows_counters_differ():
    key = draws.row_key(42, 3)
    j = np.arange(100)
    np.testing.assert_array_equal(RT.gumbel_bits(key, j), [draws.bits(key, int(t)) for t in j])
    keys = {draws.row_key(s, r) for s in range(20) for r in range(20)}
    assert len(keys) == 400
    assert draws.row_key(-1, 0) == draws.row_key(2**64 - 1, 0)  # seeds are taken mod 2**64


def chi2_ok(counts, p, z=3.72):
    """χ² goodness of fit at ~1e-4 (Wilson–Hilferty); cells of probability 0 must be empty."""
    n = counts.sum()
    assert (counts[p == 0] == 0).all(), (counts, p)
    e = n * p[p > 0]
    chi2 = float(((counts[p > 0] - e) ** 2 / e).sum())
    df = max(len(e) - 1, 1)
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return chi2 < limit, chi2, limit


@pytest.mark.parametrize("top_k, top_p", [(4, 1.0), (4, 0.7), (None, 1.0), (6, 0.3)])
def test_reference_sampler_frequencies_match_the_exact_distribution(top_k, top_p):
    x = np.tile(np.array([1.0, 0.2, 2.0, -1.0, 0.5, 2.0]), (4000, 1))
    tokens = RT.sample(x, top_k, top_p, temperature=0.8, seed=11)
    p = RT.sample_probabilities(x[0], top_k, top_p, temperature=0.8)
    ok, chi2, limit = chi2_ok(np.bincount(tokens, minlength=6), p)
    assert ok, (chi2, limit)
