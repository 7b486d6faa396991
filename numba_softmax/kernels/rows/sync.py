"""Blocks waiting for blocks: a barrier for a group of blocks, through a counter.

``cuda.syncthreads()`` makes the threads of *one* block wait for each other; nothing in
CUDA makes a few blocks of a grid wait for each other but memory.  :func:`group_barrier`
does it with one counter per group in global memory, the pattern CUDA's own grid sync is
built from (cooperative groups' ``sync_grids``):

    1. the block finishes what it must publish (``syncthreads``);
    2. thread 0 fences (*release*: the block's earlier writes — here its (m, ℓ) — are
       visible to any block that sees the arrival) and adds 1 to the group's counter;
    3. thread 0 spins, reading the counter (a relaxed load at GPU scope: it must come
       from L2, never a stale L1 line), until the whole group has arrived;
    4. thread 0 fences again (*acquire*: what the group published before arriving is
       visible to what this block reads next), and the block meets it (``syncthreads``).

The counter only grows: a group of ``size`` blocks that passes its k-th barrier has
counted (k + 1)·size arrivals, so each block waits for the next multiple of ``size``
above its own arrival — no reset between barriers or launches, as long as one counter
always serves groups of the same size (the launcher keeps one set per size).

Waiting needs every block of the group to be *running*: a block that spins while a
block of its group waits for a free multiprocessor would spin forever.  The kernels that
call this are cooperative launches (they call ``cuda.cg.this_grid()``), which the driver
refuses — with an error, not a hang — unless every block of the grid fits on the device
at once (:func:`.launcher.max_cooperative_blocks` says how many do).

The states a group exchanges are read back with the same relaxed load
(:func:`load_relaxed2`), from L2: the fence of step 4 already makes plain loads safe (CUDA's
grid sync relies on it), but a line of last row's states left in a block's L1 is then
not even a question.

Under the simulator the relaxed load is a plain read and the blocks of a cooperative
kernel run concurrently (:mod:`numba_softmax.runtime.sim`).
"""

from numba import cuda, int32

from ...runtime.sim import simulator_enabled
from ..hw import jit

if simulator_enabled():

    def load_relaxed(ary, i):
        return ary[i]

    def load_relaxed2(ary, i, j):
        return ary[i, j]

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    _PTX = {types.int64: ("b64", "l"), types.float64: ("f64", "d"), types.float32: ("f32", "f")}

    def _relaxed(context, builder, sig, args):
        at = sig.args[0]
        ary = context.make_array(at)(context, builder, value=args[0])
        index = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:])]
        ptr = cgutils.get_item_pointer(context, builder, at, ary, index, wraparound=False)
        suffix, constraint = _PTX[at.dtype]
        i64 = ir.IntType(64)
        value = context.get_value_type(at.dtype)
        asm = ir.InlineAsm(ir.FunctionType(value, [i64]), f"ld.relaxed.gpu.{suffix} $0, [$1];",
                           f"={constraint},l", side_effect=True)
        return builder.call(asm, [builder.ptrtoint(ptr, i64)])

    def _typed(ary):
        if ary.dtype not in _PTX:
            raise TypeError(f"load_relaxed: int64, float32 or float64 arrays; got {ary.dtype}")

    @intrinsic
    def load_relaxed(typingctx, ary, i):
        """ary[i] of a 1-D array, read with ``ld.relaxed.gpu``: from L2, every time."""
        _typed(ary)
        return ary.dtype(ary, i), _relaxed

    @intrinsic
    def load_relaxed2(typingctx, ary, i, j):
        """ary[i, j] of a 2-D array, read with ``ld.relaxed.gpu``."""
        _typed(ary)
        return ary.dtype(ary, i, j), _relaxed


@jit.device
def group_barrier(counters, g, size):
    """Wait until all ``size`` blocks of group ``g`` have arrived here as often as this
    one; what each wrote before arriving is then visible to all (``counters``: int64,
    one per group, only ever incremented)."""
    cuda.syncthreads()  # 1. the block's writes are done before thread 0 announces them
    if cuda.threadIdx.x == 0:
        cuda.threadfence()  # 2. release: this block's writes before its arrival
        arrived = cuda.atomic.add(counters, g, 1)
        target = (arrived // size + 1) * size
        while load_relaxed(counters, g) < target:  # 3. the group has not all arrived
            cuda.nanosleep(100)
        cuda.threadfence()  # 4. acquire: the group's writes before what follows
    cuda.syncthreads()  # the block waits for its thread 0


@jit.device
def last_to_finish(counters, ticket, count):
    """True, in every thread of its block, for the last of the ``count`` blocks that take
    a ticket from ``counters[ticket]`` (int32, zero before the launch) — each after
    writing what it publishes; that block then sees every other's writes and resets the
    counter for the next launch.  No block waits: the others just end.  (Used where the
    last piece of a row merges the pieces: decode's splits, the radix top-k's pieces.)"""
    cuda.threadfence()  # this block's writes are visible device-wide …
    cuda.syncthreads()  # … for every thread, before the ticket is taken
    last = cuda.shared.array(1, int32)
    if cuda.threadIdx.x == 0:
        last[0] = cuda.atomic.add(counters, ticket, 1) == count - 1
        if last[0]:
            counters[ticket] = 0  # ready for the next launch
            cuda.threadfence()  # and the others' writes are visible to us
    cuda.syncthreads()  # every thread reads the verdict
    return last[0] != 0
