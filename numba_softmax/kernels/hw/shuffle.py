"""A shuffle of whole register arrays: ``exchange(n)(src, dst, offset)`` sets dst[i] to
lane (lane XOR offset)'s src[i], for i < n — n ``shfl_xor_sync`` on a GPU;
``exchange3(n1, n2, n3)(a, b, c, a_o, b_o, c_o, offset)`` does it for three arrays.

The decode kernel (:mod:`.decode`) sums scores and folds (m, ℓ, O) states across lanes
several values at a time; written with this primitive, its butterflies read as one step
per offset.  Under the CUDA simulator, where each shuffle is a barrier of 32 Python
threads, the emulation moves the whole array in one round (:func:`numba_softmax.runtime.sim.warp_exchange`),
which keeps the simulated kernel fast enough for the tests.  Like a full-mask shuffle,
every lane of the warp must call it.
"""

import functools

from ...runtime.sim import simulator_enabled

FULL_MASK = 0xFFFFFFFF

if simulator_enabled():
    from ...runtime.sim import lane_id, warp_exchange

    @functools.cache
    def exchange(n):
        def xor_exchange(src, dst, offset):
            values = warp_exchange([src[i] for i in range(n)])
            partner = lane_id() ^ offset
            theirs = values[partner] if partner < len(values) else values[lane_id()]  # a partial warp
            for i in range(n):
                dst[i] = theirs[i]

        return xor_exchange

    @functools.cache
    def exchange3(n1, n2, n3):
        def xor_exchange3(a, b, c, a_o, b_o, c_o, offset):
            mine = [a[i] for i in range(n1)] + [b[i] for i in range(n2)] + [c[i] for i in range(n3)]
            values = warp_exchange(mine)
            partner = lane_id() ^ offset
            theirs = values[partner] if partner < len(values) else mine
            for i in range(n1):
                a_o[i] = theirs[i]
            for i in range(n2):
                b_o[i] = theirs[n1 + i]
            for i in range(n3):
                c_o[i] = theirs[n1 + n2 + i]

        return xor_exchange3

else:
    from numba import cuda

    from . import jit

    @functools.cache
    def exchange(n):
        @jit.device
        def xor_exchange(src, dst, offset):
            for i in range(n):
                dst[i] = cuda.shfl_xor_sync(FULL_MASK, src[i], offset)

        return xor_exchange

    @functools.cache
    def exchange3(n1, n2, n3):
        x1, x2, x3 = exchange(n1), exchange(n2), exchange(n3)

        @jit.device
        def xor_exchange3(a, b, c, a_o, b_o, c_o, offset):
            x1(a, a_o, offset)
            x2(b, b_o, offset)
            x3(c, c_o, offset)

        return xor_exchange3
