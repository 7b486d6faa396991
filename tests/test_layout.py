"""The array layer's stride arithmetic, on the host: which views fold, which copy.

A wrong row stride here once survived the whole suite, because the view code ran only on
a GPU.  These tests need no device: they check the folds against NumPy's own strides."""

import numpy as np
import pytest

from numba_softmax.arrays import layout
from numba_softmax.runtime.copy import simplify


def estrides(a):
    return tuple(s // a.itemsize for s in a.strides)


def rows_of(a, axis):
    """NumPy's (rows, n) of ``a`` reduced along ``axis`` (a copy), for comparison."""
    return np.moveaxis(a, axis, -1).reshape(-1, a.shape[axis])


def gather(base, offset, shape, strides):
    """Read the elements a (shape, strides) view from ``offset`` reaches in a flat base."""
    idx = offset + sum(np.arange(n).reshape((-1,) + (1,) * (len(shape) - 1 - k)) * st
                       for k, (n, st) in enumerate(zip(shape, strides)))
    return base[idx]


BASE = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
CASES = [
    ("contiguous", BASE, -1),
    ("3-D middle axis", BASE[0], 1),
    ("transposed", BASE[0].T, 0),
    ("stepped columns", BASE[:, :, :, ::2], -1),
    ("stepped rows", BASE[:, ::2], -1),
    ("leading axis", BASE, 0),
    ("size-1 axes", BASE[:1, :, :1], 2),
    ("permuted", BASE.transpose(2, 0, 3, 1), 1),
    ("negative columns", BASE[..., ::-1], -1),
    ("negative rows", BASE[::-1], -1),
    ("broadcast rows", np.broadcast_to(BASE[0, 0, 0], (3, 4, 5)), -1),
]


@pytest.mark.parametrize("name,a,axis", CASES, ids=[c[0] for c in CASES])
def test_fold_rows_matches_numpy_or_declines(name, a, axis):
    axis %= a.ndim
    folded = layout.fold_rows(a.shape, estrides(a), axis)
    if folded is None:  # declined: only when no one row stride exists or one is negative
        lead = [(n, st) for i, (n, st) in enumerate(zip(a.shape, estrides(a))) if i != axis]
        assert min(estrides(a)) < 0 or layout._merge(lead) is None
        return
    rows, n, rs, cs = folded
    assert min(rs, cs) >= 0
    offset = (a.__array_interface__["data"][0] - BASE.__array_interface__["data"][0]) // 4
    got = gather(BASE.reshape(-1), offset, (rows, n), (rs, cs))
    np.testing.assert_array_equal(got, rows_of(a, axis))


def test_folds_that_must_copy():
    a = BASE.transpose(1, 0, 2, 3)[:, :, 0]  # rows (3, 2) with strides (20, 60): no one stride
    assert layout.fold_rows(a.shape, estrides(a), 2) is None
    assert layout.fold_rows(BASE[..., ::-1].shape, estrides(BASE[..., ::-1]), 3) is None


@pytest.mark.parametrize("tail", [1, 2])
@pytest.mark.parametrize("view", [BASE, BASE.transpose(0, 2, 1, 3), BASE[:, ::2], BASE[None],
                                  BASE[0], BASE.reshape(6, 4, 5)[:, :, ::2]])
def test_fold_heads(view, tail):
    shape4 = layout.heads_shape(view.shape, tail)
    strides = layout.fold_heads(view.shape, estrides(view), tail)
    want = view.reshape(shape4)  # NumPy copies when it must: the values to compare with
    if strides is None:  # declined: only when the batch axes do not fold into one stride
        lead = len(view.shape) - tail
        assert layout._merge([(view.shape[i], estrides(view)[i]) for i in range(lead - 1)]) is None
        return
    offset = (view.__array_interface__["data"][0] - BASE.__array_interface__["data"][0]) // 4
    np.testing.assert_array_equal(gather(BASE.reshape(-1), offset, shape4, strides), want)


def test_fold_heads_declines_batch_axes_that_do_not_fold():
    v = BASE.transpose(1, 0, 2, 3)[:, :, None]  # batch axes (3, 2) with strides (20, 60)
    assert layout.fold_heads(v.shape, estrides(v), 2) is None


@pytest.mark.parametrize("shape,strides,want", [
    ((3, 4), (4, 1), False), ((3, 4), (1, 3), False), ((3, 4), (0, 1), True),
    ((3, 4), (2, 1), True), ((3, 1), (0, 0), True), ((1, 3), (0, 1), False), ((0, 4), (0, 0), False),
    ((2, 3), (-3, 1), False), ((2, 2, 2), (4, 1, 2), False), ((2, 2, 2), (2, 1, 2), True),
])
def test_overlaps_itself(shape, strides, want):
    assert layout.overlaps_itself(shape, strides) is want


def test_simplify_merges_and_drops_axes():
    assert simplify((2, 3, 4), (12, 4, 1), (12, 4, 1)) == ((24,), (1,), (1,))
    assert simplify((2, 1, 4), (4, 99, 1), (1, 5, 2)) == ((2, 4), (4, 1), (1, 2))
    assert simplify((3, 4), (4, 1), (1, 3)) == ((3, 4), (4, 1), (1, 3))


@pytest.mark.parametrize("view", [
    lambda a: a[::-1, ::-1],          # one element, negative strides: NumPy still calls it contiguous
    lambda a: a[:, ::-1],
    lambda a: a[::-1],
])
def test_to_device_hands_numba_packed_strides(monkeypatch, view):
    """Numba sizes a device copy from the host strides: a size-1 axis with a negative
    stride gave it an empty extent on the GPU ("incompatible shape (0, 1) vs (1, 1)")."""
    from numba_softmax.arrays import ops

    seen = []

    def fake_to_device(host, stream=0):
        seen.append((host.shape, host.strides))
        return host

    monkeypatch.setattr(ops.cuda, "to_device", fake_to_device)
    x = view(np.arange(1, dtype=np.float16).reshape(1, 1))
    ops.to_device(x)
    assert seen == [((1, 1), (2, 2))]
