"""Vector loads and stores for attention tiles: one row chunk of a 4-D array, and shared memory.

Plain Numba indexing moves 4 bytes (or 2) per instruction.  The attention kernels move
tiles — rows of a (B, H, S, D) array, or of a paged cache (blocks, block_size, H, D) — and
want 16 bytes per instruction from global memory (``ld.global.v4``) and from shared memory
(``ld.shared.v4.f32``).  :mod:`.vector` does this for 2-D rows; this module does it for the
4-D arrays of attention and for a flat float32 shared-memory array:

    global_load(W)(x, i0, i1, i2, j, v, o)   v[o + k] = x[i0, i1, i2, j + k]   k < W
    global_store(W)(y, i0, i1, i2, j, v, o)  y[i0, i1, i2, j + k] = v[o + k]
    shared_load(W)(s, i, v, o)               v[o + k] = s[i + k]
    shared_store(W)(s, i, v, o)              s[i + k] = v[o + k]

``global_load`` converts each value to the element type of ``v``: float16 → float32 by
a cast, and a uint16 array (bfloat16 bits, see :mod:`.jit`) → float32 by putting the 16
bits on top of a zero float32.  With ``v`` of the array's own dtype it is a raw copy;
``global_store`` only copies raw (v of ``y``'s dtype).

The caller guarantees what the hardware needs (the host checks it before choosing W > 1):
unit stride along the last axis, every other stride a multiple of W, a 16-byte aligned
base, j % W == 0 and j + W within the row; for shared memory, i % W == 0 (the dynamic
shared array starts 16-byte aligned).  Indices are never wrapped (no negative-index
fix-up in the inner loops).  Under the CUDA simulator the same names are Python loops.
"""

import functools

import numpy as np

from ...runtime.sim import simulator_enabled

VECTOR_BYTES = 16


def widest(dtype, *extents):
    """The widest power-of-two W (16 bytes at most) dividing every extent (strides, row
    lengths, in elements) — the vector width a row access may use."""
    w = VECTOR_BYTES // np.dtype(dtype).itemsize
    while w > 1 and any(e % w for e in extents):
        w //= 2
    return w


def global_width(arrays, tail_lengths):
    """The vector width W every 4-D array of ``arrays`` allows for rows whose lengths are
    ``tail_lengths``: unit last stride, other strides multiples of W, aligned base."""
    itemsize = np.dtype(arrays[0].dtype).itemsize
    extents = list(tail_lengths)
    for a in arrays:
        shape, strides = tuple(a.shape), [s // itemsize for s in a.strides]
        if shape[-1] > 1 and strides[-1] != 1:
            return 1
        extents += [s for s, n in zip(strides[:-1], shape[:-1]) if n > 1]
        if not simulator_enabled() and a.__cuda_array_interface__["data"][0] % VECTOR_BYTES:
            return 1
    return widest(arrays[0].dtype, *extents)


if simulator_enabled():
    from ..hw.jit import bf16_to_f32

    @functools.cache
    def global_load(width):
        def load(x, i0, i1, i2, j, v, o):
            bf16 = x.dtype == np.uint16 and v.dtype != np.uint16
            for k in range(width):
                value = x[i0, i1, i2, j + k]
                v[o + k] = bf16_to_f32(value) if bf16 else value

        return load

    @functools.cache
    def global_store(width):
        def store(y, i0, i1, i2, j, v, o):
            for k in range(width):
                y[i0, i1, i2, j + k] = v[o + k]

        return store

    @functools.cache
    def shared_load(width):
        def load(s, i, v, o):
            for k in range(width):
                v[o + k] = s[i + k]

        return load

    @functools.cache
    def shared_store(width):
        def store(s, i, v, o):
            for k in range(width):
                s[i + k] = v[o + k]

        return store

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    GLOBAL, SHARED = 1, 3  # NVPTX address spaces

    def _item_pointer(context, builder, arr_type, arr, indices, index_types):
        ary = context.make_array(arr_type)(context, builder, value=arr)
        idx = [context.cast(builder, i, t, types.intp) for i, t in zip(indices, index_types)]
        return cgutils.get_item_pointer(context, builder, arr_type, ary, idx, wraparound=False)

    def _local_slot(context, builder, v_type, v, o, o_type, k):
        i = context.cast(builder, o, o_type, types.intp)
        i = builder.add(i, ir.Constant(i.type, k))
        return _item_pointer(context, builder, v_type, v, [i], [types.intp])

    def _convert(context, builder, value, src, dst):
        """One element from the array's type to the register's: bfloat16 bits (uint16)
        become the top half of a float32; everything else is an ordinary cast."""
        if src == types.uint16 and dst == types.float32:
            bits = builder.shl(builder.zext(value, ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
            return builder.bitcast(bits, ir.FloatType())
        return context.cast(builder, value, src, dst)

    def _words(context, dtype, width):
        """The vector moved as 32-bit words when it is whole words of a 16-bit type."""
        nbytes = width * dtype.bitwidth // 8
        if nbytes >= 4 and nbytes % 4 == 0 and dtype.bitwidth == 16:
            return ir.VectorType(ir.IntType(32), nbytes // 4)
        return None

    def _load_words(builder, ptr, n, space):
        """n 32-bit words in one ``ld.global.v{n}.b32`` — inline PTX, because the compiler
        turns a <8 x half> load into two 8-byte ones."""
        i32 = ir.IntType(32)
        regs = ", ".join(f"${k}" for k in range(n))
        op = f"ld.global.v{n}.b32 {{{regs}}}, [${n}];" if n > 1 else "ld.global.b32 $0, [$1];"
        fnty = ir.FunctionType(ir.LiteralStructType([i32] * n) if n > 1 else i32, [ir.IntType(64)])
        asm = ir.InlineAsm(fnty, op, ",".join(["=r"] * n + ["l"]), side_effect=False)
        address = builder.ptrtoint(builder.addrspacecast(ptr, ir.PointerType(ir.IntType(8), space)),
                                   ir.IntType(64))
        out = builder.call(asm, [address])
        return [builder.extract_value(out, k) for k in range(n)] if n > 1 else [out]

    def _vector_load(context, builder, ptr, dtype, width, space, align):
        vec_t = ir.VectorType(context.get_value_type(dtype), width)
        words = _words(context, dtype, width)
        if words is None or space != GLOBAL:
            vec = builder.load(builder.addrspacecast(ptr, ir.PointerType(vec_t, space)), align=align)
            return [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(width)]
        i16 = ir.IntType(16)
        values = []
        for word in _load_words(builder, builder.bitcast(ptr, ir.PointerType(ir.IntType(8))),
                                words.count, space):
            for half in (word, builder.lshr(word, ir.Constant(ir.IntType(32), 16))):
                value = builder.trunc(half, i16)
                values.append(value if dtype.bitwidth == 16 and isinstance(
                    context.get_value_type(dtype), ir.IntType) else builder.bitcast(
                    value, context.get_value_type(dtype)))
        return values

    def _vector_store(context, builder, ptr, dtype, values, space, align):
        width = len(values)
        vec_t = ir.VectorType(context.get_value_type(dtype), width)
        vec = ir.Constant(vec_t, None)
        for k, value in enumerate(values):
            vec = builder.insert_element(vec, value, ir.Constant(ir.IntType(32), k))
        words = _words(context, dtype, width)
        if words is not None:
            vec, vec_t = builder.bitcast(vec, words), words
        builder.store(vec, builder.addrspacecast(ptr, ir.PointerType(vec_t, space)), align=align)

    @functools.cache
    def global_load(width):
        @intrinsic
        def load(typingctx, x, i0, i1, i2, j, v, o):
            def codegen(context, builder, sig, args):
                xt, vt, ot = sig.args[0], sig.args[5], sig.args[6]
                ptr = _item_pointer(context, builder, xt, args[0], args[1:5], sig.args[1:5])
                values = _vector_load(context, builder, ptr, xt.dtype, width, GLOBAL,
                                      width * xt.dtype.bitwidth // 8)
                for k, value in enumerate(values):
                    value = _convert(context, builder, value, xt.dtype, vt.dtype)
                    builder.store(value, _local_slot(context, builder, vt, args[5], args[6], ot, k))
                return context.get_dummy_value()

            return types.void(x, i0, i1, i2, j, v, o), codegen

        return load

    @functools.cache
    def global_store(width):
        @intrinsic
        def store(typingctx, y, i0, i1, i2, j, v, o):
            def codegen(context, builder, sig, args):
                yt, vt, ot = sig.args[0], sig.args[5], sig.args[6]
                values = [builder.load(_local_slot(context, builder, vt, args[5], args[6], ot, k))
                          for k in range(width)]
                ptr = _item_pointer(context, builder, yt, args[0], args[1:5], sig.args[1:5])
                _vector_store(context, builder, ptr, yt.dtype, values, GLOBAL,
                              width * yt.dtype.bitwidth // 8)
                return context.get_dummy_value()

            return types.void(y, i0, i1, i2, j, v, o), codegen

        return store

    @functools.cache
    def shared_load(width):
        @intrinsic
        def load(typingctx, s, i, v, o):
            def codegen(context, builder, sig, args):
                st, it, vt, ot = sig.args
                ptr = _item_pointer(context, builder, st, args[0], [args[1]], [it])
                values = _vector_load(context, builder, ptr, st.dtype, width, SHARED,
                                      width * st.dtype.bitwidth // 8)
                for k, value in enumerate(values):
                    builder.store(value, _local_slot(context, builder, vt, args[2], args[3], ot, k))
                return context.get_dummy_value()

            return types.void(s, i, v, o), codegen

        return load

    @functools.cache
    def shared_store(width):
        @intrinsic
        def store(typingctx, s, i, v, o):
            def codegen(context, builder, sig, args):
                st, it, vt, ot = sig.args
                values = [builder.load(_local_slot(context, builder, vt, args[2], args[3], ot, k))
                          for k in range(width)]
                ptr = _item_pointer(context, builder, st, args[0], [args[1]], [it])
                _vector_store(context, builder, ptr, st.dtype, values, SHARED,
                              width * st.dtype.bitwidth // 8)
                return context.get_dummy_value()

            return types.void(s, i, v, o), codegen

        return store
