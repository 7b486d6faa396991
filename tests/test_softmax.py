"""softmax / log_softmax / logsumexp: every method against the float64 references."""

import hashlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.kernels.softmax import fused, online, split, three_pass
from numba_softmax.runtime import launcher
from numba_softmax.kernels.rows.epilogue import MODES

from _helpers import SIMULATOR, sized

METHODS = ["three_pass", "fused", "online", "split"]
FUNCS = {"softmax": (ns.softmax, R.softmax), "log_softmax": (ns.log_softmax, R.log_softmax),
         "logsumexp": (ns.logsumexp, R.logsumexp)}
TOL = {np.float16: dict(rtol=2e-3, atol=2e-4), np.float32: dict(rtol=1e-4, atol=2e-6),
       np.float64: dict(rtol=1e-12, atol=1e-13)}
LOG_TOL = {np.float16: dict(rtol=2e-3, atol=2e-2), np.float32: dict(rtol=1e-5, atol=5e-5),
           np.float64: dict(rtol=1e-12, atol=1e-12)}

ROWS = sized([2], [1, 37, 199])
COLS = sized([1, 33, 300], [1, 7, 33, 760, 1128, 5000])  # 300/5000: longer than a chunk


def cols(dtype):
    """The simulator (one Python thread per CUDA thread) covers all widths in float32 only."""
    return COLS if dtype is np.float32 or not SIMULATOR else [33]


def rng():
    return np.random.default_rng()  # fresh data every run


def fused_fits(n):
    return n <= fused.max_row(launcher.device_limits().max_threads)


def check(func_name, method, x, **kw):
    ours, ref = FUNCS[func_name]
    if method == "fused" and not fused_fits(x.shape[-1]):
        with pytest.raises(ValueError, match="on chip"):
            ours(x, method=method, **kw)
        return
    got = ours(x, method=method, **kw)
    want = ref(np.moveaxis(x, kw.get("axis", -1), -1).astype(np.float64))
    if func_name != "logsumexp":
        want = np.moveaxis(want, -1, kw.get("axis", -1))
    tol = (TOL if func_name == "softmax" else LOG_TOL)[x.dtype.type]
    assert got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, **tol)


@pytest.mark.parametrize("func_name", list(FUNCS))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("rows", ROWS)
def test_every_method_dtype_and_shape(func_name, method, dtype, rows):
    for n in cols(dtype):
        x = (rng().standard_normal((rows, n)) * 4).astype(dtype)
        check(func_name, method, x)


@pytest.mark.parametrize("method", ["auto", *METHODS])
def test_special_values_follow_torch(method):
    x = rng().standard_normal((6, 9)).astype(np.float32)
    x[0, 3] = -np.inf  # −inf → 0
    x[1] = -np.inf  # all −inf → NaN row; logsumexp −inf
    x[2, 5] = np.nan  # NaN → NaN row
    x[3, 0] = np.inf  # +inf → NaN row; logsumexp +inf
    x[4] *= 1e4  # large magnitudes: no overflow
    p = ns.softmax(x, method=method)
    assert p[0, 3] == 0 and np.isfinite(p[0]).all()
    assert np.isnan(p[1:4]).all()
    assert np.isfinite(p[4:]).all()
    np.testing.assert_allclose(p[[0, 4, 5]].sum(axis=-1), 1, rtol=1e-5)
    lse = ns.logsumexp(x, method=method)
    assert lse[1] == -np.inf and np.isnan(lse[2]) and lse[3] == np.inf
    lp = ns.log_softmax(x, method=method)
    assert lp[0, 3] == -np.inf and np.isnan(lp[1:4]).all()


@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0, 5), -1), ((2, 0, 3), 1)])
def test_empty(shape, axis):
    x = np.zeros(shape, np.float32)
    assert ns.softmax(x, axis=axis).shape == shape
    lse = ns.logsumexp(x, axis=axis)
    assert lse.shape == tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
    assert np.isneginf(lse).all()


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_any_axis_and_non_contiguous(axis):
    x = rng().standard_normal((3, 4, 5))
    check("softmax", "auto", x, axis=axis)
    check("logsumexp", "auto", x, axis=axis)
    xt = x.transpose(2, 0, 1)  # a non-contiguous view
    check("softmax", "auto", xt, axis=axis)


def test_device_arrays_in_device_arrays_out():
    x = rng().standard_normal((3, 40)).astype(np.float32)
    d = cuda.to_device(x)
    y = ns.softmax(d)
    assert hasattr(y, "copy_to_host")
    np.testing.assert_allclose(y.copy_to_host(), R.softmax(x), **TOL[np.float32])
    np.testing.assert_array_equal(d.copy_to_host(), x)


def test_out_is_written_and_returned():
    x = rng().standard_normal((3, 20)).astype(np.float32)
    out = np.full_like(x, np.nan)  # poisoned
    assert ns.softmax(x, out=out) is out
    np.testing.assert_allclose(out, R.softmax(x), **TOL[np.float32])
    out_lse = np.full(3, np.nan, np.float32)
    assert ns.logsumexp(x, out=out_lse) is out_lse
    np.testing.assert_allclose(out_lse, R.logsumexp(x), **LOG_TOL[np.float32])


@pytest.mark.parametrize("method", ["auto", *METHODS])
def test_input_never_modified(method):
    x = rng().standard_normal((2, 50)).astype(np.float32)
    digest = hashlib.sha256(x.tobytes()).hexdigest()
    for f in (ns.softmax, ns.log_softmax, ns.logsumexp):
        f(x, method=method)
    assert hashlib.sha256(x.tobytes()).hexdigest() == digest


# --- bad input: clear errors, raised before any kernel runs ----------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.complex64, bool])
def test_bad_dtype(dtype):
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        ns.softmax(np.ones((2, 3), dtype=dtype))


def test_bad_method_axis_and_kind():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="three_pass"):
        ns.softmax(x, method="magic")
    with pytest.raises(ValueError, match="out of bounds"):
        ns.softmax(x, axis=2)
    with pytest.raises(TypeError, match="integer"):
        ns.softmax(x, axis=1.5)
    with pytest.raises(TypeError, match="list"):
        ns.softmax([[1.0, 2.0]])


def test_bad_out():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        ns.softmax(x, out=np.empty((3, 2), np.float32))
    with pytest.raises(TypeError, match="float64"):
        ns.softmax(x, out=np.empty((2, 3), np.float64))
    with pytest.raises(TypeError, match="same kind"):
        ns.softmax(x, out=cuda.device_array((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(2,\)"):
        ns.logsumexp(x, out=np.empty((2, 3), np.float32))


def test_fused_refuses_rows_that_do_not_fit():
    x = cuda.to_device(np.ones((1, 200), np.float32))  # 200 > 32 threads · 4 values
    y = cuda.device_array((1, 200), np.float32)
    with pytest.raises(ValueError, match="on chip"):
        fused.launch(x, y, MODES["softmax"], threads=32, vpt=2)


# --- properties on the device: the answer does not depend on how the row is cut --------
@st.composite
def problem(draw):
    rows = draw(st.integers(1, sized(2, 16)))
    n = draw(st.integers(1, sized(200, 5000)))
    scale = draw(st.sampled_from([1.0, 10.0, 1e3]))
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32) * scale
    return x


def run(mod, x, mode="softmax", **config):
    d = cuda.to_device(x)
    y = cuda.to_device(np.full((x.shape[0], 1 if mode == "logsumexp" else x.shape[1]), np.nan, x.dtype))
    mod.launch(d, y, MODES[mode], **config)
    return y.copy_to_host()


threads_st = st.sampled_from(sized([32, 64], [32, 64, 128, 256, 512, 1024]))


@given(x=problem(), threads=threads_st, vpt=st.sampled_from([1, 2, 4, 8]), splits=st.integers(1, 9))
def test_result_independent_of_launch_configuration(x, threads, vpt, splits):
    want = R.softmax(x)
    tol = TOL[np.float32]
    np.testing.assert_allclose(run(online, x, threads=threads, vpt=vpt), want, **tol)
    np.testing.assert_allclose(run(three_pass, x, threads=threads), want, **tol)
    np.testing.assert_allclose(run(split, x, threads=threads, vpt=vpt, splits=splits), want, **tol)
    if x.shape[1] <= threads * fused.max_vpt(threads):
        np.testing.assert_allclose(run(fused, x, threads=threads), want, **tol)


@given(x=problem(), c=st.floats(-50, 50), method=st.sampled_from(["auto", *METHODS]))
def test_rows_sum_to_one_and_shift_invariance(x, c, method):
    if method == "fused" and not fused_fits(x.shape[1]):
        return
    p = ns.softmax(x, method=method)
    np.testing.assert_allclose(p, R.softmax(x), **TOL[np.float32])  # the float64 twin, not itself
    np.testing.assert_allclose(p.astype(np.float64).sum(axis=-1), 1.0, rtol=1e-4)
    x_c = (x.astype(np.float64) + c).astype(np.float32)  # x + c is rounded to fp32
    shifted = ns.softmax(x_c, method=method)
    np.testing.assert_allclose(shifted, R.softmax(x_c), **TOL[np.float32])
    np.testing.assert_allclose(shifted, p, rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(SIMULATOR, reason="CuPy/PyTorch arrays need a GPU")
def test_cupy_and_torch_arrays_round_trip():
    x = rng().standard_normal((37, 760)).astype(np.float32)
    want = R.softmax(x)
    cp = pytest.importorskip("cupy")
    y = ns.softmax(cp.asarray(x))
    assert isinstance(y, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(y), want, **TOL[np.float32])
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x).cuda()
    yt = ns.softmax(t.T, axis=0)  # a transposed (non-contiguous) tensor
    assert isinstance(yt, torch.Tensor) and yt.is_cuda
    np.testing.assert_allclose(yt.T.cpu().numpy(), want, **TOL[np.float32])
    out = torch.full_like(t, float("nan"))
    assert ns.softmax(t, out=out) is out
    np.testing.assert_allclose(out.cpu().numpy(), want, **TOL[np.float32])
    ns.softmax(t, out=t)  # in place
    np.testing.assert_allclose(t.cpu().numpy(), want, **TOL[np.float32])
    with pytest.raises(ValueError, match="overlaps"):
        ns.softmax(t[:, :-1], out=t[:, 1:])


@pytest.mark.skipif(SIMULATOR, reason="PyTorch bfloat16 tensors need a GPU")
@pytest.mark.parametrize("method", ["auto"] + METHODS)
def test_torch_bfloat16_contiguous_and_stepped(method):
    """bfloat16 through the public functions: PyTorch tensors, contiguous (16-byte vectors)
    and read through a stepped view (no vector loads), against the references on the exact
    bfloat16 values; the results bfloat16 (half an ulp: up to 2⁻⁸ relative, plus float32's)."""
    torch = pytest.importorskip("torch")
    base = (torch.randn(37, 2 * 1128, device="cuda") * 3).to(torch.bfloat16)
    for x in (base[:, :1128], base[:, ::2]):
        if method == "fused" and not fused_fits(x.shape[1]):
            continue
        exact = x.double().cpu().numpy()
        for name, (fn, ref) in FUNCS.items():
            y = fn(x, method=method)
            assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
            tol = dict(rtol=8e-3, atol=2e-2 if name != "softmax" else 1e-5)
            np.testing.assert_allclose(y.double().cpu().numpy(), ref(exact), err_msg=name, **tol)


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes: a cluster of eight blocks a row")
def test_cluster_rows_through_the_public_call_and_its_replays():
    """Rows that ``auto`` gives to ``cluster`` on sm_90 (8 blocks of 8192 values a row),
    called four times on one CUDA array: the later calls replay the recorded launch
    plan, which must launch clusters too (the kernel's cluster attribute, not the call)."""
    from numba_softmax.kernels.softmax import cluster, methods

    limits = launcher.device_limits()
    if not cluster.supported(limits):
        pytest.skip("no thread-block clusters on this device")
    rows = max(37, limits.sms // 2)
    assert methods.choose(rows, 65536, np.float32, limits) == "cluster"
    x = (rng().standard_normal((rows, 65536)) * 4).astype(np.float32)
    d = cuda.to_device(x)
    want = R.softmax(x.astype(np.float64))
    for _ in range(4):
        got = ns.softmax(d).copy_to_host()
        np.testing.assert_allclose(got, want, **TOL[np.float32])
