"""Edges of the public attention API that an audit found: each was a
crash, a silent wrong answer or an unclear error before, and is checked here through the
public functions with tiny shapes."""

import numpy as np
import pytest
from numba import cuda
from numpy.lib.stride_tricks import as_strided

import numba_softmax as ns
from numba_softmax import reference as R

from _helpers import SIMULATOR


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_a_head_dimension_of_zero_is_a_value_error():
    z, v = np.zeros((1, 1, 2, 0), np.float32), np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="head dimensions"):
        ns.attention(z, z, v)
    with pytest.raises(ValueError, match="head dimensions"):
        ns.attention_varlen(z[0, 0, :, None], z[0, 0, :, None], v[0, 0, :, None],
                            np.array([0, 2], np.int32), np.array([0, 2], np.int32))


def test_varlen_rows_of_no_sequence_are_zero_with_lse_minus_inf():
    """cu_seqlens_q[-1] < total_q (padding after the last sequence): those rows belong to
    no sequence — O = 0, LSE = −inf, as the reference — never uninitialised memory."""
    rng = np.random.default_rng(1)
    q, k = _rand(rng, 7, 1, 4), _rand(rng, 8, 1, 4)
    cu_q, cu_k = np.array([0, 3, 5], np.int32), np.array([0, 4, 8], np.int32)
    o, lse = ns.attention_varlen(q, k, k, cu_q, cu_k, return_lse=True)
    ref_o, ref_lse = R.attention_varlen(q, k, k, cu_q, cu_k, return_lse=True)
    np.testing.assert_allclose(o, ref_o, atol=1e-5)
    assert (o[5:] == 0).all() and np.isneginf(lse[:, 5:]).all()
    np.testing.assert_allclose(lse[:, :5], ref_lse[:, :5], atol=1e-5)


def test_index_tables_that_are_not_arrays_are_type_errors():
    rng = np.random.default_rng(2)
    q, k = _rand(rng, 7, 1, 4), _rand(rng, 8, 1, 4)
    for bad in ([0, 3, 7], None):
        with pytest.raises(TypeError, match="cu_seqlens_q: expected a NumPy array"):
            ns.attention_varlen(q, k, k, bad, np.array([0, 4, 8], np.int32))
    with pytest.raises(TypeError, match="cu_seqlens_q has dtype int64"):
        ns.attention_varlen(q, k, k, np.array([0, 3, 7]), np.array([0, 4, 8], np.int32))
    q4, cache = _rand(rng, 2, 2, 1, 4), _rand(rng, 4, 2, 1, 4)
    table, lengths = np.array([[0, 1], [2, 3]], np.int32), np.array([3, 4], np.int32)
    with pytest.raises(TypeError, match="block_table: expected a NumPy array"):
        ns.paged_attention(q4, cache, cache, table.tolist(), lengths)
    with pytest.raises(TypeError, match="cache_seqlens: expected a NumPy array"):
        ns.paged_attention(q4, cache, cache, table, None)


@pytest.mark.parametrize("given, error", [("a", TypeError), (4.5, TypeError), (True, TypeError),
                                          (1, ValueError)])
def test_varlen_longest_lengths_are_checked_by_name(given, error):
    rng = np.random.default_rng(3)
    q, k = _rand(rng, 7, 1, 4), _rand(rng, 8, 1, 4)
    with pytest.raises(error, match="max_seqlen_q"):
        ns.attention_varlen(q, k, k, np.array([0, 3, 7], np.int32), np.array([0, 4, 8], np.int32),
                            max_seqlen_q=given)


def test_attention_refuses_an_out_whose_elements_share_memory():
    """A zero-stride device ``out`` would have every row race into the same memory."""
    rng = np.random.default_rng(4)
    q, k, v = (cuda.to_device(_rand(rng, *s)) for s in ((1, 1, 3, 8), (1, 1, 5, 8), (1, 1, 5, 8)))
    buf = np.zeros(8, np.float32)
    shared = as_strided(buf, (1, 1, 3, 8), (0, 0, 0, 4))
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        out = FakeCUDAArray(shared)
    else:  # a device array viewed with a zero row stride
        dev = cuda.to_device(buf)
        out = cuda.cudadrv.devicearray.DeviceNDArray((1, 1, 3, 8), (0, 0, 0, 4), np.float32,
                                                      gpu_data=dev.gpu_data)
    with pytest.raises(ValueError, match="share memory"):
        ns.attention(q, k, v, out=out)


def test_attention_backward_takes_numpy_booleans():
    rng = np.random.default_rng(5)
    q, k, v, do = (_rand(rng, 1, 1, 3, 4) for _ in range(4))
    o, lse = ns.attention(q, k, v, causal=True, return_lse=True)
    got = ns.attention_backward(do, q, k, v, o, lse, causal=np.True_)
    want = ns.attention_backward(do, q, k, v, o, lse, causal=True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="causal must be True or False"):
        ns.attention_backward(do, q, k, v, o, lse, causal=1)


def test_a_gpu_older_than_sm80_is_refused_clearly(monkeypatch):
    """Before the first compile on a GPU older than sm_80 (a T4, a V100): a RuntimeError
    that names the GPU and the requirement — not ptxas's error about one instruction deep
    in a kernel.  sm_80 … sm_89 pass (their limits: ``NUMBA_SOFTMAX_TEST_AS``)."""
    from numba_softmax.runtime import launcher

    t4 = launcher.SIMULATOR_LIMITS._replace(name="Tesla T4", cc=(7, 5))
    with pytest.raises(RuntimeError, match=r"compute capability 8\.0 or newer.*Tesla T4 is 7\.5"):
        launcher.require_supported(t4)
    for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):
        launcher.require_supported(t4._replace(cc=cc))

    class Uncompiled:  # a kernel with no compiled overload yet
        overloads = {}

        def typeof_pyval(self, a):
            return a

        def compile(self, sig):
            raise AssertionError("compiled on a GPU it cannot run on")

    monkeypatch.setattr(launcher, "device_limits", lambda: t4)
    with pytest.raises(RuntimeError, match="Tesla T4"):
        launcher.compiled(Uncompiled(), (1,))
