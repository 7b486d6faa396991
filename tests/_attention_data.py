"""Test data for the attention kernels: fresh seeds, poisoned outputs, bfloat16 bits,
random paged caches, the one comparison against the float64 references, and flash-attn's
rule for low precision (a plain same-precision implementation, and the bound it sets)."""

import numpy as np
from numba import cuda

from numba_softmax import reference as R

F16, F32, BF16 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.uint16)
# |device − float64 reference|: float32 accumulates in float32 (fast exp); float16 and
# bfloat16 accumulate in float32 too and round the output (half an ulp: 2⁻¹¹, 2⁻⁸ of |O|)
TOL = {F32: dict(rtol=1e-4, atol=2e-5), F16: dict(rtol=4e-3, atol=2e-3),
       BF16: dict(rtol=1.6e-2, atol=1.6e-2)}
LSE_TOL = {F32: dict(rtol=1e-5, atol=2e-5), F16: dict(rtol=1e-5, atol=1e-4),
           BF16: dict(rtol=1e-5, atol=1e-4)}


def fresh():
    """A generator on a fresh seed, and the seed (for the failure message)."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def poisoned(shape, dtype):
    """A device array of NaN (bfloat16: NaN bits): a value the kernel forgot shows."""
    if np.dtype(dtype) == BF16:
        return cuda.to_device(np.full(shape, 0x7FC0, np.uint16))
    return cuda.to_device(np.full(shape, np.nan, dtype=dtype))


def to_bf16(x):
    """float32 values → bfloat16 bits (uint16), rounded to nearest even."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits):
    """bfloat16 bits (uint16) → float32."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def values(x):
    """The numbers an array holds (bfloat16 bits decoded), as float64."""
    x = np.asarray(x)
    return (from_bf16(x) if x.dtype == BF16 else x).astype(np.float64)


def random(rng, shape, dtype, spread=1.0):
    """Standard normal values stored as ``dtype`` (uint16: bfloat16 bits)."""
    x = (spread * rng.standard_normal(shape)).astype(np.float32)
    return to_bf16(x) if np.dtype(dtype) == BF16 else x.astype(dtype)


def check(o, lse, ref_o, ref_lse, dtype, msg=""):
    """o, lse (host) against float64 references: no NaN, rows that see no key O = 0 and
    LSE = −inf exactly, the rest within the dtype's tolerance."""
    o = values(o)
    assert not np.isnan(o).any(), f"NaN in the output {msg}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), f"rows that see no key: LSE must be -inf {msg}"
    assert np.all(o[empty] == 0), f"rows that see no key: O must be 0 {msg}"
    np.testing.assert_allclose(o, ref_o, err_msg=msg, **TOL[np.dtype(dtype)])
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], err_msg=msg, **LSE_TOL[np.dtype(dtype)])


def paged_cache(rng, lengths, block_size, hkv, d, dv, dtype, shared_prefix=0, spare=3):
    """A random block pool and a shuffled block table for sequences of ``lengths``:
    the first ``shared_prefix`` blocks of every sequence are the same blocks (a shared
    prompt); unused table entries are −1.  Returns k_cache, v_cache, table, lengths."""
    per_seq = [-(-int(n) // block_size) + 1 for n in lengths]  # one block of room each
    n_blocks = shared_prefix + sum(p - min(p, shared_prefix) for p in per_seq) + spare
    order = rng.permutation(n_blocks)
    prefix, rest = list(order[:shared_prefix]), list(order[shared_prefix:])
    table = np.full((len(lengths), max(per_seq)), -1, np.int32)
    for b, p in enumerate(per_seq):
        own = [rest.pop() for _ in range(p - min(p, shared_prefix))]
        table[b, :p] = (prefix[:p] + own)[:p]
    k_cache = random(rng, (n_blocks, block_size, hkv, d), dtype)
    v_cache = random(rng, (n_blocks, block_size, hkv, dv), dtype)
    return k_cache, v_cache, table, np.asarray(lengths, np.int32)


def lowp(q, k, v, causal, scale, softcap, slopes, dtype):
    """A plain implementation in the storage precision (flash-attn's ``upcast=False``
    reference): every intermediate — S, the capped S, S + bias, P, P V — rounded to it."""
    rnd = (lambda x: values(to_bf16(x))) if np.dtype(dtype) == BF16 else (
        lambda x: np.asarray(x, np.float32).astype(dtype).astype(np.float64))
    q, k, v = (values(x) for x in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = rnd(rnd(q @ np.swapaxes(k, -1, -2)) * scale)
    if softcap:
        s = rnd(softcap * np.tanh(s / softcap))
    sq, sk = s.shape[-2:]
    if slopes is not None:
        dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :])
        s = rnd(s - rnd(slopes.astype(np.float64)[..., None, None] * dist))
    s = np.where(R.visible(sq, sk, causal), s, -np.inf)
    m = s.max(-1, keepdims=True) if sk else np.zeros(s.shape[:-1] + (1,))
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    p = rnd(np.where(den > 0, e / np.where(den > 0, den, 1), 0))
    return rnd(p @ v)


def rule(o, ref, low, msg):
    """flash-attn's rule: |o − ref| <= 2·|low − ref| (+ a floor for exact cases)."""
    assert not np.isnan(o).any(), f"NaN in the output {msg}"
    err, base = np.max(np.abs(o - ref), initial=0), np.max(np.abs(low - ref), initial=0)
    assert err <= 2 * base + 1e-5, f"error {err:.3g} > 2 × {base:.3g} + 1e-5 {msg}"
