"""Paged KV-cache decoding and appending, kernel level, against the NumPy twins
(:func:`numba_softmax.reference.paged_attention`, ``append_kv``): shuffled block tables
with shared prefixes, odd lengths and block sizes, an empty sequence, windows, causal
speculative rows, GQA groups and MQA, splits, soft-capping and ALiBi on both decode
kernels; and the host validator's errors."""

import math

import numpy as np
import pytest
from numba import cuda

from numba_softmax import block_tables
from numba_softmax import reference as R
from numba_softmax.kernels.decode import append as KAp
from numba_softmax.kernels.decode import paged as KP

from _attention_data import (BF16, F16, F32, LSE_TOL, check, fresh, lowp, paged_cache, poisoned,
                             random, rule, values)
from _helpers import SIMULATOR, sized

SMALL = dict(small=SIMULATOR)


def run_paged(q, k_cache, v_cache, table, lengths, **kw):
    b, h, sq, _ = q.shape
    o, lse = poisoned((b, h, sq, v_cache.shape[-1]), q.dtype), poisoned((b, h, sq), F32)
    block_tables.tables(table, lengths, k_cache.shape[0], k_cache.shape[1], batch=b)
    KP.launch(*(cuda.to_device(x) for x in (q, k_cache, v_cache, table, lengths)), o, lse,
              **SMALL, **kw)
    return o.copy_to_host(), lse.copy_to_host()


def reference(q, k_cache, v_cache, table, lengths, **kw):
    return R.paged_attention(values(q), values(k_cache), values(v_cache), table, lengths,
                             return_lse=True, **kw)


# (Hq, Hkv, Sq, block size, lengths, causal, window, splits, dtype, shared prefix blocks)
CASES = [
    (4, 2, 1, 4, [5, 0, 13], False, (-1, -1), None, F32, 1),   # an empty sequence
    (4, 1, 3, 5, [11, 7], True, (-1, -1), 2, F16, 1),         # MQA, speculative rows, block size 5
    (2, 2, 2, 8, [19], True, (6, -1), 3, BF16, 0),            # a sliding window
    (8, 2, 1, 4, [9, 16], False, (3, 2), None, F32, 2),       # a window on both sides
]


@pytest.mark.parametrize("hq, hkv, sq, bs, lengths, causal, window, splits, dtype, prefix", CASES)
def test_paged_matches_reference(hq, hkv, sq, bs, lengths, causal, window, splits, dtype, prefix):
    rng, seed = fresh()
    if not SIMULATOR:  # long contexts and big pages on a GPU
        bs, lengths = bs * 16 + 1 if bs == 5 else bs * 16, [n * 97 + 1 for n in lengths]
    d, dv = sized((16, 8), (128, 128))
    k_cache, v_cache, table, lengths = paged_cache(rng, lengths, bs, hkv, d, dv, dtype, prefix)
    q = random(rng, (len(lengths), hq, sq, d), dtype, spread=1.5)
    o, lse = run_paged(q, k_cache, v_cache, table, lengths, causal=causal, window=window,
                       num_splits=splits)
    check(o, lse, *reference(q, k_cache, v_cache, table, lengths, causal=causal, window=window),
          dtype, f"seed {seed}")


# (Hq, Hkv, Sq, block size, lengths, causal, splits, dtype, softcap, alibi): float32 runs
# on the CUDA-core decode kernel, float16/bfloat16 on the tensor-core one
MOD_CASES = [
    (4, 2, 1, 4, [13, 0, 6], False, None, F32, 5.0, "per_head"),
    (4, 1, 3, 5, [11, 7], True, 2, F16, 2.0, None),       # speculative rows, rows layout
    (2, 2, 2, 8, [19], True, 3, BF16, 0.0, "per_batch"),
    (8, 2, 1, 4, [9, 16], False, None, F16, 30.0, "per_batch"),
]


@pytest.mark.parametrize("hq, hkv, sq, bs, lengths, causal, splits, dtype, cap, alibi", MOD_CASES)
def test_score_modifications(hq, hkv, sq, bs, lengths, causal, splits, dtype, cap, alibi):
    """Soft-capping and ALiBi (per head, per sequence) against the float64 reference with
    Sk = each sequence's length; float16/bfloat16 by flash-attn's rule, sequence by
    sequence (a plain same-precision implementation on the gathered keys)."""
    rng, seed = fresh()
    if not SIMULATOR:
        bs, lengths = bs * 16 + 1 if bs == 5 else bs * 16, [n * 97 + 1 for n in lengths]
    d, dv = sized((16, 8), (128, 128))
    k_cache, v_cache, table, lengths = paged_cache(rng, lengths, bs, hkv, d, dv, dtype, 1)
    b = len(lengths)
    q = random(rng, (b, hq, sq, d), dtype, spread=3.0)
    sl = None if alibi is None else rng.uniform(0.05, 1.0, (b, hq) if alibi == "per_batch"
                                                 else (hq,)).astype(F32)
    dev_sl = None if sl is None else cuda.to_device(sl.reshape(-1, hq))
    o, lse = run_paged(q, k_cache, v_cache, table, lengths, causal=causal, num_splits=splits,
                       softcap=cap, alibi=dev_sl)
    ref_o, ref_lse = reference(q, k_cache, v_cache, table, lengths, causal=causal, softcap=cap,
                               alibi_slopes=sl)
    msg = f"seed {seed}"
    if dtype == F32:
        return check(o, lse, ref_o, ref_lse, F32, msg)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty) and np.all(values(o)[empty] == 0), msg
    # the fp16/bf16 kernels cap with the hardware's tanh (relative error near 2⁻¹¹): an
    # LSE off by up to cap·2⁻¹¹ beside the exact one
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=LSE_TOL[dtype]["rtol"],
                               atol=LSE_TOL[dtype]["atol"] + cap * 2.0**-10, err_msg=msg)
    for i, n in enumerate(lengths):
        kb, vb = (np.swapaxes(R.gather_kv(c, table, i, n), 0, 1)[None] for c in (k_cache, v_cache))
        row_sl = None if sl is None else (sl[i] if sl.ndim == 2 else sl)[None]
        low = lowp(q[i:i + 1], kb, vb, causal, 1 / np.sqrt(d), cap, row_sl, dtype)
        rule(values(o)[i:i + 1], ref_o[i:i + 1], low, f"{msg}, sequence {i}")


def test_public_paged_attention_takes_the_score_modifications():
    """ns.paged_attention with softcap and (B, Hq) slopes: the reference, inputs unchanged;
    bad options refused by name."""
    import numba_softmax as ns

    rng, seed = fresh()
    hq, hkv, d, bs = 4, 2, 8, 4
    k_cache, v_cache, table, lengths = paged_cache(rng, [6, 9], bs, hkv, d, d, F32)
    q = random(rng, (2, hq, 2, d), F32, spread=3.0)
    sl = rng.uniform(0.05, 1.0, (2, hq)).astype(F32)
    before = [x.copy() for x in (q, k_cache, v_cache, table, lengths, sl)]
    for table_, lengths_ in ((table, lengths), (cuda.to_device(table), cuda.to_device(lengths))):
        o, lse = ns.paged_attention(q, k_cache, v_cache, table_, lengths_, causal=True,
                                    softcap=4.0, alibi_slopes=sl, return_lse=True)
        check(o, lse, *reference(q, k_cache, v_cache, table, lengths, causal=True, softcap=4.0,
                                 alibi_slopes=sl), F32, f"seed {seed}")
    assert all(np.array_equal(a, c) for a, c in
               zip(before, (q, k_cache, v_cache, table, lengths, sl))), "inputs modified"
    for kw, error in ((dict(softcap=-1.0), ValueError), (dict(softcap=math.nan), ValueError),
                      (dict(alibi_slopes=np.ones(3, F32)), ValueError),
                      (dict(alibi_slopes=np.ones(4)), TypeError)):
        with pytest.raises(error, match=next(iter(kw))):
            ns.paged_attention(q, k_cache, v_cache, table, lengths, **kw)


def test_toy_decoder_loop():
    """Fill a paged cache token by token (two tokens, then one) with the append kernel,
    decode after every step, and check both against the dense reference."""
    rng, seed = fresh()
    hq, hkv, d, bs = 4, 2, 16, 4
    # each sequence has a block of room; new tokens never land in the shared first block
    k_cache, v_cache, table, lengths = paged_cache(rng, sized([6, 5], [300, 17]), bs, hkv, d, d,
                                                   F32, shared_prefix=1)
    dk, dv = cuda.to_device(k_cache), cuda.to_device(v_cache)
    for step, new in enumerate((2, 1)):
        k_new, v_new = (random(rng, (len(lengths), new, hkv, d), F32) for _ in range(2))
        block_tables.tables(table, lengths, k_cache.shape[0], bs, new_tokens=new)
        KAp.launch(*(cuda.to_device(x) for x in (k_new, v_new)), dk, dv,
                   *(cuda.to_device(x) for x in (table, lengths)), **SMALL)
        k_cache, v_cache = R.append_kv(k_cache, v_cache, table, lengths, k_new, v_new)
        assert np.array_equal(dk.copy_to_host(), k_cache) and np.array_equal(dv.copy_to_host(), v_cache)
        lengths = lengths + new
        q = random(rng, (len(lengths), hq, new, d), F32)
        o, lse = poisoned(q.shape, F32), poisoned(q.shape[:3], F32)
        KP.launch(cuda.to_device(q), dk, dv,
                  *(cuda.to_device(x) for x in (table, lengths)), o, lse, causal=True, **SMALL)
        for b, n in enumerate(lengths):  # the dense reference on this sequence's positions
            kb, vb = (np.swapaxes(R.gather_kv(c, table, b, n), 0, 1) for c in (k_cache, v_cache))
            ref = R.attention(q[b], kb, vb, causal=True, return_lse=True)
            check(o.copy_to_host()[b], lse.copy_to_host()[b], *ref, F32, f"seed {seed}, step {step}")


def test_reference_paged_is_dense_attention_on_gathered_blocks():
    rng, _ = fresh()
    k_cache, v_cache, table, lengths = paged_cache(rng, [7, 12], 3, 2, 8, 8, F32, shared_prefix=2)
    q = random(rng, (2, 4, 2, 8), F32)
    o = R.paged_attention(q, k_cache, v_cache, table, lengths, causal=True)
    for b in range(2):
        pos = np.arange(lengths[b])
        kb = k_cache[table[b, pos // 3], pos % 3]  # (L, Hkv, D), position by position
        vb = v_cache[table[b, pos // 3], pos % 3]
        want = R.attention(q[b], np.swapaxes(kb, 0, 1), np.swapaxes(vb, 0, 1), causal=True)
        np.testing.assert_allclose(o[b], want, rtol=1e-12, atol=1e-12)
    assert np.array_equal(table[0, :2], table[1, :2])  # the shared prefix


def test_validator_refuses_bad_tables():
    table = np.array([[3, 1, -1], [0, 2, 4]], np.int32)
    lengths = np.array([7, 9], np.int32)
    block_tables.tables(table, lengths, 5, 4)  # entries past a sequence's blocks are not read
    bad = [
        (table, np.array([-1, 9], np.int32), "cache_seqlens\\[0\\] = -1 is negative"),
        (table, np.array([7, 13], np.int32), "sequence 1 needs 13 positions"),
        (np.array([[3, 5, -1], [0, 2, 4]], np.int32), lengths, "block_table\\[0, 1\\] = 5"),
        (np.array([[3, -2, 0], [0, 2, 4]], np.int32), lengths, "block_table\\[0, 1\\] = -2"),
        (table[:1], lengths, "cache_seqlens must be \\(1,\\)"),
        (table[0], lengths[:1], "block_table must be"),
    ]
    for t, n, match in bad:
        with pytest.raises(ValueError, match=match):
            block_tables.tables(t, n, 5, 4)
    with pytest.raises(ValueError, match="block_table\\[0, 2\\] = -1"):  # room for one more token
        block_tables.tables(table, lengths, 5, 4, new_tokens=2)
    with pytest.raises(ValueError, match="sequence 1 needs 13 positions"):
        block_tables.tables(table, np.array([3, 9], np.int32), 5, 4, new_tokens=4)
    with pytest.raises(ValueError, match="batch of 3"):
        block_tables.tables(table, lengths, 5, 4, batch=3)
    with pytest.raises(TypeError, match="block_table must be int32"):
        block_tables.tables(table.astype(np.int64), lengths, 5, 4)
    for t, n, match in bad[:4]:  # device tables: the same findings from the check kernel
        with pytest.raises(ValueError, match=match):
            block_tables.tables(cuda.to_device(t), cuda.to_device(n), 5, 4)
    block_tables.tables(cuda.to_device(table), cuda.to_device(lengths), 5, 4)
    with pytest.raises(ValueError, match="block_table\\[0, 2\\] = -1"):
        block_tables.tables(cuda.to_device(table), cuda.to_device(lengths), 5, 4, new_tokens=2)
    block_tables.tables(table[:0], lengths[:0], 5, 4)  # no sequences: nothing to check


def test_shape_errors():
    q = np.zeros((2, 4, 1, 8), np.float32)
    kc = np.zeros((5, 4, 2, 8), np.float32)
    table, lengths = np.zeros((2, 3), np.int32), np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="multiple"):
        KP.check_shapes(q[:, :3], kc, kc, table, lengths)
    with pytest.raises(ValueError, match="head dimension"):
        KP.check_shapes(q[..., :4], kc, kc, table, lengths)
    with pytest.raises(ValueError, match="batch 2"):
        KP.check_shapes(q, kc, kc, table[:1], lengths)
    with pytest.raises(ValueError, match="Sq = 0"):
        KP.check_shapes(q[:, :, :0], kc, kc, table, lengths)
    with pytest.raises(TypeError, match="one dtype"):
        KAp.launch(np.zeros((2, 1, 2, 8), np.float16), np.zeros((2, 1, 2, 8), np.float32), kc, kc,
                   table, lengths)
    with pytest.raises(ValueError, match="do not fit"):
        KAp.launch(np.zeros((2, 1, 3, 8), np.float32), np.zeros((2, 1, 3, 8), np.float32), kc, kc,
                   table, lengths)


def test_public_paged_attention_checks_device_tables_and_never_reads_outside():
    """ns.paged_attention: NumPy and device tables give the reference; a bad device table
    is a ValueError from the check kernel; with check=False the kernel still reads
    nothing outside the pool or the table row (the simulator raises on such a read): it
    gives the reference's answer on the clamped table and lengths."""
    import numba_softmax as ns

    rng, seed = fresh()
    hq, hkv, d, bs = 4, 2, 8, 4
    k_cache, v_cache, table, lengths = paged_cache(rng, [6, 9], bs, hkv, d, d, F32, shared_prefix=1)
    q = random(rng, (2, hq, 1, d), F32)
    want_o, want_lse = reference(q, k_cache, v_cache, table, lengths)
    dev = [cuda.to_device(x) for x in (q, k_cache, v_cache)]
    for t, n in ((table, lengths), (cuda.to_device(table), cuda.to_device(lengths))):
        o, lse = ns.paged_attention(*dev, t, n, return_lse=True)
        check(o.copy_to_host(), lse.copy_to_host(), want_o, want_lse, F32, f"seed {seed}")
    bad = table.copy()
    bad[1, 0] = k_cache.shape[0] + 7  # not a block of the pool
    long = np.array([6, table.shape[1] * bs + 5], np.int32)  # beyond its table row
    for t, n, match in ((bad, lengths, r"block_table\[1, 0\]"), (table, long, "sequence 1 needs")):
        for tt, nn in ((t, n), (cuda.to_device(t), cuda.to_device(n))):
            with pytest.raises(ValueError, match=match):
                ns.paged_attention(*dev, tt, nn)
        o = ns.paged_attention(*dev, cuda.to_device(t), cuda.to_device(n), check=False,
                               return_lse=True)
        # a wrong answer, but read in bounds: the kernel clamps each block id to the pool
        # and each length to its table row, and computes what the reference does then
        clamped = (np.clip(t, 0, k_cache.shape[0] - 1).astype(np.int32),
                   np.clip(n, 0, table.shape[1] * bs).astype(np.int32))
        check(o[0].copy_to_host(), o[1].copy_to_host(),
              *reference(q, k_cache, v_cache, *clamped), F32, f"seed {seed}, check=False")
    with pytest.raises(TypeError, match="check"):
        ns.paged_attention(*dev, table, lengths, check="yes")


def test_public_append_kv_check_false_writes_only_inside_the_pool():
    """ns.append_kv: a device table naming a block outside the pool is a ValueError that
    writes nothing; with check=False it is not read on the host and the kernel skips the
    bad rows: every other row lands as the reference writes it, the pool's other blocks
    keep their values."""
    import numba_softmax as ns

    rng, seed = fresh()
    hkv, d, bs = 2, 8, 4
    k_cache, v_cache, table, lengths = paged_cache(rng, [5, 6], bs, hkv, d, d, F32)
    k_new, v_new = (random(rng, (2, 1, hkv, d), F32) for _ in range(2))
    bad = table.copy()
    bad[1, lengths[1] // bs] = k_cache.shape[0] + 3  # sequence 1's new token: no such block
    dk, dv = cuda.to_device(k_cache), cuda.to_device(v_cache)
    with pytest.raises(ValueError, match=r"block_table\[1, "):
        ns.append_kv(cuda.to_device(k_new), cuda.to_device(v_new), dk, dv,
                     cuda.to_device(bad), cuda.to_device(lengths))
    assert np.array_equal(dk.copy_to_host(), k_cache), "a refused call wrote the cache"
    ns.append_kv(cuda.to_device(k_new), cuda.to_device(v_new), dk, dv, cuda.to_device(bad),
                 cuda.to_device(lengths), check=False)
    want_k, want_v = R.append_kv(k_cache, v_cache, table[:1], lengths[:1], k_new[:1], v_new[:1])
    assert np.array_equal(dk.copy_to_host(), want_k), f"seed {seed}"
    assert np.array_equal(dv.copy_to_host(), want_v), f"seed {seed}"
    with pytest.raises(TypeError, match="check"):
        ns.append_kv(cuda.to_device(k_new), cuda.to_device(v_new), dk, dv, table, lengths,
                     check=1)
