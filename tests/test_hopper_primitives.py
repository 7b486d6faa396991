"""The Hopper primitives of kernels/hw (wgmma, tma) against NumPy — on an sm_90 GPU, and
their simulator twins elsewhere — and the descriptor's bit fields and the swizzle against
their definitions."""

import numpy as np
import pytest
from numba import cuda, float32, uint16, uint32

from numba_softmax.kernels.hw import tma, wgmma
from numba_softmax.runtime.sim import simulator_enabled

from _helpers import hopper_or_simulator

sim_only = pytest.mark.skipif(not simulator_enabled(), reason="simulator twins")
hopper = pytest.mark.skipif(not hopper_or_simulator(),
                            reason="wgmma and TMA need sm_90 (or the simulator)")
ALIGN = wgmma.TILE_ALIGN  # a module global: a test's kernel takes it as a constant


def _operands(rng, rows, k, kind):
    x = rng.standard_normal((rows, k)).astype(np.float32)
    if kind == "f16":
        x = x.astype(np.float16)
        return x.astype(np.float64), x.view(np.uint16)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16: truncation is exact enough
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64), bits


def test_descriptor_bits_by_hand():
    # start 0x400 (>>4 = 0x40), LBO 16 (1), SBO 1024 (0x40), 128-byte swizzle (1 << 62)
    assert int(wgmma.encode(0x400, 16, 1024, wgmma.SWIZZLE_128B)) == \
        0x40 | (1 << 16) | (0x40 << 32) | (1 << 62)
    assert int(wgmma.encode(0x3FFF0, 128, 256, wgmma.SWIZZLE_NONE)) == 0x3FFF | (8 << 16) | (16 << 32)
    assert int(wgmma.encode(0x40010, 0, 0, wgmma.SWIZZLE_32B)) == 1 | (3 << 62)  # 18-bit window


def test_swizzle_is_the_layouts_definition():
    for addr in range(0, 4096, 2):
        row, chunk = (addr >> 7) & 7, (addr >> 4) & 7
        want = (addr & ~0x70) | ((chunk ^ row) << 4)
        assert wgmma.swizzle(addr) == want
    atom = [wgmma.swizzle(a) for a in range(0, 1024, 16)]
    assert sorted(atom) == list(range(0, 1024, 16))  # a permutation of each atom's chunks
    for r in range(16):
        for k in range(64):
            assert wgmma._swizzle128(r, k) * 2 == wgmma.swizzle(r * 128 + 2 * k)
    assert wgmma.swizzle(0x80 | 0x10) == 0x80  # row 1: chunks 0 and 1 trade places


@sim_only
def test_sim_descriptor_reads_the_swizzled_tile():
    from numba_softmax.kernels.hw._wgmma_sim import descriptor, element_address

    m = np.arange(16 * 64, dtype=np.uint16).reshape(16, 64)
    tile = wgmma.reference_tile(m)
    d = descriptor(tile, 0, 16, 1024, wgmma.SWIZZLE_128B)
    for step in range(4):
        dk = wgmma.reference_tile(m)  # (unchanged)
        for r in range(16):
            for k in range(16):
                at = element_address(d + 2 * step, r, k)
                assert dk[at // 2] == m[r, 16 * step + k]


@hopper
@pytest.mark.parametrize("n,kind,ksteps,trans_b", [
    (64, "f16", 1, False), (8, "bf16", 4, False), (16, "f16", 2, False), (64, "bf16", 4, False),
    (64, "f16", 4, True), (128, "bf16", 2, True), (16, "f16", 3, True)])
def test_wgmma_from_shared_memory(n, kind, ksteps, trans_b):
    rng = np.random.default_rng(n + ksteps)
    a, abits = _operands(rng, 64, 16 * ksteps, kind)
    b, bbits = _operands(rng, n, 16 * ksteps, kind)
    d = np.full((64, n), np.nan, np.float32)
    wgmma.example_kernel(n, kind, ksteps, 0, trans_b)[1, 128](abits, bbits, d)
    want = a @ b.T
    np.testing.assert_allclose(d, want, rtol=2e-6, atol=1e-5)


@hopper
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_wgmma_a_from_registers(kind):
    from numba_softmax.kernels.hw import mma

    n = 16
    mmaf, wait = wgmma.wgmma_rs(n, kind), wgmma.wgmma_wait(0)
    pack = mma.pack_f16x2 if kind == "f16" else mma.pack_bf16x2
    rng = np.random.default_rng(7)
    a, _ = _operands(rng, 64, 16, kind)
    b, bbits = _operands(rng, n, 16, kind)
    a32 = a.astype(np.float32)

    size, half = n * 64, n // 2  # compile-time constants for the arrays

    @cuda.jit
    def k(a, b, d):
        sb = cuda.shared.array(size, uint16, alignment=ALIGN)
        tid = cuda.threadIdx.x
        for idx in range(tid, n * 64, 128):
            r, c = idx // 64, idx % 64
            sb[wgmma.swizzle128(r, c)] = b[r, c] if c < 16 else uint16(0)
        cuda.syncthreads()
        w, lane = tid // 32, tid % 32
        g, t = lane >> 2, lane & 3
        frag = cuda.local.array((1, 4), uint32)
        for r in range(4):  # a0 (g, 2t) a1 (g+8, 2t) a2 (g, 2t+8) a3 (g+8, 2t+8)
            row, col = 16 * w + g + 8 * (r & 1), 2 * t + 8 * (r >> 1)
            frag[0, r] = pack(a[row, col], a[row, col + 1])
        acc = cuda.local.array(half, float32)
        for j in range(n // 2):
            acc[j] = float32(1)
        wgmma.wgmma_fence()
        mmaf(acc, frag, 0, wgmma.descriptor(sb, 0, 16, 1024, wgmma.SWIZZLE_128B), 1)
        wgmma.wgmma_commit()
        wait()
        for j in range(n // 2):
            d[16 * w + g + 8 * ((j & 3) >> 1), 8 * (j >> 2) + 2 * t + (j & 1)] = acc[j]

    d = np.zeros((64, n), np.float32)
    k[1, 128](a32, bbits, d)
    np.testing.assert_allclose(d, a @ b.T + 1.0, rtol=2e-6, atol=1e-5)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="n=12"):
        wgmma.wgmma_ss(12, "f16")
    with pytest.raises(ValueError, match="kind"):
        wgmma.wgmma_rs(64, "f32")
    with pytest.raises(ValueError, match="setmaxnreg"):
        wgmma.setmaxnreg_inc(250)
    with pytest.raises(TypeError, match="array"):
        tma.check_box(np.zeros((2, 2, 4, 4, 4), np.float16), 4, 8, tma.NONE)
    with pytest.raises(ValueError, match="box_cols"):
        tma.check_box(np.zeros((4, 4), np.float16), 4, 4, tma.NONE)


@hopper
@pytest.mark.parametrize("row,col,sw", [(0, 0, tma.NONE), (40, 56, tma.NONE),
                                        (-3, 24, tma.NONE), (8, 0, tma.SWIZZLE_128B),
                                        (50, 40, tma.SWIZZLE_128B)])
def test_tma_tile_load_zero_fills(row, col, sw):
    # 88 columns: TMA wants each row's stride a multiple of 16 bytes (176); a box's first
    # column a multiple of 16 bytes too (col 20, 40 bytes, stopped an H100 with an
    # illegal instruction, taking the process's context with it)
    src = (np.arange(60 * 88, dtype=np.float32).reshape(60, 88) % 2000 + 1).astype(np.float16)
    box_rows, box_cols = 16, 64
    dsrc = cuda.to_device(src)  # a map describes device memory
    tmap = tma.encode_tiled(dsrc, box_rows, box_cols, sw)
    out = np.zeros(box_rows * box_cols, np.uint16)
    tma.example_kernel(box_rows, box_cols, sw)[1, 64](tmap, row, col, 0, 0, out)
    want = np.zeros((box_rows, box_cols), np.float16)
    for r in range(box_rows):
        for c in range(box_cols):
            if 0 <= row + r < 60 and 0 <= col + c < 88:
                want[r, c] = src[row + r, col + c]
    got = out.reshape(box_rows, box_cols) if sw == tma.NONE else \
        out[wgmma._swizzle128(*np.indices((box_rows, box_cols)))]
    np.testing.assert_array_equal(got, want.view(np.uint16))
    assert (got != 0).any() and (row < 0 or col + box_cols > 88 or row + box_rows > 60) == \
        (got == 0).any()


@hopper
@pytest.mark.parametrize("plane,row", [(1, 0), (2, 20), (0, -5), (3, 0)])
def test_tma_3d_loads_one_plane_and_zero_fills_past_it(plane, row):
    src = (np.arange(3 * 30 * 64, dtype=np.float32).reshape(3, 30, 64) % 1999 + 1).astype(np.float16)
    dsrc = cuda.to_device(src)
    tmap = tma.encode_tiled(dsrc, 16, 64, tma.SWIZZLE_128B)
    out = np.zeros(16 * 64, np.uint16)
    tma.example_kernel(16, 64, tma.SWIZZLE_128B, rank=3)[1, 64](tmap, row, 0, plane, 0, out)
    want = np.zeros((16, 64), np.float16)
    for r in range(16):
        if 0 <= plane < 3 and 0 <= row + r < 30:  # not the next plane's rows
            want[r] = src[plane, row + r]
    got = out[wgmma._swizzle128(*np.indices((16, 64)))]
    np.testing.assert_array_equal(got, want.view(np.uint16))


@hopper
@pytest.mark.parametrize("h,b,row", [(1, 0, 0), (2, 1, 20), (0, 1, -5), (3, 0, 0), (0, 2, 0)])
def test_tma_4d_loads_a_transposed_view_plane_by_plane(h, b, row):
    """A model's (B, H, S, D) view of a (B, S, H, D) array — strides (S·H·D, D, H·D, 1):
    not in increasing order — loads plane [b, h] as it lies, zeros past its rows and
    past the heads and batches."""
    from _helpers import permuted

    src = (np.arange(2 * 30 * 3 * 64, dtype=np.float32).reshape(2, 30, 3, 64) % 1999
           + 1).astype(np.float16)  # (B, S, H, D)
    view = permuted(cuda.to_device(src), (0, 2, 1, 3))  # (B, H, S, D), no copy
    assert view.shape == (2, 3, 30, 64) and view.strides == (30 * 3 * 128, 128, 3 * 128, 2)
    tmap = tma.encode_tiled(view, 16, 64, tma.SWIZZLE_128B)
    out = np.zeros(16 * 64, np.uint16)
    tma.example_kernel(16, 64, tma.SWIZZLE_128B, rank=4)[1, 64](tmap, row, 0, h, b, out)
    want = np.zeros((16, 64), np.float16)
    for r in range(16):
        if b < 2 and h < 3 and 0 <= row + r < 30:
            want[r] = src[b, row + r, h]
    got = out[wgmma._swizzle128(*np.indices((16, 64)))]
    np.testing.assert_array_equal(got, want.view(np.uint16))


@pytest.mark.parametrize("shape,strides,takes", [
    ((2, 3, 30, 64), (30 * 3 * 128, 128, 3 * 128, 2), True),  # transposed heads
    ((1, 3, 30, 64), (7, 128, 3 * 128, 2), True),  # extent 1: its stride never used
    ((2, 3, 30, 64), (30 * 3 * 130, 130, 3 * 130, 2), False),  # rows 130 bytes apart
    ((2, 3, 30, 64), (30 * 3 * 256, 256, 3 * 256, 4), False),  # every other value
])
def test_pitches_of_takes_what_a_map_describes(shape, strides, takes):
    from numpy.lib.stride_tricks import as_strided

    from numba_softmax.kernels.hw import tma_maps

    a = as_strided(np.zeros(1 << 16, np.float16), shape, strides)
    if takes:
        assert tma.pitches_of(a)[-1] == (16 if shape[0] == 1 else strides[0])
        assert tma.pitches_of(a)[0] == strides[2]  # the row stride first
    else:
        with pytest.raises(ValueError, match="array: rows of contiguous values"):
            tma.pitches_of(a)
    assert tma_maps.takes(a) == takes
    if not takes:  # the first array a map cannot describe, named
        with pytest.raises(ValueError, match="^q: a tensor map"):
            tma_maps.mappable(k=np.zeros(shape, np.float16), q=a)


@sim_only
def test_mbarrier_phases_flip():
    from numba_softmax.kernels.hw import _tma_sim as s

    bar = np.zeros(2, np.uint64)
    s.mbarrier_init(bar, 1, 2)
    assert s.state(bar, 1) == (0, 0, 2, 2)
    assert not s.try_wait(bar, 1, 0)
    s.arrive_expect_tx(bar, 1, 256)  # one arrival, 256 bytes expected
    s.arrive(bar, 1)
    assert s.state(bar, 1) == (0, 256, 2, 0) and not s.try_wait(bar, 1, 0)
    s.complete_tx(bar, 1, 128)
    assert not s.try_wait(bar, 1, 0)
    s.complete_tx(bar, 1, 128)  # the last bytes: phase 0 completes
    assert s.state(bar, 1) == (1, 0, 2, 2)
    assert s.try_wait(bar, 1, 0) and not s.try_wait(bar, 1, 1)
    s.complete_tx(bar, 1, 64)  # bytes before their expect_tx: the count goes negative
    s.arrive_expect_tx(bar, 1, 64)
    s.arrive(bar, 1)
    assert s.state(bar, 1) == (0, 0, 2, 2) and s.try_wait(bar, 1, 1)
    assert bar[0] == 0  # the neighbour untouched
    s.arrive_expect_tx(bar, 1, 8)
    s.arrive(bar, 1)  # every arrival in, 8 bytes still on their way: the phase goes on
    assert s.state(bar, 1) == (0, 8, 2, 0)
    with pytest.raises(RuntimeError, match="more arrivals"):
        s.arrive(bar, 1)
