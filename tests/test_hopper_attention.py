"""h1 … h7, the wgmma attention forwards (kernels/attention/hopper.py, hopper_ws.py),
against the float64 reference: on an sm_90 GPU, and on the simulator (its wgmma and TMA
twins) at one or two tiles."""

import functools

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.kernels.attention import hopper, hopper_ws

from _attention_data import BF16, F16, F32, check, fresh, poisoned, random, values
from _helpers import SIMULATOR, heads_view, hopper_or_simulator, routing, sized

pytestmark = pytest.mark.skipif(not hopper_or_simulator(), reason="wgmma needs sm_90 (or the simulator)")


def run(rng, b, hq, hkv, sq, sk, d, dv, dtype, causal, scale=None, out_dtype=None,
        ragged=False, v_n_major=False, launch=None, heads=False):
    q = random(rng, (b, hq, sq, d), dtype)
    k = random(rng, (b, hkv, sk, d + ragged), dtype)  # ragged: rows of d + 1 values, not
    # 16-byte aligned, so the kernel reads them value by value
    v = random(rng, (b, hkv, sk, dv), dtype)
    out_dtype = dtype if out_dtype is None else out_dtype
    o, lse = poisoned((b, hq, sq, dv), out_dtype), poisoned((b, hq, sq), F32)
    dq, dk, dvv = cuda.to_device(q), cuda.to_device(k)[:, :, :, :d], cuda.to_device(v)
    if heads:
        dq, dk, dvv = heads_view(q), heads_view(k), heads_view(v)
    k = k[..., :d]
    if launch is None:
        hopper.launch(dq, dk, dvv, o, lse, causal=causal, scale=scale, v_n_major=v_n_major)
    else:
        launch(dq, dk, dvv, o, lse, causal=causal, scale=scale)
    want_o, want_lse = R.attention(values(q), values(k), values(v), causal=causal, scale=scale,
                                   return_lse=True)
    lse = lse.copy_to_host()
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-5, atol=1e-4)
    check(o.copy_to_host(), lse, want_o, want_lse, dtype)  # (P is rounded to dtype inside)
    return q, k, v


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", sized(
    [(1, 1, 1, 8, 20, 64, 64, True),      # the smallest: one tile, causal (the quick tier's)
     (1, 2, 1, 40, 50, 64, 64, False),    # GQA, one tile each, Sk past the tile's keys masked
     (1, 1, 1, 24, 9, 128, 64, True)],    # D 128 in two chunks; causal Sq > Sk: empty rows
    [(2, 8, 2, 300, 517, 64, 64, False), (1, 4, 4, 517, 300, 128, 128, True),
     (2, 4, 1, 64, 2048, 128, 64, True), (1, 2, 2, 1, 1000, 64, 128, False)]),
    ids=lambda c: "b{}-h{}-{}-sq{}-sk{}-d{}-{}{}".format(*c[:7], "-causal" if c[7] else ""))
def test_matches_the_reference(case, dtype):
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d, dv, causal = case
    run(rng, b, hq, hkv, sq, sk, d, dv, dtype, causal)


@pytest.mark.parametrize("dv", [64, 128])
def test_v_read_n_major(dv):
    """V_j stored as it lies in memory, the second product reading it N-major."""
    rng, _ = fresh()
    run(rng, 1, 1, 1, *sized((16, 70), (300, 517)), 64, dv, F16, True, v_n_major=True)


WS_CASES = sized(
    [(1, 1, 1, 8, 40, 64, 64, False, None),     # the smallest: one tile (the quick tier's)
     (1, 1, 1, 16, 130, 64, 64, False, None),   # 3 key tiles: the two stages reused
     (1, 1, 1, 70, 60, 128, 64, True, -0.2)],   # Sq > Sk causal: empty rows; D 128
    [(2, 8, 2, 300, 517, 64, 64, False, None), (1, 4, 4, 517, 300, 128, 128, True, None),
     (2, 4, 1, 64, 2048, 128, 64, True, -0.1), (1, 2, 2, 1, 1000, 64, 128, False, None),
     (1, 4, 2, 517, 700, 64, 64, True, -0.3)])  # D 64 causal, a part-filled last block


def _ws_params():
    """Every configuration on every case and dtype — on the simulator, h3 (h2's source in
    another configuration, 384 threads a block) on fp16's first case, h4 on the second
    (two tiles: its loop), h5 (h4 on three stages) on the GPU only, h6 (h5 with the
    consumers' turns) on the second, h7 (three consumers, D 64 only) on the first."""
    sim_cases = {"h2": (0, 1, 2), "h3": (0,), "h4": (1,), "h5": (), "h6": (1,), "h7": (0,)}
    out = []
    for config in hopper_ws.CONFIGS:
        for i, c in enumerate(WS_CASES):
            for dtype, name in ((F16, "f16"), (BF16, "bf16")):
                if SIMULATOR and (i not in sim_cases[config] or (config != "h2" and dtype == BF16)):
                    continue
                if not hopper_ws.takes(config, c[5], c[6]):
                    continue
                ident = "b{}-h{}-{}-sq{}-sk{}-d{}-{}{}".format(*c[:7], "-causal" if c[7] else "")
                out.append(pytest.param(c, dtype, config, id=f"{config}-{ident}-{name}"))
    return out


@pytest.mark.parametrize("case,dtype,config", _ws_params())
def test_warp_specialized(case, dtype, config):
    """h2: the same fold fed by TMA through two stages by a producer warp; h3: two
    consumer warpgroups (128 query rows) on 128-key tiles, registers moved by setmaxnreg;
    h4: h3 with the softmax of tile j under the product of tile j − 1; h5: h4 on three
    stages; h6: h5 with the two consumers taking turns; h7: h5 with three consumers
    (192 query rows), D 64."""
    rng, _ = fresh()
    *shape, scale = case
    run(rng, *shape[:7], dtype, shape[7], scale=scale,
        launch=functools.partial(hopper_ws.launch, config=config))


@pytest.mark.parametrize("config", sized(["h2"], list(hopper_ws.CONFIGS)))
@pytest.mark.parametrize("case", sized(
    [(2, 2, 1, 8, 40, 64, 64, True)],  # two batches, GQA: every coordinate of the map moves
    [(2, 8, 2, 300, 517, 64, 64, False), (1, 4, 4, 517, 300, 128, 128, True)]),
    ids=lambda c: "b{}-h{}-{}-sq{}-sk{}-d{}-{}{}".format(*c[:7], "-causal" if c[7] else ""))
def test_warp_specialized_reads_a_models_transposed_views(case, config):
    """q, k, v as a model hands them over — (B, H, S, D) views of (B, S, H, D)
    projections — loaded as they lie by the 4-D tensor maps, no copy."""
    if not hopper_ws.takes(config, case[5], case[6]):
        pytest.skip(f"{config} does not take D {case[5]}")
    rng, _ = fresh()
    run(rng, *case[:7], F16, case[7], heads=True,
        launch=functools.partial(hopper_ws.launch, config=config))


def test_warp_specialized_refuses_what_no_tensor_map_describes():
    z = np.zeros((1, 1, 8, 66), np.float16)[..., :64]  # rows 132 bytes apart
    c = np.zeros((1, 1, 8, 64), np.float16)
    with pytest.raises(ValueError, match="^k: a tensor map"):
        hopper_ws.launch(c, z, c, c.copy(), np.zeros((1, 1, 8), np.float32), config="h2")


def test_warp_specialized_refuses_an_unknown_config():
    z = np.zeros((1, 1, 8, 64), np.float16)
    with pytest.raises(ValueError, match="config"):
        hopper_ws.launch(z, z, z, z.copy(), np.zeros((1, 1, 8), np.float32), config="h9")


def test_h7_takes_d64_only():
    """h7's three consumers fit the register file with D 64 tiles only: D 128 is refused
    by name, before anything runs."""
    z, lse = np.zeros((1, 1, 8, 128), np.float16), np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="config 'h7'"):
        hopper_ws.launch(z, z, z, z.copy(), lse, config="h7")
    z64 = np.zeros((1, 1, 8, 64), np.float16)
    with pytest.raises(ValueError, match="config 'h7'"):  # Dv 128 alone
        hopper_ws.launch(z64, z64, z, z.copy(), lse, config="h7")
    assert hopper_ws.takes("h7", 64, 64) and hopper_ws.takes("h6", 128, 64)
    assert not hopper_ws.takes("h7", 64, 128)
    assert "h7" in hopper_ws.taking(64, 64) and "h7" not in hopper_ws.taking(128, 128)


def test_negative_scale_float32_output_and_rows_read_value_by_value():
    rng, _ = fresh()
    run(rng, 1, 1, 1, *sized((5, 7), (100, 130)), 64, 64, F16, True, scale=-0.3,
        out_dtype=F32, ragged=True)


def test_refuses_what_it_does_not_run():
    z = np.zeros((1, 1, 8, 64), np.float16)
    lse = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="64 or 128"):
        hopper.launch(z[..., :32], z[..., :32], z[..., :32], z[..., :32], lse)
    with pytest.raises(TypeError, match="float16"):
        f = z.astype(np.float32)
        hopper.launch(f, f, f, f, lse)
    with pytest.raises(ValueError, match="scale"):
        hopper.launch(z, z, z, z.copy(), lse, scale=0.0)


@pytest.mark.skipif(SIMULATOR, reason="the API routes to the wgmma kernel on an sm_90 GPU only")
def test_the_public_api_takes_the_wgmma_kernel_where_it_applies(monkeypatch):
    """ns.attention on sm_90: by default ("auto") fp16 D 64 runs h7, D 128 h6 and D 64
    with Dv 128 h5, each with the reference's answer; a stepped q (every other row) and a
    model's transposed views take it too, as their tensor maps describe them; a q whose
    rows are not 16-byte aligned stays on mma.sync under "auto", and under a named
    configuration is copied for its tensor map (still the reference); a window, or
    NUMBA_SOFTMAX_HOPPER=off, keeps mma.sync; "h3" runs h3 at D 64 too; "h7" runs h7 at
    D 64 and leaves D 128, which it does not take, on mma.sync."""
    import numba_softmax as ns

    api, calls = routing(monkeypatch, hopper_ws)  # each call below records: none replays
    rng, seed = fresh()
    for d, config in ((64, "h7"), (128, "h6")):
        q, k, v = (random(rng, (2, 4, 200, d), F16) for _ in range(3))
        dq, dk, dv = (cuda.to_device(x) for x in (q, k, v))
        for causal in (False, True):
            o, lse = ns.attention(dq, dk, dv, causal=causal, return_lse=True)
            want = R.attention(values(q), values(k), values(v), causal=causal, return_lse=True)
            check(o.copy_to_host(), lse.copy_to_host(), *want, F16, f"seed {seed}")
        assert calls[-2:] == [config, config]
    q64 = random(rng, (2, 4, 200, 64), F16)  # D 64, Dv 128
    o = ns.attention(cuda.to_device(q64), cuda.to_device(q64), dv)
    np.testing.assert_allclose(o.copy_to_host().astype(np.float64),
                               R.attention(values(q64), values(q64), values(v)), rtol=4e-3,
                               atol=2e-3, err_msg=f"D 64, Dv 128, seed {seed}")
    assert calls[-1] == "h5"
    want = R.attention(values(q)[:, :, ::2], values(k), values(v))
    o = ns.attention(dq[:, :, ::2], heads_view(k), heads_view(v))  # stepped q, k/v views
    np.testing.assert_allclose(o.copy_to_host().astype(np.float64), want, rtol=4e-3,
                               atol=2e-3, err_msg=f"views, seed {seed}")
    assert calls[-1] == "h6"
    before = len(calls)
    wide = cuda.to_device(np.concatenate([q, q[..., :2]], axis=-1))[:, :, :, :128]
    want = R.attention(values(q), values(k), values(v))
    for setting, routed in (("auto", []), ("h5", ["h5"])):  # rows 260 bytes apart
        monkeypatch.setattr(api, "HOPPER", setting)
        o = ns.attention(wide, dk, dv)
        np.testing.assert_allclose(o.copy_to_host().astype(np.float64), want, rtol=4e-3,
                                   atol=2e-3, err_msg=f"{setting}, seed {seed}")
        assert calls[before:] == routed
    ns.attention(dq, dk, dv, window=(8, 0))
    monkeypatch.setattr(api, "HOPPER", "off")
    ns.attention(dq, dk, dv)
    assert len(calls) == before + 1
    monkeypatch.setattr(api, "HOPPER", "h3")
    d64 = cuda.to_device(random(rng, (1, 2, 100, 64), F16))
    ns.attention(d64, d64, d64)
    assert calls[-1] == "h3"
    monkeypatch.setattr(api, "HOPPER", "h7")
    before = len(calls)
    o = ns.attention(dq, dk, dv)  # D 128: not h7's
    np.testing.assert_allclose(o.copy_to_host().astype(np.float64),
                               R.attention(values(q), values(k), values(v)), rtol=4e-3, atol=2e-3)
    assert len(calls) == before
    ns.attention(d64, d64, d64)
    assert calls[before:] == ["h7"]


@pytest.mark.skipif(SIMULATOR, reason="launch plans exist on a GPU only")
@pytest.mark.parametrize("views", [False, True], ids=["contiguous", "views"])
def test_a_routed_call_replays_its_plan_with_maps_of_the_new_arrays(monkeypatch, views):
    """A call "auto" routes to the wgmma forward records a launch plan like any other:
    repeats on new arrays of the same layout (new pointers, so new tensor maps, made
    from them by the replay) launch no kernel through hopper_ws.launch, and each gives
    the reference's answer for its own data — a model's transposed views as well."""
    import numba_softmax as ns
    from numba_softmax import plans

    _, calls = routing(monkeypatch, hopper_ws)
    rng, seed = fresh()
    for i in range(3):  # the first records, the next two replay
        q, k, v = (random(rng, (2, h, 300, 128), F16) for h in (4, 2, 2))
        dev = [heads_view(x) if views else cuda.to_device(x) for x in (q, k, v)]
        o, lse = ns.attention(*dev, causal=True, return_lse=True)
        want = R.attention(values(q), values(k), values(v), causal=True, return_lse=True)
        check(o.copy_to_host(), lse.copy_to_host(), *want, F16, f"call {i}, seed {seed}")
    assert calls == ["h6"] and len(plans._PLANS) == 1


def test_an_unknown_hopper_setting_is_refused_by_name(monkeypatch):
    import importlib

    import numba_softmax as ns

    api = importlib.import_module("numba_softmax.attention")
    monkeypatch.setattr(api, "HOPPER", "h9")
    q = np.zeros((1, 1, 40, 64), np.float16)  # 40 rows: one pass, where the setting is read
    with pytest.raises(ValueError, match="NUMBA_SOFTMAX_HOPPER"):
        ns.attention(q, q, q)
    lse = np.zeros((1, 1, 40), np.float32)
    with pytest.raises(ValueError, match="NUMBA_SOFTMAX_HOPPER"):  # the backward reads it too
        ns.attention_backward(q, q, q, q, q, lse)


@pytest.mark.skipif(SIMULATOR, reason="the simulator's maps are made afresh, not pooled")
def test_tensor_map_slots_are_reused_safely(monkeypatch):
    """The device tensor maps live in a ring of slots (kernels/hw/tma_maps.py): a map
    already there is not uploaded again, and with more maps than slots each slot is
    rewritten (after the launch that read it has run) — every result still the
    reference's.  Four slots here; three maps a launch."""
    from numba_softmax.kernels.hw import tma_maps

    monkeypatch.setattr(tma_maps, "SLOTS", 4)
    ctx = id(cuda.current_context())
    monkeypatch.setitem(tma_maps._POOLS, ctx, tma_maps._Pool())
    pool = tma_maps._POOLS[ctx]
    rng, seed = fresh()
    cases = []
    for _ in range(4):
        q, k, v = (random(rng, (1, 2, 150, 64), F16) for _ in range(3))
        cases.append(((q, k, v), [cuda.to_device(x) for x in (q, k, v)]))
    for host, dev in cases + cases[:1]:
        o, lse = poisoned((1, 2, 150, 64), F16), poisoned((1, 2, 150), F32)
        hopper_ws.launch(*dev, o, lse, causal=True, config="h5")
        want = R.attention(*(values(x) for x in host), causal=True, return_lse=True)
        check(o.copy_to_host(), lse.copy_to_host(), *want, F16, f"seed {seed}")
    assert pool.next == (5 * 3) % 4 and len(pool.slot_of) == 4
    slots = dict(pool.slot_of)
    hopper_ws.launch(*cases[0][1], o, lse, causal=True, config="h5")  # its maps are in place
    assert pool.slot_of == slots and pool.next == (5 * 3) % 4


def test_a_launch_never_rewrites_a_slot_it_reads(monkeypatch):
    """The slot ring's eviction (kernels/hw/tma_maps.py) skips the slots a launch has
    already been given: with four slots full and the next one to rewrite holding the map
    a launch just found there, its next new map goes to another slot."""
    from numba_softmax.kernels.hw import tma_maps

    monkeypatch.setattr(tma_maps, "SLOTS", 4)
    pool = tma_maps._Pool()
    arrays = [cuda.to_device(np.zeros((1, 1, 64, 64), F16)) for _ in range(5)]
    stream = cuda.default_stream()
    first = [pool.slot(("a", i), arrays[i], 64, stream) for i in range(4)]  # full; next: 0
    assert first == [0, 1, 2, 3] and pool.next == 0
    taken = [pool.slot(("a", 0), arrays[0], 64, stream)]  # found in slot 0
    taken.append(pool.slot(("a", 4), arrays[4], 64, stream, taken))
    assert taken == [0, 1] and pool.slot_of[("a", 0)] == 0 and ("a", 1) not in pool.slot_of
