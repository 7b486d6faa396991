"""The launch configuration of the row backward (:mod:`.softmax_backward`): which form
runs a (rows, n) problem, with how many threads and values a thread, and the one function
that launches it."""

from typing import NamedTuple

import numpy as np

from ...runtime import launcher
from ..rows import pairs
from ..hw import vector
from ..rows.chunk import pow2_ceil
from ..hw.jit import accumulator
from ...runtime.launcher import PORTABLE_CLUSTER, scratch
from .softmax_backward import CHUNK_VPT, MAX_CLUSTER, MAX_VPT, one_pass, split, two_pass


# Clusters of 512-thread blocks holding 64 registers of values a thread.  One block a
# multiprocessor, so a cluster of S blocks takes S of a GPC's ~16: two of 8 or one of
# 15–16 fill it, and then they beat the plans of 8 blocks of 1024; where they leave a GPC
# part-empty they lose to them.  Past 8 blocks of 1024, a cluster that fills a GPC beats
# two passes; one that does not, does not.  Measured: docs/algorithms/backward.md,
# "Measured".
WIDE_THREADS = 512
FULL_GPC = 15  # blocks of one block a multiprocessor that fill a GPC (sm_90 parts: 16–18)


class Plan(NamedTuple):
    """How a (rows, n) problem is run: ``form`` is "warp", "block" or "cluster" (one
    pass), "two_pass" or "split"; ``threads`` per block; ``vpt`` values per thread (one
    pass); ``splits`` pieces per row (split), or blocks per cluster (cluster)."""

    form: str
    threads: int
    vpt: int = 0
    splits: int = 1


def max_vpt(dtype, width, warp=False):
    """Values of *each* tensor one thread may hold in the one-pass kernel: ``MAX_VPT``
    float32 (58 registers a thread in a block of 1024), half as many float64, twice as
    many float16 / bfloat16 where they are held in pairs (:mod:`.pairs`: a block or a
    cluster per row, at vector width 8; :func:`plan` asks width 1's count for a warp);
    twice that for a warp per row, whose small blocks may use more registers."""
    itemsize = np.dtype(dtype).itemsize
    vpt = MAX_VPT * 4 // (itemsize if pairs.packed(dtype, width) else max(itemsize, 4))
    return 2 * vpt if warp else vpt


def plan(rows, n, dtype, width, max_threads, sms, clusters=False, wide=False):
    """The form and sizes for (rows, n): a warp per row while 32·VPT values hold it; a
    block per row while ``max_threads``·VPT do; with ``clusters`` (sm_90), a cluster per
    row while the registers of its blocks hold it and the clusters fill the device —
    :func:`filled` where it fills whole GPCs, else up to 8 blocks of 256–1024 threads,
    else (``wide``: the device runs clusters of 16) :func:`filled` up to 16 blocks; else
    two passes, or split for fewer rows than half the multiprocessors."""
    whole = lambda v: max(pow2_ceil(v), width)  # noqa: E731  (a whole number of vectors)
    if n <= 32 * max_vpt(dtype, 1, warp=True):  # (one value a register: width 1's count)
        return Plan("warp", 32 * max(1, min(4, max_threads // 32)), whole(-(-n // 32)))
    for threads in (64, 128, 256, 512, 1024):
        if threads <= max_threads and n <= threads * max_vpt(dtype, width):
            return Plan("block", threads, whole(-(-n // threads)))
    fill = filled(rows, n, dtype, width, max_threads, sms) if clusters else None
    if fill and (fill.splits == PORTABLE_CLUSTER or (wide and fill.splits >= FULL_GPC)):
        return fill
    for threads in (256, 512, 1024) if clusters else ():
        size = -(-n // (threads * max_vpt(dtype, width)))
        if threads <= max_threads and size <= PORTABLE_CLUSTER:
            vpt = whole(-(-n // (size * threads)))
            size = -(-n // (threads * vpt))  # no empty trailing block
            if rows * size >= sms:
                return Plan("cluster", threads, vpt, size)
    if fill and wide and fill.splits > PORTABLE_CLUSTER:  # (still fewer bytes than two passes)
        return fill
    threads = 1024
    while threads > max_threads:
        threads //= 2
    if rows >= sms // 2:
        return Plan("two_pass", threads)
    chunk = threads * max(CHUNK_VPT, width)
    return Plan("split", threads, splits=max(1, min(-(-n // chunk), -(-4 * sms // rows))))


def filled(rows, n, dtype, width, max_threads, sms):
    """The cluster of :data:`WIDE_THREADS`-thread blocks holding 64 registers of values a
    thread (float32 32, float64 16, 16-bit pairs 32 — not twice the pairs, which ran far
    slower: docs/algorithms/backward.md) that holds the row in at most 16 blocks and
    whose clusters fill the device, or None."""
    most = max_vpt(dtype, width) * (1 if pairs.packed(dtype, width) else 2)
    size = -(-n // (WIDE_THREADS * most))
    if WIDE_THREADS > max_threads or size > MAX_CLUSTER:
        return None
    vpt = max(pow2_ceil(-(-n // (size * WIDE_THREADS))), width)
    size = -(-n // (WIDE_THREADS * vpt))  # no empty trailing block
    return Plan("cluster", WIDE_THREADS, vpt, size) if rows * size >= sms else None


def kernels_for(p, dtype, mode, width):
    """The compiled kernel(s) of a plan, in launch order."""
    if p.form in ("warp", "block", "cluster"):
        row_threads = 32 if p.form == "warp" else p.threads
        size = p.splits if p.form == "cluster" else 1
        pack = p.form != "warp"  # (pairs in a warp's lanes measured slow: :func:`max_vpt`)
        return (one_pass(dtype, mode, p.threads, p.vpt, row_threads, width, size, pack),)
    if p.form == "two_pass":
        return (two_pass(dtype, mode, p.threads, width),)
    return split(dtype, mode, p.threads, width)


def launch(mode, dy, y, dx, stream=0, plan_=None):
    """dx from (dy, y): three (rows, n) device arrays of one storage dtype (float16,
    uint16 = bfloat16, float32, float64), any strides; ``mode`` SOFTMAX or LOG_SOFTMAX.
    ``plan_``: a :class:`Plan` to force (tests, timing); default :func:`plan`, sized to the
    compiled kernels' own thread limits."""
    rows, n = y.shape
    if rows == 0 or n == 0:
        return
    width = vector.vector_width(dy, y, dx)
    dtype = y.dtype
    limits = launcher.device_limits()
    max_threads = limits.max_threads
    clusters = wide = tuple(limits.cc) >= (9, 0)
    while True:
        p = plan_ or plan(rows, n, dtype, width, max_threads, limits.sms, clusters, wide)
        ks = kernels_for(p, dtype, mode, width)
        arrays = (dy, y, dx)
        if pairs.packed(dtype, width) and p.form in ("block", "cluster"):  # (held in pairs)
            arrays = pairs.bits(*arrays)
        args, ws = [arrays], None
        if p.form == "split":
            chunk = p.threads * max(CHUNK_VPT, width)
            piece = -(-n // p.splits)
            piece = -(-piece // chunk) * chunk  # whole chunks: every piece starts aligned
            splits = -(-n // piece)  # no empty trailing pieces
            ws = scratch((rows, splits), accumulator(dtype).name, stream, "row sums")
            args = [(dy, y, piece, ws), (dy, y, dx, piece, ws)]
        if plan_ is not None:
            break
        fits = min(launcher.max_threads(k, a) for k, a in zip(ks, args))
        if p.threads > fits:
            max_threads = fits  # registers allow fewer threads: plan again within them
        elif p.form == "cluster" and p.splits > PORTABLE_CLUSTER and not launcher.cluster_fits(
                ks[0], args[0], p.threads, p.splits):
            wide = False  # the device does not run clusters this wide: plan within 8
        else:
            break
    size = p.splits if p.form == "cluster" else 1
    held = {"warp": 32, "block": p.threads, "cluster": p.threads * size}.get(p.form)
    if held is not None and held * p.vpt < n:
        raise ValueError(f"the one-pass form holds {p.vpt} values a thread; a row of {n} "
                         f"does not fit")
    if p.form == "cluster" and not 1 <= size <= MAX_CLUSTER:
        raise ValueError(f"a cluster has 1 … {MAX_CLUSTER} blocks; got {size}")
    grid = -(-rows // (p.threads // 32)) if p.form == "warp" else rows * size
    if ws is not None:
        grid = (rows, ws.shape[1])
    for k, a in zip(ks, args):
        launcher.launch(k, grid, p.threads, stream, a, cluster=size)
