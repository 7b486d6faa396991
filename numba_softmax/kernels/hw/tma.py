"""The Tensor Memory Accelerator (sm_90): 2-D tile loads to shared memory, ``mbarrier``\\ s.

One thread issues ``cp.async.bulk.tensor.2d``: the copy engine moves a whole box (rows ×
cols of a 2-D global array, described by a *tensor map*) into shared memory, filling
what lies outside the array with zeros, optionally 128-byte swizzled (:mod:`.wgmma`
draws the swizzle) — no thread holds any of it.  Completion is counted in bytes on an
``mbarrier``, a 64-bit shared-memory object::

    mbarrier word:  phase bit │ pending arrivals │ expected arrivals │ transaction bytes

    producer (one thread)                       consumers (all threads)
    arrive_expect_tx(bar, i, box bytes) ──┐      wait(bar, i, phase)  … spins
    tma_load_2d(smem, j, tmap, col, row,  │
                bar, i)  ── copy engine ──┴─► bytes arrive: tx → 0, arrivals → 0
                                              ⇒ the phase completes: phase bit flips,
                                                pending arrivals ← expected; waiters go

A phase completes when every expected arrival has arrived *and* every expected byte has
landed; ``try_wait.parity(p)`` is true once the phase of parity p is over, so a consumer
of a ring of stages waits with parity 0, 1, 0, 1, … on each stage's barrier.

**The tensor map.**  ``encode_tiled(array, box_rows, box_cols, swizzle)`` asks the driver
(``cuda.bindings.driver.cuTensorMapEncodeTiled``) for the 128-byte opaque map and returns
it as 16 uint64 words on the host; the kernel takes them as a ``uint64[16]`` device array.
CUDA C++ passes the map by value as a ``const __grid_constant__`` parameter
(``.param .align 64 .b8 [128]``) and takes its address in the parameter space; Numba
cannot: it flattens every argument into scalar parameters (a tuple of 16 uint64 becomes
16 parameters, a NumPy record is copied to device memory and passed by pointer) and has
no way to mark a parameter ``__grid_constant__`` or align it to 64 bytes.  So the map
lives in global memory (a device allocation: 256-byte aligned), which the PTX ISA allows
for the tensor-map operand; since it was written through another proxy, the kernel
makes it visible to the copy engine first with ``fence.proxy.tensormap::generic.acquire``
(:func:`tensormap_acquire`, once a block; ``prefetch.tensormap`` warms its cache line).

The names (``bar``: a uint64 shared array; ``smem``: a uint16 shared array, 1024-byte
aligned when swizzled; ``tmap``: the uint64[16] device array)::

    mbarrier_init(bar, i, count)            expect ``count`` arrivals a phase
    arrive_expect_tx(bar, i, nbytes)        arrive, and expect nbytes more this phase
    arrive(bar, i)                          arrive
    try_wait(bar, i, parity) -> bool        has the phase of this parity completed?
    wait(bar, i, parity)                    spin until it has
    tma_load_2d(smem, j, tmap, col, row, bar, i)
                                            smem[j …] ← the box at (row, col)
    tma_load_3d(smem, j, tmap, col, row, plane, bar, i)
                                            the same in plane ``plane`` of a 3-D array's
                                            map (box depth 1: rows past the plane's
                                            last are zeros, not the next plane's)
    tma_load_4d(smem, j, tmap, col, row, h, b, bar, i)
                                            the same in plane [b, h] of a 4-D array's
                                            map: (B, H, S, D) attention inputs with any
                                            strides a map takes, a model's transposed
                                            (B, S, H, D) views among them
    fence_proxy_async()                     this thread's shared-memory writes, visible to
                                            the async proxy (wgmma, TMA stores)
    tensormap_acquire(tmap), prefetch_tensormap(tmap)

Under the simulator (:mod:`._tma_sim`) the map's words name a registered host array,
the copy happens when issued (zero fill and swizzle included) and completes its bytes on
the barrier, whose state lives in the same 64-bit word — same kernel source.
Source: PTX ISA, "Tensor Copy" (cp.async.bulk.tensor), "mbarrier", "Tensor-map".
"""

import numpy as np
from numba import cuda, uint16, uint64

from ...runtime.sim import simulator_enabled

NONE, SWIZZLE_128B = 0, 1
_DTYPES = {np.dtype(np.float16): "FLOAT16", np.dtype(np.uint16): "BFLOAT16",
           np.dtype(np.float32): "FLOAT32"}


def check_box(array, box_rows, box_cols, swizzle):
    dtype = np.dtype(array.dtype)
    if dtype not in _DTYPES or len(array.shape) not in (2, 3, 4):
        raise TypeError(f"array: a 2-D, 3-D or 4-D float16, uint16 (bfloat16 bits) or float32 "
                        f"array, got {dtype} with shape {array.shape}")
    if not (1 <= box_rows <= 256 and 1 <= box_cols <= 256):
        raise ValueError(f"box_rows, box_cols: 1 … 256, got {box_rows}, {box_cols}")
    if (box_cols * dtype.itemsize) % 16:
        raise ValueError(f"box_cols: a row of the box is a multiple of 16 bytes, got {box_cols}")
    if swizzle == SWIZZLE_128B and box_cols * dtype.itemsize != 128:
        raise ValueError("swizzle: the 128-byte swizzle takes rows of exactly 128 bytes")
    if swizzle not in (NONE, SWIZZLE_128B):
        raise ValueError(f"swizzle: NONE or SWIZZLE_128B, got {swizzle}")


def pitches_of(array):
    """The byte strides a tensor map takes for ``array``, innermost first, leaving out the
    values' own: a ValueError unless each value is next to the last in its row and every
    other stride is a positive multiple of 16 bytes.  A dimension of extent 1 is never
    stepped along, so its stride (which frameworks leave arbitrary) is written as 16."""
    size = np.dtype(array.dtype).itemsize
    pitches = [16 if n == 1 else s for n, s in zip(array.shape[:-1], array.strides[:-1])]
    if array.strides[-1] != size or any(p % 16 or p <= 0 for p in pitches):
        raise ValueError(f"array: rows of contiguous values and other strides positive "
                         f"multiples of 16 bytes, got strides {array.strides}")
    return pitches[::-1]


if simulator_enabled():
    from ._tma_sim import (  # noqa: F401
        arrive,
        arrive_expect_tx,
        encode_tiled,
        fence_proxy_async,
        mbarrier_init,
        prefetch_tensormap,
        tensormap_acquire,
        tma_load_2d,
        tma_load_3d,
        tma_load_4d,
        try_wait,
        wait,
    )
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .mma import array_item, inline_asm, plain_asm, shared_address

    _I32, _I64 = ir.IntType(32), ir.IntType(64)

    def _bar_op(text, extra, ret=None):
        """An intrinsic f(bar, i, *extra) whose asm gets the barrier's address as $0 (or $1
        after a result), then the extra operands as uint32 values."""
        def make(typingctx, bar, i, *rest):
            def codegen(context, builder, sig, args):
                addr = shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                ops = [addr] + [context.cast(builder, a, t, types.uint32)
                                for a, t in zip(args[2:], sig.args[2:])]
                cons = ",".join((["=r"] if ret else []) + ["r"] * len(ops)) + ",~{memory}"
                out = inline_asm(builder, _I32 if ret else ir.VoidType(), ops, text, cons,
                                 side_effect=True)
                if ret:
                    return builder.icmp_unsigned("!=", out, ir.Constant(_I32, 0))
                return context.get_dummy_value()

            return (types.boolean if ret else types.void)(bar, i, *rest), codegen

        if extra == 0:
            return intrinsic(lambda typingctx, bar, i: make(typingctx, bar, i))
        return intrinsic(lambda typingctx, bar, i, x: make(typingctx, bar, i, x))

    mbarrier_init = _bar_op("mbarrier.init.shared::cta.b64 [$0], $1;", 1)
    arrive_expect_tx = _bar_op("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", 1)
    arrive = _bar_op("mbarrier.arrive.shared::cta.b64 _, [$0];", 0)
    try_wait = _bar_op("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                       "selp.u32 $0, 1, 0, p; }", 1, ret=True)
    # the loop in the asm: labels inside { } are local to the block, so copies may repeat
    wait = _bar_op("{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1; "
                   "@!p bra WAIT; }", 1)

    def _tma_load(rank):
        """``cp.async.bulk.tensor`` of a ``rank``-D map as an intrinsic
        f(smem, j, tmap, *coords, bar, i): ``rank`` coordinates, innermost first."""
        regs = ", ".join(f"${n}" for n in range(2, 2 + rank))
        text = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile"
                f".mbarrier::complete_tx::bytes [$0], [$1, {{{regs}}}], [${2 + rank}];")
        cons = "r,l," + "r," * rank + "r,~{memory}"
        bar_at = 3 + rank  # the barrier array's argument; its index follows

        def make(typingctx, smem, j, tmap, *rest):
            def codegen(context, builder, sig, args):
                dst = shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                mp = builder.ptrtoint(array_item(context, builder, sig.args[2], args[2], [0]),
                                      _I64)  # the map's generic address
                coords = [builder.trunc(context.cast(builder, args[n], sig.args[n], types.int64),
                                        _I32) for n in range(3, bar_at)]
                b = shared_address(context, builder, sig.args[bar_at], args[bar_at],
                                   args[bar_at + 1], sig.args[bar_at + 1])
                inline_asm(builder, ir.VoidType(), [dst, mp] + coords + [b], text, cons,
                           side_effect=True)
                return context.get_dummy_value()

            return types.void(smem, j, tmap, *rest), codegen

        # Numba types a starred parameter as one tuple: each rank spells its own out
        if rank == 2:
            return intrinsic(lambda typingctx, smem, j, tmap, x, y, bar, i:
                             make(typingctx, smem, j, tmap, x, y, bar, i))
        if rank == 3:
            return intrinsic(lambda typingctx, smem, j, tmap, x, y, z, bar, i:
                             make(typingctx, smem, j, tmap, x, y, z, bar, i))
        return intrinsic(lambda typingctx, smem, j, tmap, x, y, z, w, bar, i:
                         make(typingctx, smem, j, tmap, x, y, z, w, bar, i))

    tma_load_2d, tma_load_3d, tma_load_4d = _tma_load(2), _tma_load(3), _tma_load(4)

    def _map_op(text):
        @intrinsic
        def op(typingctx, tmap):
            def codegen(context, builder, sig, args):
                mp = builder.ptrtoint(array_item(context, builder, sig.args[0], args[0], [0]), _I64)
                inline_asm(builder, ir.VoidType(), [mp], text, "l,~{memory}", side_effect=True)
                return context.get_dummy_value()

            return types.void(tmap), codegen

        return op

    tensormap_acquire = _map_op("fence.proxy.tensormap::generic.acquire.gpu [$0], 128;")
    prefetch_tensormap = _map_op("prefetch.tensormap [$0];")  # (generic addresses)
    fence_proxy_async = plain_asm("fence.proxy.async.shared::cta;")

    def encode_tiled(array, box_rows, box_cols, swizzle=NONE):
        """The tensor map of ``box_rows`` × ``box_cols`` boxes of the 2-D device ``array``
        (row stride a multiple of 16 bytes), or of one plane of a 3-D or 4-D one (the
        leading dimensions' strides multiples of 16 bytes too, in any order:
        :func:`pitches_of`), as 16 uint64 words: copy them to the device.  Keep a load's
        first column a multiple of 16 bytes as well: a box of fp16 starting at column 20
        (40 bytes), three rows above the array, stopped the GPU with an illegal
        instruction (the kernels here load at multiples of 64)."""
        import ctypes

        from cuda.bindings import driver as drv

        check_box(array, box_rows, box_cols, swizzle)
        dtype, pitches = np.dtype(array.dtype), pitches_of(array)
        rows, cols = array.shape[-2:]
        dims = [cols, rows] + list(array.shape[:-2])[::-1]  # innermost first
        box = [box_cols, box_rows] + [1] * (array.ndim - 2)
        kind = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_DTYPES[dtype]}")
        sw = (drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle == SWIZZLE_128B
              else drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE)
        u32, u64 = drv.cuuint32_t, drv.cuuint64_t  # the bindings take these, not ints
        err, tmap = drv.cuTensorMapEncodeTiled(
            kind, array.ndim, array.__cuda_array_interface__["data"][0],
            [u64(x) for x in dims], [u64(x) for x in pitches], [u32(x) for x in box],
            [u32(1)] * array.ndim, drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            sw, drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # NONE: zeros
        if err != drv.CUresult.CUDA_SUCCESS:
            raise ValueError(f"cuTensorMapEncodeTiled: {err}")
        return np.frombuffer(ctypes.string_at(tmap.getPtr(), 128), np.uint64).copy()


def example_kernel(box_rows, box_cols, swizzle=NONE, rank=2):
    """One block: the box at (row, col) of the map's array — of its plane ``plane`` for a
    3-D array's map, of plane [batch, plane] for a 4-D one (``rank``) — lands in shared
    memory by TMA, the block waits on the mbarrier and copies it out to ``out`` (uint16
    bits, as stored: swizzled if the map swizzles).  The tests' and compile check's
    kernel: ``k(tmap, row, col, plane, batch, out)`` (what the rank has no use for, unread)."""
    from .jit import kernel
    from .wgmma import TILE_ALIGN

    size = box_rows * box_cols

    @kernel
    def k(tmap, row, col, plane, batch, out):
        tile = cuda.shared.array(size, uint16, alignment=TILE_ALIGN)
        bar = cuda.shared.array(1, uint64)
        tid = cuda.threadIdx.x
        if tid == 0:
            tensormap_acquire(tmap)
            mbarrier_init(bar, 0, 1)
        cuda.syncthreads()  # the barrier is initialised before anyone waits on it
        if tid == 0:
            arrive_expect_tx(bar, 0, size * 2)
            if rank == 4:
                tma_load_4d(tile, 0, tmap, col, row, plane, batch, bar, 0)
            elif rank == 3:
                tma_load_3d(tile, 0, tmap, col, row, plane, bar, 0)
            else:
                tma_load_2d(tile, 0, tmap, col, row, bar, 0)
        wait(bar, 0, 0)
        for idx in range(tid, size, cuda.blockDim.x):
            out[idx] = tile[idx]

    return k
