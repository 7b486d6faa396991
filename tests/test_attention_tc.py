"""The tensor-core FlashAttention-2 kernel (:mod:`numba_softmax.kernels.attention.attention_tc`)
against the float64 reference, with flash-attn's accuracy rule:

    max |kernel − reference| ≤ 2 · max |same-precision reference − reference| + 1e-5

where "reference" is float64 attention of the rounded inputs and the same-precision
reference is PyTorch's math path written in NumPy (S, P and O rounded to fp16/bf16, with
float32 accumulation).  On the simulator the kernel runs the lane-level mma emulation on
one-warp tiles (``small``); on a GPU the real instructions on the default tiles.
Outputs are poisoned with NaN first; data are fresh for every run (seed in the message).
"""

import math

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.kernels.attention import attention_tc as TC
from numba_softmax.kernels.attention import merge as KD

from _helpers import SIMULATOR, sized
from test_mma import bf16_bits, bf16_values

F16, BF16, F32 = np.dtype(np.float16), np.dtype(np.uint16), np.dtype(np.float32)


def fresh():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def to_storage(x, storage):
    """float32 → the stored array (fp16, or bf16 bits as uint16) and its float64 values."""
    if storage == F16:
        s = x.astype(np.float16)
        return s, s.astype(np.float64)
    s = bf16_bits(x)
    return s, bf16_values(s).astype(np.float64)


def values(a, storage):
    return a.astype(np.float64) if storage in (F16, F32) else bf16_values(a).astype(np.float64)


def rnd(x, storage):
    x = np.asarray(x, np.float32)
    return x.astype(np.float16).astype(np.float64) if storage == F16 else \
        bf16_values(bf16_bits(x)).astype(np.float64)


def lowp_reference(q, k, v, storage, causal=False, window=(-1, -1), scale=None):
    """PyTorch's math path in NumPy: S = QKᵀ rounded, scaled and rounded, softmax in float32
    rounded, P V rounded (float32 accumulation throughout)."""
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = rnd(rnd(q.astype(np.float32) @ np.swapaxes(k, -1, -2).astype(np.float32), storage)
            * np.float32(scale), storage)
    ok = R.visible(q.shape[-2], k.shape[-2], causal, window)
    s = np.where(ok, s, -np.inf).astype(np.float32)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    p = rnd(np.where(den > 0, e / np.where(den > 0, den, 1), 0), storage)
    return rnd(p.astype(np.float32) @ v.astype(np.float32), storage)


def check_rule(o, ref, lowp, msg):
    """flash-attn's rule, and no NaN where the reference has none."""
    assert not np.isnan(o).any(), f"NaN in the output {msg}"
    err, base = np.max(np.abs(o - ref), initial=0), np.max(np.abs(lowp - ref), initial=0)
    assert err <= 2 * base + 1e-5, f"error {err:.3g} > 2 × {base:.3g} + 1e-5 {msg}"


def check_lse(lse, ref_lse, msg):
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), f"rows that see no key: LSE −inf {msg}"
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4, err_msg=msg)


def inputs(rng, storage, lead_q, lead_kv, sq, sk, d, dv):
    q, qv = to_storage(1.5 * rng.standard_normal(lead_q + (sq, d)).astype(np.float32), storage)
    k, kv = to_storage(rng.standard_normal(lead_kv + (sk, d)).astype(np.float32), storage)
    v, vv = to_storage(rng.standard_normal(lead_kv + (sk, dv)).astype(np.float32), storage)
    return (q, k, v), (qv, kv, vv)


def run(q, k, v, out_dtype=None, splits=1, **kw):
    b, h, sq, _ = q.shape
    o = cuda.to_device(np.full((splits * b, h, sq, v.shape[-1]), np.nan, out_dtype or q.dtype))
    lse = cuda.to_device(np.full((splits * b, h, sq), np.nan, np.float32))
    TC.launch(*(cuda.to_device(x) for x in (q, k, v)), o, lse, small=SIMULATOR, **kw)
    return o.copy_to_host(), lse.copy_to_host()


CASES = [  # (Sq, Sk, D, Dv, causal, window): odd sizes, ragged tiles, Dv ≠ D
    (sized(20, 300), sized(37, 333), 24, 40, False, (-1, -1)),
    (sized(37, 301), sized(21, 77), 32, 16, True, (-1, -1)),  # Sq > Sk: rows that see nothing
    (sized(19, 260), sized(45, 411), 20, 20, False, (6, 3)),  # D % 8 ≠ 0: no cp.async
    (sized(33, 333), sized(33, 333), 16, 16, True, (9, -1)),
]


@pytest.mark.parametrize("storage", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_reference(storage, case):
    rng, seed = fresh()
    sq, sk, d, dv, causal, window = CASES[case]
    (q, k, v), (qv, kv, vv) = inputs(rng, storage, (1, 2), (1, 2), sq, sk, d, dv)
    o, lse = run(q, k, v, causal=causal, window=window)
    ref, ref_lse = R.attention(qv, kv, vv, causal=causal, window=window, return_lse=True)
    msg = f"case {CASES[case]}, seed {seed}"
    check_rule(values(o, storage), ref, lowp_reference(qv, kv, vv, storage, causal, window), msg)
    check_lse(lse, ref_lse, msg)
    empty = np.isneginf(ref_lse)
    assert np.all(o[empty] == 0), f"rows that see no key: O = 0 {msg}"


def test_gqa_scale_and_multi_warp_single_stage():
    """Hq = 4 query heads on Hkv = 2 K/V heads, a negative scale, 2 warps, two mma k-steps
    per key tile (Bc = 32), no double buffer."""
    rng, seed = fresh()
    (q, k, v), (qv, kv, vv) = inputs(rng, F16, (1, 4), (1, 2), sized(40, 300), sized(35, 300),
                                     16, 16)
    o, lse = run(q, k, v, causal=True, scale=-0.3, warps=sized(2, 4), block_k=32, stages=1)
    ref, ref_lse = R.attention(qv, kv, vv, causal=True, scale=-0.3, return_lse=True)
    check_rule(values(o, F16), ref, lowp_reference(qv, kv, vv, F16, True, scale=-0.3),
               f"seed {seed}")
    check_lse(lse, ref_lse, f"seed {seed}")


@pytest.mark.parametrize("storage", [F16, BF16], ids=["fp16", "bf16"])
def test_varlen_never_reads_past_a_sequence(storage):
    """Packed sequences; the rows after the last key sequence are NaN and must not leak."""
    rng, seed = fresh()
    lens_q, lens_k = sized(([5, 17, 1], [9, 3, 20]), ([100, 300, 1], [150, 90, 333]))
    cu_q, cu_k = np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)
    tq, tk = int(cu_q[-1]), int(cu_k[-1]) + 7  # 7 unused key rows at the end
    d = 24
    (q, k, v), (qv, kv, vv) = inputs(rng, storage, (1, 2), (1, 1), tq, tk, d, d)
    nan = np.float16(np.nan) if storage == F16 else np.uint16(0x7FC0)
    k[..., cu_k[-1]:, :] = nan
    v[..., cu_k[-1]:, :] = nan
    for causal in (False, True):
        o, lse = run(q, k, v, causal=causal, cu_seqlens_q=cuda.to_device(cu_q.astype(np.int32)),
                     cu_seqlens_k=cuda.to_device(cu_k.astype(np.int32)), max_seqlen_q=max(lens_q))
        for b in range(len(lens_q)):
            rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            args = (qv[:, :, rows], kv[:, :, keys], vv[:, :, keys])
            ref, ref_lse = R.attention(*args, causal=causal, return_lse=True)
            msg = f"sequence {b}, causal {causal}, seed {seed}"
            check_rule(values(o[:, :, rows], storage), ref,
                       lowp_reference(*args, storage, causal), msg)
            check_lse(lse[:, :, rows], ref_lse, msg)


def test_keys_no_row_sees_are_never_read():
    """A sliding window: the keys before every row's window hold NaN, in K and V.  A block
    visits only the keys its rows see (the key loop starts at the first of them, not at a
    tile boundary), so they are never read and cannot reach the output."""
    rng, seed = fresh()
    sq, sk, left = sized(16, 128), sized(50, 400), sized(5, 40)
    (q, k, v), (qv, kv, vv) = inputs(rng, F16, (1, 1), (1, 1), sq, sk, 16, 16)
    first = sk - sq - left  # the first key any row sees
    k[..., :first, :], v[..., :first, :] = np.nan, np.nan
    o, lse = run(q, k, v, causal=True, window=(left, -1))
    kv[..., :first, :], vv[..., :first, :] = 0, 0  # what the reference sees instead: any value
    ref, ref_lse = R.attention(qv, kv, vv, causal=True, window=(left, -1), return_lse=True)
    check_rule(values(o, F16), ref, lowp_reference(qv, kv, vv, F16, True, (left, -1)),
               f"seed {seed}")
    check_lse(lse, ref_lse, f"seed {seed}")


@pytest.mark.parametrize("storage", [F16, BF16], ids=["fp16", "bf16"])
def test_split_kv_partials_merge(storage):
    """kv_chunk: normalised float32 partials, one per key range, merged by decode's kernel."""
    rng, seed = fresh()
    sq, sk, chunk = sized(17, 130), sized(40, 700), sized(16, 128)
    splits = -(-sk // chunk)
    (q, k, v), (qv, kv, vv) = inputs(rng, storage, (2, 1), (2, 1), sq, sk, 16, 24)
    o_ws, lse_ws = run(q, k, v, out_dtype=F32, splits=splits, causal=True, kv_chunk=chunk)
    assert not np.isnan(lse_ws).any()
    o = cuda.to_device(np.full((2, 1, sq, 24), np.nan, np.float32))
    lse = cuda.to_device(np.full((2, 1, sq), np.nan, np.float32))
    KD.merge_splits_launch(cuda.to_device(o_ws), cuda.to_device(lse_ws), o, lse, small=SIMULATOR)
    ref, ref_lse = R.attention(qv, kv, vv, causal=True, return_lse=True)
    check_rule(o.copy_to_host().astype(np.float64), ref, lowp_reference(qv, kv, vv, storage, True),
               f"seed {seed}")
    check_lse(lse.copy_to_host(), ref_lse, f"seed {seed}")
    for z in range(splits):  # a range a row cannot see: O = 0, LSE = −inf in its partial
        seen = R.visible(sq, sk, causal=True)[:, z * chunk : (z + 1) * chunk].any(axis=1)
        assert np.all(np.isneginf(lse_ws[2 * z : 2 * z + 2, :, ~seen]))
        assert np.all(o_ws[2 * z : 2 * z + 2, :, ~seen] == 0)
        assert np.all(np.isfinite(lse_ws[2 * z : 2 * z + 2, :, seen]))


def test_bad_input_is_refused():
    q = cuda.to_device(np.zeros((1, 2, 4, 16), np.float16))
    o = cuda.to_device(np.zeros((1, 2, 4, 16), np.float16))
    lse = cuda.to_device(np.zeros((1, 2, 4), np.float32))
    with pytest.raises(TypeError, match="float32"):
        f = cuda.to_device(np.zeros((1, 2, 4, 16), np.float32))
        TC.launch(f, f, f, f, lse)
    with pytest.raises(ValueError, match="shapes"):
        TC.launch(q, cuda.to_device(np.zeros((1, 3, 4, 16), np.float16)), q, o, lse)
    with pytest.raises(ValueError, match="scale"):
        TC.launch(q, q, q, o, lse, scale=0.0)
    with pytest.raises(ValueError, match="head dimensions"):
        big = cuda.to_device(np.zeros((1, 1, 1, 264), np.float16))
        TC.launch(big, big, big, big, cuda.to_device(np.zeros((1, 1, 1), np.float32)))
    with pytest.raises(ValueError, match="warps"):
        TC.launch(q, q, q, o, lse, warps=3)
    with pytest.raises(ValueError, match="varlen"):
        TC.launch(q, q, q, o, lse, cu_seqlens_q=cuda.to_device(np.zeros(2, np.int32)))


@pytest.mark.skipif(SIMULATOR, reason="GPU only: Sq = Sk = 65536")
def test_memory_stays_linear_at_65536():
    """fp16, Sq = Sk = 65536, D = 64, causal: the score matrix would be 8 GiB in fp16; the
    kernel writes O and LSE and allocates nothing else.  A few rows against float64."""
    s, d = 65536, 64
    rng, seed = fresh()
    (q, k, v), (qv, kv, vv) = inputs(rng, F16, (1, 1), (1, 1), s, s, d, d)
    dq, dk, dv = (cuda.to_device(x) for x in (q, k, v))
    o = cuda.device_array((1, 1, s, d), np.float16)
    lse = cuda.device_array((1, 1, s), np.float32)
    TC.launch(dq[:, :, :128], dk[:, :, :128], dv[:, :, :128], o[:, :, :128], lse[:, :, :128],
              causal=True)  # compile and load before measuring
    ctx = cuda.current_context()
    with cuda.defer_cleanup():
        cuda.synchronize()
        free_before = ctx.get_memory_info().free
        TC.launch(dq, dk, dv, o, lse, causal=True)
        cuda.synchronize()
        used = free_before - ctx.get_memory_info().free
    assert used <= 2 * 2**20, f"{used} bytes allocated by the kernel at S = {s}"
    rows = np.array([0, 1, 4095, s // 2, s - 1])
    o_h, lse_h = o.copy_to_host()[0, 0, rows].astype(np.float64), lse.copy_to_host()[0, 0, rows]
    for r, o_r, lse_r in zip(rows, o_h, lse_h):
        ref_o, ref_lse = R.attention(qv[0, 0, r : r + 1], kv[0, 0, : r + 1], vv[0, 0, : r + 1],
                                     return_lse=True)
        np.testing.assert_allclose(o_r, ref_o[0], rtol=2e-2, atol=2e-3,
                                   err_msg=f"row {r}, seed {seed}")
        np.testing.assert_allclose(lse_r, ref_lse[0], rtol=1e-4, atol=1e-4)
