"""16-byte loads and stores: the one thing plain Numba indexing does not give us.

``x[row, j]`` compiles to a 4-byte load; a memory-bound kernel wants each thread to move
16 bytes per instruction (4 float32, 8 float16 or bfloat16, 2 float64), coalesced across
the warp.  Numba has no vector load, so this module adds one with a small ``@intrinsic``:
it takes the address of ``x[row, j]``, views it as a ``<W x dtype>`` vector in global
memory, and loads it with 16-byte alignment (PTX ``ld.global.v4.f32`` for float32).

    load(x, row, j, v, offset)    v[offset + k] = x[row, j + k],  k < W   (same dtype)
    store(y, row, j, v, offset)   y[row, j + k] = v[offset + k],  k < W

:func:`io` only moves bytes: ``v`` has the array's own dtype.  :func:`row_io` is what the
kernels call: it converts each value to the accumulator type and back with
:func:`.jit.loader` / :func:`.jit.storer`, which is where a uint16 array becomes
bfloat16 (its bits shifted into a float32), not an integer.

Callers guarantee what the hardware needs (the host checks it before choosing W > 1):
unit column stride, row stride a multiple of W, a 16-byte aligned base, j % W == 0 and
j + W <= n.  With W = 1 both are plain indexing.

Under the CUDA simulator (no intrinsics there) the same names are plain Python loops —
an emulation used only there; the kernels' source is the same.
"""

import functools

import numba
import numpy as np
from numba import cuda

from ...runtime.sim import simulator_enabled
from .widths import VECTOR_BYTES, storage_type, vector_width, width_for  # noqa: F401 (vector.…)


if simulator_enabled():

    @functools.cache
    def io(width):
        def load(x, row, j, v, offset):
            for k in range(width):
                v[offset + k] = x[row, j + k]

        def store(y, row, j, v, offset):
            for k in range(width):
                y[row, j + k] = v[offset + k]

        return load, store

    def _bits16(v):
        return np.uint32(np.asarray(v).view(np.uint16))  # float16: its bits, as the GPU loads them

    @functools.cache
    def words():
        def load_words(x, row, j, w, offset):
            for k in range(4):
                w[offset + k] = (_bits16(x[row, j + 2 * k])
                                 | _bits16(x[row, j + 2 * k + 1]) << np.uint32(16))

        def store_words(y, row, j, w, offset):
            for k in range(4):  # (the bits themselves, into a float16 array too)
                y[row, j + 2 * k] = np.uint16(w[offset + k] & np.uint32(0xFFFF)).view(y.dtype)
                y[row, j + 2 * k + 1] = np.uint16(w[offset + k] >> np.uint32(16)).view(y.dtype)

        return load_words, store_words

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    from . import jit

    def _element_pointer(context, builder, arr_type, arr, row, row_type, j, j_type):
        ary = context.make_array(arr_type)(context, builder, value=arr)
        idx = [context.cast(builder, row, row_type, types.intp),
               context.cast(builder, j, j_type, types.intp)]
        return cgutils.get_item_pointer(context, builder, arr_type, ary, idx, wraparound=False)

    def _local_pointer(context, builder, arr_type, arr, offset, off_type, k):
        ary = context.make_array(arr_type)(context, builder, value=arr)
        i = context.cast(builder, offset, off_type, types.intp)
        i = builder.add(i, ir.Constant(i.type, k))
        return cgutils.get_item_pointer(context, builder, arr_type, ary, [i], wraparound=False)

    def _global_vector(context, builder, ptr, dtype, width):
        vec = ir.VectorType(context.get_value_type(dtype), width)
        return builder.addrspacecast(ptr, ir.PointerType(vec, 1))  # 1: global memory

    @functools.cache
    def io(width):
        if width == 1:

            @jit.device
            def load1(x, row, j, v, offset):
                v[offset] = x[row, j]

            @jit.device
            def store1(y, row, j, v, offset):
                y[row, j] = v[offset]

            return load1, store1

        def same_dtype(x, v):
            if x.dtype != v.dtype:  # converting is jit.loader's job (uint16 is bfloat16)
                raise TypeError(f"vector.io moves bytes: {x.dtype} array, {v.dtype} values")

        @intrinsic
        def load(typingctx, x, row, j, v, offset):
            same_dtype(x, v)

            def codegen(context, builder, sig, args):
                xt, rt, jt, vt, ot = sig.args
                ptr = _element_pointer(context, builder, xt, args[0], args[1], rt, args[2], jt)
                vec = builder.load(_global_vector(context, builder, ptr, xt.dtype, width),
                                   align=VECTOR_BYTES)
                for k in range(width):
                    value = builder.extract_element(vec, ir.Constant(ir.IntType(32), k))
                    builder.store(value, _local_pointer(context, builder, vt, args[3], args[4], ot, k))
                return context.get_dummy_value()

            return types.void(x, row, j, v, offset), codegen

        @intrinsic
        def store(typingctx, y, row, j, v, offset):
            same_dtype(y, v)

            def codegen(context, builder, sig, args):
                yt, rt, jt, vt, ot = sig.args
                vec = ir.Constant(ir.VectorType(context.get_value_type(yt.dtype), width), None)
                for k in range(width):
                    value = builder.load(_local_pointer(context, builder, vt, args[3], args[4], ot, k))
                    vec = builder.insert_element(vec, value, ir.Constant(ir.IntType(32), k))
                ptr = _element_pointer(context, builder, yt, args[0], args[1], rt, args[2], jt)
                builder.store(vec, _global_vector(context, builder, ptr, yt.dtype, width),
                              align=VECTOR_BYTES)
                return context.get_dummy_value()

            return types.void(y, row, j, v, offset), codegen

        return load, store


    @functools.cache
    def words():
        """``load_words(x, row, j, w, offset)``: the 16 bytes at x[row, j] (any 16-bit array)
        as four 32-bit words, w[offset + k] = x[row, j + 2k] | x[row, j + 2k + 1] << 16;
        ``store_words(y, row, j, w, offset)``, its inverse."""
        i32x4 = ir.VectorType(ir.IntType(32), 4)

        def pointer(context, builder, sig, args):
            xt, rt, jt = sig.args[:3]
            ptr = _element_pointer(context, builder, xt, args[0], args[1], rt, args[2], jt)
            return builder.addrspacecast(builder.bitcast(ptr, ir.PointerType(i32x4)),
                                         ir.PointerType(i32x4, 1))

        @intrinsic
        def load_words(typingctx, x, row, j, w, offset):
            def codegen(context, builder, sig, args):
                vec = builder.load(pointer(context, builder, sig, args), align=VECTOR_BYTES)
                for k in range(4):
                    value = builder.extract_element(vec, ir.Constant(ir.IntType(32), k))
                    builder.store(value, _local_pointer(context, builder, sig.args[3], args[3],
                                                        args[4], sig.args[4], k))
                return context.get_dummy_value()

            return types.void(x, row, j, w, offset), codegen

        @intrinsic
        def store_words(typingctx, y, row, j, w, offset):
            def codegen(context, builder, sig, args):
                vec = ir.Constant(i32x4, None)
                for k in range(4):
                    value = builder.load(_local_pointer(context, builder, sig.args[3], args[3],
                                                        args[4], sig.args[4], k))
                    vec = builder.insert_element(vec, value, ir.Constant(ir.IntType(32), k))
                builder.store(vec, pointer(context, builder, sig, args), align=VECTOR_BYTES)
                return context.get_dummy_value()

            return types.void(y, row, j, w, offset), codegen

        return load_words, store_words


@functools.cache
def row_io(width, dtype):
    """``load_row``/``store_row`` for a row of ``dtype`` values: :func:`whole_io`'s vector
    access where the W values lie inside the row (j + W <= stop), value by value at its
    ragged end, each value converted to the accumulator type on the way in and back on the
    way out.  ``load_row`` fills the places past ``stop`` with ``pad`` (−inf for a max or
    a sum, which weighs 0)."""
    from . import jit

    return _ragged(*whole_io(width, dtype), jit.loader(dtype), jit.storer(dtype), width)


@functools.cache
def whole_io(width, dtype):
    """``whole_load(x, row, j, v, offset)`` / ``whole_store(y, row, j, v, offset)``: one
    vector of W values that lies inside the row, no test, converted to the accumulator
    type and back.  Float16 and bfloat16 vectors of eight move as four 32-bit words by one
    16-byte load or store (:func:`words`): NVPTX would split a vector of eight 16-bit
    values into two 8-byte accesses, each touching every sector of the warp's 512 bytes
    and using half of it."""
    from . import jit

    to_acc, to_storage = jit.loader(dtype), jit.storer(dtype)
    if width == 8 and jit.storage(dtype) in ("float16", jit.BFLOAT16):
        return _whole_words(dtype)
    load, store = io(width)
    raw = storage_type(dtype)

    @jit.device
    def whole_load(x, row, j, v, offset):
        bits = cuda.local.array(width, raw)  # the W stored values, in registers
        load(x, row, j, bits, 0)
        for k in range(width):
            v[offset + k] = to_acc(bits[k])

    @jit.device
    def whole_store(y, row, j, v, offset):
        bits = cuda.local.array(width, raw)
        for k in range(width):
            bits[k] = to_storage(v[offset + k])
        store(y, row, j, bits, 0)

    return whole_load, whole_store


def _whole_words(dtype):
    """(load, store) of one whole vector of eight 16-bit values as four words, converted."""
    from . import jit

    U32 = numba.uint32
    load_words, store_words = words()
    from_bits, to_bits = jit.bits_loader(dtype), jit.bits_storer(dtype)

    @jit.device
    def whole_load(x, row, j, v, offset):
        w = cuda.local.array(4, U32)  # the vector's words, in registers
        load_words(x, row, j, w, 0)
        for k in range(8):
            v[offset + k] = from_bits(numba.uint16(w[k // 2] >> U32(16) if k % 2
                                                   else w[k // 2] & U32(0xFFFF)))

    @jit.device
    def whole_store(y, row, j, v, offset):
        w = cuda.local.array(4, U32)
        for k in range(4):
            w[k] = U32(to_bits(v[offset + 2 * k])) | U32(to_bits(v[offset + 2 * k + 1])) << U32(16)
        store_words(y, row, j, w, 0)

    return whole_load, whole_store


def _ragged(whole_load, whole_store, to_acc, to_storage, width):
    """``load_row``/``store_row``: a whole vector where it lies inside the row, else value
    by value (converted by ``to_acc`` / ``to_storage``), ``pad`` past ``stop``."""
    from . import jit

    @jit.device
    def load_row(x, row, j, stop, v, offset, pad):
        if j + width <= stop:
            whole_load(x, row, j, v, offset)
        else:
            for k in range(width):
                v[offset + k] = to_acc(x[row, j + k]) if j + k < stop else pad

    @jit.device
    def store_row(y, row, j, stop, v, offset):
        if j + width <= stop:
            whole_store(y, row, j, v, offset)
        else:
            for k in range(width):
                if j + k < stop:
                    y[row, j + k] = to_storage(v[offset + k])

    return load_row, store_row


@functools.cache
def raw_row_io(width):
    """:func:`row_io` without the conversion: ``v`` holds the stored values themselves
    (bfloat16 as its uint16 bits) — for kernels that convert where they choose.
    ``load_row`` pads past ``stop`` with ``pad`` (of ``v``'s type)."""
    from . import jit

    load, store = io(width)

    @jit.device
    def same(value):
        return value

    return _ragged(load, store, same, same, width)
