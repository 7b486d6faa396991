"""The array layer end to end (simulator and GPU): views, copies, out=, shapes.

Every layout goes through the same pointer arithmetic on the simulator as on a GPU
(views of simulated device memory are built from pointers and strides too), so these run
in CI.  Small shapes, each against the float64 reference."""

import numpy as np
import pytest
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.arrays import kinds, ops

from _helpers import permuted

TOL = dict(rtol=1e-5, atol=1e-6)


def want(x, axis):
    return np.moveaxis(R.softmax(np.moveaxis(np.asarray(x, np.float64), axis, -1)), -1, axis)


def fresh(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", ["negative both", "negative rows", "negative columns",
                                  "stepped", "1x1 negative"])
def test_numpy_views(case):
    base = fresh((6, 9), 1)
    x = {"negative both": base[::-1, ::-2], "negative rows": base[::-2],
         "negative columns": base[:, ::-1], "stepped": base[1::2, ::3],
         "1x1 negative": base[:1, :1][::-1, ::-1]}[case]
    np.testing.assert_allclose(ns.softmax(x), want(x, -1), **TOL)


@pytest.mark.parametrize("case", ["negative rows", "negative columns", "permuted", "stepped"])
def test_numba_views_copy_or_fold_on_the_device(case):
    host = fresh((3, 4, 5), 2)
    d = cuda.to_device(host)
    x, h = {"negative rows": (d[::-1], host[::-1]), "negative columns": (d[:, :, ::-1], host[:, :, ::-1]),
            "permuted": (permuted(d, [2, 0, 1]), host.transpose(2, 0, 1)),
            "stepped": (d[:, ::2, 1:], host[:, ::2, 1:])}[case]
    for axis in (0, 2):
        np.testing.assert_allclose(ns.softmax(x, axis=axis).copy_to_host(), want(h, axis), **TOL)
    assert np.array_equal(d.copy_to_host(), host)  # the input is never modified


def test_out_in_place_strided_and_overlapping():
    host = fresh((4, 6), 3)
    d = cuda.to_device(host)
    assert ns.softmax(d, out=d) is d  # in place
    np.testing.assert_allclose(d.copy_to_host(), want(host, -1), **TOL)
    x = cuda.to_device(host)
    base = cuda.to_device(np.full((6, 8), 7.0, np.float32))
    out = permuted(base, [1, 0])[:4, :6]  # (4, 6) with strides (1, 8): written in place
    assert ns.log_softmax(x, out=out) is out
    got = base.copy_to_host()
    np.testing.assert_allclose(got[:6, :4].T, np.log(want(host, -1)), rtol=1e-5, atol=1e-5)
    assert (got[:, 4:] == 7.0).all() and (got[6:] == 7.0).all()  # nothing else written
    with pytest.raises(ValueError, match="overlaps"):
        ns.softmax(x[:, :5], out=x[:, 1:])
    with pytest.raises(ValueError, match="share memory"):
        ns.softmax(x, out=_broadcast_out())


def test_broadcast_numba_input():
    """A stride-0 Numba view (numba's own array interface calls it contiguous) is read as
    what it is: every row the same 6 values.  Twice: the second call may replay a plan."""
    host = fresh(6, 4)
    d = kinds.describe(cuda.to_device(host))
    x = kinds.view_of(d, (4, 6), (0, 1))
    for _ in range(2):
        got = ns.softmax(x)
        np.testing.assert_allclose(got.copy_to_host(), want(np.broadcast_to(host, (4, 6)), -1), **TOL)


def _broadcast_out():
    d = kinds.describe(cuda.to_device(np.zeros(6, np.float32)))
    return kinds.view_of(d, (4, 6), (0, 1))  # every row the same memory


def test_shapes_follow_numpy():
    assert ns.softmax(np.float32(3.0)).shape == ()
    assert ns.log_softmax(np.ones((), np.float32)).shape == ()
    assert ns.logsumexp(np.ones((), np.float32)).shape == ()
    assert ns.logsumexp(np.ones((2, 0), np.float32)).tolist() == [-np.inf, -np.inf]
    assert ns.softmax(np.ones((0, 3), np.float32)).shape == (0, 3)
    np.testing.assert_allclose(ns.combine(np.array([0.0, 1.0]), 1.0, np.array([1.0, -np.inf]), 1.0)[1],
                               [1 + np.exp(-1.0), 1.0])


def test_cast_and_concatenate_keep_the_library():
    """The ring's conversions (widen, back to the input's dtype, join shards) go through
    the array layer: dtype changed only when asked, memory shared when already right."""
    a = fresh((2, 3), 5).astype(np.float16)
    wide = ops.cast(a, np.float64)
    assert wide.dtype == np.float64 and np.array_equal(wide, a.astype(np.float64))
    assert ops.cast(a, a) is a
    back = ops.cast(wide, a)
    assert back.dtype == np.float16 and np.array_equal(back, a)
    joined = ops.concatenate([a, wide.astype(np.float16)], 1)
    assert joined.shape == (2, 6) and np.array_equal(joined[:, 3:], a)
    assert not kinds.is_torch(a) and not kinds.is_torch(object())


def test_array_library_branches_live_in_the_array_layer():
    """No module outside ``numba_softmax/arrays`` branches on an array's library: the
    benchmark (which times the peers themselves) and the PyTorch integration excepted."""
    import pathlib
    import re

    root = pathlib.Path(ns.__file__).parent
    sniff = re.compile(r"__module__|\.kind\s*[!=]=\s*[\"'](numpy|cupy|torch|numba)[\"']")
    found = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
             if p.parts[len(root.parts)] not in ("arrays", "bench", "torch.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if sniff.search(line)]
    assert not found, found
