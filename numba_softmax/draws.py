"""Random draws that a seed reproduces: a counter-based hash and the draw from a top-k list.

No generator state is carried anywhere.  A draw is a pure function of (seed, row, j):

    key(seed, row)  = mix64(seed + φ·(row + 1))             one 64-bit key per row
    bits(key, j)    = mix64(key + φ·(j + 1))                 64 fresh bits per counter j

where ``mix64`` is the splitmix64 finaliser (two multiply–xorshift rounds, a bijection of
64-bit words with full avalanche) and φ = 0x9E3779B97F4A7C15.  The same (seed, row) gives
the same bits on the host, on the simulator and on the GPU: the arithmetic is on 64-bit
integers, wrapping — on the host ``& MASK64`` after each product, on the device uint64
arithmetic (where the mask costs nothing).

Two uses (see :mod:`numba_softmax.kernels.topk.sample`):

* :func:`uniform` — one number in (0, 1) per row, exact in float32; :func:`draw` turns it
  into a place in a sorted top-k list (inverse CDF of the renormalised top-k, cut to its
  top-p prefix);
* :func:`gumbel` — per-element Gumbel noise for sampling from the *whole* vocabulary in
  one pass: argmax_j (u_j + G_j) is distributed as softmax(u) (the Gumbel-max trick).

Written once in plain Python: the references call these functions, the kernels their
device twins (compiled from the same source, as :mod:`numba_softmax.combine` does).
"""

import math

import numba

from .runtime.sim import simulator_enabled
from .combine import device_twin, weight, weight_device

__all__ = ["MASK64", "row_key", "bits", "uniform", "gumbel", "draw"]

MASK64 = 0xFFFFFFFFFFFFFFFF
PHI = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: the splitmix64 increment


real = float  # the float type of gumbel(): float64 on the host, the accumulator on the device


def word(v):
    """A value as an unsigned 64-bit word (the host twin; the device uses ``uint64``)."""
    return int(v) & MASK64


def mix64(z):
    """The splitmix64 finaliser: a bijection of 64-bit words with full avalanche."""
    z = ((z ^ (z >> word(30))) * word(0xBF58476D1CE4E5B9)) & word(MASK64)
    z = ((z ^ (z >> word(27))) * word(0x94D049BB133111EB)) & word(MASK64)
    return z ^ (z >> word(31))


def row_key(seed, row):
    """The 64-bit key of one row: everything a row draws is a function of it."""
    return mix64((word(seed) + word(PHI) * word(row + 1)) & word(MASK64))


def bits(key, j):
    """64 random bits for counter j of a row (j: an element index, or 0 for the row's draw)."""
    return mix64((key + word(PHI) * word(j + 1)) & word(MASK64))


def uniform(key):
    """The row's uniform number in (0, 1): (2·b + 1)·2⁻²⁴ from 23 random bits b — 24
    significant bits, so exact in float32 and float64 alike, never 0 or 1."""
    return float((bits(key, 0) >> word(41)) * word(2) + word(1)) * 5.9604644775390625e-08


def gumbel(key, j):
    """Gumbel noise G = −log E for element j, E = −log1p(−w) an exponential variate and
    w = (b + ½)·2⁻³² uniform in (0, 1) from 32 random bits b, in the ``real`` type (the
    kernel's accumulator).  Large G comes from small w, where log1p keeps full relative
    precision: the upper tail, the one an argmax sees, is not coarsened.  w stays below 1
    (float32 rounds (2³² − ½)·2⁻³² up to 1)."""
    w = (real(bits(key, j) >> word(32)) + real(0.5)) * real(2.3283064365386963e-10)
    w = min(w, real(0.99999994))
    return -math.log(-math.log1p(-w))


def draw(values, start, k, top_p, u):
    """The place r < k, in the sorted list values[start : start + k], of the token drawn
    with uniform u from the list's renormalised softmax, cut to its top-p prefix:

        w_r = exp(u_r − u_0)   (the top-k renormalised: no ℓ needed)
        n   = the smallest prefix with Σ_{r<n} w_r ≥ top_p · Σ_{r<k} w_r     (top-p)
        r   = the first place with Σ_{s≤r} w_s > u · Σ_{s<n} w_s             (inverse CDF)

    The list's first value must be finite (a row whose (m, ℓ) is not NaN).  Empty slots and
    −inf entries weigh 0 and are never drawn.
    """
    top = values[start]
    total = top - top  # 0 in the list's type
    for r in range(k):
        total += weight(values[start + r], top)
    need = top_p * total
    mass = top - top
    n = k
    for r in range(k):  # top-p: the prefix sums repeat the total's additions in order
        mass += weight(values[start + r], top)
        if mass >= need:
            n = r + 1
            break
    target = u * mass
    c = top - top
    for r in range(n):
        c += weight(values[start + r], top)
        if c > target:
            return r
    return n - 1  # u·mass rounded up to the mass: the last place of the prefix


# --- device twins ------------------------------------------------------------------------
# On the GPU the words are uint64 (wrapping, the masks vanish); the simulator keeps Python
# integers, whose products NumPy's uint64 scalars would flag as overflows.
_word_device = word if simulator_enabled() else numba.uint64
mix64_device = device_twin(mix64, word=_word_device)
row_key_device = device_twin(row_key, word=_word_device, mix64=mix64_device)
bits_device = device_twin(bits, word=_word_device, mix64=mix64_device)
uniform_device = device_twin(uniform, word=_word_device, bits=bits_device)


def gumbel_device(acc):
    """The device twin of :func:`gumbel` computing in ``acc`` (float32 or float64)."""
    return _gumbel_twins.setdefault(acc, device_twin(gumbel, word=_word_device, bits=bits_device,
                                                      real=acc))


_gumbel_twins = {}
draw_device = device_twin(draw, weight=weight_device)
