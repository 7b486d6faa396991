"""A thread's whole chunk of 16-byte vectors, from one address.

In a chunk (:mod:`.chunk`) thread t holds VPT/W vectors of its row, ``step`` = team·W
values apart: x[row, j + i·step : … + W] for i < VPT/W, j = base + t·W.  Loaded one by
one through :func:`.vector.io`, each vector's address is formed from scratch: the row
times the row length, plus its column, times the item size — a 64-bit multiply and
add a vector.  Here the address of x[row, j] is formed once and vector i's is that plus
i·step items (``step`` is the same for every chunk: the compiler forms i·step once a
kernel), so a vector costs one 64-bit add.

    load(x, row, j, step, v)    v[i·W + k] = x[row, j + i·step + k]      (stored type)
    store(y, row, j, step, v)   y[row, j + i·step + k] = v[i·W + k]
    words:  load(x, row, j, step, w)   w[i·4 + k] = word k of the vector at j + i·step
            (16-bit rows, two values a 32-bit word: :func:`.vector.words`)

:func:`chunked` takes a chunk by one test — this, where the chunk lies inside the row,
else vector by vector.  :func:`converted` is the same with each value converted to the accumulator type and back
(:func:`.jit.loader` / :func:`.jit.storer`), as :func:`.vector.whole_io` converts one
vector.  Callers guarantee what :mod:`.vector` requires of every vector, for each of
them (W = 1: any strides, value by value).  Under the CUDA simulator the same names
are loops over the vectors.
"""

import functools

import numba
from numba import cuda

from ...runtime.sim import simulator_enabled
from ..hw import jit, vector

U32 = numba.uint32

if simulator_enabled():

    @functools.cache
    def strided(width, count, words=False):
        load1, store1 = vector.words() if words else vector.io(width)
        lanes = 4 if words else width

        def load(x, row, j, step, v):
            for i in range(count):
                load1(x, row, j + i * step, v, i * lanes)

        def store(y, row, j, step, v):
            for i in range(count):
                store1(y, row, j + i * step, v, i * lanes)

        return load, store

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _vectors(context, builder, sig, args, vec, count):
        """The global-memory pointers of the ``count`` vectors: x[row, j] + i·step."""
        xt, rt, jt, st = sig.args[:4]
        ary = context.make_array(xt)(context, builder, value=args[0])
        idx = [context.cast(builder, args[1], rt, types.intp),
               context.cast(builder, args[2], jt, types.intp)]
        first = cgutils.get_item_pointer(context, builder, xt, ary, idx, wraparound=False)
        i64 = ir.IntType(64)
        # the address as an integer, through a mov the compiler cannot see through: left
        # alone, it folds first + i·step back into data + (row·n + j + i·step)·size and
        # forms every vector's address from scratch again
        mov = ir.InlineAsm(ir.FunctionType(i64, [i64]), "mov.b64 $0, $1;", "=l,l")
        base = builder.call(mov, [builder.ptrtoint(first, i64)])
        size = context.get_abi_sizeof(context.get_data_type(xt.dtype))
        step = builder.mul(context.cast(builder, args[3], st, types.intp), ir.Constant(i64, size))
        out = []
        for i in range(count):
            a = base if i == 0 else builder.add(base, builder.mul(step, ir.Constant(i64, i)))
            p = builder.inttoptr(a, ir.PointerType(vec))
            out.append(builder.addrspacecast(p, ir.PointerType(vec, 1)))  # 1: global memory
        return out

    def _slot(context, builder, arr_type, arr, k):
        ary = context.make_array(arr_type)(context, builder, value=arr)
        return cgutils.get_item_pointer(context, builder, arr_type, ary,
                                        [ir.Constant(context.get_value_type(types.intp), k)],
                                        wraparound=False)

    @functools.cache
    def strided(width, count, words=False):
        if width == 1:  # any strides: plain indexing, value by value
            return _singles(count)
        lanes = 4 if words else width

        def vector_type(context, xt):
            if words:
                return ir.VectorType(ir.IntType(32), 4)
            return ir.VectorType(context.get_value_type(xt.dtype), width)

        @intrinsic
        def load(typingctx, x, row, j, step, v):
            def codegen(context, builder, sig, args):
                vec = vector_type(context, sig.args[0])
                loaded = [builder.load(p, align=vector.VECTOR_BYTES)  # every load first
                          for p in _vectors(context, builder, sig, args, vec, count)]
                for i, value in enumerate(loaded):
                    for k in range(lanes):
                        builder.store(builder.extract_element(value, ir.Constant(ir.IntType(32), k)),
                                      _slot(context, builder, sig.args[4], args[4], i * lanes + k))
                return context.get_dummy_value()

            return types.void(x, row, j, step, v), codegen

        @intrinsic
        def store(typingctx, y, row, j, step, v):
            def codegen(context, builder, sig, args):
                vec = vector_type(context, sig.args[0])
                for i, p in enumerate(_vectors(context, builder, sig, args, vec, count)):
                    value = ir.Constant(vec, None)
                    for k in range(lanes):
                        item = builder.load(_slot(context, builder, sig.args[4], args[4], i * lanes + k))
                        value = builder.insert_element(value, item, ir.Constant(ir.IntType(32), k))
                    builder.store(value, p, align=vector.VECTOR_BYTES)
                return context.get_dummy_value()

            return types.void(y, row, j, step, v), codegen

        return load, store


def _singles(count):
    @jit.device
    def load(x, row, j, step, v):
        for i in range(count):
            v[i] = x[row, j + i * step]

    @jit.device
    def store(y, row, j, step, v):
        for i in range(count):
            y[row, j + i * step] = v[i]

    return load, store


@functools.cache
def converted(width, dtype, vpt):
    """``load(x, row, j, step, v)`` / ``store(y, row, j, step, v)``: :func:`strided` for VPT
    values a thread, each value converted to the accumulator type on the way in and back
    on the way out (16-bit vectors of eight as words, as :func:`.vector.whole_io`)."""
    to_acc, to_storage = jit.loader(dtype), jit.storer(dtype)
    if width == 8 and jit.storage(dtype) in ("float16", jit.BFLOAT16):
        load_words, store_words = strided(width, vpt // width, words=True)
        from_bits, to_bits = jit.bits_loader(dtype), jit.bits_storer(dtype)
        words = vpt // 2  # (a shape must be a constant of its own to Numba)

        @jit.device
        def load(x, row, j, step, v):
            w = cuda.local.array(words, U32)  # the chunk's words, in registers
            load_words(x, row, j, step, w)
            for i in range(vpt):
                v[i] = from_bits(numba.uint16(w[i // 2] >> U32(16) if i % 2
                                              else w[i // 2] & U32(0xFFFF)))

        @jit.device
        def store(y, row, j, step, v):
            w = cuda.local.array(words, U32)
            for k in range(words):
                w[k] = U32(to_bits(v[2 * k])) | U32(to_bits(v[2 * k + 1])) << U32(16)
            store_words(y, row, j, step, w)

        return load, store
    raw_load, raw_store = strided(width, vpt // width)
    raw = vector.storage_type(dtype)

    @jit.device
    def load(x, row, j, step, v):
        bits = cuda.local.array(vpt, raw)  # the stored values, in registers
        raw_load(x, row, j, step, bits)
        for i in range(vpt):
            v[i] = to_acc(bits[i])

    @jit.device
    def store(y, row, j, step, v):
        bits = cuda.local.array(vpt, raw)
        for i in range(vpt):
            bits[i] = to_storage(v[i])
        raw_store(y, row, j, step, bits)

    return load, store


def chunked(one, whole, vpt, width):
    """``fetch(x, row, base, stop, t, team, h, pad)``: thread t's VPT values of the chunk
    at x[row, base:] into h — by ``whole(x, row, j, step, h)`` (above) where the chunk
    lies inside the row (one test, not one a vector), else by
    ``one(x, row, j, stop, h, offset, pad)`` a vector (``pad`` past ``stop``)."""

    @jit.device
    def fetch(x, row, base, stop, t, team, h, pad):
        if base + team * vpt <= stop:  # a whole chunk: no test a vector
            whole(x, row, base + t * width, team * width, h)  # every load before any use
        else:
            for i in range(vpt // width):
                one(x, row, base + (t + i * team) * width, stop, h, i * width, pad)

    return fetch
