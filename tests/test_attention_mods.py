"""The score modifications — ``softcap`` and ``alibi_slopes``, flash-attn's — on every path
that takes them: the float64 references (against flash-attn's written definition, and the
backward against finite differences), the CUDA-core and tensor-core forward kernels on
poisoned outputs, split-KV, ``attention`` and ``attention_varlen`` (paged decoding:
``test_paged.py``), the checks of bad input, and a Hypothesis property over irregular
shapes with fresh data.  Low-precision results follow flash-attn's rule: the error
against the float64 reference at most 2× that of a plain same-precision implementation.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.kernels.attention import attention as KA
from numba_softmax.kernels.attention import attention_tc as KT

from _attention_data import BF16, F16, F32, TOL, check, fresh, lowp, poisoned, random, rule, values
from _helpers import SIMULATOR, sized


def slopes_for(rng, b, hq, per_batch):
    """ALiBi slopes as models draw them (2^(−8h/H)-like, here random in (0, 1])."""
    shape = (b, hq) if per_batch else (hq,)
    return rng.uniform(0.05, 1.0, shape).astype(np.float32)


# --- the references ---------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_reference_scores_follow_flash_attn(causal):
    """softcap·tanh(scale·q·k / softcap) − slope·|i + Sk − Sq − j|, element by element."""
    rng, seed = fresh()
    b, h, sq, sk, d = 2, 3, 4, 7, 5
    q, k = rng.standard_normal((b, h, sq, d)), rng.standard_normal((b, h, sk, d))
    sl = rng.uniform(0, 1, (b, h))
    got = R.scores(q, k, 0.7, softcap=2.0, alibi_slopes=sl)
    for bi, hi, i, j in np.ndindex(b, h, sq, sk):
        want = 2.0 * math.tanh(0.7 * float(q[bi, hi, i] @ k[bi, hi, j]) / 2.0) \
            - sl[bi, hi] * abs(i + sk - sq - j)
        assert got[bi, hi, i, j] == pytest.approx(want, rel=1e-12, abs=1e-12), f"seed {seed}"
    o = R.attention(q, k, k, causal=causal, softcap=2.0, alibi_slopes=sl[0])  # (Hq,) slopes
    s = np.where(R.visible(sq, sk, causal), R.scores(q, k, 1 / math.sqrt(d), 2.0, sl[0]), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    # (an output near 0 is a sum that cancels: its error is relative to the terms', not its own)
    np.testing.assert_allclose(o, (p / p.sum(-1, keepdims=True)) @ k, rtol=1e-12, atol=1e-14,
                               err_msg=f"seed {seed}")


def test_reference_backward_matches_finite_differences():
    rng, seed = fresh()
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 3)))
    sl, cap, g = rng.uniform(0, 1, (2,)), 1.3, rng.standard_normal((1, 2, 3, 3))
    kw = dict(causal=True, scale=0.9, softcap=cap, alibi_slopes=sl)
    o, lse = R.attention(q, k, v, return_lse=True, **kw)
    grads = R.attention_backward(g, q, k, v, o, lse, **kw)
    for x, dx in zip((q, k, v), grads):
        for idx in list(np.ndindex(x.shape))[::3]:
            e = np.zeros_like(x)
            e[idx] = 1e-6
            args = [a + e if a is x else a for a in (q, k, v)]
            plus = (R.attention(*args, **kw) * g).sum()
            args = [a - e if a is x else a for a in (q, k, v)]
            minus = (R.attention(*args, **kw) * g).sum()
            assert dx[idx] == pytest.approx((plus - minus) / 2e-6, abs=1e-6), f"seed {seed} {idx}"


# --- the kernels, on poisoned outputs ---------------------------------------------------
def run_kernel(mod, q, k, v, kv_chunk=None, softcap=0.0, slopes=None, **kw):
    b, h, sq, _ = q.shape
    z = 1 if kv_chunk is None else -(-k.shape[2] // kv_chunk)
    o_dtype = q.dtype if z == 1 else F32
    o, lse = poisoned((z * b, h, sq, v.shape[-1]), o_dtype), poisoned((z * b, h, sq), F32)
    alibi = None if slopes is None else cuda.to_device(slopes.reshape(-1, h))
    mod.launch(*(cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v)), o, lse,
               kv_chunk=kv_chunk, small=SIMULATOR, softcap=softcap, alibi=alibi, **kw)
    return o.copy_to_host(), lse.copy_to_host()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap,alibi", [(3.0, None), (0.0, "per_batch"), (1.5, "per_head")])
def test_cuda_core_kernel(causal, softcap, alibi):
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d = 2, 2, 1, 9, 21, 12
    q, k, v = random(rng, (b, hq, sq, d), F32, 2.0), random(rng, (b, hkv, sk, d), F32, 2.0), \
        random(rng, (b, hkv, sk, d), F32)
    sl = None if alibi is None else slopes_for(rng, b, hq, alibi == "per_batch")
    o, lse = run_kernel(KA, q, k, v, causal=causal, softcap=softcap, slopes=sl)
    ref_o, ref_lse = R.attention(q, k, v, causal=causal, softcap=softcap, alibi_slopes=sl,
                                 return_lse=True)
    check(o, lse, ref_o, ref_lse, F32, f"seed {seed}")


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("split", [None, 16])
def test_tensor_core_kernel(dtype, split):
    """fp16/bf16 on mma (the split writes float32 partials: checked merged by the API)."""
    rng, seed = fresh()
    b, hq, hkv, sq, sk, d = 1, 2, 2, 17, 37, 16
    q, k, v = (random(rng, s, dtype, 2.0) for s in ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d)))
    sl = slopes_for(rng, b, hq, True)
    o, lse = run_kernel(KT, q, k, v, kv_chunk=split, causal=True, softcap=2.5, slopes=sl)
    ref_o, ref_lse = R.attention(values(q), values(k), values(v), causal=True, softcap=2.5,
                                 alibi_slopes=sl, return_lse=True)
    if split is None:
        rule(values(o), ref_o, lowp(q, k, v, True, 1 / 4, 2.5, sl, dtype), f"seed {seed}")
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-4, err_msg=f"seed {seed}")
    else:  # each partial: attention over its own range of keys, normalised
        full = R.scores(values(q), values(k), 0.25, 2.5, sl)[0]
        full = np.where(R.visible(sq, sk, True), full, -np.inf)
        for z in range(-(-sk // split)):
            keys = slice(z * split, min(sk, (z + 1) * split))
            s = full[..., keys]
            m = s.max(-1)
            seen = ~np.isneginf(m)
            p = np.exp(s[seen] - m[seen][:, None])
            ref_l = m[seen] + np.log(p.sum(-1))
            ref_o = (p / p.sum(-1, keepdims=True))[:, None, :] @ values(v)[0][:, keys][
                np.nonzero(seen)[0]]
            np.testing.assert_allclose(lse[z][seen], ref_l, rtol=1e-5, atol=1e-4,
                                       err_msg=f"seed {seed}")
            np.testing.assert_allclose(o[z][seen], ref_o[:, 0], err_msg=f"seed {seed}",
                                       **TOL[np.dtype(dtype)])


# --- the public functions ---------------------------------------------------------------
@pytest.mark.parametrize("num_splits", [None, 1, 2])
def test_attention_api(num_splits):
    """Few rows per K/V head (decoding) take split_forward, more one pass; inputs kept."""
    rng, seed = fresh()
    q, k, v = (random(rng, s, F32, 2.0) for s in ((2, 4, 3, 8), (2, 2, 19, 8), (2, 2, 19, 8)))
    sl = slopes_for(rng, 2, 4, True)
    before = [x.copy() for x in (q, k, v, sl)]
    o, lse = ns.attention(q, k, v, softcap=4.0, alibi_slopes=sl, return_lse=True,
                          num_splits=num_splits, window=(5, 2))
    ref_o, ref_lse = R.attention(q, k, v, softcap=4.0, alibi_slopes=sl, return_lse=True,
                                 window=(5, 2))
    check(o, lse, ref_o, ref_lse, F32, f"seed {seed}")
    assert all(np.array_equal(a, b) for a, b in zip(before, (q, k, v, sl))), "inputs modified"


def test_off_is_the_plain_kernel():
    """softcap 0 or None and no slopes: bit for bit the result without the options."""
    rng, _ = fresh()
    q, k, v = (random(rng, (1, 2, 9, 8), F16) for _ in range(3))
    plain = ns.attention(q, k, v, causal=True)
    assert np.array_equal(ns.attention(q, k, v, causal=True, softcap=0, alibi_slopes=None), plain)
    assert np.array_equal(ns.attention(q, k, v, causal=True, softcap=None), plain)


def test_attention_varlen():
    rng, seed = fresh()
    cu_q, cu_k = np.array([0, 3, 3, 8], np.int32), np.array([0, 6, 9, 20], np.int32)
    q, k, v = (random(rng, s, F32, 2.0) for s in ((8, 2, 8), (20, 1, 8), (20, 1, 8)))
    sl = slopes_for(rng, 3, 2, True)
    o, lse = ns.attention_varlen(q, k, v, cu_q, cu_k, causal=True, softcap=2.0,
                                 alibi_slopes=sl, return_lse=True)
    ref_o, ref_lse = R.attention_varlen(q, k, v, cu_q, cu_k, causal=True, softcap=2.0,
                                        alibi_slopes=sl, return_lse=True)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=f"seed {seed}")
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=2e-5, err_msg=f"seed {seed}")


# --- bad input --------------------------------------------------------------------------
def _qkv():
    return (np.zeros((2, 4, 3, 8), np.float32), np.zeros((2, 2, 5, 8), np.float32),
            np.zeros((2, 2, 5, 8), np.float32))


@pytest.mark.parametrize("value,error", [(-1.0, ValueError), (math.nan, ValueError),
                                         (math.inf, ValueError), (True, TypeError),
                                         ("50", TypeError)])
def test_bad_softcap(value, error):
    with pytest.raises(error, match="softcap"):
        ns.attention(*_qkv(), softcap=value)


@pytest.mark.parametrize("slopes,error", [
    (np.ones(4, np.float64), TypeError), (np.ones(3, np.float32), ValueError),
    (np.ones((1, 4), np.float32), ValueError), (np.ones((2, 4, 1), np.float32), ValueError),
    (np.array([1, np.nan, 1, 1], np.float32), ValueError), ([1.0, 1.0, 1.0, 1.0], TypeError)])
def test_bad_alibi_slopes(slopes, error):
    with pytest.raises(error, match="alibi_slopes"):
        ns.attention(*_qkv(), alibi_slopes=slopes)


# --- the property ------------------------------------------------------------------------
@st.composite
def problems(draw):
    hkv = draw(st.integers(1, 2))
    return dict(dtype=draw(st.sampled_from([F32, F16])), b=draw(st.integers(1, 2)), hkv=hkv,
                hq=hkv * draw(st.integers(1, 2)), sq=draw(st.integers(1, sized(9, 70))),
                sk=draw(st.integers(0, sized(24, 300))), d=draw(st.sampled_from([1, 5, 8, 16])),
                causal=draw(st.booleans()), softcap=draw(st.sampled_from([None, 0.5, 5.0, 50.0])),
                alibi=draw(st.sampled_from([None, "per_head", "per_batch"])),
                num_splits=draw(st.sampled_from([None, 1, 3])),
                seed=draw(st.integers(0, 2**32 - 1)))


@given(p=problems())
def test_property(p):
    """Irregular shapes, empty key sets, GQA, causal, splits: against float64, and fp16
    by flash-attn's rule."""
    rng = np.random.default_rng(p["seed"])
    b, hq, hkv, sq, sk, d, dtype = (p[n] for n in ("b", "hq", "hkv", "sq", "sk", "d", "dtype"))
    q, k, v = (random(rng, s, dtype, 3.0) for s in ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d)))
    sl = None if p["alibi"] is None else slopes_for(rng, b, hq, p["alibi"] == "per_batch")
    kw = dict(causal=p["causal"], softcap=p["softcap"], alibi_slopes=sl)
    o, lse = ns.attention(q, k, v, return_lse=True, num_splits=p["num_splits"], **kw)
    ref_o, ref_lse = R.attention(q, k, v, return_lse=True, softcap=p["softcap"] or 0.0,
                                 causal=p["causal"], alibi_slopes=sl)
    if dtype == F32:
        check(o, lse, ref_o, ref_lse, F32, str(p))
    else:
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), str(p)
        low = lowp(q, k, v, p["causal"], 1 / math.sqrt(d), p["softcap"], sl, dtype)
        rule(values(o), ref_o, low, str(p))
