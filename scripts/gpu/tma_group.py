"""A probe for issue 13: the group kernel with its pieces moved by the tensor memory
accelerator (TMA) instead of by every thread.  GPU (sm_90) or the simulator; prints only.

    python scripts/gpu/tma_group.py [--configs 256x4x2,512x2x2,256x4x1]

The group kernel as shipped (:mod:`numba_softmax.kernels.group`) reaches 64–69 % of copy:
its threads load their share of the piece through registers, 32 bytes at a time each,
and hold at most 64 registers, so a multiprocessor keeps ~32 KB in flight — and it
spends ~26 instructions a value, half of them global addresses and bounds.  Here the
piece travels by ``cp.async.bulk`` (one instruction for the whole piece, its bytes
counted on an mbarrier in shared memory), the block folds it from shared memory, meets
its group exactly as the shipped kernel does, normalises it *in place*, and hands it
back to the TMA (``cp.async.bulk`` shared → global).  No thread holds a value across a
memory wait, and no thread computes a global address.

Per row and block (thread 0 issues, every thread computes):
  1. read      wait until the TMA has read the previous row's piece out of shared memory;
               expect the piece's bytes on the mbarrier; one bulk copy global → shared;
               every thread waits for the mbarrier's phase (it flips once a row);
  2. fold      thread t folds held[t], held[t + T], …: consecutive words, no bank
               conflicts; the block's (m_b, ℓ_b) by the team combine;
  3. exchange  post, group barrier, fold the group's posted states — the shipped code;
  4. write     normalise in place; ``fence.proxy.async`` (the generic writes, visible
               to the async proxy); a block barrier; one bulk copy shared → global.

With one buffer a block (tree a26a8ed, NVIDIA H200) the probe was correct and slow:
29–51 % of copy in float32, every row a chain of waits (docs/algorithms/group.md).  With
two (the default now; not yet run on a GPU), thread 0 asks for the *next* row's piece,
into the other buffer, before this row is folded, exchanged and written — each buffer
with its own mbarrier, whose phase flips every second row.

Needs rows of whole 16-byte pieces: contiguous rows, n·b and each piece a multiple of 16
bytes, 16-byte aligned data.  Under the simulator the TMA is a copy loop run by thread
0 and the mbarrier is always complete (a block barrier after the issue orders them).
Checks every shape against torch (GPU) or NumPy (simulator) before timing it.
"""

import argparse
import functools
import math
import os
import sys

import numpy as np
from numba import cuda, uint64

from numba_softmax import _sim
from numba_softmax._sim import simulator_enabled
from numba_softmax.combine import combine_device
from numba_softmax.kernels import group, jit, launcher, split, vector
from numba_softmax.kernels.epilogue import SOFTMAX, base, row_constant
from numba_softmax.kernels.ptx import nan_max
from numba_softmax.kernels.reduce import team_combine
from numba_softmax.kernels.sync import group_barrier

V = 8  # values a thread takes from shared memory per step of the fold

if simulator_enabled():
    def mbar_init(bar, k, count):
        bar[k] = 0

    def mbar_expect(bar, k, nbytes):
        pass

    def mbar_wait(bar, k, parity):
        return 1

    def bulk_load(held, at, x, row, col, count, bar, k):
        for i in range(count):
            held[at + i] = x[row, col + i]

    def bulk_store(y, row, col, held, at, count):
        for i in range(count):
            y[row, col + i] = held[at + i]

    def bulk_commit():
        pass

    def bulk_wait_read():
        pass

    def bulk_wait():
        pass

    def fence_proxy_async():
        pass
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from numba_softmax.kernels.mma import _address, _asm, _item, _plain, _shared

    _I32 = ir.IntType(32)

    def _u32(context, builder, v, t):
        return builder.trunc(context.cast(builder, v, t, types.int64), _I32)

    def _smem(context, builder, sig, args, a, i):
        """The 32-bit shared address of args[a][args[i]]."""
        return _shared(context, builder, sig.args[a], args[a], args[i], sig.args[i])

    def _nbytes(context, builder, sig, args, n, ary):
        size = context.get_abi_sizeof(context.get_data_type(sig.args[ary].dtype))
        return builder.mul(_u32(context, builder, args[n], sig.args[n]), ir.Constant(_I32, size))

    @intrinsic
    def mbar_init(typingctx, bar, k, count):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(),
                 [_smem(context, builder, sig, args, 0, 1), _u32(context, builder, args[2], sig.args[2])],
                 "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", side_effect=True)
            return context.get_dummy_value()

        return types.void(bar, k, count), codegen

    @intrinsic
    def mbar_expect(typingctx, bar, k, nbytes):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(),
                 [_smem(context, builder, sig, args, 0, 1), _u32(context, builder, args[2], sig.args[2])],
                 "{ .reg .b64 %mbst; mbarrier.arrive.expect_tx.shared::cta.b64 %mbst, [$0], $1; }",
                 "r,r,~{memory}", side_effect=True)
            return context.get_dummy_value()

        return types.void(bar, k, nbytes), codegen

    @intrinsic
    def mbar_wait(typingctx, bar, k, parity):
        def codegen(context, builder, sig, args):
            return _asm(builder, _I32,
                        [_smem(context, builder, sig, args, 0, 1), _u32(context, builder, args[2], sig.args[2])],
                        "{ .reg .pred %mbp; mbarrier.try_wait.parity.shared::cta.b64 %mbp, [$1], $2; "
                        "selp.u32 $0, 1, 0, %mbp; }", "=r,r,r,~{memory}", side_effect=True)

        return types.uint32(bar, k, parity), codegen

    @intrinsic
    def bulk_load(typingctx, held, at, x, row, col, count, bar, k):
        def codegen(context, builder, sig, args):
            src = _item(context, builder, sig.args[2], args[2], [(args[3], sig.args[3]), (args[4], sig.args[4])])
            _asm(builder, ir.VoidType(),
                 [_smem(context, builder, sig, args, 0, 1), _address(builder, src, 1, 64),
                  _nbytes(context, builder, sig, args, 5, 2), _smem(context, builder, sig, args, 6, 7)],
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
                 "r,l,r,r,~{memory}", side_effect=True)
            return context.get_dummy_value()

        return types.void(held, at, x, row, col, count, bar, k), codegen

    @intrinsic
    def bulk_store(typingctx, y, row, col, held, at, count):
        def codegen(context, builder, sig, args):
            dst = _item(context, builder, sig.args[0], args[0], [(args[1], sig.args[1]), (args[2], sig.args[2])])
            _asm(builder, ir.VoidType(),
                 [_address(builder, dst, 1, 64), _smem(context, builder, sig, args, 3, 4),
                  _nbytes(context, builder, sig, args, 5, 0)],
                 "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;", "l,r,r,~{memory}",
                 side_effect=True)
            return context.get_dummy_value()

        return types.void(y, row, col, held, at, count), codegen

    bulk_commit = _plain("cp.async.bulk.commit_group;")
    bulk_wait_read = _plain("cp.async.bulk.wait_group.read 0;")
    bulk_wait = _plain("cp.async.bulk.wait_group 0;")
    fence_proxy_async = _plain("fence.proxy.async.shared::cta;")


@functools.cache
def kernel(dtype, threads, per_sm, buffers):
    """``buffers`` 1: a block's piece in one buffer, every row a chain of waits; 2: the
    next row's piece is already in flight (the other buffer) while this row is folded,
    exchanged and written."""
    acc = jit.accumulator(dtype)
    to_acc = jit.loader(dtype)
    store = jit.storer(dtype)
    raw = vector.storage_type(dtype)
    fold_posted = split.posted_folder(dtype)
    itemsize = np.dtype(dtype).itemsize

    @jit.kernel(launch_bounds=(threads, per_sm))
    def group_tma(x, y, size, piece, m_ws, l_ws, counters):
        cuda.cg.this_grid()  # a cooperative launch: every block resident, or no launch
        groups = cuda.gridDim.x // size
        g, b = cuda.blockIdx.x // size, cuda.blockIdx.x % size
        t, T = cuda.threadIdx.x, threads
        n, rows = x.shape[1], x.shape[0]
        held = cuda.shared.array(0, raw)  # the block's buffers of `piece` values, memory order
        bar = cuda.shared.array(2, uint64)  # an mbarrier a buffer: the TMA counts its bytes
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        v = cuda.local.array(V, acc)
        h0 = b * piece
        count = max(min(h0 + piece, n) - h0, 0)  # values of x[row, h0:h1]
        if t == 0:
            for k in range(buffers):
                mbar_init(bar, k, 1)  # one arrival (thread 0's expect) a phase
            fence_proxy_async()  # the initialised mbarriers, visible to the TMA
        cuda.syncthreads()  # the mbarriers exist before anyone waits on them
        if buffers == 2 and t == 0 and count > 0 and g < rows:
            mbar_expect(bar, 0, count * itemsize)  # the prologue: the first row's piece
            bulk_load(held, 0, x, g, h0, count, bar, 0)
        it, row = 0, g
        while row < rows:
            cur = it % buffers
            at = cur * piece  # this row's buffer
            # 1. read: the TMA brings a piece; a buffer's phase flips when its bytes are in
            if t == 0 and count > 0:
                if buffers == 1:
                    bulk_wait_read()  # the last row's store has read its piece out of held
                    mbar_expect(bar, 0, count * itemsize)
                    bulk_load(held, 0, x, row, h0, count, bar, 0)
                elif row + groups < rows:  # the next row's piece, into the other buffer
                    bulk_wait_read()  # (whose last store has read it out)
                    mbar_expect(bar, 1 - cur, count * itemsize)
                    bulk_load(held, (1 - cur) * piece, x, row + groups, h0, count, bar, 1 - cur)
            cuda.syncthreads()  # (the simulator's copy is done; on the GPU a no-op wait)
            if count > 0:
                while mbar_wait(bar, cur, (it // buffers) % 2) == 0:
                    pass
            # 2. fold from chip: thread t's values held[at + t + k·T], V at a time
            m, l = acc(-math.inf), acc(0.0)
            i = t
            while i < count:
                mc = acc(-math.inf)
                for k in range(V):
                    j = i + k * T
                    v[k] = to_acc(held[at + j]) if j < count else acc(-math.inf)
                    mc = nan_max(mc, v[k])
                bc = base(mc, acc(0.0))
                lc = acc(0.0)
                for k in range(V):
                    lc += math.exp(v[k] - bc)
                m, l = combine_device(m, l, mc, lc)
                i += V * T
            m, l = team_combine(m, l, m_slots, l_slots, T)  # the block's (m_b, ℓ_b)
            # 3. exchange: as the shipped kernel (two alternating sets of slots)
            slot = (it % 2) * groups + g
            if t == 0:
                m_ws[slot, b] = m
                l_ws[slot, b] = l
            group_barrier(counters, g, size)
            m, l = fold_posted(m_ws, l_ws, slot, size, t, T, m_slots, l_slots)
            c = row_constant(m, l, acc(1.0), SOFTMAX)
            # 4. write: normalise in place, then the TMA takes the piece out
            bm = base(m, acc(0.0))
            i = t
            while i < count:
                held[at + i] = store(math.exp(to_acc(held[at + i]) - bm) * c)
                i += T
            fence_proxy_async()  # these writes, visible to the TMA's (async) reads
            cuda.syncthreads()  # every value normalised before the copy out
            if t == 0 and count > 0:
                bulk_store(y, row, h0, held, at, count)
                bulk_commit()
            it += 1
            row += groups
        if t == 0:
            bulk_wait()  # the last stores finished before the block's shared memory goes

    return _sim.cooperative(group_tma)


def launch(x, y, threads=256, per_sm=4, buffers=2, unit=None, shared=None, stream=0):
    """(plan, run): the TMA group launch on (rows, n) device arrays, float32 or float16.
    Pieces are whole ``unit``s (default a 16-byte vector for every thread, as the shipped
    kernel's chunks: the same group sizes); each block has ``buffers`` of them."""
    rows, n = x.shape
    itemsize = x.dtype.itemsize
    vector_values = 16 // itemsize  # whole 16-byte vectors: every piece and every address
    unit = unit or threads * vector_values
    if (n * itemsize) % 16 or unit % vector_values:
        raise ValueError(f"rows and pieces of whole 16-byte vectors only; n = {n}, unit {unit}")
    k = kernel(x.dtype, threads, per_sm, buffers)
    m_ws, l_ws = split.workspace(1, 1, split.workspace_dtype(x.dtype), stream)
    args = (x, y, 1, 1, m_ws, l_ws, group.counters(1, 1, stream))
    limits = launcher.device_limits()
    cap = min(limits.shared_optin, limits.shared_per_sm // per_sm) - 2048
    if shared is not None:
        cap = min(cap, shared)
    values = cap // buffers // itemsize // unit * unit  # a buffer's values
    resident = launcher.max_cooperative_blocks(k, args, threads, buffers * values * itemsize)
    resident = min(resident, per_sm * limits.sms)
    size, groups, piece, spill = group.split_row(rows, n, unit, values, resident)
    if spill:
        raise ValueError(f"{rows} x {n}: does not fit on chip ({size} blocks of {piece})")
    m_ws, l_ws = split.workspace(2 * groups, size, split.workspace_dtype(x.dtype), stream)
    args = (x, y, size, piece, m_ws, l_ws, group.counters(size, groups, stream))
    shared_bytes = buffers * piece * itemsize

    def run():
        launcher.launch(k, size * groups, threads, stream, args, shared=shared_bytes)

    return (size, groups, piece), run


def simulate():
    """The simulator's check: groups of two to four blocks, a 'shared memory' of 256 bytes a buffer,
    several rows a group (the buffers' turns and phases), one and two buffers."""
    rng = np.random.default_rng(0)
    for buffers in (1, 2):
        for rows, n in ((3, 96), (5, 40), (2, 200), (7, 48)):
            x = rng.standard_normal((rows, n)).astype(np.float32)
            x[0, 5] = -np.inf
            dx, dy = cuda.to_device(x), cuda.to_device(np.full_like(x, np.nan))
            (size, groups, piece), run = launch(dx, dy, threads=32, per_sm=1, buffers=buffers,
                                                unit=4, shared=256 * buffers)
            run()
            want = np.exp(x - x.max(1, keepdims=True))
            want /= want.sum(1, keepdims=True)
            err = np.abs(dy.copy_to_host() - want).max()
            print(f"sim {buffers} buffer(s) {rows}x{n}: size {size} groups {groups} piece {piece}: "
                  f"max error {err:.1e}")
            assert err < 1e-6, err


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="256x4x2,256x2x2,512x2x2,128x8x2,256x4x1",
                   help="threads x blocks a multiprocessor x buffers, comma-separated")
    a = p.parse_args()
    configs = [tuple(int(v) for v in c.split("x")) for c in a.configs.split(",")]
    if simulator_enabled():
        simulate()
        return
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from _timing import RowSets, kernel_ms

    print(f"device: {torch.cuda.get_device_name()}")
    shapes = [((1024, 65536), torch.float32), ((256, 262144), torch.float32),
              ((128, 1048576), torch.float32), ((256, 262144), torch.float16)]
    for (rows, n), dt in shapes:
        r = RowSets(rows, n, dt)
        sets, ys, nx, ny, want, gbps = r.sets, r.ys, r.nx, r.ny, r.want, r.gbps
        copy = r.copy_gbps()
        shipped = gbps(kernel_ms(lambda i: group.launch(nx[i], ny[i], SOFTMAX), sets))
        print(f"{dt} {rows}x{n}: copy {copy:.0f} GB/s | group as shipped {shipped:.0f} "
              f"({100 * shipped / copy:.1f} %)", flush=True)
        for threads, per_sm, buffers in configs:
            line = f"  tma {threads}x{per_sm}, {buffers} buffer(s):"
            try:
                runs = [launch(nx[i], ny[i], threads, per_sm, buffers) for i in range(sets)]
                (size, groups, piece), _ = runs[0]
                ys[0].fill_(float("nan"))
                runs[0][1]()
                err = float((ys[0].float() - want).abs().max())
                if not err < 1e-3:
                    print(line + f" WRONG: max error {err:.2e}", flush=True)
                    continue
                ms = kernel_ms(lambda i: runs[i][1](), sets)
                line += (f" {gbps(ms):.0f} GB/s ({100 * gbps(ms) / copy:.1f} % of copy; size {size} "
                         f"groups {groups} piece {piece}; max error {err:.1e})")
            except Exception as e:  # noqa: BLE001 - the probe reports what failed and goes on
                line += f" {type(e).__name__}: {str(e)[:300]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
