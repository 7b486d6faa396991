"""The two folds at the end of the decode kernel (:mod:`.decode`): across the warps of a
block, and across the Z blocks (splits) of a K/V head — both the combiner over (m, ℓ, O);
and the two index maps both decode kernels share (:func:`block_of`, :func:`row_of`).

``fold_warps``: every warp holds, per query row, a state (m, ℓ, O) over its keys (O in
the lanes of one key slot, 8 columns a lane; :mod:`.decode_tc`: in mma accumulator
fragments).  They meet in shared memory (:func:`fold_shared`); one thread per
row folds the W pairs (m, ℓ) into the row's (m, ℓ) and leaves each warp's factor
exp(m_w − m)/ℓ; then every thread forms output columns Σ_w factor_w·O_w.  The result is
normalised: with one split it is the answer (o, lse); with Z splits it is the partial
(O_z, LSE_z), written to the float32 workspace.

``fold_splits`` (run by the last block of the Z to finish, see :mod:`.decode`): an
(O_z, LSE_z) pair is the state (m = LSE_z, ℓ = 1, O_z), so the same fold again, over z::

    m = max_z LSE_z,   ℓ = Σ_z exp(LSE_z − m),   O = Σ_z exp(LSE_z − m)·O_z / ℓ

A warp per row folds its Z states (LSE_z, 1) with the combiner's butterfly
(:func:`.reduce.warp_combine`, lane z holding split z) and leaves each split's factor
exp(LSE_z − m)/ℓ in shared memory, while every thread's first partials are already on
their way.  (It was a serial fold by one thread per row behind two barriers: the whole
kernel at B 1, 8 heads, 1024 keys, 16 splits, float32 took 12.2 µs on an H200; now 9.3.)
Then the block's threads split the output into 4-column pieces, TPI threads per piece,
each reading every TPI-th partial of its piece a batch at a time (16-byte loads, all in
flight), and the TPI sums meet in shared memory — one round trip to L2, not Z of them.
"""

import functools
import math

from numba import cuda

from ..combine import combine_device, lse_device, weight_device
from ..combine import larger_device as nan_max
from . import jit, tileio
from .jit import accumulator
from .reduce import warp_combine
from .sync import last_to_finish

MAX_SPLITS = 64
EPL = 8  # output columns per lane in the decode kernel


def _row(pr, hk, group):
    """Packed row pr of K/V head hk → (query head, query index)."""
    i, g = jit.udivmod(pr, group)
    return hk * group + g, i


def _block(n_chunks, splits, n_kv):
    """This block → (row chunk rc, split z, K/V head hk, batch b): block x =
    ((b·Hkv + hk)·Z + z)·chunks + rc, the chunks of one head adjacent."""
    x, rc = jit.udivmod(cuda.blockIdx.x, n_chunks)
    x, z = jit.udivmod(x, splits)
    b, hk = jit.udivmod(x, n_kv)
    return rc, z, hk, b


row_of = jit.device(_row)
block_of = jit.device(_block)  # the grid of both decode kernels (decode_launch)


@functools.cache
def rebase(dtype):
    """Device function ``rebase(f, l, n, r, rows)``: fold the n states
    (m_k, ℓ_k) = (f[k·rows + r], l[k·rows + r]) of row r into the row's (m, ℓ), which it
    returns, and overwrite each f[k·rows + r] with the factor exp(m_k − m)/ℓ that turns
    state k's O into its share of the normalised output (0 for every k when ℓ = 0:
    nothing was seen)."""
    acc = accumulator(dtype)

    @jit.device
    def fold(f, l, n, r, rows):
        mx = acc(-math.inf)
        for k in range(n):
            mx = nan_max(f[k * rows + r], mx)
        lt = acc(0.0)
        for k in range(n):
            lt += l[k * rows + r] * weight_device(f[k * rows + r], mx)
        inv = acc(1.0) / lt if lt != acc(0.0) else acc(0.0)
        for k in range(n):
            f[k * rows + r] = weight_device(f[k * rows + r], mx) * inv
        return mx, lt

    return fold


@functools.cache
def fold_warps(dtype, lanes_per_key, dv, rows, warps):
    """The CUDA-core kernel's fold: each warp's state (in its first key slot's lanes) to
    shared memory, then :func:`fold_shared`."""
    acc = accumulator(dtype)
    RB, LPK = rows, lanes_per_key
    DVP = LPK * EPL  # columns the lanes of a key slot cover
    N_STATE = warps * RB  # (a shared array's size must be a constant)
    finish = fold_shared(dtype, dv, DVP, rows, warps)

    @jit.device
    def fold(m, l, ov, t, o, lse, o_ws, lse_ws, z, splits, b, hk, group, pr0, n_rows):
        warp, lane = cuda.threadIdx.x >> 5, cuda.threadIdx.x & 31
        f_s = cuda.shared.array(N_STATE, acc)  # m of each warp's rows, then its factor
        l_s = cuda.shared.array(N_STATE, acc)
        o_s = cuda.shared.array(0, acc)  # W·RB·DVP: each warp's O
        if lane < LPK:  # the warp's state sits in its first key slot
            for r in range(RB):
                if t == 0:
                    f_s[warp * RB + r], l_s[warp * RB + r] = m[r], l[r]
                for c in range(EPL):
                    o_s[(warp * RB + r) * DVP + t * EPL + c] = ov[r * EPL + c]
        cuda.syncthreads()  # every warp's state is in shared memory
        finish(f_s, l_s, o_s, o, lse, o_ws, lse_ws, z, splits, b, hk, group, pr0, n_rows)

    return fold


@functools.cache
def fold_shared(dtype, dv, dvp, rows, warps):
    """Device function ``finish(f_s, l_s, o_s, …)``: the W warps' states of ``rows`` rows
    in shared memory — m in f_s[w·rows + r], ℓ in l_s[…], O (unnormalised) in
    o_s[(w·rows + r)·dvp + c] — folded into the block's normalised (O, LSE): the answer
    with one split, else the partial of split z.  Every thread of the block calls it."""
    acc = accumulator(dtype)
    store_o = jit.storer(dtype)
    RB, W, DVP, THREADS = rows, warps, dvp, 32 * warps
    fold_states = rebase(dtype)

    @jit.device
    def finish(f_s, l_s, o_s, o, lse, o_ws, lse_ws, z, splits, b, hk, group, pr0, n_rows):
        tid = cuda.threadIdx.x
        row_l = cuda.shared.array(RB, acc)
        if tid < RB:  # one thread per row: (m, ℓ) of the block, and each warp's factor
            mx, lt = fold_states(f_s, l_s, W, tid, RB)
            row_l[tid] = lt
            pr = pr0 + tid
            if pr < n_rows:
                h, i = row_of(pr, hk, group)
                if splits == 1:
                    lse[b, h, i] = lse_device(mx, lt)
                else:
                    lse_ws[z * o.shape[0] + b, h, i] = lse_device(mx, lt)
        cuda.syncthreads()  # the factors are ready
        for idx in range(tid, RB * dv, THREADS):
            r = idx // dv
            c, pr = idx - r * dv, pr0 + r
            if pr < n_rows:
                x = acc(0.0)
                for w in range(W):
                    x += f_s[w * RB + r] * o_s[(w * RB + r) * DVP + c]
                if row_l[r] == acc(0.0):
                    x = acc(0.0)  # the rows saw no key: O = 0, chosen (0·NaN is NaN)
                h, i = row_of(pr, hk, group)
                if splits == 1:
                    o[b, h, i, c] = store_o(x)
                else:
                    o_ws[z * o.shape[0] + b, h, i, c] = x

    return finish


@functools.cache
def fold_splits(dtype, dv, rows, warps, batch=None):
    acc = accumulator(dtype)
    store_o = jit.storer(dtype)
    RB, W, THREADS = rows, warps, 32 * warps
    NC = -(-dv // 4)  # 4-column chunks of a row (the workspace rows are padded to 4·NC)
    ITEMS = RB * NC
    TPI = max(1, THREADS // ITEMS)  # threads per 4 output columns: each folds every TPI-th z
    ZR, RED = MAX_SPLITS * RB, 4 * ITEMS * TPI
    # partials a thread loads before it uses any: 32 splits in one round where TPI ≥ 4,
    # no more (a small call's merge runs its code once: H200, 16 splits of one row, 8 at
    # a time 9.3 µs, 2 at a time 8.8)
    BATCH = batch or max(2, min(8, 32 // TPI))
    BUF = 4 * BATCH
    load4 = tileio.global_load(4)

    @jit.device
    def piece(idx):
        """Thread piece idx → (sub, item, row r, first column c): 4 columns of a row, and
        every TPI-th split from the sub-th."""
        sub, item = idx // ITEMS, idx % ITEMS
        r = item // NC
        return sub, item, r, (item - r * NC) * 4

    @jit.device
    def load_batch(o_ws, zz, splits, n_b, b, h, i, c, buf):
        for u in range(BATCH):  # all in flight together
            if zz + u * TPI < splits:
                load4(o_ws, (zz + u * TPI) * n_b + b, h, i, c, buf, 4 * u)

    @jit.device
    def fold(o_ws, lse_ws, o, lse, splits, b, hk, group, pr0, n_rows):
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        n_b = o.shape[0]
        f_s = cuda.shared.array(ZR, acc)  # each (z, row)'s factor exp(LSE_z − m)/ℓ
        l_s = cuda.shared.array(RB, acc)  # each row's ℓ
        red = cuda.shared.array(RED, acc)  # the TPI partial sums of every 4 columns
        buf = cuda.local.array(BUF, acc)
        # this thread's first BATCH partials: on their way while the rows fold below
        sub, item, r, c = piece(tid)
        if tid < ITEMS * TPI and pr0 + r < n_rows:
            h, i = row_of(pr0 + r, hk, group)
            load_batch(o_ws, sub, splits, n_b, b, h, i, c, buf)
        # a warp per row: lane z holds the state (LSE_z, 1); the combiner's butterfly
        for r in range(warp, RB, W):
            if pr0 + r < n_rows:  # (the same in every lane: whole warps shuffle)
                h, i = row_of(pr0 + r, hk, group)
                m, l = acc(-math.inf), acc(0.0)
                for z in range(lane, splits, 32):
                    m, l = combine_device(m, l, acc(lse_ws[z * n_b + b, h, i]), acc(1.0))
                m, l = warp_combine(m, l)
                inv = acc(1.0) / l if l != acc(0.0) else acc(0.0)
                for z in range(lane, splits, 32):
                    f_s[z * RB + r] = weight_device(acc(lse_ws[z * n_b + b, h, i]), m) * inv
                if lane == 0:
                    l_s[r] = l
                    lse[b, h, i] = lse_device(m, l)
        cuda.syncthreads()  # every factor is in shared memory
        for idx in range(tid, ITEMS * TPI, THREADS):  # lanes along the columns: coalesced
            sub, item, r, c = piece(idx)
            x0 = x1 = x2 = x3 = acc(0.0)
            if pr0 + r < n_rows:
                h, i = row_of(pr0 + r, hk, group)
                zz = sub
                while zz < splits:  # O = Σ_z exp(LSE_z − m)/ℓ · O_z, BATCH splits at a time
                    if idx != tid or zz != sub:  # (the first batch was loaded above)
                        load_batch(o_ws, zz, splits, n_b, b, h, i, c, buf)
                    for u in range(BATCH):
                        z = zz + u * TPI
                        if z < splits:
                            f = f_s[z * RB + r]
                            x0 += f * buf[4 * u]
                            x1 += f * buf[4 * u + 1]
                            x2 += f * buf[4 * u + 2]
                            x3 += f * buf[4 * u + 3]
                    zz += BATCH * TPI
            at = 4 * (sub * ITEMS + item)
            red[at], red[at + 1], red[at + 2], red[at + 3] = x0, x1, x2, x3
        cuda.syncthreads()  # every partial sum is in shared memory
        for item in range(tid, ITEMS, THREADS):
            r = item // NC
            c, pr = (item - r * NC) * 4, pr0 + r
            if pr < n_rows:
                h, i = row_of(pr, hk, group)
                for e in range(4):
                    x = acc(0.0)
                    for sub in range(TPI):
                        x += red[4 * (sub * ITEMS + item) + e]
                    if c + e < dv:  # a row that saw no key: O = 0, chosen (0·NaN is NaN)
                        o[b, h, i, c + e] = store_o(x if l_s[r] != acc(0.0) else acc(0.0))

    return fold


@functools.cache
def merge_when_last(dtype, dv, rows, warps):
    """Device function: with Z > 1 splits, the last of a row chunk's Z blocks to finish
    (an atomic ticket after a memory fence) folds the Z partials (:func:`fold_splits`).
    Every thread of the block calls it, after the block's partial is written."""
    fold_z = fold_splits(dtype, dv, rows, warps)

    @jit.device
    def merge(counters, ticket, o_ws, lse_ws, o, lse, splits, b, hk, group, pr0, n_rows):
        if last_to_finish(counters, ticket, splits):  # the others' partials are visible
            fold_z(o_ws, lse_ws, o, lse, splits, b, hk, group, pr0, n_rows)

    return merge

