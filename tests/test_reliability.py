"""Reliability: what must hold whatever the input, and what must never happen.

* Inputs are never modified — a SHA-256 of the whole underlying buffer (views included,
  device arrays copied back) before and after every function, method and layout.
* ``out=`` may alias the input: in place works; an overlap that is not the input itself
  either works (NumPy: computed from a copy) or is a clean ValueError.
* A wrong ``out=`` (shape, dtype, kind) and every other bad argument are refused
  *before any kernel runs* (the launch functions are replaced by traps).
* Errors surface as clear Python exceptions — a device allocation that fails (out of
  memory), a launch that fails — without a hang, and the next call works.
* Repeat calls: a result is never overwritten by a later call; a changed input gives
  a new result (the launch-plan fast path on CUDA arrays must not cache data).
* On a GPU only: two streams at once (Numba, CuPy, PyTorch) give correct results; the
  default stream orders a call after prior PyTorch work; a row of 2**28 values (split
  and online) and a batch of more than 2**31 values (no 32-bit index overflow).
* ``scripts/sanitize.py``: its simulator mode runs, and its wrapper builds the table
  from the sanitizer's summary lines (a fake ``compute-sanitizer`` stands in here).
"""

import hashlib
import importlib
import math
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.kernels.softmax import fused, online, split, three_pass

from _helpers import permuted, SIMULATOR, device_kinds, load_script, sized, to_host

try:  # the modules (numba_softmax.attention may also name the function)
    A = importlib.import_module("numba_softmax.attention")
    KA = importlib.import_module("numba_softmax.kernels.attention.attention")
    KD = importlib.import_module("numba_softmax.kernels.decode.decode")
except ImportError:  # being written: the attention tests skip until it is there
    A = KA = KD = None

try:
    from numba.cuda.cudadrv.driver import CudaAPIError
except ImportError:  # pragma: no cover
    CudaAPIError = RuntimeError

ROOT = Path(__file__).resolve().parent.parent
API = importlib.import_module("numba_softmax.softmax")
needs_attention = pytest.mark.skipif(A is None, reason="numba_softmax.attention not there yet")
gpu_only = pytest.mark.skipif(SIMULATOR, reason="needs a GPU")

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FUNCS = {"softmax": (ns.softmax, R.softmax), "log_softmax": (ns.log_softmax, R.log_softmax),
         "logsumexp": (ns.logsumexp, R.logsumexp)}
METHODS = ["three_pass", "fused", "online", "split"]
TOL = {F16: dict(rtol=2e-3, atol=2e-4), F32: dict(rtol=1e-4, atol=2e-6),
       F64: dict(rtol=1e-12, atol=1e-13)}
LOG_TOL = {F16: dict(rtol=2e-3, atol=2e-2), F32: dict(rtol=1e-5, atol=5e-5),
           F64: dict(rtol=1e-12, atol=1e-12)}
ATT_TOL = {F32: dict(rtol=1e-4, atol=2e-5), F16: dict(rtol=4e-3, atol=2e-3)}


def rng(seed=None):
    return np.random.default_rng(seed)


def ref(func, x, axis=-1):
    want = FUNCS[func][1](np.moveaxis(np.asarray(x), axis, -1).astype(np.float64))
    return want if func == "logsumexp" else np.moveaxis(want, -1, axis)


def tol(func, dtype):
    return (TOL if func == "softmax" else LOG_TOL)[np.dtype(dtype)]


def digest(base):
    """SHA-256 of a whole buffer (host or device), bytes and layout."""
    host = to_host(base)
    return hashlib.sha256(np.ascontiguousarray(host).tobytes() + repr(host.shape).encode()).hexdigest()


# --- inputs are never modified ----------------------------------------------------------------
LAYOUTS = {
    "contiguous": lambda b: b,
    "column steps": lambda b: b[:, 1::2],
    "transposed": lambda b: b.T,
    "offset rows": lambda b: b[1:, 3:],  # a start that is not 16-byte aligned
    "reversed": lambda b: b[::-1, ::-2],  # negative strides (NumPy only)
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_inputs_never_modified(layout):
    """Every function and method, NumPy and Numba device arrays, on views of a buffer
    holding −inf, NaN and +inf: the whole buffer is unchanged afterwards (also with
    ``out=`` a separate array)."""
    base = (rng().standard_normal((4, sized(21, 301))) * 30).astype(np.float32)
    base[0, 5], base[1, 7], base[2] = np.nan, np.inf, -np.inf
    axis = 0 if layout == "transposed" else -1
    calls = {"numpy": [("softmax", "auto"), ("logsumexp", "online"), ("log_softmax", "three_pass")],
             "numba": [("softmax", "split"), ("logsumexp", "fused"), ("log_softmax", "auto")]}
    for kind, todo in calls.items():
        if kind == "numba" and layout == "reversed":
            continue  # Numba device arrays cannot be copied with negative strides
        buf = base.copy() if kind == "numpy" else cuda.to_device(base)
        before = digest(buf)
        x = LAYOUTS[layout](buf)
        y = None
        for func, method in todo:
            kw = {"out": y} if func == "log_softmax" else {}  # out= another array
            result = FUNCS[func][0](x, axis=axis, method=method, **kw)
            y = result if func == "softmax" else y
        assert digest(buf) == before, (kind, layout)


@needs_attention
@pytest.mark.parametrize("kind", ["numpy", "numba"])
def test_attention_inputs_never_modified(kind):
    r = rng()
    q = r.standard_normal((2, 7, 16)).astype(np.float32)
    k_t = r.standard_normal((2, 16, 21)).astype(np.float32)  # k is read as a transposed view
    v = r.standard_normal((2, 21, 16)).astype(np.float32)
    q[0, 1, 2] = np.nan
    bufs = [q, k_t, v] if kind == "numpy" else [cuda.to_device(a) for a in (q, k_t, v)]
    before = [digest(b) for b in bufs]
    qb, kb, vb = bufs
    kv = np.swapaxes(kb, -1, -2) if kind == "numpy" else permuted(kb, [0, 2, 1])
    o, lse = A.attention(qb, kv, vb, return_lse=True)
    o2, lse2 = A.attention(qb, kv, vb, causal=True, num_splits=3, return_lse=True)
    snap = [digest(b) for b in (o, lse, o2, lse2)]
    A.merge_attention(o, lse, o2, lse2)
    assert [digest(b) for b in bufs] == before
    assert [digest(b) for b in (o, lse, o2, lse2)] == snap


# --- out= aliasing the input ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy", "numba"])
@pytest.mark.parametrize("method", ["auto", *METHODS])
def test_in_place(kind, method):
    x = (rng().standard_normal((2, sized(37, 1001))) * 4).astype(np.float32)
    for func in ("softmax", "log_softmax"):
        want = ref(func, x)
        buf = x.copy() if kind == "numpy" else cuda.to_device(x)
        assert FUNCS[func][0](buf, method=method, out=buf) is buf
        np.testing.assert_allclose(to_host(buf), want, **tol(func, F32))


@pytest.mark.parametrize("kind", ["numpy", "numba"])
@pytest.mark.parametrize("func", list(FUNCS))
def test_out_overlapping_the_input(kind, func):
    """out= overlaps x without being x: rows shifted by one (softmax), or logsumexp into
    a piece of x.  NumPy computes from a copy (correct result); device arrays may refuse
    with a clean ValueError."""
    base = (rng().standard_normal((5, 40)) * 4).astype(np.float32)
    buf = base.copy() if kind == "numpy" else cuda.to_device(base)
    x, x_host = buf[0:4], base[0:4].copy()
    out = buf[1:5] if func != "logsumexp" else buf[3, 0:4]  # rows shifted / a piece of row 3
    try:
        got = FUNCS[func][0](x, out=out)
    except ValueError as exc:
        assert kind != "numpy" and "overlaps" in str(exc)
        return
    assert got is out
    np.testing.assert_allclose(to_host(got), ref(func, x_host), **tol(func, F32))


@needs_attention
@pytest.mark.parametrize("kind", ["numpy", "numba"])
def test_attention_out_is_q(kind):
    """attention(q, k, v, out=q): q is read in full before it is written, or copied."""
    r = rng()
    q, k, v = (r.standard_normal(s).astype(np.float32) for s in ((2, 9, 8), (2, 13, 8), (2, 13, 8)))
    want = R.attention(q, k, v, causal=True)
    qb = q.copy() if kind == "numpy" else cuda.to_device(q)
    kb, vb = (k, v) if kind == "numpy" else (cuda.to_device(k), cuda.to_device(v))
    assert A.attention(qb, kb, vb, causal=True, out=qb) is qb
    np.testing.assert_allclose(to_host(qb), want, **ATT_TOL[F32])


# --- bad arguments are refused before any kernel runs --------------------------------------
@pytest.fixture
def traps(monkeypatch):
    """Every kernel launch raises; every device allocation is counted.  Yields the list
    of what was called."""
    called = []

    def trap(name):
        def f(*args, **kwargs):
            called.append(name)
            raise AssertionError(f"{name} ran although the call must be refused first")

        return f

    from numba_softmax import plans
    from numba_softmax.runtime import launcher

    monkeypatch.setattr(launcher, "launch", trap("launcher.launch"))  # the one launcher
    monkeypatch.setattr(plans.Plan, "__call__", trap("plans.Plan"))  # and the plans' replay
    from numba_softmax.arrays import pool

    for name in ("to_device", "device_array"):  # no copy or buffer before the checks
        real_fn = getattr(cuda, name)
        monkeypatch.setattr(cuda, name, _counting(called, f"cuda.{name}", real_fn))
    monkeypatch.setattr(pool, "device_array", _counting(called, "pool.device_array",
                                                        pool.device_array))
    return called


def _counting(called, name, real):
    def counted(*args, **kwargs):
        called.append(name)
        return real(*args, **kwargs)

    return counted


def _bad_outs(kind):
    x = np.ones((3, 5), np.float32)
    dev = kind != "numpy"
    mk = (lambda a: cuda.to_device(a)) if dev else (lambda a: a)
    xin = mk(x)
    other = (lambda a: a) if dev else (lambda a: cuda.to_device(a))
    return xin, [
        ("softmax", mk(np.empty((5, 3), np.float32)), ValueError, r"\(5, 3\)"),
        ("softmax", mk(np.empty((3, 5, 1), np.float32)), ValueError, "shape"),
        ("softmax", mk(np.empty((3, 5), np.float64)), TypeError, "float64"),
        ("softmax", mk(np.empty((3, 5), np.float16)), TypeError, "float16"),
        ("softmax", other(np.empty((3, 5), np.float32)), TypeError, "same kind"),
        ("softmax", [[0.0] * 5] * 3, TypeError, "list"),
        ("logsumexp", mk(np.empty((3, 1), np.float32)), ValueError, r"\(3,\)"),
        ("logsumexp", mk(np.empty((3, 5), np.float32)), ValueError, r"\(3,\)"),
        ("log_softmax", mk(np.empty((3, 5), np.int32)), TypeError, "int32"),
    ]


@pytest.mark.parametrize("kind", ["numpy", "numba"])
@pytest.mark.parametrize("method", ["auto", *METHODS])
def test_bad_out_refused_before_any_kernel(traps, kind, method):
    x, cases = _bad_outs(kind)
    traps.clear()  # building the inputs copied them; the calls below must copy nothing
    for func, out, exc, match in cases:
        with pytest.raises(exc, match=match):
            FUNCS[func][0](x, method=method, out=out)
    assert traps == []
    # an empty input is checked too
    mk = (lambda a: a) if kind == "numpy" else cuda.to_device
    empty, empty_out = mk(np.ones((3, 0), np.float32)), mk(np.ones((0, 3), np.float32))
    traps.clear()
    with pytest.raises(ValueError, match="shape"):
        ns.softmax(empty, out=empty_out)
    assert traps == []


def test_bad_arguments_refused_before_any_kernel(traps):
    x = np.ones((3, 5), np.float32)
    with pytest.raises(TypeError, match="stream"):
        ns.softmax(x, stream="the fast one")
    with pytest.raises(ValueError, match="method"):
        ns.logsumexp(x, method="Fused")
    with pytest.raises(ValueError, match="out of bounds"):
        ns.log_softmax(x, axis=-3)
    with pytest.raises(TypeError, match="integer"):
        ns.softmax(x, axis=None)
    with pytest.raises(TypeError, match="int64"):
        ns.softmax(np.ones((3, 5), np.int64))
    assert traps == []


@gpu_only
def test_numba_out_that_cannot_be_viewed_as_rows_is_filled_by_a_device_copy():
    host = rng().standard_normal((2, 3, 4)).astype(np.float32)
    x = cuda.to_device(host)
    out = permuted(cuda.device_array((4, 2, 3), np.float32), [1, 2, 0])  # (2, 3, 4), scrambled
    assert ns.softmax(x, axis=1, out=out) is out
    np.testing.assert_allclose(to_host(out), ref("softmax", host, 1), **tol("softmax", F32))


def test_attention_bad_arguments_refused_before_any_kernel(traps):
    r = rng()
    q = r.standard_normal((2, 4, 8)).astype(np.float32)
    k = r.standard_normal((2, 6, 8)).astype(np.float32)
    v = r.standard_normal((2, 6, 8)).astype(np.float32)
    bad = [
        (dict(out=np.empty((2, 4, 7), np.float32)), ValueError, "shape"),
        (dict(out=np.empty((2, 4, 8), np.float16)), TypeError, "float16"),
        (dict(out=cuda.to_device(np.empty((2, 4, 8), np.float32))), TypeError, "same kind"),
        (dict(num_splits=0), ValueError, "num_splits"),
        (dict(num_splits=1.5), TypeError, "num_splits"),
        (dict(stream="default"), TypeError, "stream"),
    ]
    traps.clear()  # building the cases copied one array
    for kw, exc, match in bad:
        with pytest.raises(exc, match=match):
            A.attention(q, k, v, **kw)
    with pytest.raises(TypeError, match="float64"):
        A.attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match="head dim"):
        A.attention(q, k[..., :7], v)
    with pytest.raises(ValueError, match="between 1 and"):
        A.attention(np.ones((1, 2, 129), np.float32), np.ones((1, 3, 129), np.float32),
                    np.ones((1, 3, 8), np.float32))
    with pytest.raises(ValueError, match="lse_b"):
        A.merge_attention(q, np.zeros((2, 4), np.float32), q, np.zeros((2, 5), np.float32))
    assert traps == []


# --- errors surface as clear exceptions, and the next call works --------------------------------
def within(seconds, fn):
    """Run fn in a thread; its exception is re-raised here; failing to finish is a hang."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no answer after {seconds} s: a hang"
    if "error" in box:
        raise box["error"]
    return box.get("value")


OOM = [CudaAPIError(2, "CUDA_ERROR_OUT_OF_MEMORY"), MemoryError("out of device memory")]


def no_device_memory(monkeypatch, fail):
    """Every new device buffer fails with ``fail``: Numba's ``device_array`` and the
    pool's fresh blocks, with no idle block kept or left over to reuse."""
    from numba_softmax.arrays import pool

    monkeypatch.setattr(pool, "MAX_CACHED", 0)
    pool.release()
    monkeypatch.setattr(cuda, "device_array", fail)
    monkeypatch.setattr(pool, "new_block", fail)


@pytest.mark.parametrize("error", OOM, ids=["CudaAPIError", "MemoryError"])
@pytest.mark.parametrize("kind", ["numpy", "numba"])
def test_failed_allocation_surfaces(monkeypatch, error, kind):
    x = (rng().standard_normal((3, 40)) * 3).astype(np.float32)
    xin = x if kind == "numpy" else cuda.to_device(x)
    real_array, real_to_device = cuda.device_array, cuda.to_device

    def fail(*args, **kwargs):
        raise error

    from numba_softmax.arrays import pool

    real_block = pool.new_block
    no_device_memory(monkeypatch, fail)
    if kind == "numpy":  # a NumPy input fails at its copy to the device already
        monkeypatch.setattr(cuda, "to_device", fail)
    for method in ["auto", *METHODS]:
        with pytest.raises(type(error)):
            within(60, lambda: ns.softmax(xin, method=method))
    monkeypatch.setattr(cuda, "device_array", real_array)
    monkeypatch.setattr(pool, "new_block", real_block)
    monkeypatch.setattr(cuda, "to_device", real_to_device)
    for method in ["auto", "split"]:  # nothing half-made was kept
        np.testing.assert_allclose(to_host(ns.softmax(xin, method=method)), R.softmax(x), **TOL[F32])


def test_failed_split_workspace_surfaces(monkeypatch):
    """The split kernel's (m, ℓ) workspace fails to allocate — once; the failure must not
    leave a broken workspace behind."""
    x = (rng().standard_normal((2, sized(300, 5000))) * 3).astype(np.float32)
    d = cuda.to_device(x)
    y = cuda.device_array_like(d)
    from numba_softmax.runtime import workspaces

    ws = workspaces._WORKSPACES  # every kernel's scratch lives there
    saved = dict(ws) if ws is not None else None
    if ws is not None:
        ws.clear()  # so that the next split call must allocate
    real = cuda.device_array

    def fail(*args, **kwargs):
        raise CudaAPIError(2, "CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(cuda, "device_array", fail)
    try:
        with pytest.raises(CudaAPIError):
            within(60, lambda: ns.softmax(d, method="split", out=y))
        monkeypatch.setattr(cuda, "device_array", real)
        np.testing.assert_allclose(to_host(ns.softmax(d, method="split", out=y)), R.softmax(x), **TOL[F32])
    finally:
        if ws is not None:
            ws.update(saved)


def test_failed_launch_surfaces(monkeypatch):
    x = (rng().standard_normal((3, 40)) * 3).astype(np.float32)
    failure = CudaAPIError(719, "CUDA_ERROR_LAUNCH_FAILED")

    def fail(*args, **kwargs):
        raise failure

    for mod in (three_pass, fused, online, split):
        monkeypatch.setattr(mod, "launch", fail)
    for method in METHODS:
        with pytest.raises(CudaAPIError) as info:
            within(60, lambda: ns.logsumexp(x, method=method))
        assert info.value is failure
    monkeypatch.undo()
    np.testing.assert_allclose(ns.logsumexp(x), R.logsumexp(x), **LOG_TOL[F32])


@needs_attention
@pytest.mark.parametrize("splits", [1, 3])
def test_attention_failed_allocation_surfaces(monkeypatch, splits):
    r = rng()
    q, k, v = (r.standard_normal(s).astype(np.float32) for s in ((1, 5, 8), (1, 40, 8), (1, 40, 8)))

    def fail(*args, **kwargs):
        raise CudaAPIError(2, "CUDA_ERROR_OUT_OF_MEMORY")

    no_device_memory(monkeypatch, fail)
    with pytest.raises(CudaAPIError):
        within(60, lambda: A.attention(q, k, v, num_splits=splits))
    with pytest.raises(CudaAPIError):
        within(60, lambda: A.merge_attention(q, np.zeros((1, 5), np.float32), q,
                                             np.zeros((1, 5), np.float32)))
    monkeypatch.undo()
    np.testing.assert_allclose(A.attention(q, k, v, num_splits=splits), R.attention(q, k, v),
                               **ATT_TOL[F32])


@gpu_only
@needs_attention
def test_attention_with_more_than_65535_heads():
    """batch·heads > 65535 (once the grid's y limit): the grid numbers the heads along x."""
    r = rng()
    q = r.standard_normal((65536, 2, 4)).astype(np.float32)
    np.testing.assert_allclose(A.attention(q, q, q), R.attention(q, q, q), **ATT_TOL[F32])


# --- repeat calls: results are never overwritten, inputs never cached --------------------------
def to_kind(host, kind):
    if kind == "numba":
        return cuda.to_device(host)
    if kind == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(host)).cuda()
    import cupy

    return cupy.asarray(host)


@pytest.mark.parametrize("kind", device_kinds())
@pytest.mark.parametrize("method", ["auto", "split"])
def test_repeat_calls_keep_earlier_results_and_see_new_data(kind, method):
    """The first call on a layout may record a launch plan and later calls replay it
    (CuPy / PyTorch on a GPU): earlier results must survive, a changed input must give a
    new result, and a view at another alignment must be read right."""
    r = rng()
    shape = (sized(2, 37), sized(40, 3001))
    xs = [(r.standard_normal(shape) * 3).astype(np.float32) for _ in range(3)]
    ys = [ns.softmax(to_kind(x, kind), method=method) for x in xs]
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(to_host(y), R.softmax(x), **TOL[F32])
    d = to_kind(xs[0], kind)
    first = to_host(ns.softmax(d, method=method)).copy()
    new = xs[1] * 2
    if kind == "numba":
        d.copy_to_device(new)
    else:
        d[...] = to_kind(new, kind)
    np.testing.assert_allclose(to_host(ns.softmax(d, method=method)), R.softmax(new), **TOL[F32])
    np.testing.assert_allclose(first, R.softmax(xs[0]), **TOL[F32])
    wide = to_kind(np.ascontiguousarray(np.pad(new, ((0, 0), (1, 0)))), kind)
    for view, host in ((wide[:, 1:], new), (wide[:, :-1], np.pad(new, ((0, 0), (1, 0)))[:, :-1])):
        np.testing.assert_allclose(to_host(ns.softmax(view, method=method)), R.softmax(host), **TOL[F32])


# --- the sanitizer script ------------------------------------------------------------------------
def _load_sanitize():
    return load_script("scripts/sanitize.py")


@pytest.mark.skipif(not SIMULATOR, reason="the GPU run is `python scripts/sanitize.py --all-tools`")
def test_sanitize_workload_runs_on_the_simulator(capsys):
    """A sample of the script's workload on the simulator: every kernel family once.
    (The whole workload: ``python scripts/sanitize.py --sim``.)"""
    mod = _load_sanitize()
    names = [c.name for c in mod.all_cases(sim=True)]
    families = {n.split(":")[0] + ":" + n.split(":")[1] for n in names}
    expected = {f"{f}:{m}" for f in FUNCS for m in METHODS}
    if A is not None:
        expected |= {"attention:full", "attention:causal", "decode:full", "decode:causal"}
        assert any(n.startswith("merge:") for n in names)
    assert expected <= families
    picks = ["softmax:fused:float32:3x37", "logsumexp:split:float32:3x37", "softmax:views:float32:misaligned",
             "attention:causal:float32:1x37:D40", "decode:full:float32:1x37:*", "merge:float32:*"]
    assert mod.main([arg for p in picks for arg in ("--only", p)]) == 0
    out = capsys.readouterr().out
    assert "WORKLOAD:" in out and "FAIL" not in out


def test_sanitize_reads_the_sanitizer_summaries():
    mod = _load_sanitize()
    memcheck = "\n".join([
        "========= COMPUTE-SANITIZER",
        "========= Invalid __global__ read of size 4 bytes",
        "=========     at fused+0x1b0",
        '========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" '
        "on CUDA API call to cuPointerGetAttribute.",
        "WORKLOAD: 10/11 cases matched the references (3.0 s)",
        "========= ERROR SUMMARY: 2 errors",
    ])
    assert mod.parse_log(memcheck) == (2, None, (10, 11))
    assert mod.api_errors(memcheck) == {("CUDA_ERROR_INVALID_VALUE", "cuPointerGetAttribute"): 1}
    race = "========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)"
    assert mod.parse_log(race) == (1, 2, None)
    assert mod.parse_log("Segmentation fault") == (None, None, None)  # died: no verdict


FAKE_SANITIZER = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
code = int(args[args.index("--error-exitcode") + 1])
i = next(i for i, a in enumerate(args) if a.endswith("sanitize.py")) - 1
env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
proc = subprocess.run(args[i:], env=env)
probes = int(os.environ.get("FAKE_PROBES", "0")) if tool == "memcheck" else 0
errors = int(os.environ.get("FAKE_ERRORS", "0")) + probes if tool == "memcheck" else 0
print("========= COMPUTE-SANITIZER")
for _ in range(probes):
    print('========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" '
          'on CUDA API call to cuGetProcAddress_v2.')
if tool == "racecheck":
    print(f"========= RACECHECK SUMMARY: {{errors}} hazards displayed ({{errors}} errors, 0 warnings)")
else:
    print(f"========= ERROR SUMMARY: {{errors}} errors")
sys.exit(code if errors else proc.returncode)
"""


@pytest.mark.parametrize("fake_errors,probes,tools", [(0, 0, ["--all-tools"]),
                                                      (2, 0, ["--tool", "memcheck"]),
                                                      (0, 3, ["--tool", "memcheck"])])
def test_sanitize_wrapper_builds_its_table(tmp_path, fake_errors, probes, tools):
    """The wrapper runs the workload once per tool under (here, a fake) compute-sanitizer
    and reports each tool's error count and verdict; exit 1 when any tool found errors —
    the driver's answers to cuGetProcAddress probes are shown but not counted."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, FAKE_ERRORS=str(fake_errors), FAKE_PROBES=str(probes),
               NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sanitize.py"), *tools, "--sanitizer", str(fake),
         "--only", "softmax:fused:float32:1x1", "--log-dir", str(tmp_path / "logs")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    out = proc.stdout
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in out.splitlines() if line.startswith("| ") and "tool" not in line}
    assert set(rows) == ({"memcheck", "racecheck", "synccheck", "initcheck"} if "--all-tools" in tools
                         else {"memcheck"}), out
    for tool, cols in rows.items():
        errors = fake_errors + probes if tool == "memcheck" else 0
        assert cols[1] == str(errors), out
        assert cols[2] == cols[3] == str(probes if tool == "memcheck" else 0), out  # API calls, probes
        assert cols[5] == "1/1", out
        assert cols[-1] == ("FAIL" if fake_errors else "clean"), out
    assert f"SANITIZER memcheck: {fake_errors} errors ({probes} driver probes not counted)" in out
    assert proc.returncode == (1 if fake_errors else 0), out
    assert (tmp_path / "logs" / "memcheck.log").exists()


@gpu_only
@needs_attention
def test_merge_attention_with_more_than_65535_heads():
    """merge_attention numbers the (batch, head, row) triples along the grid's x axis: any
    batch·heads runs."""
    r = rng()
    lead = (70000,)
    o_a, o_b = (r.standard_normal(lead + (2, 8)).astype(np.float32) for _ in range(2))
    lse_a, lse_b = (r.standard_normal(lead + (2,)).astype(np.float32) for _ in range(2))
    o, lse = A.merge_attention(o_a, lse_a, o_b, lse_b)
    ref_o, ref_lse = R.merge_attention(o_a, lse_a, o_b, lse_b)
    np.testing.assert_allclose(o, ref_o, **ATT_TOL[F32])
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=2e-5)


# --- GPU only: streams ----------------------------------------------------------------------------
def _big_inputs(shape, n_arrays=2, seed=0):
    r = rng(seed)
    return [(r.standard_normal(shape) * 3).astype(np.float32) for _ in range(n_arrays)]


@gpu_only
@pytest.mark.parametrize("method,shape", [("fused", (4096, 1024)), ("online", (64, 200_000)),
                                          ("split", (4, 1_000_000)), ("three_pass", (64, 100_000))])
def test_two_numba_streams_at_once(method, shape):
    """Two streams, two inputs, each call queued on its own stream without waiting:
    every result is correct (the split kernel's workspace is one per stream)."""
    xs = _big_inputs(shape)
    streams = [cuda.stream(), cuda.stream()]
    ds = [cuda.to_device(x, stream=s) for x, s in zip(xs, streams)]
    results = []
    for _ in range(3):
        for d, s in zip(ds, streams):
            results.append((d, ns.softmax(d, method=method, stream=s),
                            ns.logsumexp(d, method=method, stream=s), s))
    for s in streams:
        s.synchronize()
    want = {id(d): (R.softmax(x), R.logsumexp(x)) for d, x in zip(ds, xs)}
    for d, y, lse, _ in results:
        np.testing.assert_allclose(y.copy_to_host(), want[id(d)][0], **TOL[F32])
        np.testing.assert_allclose(lse.copy_to_host(), want[id(d)][1], **LOG_TOL[F32])


@gpu_only
def test_numba_stream_orders_after_prior_work():
    """An input written by a kernel still running on stream s is read after it when the
    call is queued on s (no synchronisation in between); NumPy in, NumPy out, on s."""
    shape = (256, 65536)

    @cuda.jit
    def slow_fill(x, value, rounds):
        i, j = cuda.grid(2)
        if i < x.shape[0] and j < x.shape[1]:
            acc = value
            for _ in range(rounds):  # keep the stream busy for a while
                acc = acc * 1.0000001 + 0.0
            x[i, j] = acc + (j % 7) * 0.25

    s = cuda.stream()
    d = cuda.device_array(shape, np.float32, stream=s)
    slow_fill[(shape[0] // 16, shape[1] // 16), (16, 16), s](d, np.float32(1.0), 20000)
    y = ns.softmax(d, stream=s)
    s.synchronize()
    host = d.copy_to_host()
    np.testing.assert_allclose(y.copy_to_host(), R.softmax(host), **TOL[F32])
    x = _big_inputs((8, 5000), 1)[0]
    np.testing.assert_allclose(ns.softmax(x, stream=s), R.softmax(x), **TOL[F32])


@gpu_only
def test_cupy_streams():
    cp = pytest.importorskip("cupy")
    shape = (64, 100_000)
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    results = []
    for seed, s in enumerate(streams):
        with s:
            x = cp.random.default_rng(seed).standard_normal(shape, dtype=cp.float32) * 3
            x *= 1.5  # more work queued on s before the call
            for method in ("auto", "split", "online"):
                results.append((x, method, ns.softmax(x, method=method, stream=cp.cuda.get_current_stream())))
    for s in streams:
        s.synchronize()
    for x, method, y in results:
        np.testing.assert_allclose(cp.asnumpy(y), R.softmax(cp.asnumpy(x)), **TOL[F32], err_msg=method)


@gpu_only
def test_torch_default_stream_and_side_streams():
    """Default: a tensor produced by prior PyTorch work on its default stream is read
    after that work (the legacy default stream).  Side streams: pass
    ``torch.cuda.current_stream()``; two side streams at once."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    a = torch.randn(4096, 4096, device="cuda")
    t = (a @ a).div_(4096**0.5)[:64]  # queued, still running when softmax is called
    for method in ("auto", "online", "split"):
        y = ns.softmax(t, method=method)
        torch.cuda.synchronize()
        np.testing.assert_allclose(y.cpu().numpy(), R.softmax(t.cpu().numpy()), **TOL[F32])
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    for _ in range(3):  # the first call records a launch plan, the others replay it
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                x = torch.randn(64, 100_000, device="cuda") * (i + 1)
                x = x + 0.5
                results.append((x, ns.softmax(x, stream=torch.cuda.current_stream()),
                                ns.logsumexp(x, method="split", stream=torch.cuda.current_stream())))
    for s in streams:
        s.synchronize()
    for x, y, lse in results:
        host = x.cpu().numpy()
        np.testing.assert_allclose(y.cpu().numpy(), R.softmax(host), **TOL[F32])
        np.testing.assert_allclose(lse.cpu().numpy(), R.logsumexp(host), **LOG_TOL[F32])


@gpu_only
def test_negative_strides_on_the_device():
    """CuPy views with negative strides are copied and computed; a Numba device array
    with negative strides gives the right answer or a clear error, never a wrong one."""
    x = _big_inputs((8, 300), 1)[0]
    try:
        d = cuda.to_device(x)[::-1, ::-2]
    except (NotImplementedError, ValueError, IndexError):
        d = None  # this Numba cannot even make the view
    try:
        y = ns.softmax(d) if d is not None else None
    except (NotImplementedError, ValueError, TypeError):
        pass
    else:
        if y is not None:
            np.testing.assert_allclose(y.copy_to_host(), R.softmax(x[::-1, ::-2]), **TOL[F32])
    cp = pytest.importorskip("cupy")
    np.testing.assert_allclose(cp.asnumpy(ns.softmax(cp.asarray(x)[::-1, ::-2])),
                               R.softmax(x[::-1, ::-2]), **TOL[F32])


# --- GPU only: huge inputs ------------------------------------------------------------------------
_KERNELS = {}


def _kernels():
    """Device helpers with 64-bit indices: a hash fill, a NaN fill, a column gather."""
    if _KERNELS:
        return _KERNELS
    import numba

    @cuda.jit
    def fill(x, seed, scale):
        """x (1-D) ← pseudo-random values in [-scale, scale) from 64-bit indices."""
        i = numba.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        step = numba.int64(cuda.gridDim.x) * cuda.blockDim.x
        while i < x.size:
            h = (i * numba.int64(2654435761) + seed) & numba.int64(0xFFFFFFFF)
            h ^= h >> 15
            h = (h * numba.int64(2246822519)) & numba.int64(0xFFFFFFFF)
            h ^= h >> 13
            x[i] = (h * (2.0 / 4294967296.0) - 1.0) * scale
            i += step

    @cuda.jit
    def nan_fill(x, value):
        i = numba.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        step = numba.int64(cuda.gridDim.x) * cuda.blockDim.x
        while i < x.size:
            x[i] = value[0]
            i += step

    @cuda.jit
    def gather_column(src, col, dst):
        j = numba.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        if j < dst.size:
            dst[j] = src[j, col]

    _KERNELS.update(fill=fill, nan_fill=nan_fill, gather_column=gather_column)
    return _KERNELS


def _fill(d, seed, scale):
    _kernels()["fill"][1024, 256](d.reshape(d.size), np.int64(seed), scale)


def _poison(d):
    _kernels()["nan_fill"][4096, 256](d.reshape(d.size), cuda.to_device(np.full(1, np.nan, d.dtype)))


def _column(a, col):
    """a[:, col] of a huge 2-D device array (any strides), gathered on the device."""
    dst = cuda.device_array(a.shape[0], a.dtype)
    _kernels()["gather_column"][-(-a.shape[0] // 256), 256](a, np.int64(col), dst)
    return dst.copy_to_host()


@gpu_only
def test_one_row_of_2_pow_28_values():
    """softmax / logsumexp of one row of 2**28 float32 values (1 GiB) with split and
    online: the sum is 1 and sampled values match exp(x − m)/ℓ from float64 host sums."""
    n = 2**28
    d = cuda.device_array((1, n), np.float32)
    _fill(d, 12345, 8.0)
    x = d.copy_to_host()[0]
    m = float(x.max())
    l = sum(float(np.exp(x[i : i + 2**24].astype(np.float64) - m).sum()) for i in range(0, n, 2**24))
    lse = m + math.log(l)
    picks = np.concatenate([[0, 1, n // 2, n - 2, n - 1],
                            rng(0).integers(0, n, 1000), np.arange(2**24 - 2, 2**24 + 2)])
    y = cuda.device_array((1, n), np.float32)
    for method in ("split", "online"):
        _poison(y)
        ns.softmax(d, method=method, out=y)
        p = y.copy_to_host()[0]
        total = sum(float(p[i : i + 2**24].astype(np.float64).sum()) for i in range(0, n, 2**24))
        assert abs(total - 1) < 1e-4, (method, total)
        want = np.exp(x[picks].astype(np.float64) - m) / l
        np.testing.assert_allclose(p[picks], want, rtol=2e-4, atol=0, err_msg=method)
        got_lse = float(ns.logsumexp(d, method=method).copy_to_host()[0])
        assert abs(got_lse - lse) <= 1e-5 * abs(lse) + 1e-4, (method, got_lse, lse)


@gpu_only
def test_batch_of_more_than_2_pow_31_values():
    """(2**21 + 2**10) rows × 1024 float16 = 2**31 + 2**20 values (4 GiB in, 4 GiB out):
    every method, into a NaN-poisoned output; rows on both sides of element 2**31 are
    checked.  Then the same count laid out column-wise — softmax along axis 0 of a
    (1024, rows) array, the reduced axis having a stride of 2**21 + 2**10 elements."""
    rows, n = 2**21 + 2**10, 1024
    check = [0, 1, 2**21 - 1, 2**21, 2**21 + 1, rows - 2, rows - 1,
             *rng(1).integers(2**21, rows, 4).tolist()]
    d = cuda.device_array((rows, n), np.float16)
    _fill(d, 777, 6.0)
    x_rows = {r: d[r].copy_to_host() for r in check}
    y = cuda.device_array((rows, n), np.float16)
    for method in ("auto", "three_pass", "online", "split"):
        _poison(y)  # a row not written cannot pass
        ns.softmax(d, method=method, out=y)
        for r in check:
            np.testing.assert_allclose(y[r].copy_to_host().astype(np.float64), R.softmax(x_rows[r]),
                                       **TOL[F16], err_msg=f"{method}, row {r}")
    lse = ns.logsumexp(d).copy_to_host()
    for r in check:
        np.testing.assert_allclose(float(lse[r]), R.logsumexp(x_rows[r]), **LOG_TOL[F16])
    del d, y, lse
    cuda.current_context().deallocations.clear()  # give the 8 GiB back now

    b = cuda.device_array((n, rows), np.float16)  # column r is a row of the problem
    _fill(b, 778, 6.0)
    yb = ns.softmax(b, axis=0)
    for r in check:
        np.testing.assert_allclose(_column(yb, r).astype(np.float64), R.softmax(_column(b, r)),
                                   **TOL[F16], err_msg=f"axis 0, column {r}")


@pytest.mark.skipif(not SIMULATOR or os.environ.get("NUMBA_SOFTMAX_SIM_BLOCKS") == "in order",
                    reason="the simulator's shuffled block order (tests/conftest.py)")
def test_the_simulator_runs_blocks_out_of_order():
    """The kernels whose last block to finish merges (decode's splits, the radix top-k's
    pieces) are tested with blocks finishing in another order than their index."""

    @cuda.jit
    def ticket(order, counter):
        if cuda.threadIdx.x == 0:
            order[cuda.blockIdx.x] = cuda.atomic.add(counter, 0, 1)

    order = cuda.to_device(np.full(16, -1, np.int32))
    ticket[16, 1](order, cuda.to_device(np.zeros(1, np.int32)))
    got = order.copy_to_host()
    assert sorted(got) == list(range(16)) and list(got) != list(range(16))


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's shuffle emulation (numba_softmax/runtime/sim.py)")
def test_a_lane_that_raises_fails_its_launch_and_a_returned_lane_is_not_waited_for():
    """A lane that raises (the simulator raises where a GPU computes inf: math.log(0.0))
    while its warp shuffles fails the launch with that error — the warp once waited for
    it forever, and a fuzz case hung CI; lanes that returned before a shuffle are not
    waited for."""

    @cuda.jit
    def shuffle(x, out, fail_lane):
        lane = cuda.threadIdx.x
        if lane == fail_lane:
            x[lane] = math.log(x[lane])  # 0.0: raises under the simulator
        if lane >= 24:
            return
        out[lane] = cuda.shfl_xor_sync(0xFFFFFFFF, x[lane], 1)

    box = []
    x = np.zeros(32, np.float64)
    worker = threading.Thread(target=lambda: box.append(_raised(shuffle, x, 5)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the warp waited for the lane that raised"
    assert "math domain error" in box[0]
    out = cuda.to_device(np.full(32, -1.0))
    shuffle[1, 32](cuda.to_device(np.arange(32.0)), out, -1)
    assert list(out.copy_to_host()[:24]) == [float(i ^ 1) for i in range(24)]


def _raised(kernel, x, lane):
    try:
        kernel[1, 32](cuda.to_device(x), cuda.to_device(np.zeros(32)), lane)
    except Exception as e:  # noqa: BLE001 (the simulator's own error, whatever its type)
        return str(e)
    return "no error"
