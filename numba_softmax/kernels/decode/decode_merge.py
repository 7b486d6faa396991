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
(:func:`.reduce.warp_combine`, lane z holding splits z and z + 32) and leaves each
split's factor exp(LSE_z − m)/ℓ in shared memory, while every thread's first partials
are already on their way (a serial fold by one thread per row, behind two barriers,
left those loads waiting).  Then the block's threads split the output into 4-column pieces,
TPI threads per piece, each reading every TPI-th partial of its piece a batch at a time
(16-byte loads, all in flight), and the TPI sums meet in shared memory — one round trip
to L2, not Z of them.

**This code runs once, cold.**  One block a row chunk merges, once, so nothing of it is
in the instruction cache: its time is largely the fetch of its instructions (`ncu` puts
nearly half of its stall samples on instruction fetches).  So it is written to compile
small: the workspace keeps a row's Z partials in adjacent rows — row
((b·Hq + h)·Sq + i)·Z + z of a (B·Hq·Sq·Z, 4·⌈Dv/4⌉) float32 array, its LSEs adjacent
values of a flat one (:func:`workspace_row`) — so a partial's address is one add, where
the 4-D index (z·B + b, h, i, c) took ~30 instructions a load; and the loops over rows
and pieces have constant trip counts, compiled once each; shared-memory indices are
unsigned (no negative-index fix-ups), here and in the warps' fold every block runs at its
end: the merge compiles to about half the instructions it took with 4-D indices, and the
kernel's time falls with it (docs/algorithms/decode.md, "The merge compiled small").
"""

import functools
import math

from numba import cuda, float32
from numba import uint32 as u32

from ...combine import combine_device, lse_device, weight_device
from ...combine import larger_device as nan_max
from ..hw import jit, vector
from ..hw.jit import accumulator
from ..rows.reduce import warp_combine
from ..rows.sync import last_to_finish

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


@jit.device
def workspace_row(o, b, h, i, splits):
    """The workspace row of split 0 of query (b, h, i): ((b·Hq + h)·Sq + i)·Z — a row's
    Z partials are adjacent rows (its LSEs adjacent values), so split z is
    ``workspace_row(…) + z``."""
    return ((b * o.shape[1] + h) * o.shape[2] + i) * splits


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
        for k in range(n):  # (unsigned indices: no negative-index fix-ups)
            mx = nan_max(f[u32(k * rows + r)], mx)
        lt = acc(0.0)
        for k in range(n):
            lt += l[u32(k * rows + r)] * weight_device(f[u32(k * rows + r)], mx)
        inv = acc(1.0) / lt if lt != acc(0.0) else acc(0.0)
        for k in range(n):
            f[u32(k * rows + r)] = weight_device(f[u32(k * rows + r)], mx) * inv
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
                at = u32(warp * RB + r)  # (unsigned indices: no negative-index fix-ups)
                if t == 0:
                    f_s[at], l_s[at] = m[r], l[r]
                for c in range(EPL):
                    o_s[at * u32(DVP) + u32(t * EPL) + u32(c)] = ov[r * EPL + c]
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
    ROUNDS = -(-RB * dv // THREADS)  # of the output loop: a constant, compiled once each
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
                    lse_ws[workspace_row(o, b, h, i, splits) + z] = lse_device(mx, lt)
        cuda.syncthreads()  # the factors are ready
        for k in range(ROUNDS):
            idx = u32(tid + k * THREADS)  # (unsigned: no negative-index fix-ups)
            r = idx // u32(dv)
            c, pr = idx - r * u32(dv), pr0 + r
            if idx < u32(RB * dv) and pr < n_rows:
                x = acc(0.0)
                for w in range(W):
                    x += f_s[u32(w * RB) + r] * o_s[(u32(w * RB) + r) * u32(DVP) + c]
                if row_l[r] == acc(0.0) and splits == 1:
                    x = acc(0.0)  # the row saw no key: O = 0, chosen (0·NaN is NaN); a
                    # split's partial keeps its 0·NaN for the merge to weigh, as one pass would
                h, i = row_of(pr, hk, group)
                if splits == 1:
                    o[b, h, i, c] = store_o(x)
                else:
                    o_ws[workspace_row(o, b, h, i, splits) + z, c] = x

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
    # rounds of the block's threads over the rows (a warp each), the pieces and the
    # outputs: constants, so that each loop body is compiled once (this code runs once,
    # cold: its instructions' fetch is most of its time, see the module docstring)
    ROW_ROUNDS, PIECE_ROUNDS = -(-RB // W), -(-ITEMS * TPI // THREADS)
    OUT_ROUNDS = -(-ITEMS // THREADS)
    # partials a thread loads before it uses any: 32 splits in one round where TPI ≥ 4,
    # no more (a small call's merge runs its code once, and a longer batch is more code
    # to fetch: docs/algorithms/decode.md, "Measured")
    BATCH = batch or max(2, min(8, 32 // TPI))
    BUF = 4 * BATCH
    load4 = vector.io(4)[0]
    neg_inf = acc(-math.inf)

    @jit.device
    def piece(idx):
        """Thread piece idx → (sub, item, row r, first column c): 4 columns of a row, and
        every TPI-th split from the sub-th.  (Unsigned, as every shared-memory index
        here: no negative-index fix-ups.)"""
        idx = u32(idx)
        sub, item = idx // u32(ITEMS), idx % u32(ITEMS)
        r = item // u32(NC)
        return sub, item, r, (item - r * u32(NC)) * u32(4)

    @jit.device
    def load_batch(o_ws, at, zz, splits, c, buf):
        """Partials zz, zz + TPI, … (BATCH of them, those < splits) of the row whose
        split 0 is workspace row ``at``: columns c … c + 3 into buf, all in flight."""
        for u in range(BATCH):
            if zz + u * TPI < splits:
                load4(o_ws, at + zz + u * TPI, c, buf, 4 * u)

    @jit.device
    def fold(o_ws, lse_ws, o, lse, splits, b, hk, group, pr0, n_rows):
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        f_s = cuda.shared.array(ZR, acc)  # each (z, row)'s factor exp(LSE_z − m)/ℓ
        l_s = cuda.shared.array(RB, acc)  # each row's ℓ
        red = cuda.shared.array(RED, acc)  # the TPI partial sums of every 4 columns
        buf = cuda.local.array(BUF, float32)  # (the workspace's type)
        # this thread's first BATCH partials: on their way while the rows fold below
        sub, item, r, c = piece(tid)
        if tid < ITEMS * TPI and pr0 + r < n_rows:
            h, i = row_of(pr0 + r, hk, group)
            load_batch(o_ws, workspace_row(o, b, h, i, splits), sub, splits, c, buf)
        # a warp per row: lanes z and z + 32 hold the states (LSE_z, 1) of splits z, z + 32;
        # the combiner's butterfly
        for k in range(ROW_ROUNDS):
            r = u32(warp + k * W)
            if r < RB and pr0 + r < n_rows:  # (the same in every lane: whole warps shuffle)
                h, i = row_of(pr0 + r, hk, group)
                at = workspace_row(o, b, h, i, splits)
                x0 = acc(lse_ws[at + lane]) if lane < splits else neg_inf
                x1 = acc(lse_ws[at + lane + 32]) if lane + 32 < splits else neg_inf
                m, l = combine_device(x0, acc(1.0), x1, acc(1.0))  # (−inf weighs 0)
                m, l = warp_combine(m, l)
                inv = acc(1.0) / l if l != acc(0.0) else acc(0.0)
                if lane < splits:
                    f_s[u32(lane * RB) + r] = weight_device(x0, m) * inv
                if lane + 32 < splits:
                    f_s[u32((lane + 32) * RB) + r] = weight_device(x1, m) * inv
                if lane == 0:
                    l_s[r] = l
                    lse[b, h, i] = lse_device(m, l)
        cuda.syncthreads()  # every factor is in shared memory
        for k in range(PIECE_ROUNDS):  # lanes along the columns: coalesced
            idx = tid + k * THREADS
            sub, item, r, c = piece(idx)
            x0 = x1 = x2 = x3 = acc(0.0)
            if idx < ITEMS * TPI and pr0 + r < n_rows:
                h, i = row_of(pr0 + r, hk, group)  # (pr0 + r: signed, as every row index)
                at = workspace_row(o, b, h, i, splits)
                zz = sub
                while zz < splits:  # O = Σ_z exp(LSE_z − m)/ℓ · O_z, BATCH splits at a time
                    if k > 0 or zz != sub:  # (the first batch was loaded above)
                        load_batch(o_ws, at, zz, splits, c, buf)
                    for u in range(BATCH):
                        z = zz + u * TPI
                        if z < splits:
                            f = f_s[u32(z * RB) + r]
                            x0 += f * acc(buf[4 * u])
                            x1 += f * acc(buf[4 * u + 1])
                            x2 += f * acc(buf[4 * u + 2])
                            x3 += f * acc(buf[4 * u + 3])
                    zz += BATCH * TPI
            if idx < ITEMS * TPI:
                at = u32(4) * (sub * u32(ITEMS) + item)
                red[at], red[at + 1], red[at + 2], red[at + 3] = x0, x1, x2, x3
        cuda.syncthreads()  # every partial sum is in shared memory
        for k in range(OUT_ROUNDS):
            item = u32(tid + k * THREADS)
            r = item // u32(NC)
            c, pr = (item - r * u32(NC)) * u32(4), pr0 + r
            if item < u32(ITEMS) and pr < n_rows:
                h, i = row_of(pr, hk, group)
                for e in range(4):
                    x = acc(0.0)
                    for sub in range(TPI):
                        x += red[u32(4 * sub * ITEMS + e) + u32(4) * item]
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

