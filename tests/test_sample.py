"""Sampling: the kernels draw exactly what the NumPy twin draws (same counter-based hash),
their frequencies fit the exact distribution (χ²), and a seed reproduces the draws."""

import numpy as np
import pytest
from numba import cuda

from numba_softmax.kernels.topk import sample as S
from numba_softmax.kernels.topk import topk as K
from numba_softmax.reference import topk as RT
from numba_softmax.topk import sample

from _helpers import SIMULATOR, device_kinds, sized, to_host
from test_topk_combine import chi2_ok


def draw(x, plan=None, **kw):
    tokens = cuda.to_device(np.full(x.shape[0], -7, np.int64))  # poisoned
    S.launch(cuda.to_device(x), tokens, plan=plan, **kw)
    return tokens.copy_to_host()


def logits(rows, V, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, V)).astype(np.float32)
    x[1, V // 3] = np.nan  # no softmax: token −1
    x[2, : V // 2] = -np.inf
    return x


@pytest.mark.parametrize("plan", [K.Plan(True, 64, 4), K.Plan(False, 32, 4, 2)],
                         ids=["warp-rows", "split"])
@pytest.mark.parametrize("top_k, top_p", [(5, 0.8), (None, 1.0)], ids=["top-k-p", "gumbel"])
def test_kernel_draws_what_the_numpy_twin_draws(plan, top_k, top_p):
    x = logits(sized(3, 300), sized(24, 5000), 1)
    kw = dict(top_k=top_k, top_p=top_p, temperature=0.7, seed=123)
    got = draw(x, plan if SIMULATOR else None, **kw)
    ref = RT.sample(x, **kw)
    assert got[1] == -1 and (got[np.arange(len(got)) != 1] >= 0).all()
    # float32 vs float64 may move a draw lying within ~1e-6 of a boundary
    assert (got != ref).mean() <= sized(0, 1e-3), (got, ref)


@pytest.mark.parametrize("top_k, top_p", [(3, 0.9)] + ([] if SIMULATOR else [(None, 1.0)]))
def test_frequencies_fit_the_exact_distribution(top_k, top_p):
    """Weak on the simulator (24 draws: a warp per draw there); the exact agreement with
    the NumPy twin above and the twin's own χ² tests (4000 draws per case, both paths)
    carry the weight there.  On a GPU: 200000 draws per path."""
    x = np.tile(np.array([0.5, -0.3, 1.2, 0.9], np.float32), (sized(24, 200_000), 1))
    plan = K.Plan(True, 64, 4) if SIMULATOR else None
    tokens = draw(x, plan, top_k=top_k, top_p=top_p, temperature=1.3, seed=7)
    p = RT.sample_probabilities(x[0], top_k, top_p, temperature=1.3)
    ok, chi2, limit = chi2_ok(np.bincount(tokens, minlength=4), p)
    assert ok, (chi2, limit, np.bincount(tokens, minlength=4), p)


def test_a_seed_reproduces_the_draws():
    x = np.zeros((4, 8), np.float32)  # uniform rows: every token equally likely
    a, b, c = (draw(x, K.Plan(True, 64, 4), top_k=None, seed=s) for s in (5, 5, 6))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


@pytest.mark.parametrize("plan", [K.Plan(True, 64, 4), K.Plan(False, 32, 4, 2)], ids=["warp-rows", "split"])
def test_strided_float16_rows(plan):
    """A strided float16 view (W 1): its rows' ends padded by a float16 −inf made on the
    device (a float16 constant in a kernel failed to compile on a GPU)."""
    x = logits(sized(3, 64), sized(24, 5000), 4).astype(np.float16)
    wide = np.zeros((x.shape[0], 2 * x.shape[1]), np.float16)
    wide[:, ::2] = x
    tokens = cuda.to_device(np.full(x.shape[0], -7, np.int64))  # poisoned
    kw = dict(top_k=5, top_p=0.8, temperature=0.7, seed=3)
    S.launch(cuda.to_device(wide)[:, ::2], tokens, plan=plan, **kw)
    got, ref = tokens.copy_to_host(), RT.sample(x.astype(np.float32), **kw)
    assert got[1] == -1 and (got[np.arange(len(got)) != 1] >= 0).all()
    assert (got != ref).mean() <= sized(0, 1e-3), (got, ref)


@pytest.mark.skipif(SIMULATOR, reason="big shapes: GPU only")
def test_gpu_split_rows_and_bfloat16():
    x = logits(4, 128256, 2) * 3
    for kw in (dict(top_k=50, top_p=0.9), dict(top_k=None)):
        assert (draw(x, **kw, seed=9) == RT.sample(x, **kw, seed=9)).all()
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    exact = (bits.astype(np.uint32) << 16).view(np.float32)
    assert (draw(bits, top_k=8, seed=3) == RT.sample(exact, top_k=8, seed=3)).all()


# --- the public function -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy"] + device_kinds())
def test_public_axis_removed_any_kind(kind):
    x = np.random.default_rng(3).standard_normal((1, 9, 2)).astype(np.float32)
    arg = x if kind == "numpy" else cuda.to_device(x) if kind == "numba" else _device(x, kind)
    tokens = to_host(sample(arg, top_k=4, top_p=0.9, seed=2, axis=1))
    assert tokens.shape == (1, 2) and tokens.dtype == np.int64
    np.testing.assert_array_equal(tokens, RT.sample(np.moveaxis(x, 1, -1), 4, 0.9, seed=2))


def _device(x, kind):
    if kind == "torch":
        import torch

        return torch.from_numpy(x).cuda()
    import cupy

    return cupy.asarray(x)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(top_k=0), ValueError, "top_k must be in 1 … 6"),
    (dict(top_k=2.5), TypeError, "top_k must be an integer"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(top_p=0.5), ValueError, "top_p < 1 needs top_k"),
    (dict(seed=1.0), TypeError, "seed"),
    (dict(temperature=-1.0), ValueError, "temperature"),
])
def test_public_errors_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        sample(np.zeros((2, 6), np.float32), **kwargs)


def test_public_empty_axis_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        sample(np.zeros((2, 0), np.float32))
