"""The ceilings every other figure is held to, measured first, by the same timer.

* **copy** — a large device-to-device copy (the driver's ``cuMemcpyDtoD`` through Numba,
  ``torch``'s ``copy_`` and CuPy's ``copyto`` when present; the fastest counts), bytes
  read + written: the
  practical ceiling of a streaming kernel that reads its input once and writes its output
  once (softmax: "% copy").
* **read** — a read-only stream (a Numba grid-stride sum, ``torch.sum`` and CuPy's
  ``sum`` when present; the fastest counts), bytes read: the ceiling of a read-mostly
  kernel such as decoding, which can beat a copy because it hardly writes.

Each is also a row of the ``bounds`` table.
"""

import functools

import numpy as np
from numba import cuda

from ..kernels.hw import jit
from ..runtime import launcher
from .results import gbps

THREADS = 256


@functools.cache
def _read_kernel():
    @jit.kernel
    def read_all(x, partial):
        """partial[t] = Σ of thread t's grid-stride share of x: every value read once."""
        t, step = cuda.grid(1), cuda.gridsize(1)
        acc = np.float32(0.0)
        for i in range(t, x.size, step):
            acc += x[i]
        partial[t] = acc

    return read_all


def run(b):
    nbytes = b.cfg.pick(16 << 10, 512 << 20, 512 << 20)
    n = nbytes // 4
    k = b.n_sets(2 * nbytes)
    row = dict(suite="bounds", dtype="float32", level="kernel", M=1, N=n)
    src = [b.random((n,), "float32", seed=s) for s in range(k)]
    dst = [cuda.device_array(n, dtype=np.float32) for _ in range(k)]

    copies = {"d2d copy": ("numba", lambda i: dst[i].copy_to_device(src[i], stream=b.stream))}
    reads = {}
    blocks = 1 if b.sim else 8 * b.limits.sms
    partial = cuda.device_array(blocks * (32 if b.sim else THREADS), dtype=np.float32)
    reads["read (numba sum)"] = ("numba", lambda i: launcher.launch(
        _read_kernel(), blocks, 32 if b.sim else THREADS, b.stream, (src[i], partial)))
    if b.torch is not None:
        ts, td = [b.view(a, "torch") for a in src], [b.view(a, "torch") for a in dst]
        copies["torch copy_"] = ("torch", lambda i: _on(b, "torch", lambda: td[i].copy_(ts[i])))
        reads["read (torch.sum)"] = ("torch", lambda i: _on(b, "torch", lambda: ts[i].sum()))
    if b.cupy is not None:
        cs, cd = [b.view(a, "cupy") for a in src], [b.view(a, "cupy") for a in dst]
        copies["cupy copy"] = ("cupy", lambda i: _on(b, "cupy", lambda: b.cupy.copyto(cd[i], cs[i])))
        reads["read (cupy sum)"] = ("cupy", lambda i: _on(b, "cupy", lambda: cs[i].sum()))

    best_copy = best_read = 0.0
    for impl, (array, fn) in copies.items():
        r = b.record(b.timer.device(fn, k), impl=impl, array=array, bytes=2 * nbytes,
                     bound="copy", **row)
        best_copy = max(best_copy, gbps(r.bytes, r.median_ms))
    for impl, (array, fn) in reads.items():
        r = b.record(b.timer.device(fn, k), impl=impl, array=array, bytes=nbytes,
                     bound="read", **row)
        best_read = max(best_read, gbps(r.bytes, r.median_ms))
    b.bounds.copy_gbps, b.bounds.read_gbps = best_copy, best_read


def _on(b, lib, fn):
    with b.on_stream(lib):
        fn()
