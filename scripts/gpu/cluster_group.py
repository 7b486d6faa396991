"""A probe for issue 13: a row held on chip by a *thread-block cluster* (sm_90), the
blocks meeting at the cluster's hardware barrier instead of a counter in global memory.
GPU only; prints only.

    python scripts/gpu/cluster_group.py [--sizes 2,4,8,16] [--threads 256,512]

The group kernel (:mod:`numba_softmax.kernels.group`) meets its group once a row through
global memory: an atomic add, a spin on L2, a fence — microseconds a row, during which
the block moves no bytes.  Hopper launches blocks in *clusters* that run at once on one
GPC; a block may store into a peer's shared memory (``mapa`` + ``st.shared::cluster``)
and the cluster meets at ``barrier.cluster`` — no global memory at all.  Here one
cluster of ``size`` blocks takes one row (no persistent loop):

    1. read      block b parks x[row, b·piece : (b+1)·piece] in its shared memory,
                 folding it into (m_b, ℓ_b) (the shipped ``onchip.keeper``);
    2. exchange  thread r < size stores (m_b, ℓ_b) into slot b of block r's shared
                 memory; ``barrier.cluster`` (release / acquire);
    3. combine   every block folds the ``size`` slots: the row's (m, ℓ);
    4. write     normalise the parked piece and write it (``onchip.writer``).

The cluster barrier at the start (arrive at entry, wait before the first remote store)
is the rule for distributed shared memory: every peer has started before anyone writes
into it.  No block reads a peer after the second barrier, so none may exit early.
Launched by ``cuLaunchKernelEx`` with ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``.
"""

import argparse
import ctypes
import functools
import math
import os
import sys

from cuda.bindings import driver as cu
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from numba_softmax.combine import combine_device  # noqa: E402
from numba_softmax.kernels import jit, launcher, onchip, vector  # noqa: E402
from numba_softmax.kernels.epilogue import SOFTMAX, row_constant  # noqa: E402
from numba_softmax.kernels.mma import _asm, _plain, _shared  # noqa: E402
from numba_softmax.kernels.online import VECTORS  # noqa: E402
from numba_softmax.kernels.reduce import team_combine  # noqa: E402

_I32 = ir.IntType(32)


@intrinsic
def cluster_rank(typingctx):
    def codegen(context, builder, sig, args):
        return _asm(builder, _I32, [], "mov.u32 $0, %cluster_ctarank;", "=r")

    return types.uint32(), codegen


cluster_arrive = _plain("barrier.cluster.arrive.relaxed.aligned;")
cluster_wait = _plain("barrier.cluster.wait.aligned;")
cluster_sync = _plain("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;")


@intrinsic
def store_remote(typingctx, ary, i, rank, value):
    """ary[i] = value in the shared memory of block ``rank`` of this cluster (float32)."""

    def codegen(context, builder, sig, args):
        a = _shared(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        r = builder.trunc(context.cast(builder, args[2], sig.args[2], types.int64), _I32)
        _asm(builder, ir.VoidType(), [a, r, args[3]],
             "{ .reg .b32 %ra; mapa.shared::cluster.u32 %ra, $0, $1; "
             "st.shared::cluster.f32 [%ra], $2; }", "r,r,f,~{memory}", side_effect=True)
        return context.get_dummy_value()

    return types.void(ary, i, rank, types.float32), codegen


@functools.cache
def kernel(dtype, vpt, width, threads, size, per_sm):
    acc = jit.accumulator(dtype)
    keep = onchip.keeper(dtype, vpt, width)
    write_held = onchip.writer(dtype, vpt, width, SOFTMAX)
    raw = vector.storage_type(dtype)

    @jit.kernel(launch_bounds=(threads, per_sm))
    def cluster_softmax(x, y, piece, stride):
        cluster_arrive()  # 0. this block has started (peers may write into it after the wait)
        b = cluster_rank()
        row = cuda.blockIdx.x // size
        t, T = cuda.threadIdx.x, threads
        n = x.shape[1]
        held = cuda.shared.array(0, raw)
        m_slots = cuda.shared.array(64, acc)
        l_slots = cuda.shared.array(64, acc)
        m_post = cuda.shared.array(16, acc)
        l_post = cuda.shared.array(16, acc)
        h0 = b * piece
        h1 = min(h0 + piece, n)
        # 1. read: park this block's piece, fold it
        m, l = keep(x, row, h0, h1, held, stride, t, T)
        m, l = team_combine(m, l, m_slots, l_slots, T)  # the block's (m_b, ℓ_b)
        cluster_wait()  # every peer has started: its shared memory exists
        # 2. exchange: (m_b, ℓ_b) into slot b of every block of the cluster
        if t < size:
            store_remote(m_post, b, t, m)
            store_remote(l_post, b, t, l)
        cluster_sync()  # every block's state is in every block's slots
        # 3. combine the size posted states
        m, l = m_post[0], l_post[0]
        for r in range(1, size):
            m, l = combine_device(m, l, m_post[r], l_post[r])
        c = row_constant(m, l, acc(1.0), SOFTMAX)
        # 4. write from chip
        write_held(y, row, h0, h1, held, stride, t, T, m, c)

    return cluster_softmax


def launch(nx, ny, size, threads, per_sm, stream=0):
    rows, n = nx.shape
    width = vector.vector_width(nx, ny)
    vpt = max(VECTORS * vector.width_for(nx.dtype), width)
    unit = threads * width
    piece = -(-(-(-n // size)) // unit) * unit
    stride = onchip.stride_for(piece, threads, width)
    shared = threads * stride * nx.dtype.itemsize
    k = kernel(nx.dtype, vpt, width, threads, size, per_sm)
    args = (nx, ny, piece, stride)
    compiled = launcher.compiled(k, args)
    launcher._allow_shared(k, args, shared)
    cufunc = compiled._codelibrary.get_cufunc()
    err, func = cu.cuKernelGetFunction(cufunc.handle)
    assert not err, err
    if size > 8:
        (err,) = cu.cuFuncSetAttribute(
            func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        assert not err, err
    flat = []
    for ty, v in zip(compiled.argument_types, args):
        compiled._prepare_args(ty, v, stream, [], flat)
    objs = [ctypes.c_int64(v) if isinstance(v, int) else type(v)(v.value) for v in flat]
    params = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = rows * size, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = shared
    cfg.hStream = cu.CUstream(stream)
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = size, 1, 1
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    (err,) = cu.cuLaunchKernelEx(cfg, func, ctypes.addressof(params), 0)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx: {err!r}")
    return piece, shared


SHAPES = [((1024, 65536), "float32"), ((256, 262144), "float32"), ((128, 1048576), "float32"),
          ((256, 262144), "float16"), ((1024, 65536), "float16"), ((2048, 16384), "float32")]


def main():
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from _timing import RowSets, kernel_ms

    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="2,4,8,16")
    p.add_argument("--threads", default="256,512")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    thread_list = [int(s) for s in a.threads.split(",")]
    print(f"device: {torch.cuda.get_device_name()}")
    for (rows, n), name in SHAPES:
        dt = getattr(torch, name)
        r = RowSets(rows, n, dt)
        copy = r.copy_gbps()
        print(f"{dt} {rows}x{n}: copy {copy:.0f} GB/s", flush=True)
        for size in sizes:
            for threads in thread_list:
                per_sm = max(1, 2048 // threads)
                per_piece = n * r.xs[0].element_size() / size
                if per_piece > 200_000 or per_piece < threads * 16:
                    continue
                name = f"  cluster {size:2d} x {threads}"
                try:
                    r.ys[0].fill_(float("nan"))
                    piece, shared = launch(r.nx[0], r.ny[0], size, threads, per_sm)
                    torch.cuda.synchronize()
                    err = float((r.ys[0].float() - r.want).abs().max())
                    if not err < 1e-3:
                        print(f"{name}: WRONG, max error {err:.2e}", flush=True)
                        continue
                    ms = kernel_ms(lambda i: launch(r.nx[i], r.ny[i], size, threads, per_sm),
                                   r.sets)
                    print(f"{name}: piece {piece} ({shared} B): {ms * 1e3:.1f} µs, "
                          f"{r.gbps(ms):.0f} GB/s ({100 * r.gbps(ms) / copy:.1f} % of copy); "
                          f"max error {err:.1e}", flush=True)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
