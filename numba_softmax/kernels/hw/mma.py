"""Warp-level matrix multiply on tensor cores: ``mma.sync`` m16n8k16, ``ldmatrix``, ``cp.async``.

Numba has no tensor-core API, so this module emits the PTX instructions itself, each in a
small ``@intrinsic`` (llvmlite inline assembly).  One instruction,
``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32``, makes the 32 lanes
of a warp compute D = A·B + C together: A is 16×16, B is 16×8 (fp16 or bf16), C and D are
16×8 float32 — 4096 flops per instruction.  No lane holds a whole matrix: each holds a
*fragment*, a few registers at places fixed by the ISA.  With g = lane >> 2 (the lane's
"group", 0…7) and t = lane % 4 (its place in the quad)::

    A (16×16, 4 regs, two halves each)       B (16×8, 2 regs)        C, D (16×8 float32, 4 regs)
                 k: 0 … 7    8 … 15                  n = g                       n: 2t  2t+1
    row g        a0 ▮▮       a2 ▮▮          k 2t,2t+1     b0             row g      c0   c1
    row g+8      a1 ▮▮       a3 ▮▮          k 2t+8,2t+9   b1             row g+8    c2   c3
                 (▮▮ = columns 2t, 2t+1)

    which lane holds C:   cols 0,1  2,3  4,5  6,7
                 row 0    T0    T1   T2   T3       rows 0…7:  c0, c1
                 row 1    T4    T5   T6   T7       rows 8…15: c2, c3 (same lanes)
                 …
                 row 7    T28   T29  T30  T31

A register of A or B packs two 16-bit values, the lower column (A) or row (B) in the
lower half: :func:`pack_f16x2` / :func:`pack_bf16x2` make one from two float32.  A row's
C values sit in the 4 lanes of one quad, so a row max or a row sum is 2 shuffles
(xor 1, xor 2).  And two adjacent n8 accumulator tiles *are* one k16 A fragment::

    S tile 2j  (cols 16j … 16j+7)      S tile 2j+1 (cols 16j+8 … 16j+15)
    row g:   c0 c1                     c0 c1            → a0 = pack(c0, c1)ⱼ,  a2 = pack(c0, c1)ⱼ₊₁
    row g+8: c2 c3                     c2 c3            → a1 = pack(c2, c3)ⱼ,  a3 = pack(c2, c3)ⱼ₊₁

— which is why FlashAttention-2's P = exp(S − m) never leaves the registers: the lane
that computed a score holds exactly the P value it feeds back as the A operand of P·V.

The names, and what they do (fragments live in ``cuda.local.array``\\ s indexed by
compile-time constants only, so that they stay in registers):

    mma_f16(c, ci, a, ai, b0, b1)   c[ci, 0:4] += A·B; A from a[ai, 0:4], B from (b0, b1)
    mma_bf16(...)                   the same with bfloat16 operands
    pack_f16x2(lo, hi)              two float32 → one uint32 of two fp16 (round to nearest)
    pack_bf16x2(lo, hi)             … two bfloat16
    ldmatrix_x4(smem, i)            4 regs: 8×8 tiles of 16-bit values from shared memory;
                                    lane L gives the row address i of row L % 8 of tile L // 8;
                                    register r receives tile r's (row g, cols 2t, 2t+1)
    ldmatrix_x4_trans(smem, i)      the same, transposed: register r receives tile r's
                                    (rows 2t, 2t+1, col g) — a B fragment of a row-major V
    cp_async16(smem, i, src, row, col, ok)
                                    smem[i : i+8] ← src[row, col : col+8] (16 bytes,
                                    asynchronously), or eight zeros when not ``ok``; the
                                    L2 fetches the whole 128-byte line at once (``L2::128B``:
                                    a small gain in split-KV decoding's read rate,
                                    docs/algorithms/decode.md; ``L2::256B`` gained nothing)
    cp_async_commit(), cp_async_wait_all()
                                    close a group of copies; wait until all have landed
    cp_async_wait(n)                (a build-time call) the function that waits until at
                                    most n of the thread's groups are still in flight
    max_nan(a, b)                   :func:`numba_softmax.combine.larger` (a NaN wins) in one
                                    instruction, ``max.NaN.f32``, instead of four
    st_shared_b32(smem, i, w)       smem[i], smem[i+1] ← the two halves of the uint32 w
                                    (one 4-byte store; i even)
    red_add_v2(a, i, j, r, c, x, y) a[i, j, r, c] += x and a[i, j, r, c+1] += y, atomically,
                                    in one ``red.global.add.v2.f32`` (a float32, 8-byte aligned)
    red_add_v4(a, i, j, r, c, v, o) a[i, j, r, c + e] += v[o + e], e < 4, in one
                                    ``red.global.add.v4.f32`` (16-byte aligned; sm_90)

``smem`` is a uint16 shared array (the 16-bit values' bits); ``ldmatrix`` needs each row
16-byte aligned, ``cp_async16`` needs 16-byte aligned source and destination.

Under the CUDA simulator the same names are a lane-level emulation (:mod:`._mma_sim`):
each lane posts its registers through :func:`numba_softmax.runtime.sim.warp_exchange`, and each
computes its own fragment of the result from the operands rounded exactly to fp16/bf16,
accumulating in float32 — so the kernels that use them are one source in both places.
Source: PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix".
"""

from ...runtime.sim import simulator_enabled

if simulator_enabled():
    from ...combine import larger as max_nan  # noqa: F401
    from ._mma_sim import (
        cp_async16,
        cp_async_commit,
        cp_async_wait,
        cp_async_wait_all,
        ldmatrix_x4,
        ldmatrix_x4_trans,
        mma_bf16,
        mma_f16,
        pack_bf16x2,
        pack_f16x2,
        red_add_v2,
        red_add_v4,
        st_shared_b32,
    )
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    _F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def inline_asm(builder, ret, args, text, constraints, side_effect=False):
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), args)

    def array_item(context, builder, arr_type, arr, indices):
        """Pointer to arr[indices] (indices: (llvm value, numba type) or int constants)."""
        ary = context.make_array(arr_type)(context, builder, value=arr)
        idx = [ir.Constant(ir.IntType(64), i) if isinstance(i, int)
               else context.cast(builder, i[0], i[1], types.intp) for i in indices]
        return cgutils.get_item_pointer(context, builder, arr_type, ary, idx, wraparound=False)

    def _address(builder, ptr, space, bits):
        """A generic pointer as a ``bits``-wide address in state space ``space``
        (3: shared, 32 bits; 1: global, 64 bits)."""
        cast = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, space))
        return builder.ptrtoint(cast, ir.IntType(bits))

    def shared_address(context, builder, arr_type, arr, i, i_type):
        """The 32-bit shared-memory address of arr[i], computed in 32 bits (base + 2·i):
        constant parts of i become the instruction's immediate offset."""
        ary = context.make_array(arr_type)(context, builder, value=arr)
        base = _address(builder, ary.data, 3, 32)
        i32 = builder.trunc(context.cast(builder, i, i_type, types.intp), _I32)
        size = ir.Constant(_I32, context.get_abi_sizeof(context.get_data_type(arr_type.dtype)))
        return builder.add(base, builder.mul(i32, size))

    def _mma(kind):
        text = (f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")

        @intrinsic
        def mma(typingctx, c, ci, a, ai, b0, b1):
            def codegen(context, builder, sig, args):
                ct, cit, at, ait, _, _ = sig.args
                cp = [array_item(context, builder, ct, args[0], [(args[1], cit), r]) for r in range(4)]
                ap = [array_item(context, builder, at, args[2], [(args[3], ait), r]) for r in range(4)]
                ops = [builder.load(p) for p in ap] + [args[4], args[5]]
                ops += [builder.load(p) for p in cp]
                d = inline_asm(builder, ir.LiteralStructType([_F32] * 4), ops, text,
                         "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3")
                for r in range(4):
                    builder.store(builder.extract_value(d, r), cp[r])
                return context.get_dummy_value()

            return types.void(c, ci, a, ai, types.uint32, types.uint32), codegen

        return mma

    mma_f16, mma_bf16 = _mma("f16"), _mma("bf16")

    def _pack(kind):
        @intrinsic
        def pack(typingctx, lo, hi):
            def codegen(context, builder, sig, args):
                lo_, hi_ = (context.cast(builder, v, t, types.float32)
                            for v, t in zip(args, sig.args))
                # cvt.rn.f16x2.f32 d, a, b puts a in the upper half, b in the lower
                return inline_asm(builder, _I32, [hi_, lo_], f"cvt.rn.{kind}x2.f32 $0, $1, $2;",
                            "=r,f,f")

            return types.uint32(lo, hi), codegen

        return pack

    pack_f16x2, pack_bf16x2 = _pack("f16"), _pack("bf16")

    def _ldmatrix(trans):
        text = (f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 "
                "{$0,$1,$2,$3}, [$4];")

        @intrinsic
        def ldmatrix(typingctx, smem, i):
            def codegen(context, builder, sig, args):
                addr = shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                # volatile, with a memory clobber: it must not move across a barrier
                d = inline_asm(builder, ir.LiteralStructType([_I32] * 4), [addr], text,
                         "=r,=r,=r,=r,r,~{memory}", side_effect=True)
                return context.make_tuple(builder, sig.return_type,
                                          [builder.extract_value(d, r) for r in range(4)])

            return types.UniTuple(types.uint32, 4)(smem, i), codegen

        return ldmatrix

    ldmatrix_x4, ldmatrix_x4_trans = _ldmatrix(False), _ldmatrix(True)

    @intrinsic
    def cp_async16(typingctx, smem, i, src, row, col, ok):
        def codegen(context, builder, sig, args):
            st, it, srct, rt, colt, okt = sig.args
            dst = shared_address(context, builder, st, args[0], args[1], it)
            ptr = array_item(context, builder, srct, args[2], [(args[3], rt), (args[4], colt)])
            ok_ = context.cast(builder, args[5], okt, types.boolean)
            size = builder.select(ok_, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            # src-size 0: nothing is read, the 16 bytes are zero-filled
            inline_asm(builder, ir.VoidType(),
                 [dst, _address(builder, ptr, 1, 64), size],
                 "cp.async.cg.shared.global.L2::128B [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                 side_effect=True)
            return context.get_dummy_value()

        return types.void(smem, i, src, row, col, ok), codegen

    def plain_asm(text):
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, sig, args):
                inline_asm(builder, ir.VoidType(), [], text, "~{memory}", side_effect=True)
                return context.get_dummy_value()

            return types.void(), codegen

        return op

    @intrinsic
    def max_nan(typingctx, a, b):
        def codegen(context, builder, sig, args):
            a_, b_ = (context.cast(builder, x, t, types.float32) for x, t in zip(args, sig.args))
            return inline_asm(builder, _F32, [a_, b_], "max.NaN.f32 $0, $1, $2;", "=f,f,f")

        return types.float32(a, b), codegen

    @intrinsic
    def st_shared_b32(typingctx, smem, i, word):
        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            w = context.cast(builder, args[2], sig.args[2], types.uint32)
            inline_asm(builder, ir.VoidType(), [addr, w], "st.shared.b32 [$0], $1;", "r,r,~{memory}",
                 side_effect=True)
            return context.get_dummy_value()

        return types.void(smem, i, word), codegen

    @intrinsic
    def red_add_v2(typingctx, arr, i, j, r, c, x, y):
        def codegen(context, builder, sig, args):
            ptr = array_item(context, builder, sig.args[0], args[0],
                        [(args[n], sig.args[n]) for n in range(1, 5)])
            xs = [context.cast(builder, args[n], sig.args[n], types.float32) for n in (5, 6)]
            inline_asm(builder, ir.VoidType(), [_address(builder, ptr, 1, 64)] + xs,
                 "red.relaxed.gpu.global.add.v2.f32 [$0], {$1, $2};", "l,f,f,~{memory}",
                 side_effect=True)
            return context.get_dummy_value()

        return types.void(arr, i, j, r, c, x, y), codegen

    @intrinsic
    def red_add_v4(typingctx, arr, i, j, r, c, v, o):
        def codegen(context, builder, sig, args):
            ptr = array_item(context, builder, sig.args[0], args[0],
                        [(args[n], sig.args[n]) for n in range(1, 5)])
            vt, ot = sig.args[5], sig.args[6]
            local = context.make_array(vt)(context, builder, value=args[5])
            base = context.cast(builder, args[6], ot, types.intp)
            xs = []
            for e in range(4):
                at = builder.add(base, ir.Constant(base.type, e))
                slot = cgutils.get_item_pointer(context, builder, vt, local, [at], wraparound=False)
                xs.append(context.cast(builder, builder.load(slot), vt.dtype, types.float32))
            inline_asm(builder, ir.VoidType(), [_address(builder, ptr, 1, 64)] + xs,
                 "red.relaxed.gpu.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
                 "l,f,f,f,f,~{memory}", side_effect=True)
            return context.get_dummy_value()

        return types.void(arr, i, j, r, c, v, o), codegen

    cp_async_commit = plain_asm("cp.async.commit_group;")
    cp_async_wait_all = plain_asm("cp.async.wait_group 0;")
    _WAITS = {0: cp_async_wait_all}

    def cp_async_wait(n):
        """``cp.async.wait_group n`` (n is part of the instruction: one function per n)."""
        if n not in _WAITS:
            _WAITS[n] = plain_asm(f"cp.async.wait_group {int(n)};")
        return _WAITS[n]


def for_dtype(dtype):
    """(mma, pack) for a storage dtype: fp16, or uint16 (= bfloat16 bits)."""
    from .jit import BFLOAT16, storage

    kind = storage(dtype)
    if kind == BFLOAT16:
        return mma_bf16, pack_bf16x2
    if kind == "float16":
        return mma_f16, pack_f16x2
    raise TypeError(f"tensor-core kernels take float16 or bfloat16 (uint16) arrays, got {dtype}")
