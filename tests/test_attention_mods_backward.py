"""The score modifications — ``softcap`` and ``alibi_slopes`` — in the attention backward:
the CUDA-core kernel (float32) and the tensor-core kernel (float16, bfloat16) against the
float64 reference backward (:func:`numba_softmax.reference.attention_backward`, itself
checked against finite differences in ``test_attention_mods.py``), on poisoned outputs,
with GQA, causal masks, windows and irregular shapes; and the public
:func:`numba_softmax.attention_backward` with the options, forward and backward together.
"""

import numpy as np
import pytest
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.kernels.backward import attention_backward as KA
from numba_softmax.kernels.backward import attention_backward_tc_launch as TC

from _attention_data import BF16, F16, F32, fresh, poisoned, values
from _helpers import SIMULATOR, sized
from test_backward import attention_magnitudes, check_attention, stored

# |kernel − float64 reference| of a half-precision gradient, relative to its largest value
HALF_TOL = {F16: 1e-2, BF16: 6e-2}


def case(rng, b, hq, hkv, sq, sk, d, dv, dtype, causal, window, scale, softcap, alibi):
    """Inputs in ``dtype`` storage (O, LSE from the float64 forward with the options),
    the slopes (or None) and the float64 reference gradients."""
    shapes = [(b, hq, sq, dv), (b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, dv)]
    (do, do64), (q, q64), (k, k64), (v, v64) = (stored(rng.standard_normal(s), dtype)
                                                for s in shapes)
    slopes = None
    if alibi is not None:
        slopes = rng.uniform(0.05, 1.0, (b, hq) if alibi == "per_batch" else (hq,)).astype(F32)
    kw = dict(causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=slopes)
    o64, lse = R.attention(q64, k64, v64, return_lse=True, **kw)
    o, o64 = stored(o64, dtype)
    lse = lse.astype(np.float32)
    want = R.attention_backward(do64, q64, k64, v64, o64, lse, **kw)
    return (do, q, k, v, o, lse), slopes, want


def launch(mod, inputs, slopes, hq, **kw):
    outs = [poisoned(x.shape, x.dtype) for x in inputs[1:4]]
    alibi = None if slopes is None else cuda.to_device(slopes.reshape(-1, hq))
    mod.launch(*(cuda.to_device(x) for x in inputs), *outs, small=SIMULATOR, alibi=alibi, **kw)
    return [values(x.copy_to_host()) for x in outs]


def check_half(got, want, dtype, msg):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert np.isfinite(g).all(), f"{name}: not finite {msg}"
        err, top = np.max(np.abs(g - w), initial=0), np.max(np.abs(w), initial=0)
        assert err <= HALF_TOL[dtype] * (top + 0.1), f"{name}: error {err:.3g} (max {top:.3g}) {msg}"


MODS = [(3.0, None), (0.0, "per_batch"), (1.5, "per_head")]
CASES = sized(
    [  # (b, hq, hkv, sq, sk, d, dv, causal, window)
        (1, 2, 1, 9, 13, 8, 8, True, (-1, -1)),  # GQA, causal, ragged tiles
        (2, 1, 1, 7, 5, 5, 3, False, (2, 1)),  # irregular: D odd, Sq > Sk, a window
    ],
    [
        (2, 4, 2, 200, 333, 64, 64, True, (-1, -1)),
        (1, 3, 1, 77, 91, 40, 24, False, (5, 3)),
        (2, 2, 2, 150, 120, 128, 128, True, (-1, -1)),
    ])


@pytest.mark.parametrize("softcap,alibi", MODS)
@pytest.mark.parametrize("index", range(len(CASES)))
def test_cuda_core_kernel(index, softcap, alibi):
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window = CASES[index]
    inputs, slopes, want = case(rng, b, hq, hkv, sq, sk, d, dv, F32, causal, window, 0.7,
                                softcap, alibi)
    got = launch(KA, inputs, slopes, hq, causal=causal, window=window, scale=0.7,
                 softcap=softcap)
    sizes = attention_magnitudes(inputs, causal, window, 0.7, softcap, slopes)
    check_attention(got, want, F32, f"case {CASES[index]}, {softcap}, {alibi}, seed {seed}",
                    sizes)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("softcap,alibi", MODS)
def test_tensor_core_kernel(dtype, softcap, alibi):
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window = CASES[0] if dtype == F16 else CASES[1]
    inputs, slopes, want = case(rng, b, hq, hkv, sq, sk, d, dv, dtype, causal, window, -0.6,
                                softcap, alibi)
    got = launch(TC, inputs, slopes, hq, causal=causal, window=window, scale=-0.6,
                 softcap=softcap)
    check_half(got, want, dtype, f"{softcap}, {alibi}, seed {seed}")
    if causal and sq > sk:  # the rows that see no key get no gradient
        assert np.all(got[0][..., : sq - sk, :] == 0)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_public_api_forward_and_backward(dtype):
    """ns.attention's O and LSE with the options, then ns.attention_backward with the same
    options: the float64 reference's gradients (GQA, causal, Sq > Sk, per-batch slopes)."""
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d = 2, 2, 1, 11, 6, 8
    q, k, v, do = (rng.standard_normal(s).astype(dtype) for s in
                   ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d), (b, hq, sq, d)))
    sl = rng.uniform(0.1, 1.0, (b, hq)).astype(F32)
    kw = dict(causal=True, softcap=2.0, alibi_slopes=sl)
    o, lse = ns.attention(q, k, v, return_lse=True, **kw)
    got = ns.attention_backward(do, q, k, v, o, lse, **kw)
    ref = [values(x) for x in (do, q, k, v, o)]
    want = R.attention_backward(*ref, lse, **kw)
    if dtype == F32:
        check_attention(got, want, F32, f"seed {seed}")
    else:
        check_half([values(g) for g in got], want, dtype, f"seed {seed}")
    assert np.all(values(got[0])[..., : sq - sk, :] == 0)  # rows that see no key


def test_off_is_the_plain_backward():
    """softcap 0 or None and no slopes: bit for bit the gradients without the options
    (the same compiled kernel)."""
    rng, _ = fresh()
    q, k, v = (rng.standard_normal((1, 2, 6, 8)).astype(F32) for _ in range(3))
    o, lse = ns.attention(q, k, v, causal=True, return_lse=True)
    plain = ns.attention_backward(o, q, k, v, o, lse, causal=True)
    for kw in (dict(softcap=0, alibi_slopes=None), dict(softcap=None)):
        got = ns.attention_backward(o, q, k, v, o, lse, causal=True, **kw)
        assert all(np.array_equal(g, p) for g, p in zip(got, plain))


@pytest.mark.parametrize("kw,error", [(dict(softcap=-1.0), ValueError),
                                      (dict(softcap=float("nan")), ValueError),
                                      (dict(alibi_slopes=np.ones(3, F32)), ValueError),
                                      (dict(alibi_slopes=np.ones(2, np.float64)), TypeError)])
def test_bad_options_are_refused_by_name(kw, error):
    q = np.ones((1, 2, 3, 4), F32)
    o, lse = ns.attention(q, q, q, return_lse=True)
    with pytest.raises(error, match=next(iter(kw))):
        ns.attention_backward(o, q, q, q, o, lse, **kw)
