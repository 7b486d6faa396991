"""hb1 and hb2, the wgmma attention backwards (kernels/backward/hopper_backward.py,
hopper_backward_ws.py), against the float64 reference with flash-attn's rule per gradient (``test_attention_backward_tc``'s
rule and same-precision path): on an sm_90 GPU, and on the simulator (its wgmma twin) at
one or two tiles.  Outputs poisoned with NaN first; data fresh every run."""

import functools

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.kernels.backward import hopper_backward as HB
from numba_softmax.kernels.backward import hopper_backward_ws as HBW

from _helpers import SIMULATOR, heads_view, hopper_or_simulator, routing, sized
from test_attention_backward_tc import check_rule, lowp_backward, values
from test_backward import BF16, F16, att_case, fresh, poisoned

pytestmark = pytest.mark.skipif(not hopper_or_simulator(), reason="wgmma needs sm_90 (or the simulator)")


def run(inputs, causal=False, window=(-1, -1), scale=None, strided=False, launch=HB.launch,
        heads=False):
    do, q, k, v, o, lse = inputs
    outs = [poisoned(x.shape, x.dtype) for x in (q, k, v)]
    dev = [cuda.to_device(x) for x in inputs]
    if heads:  # do, q, k, v as a model's transposed views
        dev[:4] = [heads_view(x) for x in inputs[:4]]
    if strided:  # q read through a view whose rows are not 16-byte aligned: value by value
        wide = cuda.to_device(np.concatenate([q, q[..., :1]], axis=-1))
        dev[1] = wide[:, :, :, :q.shape[-1]]
    launch(*dev, *outs, causal=causal, window=window, scale=scale)
    return [values(x.copy_to_host()) for x in outs]


CASES = sized(
    [  # (b, hq, hkv, sq, sk, d, dv, causal, window, storage): one storage a case here
        (1, 1, 1, 9, 20, 64, 64, True, (-1, -1), F16),  # one tile each; GQA, D 128, windows
    ],                                                  # and the rest at GPU sizes (CI's time)
    [(*c, s) for c in [
        (2, 4, 4, 200, 333, 64, 64, False, (-1, -1)),
        (2, 8, 2, 333, 200, 64, 64, True, (-1, -1)),
        (1, 8, 2, 257, 300, 128, 128, True, (-1, -1)),
        (1, 4, 1, 300, 300, 64, 128, False, (64, 16)),
        (1, 2, 2, 100, 517, 128, 128, False, (-1, -1)),
        (1, 2, 1, 1, 700, 128, 64, True, (-1, -1)),
        (2, 2, 1, 1024, 1024, 128, 128, True, (-1, -1)),
    ] for s in (F16, BF16)])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-h{}-{}-sq{}-sk{}-d{}-{}{}-{}".format(
    *c[:7], "-causal" if c[7] else "", "fp16" if c[9] == F16 else "bf16"))
def test_matches_the_reference(case):
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window, storage = case
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, storage, causal, window, scale=0.3)
    got = run(inputs, causal, window, scale=0.3)
    lowp = lowp_backward(inputs, storage, causal, window, 0.3)
    check_rule(got, want, lowp, f"case {case}, seed {seed}", storage)
    if causal and sq > sk:  # the rows that see no key get no gradient
        assert np.all(got[0][..., : sq - sk, :] == 0)


HB2_CASES = sized([(1, 3, 1, 9, 20, 64, 64, True, (-1, -1), F16)],  # GQA: 3 tiles, a stage reused
                  [c for c in CASES if c[3] > 1])
FUSED_CASES = sized([(1, 3, 1, 9, 20, 64, 64, True, (-1, -1), F16),
                     # 2 key blocks add dQ to the same rows; 4 tiles a block reuse both dSᵀ tiles
                     (1, 2, 1, 70, 100, 64, 64, False, (-1, -1), BF16)],
                    [c for c in HB2_CASES if c[5] == 64])


@pytest.mark.skipif(SIMULATOR, reason="the simulator runs this shape in one kernel (the fused "
                    "test: the same producer) and the two kernels on views (the next test)")
@pytest.mark.parametrize("case", HB2_CASES, ids=lambda c: "b{}-h{}-{}-sq{}-sk{}-d{}-{}{}-{}".format(
    *c[:7], "-causal" if c[7] else "", "fp16" if c[9] == F16 else "bf16"))
def test_hb2_matches_the_reference(case):
    """hb2: hb1's kernels fed by TMA through a ring of stages by a producer warp."""
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window, storage = case
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, storage, causal, window, scale=0.3)
    got = run(inputs, causal, window, scale=0.3, launch=HBW.launch)
    lowp = lowp_backward(inputs, storage, causal, window, 0.3)
    check_rule(got, want, lowp, f"hb2, case {case}, seed {seed}", storage)


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: "b{}-h{}-{}-sq{}-sk{}-d{}-{}{}-{}".format(
    *c[:7], "-causal" if c[7] else "", "fp16" if c[9] == F16 else "bf16"))
def test_hb2_fused_matches_the_reference(case):
    """hb2 in one kernel at D 64: dQ_i = dS_i K_j from dSᵀ read back transposed, added
    to the accumulator by every key block."""
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window, storage = case
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, storage, causal, window, scale=0.3)
    got = run(inputs, causal, window, scale=0.3, launch=functools.partial(HBW.launch, fused=True))
    lowp = lowp_backward(inputs, storage, causal, window, 0.3)
    check_rule(got, want, lowp, f"hb2 fused, case {case}, seed {seed}", storage)


@pytest.mark.parametrize("case", sized(
    [(2, 2, 1, 9, 20, 64, 64, True, (-1, -1), F16)],  # two batches, GQA: every coordinate
    [(2, 8, 2, 333, 200, 64, 64, True, (-1, -1), BF16),
     (1, 4, 1, 300, 300, 128, 128, False, (64, 16), F16)]),
    ids=lambda c: "b{}-h{}-{}-sq{}-sk{}-d{}-{}".format(*c[:7]))
def test_hb2_reads_a_models_transposed_views(case):
    """do, q, k, v as (B, H, S, D) views of (B, S, H, D) arrays: the 4-D maps load them
    as they lie."""
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal, window, storage = case
    inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, dv, storage, causal, window, scale=0.3)
    got = run(inputs, causal, window, scale=0.3, launch=HBW.launch, heads=True)
    lowp = lowp_backward(inputs, storage, causal, window, 0.3)
    check_rule(got, want, lowp, f"hb2 on views, case {case}, seed {seed}", storage)


def test_hb2_refuses_what_no_tensor_map_describes():
    rng, _ = fresh()
    inputs, _ = att_case(rng, 1, 1, 1, 4, 4, 64, 64, F16)
    dev = [cuda.to_device(x) for x in inputs]
    outs = [cuda.to_device(np.zeros_like(x)) for x in inputs[1:4]]
    wide = cuda.to_device(np.zeros((1, 1, 4, 66), F16))  # rows 132 bytes apart
    with pytest.raises(ValueError, match="^q: a tensor map"):
        HBW.launch(dev[0], wide[:, :, :, :64], *dev[2:], *outs)
    d128 = [cuda.to_device(np.zeros((1, 1, 4, 128), F16)) for _ in range(5)]
    with pytest.raises(ValueError, match="^fused: .* D 64 only"):  # one kernel: D 64 alone
        HBW.launch(*d128, dev[5], *d128[:3], fused=True)


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes: four tiles a kernel cost the simulator a minute")
def test_negative_scale_window_minus_inf_lse_and_rows_read_value_by_value():
    """A negative scale (no max is subtracted: LSE is the true normaliser), a window over
    two key tiles, a row marked as having seen nothing (LSE = −inf: no gradient, and it
    gives dK, dV nothing), and a q whose rows are not 16-byte aligned."""
    rng, seed = fresh()
    window = (9, 3)
    inputs, _ = att_case(rng, 1, 1, 1, 100, 230, 64, 64, F16,
                         window=window, scale=-0.4)
    do, q, k, v, o, lse = inputs
    lse[0, 0, 3] = -np.inf
    o[0, 0, 3] = 0
    want = R.attention_backward(*(values(x) for x in (do, q, k, v, o)), lse, scale=-0.4,
                                window=window)
    got = run((do, q, k, v, o, lse), window=window, scale=-0.4, strided=True)
    assert np.all(got[0][0, 0, 3] == 0)
    check_rule(got, want, lowp_backward((do, q, k, v, o, lse), F16, False, window, -0.4),
               f"seed {seed}")


def test_refuses_what_it_does_not_run():
    rng, _ = fresh()
    (do, q, k, v, o, lse), _ = att_case(rng, 1, 1, 1, 4, 4, 64, 64, F16)
    dev = [cuda.to_device(x) for x in (do, q, k, v, o, lse)]
    outs = [cuda.to_device(np.zeros_like(x)) for x in (q, k, v)]
    with pytest.raises(ValueError, match="D and Dv"):
        HB.launch(*(cuda.to_device(np.zeros((1, 1, 4, 40), F16)) for _ in range(4)), dev[4][:, :, :, :40],
                  dev[5], *(cuda.to_device(np.zeros((1, 1, 4, 40), F16)) for _ in range(3)))
    with pytest.raises(TypeError, match="float16"):
        f32 = [cuda.to_device(x.astype(np.float32)) for x in (do, q, k, v)]
        HB.launch(*f32, dev[4], dev[5], *outs)
    with pytest.raises(ValueError, match="scale"):
        HB.launch(*dev, *outs, scale=0.0)



@pytest.mark.skipif(SIMULATOR, reason="the API routes to the wgmma backward on an sm_90 GPU only")
def test_the_public_backward_takes_hb2_where_it_applies(monkeypatch):
    """ns.attention_backward on sm_90 runs hb2 for fp16 at D 64 (causal) and for a model's
    transposed views at D 128 (GQA, a window), with the reference's gradients; repeats on
    new arrays replay the call's launch plan — hb2's tensor maps, of the inputs and of its
    row terms' workspace, made again by the replay: no second launch through
    hopper_backward_ws.launch — and match their own reference; soft-capping, or
    NUMBA_SOFTMAX_HOPPER=off, keeps mma.sync."""
    import numba_softmax as ns

    api, calls = routing(monkeypatch, HBW)
    rng, seed = fresh()
    for b, hq, hkv, sq, sk, d, causal, window, views in (
            (1, 2, 1, 150, 200, 64, True, (-1, -1), False),
            (2, 4, 2, 130, 170, 128, False, (40, 8), True)):
        before = len(calls)
        for i in range(3):  # the first records, the next two replay
            inputs, want = att_case(rng, b, hq, hkv, sq, sk, d, d, F16, causal, window, scale=0.3)
            dev = [cuda.to_device(x) for x in inputs]
            if views:
                dev[:4] = [heads_view(x) for x in inputs[:4]]
            got = ns.attention_backward(*dev, causal=causal, window=window, scale=0.3)
            check_rule([values(x.copy_to_host()) for x in got], want,
                       lowp_backward(inputs, F16, causal, window, 0.3),
                       f"call {i}, D {d}, views {views}, seed {seed}", F16)
        assert len(calls) == before + 1
    before = len(calls)
    ns.attention_backward(*dev, window=window, scale=0.3, softcap=5.0)
    monkeypatch.setattr(api, "HOPPER", "off")
    ns.attention_backward(*dev, window=window, scale=0.3)
    assert len(calls) == before
