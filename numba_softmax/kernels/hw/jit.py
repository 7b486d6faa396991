"""How every kernel here is compiled: the options, the accumulator type, the storage types.

* ``FASTMATH`` (defined beside the combiner, whose device twins use it too): fast
  ``exp``/``log`` and reciprocal, FMA contraction, no ``nnan``/``ninf``.  Every kernel
  *and* device function here is compiled through :func:`kernel` / :func:`device`, which
  pass it: a kernel's flag does not reach into the device functions it calls.  (The
  simulator ignores fastmath.)
* ``accumulator(dtype)``: float16 and bfloat16 inputs accumulate in float32, like
  PyTorch; float32 and float64 accumulate in their own type.  Kernels are built by small
  cached factories that close over this type, so constants such as the identity
  (−inf, 0) are typed exactly (a bare ``-math.inf`` would silently turn float32
  arithmetic into float64).
* bfloat16 has no NumPy dtype: a bfloat16 array reaches the kernels as ``uint16`` holding
  the bits (the array layer makes that view; *a uint16 array here always means
  bfloat16*), and :func:`loader` / :func:`storer` give
  the device functions that turn those bits into float32 and back (round to nearest
  even).  For every other dtype they are plain casts.
"""

import math

import numba
import numpy as np
from numba import cuda
from numba.cuda import libdevice

from ...runtime.sim import simulator_enabled

from ...combine import FASTMATH

BFLOAT16 = "bfloat16"
LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): the kernels scale once, then use exp2
"""The storage-dtype name of bfloat16 data (held as uint16 bits on the device)."""

_ACCUMULATE = {np.dtype(np.float16): numba.float32, np.dtype(np.float32): numba.float32,
               np.dtype(np.float64): numba.float64}


def kernel(fn=None, **options):
    """``cuda.jit`` with the project's compile options: every kernel of ``kernels/`` is built
    by this (the runtime's strided copy, which does no arithmetic, is plain ``cuda.jit``).
    ``@kernel`` or ``@kernel(launch_bounds=…)`` (more ``cuda.jit`` options; the simulator
    takes neither launch bounds nor ``max_registers``: there they are dropped)."""
    if simulator_enabled():
        options.pop("launch_bounds", None)
        options.pop("max_registers", None)
    if fn is None:
        return lambda f: cuda.jit(fastmath=FASTMATH, **options)(f)
    return cuda.jit(fastmath=FASTMATH, **options)(fn)


def device(fn):
    """``cuda.jit(device=True)`` with the project's compile options."""
    return cuda.jit(device=True, fastmath=FASTMATH)(fn)


def storage(dtype):
    """The storage dtype name: ``"float16"``, ``"float32"``, ``"float64"`` or ``"bfloat16"``
    (``"bfloat16"`` itself, or uint16: the bits of bfloat16 values)."""
    if isinstance(dtype, str) and dtype == BFLOAT16:
        return BFLOAT16
    dtype = np.dtype(dtype)
    return BFLOAT16 if dtype == np.uint16 else dtype.name


def accumulator(dtype):
    """The numba type a kernel accumulates ``dtype`` values in (``dtype`` may be
    ``"bfloat16"``)."""
    if storage(dtype) == BFLOAT16:
        return numba.float32
    return _ACCUMULATE[np.dtype(dtype)]


if simulator_enabled():  # the simulator's libdevice has no bit casts: NumPy views instead

    def bf16_to_f32(bits):
        return np.array([np.uint32(bits) << np.uint32(16)], np.uint32).view(np.float32)[0]

    def f32_to_bf16(x):
        b = int(np.array([x], np.float32).view(np.uint32)[0])
        if (b & 0x7FFFFFFF) > 0x7F800000:
            return np.uint16((b >> 16) | 0x40)
        return np.uint16(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF)

    def _f16_bits_to_f32(bits):
        return np.float32(np.array([bits], np.uint16).view(np.float16)[0])

    def _f32_to_f16_bits(x):
        return np.array([x], np.float16).view(np.uint16)[0]

else:
    from .ptx import bf16_rn, f16_bits_to_f32, f32_to_f16_bits

    def bf16_to_f32(bits):
        """float32 whose upper 16 bits are ``bits`` (exact: bfloat16 is a truncated float32)."""
        return libdevice.int_as_float(numba.int32(numba.uint32(bits) << numba.uint32(16)))

    def f32_to_bf16(x):
        """The bfloat16 bits nearest to float32 ``x`` (ties to even; a NaN stays a NaN):
        one ``cvt.rn.bf16.f32`` (:mod:`.ptx`; the simulator's twin above spells it out)."""
        return bf16_rn(numba.float32(x))


    def _f16_bits_to_f32(bits):
        """The float16 value whose bits are ``bits``, as float32: one ``cvt.f32.f16``."""
        return f16_bits_to_f32(bits)

    def _f32_to_f16_bits(x):
        """The bits of the float16 nearest to float32 ``x``: one ``cvt.rn.f16.f32``."""
        return f32_to_f16_bits(numba.float32(x))


if simulator_enabled():

    def _exp(x):
        # (Python's raises past float64's range; a float32 result overflows where stored)
        return math.inf if x > 709.0 else math.exp(x)

else:

    def _exp(x):
        """eˣ; +inf past the float range, as the GPU gives it (fast: an ``ex2.approx``)."""
        return math.exp(x)


exp = device(_exp)
_bf16_load = device(bf16_to_f32)
_bf16_store = device(f32_to_bf16)
_f16_bits_load = device(_f16_bits_to_f32)
_f16_bits_store = device(_f32_to_f16_bits)


def loader(dtype):
    """Device function ``load(value) -> accumulator`` for one stored value of ``dtype``."""
    if storage(dtype) == BFLOAT16:
        return _bf16_load
    acc = accumulator(dtype)

    @device
    def load(value):
        return acc(value)

    return load


def storer(dtype):
    """Device function ``store(value) -> stored`` for one accumulator value into ``dtype``."""
    if storage(dtype) == BFLOAT16:
        return _bf16_store
    out = numba.from_dtype(np.dtype(dtype))

    @device
    def store(value):
        return out(value)

    return store


def bits_loader(dtype):
    """:func:`loader` for a 16-bit ``dtype`` (float16 or bfloat16) held as its uint16 bits."""
    return _bf16_load if storage(dtype) == BFLOAT16 else _f16_bits_load


def bits_storer(dtype):
    """:func:`storer` into the uint16 bits of a 16-bit ``dtype`` (float16 or bfloat16)."""
    return _bf16_store if storage(dtype) == BFLOAT16 else _f16_bits_store


def _udivmod(a, n):
    """(a // n, a % n) for 0 ≤ a < 2³² and 0 < n < 2³² (indices, counts): one 32-bit
    unsigned division, ~20 instructions, where Numba's int64 ``//`` and ``%`` each cost a
    64-bit one and Python's sign fix-ups (~60: measurable in a kernel that runs a few
    microseconds)."""
    x, m = numba.uint32(a), numba.uint32(n)
    q = x // m  # LLVM narrows the division of two zero-extended uint32 to div.u32
    return numba.int64(q), numba.int64(x - q * m)


udivmod = device(_udivmod)
