"""Split-KV decoding on tensor cores (:mod:`numba_softmax.kernels.decode.decode_tc`) against the
float64 references, beside the CUDA-core decode kernel on the same problems: GQA groups
and MQA, speculative rows, causal and windows, splits and exact chunks, rows that see no
key, a negative scale, dense and paged caches; which kernel the dispatch picks; every
launch configuration (GPU)."""

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.kernels.decode import decode_launch as KD
from numba_softmax.runtime import launcher
from numba_softmax.kernels.decode import decode_tc as TC
from numba_softmax.kernels.decode import decode_tc_tiles as TT
from numba_softmax.kernels.decode import paged as KP
from numba_softmax.kernels.attention import visible as vis

from _attention_data import BF16, F16, F32, check, fresh, paged_cache, poisoned, random, values
from _helpers import SIMULATOR, sized

SMALL = dict(small=SIMULATOR)
TENSOR, CUDA_CORES = {}, False  # the ``tiles`` argument: force one kernel or the other


def decode(q, k, v, tiles, **kw):
    b, h, sq, _ = q.shape
    o, lse = poisoned((b, h, sq, v.shape[-1]), q.dtype), poisoned((b, h, sq), F32)
    KD.launch(*(cuda.to_device(x) for x in (q, k, v)), o, lse, tiles=tiles, **SMALL, **kw)
    return o.copy_to_host(), lse.copy_to_host()


def reference(q, k, v, **kw):
    return R.attention(values(q), values(k), values(v), return_lse=True, **kw)


# (Hq, Hkv, Sq, Sk, D, Dv, causal, window, split options, dtype)
CASES = [
    (8, 2, 1, (37, 4099), 16, 16, False, (-1, -1), {}, F16),                # GQA 4, chosen splits
    (4, 1, 3, (50, 3001), 8, 24, True, (-1, -1), dict(num_splits=3), BF16),  # MQA, speculative
    (2, 2, 2, (41, 2000), 16, 8, True, (6, 0), dict(kv_chunk=16), F16),      # window, exact chunks
    (32, 8, 1, (20, 1031), 16, 16, False, (3, 2), {}, BF16),                 # both-sided window
    (4, 2, 5, (3, 4), 16, 16, True, (-1, -1), {}, F16),                      # rows that see no key
    # GPU: 48 KB of staging + the fold's static shared memory: the launch must opt in
    (4, 2, 1, (1, 1), 40, 24, False, (-1, -1), dict(num_splits=2), F16),
]


@pytest.mark.parametrize("tiles", [TENSOR, CUDA_CORES], ids=["tensor", "cuda_cores"])
@pytest.mark.parametrize("hq, hkv, sq, sk, d, dv, causal, window, split, dtype", CASES)
def test_decode_matches_reference(hq, hkv, sq, sk, d, dv, causal, window, split, dtype, tiles):
    rng, seed = fresh()
    sk = sized(*sk)
    d, dv = (d, dv) if SIMULATOR else (8 * d, 8 * dv) if max(d, dv) <= 16 else (d, dv)
    q = random(rng, (sized(1, 3), hq, sq, d), dtype, spread=1.5)
    k, v = random(rng, (q.shape[0], hkv, sk, d), dtype), random(rng, (q.shape[0], hkv, sk, dv), dtype)
    o, lse = decode(q, k, v, tiles, causal=causal, window=window, **split)
    check(o, lse, *reference(q, k, v, causal=causal, window=window), dtype,
          f"seed {seed}, tiles {tiles}")


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_negative_scale(dtype):
    rng, seed = fresh()
    q = random(rng, (1, 4, 1, 16), dtype, spread=1.5)
    k, v = random(rng, (1, 2, sized(33, 999), 16), dtype), random(rng, (1, 2, sized(33, 999), 16), dtype)
    o, lse = decode(q, k, v, TENSOR, scale=-0.3, num_splits=2)
    check(o, lse, *reference(q, k, v, scale=-0.3), dtype, f"seed {seed}")


@pytest.mark.parametrize("tiles", [TENSOR, CUDA_CORES] + ([] if SIMULATOR else [dict(block_k=64)]),
                         ids=["tensor", "cuda_cores"] + ([] if SIMULATOR else ["tensor_bk64"]))
def test_paged_decode(tiles):
    """A shuffled block table with a shared prefix, block size 5 (not a power of two), 4
    and 16 (a tile of keys inside one page: one table read), an empty sequence,
    speculative causal rows.  (Block_k 64: two table entries a lane.)"""
    rng, seed = fresh()
    for bs, lengths, sq in ((5, [11, 0, 23], 2), (4, [17, 9], 1), (16, [37, 16], 1)):
        if not SIMULATOR:  # (16 → 256: whole tiles inside one page)
            bs, lengths = bs * 16, [n * 97 + 1 for n in lengths]
        k_cache, v_cache, table, lengths = paged_cache(rng, lengths, bs, 2, 16, 16, F16, 1)
        q = random(rng, (len(lengths), 8, sq, 16), F16, spread=1.5)
        o, lse = poisoned(q.shape, F16), poisoned(q.shape[:3], F32)
        KP.launch(*(cuda.to_device(x) for x in (q, k_cache, v_cache, table, lengths)), o, lse,
                  causal=True, tiles=tiles, **SMALL)
        ref = R.paged_attention(values(q), values(k_cache), values(v_cache), table, lengths,
                                causal=True, return_lse=True)
        check(o.copy_to_host(), lse.copy_to_host(), *ref, F16, f"seed {seed}, block size {bs}")


@pytest.mark.parametrize("tiles", [TENSOR, CUDA_CORES], ids=["tensor", "cuda_cores"])
def test_many_splits_of_sixteen_rows(tiles):
    """16 packed rows (GQA 4 × Sq 4, causal: early splits see keys the late rows do not)
    over 40 splits on a GPU (9 in the simulator): the last block folds them in batches
    of partials (``fold_splits``)."""
    rng, seed = fresh()
    splits, d = (9, 16) if SIMULATOR else (40, 128)
    q = random(rng, (1, 8, 4, d), F16, spread=1.5)  # GQA 4 × Sq 4 = 16 rows a K/V head
    k, v = (random(rng, (1, 2, splits * 16 + 5, d), F16) for _ in range(2))
    o, lse = decode(q, k, v, tiles, causal=True, num_splits=splits)
    check(o, lse, *reference(q, k, v, causal=True), F16, f"seed {seed}, tiles {tiles}")


@pytest.mark.parametrize("tiles", [TENSOR, CUDA_CORES], ids=["tensor", "cuda_cores"])
def test_more_splits_than_lanes(tiles):
    """34 and 64 splits (MAX_SPLITS): the merge's warp per row holds splits z and z + 32
    in lane z; causal with Sq 2, so the last split's keys are not all seen by both rows.
    The simulator runs the CUDA-core kernel at 34 splits only."""
    if SIMULATOR and tiles is TENSOR:
        pytest.skip("the simulator runs the same merge through the CUDA-core kernel")
    rng, seed = fresh()
    d = 8 if SIMULATOR else 64
    for splits in (34,) if SIMULATOR else (34, 64):
        q = random(rng, (1, 1, 2, d), F16, spread=1.5)  # one head, Sq 2
        k, v = (random(rng, (1, 1, splits * 16 - 3, d), F16) for _ in range(2))
        o, lse = decode(q, k, v, tiles, causal=True, num_splits=splits)
        check(o, lse, *reference(q, k, v, causal=True), F16,
              f"seed {seed}, tiles {tiles}, {splits} splits")


def test_paged_decode_many_tiles_a_warp():
    """One split and pages of 16 (every tile inside a page): each warp holds the table
    entries of 32 of its tiles and loads the next 32 a batch ahead — here over 64 tiles a
    warp, so the batches turn over twice; a shuffled table, a tail tile cut short."""
    rng, seed = fresh()
    warps = 2 if SIMULATOR else 8  # (the simulator's tiles: 2 warps of 16 keys)
    length = warps * 16 * 66 + 5
    k_cache, v_cache, table, lengths = paged_cache(rng, [length], 16, 1, 16, 16, F16)
    q = random(rng, (1, 2, 1, 16), F16, spread=1.5)
    o, lse = poisoned(q.shape, F16), poisoned(q.shape[:3], F32)
    KP.launch(*(cuda.to_device(x) for x in (q, k_cache, v_cache, table, lengths)), o, lse,
              num_splits=1, tiles=dict(warps=warps, block_k=16, stages=3), **SMALL)
    ref = R.paged_attention(values(q), values(k_cache), values(v_cache), table, lengths,
                            return_lse=True)
    check(o.copy_to_host(), lse.copy_to_host(), *ref, F16, f"seed {seed}")


@pytest.mark.parametrize("chunk", [32, 24], ids=["pages", "rows"])
def test_paged_decode_in_chunks(chunk):
    """Splits of exactly ``kv_chunk`` keys over pages of 16: a multiple of the 16-key tile
    (layout "pages": every split's tiles inside one page) or not ("rows": tiles across
    pages, the table entries read again where the split's first key moved); sequences of
    73 and 9 keys, so the short one's later splits are empty and their table entries
    (read before the length is known) are the table's unused −1s."""
    assert KD.layout(True, 16, 16, vis.UNBOUNDED, chunk) == ("pages" if chunk == 32 else "rows")
    rng, seed = fresh()
    k_cache, v_cache, table, lengths = paged_cache(rng, [73, 9], 16, 2, 16, 16, F16, 1)
    q = random(rng, (2, 8, 1, 16), F16, spread=1.5)
    o, lse = poisoned(q.shape, F16), poisoned(q.shape[:3], F32)
    KD.run(*(cuda.to_device(x) for x in (q, k_cache, v_cache)), o, lse, paged=True,
           table=cuda.to_device(table), seqlens=cuda.to_device(lengths), kv_chunk=chunk,
           causal=True, **SMALL)
    ref = R.paged_attention(values(q), values(k_cache), values(v_cache), table, lengths,
                            causal=True, return_lse=True)
    check(o.copy_to_host(), lse.copy_to_host(), *ref, F16, f"seed {seed}, chunks of {chunk}")


def test_dispatch():
    """Tensor cores for float16 / bfloat16 with D, Dv multiples of 8 up to 128, aligned
    rows and a usable scale; the CUDA-core kernel for the rest."""
    def arr(shape, dtype=F16):
        return cuda.to_device(np.zeros(shape, dtype))

    q, kv = arr((1, 4, 1, 64)), arr((1, 2, 9, 64))
    assert KD.tensor_cores(q, kv, kv, 0.125)
    assert KD.tensor_cores(arr((1, 4, 1, 128), BF16), arr((1, 2, 9, 128), BF16),
                           arr((1, 2, 9, 128), BF16), 0.1)
    assert not KD.tensor_cores(arr((1, 4, 1, 64), F32), arr((1, 2, 9, 64), F32),
                               arr((1, 2, 9, 64), F32), 0.125)  # float32: CUDA cores, exact
    assert not KD.tensor_cores(arr((1, 4, 1, 12)), arr((1, 2, 9, 12)), arr((1, 2, 9, 12)), 0.3)
    assert not KD.tensor_cores(arr((1, 4, 1, 136)), arr((1, 2, 9, 136)), arr((1, 2, 9, 136)), 0.1)
    assert not KD.tensor_cores(q, kv, kv, 0.0)  # the tensor-core masks need scale ≠ 0
    strided = arr((1, 2, 9, 128))[:, :, :, ::2]  # 64 values 4 bytes apart: no 16-byte copies
    assert not KD.tensor_cores(q, strided, strided, 0.125)


def test_tiles_are_checked():
    with pytest.raises(ValueError, match="block_k"):
        TT.Tiles(64, 64, block_k=24)
    with pytest.raises(ValueError, match="stages"):
        TT.Tiles(64, 64, stages=1)
    t = TT.Tiles(128, 128, warps=4, block_k=32, stages=2)
    assert t.shared == 4 * 2 * 32 * (128 + 128 + 16) * 2


def test_layout_follows_the_pages_and_the_splits():
    """A paged kernel copies whole tiles from one block ("pages") only where every tile
    lies inside one: blocks of 2^s ≥ Bc positions, and tiles starting on multiples of Bc —
    a left window bound moves the first key, and splits of kv_chunk keys move the others."""
    U = vis.UNBOUNDED
    assert KD.layout(False, 16, 16, U, None) == "dense"
    assert KD.layout(True, 16, 16, U, None) == KD.layout(True, 256, 16, U, 32) == "pages"
    assert KD.layout(True, 8, 16, U, None) == "rows"  # a tile spans two blocks
    assert KD.layout(True, 48, 16, U, None) == "rows"  # not a power of two
    assert KD.layout(True, 16, 16, 100, None) == "rows"  # a window's first key
    assert KD.layout(True, 256, 16, U, 24) == "rows"  # splits not on tile edges
    with pytest.raises(ValueError, match="layout"):
        TC.kernel(np.float16, 64, 64, 4, 2, 16, 2, True)


def test_default_tiles_follow_the_grid():
    """B·Hkv blocks that fill half the device or more: one block of 8 warps × 16 keys ×
    3 stages a multiprocessor; fewer (a batch of one, split many ways): 8 warps × 16 × 2.
    Both are launchable configurations within the shared memory of one multiprocessor,
    with tiles of 16 keys (inside any page of 16 or more)."""
    many, few = KD.tiles_for(66, 132), KD.tiles_for(8, 132)
    assert many == dict(warps=8, block_k=16, stages=3)
    assert few == dict(warps=8, block_k=16, stages=2)
    assert KD.tiles_for(65, 132) == few
    for tiles in (many, few):
        assert TT.Tiles(128, 128, **tiles).shared <= 227 * 1024


def test_default_tiles_fit_the_device():
    """Where a block gets less shared memory than on Hopper (227 KB), the tiles keep 2
    stages, then fewer warps: the A100 (163 KB) 8 warps × 16 keys × 2 stages at D 128,
    sm_86/sm_89 (99 KB) 4 × 16 × 2; Hopper's choice unchanged."""
    hopper, a100, ada = 227 * 1024, 163 * 1024, 99 * 1024
    for units in (8, 66):
        assert KD.tiles_for(units, 132, hopper) == KD.tiles_for(units, 132)
        assert KD.tiles_for(units, 108, a100) == dict(warps=8, block_k=16, stages=2)
        assert KD.tiles_for(units, 128, ada) == dict(warps=4, block_k=16, stages=2)
        for d in (64, 128):
            for room in (hopper, a100, ada, 48 * 1024):
                tiles = KD.tiles_for(units, 132, room, d, d)
                assert TT.Tiles(d, d, **tiles).shared + TT.STATIC_SHARED <= room, (units, d, room)


@pytest.mark.skipif(SIMULATOR, reason="GPU only: every launch configuration")
def test_every_configuration_gives_the_same_answer():
    rng, seed = fresh()
    q = random(rng, (2, 32, 1, 128), F16, spread=1.5)
    k, v = random(rng, (2, 8, 5003, 128), F16), random(rng, (2, 8, 5003, 128), F16)
    ref = reference(q, k, v)
    room, ran = launcher.device_limits().shared_optin, 0
    for warps in (1, 2, 4, 8):
        for block_k in (16, 32, 64):
            for stages in (2, 3, 4):
                tiles = dict(warps=warps, block_k=block_k, stages=stages)
                if TT.Tiles(128, 128, **tiles).shared > room:
                    continue
                try:
                    o, lse = decode(q, k, v, tiles)
                except ValueError as e:  # the static arrays took it past the device's room
                    if "this device allows" not in str(e):
                        raise
                    continue
                check(o, lse, *ref, F16, f"seed {seed}, tiles {tiles}")
                ran += 1
    assert ran >= 10  # (24 on Hopper, 12 in 99 KB)
