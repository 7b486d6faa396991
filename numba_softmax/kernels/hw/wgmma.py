"""Warpgroup matrix multiply (sm_90a): ``wgmma.mma_async`` m64nNk16, its descriptors, fences.

A *warpgroup* is 4 consecutive warps (128 threads, the first warp's rank a multiple of 4).
One ``wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}`` makes them compute
D = A·Bᵀ + D together: A is 64×16, B is N×16 (N = 8 … 256, a multiple of 8; "K-major":
each row of B is one column of the product, its 16 k-values contiguous), D is 64×N
float32, held in the threads' registers — each thread holds N/2 of them.  A is read from
shared memory through a *matrix descriptor* (:func:`wgmma_ss`) or from registers
(:func:`wgmma_rs`); B always comes from shared memory.  Numba asks NVVM for ``sm_90a`` on
a compute-capability-9.0 device, which is what lets this inline PTX exist at all.

Who holds D (warp w = rank in the warpgroup, g = lane >> 2, t = lane % 4) — each warp
holds 16 rows, and inside them the n8 pattern of ``mma.sync`` (:mod:`.mma`) repeats
N/8 times::

                cols 8j+2t  8j+2t+1      j = 0 … N/8−1
    row 16w+g       d[4j]   d[4j+1]
    row 16w+g+8     d[4j+2] d[4j+3]

      warp 0: rows  0…15    ┌ n: 0 1 │ 2 3 │ 4 5 │ 6 7 │ 8 9 … ┐
      warp 1: rows 16…31    │ T0     │ T1  │ T2  │ T3  │ T0  … │  row 16w+0  (and +8)
      warp 2: rows 32…47    │ T4     │ T5  │ T6  │ T7  │ T4  … │  row 16w+1
      warp 3: rows 48…63    │ …  T28 … T31 for row 16w+7          d[4j…4j+3]: block j

A from registers (:func:`wgmma_rs`): warp w's four registers are exactly the A fragment
of ``mma.sync`` m16n8k16 for rows 16w … 16w+15 (drawn in :mod:`.mma`) — an accumulator
of an earlier wgmma, packed to 16 bits, feeds the next one without touching memory.

**The 128-byte swizzle.**  Shared memory is 32 banks of 4 bytes; a tile stored row after
row puts a column of 16-byte chunks in one bank group.  The 128-byte swizzle stores
row r's 16-byte chunk c at chunk c ⊕ (r mod 8) — on byte addresses,
``addr ^ ((addr >> 7) & 7) << 4`` — so eight rows' chunk c fall in eight different bank
groups.  A swizzle *atom* is 8 rows × 128 bytes (64 fp16) = 1024 bytes::

    byte   0    16   32   48   64   80   96  112
    row 0  c0   c1   c2   c3   c4   c5   c6   c7
    row 1  c1   c0   c3   c2   c5   c4   c7   c6
    row 2  c2   c3   c0   c1   c6   c7   c4   c5
    …
    row 7  c7   c6   c5   c4   c3   c2   c1   c0      (cell: which chunk of the row is here)

The hardware swizzles the *absolute* address, so a swizzled tile starts on a 1024-byte
boundary (``cuda.shared.array(…, alignment=TILE_ALIGN)``), and the k-th k16 slice of a 64-wide
tile is the same descriptor with its start 32·k bytes further (:func:`advance`).

**The descriptor** (64 bits; addresses and offsets in units of 16 bytes)::

    bits  0–13  start address >> 4     bits 32–45  stride byte offset (SBO) >> 4
    bits 16–29  leading byte offset >> 4 bits 49–51  base offset (0: atom-aligned start)
    bits 62–63  layout: 0 none, 1 128-byte swizzle, 2 64-byte, 3 32-byte

K-major with a swizzle: SBO = bytes from one 8-row group to the next (1024 for a dense
64-wide tile), LBO unused (1).  Without one: 8×8 core matrices of 128 contiguous bytes,
LBO = bytes between core matrices adjacent in k, SBO = … adjacent in rows.

**N-major B** (``trans_b=True``, the instruction's ``imm-trans-b``; 128-byte swizzle
only here): B stored k-row after k-row, its N values contiguous — a V tile as it lies in
memory, (keys, Dv) — in blocks of 64 columns: row k of block b at byte
``b·LBO + k·128``, swizzled as above.  The two offsets swap roles: SBO = bytes from one
group of 8 k-rows to the next (1024), LBO = bytes from one 64-column block to the next;
a k16 step is 16 rows, 2048 bytes further.

The names (``c`` is a ``cuda.local.array(N // 2, float32)``; see ``example_kernel``)::

    descriptor(smem, i, lbo, sbo, layout)  uint64 for the tile at uint16 smem[i]
    address(smem, i)                       the shared-memory byte address of smem[i]
                                           (to align a dynamic array's tiles to 1024)
    encode(address, lbo, sbo, layout)      the same from a byte address (host and device)
    advance(desc, nbytes)                  the descriptor nbytes further (nbytes % 16 == 0)
    swizzle(addr) / swizzle128(r, k)       the 128-byte swizzle; the uint16 index of (r, k)
                                           in a dense 64-wide swizzled tile
    wgmma_ss(n, kind[, trans_b])(c, da, db, scale_d)  c += A·Bᵀ (scale_d 0: c = A·Bᵀ),
                                           kind f16 | bf16; trans_b: B N-major
    wgmma_rs(n, kind[, trans_b])(c, a, ai, db, scale_d)  A from a[ai, 0:4] (packed pairs)
    wgmma_fence(), wgmma_commit(), wgmma_wait(n)
                                           order register accesses before a wgmma; close a
                                           group; (build time) the waiter for ≤ n groups
    setmaxnreg_inc(n) / setmaxnreg_dec(n)  (build time) a warpgroup's register budget

Under the CUDA simulator (:mod:`._wgmma_sim`) a descriptor is an int that also carries its
array, and each thread computes its own N/2 outputs from shared memory as the map says,
rounding each once to float32 — one kernel source in both places.
Source: PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"
(register fragments, shared-memory matrix layouts, matrix descriptor).
"""

import numpy as np
from numba import cuda, float32, uint16, uint64

from ...runtime.sim import simulator_enabled
from .jit import device, kernel

SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B = 0, 1, 2, 3
# what a swizzled tile's cuda.shared.array takes as ``alignment`` (the simulator takes none)
TILE_ALIGN = None if simulator_enabled() else 1024
WIDTH = {SWIZZLE_128B: 128, SWIZZLE_64B: 64, SWIZZLE_32B: 32}  # bytes a swizzled row


def encode(address, lbo, sbo, layout):
    """The 64-bit descriptor of a tile at shared byte ``address`` (a multiple of 16)."""
    return (uint64((address & 0x3FFFF) >> 4) | (uint64((lbo >> 4) & 0x3FFF) << uint64(16))
            | (uint64((sbo >> 4) & 0x3FFF) << uint64(32)) | (uint64(layout & 3) << uint64(62)))


def swizzle(addr, width=128):
    """A byte address under the ``width``-byte swizzle: 16-byte chunk bits ⊕ row bits."""
    return addr ^ (((addr >> 7) & (width // 16 - 1)) << 4)


def _swizzle128(r, k):
    """The uint16 index of element (r, k) of a dense 64-wide tile, 128-byte swizzled."""
    return r * 64 + ((((k >> 3) ^ (r & 7)) << 3) | (k & 7))


if simulator_enabled():
    from ._wgmma_sim import (  # noqa: F401
        address,
        advance,
        descriptor,
        setmaxnreg_dec,
        setmaxnreg_inc,
        wgmma_commit,
        wgmma_fence,
        wgmma_rs,
        wgmma_ss,
        wgmma_wait,
    )
    swizzle128 = _swizzle128
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .mma import array_item, inline_asm, plain_asm, shared_address

    _F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    swizzle128 = device(_swizzle128)
    _encode = device(encode)

    @intrinsic
    def _smem_address(typingctx, smem, i):
        def codegen(context, builder, sig, args):
            return shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])

        return types.uint32(smem, i), codegen

    address = _smem_address

    @device
    def descriptor(smem, i, lbo, sbo, layout):
        return _encode(_smem_address(smem, i), lbo, sbo, layout)

    @device
    def advance(desc, nbytes):
        return desc + uint64(nbytes >> 4)

    def _wgmma(n, kind, a_regs, trans_b):
        m = n // 2  # accumulator registers a thread
        d = ",".join(f"${r}" for r in range(m))
        a = "{" + ",".join(f"${m + r}" for r in range(4)) + "}" if a_regs else f"${m}"
        b, p = (m + 4, m + 5) if a_regs else (m + 1, m + 2)
        tb = int(bool(trans_b))  # imm-trans-b: 1 reads B N-major
        tail = f"p, 1, 1, {tb};" if a_regs else f"p, 1, 1, 0, {tb};"
        text = (f"{{ .reg .pred p; setp.ne.b32 p, ${p}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
                f"{{{d}}}, {a}, ${b}, {tail} }}")
        cons = ",".join(["=f"] * m + (["r"] * 4 if a_regs else ["l"]) + ["l", "r"]
                        + [str(r) for r in range(m)])

        def codegen(context, builder, sig, args):
            ct = sig.args[0]
            cp = [array_item(context, builder, ct, args[0], [r]) for r in range(m)]
            if a_regs:
                at, ait = sig.args[1], sig.args[2]
                ops = [builder.load(array_item(context, builder, at, args[1], [(args[2], ait), r]))
                       for r in range(4)]
                rest = args[3:], sig.args[3:]
            else:
                ops = [context.cast(builder, args[1], sig.args[1], types.uint64)]
                rest = args[2:], sig.args[2:]
            ops.append(context.cast(builder, rest[0][0], rest[1][0], types.uint64))
            ops.append(context.cast(builder, rest[0][1], rest[1][1], types.int32))
            ops += [builder.load(q) for q in cp]
            out = inline_asm(builder, ir.LiteralStructType([_F32] * m), ops, text,
                             cons + ",~{memory}", side_effect=True)
            for r in range(m):
                builder.store(builder.extract_value(out, r), cp[r])
            return context.get_dummy_value()

        if a_regs:
            @intrinsic
            def wgmma(typingctx, c, a, ai, db, scale_d):
                return types.void(c, a, ai, db, scale_d), codegen
        else:
            @intrinsic
            def wgmma(typingctx, c, da, db, scale_d):
                return types.void(c, da, db, scale_d), codegen
        return wgmma

    _MADE = {}

    def _made(key, build):
        if key not in _MADE:
            _MADE[key] = build()
        return _MADE[key]

    def _check(n, kind):
        if n % 8 or not 8 <= n <= 256 or kind not in ("f16", "bf16"):
            raise ValueError(f"wgmma m64nNk16 takes N = 8 … 256 (a multiple of 8) and kind "
                             f"f16 or bf16, got n={n}, kind={kind!r}")

    def wgmma_ss(n, kind, trans_b=False):
        """The m64n{n}k16 wgmma with A and B from shared memory (one function per n, kind,
        B's major-ness)."""
        _check(n, kind)
        return _made(("ss", n, kind, bool(trans_b)), lambda: _wgmma(n, kind, False, trans_b))

    def wgmma_rs(n, kind, trans_b=False):
        """The m64n{n}k16 wgmma with A from registers, B from shared memory."""
        _check(n, kind)
        return _made(("rs", n, kind, bool(trans_b)), lambda: _wgmma(n, kind, True, trans_b))

    wgmma_fence = plain_asm("wgmma.fence.sync.aligned;")
    wgmma_commit = plain_asm("wgmma.commit_group.sync.aligned;")

    def wgmma_wait(n):
        """``wgmma.wait_group.sync.aligned n``: at most n groups still in flight."""
        return _made(("wait", n), lambda: plain_asm(f"wgmma.wait_group.sync.aligned {int(n)};"))

    def _setmaxnreg(how, n):
        if n % 8 or not 24 <= n <= 256:
            raise ValueError(f"setmaxnreg takes a multiple of 8 in 24 … 256, got {n}")
        return _made((how, n), lambda: plain_asm(f"setmaxnreg.{how}.sync.aligned.u32 {n};"))

    def setmaxnreg_inc(n):
        """``setmaxnreg.inc``: the calling warpgroup may use up to n registers a thread."""
        return _setmaxnreg("inc", n)

    def setmaxnreg_dec(n):
        """``setmaxnreg.dec``: the calling warpgroup gives its registers above n back."""
        return _setmaxnreg("dec", n)


def example_kernel(n, kind, ksteps=4, regs=0, trans_b=False):
    """One warpgroup: D (64×n float32) = A (64×16·ksteps) · B (n×16·ksteps)ᵀ, A and B given
    as uint16 bits, staged in 128-byte swizzled shared tiles and multiplied by ``ksteps``
    wgmmas of one group (first raising its registers to ``regs`` with ``setmaxnreg``, if
    given; ``trans_b``: B staged N-major, 64 k-rows of each 64-column block).  The tests'
    and compile check's kernel; the pattern to copy."""
    if not 1 <= ksteps <= 4:
        raise ValueError(f"ksteps is 1 … 4 (one 64-wide swizzled tile), got {ksteps}")
    from .tma import fence_proxy_async

    mma, wait = wgmma_ss(n, kind, trans_b), wgmma_wait(0)
    grow = setmaxnreg_inc(regs) if regs else wgmma_fence  # (a fence: harmless)
    half, kk, a_size = n // 2, 16 * ksteps, 64 * 64  # (shapes: constants)
    b_size = -(-n // 64) * 64 * 64 if trans_b else n * 64
    # B's descriptor: K-major, 8-row groups 1024 bytes apart, k16 steps 32 bytes on; N-major,
    # 64-column blocks 8 KiB apart (LBO), 8-k-row groups 1024 (SBO), k16 steps 2048 bytes on
    b_lbo, b_step = (64 * 64 * 2, 2048) if trans_b else (16, 32)

    @kernel
    def k(a, b, d):
        sa = cuda.shared.array(a_size, uint16, alignment=TILE_ALIGN)
        sb = cuda.shared.array(b_size, uint16, alignment=TILE_ALIGN)
        grow()
        tid = cuda.threadIdx.x
        for idx in range(tid, 64 * 64, 128):
            r, c = idx // 64, idx % 64
            sa[swizzle128(r, c)] = a[r, c] if c < kk else uint16(0)
        for idx in range(tid, n * 64, 128):
            r, c = idx // 64, idx % 64  # B[r, c]: column r of the product, k = c
            x = b[r, c] if c < kk else uint16(0)
            if trans_b:  # k-row c of r's 64-column block
                sb[(r >> 6) * 4096 + swizzle128(c, r & 63)] = x
            else:
                sb[swizzle128(r, c)] = x
        cuda.syncthreads()
        fence_proxy_async()  # the threads' stores, seen by the tensor cores' reads
        acc = cuda.local.array(half, float32)
        for j in range(half):
            acc[j] = float32(0)
        da = descriptor(sa, 0, 16, 1024, SWIZZLE_128B)
        db = descriptor(sb, 0, b_lbo, 1024, SWIZZLE_128B)
        wgmma_fence()
        for s in range(ksteps):
            mma(acc, advance(da, 32 * s), advance(db, b_step * s), 1)
        wgmma_commit()
        wait()
        w, lane = tid // 32, tid % 32
        g, t = lane >> 2, lane & 3
        for j in range(half):
            d[16 * w + g + 8 * ((j & 3) >> 1), 8 * (j >> 2) + 2 * t + (j & 1)] = acc[j]

    return k


def reference_tile(m):
    """A (rows, 64) matrix as a dense 128-byte swizzled tile (host side, any dtype)."""
    m = np.asarray(m)
    out = np.zeros(m.shape[0] * 64, m.dtype)
    r, k = np.indices(m.shape)
    out[_swizzle128(r, k)] = m
    return out
