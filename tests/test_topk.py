"""Fused softmax + top-k: every layout (warp per row, block per row, split), dtypes,
strides, ties, rows without softmax, temperature, log; the public ``softmax_topk``.

On the simulator the shapes are tiny (a warp vote costs milliseconds there) but cross
every path: two warps per block, an idle warp past the last row, two warps' lists merged,
several pieces of a row merged, ragged ends; the split by radix select with ties decided
in the index's bytes (all-equal rows, ±0), pieces shorter than k, one piece.  On a GPU
the same tests run bigger.
"""

import numba
import numpy as np
import pytest
from numba import cuda

from numba_softmax.runtime import launcher
from numba_softmax.kernels.topk import topk as K
from numba_softmax.kernels.topk.topk_list import BUFFER, WARP
from numba_softmax.reference import topk as RT
from numba_softmax.topk import softmax_topk

from _helpers import SIMULATOR, device_kinds, sized, to_host

RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-5, "float64": 1e-12}


def as_stored(x, dtype):
    """(device-ready array, its values as float64): bfloat16 as uint16 bits."""
    if dtype == "bfloat16":
        bits = (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    stored = np.asarray(x).astype(dtype)
    return stored, stored.astype(np.float64)


def as_float(values, dtype):
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


def run(x, k, dtype="float32", plan=None, strided=False, **kw):
    """Launch on ``x`` (poisoned outputs) and check against the float64 reference."""
    stored, exact = as_stored(x, dtype)
    if strided:  # every other column of a wider array: no vector loads
        wide = np.zeros((stored.shape[0], 2 * stored.shape[1]), stored.dtype)
        wide[:, ::2] = stored
        x_dev = cuda.to_device(wide)[:, ::2]
    else:
        x_dev = cuda.to_device(stored)
    out_dtype = np.uint16 if dtype == "bfloat16" else dtype
    values = cuda.to_device(np.full((x.shape[0], k), 0x7FC0 if dtype == "bfloat16" else np.nan, out_dtype))
    indices = cuda.to_device(np.full((x.shape[0], k), -7, np.int64))
    K.launch(x_dev, k, values, indices, plan=plan, **kw)
    check(exact, k, as_float(values.copy_to_host(), dtype), indices.copy_to_host(), dtype, **kw)


def check(exact, k, v, i, dtype, temperature=1.0, log=False):
    v_ref, i_ref = RT.softmax_topk(exact, k, temperature=temperature, log=log)
    rtol = RTOL[dtype]
    np.testing.assert_allclose(v, v_ref, rtol=rtol, atol=rtol if log else 1e-30, equal_nan=True)
    if temperature == 1.0:  # u = x exactly: the same order, ties to the lower index
        np.testing.assert_array_equal(i, i_ref)
    else:  # x / T rounds: near-ties may swap; each index must carry its own value
        p_ref = RT.softmax_topk(exact, exact.shape[1], temperature=temperature, log=log)
        full = np.full(exact.shape, np.nan)
        np.put_along_axis(full, p_ref[1], p_ref[0], -1)
        np.testing.assert_allclose(np.take_along_axis(full, i, -1), v, rtol=rtol, atol=rtol if log else 0,
                                   equal_nan=True)
    for row in i:
        assert len(set(row.tolist())) == k  # no index twice


def special_rows(V, rng):
    """Random, ties (few distinct values), −inf entries, NaN, all −inf, +inf."""
    x = rng.standard_normal((6, V))
    x[1] = rng.integers(-2, 2, V)
    x[2, ::3] = -np.inf
    x[3, V // 2] = np.nan
    x[4] = -np.inf
    x[5, V - 1] = np.inf
    return x


def test_warp_per_row_special_rows_and_an_idle_warp():
    rng = np.random.default_rng(1)
    V = sized(9, 1000)
    x = np.concatenate([special_rows(V, rng), rng.standard_normal((sized(1, 500), V))])
    run(x, 5, plan=K.Plan(True, 64, 4))  # 7 rows, 2 per block: the last warp has none


def test_block_per_row_merges_warp_lists_k64_log_temperature():
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, (sized(1, 64), sized(72, 5000))).astype(np.float64)
    x[0, ::7] = -np.inf
    run(x, 64, plan=K.Plan(False, 64, 4), log=True, temperature=0.7)


@pytest.mark.parametrize("ties", [False, True])
def test_block_per_row_shared_floor(ties, four_warp_blocks):
    """Three warps stream each row (a block shares a floor only with more than two), their
    lists fill in the first chunk and every later chunk is gated by the block's floor (the
    largest warp θ): values at the floor with a lower index, and values between a warp's
    own θ and the floor, must still be right; candidates reach the lists through the
    buffer, 32 at a time by the bitonic merge.  Two warps (no floor) as well."""
    rng = np.random.default_rng(9)
    shape = (2, sized(1100, 40_000))
    x = rng.integers(-3, 4, shape).astype(np.float32) if ties else rng.standard_normal(shape)
    for k in (3, 40, 70):  # lists of 1, 2 and 4 entries a lane
        run(x, k, plan=K.Plan(False, 96, 4))
    run(x, 40, plan=K.Plan(False, 64, 4))


@pytest.mark.parametrize("dtype", sized(["float32"],  # (16-bit chunks and float64 at GPU
                                         ["float32", "bfloat16", "float64"]))  # sizes: CI's time)
def test_lagging_reference_its_rescale_and_special_chunks(dtype):
    """ℓ is summed against the m of a thread's chunks before, m moving only when a
    chunk's max passes it by more than LAG (16): chunks that raise the max within the lag,
    past it (by 105: e¹⁰⁵ is past float32's range, so a lag that let it through fails),
    all −inf, far below, huge (exp past the float range: discarded), and a NaN or +inf
    arriving in a later chunk; rows of magnitude 10⁴, and ties at the largest float32
    (the GPU's fuzz found them lost to exp2(u·log2e − m·log2e) as one FMA) — each against
    the float64 reference."""
    rng = np.random.default_rng(17)
    plan = K.Plan(True, WARP, 4)  # a warp a row: float32 chunks of 128 columns, 4 a thread
    shifts = [0.0, 8.0, 30.0, -np.inf, 45.0, 150.0, -100.0, 9.0e3, 40.0]  # chunk by chunk
    c = WARP * 4  # a float32 chunk's columns (bfloat16's hold 8 a thread: two blocks a chunk)
    x = np.concatenate([rng.standard_normal((5, c)) + s for s in shifts], axis=1)
    x[0, 7 * c : 8 * c] = 0.0  # row 0 without the huge chunk: its ℓ is checked
    x[1, 4 * c + 5] = np.nan  # a NaN in a lagged chunk
    x[2, 3 * c + 9] = np.inf  # +inf where the rest of the chunk is −inf
    x[3, :c] = -np.inf  # m stays −inf through the first chunk
    big = rng.standard_normal((2, x.shape[1])) * 1.0e4  # m·log2e would round by 1e-3
    big[1, ::37] = 3.4e38  # ties at the largest float32 (whose ·log2e is inf)
    x = np.concatenate([x, big])
    run(x, 5, dtype, plan=plan)
    run(x, 40, dtype, plan=K.Plan(False, 2 * WARP, 4), log=True)
    run(x[:5], 5, dtype, plan=plan, temperature=0.5)  # the stream that multiplies by 1/T


def test_rows_of_large_values_and_nans():
    """float16 rows of ±3000 with every other value NaN give NaN values (torch's
    convention for a row holding NaN) and no error.  The simulator's max lets a NaN hide a
    chunk's largest value, and exp(u − m_c) then passed Python's range: a raised lane,
    whose warp waited for it forever, hung a fuzz case in CI."""
    for seed in (2, 5):  # (rows the old exp raised on)
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal(68) * 1000).astype(np.float16)
        x[rng.random(68) < 0.5] = np.nan
        v, i = softmax_topk(cuda.to_device(x), 3)
        assert np.isnan(to_host(v).astype(np.float64)).all()
        assert list(to_host(i)) == [0, 1, 2]


def test_fit_cuts_threads_to_whole_warps(monkeypatch):
    """Threads a compiled kernel cannot launch are cut to whole warps (the lists vote by
    warps): a plan of 96 where 64 fit gives 64 (half, rounded up to whole warps), not 48
    or 32; where only 32 fit, 32."""
    for fits, want in ((64, 64), (63, 32), (32, 32)):
        monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: fits)
        assert K.fit(lambda t: t, 96, ()) == (want, want)


def test_a_chunk_with_more_candidates_than_the_warps_buffer():
    """An ascending row: once the first chunk has seeded the list, every value of each
    later chunk beats θ — 32 lanes × 8 values, more than a warp's buffer holds — so they
    go to the list in order of i, merged whenever 32 are waiting (the overflow path)."""
    V = 4 * WARP * 8  # four chunks of one warp × 8 values
    assert WARP * 8 > BUFFER
    x = (np.arange(V, dtype=np.float64) / V)[None, :]  # (exact in float32)
    for k in (40, 100):  # lists of 2 and 4 entries a lane
        run(x, k, plan=K.Plan(False, WARP, 8))


def test_candidates_at_every_place_of_a_lane():
    """Each lane marks a chunk's candidates as bits of i; a list of one entry a lane (k 5,
    20) inserts them lane by lane, lowest i first, and lists of two (k 40, 50) write them
    to the warp's buffer — each u[i] picked by a tree of selects.  Chunks of 16 values a
    thread (the B 1024 layout) where lanes hold candidates at i = 0, at 15, at several
    places at once, and values tied with θ on both sides of it in index order — against
    the reference."""
    rng = np.random.default_rng(23)
    vpt, width = 16, 4  # float32: four 16-byte vectors a thread
    c = WARP * vpt
    x = np.full((2, 4 * c), -6.0)
    x[:, :c] = rng.standard_normal((2, c))  # the first chunk seeds the lists

    def col(chunk, lane, i):  # topk_stream's index(): vectors of width, threads interleaved
        return chunk * c + (lane + (i // width) * WARP) * width + i % width

    places = {3: (0, 15), 7: (5, 6, 7), 12: range(16), 31: (15,), 0: (1, 2, 14)}
    for chunk in (1, 2, 3):
        for lane, ii in places.items():
            for i in ii:
                x[0, col(chunk, (lane + 5 * chunk) % WARP, i)] = 3.0 + rng.random()
                x[1, col(chunk, (lane + 5 * chunk) % WARP, i)] = rng.integers(1, 4)  # ties
    for k in (5, 20, 40, 50):
        run(x, k, plan=K.Plan(False, WARP, vpt))


@pytest.mark.parametrize("fused", [False, True], ids=["kernel_2", "last_piece"])
def test_split_row_pieces_merged(fused):
    """Kernel 2 merging the lists' pieces, or (fused) the last piece of each row to finish."""
    rng = np.random.default_rng(3)
    x = rng.integers(-20, 20, (2, sized(100, 200_000))).astype(np.float32)  # ties across pieces
    x[1, -1] = np.nan  # in the last piece
    for log in (False, True):  # 3 pieces: one list unpaired
        run(x, 5, plan=K.Plan(False, sized(32, 256), 4, sized(3, 40), fused=fused), log=log)


# --- the split path by radix select (kernels/topk/topk_select.py) --------------------------------
def radix_rows(V, rng):
    """Special rows, plus all-equal (the k lowest indices), ±0, and ties at every rank."""
    x = np.concatenate([special_rows(V, rng), np.zeros((3, V))])
    x[6] = 1.5  # all equal: every key shares its value bytes, the index bytes decide
    x[7, ::2] = -0.0  # −0 and +0 are equal values
    x[7, 5::7] = rng.integers(-2, 3, len(x[7, 5::7]))
    x[8] = rng.integers(0, 3, V) * 0.25
    return x


@pytest.mark.parametrize("k, threads, splits, fused", [(1, 32, 3, False), (7, 64, 4, True),
                                                       (40, 32, 6, False), (40, 32, 6, True),
                                                       (19, 64, 1, False)])
def test_radix_split_special_rows_and_ties(k, threads, splits, fused):
    """Kernel 2 merging the pieces, or (fused) the last piece of each row to finish."""
    rng = np.random.default_rng(k)
    V = sized(211, 20_000)  # ragged: the last piece is short (and some pieces < k)
    run(radix_rows(V, rng), k, plan=K.Plan(False, threads, 4, sized(splits, 40), True, fused=fused))


@pytest.mark.parametrize("cap, heads, fused", [(None, None, False), (4, None, False),
                                               (None, 4, False), (None, None, True), (4, None, True)])
def test_radix_merge_by_bound_and_by_radix(cap, heads, fused, monkeypatch):
    """Kernel 2 (kernels/topk/topk_merge.py): the candidates that the bound keeps, ranked by
    counting — and with room for only 4 of them, or for only 4 heads (S·⌈k/S⌉ = 12 here),
    the radix select of all S·k entries.
    Rows: random; one whose best values crowd into its first piece (most candidates); one
    of few distinct values (ties across pieces); and one whose k best are exactly the
    lists' heads (piece s holds ranks s, s + S, …: the bound is the k-th best itself)."""
    from numba_softmax.kernels.topk import topk_merge

    if cap is not None:
        monkeypatch.setattr(topk_merge, "CAP", cap)
    if heads is not None:
        monkeypatch.setattr(topk_merge, "HEADS", heads)
    rng = np.random.default_rng(11)
    S = sized(4, 40)
    V = S * sized(52, 500)  # pieces of V/S whatever the vector width
    x = rng.standard_normal((4, V))
    x[1, : V // 5] += 10
    x[2] = rng.integers(0, 4, V)
    piece, e = np.divmod(np.arange(V), V // S)
    x[3] = -(e * S + piece) / V
    run(x, 9, plan=K.Plan(False, 32, 4, S, True, fused=fused))


def test_a_plan_of_part_of_a_warp_is_refused():
    """Votes and shuffles take whole warps: on a GPU a block of 48 threads would hang or
    read garbage (the simulator's warp would not notice), so the plan is a ValueError."""
    with pytest.raises(ValueError, match="multiple of 32"):
        run(np.zeros((1, 500)), 5, plan=K.Plan(False, 48, 4, 3, True))


def dtype_rows(V, seed):
    """Three rows for the dtype tests: random, rounded (ties), a fifth of them −inf."""
    x = np.random.default_rng(seed).standard_normal((3, V)) * 3
    x[1] = np.round(x[1])  # ties
    x[2, ::5] = -np.inf
    return x


def run_dtype(x, dtype, plan):
    """k = 12 log-probabilities of ``x`` in ``dtype``, temperature 0.8 (1 for float64)."""
    run(x, 12, dtype=dtype, plan=plan, log=True, temperature=1.0 if dtype == "float64" else 0.8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_radix_split_dtypes_log_temperature(dtype):
    run_dtype(dtype_rows(sized(260, 70_000), 8), dtype,
              K.Plan(False, sized(32, 256), 8, sized(3, 30), True))


def test_radix_split_strided_and_k_equal_to_v():
    rng = np.random.default_rng(9)
    x = rng.integers(-2, 2, (2, 70)).astype(np.float64)
    run(x, 70, strided=True, plan=K.Plan(False, 32, 1, 2, True))  # W = 1, every entry kept


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("plan", [K.Plan(True, 32, 4), K.Plan(False, 32, 4), K.Plan(False, 32, 4, 2),
                                  K.Plan(False, 32, 1, 2, True), K.Plan(False, 32, 4, 2, filter=True)],
                         ids=["warp-rows", "block-rows", "lists-split", "radix-split", "filter"])
def test_strided_16_bit_rows_every_layout(dtype, plan):
    """A strided view (W 1) holds one stored value a slot and pads its row's end with
    −inf as stored — float16's converted on the device: a float16 constant in a kernel
    is IR that NVVM rejects, and every strided float16 top-k failed to compile on a GPU
    (the simulator compiles nothing)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((sized(2, 6), sized(70, 50_001))) * 3
    x[0, :5] = -np.inf
    run(x, sized(9, 64), dtype=dtype, strided=True, plan=plan)


def test_choose_takes_the_radix_split_for_few_long_rows():
    limits = launcher.Limits("H100", sms=132, max_threads=1024, shared_optin=227 * 1024,
                             shared_per_sm=228 * 1024, l2_bytes=50 << 20)
    for k in (8, 50, 128):
        p = K.choose(1, 128256, k, np.dtype(np.float32), 4, limits, True)
        assert p == K.Plan(False, K.WAVE_THREADS, 4, 63, True)  # a multiprocessor a piece
        assert p.splits * k <= K.RADIX_MERGE_THREADS * K.RADIX_MERGE_PER_THREAD
        p = K.choose(1, 128256, k, np.dtype(np.uint16), 8, limits, True)  # bfloat16 (W 8)
        assert p == K.Plan(False, K.WAVE_THREADS // 2, 8, 63, True)  # an 8-wide vector a thread
    assert K.choose(4, 128256, 50, np.dtype(np.float32), 4, limits, True) == \
        K.Plan(False, 512, 8, 32, True)  # 4 · 63 pieces of 2048 would be past the SMs
    assert not K.choose(1, 128256, 50, np.dtype(np.float32), 4, limits).radix  # the sampler's
    for k in (8, 50):  # half a row per multiprocessor: the lists, each row in 2 pieces of 512 …
        for n in (128256, 32000):  # (32000: 1.95 chunks of the block a piece)
            assert K.choose(64, n, k, np.dtype(np.float32), 4, limits, True) == K.Plan(False, 512, 16, 2,
                                                                                        fused=True)
        # (the last piece of a row merging it) … but not pieces of 1.9 chunks of the block
        assert K.choose(64, 31000, k, np.dtype(np.float32), 4, limits, True) == K.Plan(False, 512, 16, 1)
        assert K.choose(100, 32000, k, np.dtype(np.float32), 4, limits, True).splits == 1  # ≥ SMs/2 rows
    assert not K.choose(1, 2**24, 128, np.dtype(np.float32), 4, limits, True).radix  # S·k too many
    assert K.choose(16, 128256, 50, np.dtype(np.float32), 4, limits, True) == K.Plan(False, 256, 16, 32, True)
    # (not fused: 16 · 32 pieces are more than the multiprocessors, whose registers the merge would take)
    assert not K.choose(32, 128256, 50, np.dtype(np.float32), 4, limits, True).radix  # past two waves
    for rows, splits in ((48, 2), (45, 2), (44, 3), (34, 3), (66, 2), (67, 1)):  # one wave
        p = K.choose(rows, 128256, 50, np.dtype(np.float32), 4, limits, True)
        assert p.splits == splits and rows * p.splits <= limits.sms, (rows, p)
    rng = np.random.default_rng(10)
    run(rng.standard_normal((1, sized(2100, 128256))), 5)  # the default plan: radix split


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("plan, V", [(K.Plan(True, 32, 16), 2296), (K.Plan(False, 64, 16), 3496),
                                     (K.Plan(False, 32, 16, 2), 2696), (K.Plan(True, 32, 16), 1024)],
                         ids=["warp-rows-5", "block-rows-4", "lists-split-3", "warp-rows-2"])
def test_16_bit_rows_of_several_chunks(dtype, plan, V):
    """Rows of two to five chunks of 16-bit values held in pairs (an odd count, a ragged
    last one), the best values in the last chunk, in the second, spread: a chunk read
    from the wrong load buffer, or twice, changes the values or ℓ (it caught exactly that
    in an experiment with two buffers).  Row lengths a multiple of 8: 16-byte rows, the
    vector loads that hold pairs."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, V))
    x[1] += np.linspace(0, 4, V)  # the best in the last chunk
    x[2, 512:1024] += 3  # the best in a warp row's second chunk
    run(x, 9, dtype=dtype, plan=plan)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, sized(40, 3000))) * 3
    run(x, 5, dtype=dtype, plan=K.Plan(True, 32, 8 if dtype == "float64" else 16))


def test_strided_input_and_k_equal_to_v():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7))
    run(x, 7, strided=True, plan=K.Plan(True, 32, 4))


@pytest.mark.parametrize("V, k", [(1, 1), (760, 5), (1128, 64)] if not SIMULATOR else [(1, 1), (760, 5)])
def test_default_layouts(V, k):
    rng = np.random.default_rng(V)
    run(rng.standard_normal((sized(1, 300), V)), k)


@pytest.mark.skipif(SIMULATOR, reason="big shapes: GPU only")
@pytest.mark.parametrize("rows, V, k", [(1, 128256, 50), (64, 32000, 8), (1000, 4099, 128), (3, 262144, 64)])
def test_gpu_shapes_every_layout(rows, V, k):
    rng = np.random.default_rng(rows)
    for dtype in ("float32", "bfloat16"):
        run(rng.standard_normal((rows, V)) * 4, k, dtype=dtype)


def test_kernel_refuses_k_outside_1_to_v():
    x = cuda.to_device(np.zeros((1, 4), np.float32))
    out = cuda.device_array((1, 5), np.float32), cuda.device_array((1, 5), np.int64)
    with pytest.raises(ValueError, match="k must be in 1"):
        K.launch(x, 5, *out)
    with pytest.raises(ValueError, match="k must be in 1"):
        K.launch(x, 0, *out)


# --- the public function -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy"] + device_kinds())
def test_public_any_axis_and_kind(kind):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 11, 2)).astype(np.float32)
    before = x.copy()
    arg = x if kind == "numpy" else _device(x, kind)
    v, i = softmax_topk(arg, 4, axis=1, temperature=2.0)
    assert type(v) is type(arg) or kind == "numba"
    v, i = to_host(v), to_host(i)
    assert v.shape == i.shape == (1, 4, 2) and i.dtype == np.int64 and v.dtype == np.float32
    v_ref, i_ref = RT.softmax_topk(np.moveaxis(x, 1, -1).astype(np.float64), 4, temperature=2.0)
    np.testing.assert_allclose(v, np.moveaxis(v_ref, -1, 1), rtol=2e-5)
    np.testing.assert_array_equal(i, np.moveaxis(i_ref, -1, 1))
    np.testing.assert_array_equal(x, before)  # the input is not modified


@pytest.mark.skipif("torch" not in device_kinds(), reason="PyTorch on a GPU: its bfloat16 tensors")
@pytest.mark.parametrize("rows, V", [(200, 3000), (2, 100_000)], ids=["block-rows", "radix-split"])
def test_public_torch_bfloat16_strided_views(rows, V):
    """bfloat16 through the public function: a PyTorch tensor read through a stepped view
    (every other column: no vector loads), its values and indices against the reference
    on the exact bfloat16 values, the result bfloat16 on the same device."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(V)
    base = (torch.randn(rows, 2 * V, device="cuda", generator=g) * 3).to(torch.bfloat16)
    x = base[:, ::2]
    v, i = softmax_topk(x, 40)
    assert v.dtype == torch.bfloat16 and i.dtype == torch.int64 and v.shape == i.shape == (rows, 40)
    exact = x.double().cpu().numpy()
    v_ref, i_ref = RT.softmax_topk(exact, 40)
    np.testing.assert_allclose(v.double().cpu().numpy(), v_ref, rtol=RTOL["bfloat16"])
    np.testing.assert_array_equal(i.cpu().numpy(), i_ref)  # ties (bfloat16 has many): the lower index


def _device(x, kind):
    if kind == "torch":
        import torch

        return torch.from_numpy(x).cuda()
    if kind == "cupy":
        import cupy

        return cupy.asarray(x)
    return cuda.to_device(x)


def test_public_no_rows():
    v, i = softmax_topk(np.zeros((0, 3, 5), np.float32), 2, axis=-1)
    assert v.shape == i.shape == (0, 3, 2) and i.dtype == np.int64


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(k=0), ValueError, "k must be in 1 … 6"),
    (dict(k=7), ValueError, "k must be in 1 … 6"),
    (dict(k=2.0), TypeError, "k must be an integer"),
    (dict(k=True), TypeError, "k must be an integer"),
    (dict(k=2, temperature=0.0), ValueError, "temperature"),
    (dict(k=2, temperature=float("nan")), ValueError, "temperature"),
    (dict(k=2, temperature="1"), TypeError, "temperature"),
    (dict(k=2, log=1), TypeError, "log"),
    (dict(k=2, axis=2), ValueError, "axis"),
])
def test_public_errors_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        softmax_topk(np.zeros((2, 6), np.float32), **kwargs)


def test_ballot_is_an_unsigned_word_with_lane_31():
    """numba's ballot_sync is a signed int32: lane 31's vote made it negative, and the
    top-k candidate loop (``mask &= mask - 1`` in int64) then found 32 phantom lanes —
    duplicates in every list where lane 31 held a candidate (seen on an H100)."""
    from numba_softmax.kernels.hw import jit
    from numba_softmax.kernels.hw.warp import ballot

    @jit.kernel
    def votes(out):
        lane = cuda.threadIdx.x
        mask = ballot(lane == 31 or lane == 0)
        everyone = ballot(lane >= 0)  # every lane votes (outside any branch)
        n = 0
        while mask != 0:  # the candidate loop's pattern
            mask &= mask - 1
            n += 1
        if lane == 0:
            out[0] = n
            out[1] = numba.int64(everyone)

    out = cuda.to_device(np.zeros(2, np.int64))
    votes[1, 32](out)
    got = out.copy_to_host()
    assert got[0] == 2 and got[1] == 0xFFFFFFFF
