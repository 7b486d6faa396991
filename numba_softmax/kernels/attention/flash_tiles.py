"""The layout of one block of the CUDA-core FlashAttention kernel (:mod:`numba_softmax.kernels.attention.attention`):
which lane holds which scores, where each tile sits in shared memory, and the copy of a
tile from global into shared memory.

Lanes (W warps; every warp owns 4·RPL query rows of the Br = 4·RPL·W rows of the tile)::

    lane = 8·rg + cg        rg ∈ 0…3 (row group), cg ∈ 0…7 (column group)
    rows of a lane          warp·4·RPL + rg + 4·i,              i < RPL
    S columns of a lane     cg + 8·jj,                          jj < CPL = Bc/8
    O columns of a lane     VV·cg + 8·VV·(jv // VV) + jv % VV,  jv < NPL = ⌈Dv/8⌉

Shared memory, float32, every tile row-major (one dynamic array, these offsets)::

    Q_i  Br × DP     scaled; DP = ⌈D/4⌉·4, plus 4 when DP/4 is even
    K_j  Bc × DP
    V_j  Bc × DVP    DVP = 8·NPL
    P    Br × CP     CP ≡ 8 (mod 32)

Both products contract along the contiguous axis, so every operand read is a 16-byte
``ld.shared.v4``: S += Q[rows, d:d+4]·K[cols, d:d+4] and O += P[rows, c:c+4]·V[c…c+3,
cols].  The strides make every such read one bank wavefront: with DP/4 odd, the 8 rows
cg + 8·jj of K that a warp reads at once start in 8 different 16-byte bank groups (and the
4 rows of Q in 4); with CP ≡ 8 (mod 32) the scalar stores of P by the 32 lanes
(4 rows × 8 columns) hit 32 different banks, and its float4 reads 4 bank groups; the V
reads are 8 lanes × VV consecutive values.
"""

import functools
import math
from typing import NamedTuple

import numpy as np

from numba import cuda

from ...runtime.sim import simulator_enabled

from ..hw import jit
from ...runtime import launcher
from . import tileio
from ..hw.jit import accumulator
from ...runtime import counters
from .visible import UNBOUNDED

GROUP = 8  # lanes that share a query row (the column groups)
MAX_WARPS = 8
SM90_SHARED = 227 * 1024  # the simulator checks nothing: tile as for sm_90's opt-in limit


def shared_limit():
    """Dynamic shared memory one block may use on this device."""
    return SM90_SHARED if simulator_enabled() else launcher.device_limits().shared_optin


class Layout(NamedTuple):
    d4: int  # D rounded up to whole float4s: the length of the d loop (zero padded)
    dp: int  # row stride of Q and K
    npl: int  # O columns per lane
    vv: int  # consecutive O columns a lane reads at once (4, 2 or 1)
    dvp: int  # row stride of V
    cp: int  # row stride of P
    q0: int  # offsets, in floats, of the four tiles
    k0: int
    v0: int
    p0: int
    floats: int  # total


def layout(d, dv, block_q, block_k):
    d4 = -(-d // 4) * 4
    dp = d4 if (d4 // 4) % 2 else d4 + 4
    npl = -(-dv // GROUP)
    vv = 4 if npl % 4 == 0 else 2 if npl % 2 == 0 else 1
    dvp = GROUP * npl
    cp = block_k + (8 - block_k) % 32
    k0 = block_q * dp
    v0 = k0 + block_k * dp
    p0 = v0 + block_k * dvp
    return Layout(d4, dp, npl, vv, dvp, cp, 0, k0, v0, p0, p0 + block_q * cp)


def shared_bytes(d, dv, block_q, block_k):
    """Bytes of dynamic shared memory one block uses."""
    return 4 * layout(d, dv, block_q, block_k).floats


def split_rows(block_q, rows_per_lane=None):
    """(warps W, rows per lane RPL) for Br = block_q = 4·RPL·W rows.  Default: 4 warps
    where that gives RPL in 1, 2, 4, 8 (the register tile grows with Br), else the largest
    RPL of 4, 2, 1 that tiles Br with at most 8 warps."""
    if block_q % 4 or block_q < 4:
        raise ValueError(f"block_q must be a positive multiple of 4, got {block_q}")
    if rows_per_lane is None:
        w = min(4, block_q // 4)
        if block_q % (4 * w) == 0 and block_q // (4 * w) in (1, 2, 4, 8):
            rows_per_lane = block_q // (4 * w)
        else:
            rows_per_lane = next((r for r in (4, 2, 1) if block_q % (4 * r) == 0
                                  and block_q // (4 * r) <= MAX_WARPS), 4)
    if rows_per_lane not in (1, 2, 4, 8) or block_q % (4 * rows_per_lane):
        raise ValueError(f"rows_per_lane must be 1, 2, 4 or 8 and divide block_q/4; got "
                         f"rows_per_lane={rows_per_lane}, block_q={block_q}")
    warps = block_q // (4 * rows_per_lane)
    if warps > MAX_WARPS:
        raise ValueError(f"block_q={block_q} with rows_per_lane={rows_per_lane} needs {warps} "
                         f"warps; at most {MAX_WARPS}")
    return warps, rows_per_lane


def check_tiles(d, dv, block_q, block_k, rows_per_lane=None):
    """ValueError unless (Br, Bc) = (block_q, block_k) is a tiling the kernel supports on
    this device (shared memory: the device's opt-in limit)."""
    split_rows(block_q, rows_per_lane)
    if block_k % GROUP or block_k < GROUP:
        raise ValueError(f"block_k must be a positive multiple of {GROUP}, got {block_k}")
    need, limit = shared_bytes(d, dv, block_q, block_k), shared_limit()
    if need > limit:
        raise ValueError(f"tiles block_q={block_q}, block_k={block_k} need {need} bytes of "
                         f"shared memory with D={d}, Dv={dv}; this device allows {limit}")


def fit_tiles(d, dv, small=False):
    """(Br, Bc) for head dimensions D, Dv: 128×64 (4 warps of 8×8 score tiles per lane)
    up to 64, 64×32 (4 warps, 4×4) up to 128 — each two blocks per multiprocessor in
    sm_90's shared memory; ``small``: the simulator's 2-warp tiles (8×16)."""
    if small:
        return 8, 16
    first = (128, 64) if max(d, dv) <= 64 else (64, 32)
    fit = launcher.first_fitting((first, (64, 32), (32, 32), (32, 16), (16, 16)),
                                 lambda t: shared_bytes(d, dv, *t), shared_limit())
    if fit is None:
        raise ValueError(f"head dimensions D={d}, Dv={dv} do not fit in shared memory")
    return fit


@functools.cache
def stager(dtype, threads, rows, cols, stride, width, batch=8, span=None):
    """Device function ``stage(dst, base, src, i0, i1, first, stop, sc)``: copy rows
    ``first`` … ``first + rows`` of ``src[i0, i1, :, :cols]`` (4-D) into the shared array
    ``dst`` (the accumulator type) at ``base + r·stride + c``, times ``sc``; rows at or
    past ``stop`` and the columns ``cols`` … ``span`` (default ⌈cols/4⌉·4) are written
    as 0.  (The forward and, with its own span, the CUDA-core backward stage through it.)

    Each thread takes chunks of ``width`` consecutive values (one 16-byte load when
    width·itemsize = 16; consecutive threads take consecutive chunks: coalesced), and
    loads a batch of them before it stores any — ``batch`` loads in flight, not one."""
    acc = accumulator(dtype)
    span = -(-cols // 4) * 4 if span is None else span
    per_row = -(-span // width)
    total = rows * per_row
    batch = max(1, min(batch, -(-total // threads)))
    sw = math.gcd(width, 16 // (acc.bitwidth // 8))  # values per shared store (16 bytes at most)
    BUF = batch * width
    load = tileio.global_load(width)
    store = tileio.shared_store(sw)

    @jit.device
    def stage(dst, base, src, i0, i1, first, stop, sc):
        buf = cuda.local.array(BUF, acc)
        t = cuda.threadIdx.x
        while t < total:  # one batch per iteration
            t1 = t
            for u in range(batch):  # the batch's loads, all in flight together
                r, c = t1 // per_row, (t1 % per_row) * width
                if t1 < total and first + r < stop and c < cols:
                    load(src, i0, i1, first + r, c, buf, u * width)
                    for e in range(width):
                        buf[u * width + e] *= sc
                else:
                    for e in range(width):
                        buf[u * width + e] = acc(0.0)
                t1 += threads
            t1 = t
            for u in range(batch):  # then their stores
                if t1 < total:
                    r, c = t1 // per_row, (t1 % per_row) * width
                    for s in range(width // sw):
                        store(dst, base + r * stride + c + s * sw, buf, u * width + s * sw)
                t1 += threads
            t += batch * threads

    return stage


def grid_of(n_b, sq, sk, o, lse, kv_chunk, cu_q, cu_k, max_seqlen_q):
    """The forward launch's (kv_chunk, splits Z, sequences, rows of the longest, cu_q,
    cu_k) from its arguments (:func:`.attention.launch`), checked: o and lse need Z·B rows
    on their first axis; varlen needs both offsets and (1, H, total, ·) views."""
    splits = 1
    if kv_chunk is None:
        kv_chunk = UNBOUNDED
    else:
        kv_chunk = int(kv_chunk)
        if kv_chunk < 1:
            raise ValueError(f"kv_chunk must be >= 1, got {kv_chunk}")
        splits = max(1, -(-sk // kv_chunk))
    if o.shape[0] != splits * n_b or lse.shape[0] != splits * n_b:
        raise ValueError(f"o and lse need {splits}·{n_b} rows on their first axis for "
                         f"{splits} splits, got {o.shape[0]} and {lse.shape[0]}")
    if splits > 65535:
        raise ValueError(f"at most 65535 key splits per launch, got {splits}")
    if (cu_q is not None) != (cu_k is not None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together")
    if cu_q is None:
        cu_q = cu_k = counters.placeholder(1, np.int32)
        return kv_chunk, splits, n_b, sq, cu_q, cu_k
    if n_b != 1:
        raise ValueError(f"varlen: q, k, v are (1, H, total, D) views, got batch {n_b}")
    rows = sq if max_seqlen_q is None else int(max_seqlen_q)
    return kv_chunk, splits, cu_q.shape[0] - 1, rows, cu_q, cu_k
