"""How the simulator runs blocks, made fit for this project's kernels (used only under
``NUMBA_ENABLE_CUDASIM=1``; installed by :func:`numba_softmax.runtime.sim.install`).

* **Barriers, not polling.**  The simulator's block manager polls every thread in a busy
  loop, which holds the interpreter lock against the very threads it waits for; here a
  block's ``syncthreads`` is a :class:`Barrier` (each waiter sleeps on a lock of its
  own) and its threads start together behind a gate.
* **Cooperative grids.**  The simulator runs blocks one after another, so a block that
  waits for another (a grid sync, or a spin on a counter another block increments)
  would wait forever.  :func:`cooperative` marks a kernel whose blocks wait on each
  other; its blocks then all run at once — each with its own shared memory, as on the
  GPU — and ``cuda.cg.this_grid().sync()`` becomes a barrier of every thread of every
  block.  A failing block aborts the grid (the barrier breaks, ``nanosleep`` raises), so
  a spinning peer cannot hang the test.  On the GPU the driver's cooperative launch
  gives the same guarantee for real: every block is resident at once.
* **Shared arrays made once, under a lock**, and **the fake ``cuda`` swapped into a
  module once per launch** instead of around every device-function call
  (:mod:`.sim_calls`).

Together they make the simulator's test runs several times shorter (``docs/testing.md``).
"""

import _thread
import sys
import threading
import time

from . import sim_calls

LOCK = threading.Lock()


class Barrier:
    """A barrier of ``parties`` threads in which each waiter sleeps on a lock of its own
    and the last to arrive releases them: no lock convoy on wake-up, so faster than
    ``threading.Barrier`` for a warp's 32 threads.  ``leave()`` lowers the count for a
    thread that has returned (on the GPU an exited thread no longer counts at a block
    barrier); ``abort()`` releases every waiter with an error (a thread failed)."""

    def __init__(self, parties):
        self.parties, self.lock, self.waiters, self.broken = parties, _thread.allocate_lock(), [], False

    def wait(self):
        self.lock.acquire()
        if self.broken:
            self.lock.release()
            raise RuntimeError("block aborted: another thread failed")
        if len(self.waiters) + 1 >= self.parties:
            self._release()
            return
        me = _thread.allocate_lock()
        me.acquire()
        self.waiters.append(me)
        self.lock.release()
        me.acquire()  # until the last one arrives (or the block aborts)
        if self.broken:
            raise RuntimeError("block aborted: another thread failed")

    def leave(self):
        self.lock.acquire()
        self.parties -= 1
        if self.waiters and len(self.waiters) >= self.parties:
            self._release()
        else:
            self.lock.release()

    def abort(self):
        self.lock.acquire()
        self.broken = True
        self._release()

    def _release(self):  # called holding self.lock; releases it
        waiters, self.waiters = self.waiters, []
        self.lock.release()
        for w in waiters:
            w.release()


def cooperative(kernel):
    """Mark ``kernel`` (a ``jit.kernel``) as one whose blocks wait for each other: under the
    simulator its blocks then run concurrently.  A no-op on the GPU (Numba launches a
    kernel that calls ``cuda.cg.this_grid()`` cooperatively by itself)."""
    from .sim import simulator_enabled

    if simulator_enabled():
        kernel.fn._ns_cooperative = True
    return kernel


class _Grid:
    """The state of one cooperative launch: blocks waiting to start, the grid barrier,
    each block's shared memory."""

    def __init__(self, blocks, threads):
        self.blocks = blocks
        self.pending = []
        self.barrier = Barrier(blocks * threads)
        self.shared = {}
        self.aborted = False


def running_grid():
    """The running cooperative launch, or None."""
    from numba.cuda.simulator.kernel import _get_kernel_context

    ctx = _get_kernel_context()
    return getattr(ctx, "_ns_grid", None) if ctx is not None else None


def _block_manager_class():
    from numba.cuda.simulator import kernel as simkernel

    base = getattr(simkernel.BlockManager, "_ns_base", simkernel.BlockManager)

    class Thread(simkernel.BlockThread):
        def syncthreads(self):
            self._manager._ns_barrier.wait()

        def run(self):
            try:
                super().run()  # (stores an exception in self.exception)
            finally:
                failed = self.exception is not None
                if failed:
                    self._manager._ns_barrier.abort()
                self._manager._ns_barrier.leave()
                from .sim import lane_done

                lane_done(self, failed)  # its warp's shuffles wait for it no more

    class BlockManager(base):
        """Runs a block's threads with a :class:`Barrier` for ``syncthreads`` (the
        simulator's own manager polls every thread in a busy loop, which holds the
        interpreter lock against the very threads it waits for); runs a cooperative
        kernel's blocks all at once."""

        _ns_base = base

        def run(self, grid_point, *args):
            if not getattr(self._f, "_ns_cooperative", False):
                return self._run_block(grid_point, args)
            from numba.cuda.simulator.kernel import _get_kernel_context

            ctx = _get_kernel_context()
            blocks = 1
            for d in self._grid_dim:
                blocks *= d
            with LOCK:
                grid = ctx.__dict__.setdefault("_ns_grid", _Grid(blocks, self._threads()))
                grid.pending.append((self, grid_point))
                if len(grid.pending) < blocks:
                    return None  # the last block of the grid starts them all
            errors = []

            def one(manager, point):
                try:
                    manager._run_block(point, args)
                except BaseException as e:  # abort the grid: no peer may wait forever
                    errors.append(e)
                    grid.aborted = True
                    grid.barrier.abort()

            runners = [threading.Thread(target=one, args=p, daemon=True) for p in grid.pending]
            for r in runners:
                r.start()
            for r in runners:
                r.join()
            if errors:
                first = [e for e in errors if "aborted" not in str(e)
                         and not isinstance(e, threading.BrokenBarrierError)]
                raise (first or errors)[0]
            return None

        def _threads(self):
            threads = 1
            for d in self._block_dim:
                threads *= d
            return threads

        def _run_block(self, grid_point, args):
            import numpy as np

            self._ns_barrier = Barrier(self._threads())
            gate = Barrier(self._threads() + 1)  # no thread runs before all have started

            def target():
                gate.wait()
                self._f(*args)

            threads = [Thread(target, self, grid_point, point, self._debug)
                       for point in np.ndindex(*self._block_dim)]
            for t in threads:
                t.start()  # (cheap while the others wait at the gate: 64 starts took 0.17 s)
            gate.wait()
            for t in threads:
                t.join()
            failed = [t for t in threads if t.exception is not None]
            first = [t for t in failed if "aborted" not in str(t.exception[0])] or failed
            if first:
                raise first[0].exception[0].with_traceback(first[0].exception[1])

    return BlockManager


def _grid_sync(self):
    """``cuda.cg.this_grid().sync()``: every thread of every block of a cooperative grid
    meets; in any other kernel the simulator's own (one-block) grid sync."""
    grid = running_grid()
    if grid is None:
        return threading.current_thread().syncthreads()
    grid.barrier.wait()


def _shared(self):
    """``cuda.shared``: one shared memory per block of a cooperative grid (its blocks run
    at once); the simulator's single one otherwise."""
    grid = getattr(self, "_ns_grid", None)
    if grid is None:
        return self._shared
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    block = tuple(threading.current_thread().blockIdx)
    with LOCK:
        if block not in grid.shared:
            grid.shared[block] = FakeCUDAShared(self._shared._dynshared_size)
        return grid.shared[block]


def _shared_array(self, shape, dtype, alignment=None):
    """``cuda.shared.array`` as the simulator's, but made once per source line under a
    lock: the simulator's own version looks the line up and stores a new array in two
    steps, so two threads starting together could each make their own "shared" array
    (seen as a rare wrong logsumexp once threads started at the same moment)."""
    if shape == 0 or alignment is not None:
        return _FakeShared_array(self, shape, dtype, alignment)
    from numba.cuda.np import numpy_support
    from numba.cuda import types as nbtypes
    import numpy as np

    if isinstance(dtype, nbtypes.Type):
        dtype = numpy_support.as_dtype(dtype)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with LOCK:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = np.empty(shape, dtype)
    return res


_FakeShared_array = None


def _nanosleep(self, ns):
    """``cuda.nanosleep``: yield the interpreter; raises once the cooperative grid has
    aborted (a spinning block would otherwise wait forever for a failed peer)."""
    grid = running_grid()
    if grid is not None and grid.aborted:
        raise RuntimeError("cooperative grid aborted: another block failed")
    time.sleep(0)


def install():
    """Patch the simulator (idempotent)."""
    global _FakeShared_array
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, FakeCUDAShared, GridGroup

    FakeCUDAModule.nanosleep = _nanosleep
    FakeCUDAModule.shared = property(_shared)
    GridGroup.sync = _grid_sync
    if _FakeShared_array is None:
        _FakeShared_array = FakeCUDAShared.array
        FakeCUDAShared.array = _shared_array
    sim_calls.install()
    if not hasattr(simkernel.BlockManager, "_ns_base"):
        simkernel.BlockManager = _block_manager_class()
