"""PTX instructions Numba does not emit: ``max.NaN.f32``, ``cvt.rn.bf16.f32``, and the
float16 conversions from and to bits.

The row max of attention must keep a NaN, whichever side it is on (:func:`.combine.larger`);
written in Python that is two compares, an ``or`` and a select per score.  Since sm_80 the
hardware has the instruction: ``max.NaN.f32 d, a, b`` is NaN when a or b is, else the
larger.  :func:`nan_max` emits it through inline PTX for float32 (and falls back to
:func:`.combine.larger` for other types); under the CUDA simulator it *is*
:func:`.combine.larger`.

bfloat16 values are stored as uint16 bits, and rounding a float32 to them written in
Python is ~8 integer instructions (a NaN test, the tie-to-even add, a shift).  Since sm_80
``cvt.rn.bf16.f32`` does it in one, with the same rounding (to nearest, ties to even; a
NaN stays a NaN, its payload the hardware's): :func:`bf16_rn`, device only —
:func:`.jit.storer` uses it on the GPU and its Python twin under the simulator.

float16 held as bits (a uint16, e.g. half of a 32-bit register holding two values,
:mod:`.pairs`) has no Numba conversion: Numba converts a ``float16`` *value*, and has no
bit cast to one.  :func:`f16_bits_to_f32` is ``cvt.f32.f16`` on the bits and
:func:`f32_to_f16_bits` is ``cvt.rn.f16.f32`` giving them (device only; twins in
:mod:`.jit`).  :func:`opaque_u32` is a ``mov`` the compiler cannot see through: a kernel
that unpacks such pairs twice, before and after a reduction, keeps the packed words alive
in between rather than every unpacked value (twice the registers).
"""

from ...runtime.sim import simulator_enabled
from ...combine import larger, larger_device

if simulator_enabled():
    nan_max = larger

    def opaque_u32(x):
        return x
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic, overload

    @intrinsic
    def _max_nan_f32(typingctx, a, b):
        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            asm = ir.InlineAsm(ir.FunctionType(f32, [f32, f32]), "max.NaN.f32 $0, $1, $2;",
                               "=f,f,f", side_effect=False)
            return builder.call(asm, list(args))

        return types.float32(types.float32, types.float32), codegen

    def nan_max(a, b):
        """max(a, b), NaN if either is NaN (device only)."""
        return larger(a, b)

    @overload(nan_max, target="cuda")
    def _nan_max(a, b):
        if a == types.float32 and b == types.float32:
            return lambda a, b: _max_nan_f32(a, b)
        return lambda a, b: larger_device(a, b)

    @intrinsic
    def bf16_rn(typingctx, x):
        """The bfloat16 bits (uint16) nearest to float32 ``x``: ``cvt.rn.bf16.f32``."""

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]),
                               "cvt.rn.bf16.f32 $0, $1;", "=h,f", side_effect=False)
            return builder.call(asm, [context.cast(builder, args[0], sig.args[0], types.float32)])

        return types.uint16(x), codegen

    def _cvt(name, asm, out_bits, out_type, in_type, constraint):
        def cvt(typingctx, x):
            def codegen(context, builder, sig, args):
                a = context.cast(builder, args[0], sig.args[0], in_type)
                ty = ir.FunctionType(ir.IntType(out_bits) if out_bits else ir.FloatType(),
                                     [context.get_value_type(in_type)])
                return builder.call(ir.InlineAsm(ty, asm, constraint, side_effect=False), [a])

            return out_type(x), codegen

        cvt.__name__ = name
        return intrinsic(cvt)

    f16_bits_to_f32 = _cvt("f16_bits_to_f32", "cvt.f32.f16 $0, $1;", 0, types.float32,
                           types.uint16, "=f,h")
    opaque_u32 = _cvt("opaque_u32", "mov.b32 $0, $1;", 32, types.uint32, types.uint32, "=r,r")
    opaque_u32.__doc__ = """x, through a ``mov`` the compiler cannot see through: what it
    computed from x before is not reused (and kept alive) after."""
    f32_to_f16_bits = _cvt("f32_to_f16_bits", "cvt.rn.f16.f32 $0, $1;", 16, types.uint16,
                           types.float32, "=h,f")
