"""The combiner: monoid laws on the host, and any chunking / order / tree on the device."""

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.combine import IDENTITY, combine, combine_np, lse, lse_np, weight, weight_np
from numba_softmax.kernels.softmax import fold

from _helpers import sized

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
m_values = st.one_of(finite, st.just(-math.inf))


@st.composite
def states(draw):
    """A reachable state: the identity, or (m, ℓ) with finite m and ℓ >= 1."""
    m = draw(m_values)
    return IDENTITY if m == -math.inf else (m, draw(st.floats(1.0, 1e6)))


def close(s, t, rtol=1e-12):
    (m1, l1), (m2, l2) = s, t
    return m1 == m2 and math.isclose(l1, l2, rel_tol=rtol, abs_tol=0.0)


# --- host: the monoid laws -------------------------------------------------------------
@given(states(), states(), states())
def test_associative(a, b, c):
    assert close(combine(*combine(*a, *b), *c), combine(*a, *combine(*b, *c)))


@given(states(), states())
def test_commutative(a, b):
    assert close(combine(*a, *b), combine(*b, *a))


@given(states())
def test_identity_is_exact(a):
    assert combine(*a, *IDENTITY) == a
    assert combine(*IDENTITY, *a) == a


def test_identity_with_identity_never_forms_nan():
    assert combine(*IDENTITY, *IDENTITY) == IDENTITY
    assert weight(-math.inf, -math.inf) == 0.0
    assert lse(*IDENTITY) == -math.inf


@given(st.lists(finite, min_size=1, max_size=50))
def test_state_of_a_row_is_its_logsumexp(xs):
    m, l = IDENTITY
    for x in xs:
        m, l = combine(m, l, x, 1.0)
    assert m == max(xs)
    ref = R.logsumexp(np.array(xs))
    assert math.isclose(lse(m, l), ref, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_nan_and_inf_poison_l_in_any_position(bad, where):
    xs = [1.0, 2.0, 3.0]
    xs[where] = bad
    m, l = IDENTITY
    for x in xs:
        m, l = combine(m, l, x, 1.0)
    assert math.isnan(l)
    assert math.isnan(m) if math.isnan(bad) else m == math.inf


@given(st.lists(st.tuples(states(), states()), min_size=1, max_size=20))
def test_vectorised_twins_equal_the_scalar_combiner(pairs):
    (a, b) = zip(*pairs)
    m_a, l_a = map(np.array, zip(*a))
    m_b, l_b = map(np.array, zip(*b))
    m, l = combine_np(m_a, l_a, m_b, l_b)
    ulps = dict(rel_tol=1e-14, abs_tol=0.0)  # NumPy's SIMD exp may differ from math.exp by an ulp
    for i, (sa, sb) in enumerate(pairs):
        ms, ls = combine(*sa, *sb)
        assert m[i] == ms and math.isclose(l[i], ls, **ulps)
        assert math.isclose(weight_np(m_a[i], m[i]), weight(m_a[i], ms), **ulps)
        assert lse_np(m[i], l[i]) == lse(ms, ls) or math.isclose(lse_np(m[i], l[i]), lse(ms, ls), **ulps)


# --- host: the references built on it ------------------------------------------------
rows = st.lists(st.one_of(finite, st.just(-math.inf)), min_size=1, max_size=64)


@given(rows, st.integers(1, 80))
def test_online_softmax_equals_softmax_for_any_block(xs, block):
    x = np.array(xs)
    np.testing.assert_allclose(R.online_softmax(x, block), R.softmax(x), rtol=1e-12, atol=1e-15)


@st.composite
def chunking(draw, n):
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    order = draw(st.permutations(range(len(cuts) + 1)))
    return cuts, order


@given(st.data(), rows)
def test_chunk_merges_equal_the_whole_row(data, xs):
    x = np.array([xs, xs[::-1]])
    assume(np.isfinite(x).any())  # a row of all −inf is NaN everywhere; tested below
    cuts, order = data.draw(chunking(x.shape[1]))
    chunks = R.chunk_softmax(x, cuts)
    whole = R.softmax(x)
    # float64 round-off only; subnormal products (exp(−700)·…) lose relative digits
    np.testing.assert_allclose(R.merge_chunks(chunks, order), whole, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(R.merge_chunks_lse(chunks), whole, rtol=1e-10, atol=1e-14)


def test_all_neg_inf_row_is_nan_and_lse_neg_inf():
    x = np.full((2, 5), -np.inf)
    assert np.isnan(R.softmax(x)).all()
    assert np.isneginf(R.logsumexp(x)).all()


# --- the device: any chunking, any order, any tree ---------------------------------------
special = st.sampled_from([-math.inf, 1e4, -1e4, 9999.5, -9999.5, 0.0])


@st.composite
def device_problem(draw):
    """Rows (with −inf entries, −inf chunks, an all −inf row, ±1e4), cut points, and a
    fold program: leaves in a random order, adjacent pairs merged at random positions."""
    n = draw(st.integers(1, sized(24, 300)))
    n_rows = draw(st.integers(1, sized(3, 40)))
    x = draw(st.lists(st.lists(st.one_of(finite, special), min_size=n, max_size=n),
                      min_size=n_rows, max_size=n_rows))
    x = np.array(x, dtype=np.float64)
    if draw(st.booleans()):
        x[draw(st.integers(0, n_rows - 1))] = -np.inf  # an all −inf row
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=sized(6, 40))))
    k = len(cuts) + 1
    slots = list(draw(st.permutations(range(k))))
    merges = []
    while len(slots) > 1:
        i = draw(st.integers(0, len(slots) - 2))
        merges.append((slots[i], slots[i + 1]))  # slot[i] <- combine(slot[i], slot[i+1])
        del slots[i + 1]
    if x.size and draw(st.booleans()):  # a chunk of all −inf
        lo = cuts[0] if cuts else 0
        hi = cuts[1] if len(cuts) > 1 else n
        x[:, lo:hi] = -np.inf
    return x, cuts, merges, slots[0]


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@given(problem=device_problem())
def test_device_fold_any_chunking_order_and_tree(dtype, rtol, problem):
    x, cuts, merges, root = problem
    x = x.astype(dtype)
    m_c, l_c = fold.chunk_states(cuda.to_device(x), cuts)
    m, l = fold.fold_tree(m_c, l_c, merges or [[0, 0]][:0], root)
    m, l = m.copy_to_host(), l.copy_to_host()

    m_ref, l_ref = R.online_state(x.astype(np.float64), block=max(x.shape[1], 1))
    np.testing.assert_array_equal(m, m_ref.astype(dtype))  # the max is exact
    empty = np.isneginf(m_ref)
    assert (l[empty] == 0).all()  # the identity, exactly
    np.testing.assert_allclose(l[~empty], l_ref[~empty], rtol=rtol)
