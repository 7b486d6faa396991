"""The one place every kernel is launched, and what a launch may ask of the device.

Each kernel module sizes its own launch (the launch configuration sits beside the kernel,
named, like quack's ``Softmax.__call__``) and hands it here::

    launcher.launch(kernel, grid, block, stream, (x, y), shared=nbytes)

This function

* refuses a GPU older than sm_80 with a clear error before the first compile
  (:func:`require_supported`), where ptxas would fail on an instruction deep in a kernel;
* checks the block against the *compiled* kernel's own limit (registers per thread and
  the kernel's max-threads attribute decide it, not a constant: a float64 kernel that
  holds several values per thread cannot run 1024 threads) and says so clearly instead
  of failing with ``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``;
* opts the kernel in to more than 48 KB of dynamic shared memory when it asks for it
  (``cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`` on the compiled kernel);
* launches it in thread-block clusters of ``cluster`` blocks when asked (sm_90: the
  compiled kernel's ``REQUIRED_CLUSTER_WIDTH`` attribute, so Numba's own launch — and a
  plan's replay of it — launches clusters, scheduled by load balancing; :mod:`.dsmem`;
  :func:`cluster_fits` says whether a cluster of more than the portable 8 runs);
* notes the launch while a launch plan is being recorded (:mod:`numba_softmax.plans`).

Cooperative kernels (those calling ``cuda.cg.this_grid().sync()``) are launched
cooperatively by Numba itself; :func:`max_cooperative_blocks` says how many blocks may
be co-resident, which such a grid must not exceed.

:func:`max_threads` and :func:`device_limits` are what the kernel modules size from.
On the CUDA simulator (one Python thread per CUDA thread) the limits are small (blocks of
at most 64 threads, a few KB of shared memory) and no attribute is set; the simulator does
not check them, so kernels launched there with larger blocks still run (slowly).
"""

import functools
import threading
import warnings
from typing import NamedTuple

from . import driver
from .sim import simulator_enabled
from .workspaces import scratch, workspace, workspace_holding  # noqa: F401 (launcher.workspace …)

STATIC_SHARED_LIMIT = 48 * 1024  # above this a block must opt in (dynamic shared memory)
MIN_CC = (8, 0)  # max.NaN.f32, cvt.rn.bf16.f32, cp.async, mma.sync with bfloat16
PORTABLE_CLUSTER = 8  # blocks a cluster every sm_90 device runs; more need an opt-in

_recording = threading.local()


class Limits(NamedTuple):
    """What the current device offers a launch (read once per device)."""

    name: str
    sms: int  # multiprocessors
    max_threads: int  # threads per block, hardware limit
    shared_optin: int  # dynamic shared memory one block may opt in to, bytes
    shared_per_sm: int  # shared memory per multiprocessor, bytes
    l2_bytes: int
    cc: tuple = (0, 0)  # compute capability; (9, 0) and up launch thread-block clusters


SIMULATOR_LIMITS = Limits("CUDA simulator", sms=4, max_threads=64, shared_optin=8 * 1024,
                          shared_per_sm=16 * 1024, l2_bytes=1 << 20, cc=(9, 0))


def device_limits():
    """The :class:`Limits` of the current device (the simulator's small ones under it)."""
    if simulator_enabled():
        return SIMULATOR_LIMITS
    from numba import cuda

    return _limits_of(cuda.get_current_device().id)


@functools.cache
def _limits_of(device_id):
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return Limits(name, sms=dev.MULTIPROCESSOR_COUNT, max_threads=dev.MAX_THREADS_PER_BLOCK,
                  shared_optin=dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                  shared_per_sm=dev.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                  l2_bytes=dev.L2_CACHE_SIZE, cc=tuple(dev.compute_capability))


def first_fitting(choices, need, room):
    """The first of ``choices`` (launch configurations, most preferred first) whose
    ``need(choice)`` — bytes of shared memory a block — is at most ``room`` (``None``: no
    limit, the first); ``None`` if none is.  How every tile chooser falls back where a
    block gets less than on Hopper (163 KB on sm_80, 99 KB on sm_86/sm_89)."""
    return next((c for c in choices if room is None or need(c) <= room), None)


def compiled(kernel, args):
    """The compiled kernel (Numba's ``_Kernel``) for these arguments; compiles it once
    (after :func:`require_supported`: on an older GPU a clear error, not ptxas's)."""
    sig = tuple(kernel.typeof_pyval(a) for a in args)
    found = kernel.overloads.get(sig)
    if found is not None:
        return found
    require_supported(device_limits())
    return kernel.compile(sig)


def require_supported(limits):
    """RuntimeError unless the device is sm_80 or newer: the kernels use instructions that
    Ampere introduced (``docs/caveats.md``), which ptxas refuses for older targets."""
    if tuple(limits.cc) < MIN_CC:
        raise RuntimeError(
            f"numba_softmax needs a GPU of compute capability {MIN_CC[0]}.{MIN_CC[1]} or newer "
            f"(Ampere, Ada, Hopper, Blackwell): its kernels use instructions sm_80 introduced "
            f"(max.NaN.f32, cvt.rn.bf16.f32, cp.async, mma.sync with bfloat16); {limits.name} "
            f"is {limits.cc[0]}.{limits.cc[1]}.  The CUDA simulator (NUMBA_ENABLE_CUDASIM=1) "
            f"runs them on the CPU.")


def max_threads(kernel, args):
    """Threads per block this kernel can launch with these argument types: the compiled
    kernel's own limit (its registers per thread decide it).  On the simulator 64 — two
    warps, enough to cross every warp boundary, few enough Python threads to be quick."""
    if simulator_enabled():
        return SIMULATOR_LIMITS.max_threads
    return compiled(kernel, args).max_threads_per_block


def max_cooperative_blocks(kernel, args, block, shared=0):
    """How many blocks of ``block`` threads can be resident at once (a cooperative grid's
    ceiling); on the simulator, which runs a cooperative grid's blocks together, 8."""
    if simulator_enabled():
        return 8
    _allow_shared(kernel, args, shared)
    return compiled(kernel, args).max_cooperative_grid_blocks(block, shared)


def _threads(block):
    if isinstance(block, int):
        return block
    n = 1
    for b in block:
        n *= b
    return n


_SET = {}  # (cufunc handle, device, what) -> the value set on that compiled kernel


def _set_attributes(kernel, args, what, value, attributes, covers=lambda old, new: old == new):
    """Set ``attributes`` ((name, value) pairs of ``CUfunction_attribute``) on the compiled
    kernel, once per device for ``what`` set to ``value``: not again while the value set
    last ``covers`` the one asked for."""
    cufunc = compiled(kernel, args)._codelibrary.get_cufunc()  # numba-cuda: the CUkernel
    key = (int(cufunc.handle), cufunc.device.id, what)
    if key in _SET and covers(_SET[key], value):
        return
    for name, v in attributes:
        try:
            driver.set_kernel_attribute(name, v, cufunc.handle, cufunc.device.id)
        except RuntimeError as e:
            raise RuntimeError(f"{e} (kernel {kernel.__name__})") from None
    _SET[key] = value


def _allow_shared(kernel, args, shared):
    """Let the compiled kernel use ``shared`` bytes of dynamic shared memory: a block
    whose dynamic and static shared memory pass 48 KB needs an explicit opt-in per
    kernel and device (without it the launch fails: CUDA_ERROR_INVALID_VALUE)."""
    if shared == 0 or simulator_enabled():
        return
    static = compiled(kernel, args).shared_mem_per_block  # its fixed-size shared arrays
    if shared + static <= STATIC_SHARED_LIMIT:
        return
    limit = device_limits().shared_optin
    if shared + static > limit:
        raise ValueError(f"{kernel.__name__} asks for {shared} bytes of shared memory and "
                         f"has {static} of its own; this device allows {limit} per block")
    _set_attributes(kernel, args, "shared", shared,
                    [("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", shared)],
                    covers=lambda old, new: old >= new)  # a larger opt-in allows less


CLUSTER_LOAD_BALANCING = 2  # CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING


def _require_cluster(kernel, args, cluster):
    """Make every launch of the compiled kernel one of clusters of ``cluster`` blocks (x):
    (width, height, depth) all three, or the launch fails with INVALID_CLUSTER_SIZE.  The
    clusters are scheduled by load balancing, not the default (a small gain for clusters of
    several blocks a multiprocessor, none for one block a multiprocessor; spreading them
    changed nothing: ``docs/algorithms/cluster.md``, "Measured").  More than
    :data:`PORTABLE_CLUSTER` blocks: with the non-portable opt-in (:func:`cluster_fits`
    asks first whether the device runs them)."""
    wide = [("CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)]
    _set_attributes(kernel, args, "cluster", cluster,
                    (wide if cluster > PORTABLE_CLUSTER else []) +
                    [("CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH", cluster),
                     ("CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT", 1),
                     ("CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH", 1),
                     ("CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE",
                      CLUSTER_LOAD_BALANCING)])


_CLUSTER_FITS = {}  # (compiled kernel's id, device, block, cluster, shared) → (kernel, answer)


def cluster_fits(kernel, args, block, cluster, shared=0):
    """Whether the device holds a cluster of ``cluster`` blocks of ``block`` threads of
    this kernel at once (``cuOccupancyMaxActiveClusters`` ≥ 1), after the opt-in a size
    above :data:`PORTABLE_CLUSTER` needs (sm_90 data-centre parts run 16); False where
    the device refuses either.  Asked of the driver once per compiled kernel, device and launch
    shape (a launch plan asks on every call).  The simulator runs any size."""
    if simulator_enabled():
        return True
    from numba import cuda

    ck = compiled(kernel, args)
    key = (id(ck), getattr(cuda.get_current_device(), "id", None), block, cluster, shared)
    if key not in _CLUSTER_FITS:  # (the kernel is kept with its answer: its id stays its own)
        _CLUSTER_FITS[key] = (ck, _cluster_query(kernel, args, block, cluster, shared))
    return _CLUSTER_FITS[key][1]


def _cluster_query(kernel, args, block, cluster, shared):
    """:func:`cluster_fits`'s driver query."""
    try:
        _allow_shared(kernel, args, shared)
        _require_cluster(kernel, args, cluster)
    except (RuntimeError, ValueError):
        return False
    func = driver.kernel_function(compiled(kernel, args)._codelibrary.get_cufunc().handle)
    if func is None:
        return False
    cu = driver.cu
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = shared
    dims = cu.CUlaunchAttribute()
    dims.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dims.value.clusterDim.x, dims.value.clusterDim.y, dims.value.clusterDim.z = cluster, 1, 1
    config.attrs, config.numAttrs = [dims], 1
    err, count = cu.cuOccupancyMaxActiveClusters(func, config)
    return int(err) == 0 and count >= 1


def launch(kernel, grid, block, stream, args, shared=0, cluster=1):
    """``kernel[grid, block, stream, shared](*args)``: the one place every kernel is
    launched (see the module docstring for what it checks and notes).  ``cluster``: the
    blocks of a thread-block cluster (sm_90; ``grid`` a multiple of it), set on the
    compiled kernel whenever it differs from the size its last launch asked for."""
    if not simulator_enabled():
        limit = max_threads(kernel, args)
        if _threads(block) > limit:
            raise ValueError(f"{kernel.__name__}: a block of {_threads(block)} threads exceeds "
                             f"this compiled kernel's limit of {limit} (its registers per "
                             f"thread); the launch configuration must ask max_threads()")
        _allow_shared(kernel, args, shared)
        if cluster > 1:
            _require_cluster(kernel, args, cluster)
    if simulator_enabled():
        with warnings.catch_warnings():  # the simulator computes −inf − (−inf), 1/0 … in
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy on purpose: not the user's
            kernel[grid, block, stream, shared](*args)
    else:
        kernel[grid, block, stream, shared](*args)
    notes = getattr(_recording, "launches", None)
    if notes is not None:
        notes.append((kernel, grid, block, tuple(args), shared))


class recording:
    """``with recording() as notes:`` collects (kernel, grid, block, args, shared) of every
    launch made inside it, in this thread (the launch-plan layer replays them)."""

    def __enter__(self):
        self.notes = _recording.launches = []
        return self.notes

    def __exit__(self, *exc):
        _recording.launches = None
