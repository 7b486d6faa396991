"""Fuzzing: inputs drawn widely, every result against the float64 references.

What is drawn
: dtypes float16/32/64; 1–3 axes, any of them the reduced one (negative too); empty and
  length-1 axes; magnitudes from 1e-3 to 1e4, plus each dtype's extremes (float16:
  ±65504, the smallest normal and subnormals; float32/64: subnormals and values near the
  largest finite); ties; −inf, NaN and +inf anywhere, and rows of −inf; strided views
  (steps, negative steps for NumPy, offsets) and transposes; NumPy arrays and, as device
  arrays, Numba device arrays (and CuPy / PyTorch on a GPU when they are importable);
  every method; ``out=`` in any layout, in place and aliasing.  ``softmax_topk`` on the
  same inputs (k 1 … min(n, 128), temperatures that are powers of two, log).  Attention and
  ``merge_attention`` (when :mod:`numba_softmax.attention` is there): ragged Sq/Sk,
  empty ones, head dims 1–128, causal or not, split-KV, ±inf/NaN in q, k (and v when not
  causal), −inf/+inf/NaN in LSEs.

How results are compared (:func:`assert_matches`)
: NaN positions must match the reference exactly; infinities must match the reference
  *as the output dtype holds it* (a float16 log-softmax of −131008 is −inf); finite
  values within the stated tolerances (``TOL``: the float32 kernels use fast exp/log
  and accumulate in float32; float16 inputs accumulate in float32 and are rounded to
  float16 once; attention's tolerance grows with the size of the scores, the bound of a
  float32 dot product).

Profiles: ``sim`` (8 examples a test, tiny shapes) on the simulator, ``gpu`` (150) on a
GPU, and the long run — 2000 examples a test, seven tests with NumPy and Numba arrays
(nine when CuPy and PyTorch are importable), so 14,000 examples or more::

    pytest tests/test_fuzz.py --hypothesis-profile=fuzz --hypothesis-seed=12345

Every example is reproducible from what Hypothesis prints (the data come from a drawn
seed).  What it found is fixed; each find has a plain regression test at the end.
"""

import math

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.reference import topk as RT
from numba_softmax.kernels.softmax import fused

from _helpers import permuted, SIMULATOR, device_kinds, hopper_or_simulator, sized, to_host

try:
    from numba_softmax.attention import attention, merge_attention
except ImportError:  # being written: the attention tests skip until it is there
    attention = merge_attention = None

needs_attention = pytest.mark.skipif(attention is None, reason="numba_softmax.attention not there yet")

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FUNCS = {"softmax": (ns.softmax, R.softmax), "log_softmax": (ns.log_softmax, R.log_softmax),
         "logsumexp": (ns.logsumexp, R.logsumexp)}
METHODS = ["auto", "three_pass", "fused", "online", "split"]

# |ours − float64 reference| <= atol + rtol·|reference|, per function and dtype.
TOL = {
    "softmax": {F16: dict(rtol=2e-3, atol=2e-4), F32: dict(rtol=1e-4, atol=2e-6),
                F64: dict(rtol=1e-11, atol=1e-13)},
    "log_softmax": {F16: dict(rtol=2e-3, atol=2e-2), F32: dict(rtol=1e-5, atol=5e-5),
                    F64: dict(rtol=1e-12, atol=1e-12)},
    "logsumexp": {F16: dict(rtol=2e-3, atol=2e-2), F32: dict(rtol=1e-5, atol=5e-5),
                  F64: dict(rtol=1e-12, atol=1e-12)},
}
ATT_TOL = {F32: dict(rtol=1e-4, atol=2e-5), F16: dict(rtol=4e-3, atol=2e-3)}
ATT_LSE_TOL = {F32: dict(rtol=1e-5, atol=2e-5), F16: dict(rtol=1e-5, atol=1e-4)}
EPS32 = float(np.finfo(np.float32).eps)


# Each dtype's extremes: drawn into arrays at random positions.
EXTREMES = {
    F16: [65504.0, -65504.0, 6.104e-05, -6.104e-05, 5.96e-08, -5.96e-08, 3.0e-06, 0.0, -0.0,
          1e4, -1e4, 65000.0],
    F32: [3.4e38, -3.4e38, 1.1754944e-38, 1e-40, -1e-45, 0.0, -0.0, 1e4, -1e4],
    F64: [1.7e308, -1.7e308, 2.2250738585072014e-308, 1e-310, -5e-324, 0.0, -0.0, 1e4, -1e4],
}
# the smallest magnitude that rounds to inf in the dtype (ties round to even: to inf)
OVERFLOW = {F16: 65520.0, F32: float(np.finfo(np.float32).max) * (1 + 2.0**-25), F64: math.inf}


DEVICE_KINDS = device_kinds()


# --- arrays: values, views, kinds -----------------------------------------------------------
class View:
    """A recipe for a view of a base array: per axis (start, step), then maybe a reversal
    of the axes (a transpose).  Applied the same way to the NumPy base and to its device
    copy, so both hold the same values in the same layout."""

    def __init__(self, shape, starts, steps, transpose):
        self.shape, self.starts, self.steps, self.transpose = shape, starts, steps, transpose

    def base_shape(self):
        return tuple(o + ((s - 1) * abs(k) + 1 if s else 0) for s, o, k in
                     zip(self.shape, self.starts, self.steps))

    def slices(self):
        out = []
        for s, o, k in zip(self.shape, self.starts, self.steps):
            if k > 0:
                out.append(slice(o, o + (s - 1) * k + 1 if s else o, k))
            else:  # negative step: from the last element of this axis backwards
                last = o + (s - 1) * -k
                out.append(slice(last, o - 1 if o else None, k) if s else slice(o, o))
        return tuple(out)

    def apply(self, base):
        x = base[self.slices()]
        if self.transpose and x.ndim > 1:
            axes = list(reversed(range(x.ndim)))
            if hasattr(x, "permute"):
                x = x.permute(*axes)
            elif hasattr(x, "copy_to_host"):  # Numba transposes only 2-D arrays itself
                x = permuted(x, axes)
            else:
                x = x.T
        return x

    def __repr__(self):
        return f"View(shape={self.shape}, starts={self.starts}, steps={self.steps}, T={self.transpose})"


@st.composite
def views(draw, shape, negative_steps=True, transpose=False):
    starts = tuple(draw(st.lists(st.integers(0, 2), min_size=len(shape), max_size=len(shape))))
    steps = st.sampled_from([1, 1, 2, 3, -1, -2] if negative_steps else [1, 1, 2, 3])
    steps = tuple(draw(st.lists(steps, min_size=len(shape), max_size=len(shape))))
    return View(tuple(shape), starts, steps, transpose)


def make_values(rng, shape, dtype, scale, extremes, ties):
    x = rng.standard_normal(shape) * scale
    if ties:
        x = np.round(x / scale * 2) * scale  # few distinct values: ties for the max
    if extremes and x.size:
        mask = rng.random(shape) < extremes
        x[mask] = rng.choice(EXTREMES[dtype], size=int(mask.sum()))
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def place_specials(x, axis, specials, special_rows):
    """Write ±inf/NaN at flat positions (fractions of x.size) and whole rows of −inf (or
    −inf but one value) into x — a view, so its base changes too."""
    if x.size == 0:
        return
    for frac, value in specials:
        x[np.unravel_index(min(int(frac * x.size), x.size - 1), x.shape)] = value
    xm = np.moveaxis(x, axis, -1)
    rows = int(np.prod(xm.shape[:-1]))
    for frac, keep_one in special_rows:
        idx = np.unravel_index(min(int(frac * rows), rows - 1), xm.shape[:-1])
        xm[idx] = -np.inf
        if keep_one:
            xm[idx + (xm.shape[-1] // 2,)] = 1.0


def to_kind(host_base, view, kind):
    """The view of ``host_base`` as an array of ``kind`` (device kinds: the base is copied
    to the device, then viewed there)."""
    if kind == "numpy":
        return view.apply(host_base)
    if kind == "numba":
        if 0 in view.shape:  # Numba cannot slice an empty view out of a device array
            return cuda.to_device(np.ascontiguousarray(view.apply(host_base)))
        return view.apply(cuda.to_device(np.ascontiguousarray(host_base)))
    if kind == "torch":
        import torch

        return view.apply(torch.from_numpy(np.ascontiguousarray(host_base)).cuda())
    import cupy

    return view.apply(cupy.asarray(host_base))


def empty_like_kind(shape, dtype, kind, transposed=False):
    """A NaN-poisoned array of ``kind`` (NumPy may be a transposed view)."""
    host = np.full(shape[::-1] if transposed else shape, np.nan, dtype=dtype)
    if kind == "numpy":
        return host.T if transposed else host
    return to_kind(host, View(tuple(host.shape), (0,) * host.ndim, (1,) * host.ndim, False), kind)


# --- the comparison -------------------------------------------------------------------------
def assert_matches(got, want, dtype, tol, what=""):
    """``got`` (the output dtype) against the float64 reference ``want``: NaN positions
    exactly; infinities as the output dtype holds the reference; the rest within ``tol``."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, want {dtype}"
    g = got.astype(np.float64)
    with np.errstate(over="ignore"):
        held = want.astype(dtype).astype(np.float64)  # the reference as the dtype holds it
    nan_g, nan_w = np.isnan(g), np.isnan(want)
    if not np.array_equal(nan_g, nan_w):
        bad = np.argwhere(nan_g != nan_w)[:5]
        raise AssertionError(f"{what}: NaN positions differ at {bad.tolist()}: got "
                             f"{[g[tuple(i)] for i in bad]}, want {[want[tuple(i)] for i in bad]}")
    inf = (np.isinf(g) | np.isinf(held)) & ~nan_w
    bad = inf & (g != held)
    # a value at the dtype's overflow threshold may round either way
    near = np.abs(np.abs(want) - OVERFLOW[dtype]) <= tol["atol"] + 2 * tol["rtol"] * OVERFLOW[dtype]
    bad &= ~(np.isfinite(want) & near)
    if bad.any():
        idx = np.argwhere(bad)[:5]
        raise AssertionError(f"{what}: infinities differ at {idx.tolist()}: got "
                             f"{[g[tuple(i)] for i in idx]}, want {[want[tuple(i)] for i in idx]}")
    fin = np.isfinite(g) & np.isfinite(held)
    np.testing.assert_allclose(g[fin], want[fin], err_msg=what, **tol)


def expected(func, x, axis):
    """The float64 reference of ``func`` along ``axis`` of the host array x."""
    xm = np.moveaxis(np.asarray(x), axis, -1).astype(np.float64)
    want = FUNCS[func][1](xm)
    return want if func == "logsumexp" else np.moveaxis(want, -1, axis)


def max_threads():
    """The largest block the API launches with (the device's; 64 on the simulator)."""
    from numba_softmax.runtime import launcher

    return launcher.device_limits().max_threads


def fits_fused(n):
    return n <= fused.max_row(max_threads())


def call(func, method, x, axis, **kw):
    """ns.<func>; for method='fused' on a row that does not fit, the clear ValueError is the
    expected answer (returns None then)."""
    shape = tuple(x.shape)  # (the simulator's device-array shape takes no negative index)
    n = shape[axis] if shape else 1
    empty = n == 0 or math.prod(shape) == 0
    if method == "fused" and not empty and not fits_fused(n):
        with pytest.raises(ValueError, match="on chip"):
            FUNCS[func][0](x, axis=axis, method=method, **kw)
        return None
    return FUNCS[func][0](x, axis=axis, method=method, **kw)


# --- strategies -------------------------------------------------------------------------
LONG = sized(300, 40000)  # a long row now and then: online chunks, split pieces, no fused
LEAD = sized(3, 17)
special_values = st.sampled_from([-np.inf, np.nan, np.inf])


@st.composite
def problems(draw, dtypes=(F16, F32, F64), negative_steps=True, extremes=None):
    dtype = draw(st.sampled_from(dtypes))
    ndim = draw(st.integers(1, 3))
    axis = draw(st.integers(-ndim, ndim - 1))
    n = draw(st.one_of(st.sampled_from([0, 1, 2, 31, 32, 33]), st.integers(0, sized(70, 1200)),
                       st.integers(0, sized(LONG, 5000)), st.integers(LONG // 2, LONG)))
    lead_max = 1 if n > sized(100, 5000) else LEAD
    shape = [draw(st.one_of(st.sampled_from([0, 1]), st.integers(1, lead_max))) for _ in range(ndim)]
    shape[axis] = n
    transpose = draw(st.booleans())
    if transpose:  # ``axis`` is an axis of the final (transposed) array
        shape = shape[::-1]
    view = draw(views(shape, negative_steps, transpose))
    p = dict(
        dtype=dtype, view=view, axis=axis, seed=draw(st.integers(0, 2**32 - 1)),
        scale=10.0 ** draw(st.integers(-3, 4)),
        extremes=draw(st.sampled_from([0.0, 0.0, 0.01, 0.2])) if extremes is None else extremes,
        ties=draw(st.booleans()),
        specials=draw(st.lists(st.tuples(st.floats(0, 1), special_values), max_size=4)),
        special_rows=draw(st.lists(st.tuples(st.floats(0, 1), st.booleans()), max_size=2)),
    )
    return p


def build(p, kind="numpy"):
    """(host view x, input of ``kind``): the host view holds exactly the input's values."""
    rng = np.random.default_rng(p["seed"])
    view = p["view"]
    base = make_values(rng, view.base_shape(), p["dtype"], p["scale"], p["extremes"], p["ties"])
    x = view.apply(base)
    place_specials(x, p["axis"], p["specials"], p["special_rows"])
    return x, (x if kind == "numpy" else to_kind(base, view, kind))


def check_problem(p, func, method, kind="numpy", out_layout=None):
    x, xin = build(p, kind)
    axis = p["axis"]
    note(f"x: shape {x.shape}, strides {x.strides}, dtype {x.dtype}, axis {axis}")
    kw = {}
    if out_layout is not None and (kind == "numpy" or x.ndim > 1 or func != "logsumexp"):
        out_shape = x.shape if func != "logsumexp" else tuple(
            s for i, s in enumerate(x.shape) if i != axis % x.ndim)
        kw["out"] = empty_like_kind(out_shape, x.dtype, kind, out_layout == "transposed")
    got = call(func, method, xin, axis, **kw)
    if got is None:
        return
    if "out" in kw:
        assert got is kw["out"]
    got = to_host(got)
    want = expected(func, x, axis)
    assert_matches(got, want, x.dtype, TOL[func][x.dtype], f"{func}/{method}/{kind}")


# --- the tests --------------------------------------------------------------------------------
@given(p=problems(), func=st.sampled_from(list(FUNCS)), method=st.sampled_from(METHODS),
       out=st.sampled_from([None, None, "contiguous", "transposed"]))
def test_fuzz_numpy(p, func, method, out):
    """NumPy arrays of any dtype, layout and content, every function and method, out= in
    any layout."""
    check_problem(p, func, method, "numpy", out)


@pytest.mark.parametrize("kind", DEVICE_KINDS)
@given(data=st.data())
def test_fuzz_device_arrays(kind, data):
    """Device arrays, viewed with steps and transposes on the device (read in place on a
    GPU); the result comes back as the same kind."""
    p = data.draw(problems(negative_steps=False), label="problem")
    func = data.draw(st.sampled_from(list(FUNCS)), label="func")
    method = data.draw(st.sampled_from(METHODS), label="method")
    out = data.draw(st.sampled_from([None, "contiguous"]), label="out")
    check_problem(p, func, method, kind, out)


@given(p=problems(dtypes=(F16,), extremes=0.3), func=st.sampled_from(list(FUNCS)),
       method=st.sampled_from(METHODS))
def test_fuzz_float16_limits(p, func, method):
    """float16 at its limits: ±65504, the smallest normal, subnormals — 30% of the values."""
    check_problem(p, func, method)


ROW_PATTERNS = ["normal", "all -inf", "-inf but one", "one nan", "one +inf", "nan and +inf",
                "+inf and -inf", "all equal", "huge spread", "one value"]


@given(patterns=st.lists(st.sampled_from(ROW_PATTERNS), min_size=1, max_size=sized(4, 40)),
       n=st.integers(1, sized(70, 3000)), dtype=st.sampled_from([F16, F32, F64]),
       seed=st.integers(0, 2**32 - 1), func=st.sampled_from(list(FUNCS)),
       method=st.sampled_from(METHODS))
def test_fuzz_special_rows(patterns, n, dtype, seed, func, method):
    """Rows built to hit each edge of torch.softmax's semantics, at random positions."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((len(patterns), n)) * 3).astype(dtype)
    big = float(np.finfo(dtype).max) / 4 if dtype != F16 else 6e4
    for r, pat in enumerate(patterns):
        j, k = rng.integers(n), rng.integers(n)
        if pat == "all -inf":
            x[r] = -np.inf
        elif pat == "-inf but one":
            x[r] = -np.inf
            x[r, j] = rng.standard_normal() * 100
        elif pat == "one nan":
            x[r, j] = np.nan
        elif pat == "one +inf":
            x[r, j] = np.inf
        elif pat == "nan and +inf":
            x[r, j], x[r, k] = np.nan, np.inf
        elif pat == "+inf and -inf":
            x[r, j], x[r, k] = np.inf, -np.inf
        elif pat == "all equal":
            x[r] = dtype.type(rng.standard_normal() * 1e3)
        elif pat == "huge spread":
            x[r, j], x[r, k] = big, -big
        elif pat == "one value":
            x[r] = -np.inf
            x[r, j] = -big
    note(f"rows: {patterns}")
    got = call(func, method, x, -1)
    if got is None:
        return
    want = expected(func, x, -1)
    assert_matches(got, want, dtype, TOL[func][dtype], f"{func}/{method}")


@given(data=st.data())
def test_fuzz_out_aliasing_the_input(data):
    """out= is the input (in place), overlaps it (shifted by one column), or is a column
    of it (logsumexp): the result is that of the original values, or a clean ValueError
    (device arrays that overlap without being the input)."""
    kind = data.draw(st.sampled_from(["numpy"] + DEVICE_KINDS), label="kind")
    func = data.draw(st.sampled_from(list(FUNCS)), label="func")
    method = data.draw(st.sampled_from(METHODS), label="method")
    dtype = data.draw(st.sampled_from([F16, F32, F64]), label="dtype")
    rows = data.draw(st.integers(1, sized(3, 50)), label="rows")
    n = data.draw(st.integers(2, sized(70, 3000)), label="n")
    alias = data.draw(st.sampled_from(["same", "shifted"] if func != "logsumexp" else ["column"]),
                      label="alias")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    base = (np.random.default_rng(seed).standard_normal((rows, n + 1)) * 5).astype(dtype)
    dev = base if kind == "numpy" else to_kind(base, View(base.shape, (0, 0), (1, 1), False), kind)
    if alias == "same":
        x, out, x_host = dev[:, :n], dev[:, :n], base[:, :n].copy()
    elif alias == "shifted":
        x, out, x_host = dev[:, :n], dev[:, 1:], base[:, :n].copy()
    else:
        x, out, x_host = dev[:, 1:], dev[:, 0], base[:, 1:].copy()
    if method == "fused" and not fits_fused(x_host.shape[1]):
        return
    try:
        got = FUNCS[func][0](x, method=method, out=out)
    except ValueError as exc:
        if kind == "numba" and "contiguous" in str(exc):
            return  # a strided Numba out= the kernels cannot write directly: refused up front
        assert alias != "same" and kind != "numpy", f"in place must work: {exc}"
        assert "overlaps" in str(exc)
        return
    assert got is out
    want = expected(func, x_host, -1)
    assert_matches(to_host(got), want, dtype, TOL[func][dtype], f"{func}/{method}/{kind}/{alias}")


# --- softmax + top-k ----------------------------------------------------------------------
TEMPERATURES = [1.0, 1.0, 0.5, 2.0, 0.25]  # powers of two: x·(1/T) exact but past the range


@pytest.mark.parametrize("kind", ["numpy"] + DEVICE_KINDS)
@given(data=st.data())
def test_fuzz_softmax_topk(kind, data):
    """``softmax_topk`` on any dtype, view (device arrays viewed on the device: strided
    rows, read without vector loads — where a float16 constant once failed to compile)
    and content, k from 1 to min(n, 128), temperature, log: the values within softmax's
    (log_softmax's) tolerance of the float64 reference on u = x·(1/T) formed as the
    kernels form it, the reference's indices (ties to the lower), no index twice."""
    p = data.draw(problems(negative_steps=kind == "numpy"), label="problem")
    x, xin = build(p, kind)
    axis = p["axis"]
    n = x.shape[axis]
    if n == 0 or (SIMULATOR and x.size > 600):  # (k ≥ 1; the simulator's warp votes are slow)
        return
    k = data.draw(st.integers(1, min(n, 128)), label="k")
    temperature = data.draw(st.sampled_from(TEMPERATURES), label="temperature")
    log = data.draw(st.booleans(), label="log")
    note(f"x: shape {x.shape}, strides {x.strides}, dtype {x.dtype}, axis {axis}")
    v, i = ns.softmax_topk(xin, k, axis=axis, temperature=temperature, log=log)
    v, i = np.moveaxis(to_host(v), axis, -1), np.moveaxis(to_host(i), axis, -1)
    xm = np.moveaxis(x, axis, -1)
    acc = np.float64 if x.dtype == F64 else np.float32  # u = x·(1/T) as the kernels form it:
    with np.errstate(over="ignore"):  # in their accumulator (near float32's largest, ·4 is inf)
        u = (xm.astype(acc) * acc(1.0 / temperature)).astype(np.float64)
    want_v, want_i = RT.softmax_topk(u, k, log=log)
    func = "log_softmax" if log else "softmax"
    assert_matches(v, want_v, x.dtype, TOL[func][x.dtype], f"softmax_topk/{kind}/k {k}/T {temperature}")
    assert i.dtype == np.int64 and (np.diff(np.sort(i, -1), axis=-1) != 0).all()  # no index twice
    # the reference's order, ties to the lower index — but where a GPU's float32 flushes
    # subnormals (x or u) to zero (fast math, docs/caveats.md), two values can become one,
    # a tie either index may win: those rows check only that each index holds its rank's value
    exact = np.ones(xm.shape[:-1], bool)
    if acc is np.float32 and not SIMULATOR:
        for a in (xm, u):
            exact &= ~((np.abs(a) < np.finfo(np.float32).tiny) & (a != 0)).any(-1)
    np.testing.assert_array_equal(i[exact], want_i[exact])
    all_v, all_i = RT.softmax_topk(u, n, log=log)
    full = np.empty(xm.shape)
    np.put_along_axis(full, all_i, all_v, -1)  # each position's value
    np.testing.assert_allclose(np.take_along_axis(full, i, -1), want_v, equal_nan=True,
                               **TOL[func][x.dtype])


# --- attention --------------------------------------------------------------------------
# (D, Dv): a few, since each pair (× dtype × causal × query tile) is a kernel compilation
HEAD_DIMS = sized([(1, 3), (8, 8), (40, 40)], [(1, 3), (40, 24), (64, 64), (128, 128)])


def expected_attention(q, k, v, causal, scale):
    """The reference, with a NaN softmax row (ℓ NaN: a NaN or +inf score) giving a NaN O
    row, as the softmax does (the reference itself gives O = 0 there: reported)."""
    o, lse = R.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    nan_l = np.isnan(lse) | np.isposinf(lse)
    o = np.where(nan_l[..., None], np.nan, o)
    return o, lse


def score_bound(q, k, scale):
    """Per query row: scale·max_j Σ_d |q_d k_jd|, the size a float32 dot product's error
    scales with."""
    qa, ka = np.abs(q.astype(np.float64)), np.abs(k.astype(np.float64))
    qa, ka = np.nan_to_num(qa, posinf=0), np.nan_to_num(ka, posinf=0)
    if k.shape[-2] == 0 or q.shape[-2] == 0:
        return np.zeros(q.shape[:-1])
    return abs(scale) * (qa @ np.swapaxes(ka, -1, -2)).max(axis=-1)


def check_attention_result(o, lse, ref_o, ref_lse, dtype, delta, vmax, what):
    """O and LSE against the reference; ``delta`` (per row) bounds the error of the scores."""
    lse = np.asarray(lse)
    assert lse.dtype == F32, f"{what}: LSE dtype {lse.dtype}"
    # LSE: NaN and infinities exactly, the rest within the tolerance plus the score error
    assert np.array_equal(np.isnan(lse), np.isnan(ref_lse)), f"{what}: LSE NaN positions differ"
    inf = np.isinf(lse) | np.isinf(ref_lse)
    assert np.array_equal(lse[inf], ref_lse[inf]), f"{what}: LSE infinities differ"
    fin = np.isfinite(ref_lse)
    t = ATT_LSE_TOL[dtype]
    err = np.abs(lse[fin] - ref_lse[fin])
    lim = t["atol"] + t["rtol"] * np.abs(ref_lse[fin]) + 2 * delta[fin]
    assert (err <= lim).all(), f"{what}: LSE off by {err.max()} (limit {lim[np.argmax(err - lim)]})"
    # O: NaN positions exactly; the rest within the tolerance, scaled by the size of v
    o = np.asarray(o).astype(np.float64)
    assert np.array_equal(np.isnan(o), np.isnan(ref_o)), \
        f"{what}: O NaN positions differ at {np.argwhere(np.isnan(o) != np.isnan(ref_o))[:5].tolist()}"
    inf = np.isinf(o) | np.isinf(ref_o)
    assert np.array_equal(o[inf], ref_o[inf]), f"{what}: O infinities differ"
    ok = ~np.isnan(ref_o) & ~inf
    t = ATT_TOL[dtype]
    lim = (t["atol"] * vmax + t["rtol"] * np.abs(ref_o) + 3 * delta[..., None] * vmax)
    err = np.abs(o - ref_o)
    bad = ok & ~(err <= lim)
    assert not bad.any(), f"{what}: O off by {err[bad].max()} at {np.argwhere(bad)[:3].tolist()}"


@st.composite
def attention_problems(draw):
    dtype = draw(st.sampled_from([F32, F16]))
    lead = tuple(draw(st.lists(st.integers(sized(1, 0), sized(2, 3)), max_size=sized(1, 2))))
    sq = draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, sized(12, 150))))
    sk = draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, sized(24, 300))))
    d, dv = draw(st.sampled_from(HEAD_DIMS))
    causal = draw(st.booleans())
    specials = draw(st.lists(st.tuples(st.sampled_from(["q", "k", "v"]), st.floats(0, 1),
                                       special_values), max_size=3))
    return dict(dtype=dtype, lead=lead, sq=sq, sk=sk, d=d, dv=dv, causal=causal,
                num_splits=draw(st.sampled_from([1, 1, 2, 3, 5])),
                scale=draw(st.sampled_from([None, None, 0.05, 1.0, 3.0])),
                mags=tuple(10.0 ** draw(st.integers(-2, 1)) for _ in range(3)),
                # v: NaN only, and not with causal (a masked key's 0·v is NaN for v = ±inf
                # or NaN, and whether it is formed at all depends on the tiling)
                specials=[s for s in specials if s[0] != "v" or (not causal and s[2] != s[2])],
                transpose_k=draw(st.booleans()), use_out=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


@needs_attention
@given(p=attention_problems())
def test_fuzz_attention(p):
    """attention(): ragged and empty Sq/Sk, head dims, causal, split-KV, scales, ±inf/NaN
    in q and k, NaN in v (without causal), k as a transposed view, out=."""
    rng = np.random.default_rng(p["seed"])
    dtype, lead, sq, sk, d, dv = p["dtype"], p["lead"], p["sq"], p["sk"], p["d"], p["dv"]
    mq, mk, mv = p["mags"]
    q = (rng.standard_normal(lead + (sq, d)) * mq).astype(dtype)
    k_t = (rng.standard_normal(lead + (d, sk)) * mk).astype(dtype)
    k = np.swapaxes(k_t, -1, -2) if p["transpose_k"] else np.ascontiguousarray(np.swapaxes(k_t, -1, -2))
    v = (rng.standard_normal(lead + (sk, dv)) * mv).astype(dtype)
    for name, frac, value in p["specials"]:
        arr = {"q": q, "k": k, "v": v}[name]
        if arr.size:
            arr[np.unravel_index(min(int(frac * arr.size), arr.size - 1), arr.shape)] = value
    scale = p["scale"]
    eff_scale = 1 / math.sqrt(d) if scale is None else scale
    kw = {}
    if p["use_out"]:
        kw["out"] = np.full(lead + (sq, dv), np.nan, dtype=dtype)
    o, lse = attention(q, k, v, causal=p["causal"], scale=scale, return_lse=True,
                       num_splits=p["num_splits"], **kw)
    if p["use_out"]:
        assert o is kw["out"]
    assert o.shape == lead + (sq, dv) and o.dtype == dtype and lse.shape == lead + (sq,)
    ref_o, ref_lse = expected_attention(q, k, v, p["causal"], scale)
    delta = (d + 4) * EPS32 * score_bound(q, k, eff_scale) + 8 * EPS32
    vmax = max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(v), 0, v)))) if v.size else 1.0)
    check_attention_result(o, lse, ref_o, ref_lse, dtype, delta, vmax,
                           f"attention causal={p['causal']} splits={p['num_splits']}")


@needs_attention
@given(data=st.data())
def test_fuzz_merge_attention(data):
    """merge_attention(): LSEs of any size, −inf (an empty side, both empty), +inf and NaN,
    LSE dtypes float16/32/64."""
    dtype = data.draw(st.sampled_from([F32, F16]), label="dtype")
    lse_dtype = data.draw(st.sampled_from([F32, F32, F16, F64]), label="lse dtype")
    lead = tuple(data.draw(st.lists(st.integers(sized(1, 0), 3), max_size=2), label="lead"))
    s = data.draw(st.one_of(st.just(0), st.integers(1, sized(6, 200))), label="S")
    dv = data.draw(st.sampled_from([1, 3, 8, 40, 64, 128] if not SIMULATOR else [1, 3, 40]), label="Dv")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    mag = 10.0 ** data.draw(st.integers(-1, 4), label="lse magnitude")
    fill = data.draw(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 1),
                                        st.sampled_from([-np.inf, -np.inf, np.inf, np.nan])),
                              max_size=4), label="special LSEs")
    rng = np.random.default_rng(seed)
    o_a = (rng.standard_normal(lead + (s, dv)) * 10.0 ** rng.integers(-2, 3)).astype(dtype)
    o_b = (rng.standard_normal(lead + (s, dv)) * 10.0 ** rng.integers(-2, 3)).astype(dtype)
    lse_a = (rng.standard_normal(lead + (s,)) * mag).astype(lse_dtype)
    lse_b = (lse_a.astype(np.float64) + rng.standard_normal(lead + (s,)) * 3).astype(lse_dtype)
    if lse_a.size:
        for side, frac, value in fill:
            arr = lse_a if side == "a" else lse_b
            arr[np.unravel_index(min(int(frac * arr.size), arr.size - 1), arr.shape)] = value
    o, lse = merge_attention(o_a, lse_a, o_b, lse_b)
    assert o.dtype == dtype and o.shape == o_a.shape and lse.shape == lse_a.shape
    ref_o, ref_lse = R.merge_attention(o_a, lse_a, o_b, lse_b)
    nan_l = np.isnan(ref_lse) | np.isposinf(ref_lse)
    ref_o = np.where(nan_l[..., None], np.nan, ref_o)  # as in expected_attention
    # the kernel folds in float32: a float64 LSE is rounded first
    la, lb = (np.nan_to_num(np.abs(x.astype(np.float64)), posinf=0) for x in (lse_a, lse_b))
    delta = (2 * EPS32 * np.maximum(la, lb) if lse_dtype == F64 else 0 * la) + 4 * EPS32
    vmax = max(1.0, float(np.abs(o_a).max(initial=0)), float(np.abs(o_b).max(initial=0)))
    check_attention_result(o, lse, ref_o, ref_lse, dtype, delta, vmax, "merge")


# --- regressions: discrepancies this file found, since fixed ---------------------------------
@pytest.mark.parametrize("method", ["fused", "online", "split", "three_pass"])
def test_logsumexp_of_nan_and_inf_is_nan(method):
    """The row max of fused/online/split once dropped NaN (logsumexp +inf, not NaN)."""
    x = np.array([[np.nan, np.inf, 0.0], [1.0, np.inf, np.nan]], np.float32)
    assert np.isnan(R.logsumexp(x)).all()
    assert np.isnan(ns.logsumexp(x, method=method)).all()


def test_strided_numba_out_is_filled_on_the_device():
    """Out.fill once failed *after* the kernels ran: Numba copies only contiguous arrays.
    A strided out= (here: logsumexp of an empty axis into a column view) is now filled by
    the device copy kernel, and the column beside it is left as it was."""
    x = cuda.to_device(np.zeros((3, 0), np.float32))
    base = cuda.to_device(np.full((3, 2), 7.0, np.float32))
    out = base[:, 0]
    assert ns.logsumexp(x, out=out) is out
    host = base.copy_to_host()
    assert (host[:, 0] == -np.inf).all() and (host[:, 1] == 7.0).all()


@needs_attention
def test_reference_attention_nan_row_is_nan():
    """The references once gave O = 0 for a row whose ℓ is NaN (np.where(l > 0, …))."""
    q = np.ones((1, 2, 4))
    q[0, 0, 0] = np.nan
    o = R.attention(q, np.ones((1, 3, 4)), np.ones((1, 3, 4)))
    assert np.isnan(o[0, 0]).all()
    o_m, _ = R.merge_attention(np.ones((1, 4)), np.array([np.nan]), np.ones((1, 4)), np.array([0.0]))
    assert np.isnan(o_m).all()


@st.composite
def hopper_problems(draw):
    hkv = draw(st.integers(1, 3))
    return dict(b=draw(st.integers(1, 2)), hkv=hkv, hq=hkv * draw(st.sampled_from([1, 2, 4])),
                sq=draw(st.one_of(st.sampled_from([1, 63, 64, 65, 128, 129]), st.integers(1, 200))),
                sk=draw(st.one_of(st.sampled_from([1, 63, 64, 65, 128, 129]), st.integers(1, 260))),
                d=draw(st.sampled_from([64, 128])), causal=draw(st.booleans()),
                scale=draw(st.sampled_from([None, None, 0.05, 1.0, -0.5])),
                mags=tuple(10.0 ** draw(st.integers(-2, 1)) for _ in range(3)),
                specials=draw(st.lists(st.tuples(st.sampled_from(["q", "k", "v"]), st.floats(0, 1),
                                                 special_values), max_size=3)),
                strided=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


@needs_attention
@pytest.mark.skipif(SIMULATOR or not hopper_or_simulator(),
                    reason="the wgmma kernels on an sm_90 GPU (the simulator's: test_hopper_attention)")
@given(p=hopper_problems())
def test_fuzz_attention_hopper(p):
    """The wgmma kernels (:mod:`numba_softmax.kernels.attention.hopper_ws`), every
    configuration launched directly, and attention() (contiguous inputs take h5; a strided
    q stays on mma.sync): ragged Sq, Sk around the tiles, GQA, causal, D 64/128, scales of
    either sign, ±inf/NaN in q and k, NaN in v (without causal), fp16, against float64."""
    from numba_softmax.kernels.attention import hopper_ws

    rng = np.random.default_rng(p["seed"])
    b, hq, hkv, sq, sk, d = (p[n] for n in ("b", "hq", "hkv", "sq", "sk", "d"))
    mq, mk, mv = p["mags"]
    q = (rng.standard_normal((b, hq, sq, d)) * mq).astype(F16)
    k = (rng.standard_normal((b, hkv, sk, d)) * mk).astype(F16)
    v = (rng.standard_normal((b, hkv, sk, d)) * mv).astype(F16)
    for name, frac, value in p["specials"]:
        if name != "v" or (not p["causal"] and value != value):  # as test_fuzz_attention
            arr = {"q": q, "k": k, "v": v}[name]
            arr[np.unravel_index(min(int(frac * arr.size), arr.size - 1), arr.shape)] = value
    scale = p["scale"]
    eff_scale = 1 / math.sqrt(d) if scale is None else scale
    ref_o, ref_lse = expected_attention(q, k, v, p["causal"], eff_scale)
    # the bound per query head, from the K/V head it reads
    delta = (d + 4) * EPS32 * score_bound(q, np.repeat(k, hq // hkv, axis=1), eff_scale) \
        + 8 * EPS32
    vmax = max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(v), 0, v)))))
    dq, dk, dv = (cuda.to_device(x) for x in (q, k, v))
    for config in hopper_ws.taking(d, d):
        o = cuda.to_device(np.full((b, hq, sq, d), np.nan, F16))
        lse = cuda.to_device(np.full((b, hq, sq), np.nan, F32))
        hopper_ws.launch(dq, dk, dv, o, lse, causal=p["causal"], scale=scale, config=config)
        check_attention_result(o.copy_to_host(), lse.copy_to_host(), ref_o, ref_lse, F16, delta,
                               vmax, f"hopper_ws {config} causal={p['causal']}")
    if p["strided"]:  # q as a stepped view of a wider array
        wide = np.zeros((b, hq, sq, 2 * d), F16)
        wide[..., ::2] = q
        dq = cuda.to_device(wide)[:, :, :, ::2]  # (Numba's device arrays take no Ellipsis)
    o, lse = attention(dq, dk, dv, causal=p["causal"], scale=scale, return_lse=True, num_splits=1)
    check_attention_result(o.copy_to_host(), lse.copy_to_host(), ref_o, ref_lse, F16, delta, vmax,
                           f"attention() on sm_90 causal={p['causal']} strided={p['strided']}")


# --- regressions: discrepancies found here and fixed --------------------------------------
@needs_attention
@pytest.mark.parametrize("splits", [1, 2])
def test_attention_lse_of_nan_and_inf_scores_is_nan(splits):
    """The attention kernel's row max once dropped NaN (LSE +inf for NaN and +inf scores)."""
    q = np.ones((1, 2, 4), np.float32)
    k = np.ones((1, 3, 4), np.float32)
    k[0, 0, 0], k[0, 1, 0] = np.inf, np.nan
    v = np.ones((1, 3, 4), np.float32)
    _, lse = attention(q, k, v, return_lse=True, num_splits=splits)
    assert np.isnan(R.attention(q, k, v, return_lse=True)[1]).all()
    assert np.isnan(lse).all()


@needs_attention
@pytest.mark.parametrize("sq", [9, 12])
def test_split_kv_with_9_to_12_queries(sq):
    """Split-KV once picked a 12-row query tile for 9 <= Sq <= 12, which no rows-per-lane
    split tiles (ValueError)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, sq, 8)).astype(np.float32)
    k = rng.standard_normal((1, 5, 8)).astype(np.float32)
    o = attention(q, k, k, num_splits=2)
    np.testing.assert_allclose(o, R.attention(q, k, k), **ATT_TOL[F32])
