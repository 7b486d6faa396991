"""The warp-level tensor-core primitives of :mod:`numba_softmax.kernels.hw.mma`, one warp each,
against NumPy: the fragment layout drawn in the module docstring, element by element.

On the simulator these run the lane-level emulation; on a GPU the inline PTX — the same
test checks that both agree with the picture.
"""

import numba
import numpy as np
import pytest
from numba import cuda

from numba_softmax.kernels.hw import jit
from numba_softmax.kernels.hw import mma as M

F16, BF16 = np.dtype(np.float16), np.dtype(np.uint16)


def fresh():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def bf16_bits(x):
    """float32 → bfloat16 bits, round to nearest even (finite values)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def rounded(x, storage):
    """float32 values as the tensor cores see them after pack_*x2."""
    x = np.asarray(x, np.float32)
    return x.astype(np.float16).astype(np.float64) if storage == F16 else \
        bf16_values(bf16_bits(x)).astype(np.float64)


def _mma_kernel(storage):
    mma, pack = M.for_dtype(storage)

    @jit.kernel
    def k(a, b, c, d, words):
        lane = cuda.threadIdx.x
        g, t = lane >> 2, lane & 3
        af = cuda.local.array((2, 4), numba.uint32)
        cf = cuda.local.array((1, 4), numba.float32)
        for r in range(4):  # A: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8)
            row, col = g + 8 * (r & 1), 2 * t + 8 * (r >> 1)
            af[1, r] = pack(a[row, col], a[row, col + 1])
            cf[0, r] = c[g + 8 * (r >> 1), 2 * t + (r & 1)]  # C: c0 c1 (row g), c2 c3 (g+8)
            words[lane, r] = af[1, r]
        b0 = pack(b[2 * t, g], b[2 * t + 1, g])
        b1 = pack(b[2 * t + 8, g], b[2 * t + 9, g])
        mma(cf, 0, af, 1, b0, b1)
        for r in range(4):
            d[g + 8 * (r >> 1), 2 * t + (r & 1)] = cf[0, r]

    return k


@pytest.mark.parametrize("storage", [F16, BF16])
def test_mma_m16n8k16(storage):
    rng, seed = fresh()
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    d = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    words = cuda.to_device(np.zeros((32, 4), np.uint32))
    _mma_kernel(storage)[1, 32](a, b, c, d, words)
    want = rounded(a, storage) @ rounded(b, storage) + c
    np.testing.assert_allclose(d.copy_to_host(), want, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    # pack: two float32 → the two 16-bit values, the lower column in the lower half
    w = words.copy_to_host()
    lo = (w & 0xFFFF).astype(np.uint16)
    want_lo = np.array([[a[(l >> 2) + 8 * (r & 1), 2 * (l & 3) + 8 * (r >> 1)] for r in range(4)]
                        for l in range(32)], np.float32)
    bits = want_lo.astype(np.float16).view(np.uint16) if storage == F16 else bf16_bits(want_lo)
    assert np.array_equal(lo, bits), f"seed {seed}"


@pytest.mark.parametrize("storage", [F16, BF16])
def test_mma_infinities_and_nan_follow_ieee(storage):
    """inf − inf in a dot product is NaN, inf + finite is inf, NaN spreads — as the tensor
    cores compute them.  (The emulation summed with math.fsum, which *raises* on inf − inf:
    one lane failed, and its warp waited for it forever in the next shuffle.)"""
    rng, seed = fresh()
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = np.abs(rng.standard_normal((16, 8))).astype(np.float32) + 0.5  # all positive
    c = np.zeros((16, 8), np.float32)
    a[0, 0], a[0, 1] = np.inf, -np.inf  # row 0: inf − inf → NaN
    a[1, 3] = np.inf  # row 1: inf
    a[2, 5] = -np.inf  # row 2: −inf
    a[3, 7] = np.nan  # row 3: NaN
    d = cuda.to_device(np.zeros((16, 8), np.float32))
    words = cuda.to_device(np.zeros((32, 4), np.uint32))
    _mma_kernel(storage)[1, 32](a, b, c, d, words)
    with np.errstate(invalid="ignore"):
        want = rounded(a, storage) @ rounded(b, storage) + c
    got = d.copy_to_host()
    assert np.isnan(got[0]).all() and np.isnan(got[3]).all(), f"seed {seed}"
    assert (got[1] == np.inf).all() and (got[2] == -np.inf).all(), f"seed {seed}"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=f"seed {seed}")


@jit.kernel
def _ldmatrix_kernel(src, plain, trans, copied, stride):
    lane = cuda.threadIdx.x
    smem = cuda.shared.array(0, numba.uint16)
    for r in range(lane, src.shape[0], 32):  # cp.async: row r (16 bytes), zeros for odd rows
        M.cp_async16(smem, r * stride, src, r, 0, r % 2 == 0)
    M.cp_async_commit()
    M.cp_async_wait_all()
    cuda.syncthreads()  # every lane's copies have landed
    for r in range(src.shape[0]):
        for e in range(8):
            copied[r, e] = smem[r * stride + e]
    cuda.syncthreads()  # read before the rows are rewritten
    for i in range(lane, src.shape[0] * 8, 32):  # now the whole source, as 16-bit values
        smem[(i // 8) * stride + i % 8] = src[i // 8, i % 8]
    cuda.syncthreads()  # the tiles are complete before ldmatrix reads them
    r0, r1, r2, r3 = M.ldmatrix_x4(smem, lane * stride)  # lane L: row L % 8 of tile L // 8
    plain[lane, 0], plain[lane, 1], plain[lane, 2], plain[lane, 3] = r0, r1, r2, r3
    r0, r1, r2, r3 = M.ldmatrix_x4_trans(smem, lane * stride)
    trans[lane, 0], trans[lane, 1], trans[lane, 2], trans[lane, 3] = r0, r1, r2, r3


def test_ldmatrix_and_cp_async():
    rng, seed = fresh()
    stride = 24  # 16-byte rows, padded: ldmatrix needs only 16-byte aligned row addresses
    src = rng.integers(0, 2**16, size=(32, 8), dtype=np.uint16)  # four 8×8 tiles
    plain, trans = (cuda.to_device(np.zeros((32, 4), np.uint32)) for _ in range(2))
    copied = cuda.to_device(np.full((32, 8), 7, np.uint16))
    _ldmatrix_kernel[1, 32, 0, 2 * 32 * stride](src, plain, trans, copied, stride)
    want = src.copy()
    want[1::2] = 0  # not ok: zero-filled
    assert np.array_equal(copied.copy_to_host(), want), f"seed {seed}"
    w = src.astype(np.uint32)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    for r in range(4):  # register r: tile r (rows 8r … 8r+7)
        p = w[8 * r + g, 2 * t] | (w[8 * r + g, 2 * t + 1] << 16)  # (row g, cols 2t, 2t+1)
        q = w[8 * r + 2 * t, g] | (w[8 * r + 2 * t + 1, g] << 16)  # (rows 2t, 2t+1, col g)
        assert np.array_equal(plain.copy_to_host()[:, r], p), f"tile {r}, seed {seed}"
        assert np.array_equal(trans.copy_to_host()[:, r], q), f"tile {r} (.trans), seed {seed}"


@jit.kernel
def _max_kernel(x, y, out):
    i = cuda.threadIdx.x
    out[i] = M.max_nan(x[i], y[i])


def test_max_nan_keeps_nan_on_either_side():
    x = np.array([1, np.nan, 2, -np.inf, np.nan, -np.inf], np.float32)
    y = np.array([np.nan, 1, 3, -np.inf, np.nan, 5], np.float32)
    out = cuda.to_device(np.zeros(6, np.float32))
    _max_kernel[1, 6](x, y, out)
    np.testing.assert_array_equal(out.copy_to_host(), [np.nan, np.nan, 3, -np.inf, np.nan, 5])


@jit.kernel
def _store_and_add_kernel(words, halves, acc):
    lane = cuda.threadIdx.x
    smem = cuda.shared.array(0, numba.uint16)
    M.st_shared_b32(smem, 2 * lane, words[lane])  # one 4-byte store: two 16-bit halves
    cuda.syncthreads()  # every lane's word is stored before any is read back
    halves[2 * lane], halves[2 * lane + 1] = smem[2 * lane], smem[2 * lane + 1]
    for rep in range(4):  # 32 lanes × 4 adds land on the same two floats: atomic
        M.red_add_v2(acc, 0, 0, 0, 2 * (lane % 2), numba.float32(1.0), numba.float32(0.5))


def test_st_shared_b32_and_red_add_v2():
    """The 32-bit store puts the lower half first; the paired add is atomic per float."""
    rng, seed = fresh()
    words = rng.integers(0, 2**32, size=32, dtype=np.uint64).astype(np.uint32)
    halves = cuda.to_device(np.zeros(64, np.uint16))
    acc = cuda.to_device(np.zeros((1, 1, 1, 4), np.float32))
    _store_and_add_kernel[1, 32, 0, 128](words, halves, acc)
    want = np.stack([words & 0xFFFF, words >> 16], axis=1).reshape(-1).astype(np.uint16)
    assert np.array_equal(halves.copy_to_host(), want), f"seed {seed}"
    np.testing.assert_array_equal(acc.copy_to_host()[0, 0, 0], [64, 32, 64, 32])


def test_for_dtype_refuses_other_types():
    assert M.for_dtype(np.float16)[0] is M.mma_f16
    assert M.for_dtype(np.uint16)[0] is M.mma_bf16 and M.for_dtype("bfloat16")[1] is M.pack_bf16x2
    with pytest.raises(TypeError, match="float32"):
        M.for_dtype(np.float32)
