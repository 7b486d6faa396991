"""Thread-block clusters (sm_90): blocks that run together and write into each other's
shared memory.  Numba has no API for them; each primitive here is one or two PTX
instructions in an ``@intrinsic``, as :mod:`.mma` does for the tensor cores.

    rank(size)                       this block's place in its cluster (``%cluster_ctarank``)
    arrive() … wait()                the cluster barrier in two halves: ``arrive`` says "this
                                     block has started", ``wait`` returns once every block
                                     of the cluster has said so (nothing is ordered by it)
    sync()                           the whole barrier, release / acquire: every shared-memory
                                     write before it, local or remote, is visible after it
    store_remote(ary, i, r, size, v) ary[i] = v in the shared memory of block r of this
                                     cluster (``mapa`` maps the address, ``st.shared::cluster``)

A cluster's blocks are launched together on one GPC — the hardware's guarantee, not a
cooperative launch's — and the launch asks for them by a function attribute
(:func:`.launcher.launch`'s ``cluster``).  The rule of distributed shared memory: a
block may write into a peer only once the peer has started (``arrive`` early, ``wait``
just before the first remote store), and must not write into one that may have exited
(here every remote store comes before the last ``sync``).

Under the simulator: the kernel is a cooperative one (:func:`numba_softmax.runtime.sim.cooperative`:
its blocks run at once, each with its own shared memory), ``rank`` is the block index
modulo ``size``, the barriers are the grid's barrier (stronger than a cluster's), and
``store_remote`` finds the peer block's array made by the same ``cuda.shared.array`` line.
"""

from ...runtime.sim import simulator_enabled

if simulator_enabled():
    import threading

    from ...runtime.sim_blocks import LOCK, running_grid  # the running cooperative grid (simulator)

    def rank(size):
        return threading.current_thread().blockIdx.x % size

    def arrive():
        pass

    def wait():
        running_grid().barrier.wait()  # every thread of every block of the grid

    def sync():
        running_grid().barrier.wait()

    def store_remote(ary, i, r, size, value):
        grid = running_grid()
        me = tuple(threading.current_thread().blockIdx)
        peer = (me[0] - me[0] % size + r,) + me[1:]  # a cluster: consecutive block indices
        with LOCK:
            mine = grid.shared[me]._allocations  # this block's arrays, by source line
            line = next(k for k, v in mine.items() if v is ary)
            theirs = grid.shared[peer]._allocations[line]
        theirs[i] = value

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from ..hw.mma import inline_asm, plain_asm, shared_address

    _I32 = ir.IntType(32)
    _STORE = {types.float32: ("f32", "f"), types.float64: ("f64", "d")}

    @intrinsic
    def rank(typingctx, size):
        def codegen(context, builder, sig, args):
            return inline_asm(builder, _I32, [], "mov.u32 $0, %cluster_ctarank;", "=r")

        return types.uint32(size), codegen

    arrive = plain_asm("barrier.cluster.arrive.relaxed.aligned;")
    wait = plain_asm("barrier.cluster.wait.aligned;")
    sync = plain_asm("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;")

    @intrinsic
    def store_remote(typingctx, ary, i, r, size, value):
        if ary.dtype not in _STORE:
            raise TypeError(f"store_remote: float32 or float64 shared arrays; got {ary.dtype}")
        suffix, constraint = _STORE[ary.dtype]

        def codegen(context, builder, sig, args):
            address = shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            peer = builder.trunc(context.cast(builder, args[2], sig.args[2], types.int64), _I32)
            value = context.cast(builder, args[4], sig.args[4], ary.dtype)
            inline_asm(builder, ir.VoidType(), [address, peer, value],
                 "{ .reg .b32 %remote; mapa.shared::cluster.u32 %remote, $0, $1; "
                 f"st.shared::cluster.{suffix} [%remote], $2; }}", f"r,r,{constraint},~{{memory}}",
                 side_effect=True)
            return context.get_dummy_value()

        return types.void(ary, i, r, size, value), codegen
