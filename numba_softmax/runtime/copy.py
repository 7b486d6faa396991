"""A strided copy: any N-d layout (negative and zero strides included) into any other.

Not a chapter of the algorithm: the plumbing that lets every other kernel assume a layout
it can address.  When a user's array cannot be viewed as the (rows, n) or (B, H, S, D)
array a kernel reads (its axes do not fold into one stride, or a stride is negative), the
array layer copies it into a contiguous buffer with this kernel; when ``out=`` cannot be
written in place, the result is copied into it the same way.  It runs on the device for
every array kind, so no layout ever needs a trip through the host.

Each array is passed as a flat 1-D view starting at its lowest address, an offset (in
elements) to its element [0, …, 0], and up to ``NDIM`` element strides: element
(i_0, …, i_{N−1}) sits at ``offset + Σ i_k·stride_k``.  One thread per element, grid-stride.
Memory traffic: read N·b, write N·b.  NumPy twin: ``np.copyto``.
"""

import functools

from numba import cuda

from . import launcher

NDIM = 6  # axes after dropping size-1 axes and merging the ones that share a stride
THREADS = 256


@functools.cache
def _kernel():
    @cuda.jit  # no arithmetic to tune: plain cuda.jit
    def copy(src, src_off, src_st, dst, dst_off, dst_st, shape, total):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < total:
            rem, s, d = i, src_off, dst_off
            for ax in range(NDIM - 1, -1, -1):  # unravel i in C order, last axis fastest
                idx = rem % shape[ax]
                rem //= shape[ax]
                s += idx * src_st[ax]
                d += idx * dst_st[ax]
            dst[d] = src[s]
            i += step

    return copy


def simplify(shape, *strides):
    """Drop size-1 axes and merge neighbours that every array steps over as one axis
    (outer stride = inner stride × inner size); returns (shape, strides...)."""
    dims = [(n, tuple(st[i] for st in strides)) for i, n in enumerate(shape) if n != 1]
    merged = []
    for n, st in dims:
        if merged:
            n0, st0 = merged[-1]
            if all(a == b * n for a, b in zip(st0, st)):
                merged[-1] = (n0 * n, st)
                continue
        merged.append((n, st))
    out_shape = tuple(n for n, _ in merged)
    return (out_shape,) + tuple(tuple(st[k] for _, st in merged) for k in range(len(strides)))


def launch(src, src_off, src_st, dst, dst_off, dst_st, shape, stream=0):
    """dst[…] = src[…] element by element; ``src``/``dst`` flat 1-D device arrays of one
    dtype, offsets and strides in elements, ``shape`` the common shape."""
    shape, src_st, dst_st = simplify(shape, src_st, dst_st)
    if len(shape) > NDIM:
        raise ValueError(f"a copy of {len(shape)} axes that do not merge: at most {NDIM}")
    total = 1
    for n in shape:
        total *= n
    if total == 0:
        return
    pad = NDIM - len(shape)
    shape, src_st, dst_st = ((1,) * pad + shape, (0,) * pad + src_st, (0,) * pad + dst_st)
    kernel = _kernel()
    args = (src, src_off, src_st, dst, dst_off, dst_st, shape, total)
    threads = min(THREADS, launcher.max_threads(kernel, args))
    blocks = min(-(-total // threads), 32 * launcher.device_limits().sms)
    launcher.launch(kernel, blocks, threads, stream, args)
