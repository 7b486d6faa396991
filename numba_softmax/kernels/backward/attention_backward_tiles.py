"""The tiles of the CUDA-core attention backward (:mod:`.attention_backward`): their sizes,
which the device fits, and where each lives in shared memory.
"""

from ...runtime import launcher
from ..attention.flash_tiles import shared_limit
from .attention_backward_products import GROUP


def pad8(n):
    """``n`` rounded up to a whole number of column groups."""
    return GROUP * -(-n // GROUP)


def strides(d, dv, block_k, vw=4):
    """Row strides of (Q and K, dO and V, P and dS) for ``vw`` values a 16-byte read: each
    a multiple of vw with stride/vw odd, so that rows read together start in different
    16-byte bank groups."""
    return pad8(d) + vw, pad8(dv) + vw, block_k + vw


def layout(d, dv, block_q, block_k, vw=4):
    """Offsets (in values) of the shared tiles Q, dO, K, V, P, dS, and the total."""
    qs, vs, ps = strides(d, dv, block_k, vw)
    sizes = (block_q * qs, block_q * vs, block_k * qs, block_k * vs, block_q * ps, block_q * ps)
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += size
    return tuple(offsets), total


TILINGS = ((64, 64), (64, 32), (32, 32), (32, 16), (16, 16))  # (Br, Bc), largest first


def fit_tiles(d, dv, itemsize=4, small=False):
    """(Br, Bc, W) for these head dimensions: 64×64 tiles, 4 warps up to D = 64; 32×32
    up to 128; half-size tiles for float64 — or, where a block gets less shared memory
    than that needs (99 KB on sm_86/sm_89), the next smaller of :data:`TILINGS` that fits;
    the simulator's 8×8 tiles of 2 warps.

    At D = 128 the tiles are the multiprocessor's occupancy: 64×32 take 117 KB of shared
    memory, one block of 4 warps a multiprocessor; 32×32 take 75 KB — exactly a third of
    228 KB less the driver's 1 KB a block — so three blocks fit (12 warps; ptxas: 167
    registers a thread, under the 168 that three blocks allow).  The other tilings timed
    no faster: ``docs/algorithms/backward.md``, "Tiles at D = 128"."""
    if small:
        return 8, 8, 2
    first = (32, 32) if itemsize == 8 else (64, 64) if max(d, dv) <= 64 else (32, 32)
    value = 8 if itemsize == 8 else 4  # the accumulator's bytes
    fit = launcher.first_fitting(TILINGS[TILINGS.index(first):],
                                 lambda t: layout(d, dv, *t, 16 // value)[1] * value,
                                 shared_limit())
    if fit is None:
        raise ValueError(f"head dimensions D={d}, Dv={dv} do not fit in shared memory")
    return fit + (4,)


def check_tiles(block_q, block_k, warps):
    """ValueError unless (Br, Bc, W) is a tiling the kernel supports: Br and Bc multiples of
    4·W (and Bc of 8), 1 <= W <= 8."""
    if not 1 <= warps <= 8:
        raise ValueError(f"tiles Br={block_q} with W={warps} warps: 1 <= W <= 8")
    if block_q % (4 * warps) or block_k % (4 * warps) or block_k % GROUP or not block_q * block_k:
        raise ValueError(f"tiles Br={block_q}, Bc={block_k} need multiples of 4·W = "
                         f"{4 * warps} (and Bc of {GROUP})")
