"""The tensor-core attention backward (:mod:`numba_softmax.kernels.backward.attention_backward_tc`)
against the float64 reference, with flash-attn's accuracy rule per gradient:

    max |kernel − reference| ≤ 2 · max |same-precision backward − reference| + 1e-5

where "reference" is the float64 backward of the stored (rounded) inputs and the
same-precision backward is PyTorch's math path written in NumPy (every product in float32,
rounded to fp16/bf16).  On the simulator the kernel runs the lane-level mma emulation on
one- and two-warp tiles; on a GPU the real instructions on the default tiles.  Outputs are
poisoned with NaN first; data are fresh every run (the seed is in the message).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.backward import attention_backward
from numba_softmax.kernels.backward import attention_backward_tc_launch as TC
from numba_softmax.runtime import launcher

from _helpers import SIMULATOR, sized
from test_backward import BF16, F16, att_case, from_bf16, fresh, poisoned, to_bf16


def rnd(x, storage):
    """float → the nearest fp16 / bf16 value (as float64)."""
    x = np.asarray(x, np.float32)
    if storage == F16:
        return x.astype(np.float16).astype(np.float64)
    return from_bf16(to_bf16(x)).astype(np.float64)


def values(a):
    return (from_bf16(a) if a.dtype == BF16 else a).astype(np.float64)


def lowp_backward(inputs, storage, causal, window, scale):
    """PyTorch's math-path backward in half precision: S, P, dP, dS and each gradient
    rounded to the storage type, products accumulated in float32."""
    do, q, k, v, o, lse = (values(x) for x in inputs)
    group = q.shape[-3] // k.shape[-3]
    kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)

    def mm(a, b):
        return a.astype(np.float32) @ b.astype(np.float32)

    s = rnd(mm(q, np.swapaxes(kr, -1, -2)) * np.float32(scale), storage)
    seen = R.visible(q.shape[-2], k.shape[-2], causal, window) & np.isfinite(lse)[..., None]
    p = rnd(np.where(seen, np.exp(np.where(seen, s - lse[..., None], 0.0)), 0.0), storage)
    dp = rnd(mm(do, np.swapaxes(vr, -1, -2)), storage)
    ds = rnd(p * (dp - rnd((p * dp).sum(-1, keepdims=True), storage)), storage)

    def per_kv(x):  # the sum over each group of query heads
        return x.reshape(k.shape[:-3] + (k.shape[-3], group) + x.shape[-2:]).sum(axis=-3)

    dq = rnd(mm(ds, kr) * np.float32(scale), storage)
    dk = rnd(per_kv(mm(np.swapaxes(ds, -1, -2), q)) * np.float32(scale), storage)
    dv = rnd(per_kv(mm(np.swapaxes(p, -1, -2), do)), storage)
    return dq, dk, dv


def run(inputs, causal=False, window=(-1, -1), scale=None, **tiles):
    do, q, k, v, o, lse = inputs
    outs = [poisoned(x.shape, x.dtype) for x in (q, k, v)]
    TC.launch(*(cuda.to_device(x) for x in inputs), *outs, causal=causal, window=window,
              scale=scale, small=SIMULATOR, **tiles)
    return [values(x.copy_to_host()) for x in outs]


def check_rule(got, want, lowp, msg, storage=F16):
    """The rule, each element allowed besides the rounding of its own stored value (half
    an ulp: where the same-precision path happens to round a tiny sum exactly, one
    rounding of ours must not fail it)."""
    half_ulp = 2.0 ** -11 if storage == F16 else 2.0 ** -8
    for name, g, w, lp in zip(("dq", "dk", "dv"), got, want, lowp):
        assert np.isfinite(g).all(), f"{name}: not finite {msg}"
        err = np.max(np.abs(g - w) - half_ulp * np.abs(w), initial=0)
        base = np.max(np.abs(lp - w), initial=0)
        assert err <= 2 * base + 1e-5, f"{name}: error {err:.3g} > 2 × {base:.3g} + 1e-5 {msg}"


CASES = sized(
    [  # (b, hq, hkv, sq, sk, d, dv, causal, window, tiles)
        (1, 2, 2, 9, 17, 16, 16, False, (-1, -1), {}),
        (1, 2, 1, 20, 13, 24, 16, True, (-1, -1), {}),  # GQA; Sq > Sk: rows that see nothing
        (1, 1, 1, 18, 21, 20, 8, False, (3, 2), {}),  # D % 8 ≠ 0: copies value by value
        (1, 1, 1, 33, 35, 16, 16, True, (-1, -1), dict(warps=2, block_q=32)),
        (1, 2, 1, 17, 19, 48, 16, False, (-1, -1), dict(warps=2, block_q=16)),  # 2 warps a dQ slice
        (1, 1, 1, 12, 14, 7, 5, False, (-1, -1), {}),  # D odd: dQ by scalar atomic adds
    ],
    [
        (2, 4, 4, 200, 333, 64, 64, False, (-1, -1), {}),
        (2, 8, 2, 333, 200, 64, 64, True, (-1, -1), {}),
        (1, 8, 2, 257, 300, 128, 128, True, (-1, -1), {}),
        (1, 4, 1, 300, 300, 40, 24, False, (64, 16), {}),
        (1, 2, 2, 129, 130, 96, 96, True, (-1, -1), dict(warps=4, block_q=32)),
        (1, 2, 2, 100, 517, 128, 128, False, (-1, -1), dict(warps=4, block_q=64)),
        (1, 2, 1, 77, 91, 20, 8, False, (5, 3), dict(warps=2, block_q=16)),
        (2, 3, 3, 50, 61, 31, 33, True, (-1, -1), {}),
    ])


@pytest.mark.parametrize("storage", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_the_reference(storage, case):
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window, tiles = CASES[case]
    if tiles and not SIMULATOR and TC.Tiles.bytes(d, dv, tiles["warps"], tiles["block_q"]) \
            > launcher.device_limits().shared_optin:
        pytest.skip(f"tiles {tiles} need more shared memory than this device has")
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, storage, causal, window, scale=0.3)
    got = run(inputs, causal, window, scale=0.3, **tiles)
    lowp = lowp_backward(inputs, storage, causal, window, 0.3)
    check_rule(got, want, lowp, f"case {CASES[case]}, seed {seed}", storage)
    if causal and sq > sk:  # the rows that see no key get no gradient
        assert np.all(got[0][..., : sq - sk, :] == 0)


@st.composite
def problems(draw):
    hkv, group = draw(st.integers(1, 2)), draw(st.sampled_from([1, 1, 2, 3]))
    return dict(
        storage=draw(st.sampled_from([F16, BF16])), b=draw(st.integers(1, 2)), hq=hkv * group,
        hkv=hkv, sq=draw(st.one_of(st.sampled_from([1, 2]), st.integers(1, sized(20, 300)))),
        sk=draw(st.one_of(st.sampled_from([1, 2]), st.integers(1, sized(24, 300)))),
        dims=draw(st.sampled_from(sized([(16, 16), (8, 24)],
                                        [(16, 16), (40, 24), (64, 64), (128, 128)]))),
        causal=draw(st.booleans()), window=draw(st.sampled_from([(-1, -1), (-1, -1), (4, -1), (3, 5)])),
        scale=draw(st.sampled_from([None, 0.2, -0.5])), seed=draw(st.integers(0, 2**32 - 1)))


@given(p=problems())
def test_fuzz(p):
    """Drawn shapes (GQA groups, Sq and Sk from 1, ragged tiles), head dims, masks, windows
    and scales, fp16 and bf16: the rule on every gradient."""
    rng = np.random.default_rng(p["seed"])
    d, dv = p["dims"]
    args = (p["b"], p["hq"], p["hkv"], p["sq"], p["sk"], d, dv, p["storage"])
    inputs, want = att_case(rng, *args, p["causal"], p["window"], p["scale"])
    scale = 1 / np.sqrt(d) if p["scale"] is None else p["scale"]
    got = run(inputs, p["causal"], p["window"], scale)
    lowp = lowp_backward(inputs, p["storage"], p["causal"], p["window"], scale)
    check_rule(got, want, lowp, str(p), p["storage"])


def test_minus_inf_lse_and_negative_scale():
    """A row marked as having seen nothing (LSE = −inf) contributes nothing; a negative
    scale flips the scores (no max is subtracted here: LSE is the true normaliser)."""
    rng, seed = fresh()
    inputs, _ = att_case(rng, 1, 1, 1, 10, 12, 16, 16, F16, scale=-0.4)
    do, q, k, v, o, lse = inputs
    lse[0, 0, 3] = -np.inf
    o[0, 0, 3] = 0
    want = R.attention_backward(*(values(x) for x in (do, q, k, v, o)), lse, scale=-0.4)
    got = run((do, q, k, v, o, lse), scale=-0.4)
    assert np.all(got[0][0, 0, 3] == 0)
    check_rule(got, want, lowp_backward((do, q, k, v, o, lse), F16, False, (-1, -1), -0.4),
               f"seed {seed}")


def test_public_api_takes_half_precision_to_tensor_cores(monkeypatch):
    """``attention_backward`` on float16 NumPy arrays runs this kernel (the CUDA-core one
    would meet the rule too, so which launch ran is what is checked)."""
    calls = []
    real = TC.launch
    monkeypatch.setattr(TC, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rng, seed = fresh()
    inputs, want = att_case(rng, 1, 2, 1, 9, 11, 16, 16, F16, True, scale=0.3)
    got = attention_backward(*inputs, causal=True, scale=0.3)  # (a shape no other test uses:
    assert calls, "float16 did not reach the tensor-core kernel"  # no launch plan replays)
    check_rule([g.astype(np.float64) for g in got], want,
               lowp_backward(inputs, F16, True, (-1, -1), 0.3), f"seed {seed}")


def test_zero_scale_goes_to_cuda_cores():
    """scale = 0 (every visible key weighs the same): the tensor-core kernel cannot mask by
    scale·s = −inf, so the public API takes the CUDA-core kernel — finite, and right."""
    rng, seed = fresh()
    inputs, want = att_case(rng, 1, 2, 1, 9, 7, 16, 16, F16, True, scale=0.0)
    got = attention_backward(*inputs, causal=True, scale=0.0)
    lowp = lowp_backward(inputs, F16, True, (-1, -1), 0.0)
    check_rule([g.astype(np.float64) for g in got], want, lowp, f"seed {seed}")


def test_empty_half_precision_problems_give_zero_gradients():
    """No key or no query: the public API answers with zeros (no kernel), in fp16."""
    rng, _ = fresh()
    (do, q, k, v, o, lse), _ = att_case(rng, 1, 2, 1, 4, 5, 16, 16, F16)
    dq, dk, dv = attention_backward(do, q, k[:, :, :0], v[:, :, :0], np.zeros_like(o),
                                    np.full_like(lse, -np.inf))
    assert dq.dtype == F16 and np.all(dq == 0) and dk.shape == (1, 1, 0, 16)
    dq, dk, dv = attention_backward(do[:, :, :0], q[:, :, :0], k, v, o[:, :, :0], lse[:, :, :0])
    assert dq.shape == (1, 2, 0, 16) and np.all(dk == 0) and np.all(dv == 0) and dk.dtype == F16


def test_tiles_are_checked():
    t = TC.Tiles(128, 128)
    if SIMULATOR:
        assert (t.warps, t.block_q) == (8, 64)
    else:  # the first default this device's shared memory holds
        room = launcher.device_limits().shared_optin
        assert (t.warps, t.block_q) == TC.Tiles.fitting(128, 128, room)
        assert t.shared + 16 * t.block_q <= room
    assert t.block_k == 16 * t.warps
    with pytest.raises(ValueError, match="block_q"):
        TC.Tiles(64, 64, warps=2, block_q=48)
    with pytest.raises(ValueError, match="block_q"):
        TC.Tiles(64, 64, warps=4, block_q=24)


def test_default_tiles_fit_the_device():
    """The default tiles are the first of ``Tiles.DEFAULTS`` whose block fits the device's
    shared memory: Hopper (227 KB a block) and the A100 (163 KB) keep 8 warps × 64 query
    rows at D 128 (155 KB), sm_86/sm_89 (99 KB) get 4 × 32 there and 8 × 64 at D 64."""
    hopper, a100, ada = 227 * 1024, 163 * 1024, 99 * 1024
    assert TC.Tiles.fitting(128, 128, hopper) == (8, 64)
    assert TC.Tiles.fitting(128, 128, a100) == (8, 64)
    assert TC.Tiles.fitting(128, 128, ada) == (4, 32)
    assert TC.Tiles.fitting(64, 64, ada) == (8, 64)
    for d in (8, 64, 96, 128):
        for room in (hopper, a100, ada, 48 * 1024):
            w, br = TC.Tiles.fitting(d, d, room)
            assert TC.Tiles.bytes(d, d, w, br) <= room, (d, room, w, br)
    t = TC.Tiles(96, 64, warps=4, block_q=32)
    assert TC.Tiles.bytes(96, 64, 4, 32) == t.shared + 16 * 32  # + LSE_i, D_i (static)


def test_one_atomic_add_a_value_before_sm90(monkeypatch):
    """``red.global.add.v2.f32`` is sm_90's: on sm_80 … sm_89 dQ is added one value at a
    time, with the same gradients (even head sizes; odd ones always go that way)."""
    limits = launcher.device_limits()
    monkeypatch.setattr(launcher, "device_limits", lambda: limits._replace(cc=(8, 0)))
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window, tiles = CASES[1]  # GQA, causal, Sq > Sk
    assert d % 2 == 0
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, F16, causal, window, scale=0.3)
    got = run(inputs, causal, window, scale=0.3, **tiles)
    check_rule(got, want, lowp_backward(inputs, F16, causal, window, 0.3), f"seed {seed}")
