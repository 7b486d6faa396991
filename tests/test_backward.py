"""Backward passes: the float64 references against central finite differences (host), the
kernels against the references and against finite differences (float64 kernels), every
launch form, storage type and edge case; the public API's kinds, ``out=`` and errors.

Outputs are poisoned with NaN before a kernel runs; data are fresh every run (the seed is
in the failure message).  Shapes are tiny on the simulator but cross every code path: two
warps, several tiles and chunks, ragged ends, masked rows.
"""

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.backward import attention_backward, log_softmax_backward, softmax_backward
from numba_softmax.kernels.backward import attention_backward as KA
from numba_softmax.kernels.backward import attention_backward_tiles as KT
from numba_softmax.kernels.backward import softmax_backward_launch as KS
from numba_softmax.kernels.rows.epilogue import LOG_SOFTMAX, SOFTMAX

from _helpers import SIMULATOR, sized, to_host

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = np.dtype(np.uint16)  # bfloat16 bits
MODES = {"softmax": (SOFTMAX, R.softmax, R.softmax_backward),
         "log_softmax": (LOG_SOFTMAX, R.log_softmax, R.log_softmax_backward)}
# |kernel − float64 reference| for unit-scale gradients: float32 accumulates in float32,
# float16/bfloat16 inputs in float32 with the result rounded to the storage type
TOL = {F64: dict(rtol=1e-11, atol=1e-12), F32: dict(rtol=2e-5, atol=2e-6),
       F16: dict(rtol=4e-3, atol=2e-3), BF16: dict(rtol=2e-2, atol=2e-2)}
ATT_TOL = {F64: dict(rtol=1e-10, atol=1e-11), F32: dict(rtol=1e-4, atol=2e-5),
           F16: dict(rtol=1e-2, atol=5e-3), BF16: dict(rtol=5e-2, atol=4e-2)}


def fresh():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def to_bf16(x):
    """float32 → bfloat16 bits (round to nearest even)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def stored(x, dtype):
    """x in ``dtype`` storage, and the float64 values that storage holds."""
    if dtype == BF16:
        bits = to_bf16(x)
        return bits, from_bf16(bits).astype(np.float64)
    s = np.asarray(x).astype(dtype)
    return s, s.astype(np.float64)


def central_diff(f, x, eps=1e-6):
    """∂f/∂x by central differences, f a scalar function of the float64 array x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def attention_fd(fwd, do, q, k, v):
    """Central differences of Σ dO ∘ fwd(q, k, v)[0] with respect to q, k and v."""
    def wrt(i):
        def loss(a):
            args = [q, k, v]
            args[i] = a
            return (do * fwd(*args)[0]).sum()

        return central_diff(loss, (q, k, v)[i])

    return [wrt(i) for i in range(3)]


def poisoned(shape, dtype):
    return cuda.to_device(np.full(shape, np.nan if dtype != BF16 else 0x7FC0, dtype=dtype))


# --- the references against finite differences (host only) -------------------------------
@pytest.mark.parametrize("name", list(MODES))
@pytest.mark.parametrize("axis", [-1, 0])
def test_row_references_match_finite_differences(name, axis):
    rng, seed = fresh()
    _, fwd, bwd = MODES[name]
    x, dy = rng.standard_normal((2, 5, 7)) * 3, rng.standard_normal((2, 5, 7))
    on = lambda a: np.moveaxis(fwd(np.moveaxis(a, axis, -1)), -1, axis)  # noqa: E731
    want = central_diff(lambda a: (dy * on(a)).sum(), x)
    np.testing.assert_allclose(bwd(dy, on(x), axis=axis), want, atol=1e-7, err_msg=f"seed {seed}")


@pytest.mark.parametrize("causal, window, hq, hkv, sq, sk", [
    (False, (-1, -1), 2, 2, 5, 7),
    (True, (-1, -1), 4, 2, 9, 4),    # Sq > Sk: the first rows see no key (LSE = −inf)
    (False, (2, 1), 3, 1, 6, 6),     # a sliding window, multi-query
    (True, (3, -1), 2, 1, 4, 9),
])
def test_attention_reference_matches_finite_differences(causal, window, hq, hkv, sq, sk):
    rng, seed = fresh()
    q, do = rng.standard_normal((2, hq, sq, 3)), rng.standard_normal((2, hq, sq, 4))
    k, v = rng.standard_normal((2, hkv, sk, 3)), rng.standard_normal((2, hkv, sk, 4))
    fwd = lambda q, k, v: R.attention(q, k, v, causal, 0.7, True, window)  # noqa: E731
    o, lse = fwd(q, k, v)
    got = R.attention_backward(do, q, k, v, o, lse, causal, 0.7, window)
    for g, want in zip(got, attention_fd(fwd, do, q, k, v)):
        np.testing.assert_allclose(g, want, atol=2e-7, err_msg=f"seed {seed}")
    if causal and sq > sk:
        assert np.isneginf(lse[..., : sq - sk]).all() and np.all(got[0][..., : sq - sk, :] == 0)
    assert all(np.isfinite(g).all() for g in got)


# --- softmax backward kernels -------------------------------------------------------------
def run_rows(name, y, dy, plan=None):
    out = poisoned(y.shape, y.dtype)
    KS.launch(MODES[name][0], cuda.to_device(dy), cuda.to_device(y), out, plan_=plan)
    return out.copy_to_host()


def row_case(rng, name, rows, n, dtype):
    y = MODES[name][1](rng.standard_normal((rows, n)) * 3)
    y, y64 = stored(y, dtype)
    dy, dy64 = stored(rng.standard_normal((rows, n)), dtype)
    return y, dy, MODES[name][2](dy64, y64)


@pytest.mark.parametrize("name", list(MODES))
def test_float64_kernel_matches_finite_differences(name):
    rng, seed = fresh()
    _, fwd, _ = MODES[name]
    x, dy = rng.standard_normal((3, 37)) * 3, rng.standard_normal((3, 37))
    got = run_rows(name, fwd(x), dy)
    want = central_diff(lambda a: (dy * fwd(a)).sum(), x)
    np.testing.assert_allclose(got, want, atol=1e-7, err_msg=f"seed {seed}")


# (name, rows, n, plan): a warp per row; a block per row; two passes and split with ragged
# chunks (log_softmax's first pass reads dy alone: both modes for the streaming forms)
PLANS = sized(
    [("softmax", 5, 45, None), ("log_softmax", 3, 40, None),
     ("softmax", 2, 200, KS.Plan("block", 64, 4)),
     ("softmax", 2, 300, KS.Plan("two_pass", 64)), ("log_softmax", 2, 300, KS.Plan("two_pass", 64)),
     ("softmax", 2, 520, KS.Plan("split", 32, splits=3)),
     ("log_softmax", 1, 520, KS.Plan("split", 32, splits=3))],
    [(name, rows, n, plan) for name in MODES for rows, n, plan in [
        (37, 760, None), (199, 1128, None), (37, 5000, None), (20, 70000, None), (3, 300000, None),
        (37, 100001, None),  # sm_90: a cluster of 7 blocks a row
        (5, 5000, KS.Plan("two_pass", 256)), (3, 40000, KS.Plan("split", 256, splits=7))]])


def rounding_bound(name, y, dy):
    """What float32 arithmetic may miss per element, from the size of the terms it
    cancels (the result can be far smaller than they are): log_softmax dx = dy − p·S with
    S = Σ dy, softmax dx = y·(dy − S) with S = Σ y·dy; a tree sum of n terms rounds by at
    most (log2 n + 1)·eps·Σ|terms|.  (A 5000-value log_softmax row with p = 0.3 and S = 70
    missed 7e-6 on the H100: right, and beyond a flat 2e-6.)"""
    eps = float(np.finfo(np.float32).eps)
    y, dy = y.astype(np.float64), dy.astype(np.float64)
    depth = np.log2(y.shape[-1]) + 1
    w, t = (np.exp(y), dy) if name == "log_softmax" else (y, y * dy)
    S, S_abs = t.sum(-1, keepdims=True), np.abs(t).sum(-1, keepdims=True)
    if name == "log_softmax":
        return 4 * eps * (np.abs(dy) + w * np.abs(S)) + depth * eps * w * S_abs
    return 4 * eps * w * (np.abs(dy) + np.abs(S)) + depth * eps * w * S_abs


@pytest.mark.parametrize("name, rows, n, plan", PLANS)
def test_every_form_matches_the_reference(name, rows, n, plan):
    rng, seed = fresh()
    y, dy, want = row_case(rng, name, rows, n, F32)
    got = run_rows(name, y, dy, plan).astype(np.float64)
    allowed = TOL[F32]["atol"] + TOL[F32]["rtol"] * np.abs(want) + rounding_bound(name, y, dy)
    excess = np.abs(got - want) / allowed  # NaN (poison left) fails too
    worst = np.unravel_index(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)), excess.shape)
    assert np.all(excess <= 1), (f"seed {seed}: {np.sum(~(excess <= 1))} elements beyond the "
                                 f"bound; at {worst}: got {got[worst]!r}, want {want[worst]!r}, "
                                 f"allowed ±{allowed[worst]:.3g}")


@pytest.mark.parametrize("dtype, name, plan", [(F16, "softmax", None),
                                               (BF16, "log_softmax", KS.Plan("two_pass", 64))])
def test_storage_types(dtype, name, plan):
    rng, seed = fresh()
    y, dy, want = row_case(rng, name, 2, sized(70, 3000), dtype)
    got = run_rows(name, y, dy, plan)
    got = from_bf16(got) if dtype == BF16 else got
    np.testing.assert_allclose(got.astype(np.float64), want, err_msg=f"seed {seed}", **TOL[dtype])


# (rows, n, plan) for the pair-holding forms: rows of whole 16-byte vectors (several rows,
# aligned: float16 / bfloat16 in pairs), and one row with a ragged last vector (one row
# needs no row stride, so it still takes vectors); the last piece of a cluster short
CLUSTER_CASES = sized(
    [(2, 704, KS.Plan("cluster", 32, 8, 3)), (1, 701, KS.Plan("cluster", 32, 8, 3))],
    [(37, 19000, KS.Plan("cluster", 256, 16, 5)), (1, 19001, KS.Plan("cluster", 256, 16, 5))])
BLOCK_CASES = sized([(2, 200, KS.Plan("block", 32, 8)), (1, 203, KS.Plan("block", 32, 8))],
                    [(37, 9000, None), (1, 9001, None)])  # (the GPU: 512 threads × 32)


def check_rows(name, dtype, rows, n, plan):
    rng, seed = fresh()
    y, dy, want = row_case(rng, name, rows, n, dtype)
    got = run_rows(name, y, dy, plan)
    got = from_bf16(got) if dtype == BF16 else got.astype(np.float64)
    allowed = TOL[dtype]["atol"] + TOL[dtype]["rtol"] * np.abs(want)
    if dtype == F32:
        allowed = allowed + rounding_bound(name, y, dy)
    bad = ~(np.abs(got - want) <= allowed)  # NaN (poison left) fails too
    assert not bad.any(), f"seed {seed}: {bad.sum()} of {bad.size} beyond the bound"


@pytest.mark.parametrize("rows, n, plan", CLUSTER_CASES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("name", list(MODES))
def test_cluster_form(dtype, name, rows, n, plan):
    """A row over a cluster of blocks whose sums meet in each other's shared memory: three
    blocks of 32 threads (simulator) or five of 256 (GPU), the last piece short.  Every
    block adds the posted sums in one order, so each row's c is one number (within
    rounding of the other forms')."""
    if not SIMULATOR and tuple(KS.launcher.device_limits().cc) < (9, 0):
        pytest.skip("no thread-block clusters on this device")
    check_rows(name, dtype, rows, n, plan)


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
@pytest.mark.parametrize("name", list(MODES))
def test_wide_cluster_form(dtype, name):
    """A cluster of more than 8 blocks a row (the non-portable sizes, opted in by the
    launcher): the sums of 12 blocks (simulator) or 15–16 (GPU: the default plans, 512
    threads holding 64 registers of values — float32 rows past what 8 blocks hold)."""
    if not SIMULATOR and tuple(KS.launcher.device_limits().cc) < (9, 0):
        pytest.skip("no thread-block clusters on this device")
    if SIMULATOR:
        rows, n, plan = 1, 3001, KS.Plan("cluster", 32, 8, 12)
    else:
        rows, n, plan = 37, {F32: 250001, F64: 120001}.get(dtype, 250001), None
        assert KS.plan(rows, n, dtype, 1, 1024, 132, True, True).splits in (15, 16)
    check_rows(name, dtype, rows, n, plan)


@pytest.mark.parametrize("rows, n, plan", BLOCK_CASES)
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("name", list(MODES))
def test_block_form_in_pairs(dtype, name, rows, n, plan):
    """A block per row holding float16 / bfloat16 two to a register: a forced block of one
    warp on the simulator, the default plan on the GPU."""
    check_rows(name, dtype, rows, n, plan)


def test_pairs_are_used():
    """The cases above reach the pairs: whole vectors on aligned rows, and on one row."""
    from numba_softmax.kernels.rows import pairs
    from numba_softmax.kernels.hw import vector

    for rows, n in ((2, 704), (1, 701), (2, 200), (1, 203), (37, 19000), (1, 19001),
                    (37, 9000), (1, 9001)):
        a = cuda.to_device(np.zeros((rows, n), np.float16))
        assert pairs.packed(np.float16, vector.vector_width(a, a, a)), (rows, n)


def test_cluster_plan_refusals():
    """A forced cluster plan that does not cover the row, or of more than 16 blocks."""
    y = cuda.to_device(np.zeros((2, 700), np.float32))
    with pytest.raises(ValueError, match="does not fit"):
        KS.launch(SOFTMAX, y, y, cuda.device_array_like(y), plan_=KS.Plan("cluster", 32, 8, 2))
    with pytest.raises(ValueError, match="1 … 16 blocks"):
        KS.launch(SOFTMAX, y, y, cuda.device_array_like(y), plan_=KS.Plan("cluster", 32, 1, 22))


def test_wide_clusters_are_asked_of_the_driver_once(monkeypatch):
    """``cluster_fits`` (asked by every backward launch of a cluster over 8 blocks) goes to
    the driver once per compiled kernel, device and launch shape, then answers from memory."""
    from numba_softmax.runtime import launcher

    asked = []
    monkeypatch.setattr(launcher, "simulator_enabled", lambda: False)
    monkeypatch.setattr(launcher, "compiled", lambda kernel, args: kernel)
    monkeypatch.setattr(launcher, "_cluster_query", lambda *a: asked.append(a[2:]) or len(asked) == 1)
    monkeypatch.setattr(launcher, "_CLUSTER_FITS", {})
    kernel = object()  # (stands for a compiled kernel)
    answers = [launcher.cluster_fits(kernel, (), 256, 16) for _ in range(3)]
    answers.append(launcher.cluster_fits(kernel, (), 512, 16))  # another shape: asked again
    assert answers == [True, True, True, False]
    assert asked == [(256, 16, 0), (512, 16, 0)]


def test_strided_rows_without_vectors():
    """Column stride 2 and an odd row stride: W = 1, plain loads; the kernels read strides."""
    rng, seed = fresh()
    y, dy, want = row_case(rng, "softmax", 4, 30, F32)
    wide = np.zeros((4, 61), np.float32)
    wide[:, ::2][:, :30] = y
    y_dev = cuda.to_device(wide)[:, ::2][:, :30]
    out = poisoned((4, 30), F32)
    KS.launch(SOFTMAX, cuda.to_device(dy), y_dev, out)
    np.testing.assert_allclose(out.copy_to_host(), want, err_msg=f"seed {seed}", **TOL[F32])


def test_plan_picks_by_row_length():
    assert KS.plan(100, 1024, F32, 4, 1024, 132).form == "warp"
    assert KS.plan(100, 16384, F32, 4, 1024, 132) == KS.Plan("block", 1024, 16)
    assert KS.plan(100, 16385, F32, 4, 1024, 132).form == "two_pass"
    assert KS.plan(100, 16384, F64, 2, 1024, 132).form == "two_pass"  # half the values in float64
    assert KS.plan(8, 1 << 20, F32, 4, 1024, 132).form == "split"
    assert KS.plan(100, 4000, F32, 4, 256, 132) == KS.Plan("block", 256, 16)  # the kernel's limit
    # sm_90: a cluster of blocks a row, while 8 blocks' registers hold it and the clusters
    # fill the device
    assert KS.plan(100, 65536, F32, 4, 1024, 132, True) == KS.Plan("cluster", 512, 16, 8)
    assert KS.plan(100, 20000, F32, 4, 1024, 132, True) == KS.Plan("cluster", 256, 16, 5)
    assert KS.plan(100, 100000, F32, 4, 1024, 132, True) == KS.Plan("cluster", 1024, 16, 7)
    # 512 threads holding 64 registers of values where the cluster fills GPCs: 8 blocks
    assert KS.plan(100, 131072, F32, 4, 1024, 132, True) == KS.Plan("cluster", 512, 32, 8)
    assert KS.plan(100, 65536, F64, 2, 1024, 132, True) == KS.Plan("cluster", 512, 16, 8)
    assert KS.plan(100, 131073, F32, 4, 1024, 132, True).form == "two_pass"  # too long
    assert KS.plan(8, 65536, F32, 4, 1024, 132, True).form == "split"  # 64 blocks: too few
    # float16 / bfloat16: pairs in a block or a cluster, not in a warp (64-value lanes
    # measured 3.6× slower than a block of 128 holding 16 each)
    assert KS.plan(100, 1024, F16, 8, 1024, 132, True) == KS.Plan("warp", 128, 32)
    assert KS.plan(100, 2048, F16, 8, 1024, 132, True) == KS.Plan("block", 64, 32)
    assert KS.plan(100, 8192, F16, 8, 1024, 132, True) == KS.Plan("block", 256, 32)
    assert KS.plan(100, 262144, F16, 8, 1024, 132, True) == KS.Plan("cluster", 1024, 32, 8)
    # where the device runs clusters of 16 (``wide``): 15–16 such blocks (one a GPC)
    # before 8 of 1024, and any number up to 16 before two passes
    assert KS.plan(100, 262144, F16, 8, 1024, 132, True, True) == KS.Plan("cluster", 512, 32, 16)
    assert KS.plan(100, 163840, F16, 8, 1024, 132, True, True) == KS.Plan("cluster", 1024, 32, 5)
    assert KS.plan(100, 131073, F32, 4, 1024, 132, True, True) == KS.Plan("cluster", 512, 32, 9)
    assert KS.plan(256, 262144, F32, 4, 1024, 132, True, True) == KS.Plan("cluster", 512, 32, 16)
    assert KS.plan(256, 262145, F32, 4, 1024, 132, True, True).form == "two_pass"
    assert KS.plan(100, 524288, F16, 8, 1024, 132, True, True).form == "two_pass"  # pairs
    assert KS.plan(100, 131072, F64, 2, 1024, 132, True, True) == KS.Plan("cluster", 512, 16, 16)
    assert KS.plan(8, 262144, F32, 4, 1024, 132, True, True).form == "split"  # 128 blocks
    assert KS.plan(256, 262144, F32, 4, 256, 132, True, True).form == "two_pass"  # 512 threads


# --- the public row API -------------------------------------------------------------------
def test_public_api_axis_out_and_kinds():
    rng, seed = fresh()
    x, dy = rng.standard_normal((2, 9, 3)), rng.standard_normal((2, 9, 3)).astype(np.float32)
    y = np.moveaxis(R.softmax(np.moveaxis(x, 1, -1)), -1, 1).astype(np.float32)
    want = R.softmax_backward(dy, y, axis=1)
    got = softmax_backward(dy, y, axis=1)
    assert isinstance(got, np.ndarray) and got.dtype == F32
    np.testing.assert_allclose(got, want, err_msg=f"seed {seed}", **TOL[F32])
    copies = dy.copy(), y.copy()
    out = np.full_like(dy, np.nan)
    assert softmax_backward(dy, y, axis=1, out=out) is out
    np.testing.assert_allclose(out, want, **TOL[F32])
    assert np.array_equal(dy, copies[0]) and np.array_equal(y, copies[1])  # never modified
    ly = np.log(y)
    got = log_softmax_backward(cuda.to_device(dy), cuda.to_device(ly), axis=1)  # Numba in, Numba out
    assert hasattr(got, "copy_to_host")
    np.testing.assert_allclose(got.copy_to_host(), R.log_softmax_backward(dy, ly, axis=1), **TOL[F32])
    assert softmax_backward(np.zeros((2, 0), F32), np.zeros((2, 0), F32)).shape == (2, 0)


def test_public_api_errors():
    y = np.full((2, 5), 0.2, np.float32)
    with pytest.raises(TypeError, match="one dtype"):
        softmax_backward(y.astype(np.float64), y)
    with pytest.raises(TypeError, match="int32"):
        softmax_backward(y, y.astype(np.int32))
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        softmax_backward(y[:, :4], y)
    with pytest.raises(TypeError, match="kind"):
        log_softmax_backward(cuda.to_device(y), y)
    with pytest.raises(ValueError, match="out"):
        softmax_backward(y, y, out=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="axis"):
        softmax_backward(y, y, axis=2)


# --- attention backward kernel ------------------------------------------------------------
def att_case(rng, b, hq, hkv, sq, sk, d, dv, dtype, causal=False, window=(-1, -1), scale=None):
    """Inputs in ``dtype`` storage, O and LSE from the float64 forward on the stored values,
    and the float64 reference gradients."""
    shapes = [(b, hq, sq, dv), (b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, dv)]
    (do, do64), (q, q64), (k, k64), (v, v64) = (stored(rng.standard_normal(s), dtype) for s in shapes)
    o64, lse = R.attention(q64, k64, v64, causal, scale, True, window)
    o, o64 = stored(o64, dtype)
    lse = lse.astype(np.float32)
    want = R.attention_backward(do64, q64, k64, v64, o64, lse, causal, scale, window)
    return (do, q, k, v, o, lse), want


def run_attention(inputs, causal=False, window=(-1, -1), scale=None, tiles=None):
    do, q, k, v, o, lse = inputs
    outs = [poisoned(x.shape, x.dtype) for x in (q, k, v)]
    KA.launch(*(cuda.to_device(x) for x in inputs), *outs, causal=causal, window=window,
              scale=scale, small=SIMULATOR, tiles=tiles)
    got = [x.copy_to_host() for x in outs]
    return [from_bf16(g) if g.dtype == BF16 else g for g in got]


def check_attention(got, want, dtype, msg, magnitudes=None):
    """Each gradient within ATT_TOL of the float64 reference — plus, given the
    ``magnitudes`` of the terms each element sums (:func:`attention_magnitudes`), what
    float32 may lose to them: 64·eps·Σ|terms| (the sums' rounding, ~log2 n·eps, and the
    exponent's, ~|s − LSE|·eps, on P)."""
    eps = float(np.finfo(np.float32).eps)
    for i, (name, g, w) in enumerate(zip(("dq", "dk", "dv"), got, want)):
        assert np.isfinite(g).all(), f"{name}: not finite {msg}"
        tol = dict(ATT_TOL[dtype])
        if magnitudes is not None:
            tol["atol"] = tol["atol"] + 64 * eps * magnitudes[i]
            excess = np.abs(g.astype(np.float64) - w) - tol["atol"] - tol["rtol"] * np.abs(w)
            worst = np.unravel_index(np.argmax(excess), excess.shape)
            assert np.all(excess <= 0), (f"{name} {msg}: {np.sum(excess > 0)} elements beyond "
                                         f"the bound; at {worst}: got {g[worst]!r}, want {w[worst]!r}")
            continue
        np.testing.assert_allclose(g.astype(np.float64), w, err_msg=f"{name} {msg}", **tol)


def attention_magnitudes(inputs, causal=False, window=(-1, -1), scale=None, softcap=0.0,
                         alibi_slopes=None):
    """Σ|terms| of each element of (dQ, dK, dV): the backward's sums with every factor
    replaced by its size (P ≥ 0 as it is; dS by P·(|dO||V|ᵀ + Σ|dO∘O|)).  A gradient can
    be far smaller than the terms that cancel in it; float32 rounds relative to these."""
    do, q, k, v, o, lse = ((from_bf16(x) if x.dtype == BF16 else x).astype(np.float64)
                           for x in inputs)
    group = q.shape[-3] // k.shape[-3]
    kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = R.scores(q, kr, scale, softcap, alibi_slopes)  # (the options' factor g ≤ 1: dropped)
    seen = R.visible(q.shape[-2], k.shape[-2], causal, window) & np.isfinite(lse)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.where(seen, np.exp(np.where(seen, s - lse[..., None], 0.0)), 0.0)
    ds = p * (np.abs(do) @ np.swapaxes(np.abs(vr), -1, -2) + (np.abs(do) * np.abs(o)).sum(-1, keepdims=True))
    m_dq = scale * (ds @ np.abs(kr))
    m_dk = scale * (np.swapaxes(ds, -1, -2) @ np.abs(q))
    m_dv = np.swapaxes(p, -1, -2) @ np.abs(do)
    shape = k.shape[:-3] + (k.shape[-3], group)
    return (m_dq, m_dk.reshape(shape + m_dk.shape[-2:]).sum(axis=-3),
            m_dv.reshape(shape + m_dv.shape[-2:]).sum(axis=-3))


def test_attention_float64_kernel_matches_finite_differences():
    """GQA (2 query heads a K/V head), causal with Sq > Sk, ragged tiles, Dv != D."""
    rng, seed = fresh()
    q, do = rng.standard_normal((1, 2, 10, 5)), rng.standard_normal((1, 2, 10, 6))
    k, v = rng.standard_normal((1, 1, 9, 5)), rng.standard_normal((1, 1, 9, 6))
    fwd = lambda q, k, v: R.attention(q, k, v, True, None, True)  # noqa: E731
    o, lse = fwd(q, k, v)
    got = run_attention((do, q, k, v, o, lse), causal=True)
    for g, want in zip(got, attention_fd(fwd, do, q, k, v)):
        np.testing.assert_allclose(g, want, atol=1e-7, err_msg=f"seed {seed}")


ATT_CASES = sized(
    [  # (b, hq, hkv, sq, sk, d, dv, causal, window, tiles)
        (1, 2, 2, 9, 17, 8, 12, False, (-1, -1), None),
        (1, 1, 1, 20, 7, 8, 8, True, (-1, -1), None),     # whole tiles of rows that see nothing
        (1, 2, 1, 11, 17, 16, 8, False, (3, 2), None),    # a window, GQA
        (1, 1, 1, 17, 18, 8, 8, True, (5, -1), (16, 16, 2)),  # 2 rows and keys a lane
        (1, 1, 1, 9, 10, 32, 32, False, (-1, -1), None),  # dQ in vectors of 4 (sm_90)
    ],
    [
        (2, 4, 4, 200, 333, 64, 64, False, (-1, -1), None),
        (2, 4, 2, 333, 200, 64, 64, True, (-1, -1), None),
        (1, 8, 2, 257, 300, 128, 128, True, (-1, -1), None),
        (1, 4, 1, 300, 300, 40, 24, False, (64, 16), None),
        (2, 2, 2, 129, 130, 64, 64, True, (-1, -1), (32, 32, 4)),
        (1, 2, 2, 100, 130, 128, 128, False, (-1, -1), (32, 32, 4)),
    ])


@pytest.mark.parametrize("b, hq, hkv, sq, sk, d, dv, causal, window, tiles", ATT_CASES)
def test_attention_kernel_matches_the_reference(b, hq, hkv, sq, sk, d, dv, causal, window, tiles):
    rng, seed = fresh()
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, F32, causal, window, scale=0.3)
    got = run_attention(inputs, causal, window, scale=0.3, tiles=tiles)
    # long GQA sums: a small dK element can be what is left of large terms that cancel
    # (the H100 missed a flat 2e-5 by 5e-6 on one of 76800 at Sq 257, 4 heads a group)
    check_attention(got, want, F32, f"seed {seed}", attention_magnitudes(inputs, causal, window, 0.3))


def test_attention_kernel_on_strided_views():
    """Inputs and dQ as views of every second column: no 16-byte tile loads and no dQ adds
    in fours (both need unit column strides), the same gradients."""
    rng, seed = fresh()
    inputs, want = att_case(rng, 1, 2, 1, 9, 10, 32, 32, F32, True)
    wide = [cuda.to_device(np.repeat(x, 2, axis=-1)) for x in inputs[:5]]
    halve = lambda w: w[(slice(None),) * (w.ndim - 1) + (slice(None, None, 2),)]  # noqa: E731
    views = [halve(w) for w in wide] + [cuda.to_device(inputs[5])]  # (device arrays take no `...`)
    dq_wide = cuda.to_device(np.full(inputs[1].shape[:-1] + (64,), np.nan, np.float32))
    dk, dv = (poisoned(x.shape, x.dtype) for x in (inputs[2], inputs[3]))
    KA.launch(*views, halve(dq_wide), dk, dv, causal=True, small=SIMULATOR)
    got = [dq_wide.copy_to_host()[..., ::2], dk.copy_to_host(), dv.copy_to_host()]
    check_attention(got, want, F32, f"seed {seed}", attention_magnitudes(inputs, True))


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_attention_half_precision_storage(dtype):
    rng, seed = fresh()
    inputs, want = att_case(rng, 1, 2, 1, sized(9, 150), sized(13, 170), 16, 16, dtype, True)
    check_attention(run_attention(inputs, True), want, dtype, f"seed {seed}")


def test_lse_of_minus_inf_gives_zero_gradients():
    """A row marked as having seen nothing (LSE = −inf) contributes nothing, even where its
    keys are visible: P = 0, never exp(+inf)."""
    rng, _ = fresh()
    (do, q, k, v, o, lse), _ = att_case(rng, 1, 1, 1, 6, 9, 8, 8, F32)
    lse[0, 0, 2] = -np.inf
    o[0, 0, 2] = 0
    got = run_attention((do, q, k, v, o, lse))
    assert all(np.isfinite(g).all() for g in got) and np.all(got[0][0, 0, 2] == 0)
    want = R.attention_backward(do, q, k, v, o, lse)
    check_attention(got, want, F32, "")


def test_tiles_are_checked(monkeypatch):
    if KT.shared_limit() >= 227 * 1024:  # Hopper (and the simulator, tiled as for it)
        assert KT.fit_tiles(64, 64) == (64, 64, 4) and KT.fit_tiles(128, 96) == (32, 32, 4)
    monkeypatch.setattr(KT, "shared_limit", lambda: 99 * 1024)  # sm_86, sm_89: smaller tiles
    assert KT.fit_tiles(64, 64) == (64, 32, 4) and KT.fit_tiles(128, 96) == (32, 32, 4)
    assert KT.fit_tiles(128, 128, itemsize=8) == (16, 16, 4)
    for d in (8, 64, 128):
        for itemsize in (4, 8):
            bq, bk, _ = KT.fit_tiles(d, d, itemsize)
            assert KT.layout(d, d, bq, bk)[1] * itemsize <= 99 * 1024
    with pytest.raises(ValueError, match="4·W"):
        KT.check_tiles(24, 16, 4)
    offsets, total = KT.layout(64, 64, 64, 64)
    assert offsets[0] == 0 and total * 4 <= 227 * 1024  # fits an H100 block, 2 per SM
    qs, vs, ps = KT.strides(128, 96, 32)  # rows read together start in different bank groups
    assert (qs % 4, vs % 4, ps % 4) == (0, 0, 0) and (qs // 4) % 2 == (vs // 4) % 2 == (ps // 4) % 2 == 1
    assert KT.layout(128, 128, 32, 32)[1] * 4 + 1024 <= 228 * 1024 // 3  # three blocks an SM


# --- the public attention API -------------------------------------------------------------
def test_public_attention_backward_kinds_gqa_and_strides():
    rng, seed = fresh()
    inputs, want = att_case(rng, 2, 2, 1, 7, 9, 8, 8, F32, True)
    do, q, k, v, o, lse = inputs
    got = attention_backward(*inputs, causal=True)
    assert all(isinstance(g, np.ndarray) and g.dtype == F32 for g in got)
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
    check_attention(got, want, F32, f"seed {seed}")
    # (S, D) matrices, a window, Numba arrays in and out
    args = [cuda.to_device(np.ascontiguousarray(x[0, 0])) for x in inputs]
    w_o, w_lse = R.attention(q[0, 0], k[0, 0], v[0, 0], return_lse=True, window=(2, 3))
    args[4], args[5] = cuda.to_device(w_o.astype(np.float32)), cuda.to_device(w_lse.astype(np.float32))
    w = R.attention_backward(do[0, 0], q[0, 0], k[0, 0], v[0, 0], w_o, w_lse, window=(2, 3))
    got = attention_backward(*args, window=(2, 3))
    assert all(hasattr(g, "copy_to_host") for g in got)
    check_attention([g.copy_to_host() for g in got], w, F32, f"seed {seed}")


def test_public_attention_backward_errors_and_empty():
    rng, _ = fresh()
    (do, q, k, v, o, lse), _ = att_case(rng, 1, 2, 1, 4, 5, 8, 8, F32)
    with pytest.raises(TypeError, match="one dtype"):
        attention_backward(do, q.astype(np.float64), k, v, o, lse)
    with pytest.raises(ValueError, match="incompatible"):
        attention_backward(do, q, k[..., :7], v, o, lse)
    with pytest.raises(ValueError, match="incompatible"):
        attention_backward(do, q[:, :1], k[:, :1].repeat(2, 1), v[:, :1].repeat(2, 1), o, lse)
    with pytest.raises(ValueError, match="lse"):
        attention_backward(do, q, k, v, o, lse[..., :3])
    with pytest.raises(ValueError, match="do has shape"):
        attention_backward(do[..., :4], q, k, v, o, lse)
    with pytest.raises(TypeError, match="window"):
        attention_backward(do, q, k, v, o, lse, window=3)
    with pytest.raises(TypeError, match="kind"):
        attention_backward(do, q, k, v, o, cuda.to_device(lse))
    dq, dk, dv = attention_backward(do, q, k[:, :, :0], v[:, :, :0], np.zeros_like(o),
                                    np.full_like(lse, -np.inf))
    assert np.all(dq == 0) and dk.shape == (1, 1, 0, 8)
    to_host(dq)
