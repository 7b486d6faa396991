"""Attention as inference engines run it, kernel level: sliding windows, grouped-query
heads (GQA/MQA), packed variable-length batches, bfloat16, split partials, the decode
kernel's split choice, and grids past 65535 batch·heads — each against the float64
references (:func:`numba_softmax.reference.attention`, ``attention_varlen``), on poisoned
outputs with fresh data.  Shapes are tiny on the simulator (2-warp tiles), larger on a GPU.
"""

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.kernels.attention import attention as KA
from numba_softmax.kernels.decode import decode as KC
from numba_softmax.kernels.decode import decode_launch as KD
from numba_softmax.kernels.attention import merge as KM
from numba_softmax.runtime import counters
from numba_softmax.kernels.attention import visible

from _attention_data import BF16, F16, F32, check, fresh, poisoned, random, values
from _helpers import SIMULATOR, sized

SMALL = dict(small=SIMULATOR)


def qkv(rng, b, hq, hkv, sq, sk, d, dv, dtype):
    return (random(rng, (b, hq, sq, d), dtype, spread=1.5), random(rng, (b, hkv, sk, d), dtype),
            random(rng, (b, hkv, sk, dv), dtype))


def forward(q, k, v, **kw):
    b, h, sq, _ = q.shape
    o, lse = poisoned((b, h, sq, v.shape[-1]), q.dtype), poisoned((b, h, sq), F32)
    KA.launch(*(cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v)), o, lse, **SMALL, **kw)
    return o.copy_to_host(), lse.copy_to_host()


def decode(q, k, v, **kw):
    b, h, sq, _ = q.shape
    o, lse = poisoned((b, h, sq, v.shape[-1]), q.dtype), poisoned((b, h, sq), F32)
    KD.launch(*(cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v)), o, lse, **SMALL, **kw)
    return o.copy_to_host(), lse.copy_to_host()


def reference(q, k, v, **kw):
    return R.attention(values(q), values(k), values(v), return_lse=True, **kw)


def test_bounds_fold_causal_into_the_window():
    U = visible.UNBOUNDED
    assert visible.bounds() == (U, U)
    assert visible.bounds(True) == (U, 0)
    assert visible.bounds(True, (3, 5)) == (3, 0) and visible.bounds(False, (3, 5)) == (3, 5)
    assert visible.bounds(False, (-1, 2)) == (U, 2)
    with pytest.raises(TypeError, match="window"):
        visible.bounds(False, 3)


# (Hq, Hkv, causal, window): plain, GQA 2, MQA; windows on both sides, causal with a left one
CASES = sized([(2, 2, False, (3, 2)), (4, 2, True, (5, -1)), (4, 1, False, (0, 0))],
              [(2, 2, False, (3, 2)), (4, 2, True, (5, -1)), (4, 1, False, (-1, 0)),
               (8, 2, True, (-1, -1)), (2, 1, False, (0, 0))])


@pytest.mark.parametrize("hq, hkv, causal, window", CASES)
def test_forward_window_and_grouped_heads(hq, hkv, causal, window):
    rng, seed = fresh()
    dims = sized((1, 9, 21, 16, 16), (2, 300, 333, 64, 64))
    b, sq, sk, d, dv = dims
    q, k, v = qkv(rng, b, hq, hkv, sq, sk, d, dv, F32)
    o, lse = forward(q, k, v, causal=causal, window=window)
    check(o, lse, *reference(q, k, v, causal=causal, window=window), F32, f"seed {seed}")


@pytest.mark.parametrize("dtype", sized([BF16], [F16, BF16]))
def test_forward_half_precision(dtype):
    rng, seed = fresh()
    q, k, v = qkv(rng, 1, 4, 2, sized(9, 200), sized(19, 250), 24, 24, dtype)
    o, lse = forward(q, k, v, causal=True, window=(7, -1))
    check(o, lse, *reference(q, k, v, causal=True, window=(7, -1)), dtype, f"seed {seed}")


def test_forward_varlen():
    """Packed sequences of different lengths — one with no queries, one with no keys,
    one with more queries than keys — each attending to its own keys only."""
    rng, seed = fresh()
    lq, lk = sized(([3, 0, 9, 4], [5, 7, 0, 2]), ([300, 0, 77, 513], [280, 99, 0, 700]))
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lq, lk))
    hq, hkv, d, dv = 4, 2, 16, 8
    q = random(rng, (cu_q[-1], hq, d), F32, spread=1.5)
    k, v = random(rng, (cu_k[-1], hkv, d), F32), random(rng, (cu_k[-1], hkv, dv), F32)
    for causal, window in sized(((True, (2, -1)),), ((False, (-1, -1)), (True, (2, -1)))):
        o, lse = poisoned((1, hq, cu_q[-1], dv), F32), poisoned((1, hq, cu_q[-1]), F32)
        heads = (cuda.to_device(np.ascontiguousarray(np.swapaxes(x, 0, 1))[None]) for x in (q, k, v))
        KA.launch(*heads, o, lse, causal=causal, window=window, cu_seqlens_q=cuda.to_device(cu_q),
                  cu_seqlens_k=cuda.to_device(cu_k), max_seqlen_q=max(lq), **SMALL)
        ref_o, ref_lse = R.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, window=window,
                                            return_lse=True)
        check(np.swapaxes(o.copy_to_host()[0], 0, 1), lse.copy_to_host()[0].T, ref_o, ref_lse.T,
              F32, f"seed {seed}, causal {causal}")


def test_forward_split_partials_merge_to_the_whole():
    """kv_chunk: Z partials (O_z, LSE_z) in float32, merged by the merge kernel."""
    rng, seed = fresh()
    q, k, v = qkv(rng, 1, 4, 2, sized(6, 100), sized(37, 900), 16, 16, F16)
    chunk = sized(16, 256)
    z = -(-k.shape[2] // chunk)
    o_ws, lse_ws = poisoned((z, 4, q.shape[2], 16), F32), poisoned((z, 4, q.shape[2]), F32)
    KA.launch(*(cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v)), o_ws, lse_ws, causal=True,
              window=(20, -1), kv_chunk=chunk, **SMALL)
    o, lse = poisoned((1, 4, q.shape[2], 16), F16), poisoned((1, 4, q.shape[2]), F32)
    KM.merge_splits_launch(o_ws, lse_ws, o, lse, **SMALL)
    check(o.copy_to_host(), lse.copy_to_host(), *reference(q, k, v, causal=True, window=(20, -1)),
          F16, f"seed {seed}")


# (Hq, Hkv, Sq, causal, window, num_splits): GQA groups 1, 2, 4 and MQA; speculative Sq > 1
DECODE = [(2, 2, 1, False, (-1, -1), None), (4, 2, 3, True, (-1, -1), 3), (4, 1, 2, True, (4, 0), None)]


@pytest.mark.parametrize("hq, hkv, sq, causal, window, splits", DECODE)
def test_decode_grouped_heads_windows_and_splits(hq, hkv, sq, causal, window, splits):
    rng, seed = fresh()
    q, k, v = qkv(rng, sized(1, 3), hq, hkv, sq, sized(29, 3000), 16, sized(12, 128), F32)
    o, lse = decode(q, k, v, causal=causal, window=window, num_splits=splits)
    check(o, lse, *reference(q, k, v, causal=causal, window=window), F32, f"seed {seed}")


def test_decode_half_precision_and_exact_chunks():
    rng, seed = fresh()
    for dtype in sized((BF16,), (F16, BF16)):
        q, k, v = qkv(rng, 1, 8, 2, 1, sized(23, 2000), 24, 24, dtype)
        o, lse = decode(q, k, v, kv_chunk=sized(9, 333))
        check(o, lse, *reference(q, k, v), dtype, f"seed {seed}, {dtype}")


def test_split_choice():
    # B = 1, 8 K/V heads on 132 multiprocessors (one block each): about 16 splits
    assert KD.choose_splits(8, 4096, 132, 64) == 16
    assert KD.choose_splits(128, 4096, 132, 64) == 1  # the batch fills the device
    assert KD.choose_splits(8, 100, 132, 64) == 2  # no split shorter than a step of keys
    assert KD.choose_splits(1, 10**6, 1000, 64) == KD.MAX_SPLITS
    assert KC.lanes(F16, 128, 128) == (16, 2, 4) and KC.lanes(F32, 64, 64) == (8, 4, 2)


def test_partials_and_tickets():
    o1, lse1 = KM.partials((2, 3, 4), 8, 0)
    assert o1.shape == (2, 3, 4, 8) and lse1.shape == (2, 3, 4)
    assert np.all(counters.tickets(5).copy_to_host() == 0)


@pytest.mark.skipif(SIMULATOR, reason="GPU only: 70000 (batch, head) pairs")
def test_more_than_65535_batch_heads():
    rng, seed = fresh()
    q, k, v = qkv(rng, 35000, 2, 1, 3, 5, 8, 8, F32)
    o, lse = forward(q, k, v, causal=True)
    check(o, lse, *reference(q, k, v, causal=True), F32, f"seed {seed}")
    o, lse = decode(q[:, :, :1], k, v, num_splits=2)
    check(o, lse, *reference(q[:, :, :1], k, v), F32, f"seed {seed}")
    a = forward(q, k[:, :, :2], v[:, :, :2])
    c = forward(q, k[:, :, 2:], v[:, :, 2:])
    o, lse = poisoned(q.shape, F32), poisoned(q.shape[:3], F32)
    KM.merge_pair_launch(*(cuda.to_device(x) for x in (*a, *c)), o, lse)
    check(o.copy_to_host(), lse.copy_to_host(), *reference(q, k, v), F32, f"seed {seed}")
