"""The 16-byte moves of float16 and bfloat16 rows: one load or store of four 32-bit words.

NVPTX splits a vector of eight 16-bit values into two 8-byte accesses, so these rows move
as words (:func:`numba_softmax.kernels.hw.vector.words`) and are unpacked in registers: the
softmax chunks' ``row_io`` and top-k's ``loads``.  Each is checked here against the values
themselves, bit for bit, over whole vectors, a ragged last vector and the place past the
row's end (the pad), in a row view whose stride is longer than the row.
"""

import math

import numpy as np
import pytest
from numba import cuda

from numba_softmax.kernels.hw import jit, vector
from numba_softmax.kernels.topk import topk_stream
from numba_softmax.kernels.rows import vector_chunk

W = 8
STRIDE, N = 24, 21  # vectors at 0 and 8 whole, at 16 ragged (5 values), at 24 past the end


def storage(dtype, rng, cols=STRIDE):
    """(storage array of 2 × cols, its values as float32): bfloat16 as uint16 bits."""
    values = rng.standard_normal((2, cols)).astype(np.float32) * 4
    values[1, 3], values[0, 17] = -np.inf, np.inf
    if dtype == "float32":
        return values, values
    if dtype == "bfloat16":
        bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # (truncated: exact values)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32)
    x = values.astype(np.float16)
    return x, x.astype(np.float32)


def kind(dtype):
    """The dtype the kernels are built for: bfloat16 arrives as its uint16 bits."""
    return np.dtype(np.uint16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_row_io_moves_16_bit_vectors_as_words(dtype):
    load_row, store_row = vector.row_io(W, kind(dtype))
    x, values = storage(dtype, np.random.default_rng(0))
    pad = np.float32(-7.5)

    @jit.kernel
    def through(x, y, seen):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x  # thread t: the vector at t·W
        v = cuda.local.array(W, np.float32)
        load_row(x, row, t * W, x.shape[1], v, 0, pad)
        for k in range(W):
            seen[row, t * W + k] = v[k]
        store_row(y, row, t * W, y.shape[1], v, 0)

    xd = cuda.to_device(x)[:, :N]
    y = np.full((2, STRIDE), 0x7FC0 if dtype == "bfloat16" else np.nan, x.dtype)
    yd = cuda.to_device(y)
    seen = cuda.to_device(np.zeros((2, 4 * W), np.float32))
    through[2, 4](xd, yd[:, :N], seen)
    got = seen.copy_to_host()
    np.testing.assert_array_equal(got[:, :N], values[:, :N])  # every value, exactly
    assert (got[:, N:] == pad).all()  # past the row's end: the pad
    out = yd.copy_to_host()
    np.testing.assert_array_equal(out[:, :N].view(np.uint16), x[:, :N].view(np.uint16))
    np.testing.assert_array_equal(out[:, N:].view(np.uint16), y[:, N:].view(np.uint16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_topk_holds_16_bit_vectors_as_words(dtype):
    fetch, value, held, slots, pad = topk_stream.loads(kind(dtype), 2 * W, W)
    assert slots == W  # 16 values in 8 words

    @jit.kernel
    def hold(x, seen):
        row, t, team = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        h = cuda.local.array(slots, held)  # thread t: the vectors at t·W, (t + team)·W
        fetch(x, row, 0, x.shape[1], t, team, h, pad)
        for i in range(2):
            for k in range(W):
                seen[row, (t + team * i) * W + k] = value(h, i * W + k)

    x, values = storage(dtype, np.random.default_rng(1))
    seen = cuda.to_device(np.zeros((2, 4 * W), np.float32))
    hold[2, 2](cuda.to_device(x)[:, :N], seen)  # a ragged chunk: vector by vector
    got = seen.copy_to_host()
    np.testing.assert_array_equal(got[:, :N], values[:, :N])
    assert (got[:, N:] == -math.inf).all()  # past the end: −inf, which weighs nothing
    seen = cuda.to_device(np.zeros((2, 4 * W), np.float32))
    hold[2, 1](cuda.to_device(x)[:, :2 * W], seen)  # a whole chunk (one thread): one address
    np.testing.assert_array_equal(seen.copy_to_host()[:, :2 * W], values[:, :2 * W])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_chunk_moves_from_one_address(dtype):
    """vector_chunk.converted: thread t's vectors at t·W and (t + 2)·W of each row, in
    and back out, bit for bit, through a row view whose stride is longer than the row."""
    w = vector.width_for(np.float32 if dtype == "float32" else np.float16)
    load, store = vector_chunk.converted(w, kind(dtype), 2 * w)
    x, values = storage(dtype, np.random.default_rng(2), 6 * w)
    vpt = 2 * w  # (a local array's shape must be a constant of its own)

    @jit.kernel
    def through(x, y, seen):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        v = cuda.local.array(vpt, np.float32)
        load(x, row, t * w, 2 * w, v)
        for i in range(2):
            for k in range(w):
                seen[row, (t + 2 * i) * w + k] = v[i * w + k]
        store(y, row, t * w, 2 * w, v)

    xd = cuda.to_device(x)[:, :4 * w]
    yd = cuda.to_device(np.zeros_like(x))
    seen = cuda.to_device(np.zeros((2, 4 * w), np.float32))
    through[2, 2](xd, yd[:, :4 * w], seen)
    np.testing.assert_array_equal(seen.copy_to_host(), values[:, :4 * w])
    out = yd.copy_to_host()
    np.testing.assert_array_equal(out[:, :4 * w].view(np.uint8), x[:, :4 * w].view(np.uint8))
    assert not out[:, 4 * w:].any()  # nothing written past the chunk
