"""The combiner on the device, under any chunking, order and tree.

Two small kernels that exist to *test* (and show) the claim every other kernel rests on:

``chunk_states``  thread (r, c) streams chunk c of row r value by value with the
                  per-element recurrence ``(m, ℓ) ← combine(m, ℓ, x, 1)``; chunks are given
                  by arbitrary cut points (empty chunks allowed: they stay the identity).
``fold_tree``     thread r folds row r's chunk states along an arbitrary binary tree,
                  written as a program of merges ``slot[a] ← combine(slot[a], slot[b])``;
                  the order of the leaves and the shape of the tree are the caller's.

Both call ``combine_device`` — the compiled twin of :func:`numba_softmax.combine.combine`
— so the Hypothesis tests prove the very code the softmax and attention kernels run.
NumPy twins: :func:`numba_softmax.reference.online_state` and
:func:`numba_softmax.reference.merge_chunks`.
"""

import functools
import math

import numpy as np
from numba import cuda

from ...combine import combine_device
from ..hw import jit
from ...runtime import launcher
from ..hw.jit import accumulator


@functools.cache
def _kernels(dtype):
    """{"chunk_states": kernel, "fold_tree": kernel} for one dtype."""
    acc = accumulator(dtype)

    @jit.kernel
    def chunk_states(x, bounds, m_out, l_out):
        r, c = cuda.grid(2)
        if r < x.shape[0] and c < bounds.shape[0] - 1:
            m, l = acc(-math.inf), acc(0.0)  # the identity
            one = acc(1.0)
            for j in range(bounds[c], bounds[c + 1]):
                m, l = combine_device(m, l, acc(x[r, j]), one)
            m_out[r, c] = m
            l_out[r, c] = l

    @jit.kernel
    def fold_tree(m, l, merges, root, m_out, l_out):
        r = cuda.grid(1)
        if r < m.shape[0]:
            for s in range(merges.shape[0]):
                a, b = merges[s, 0], merges[s, 1]
                m[r, a], l[r, a] = combine_device(m[r, a], l[r, a], m[r, b], l[r, b])
            m_out[r] = m[r, root]
            l_out[r] = l[r, root]

    return {"chunk_states": chunk_states, "fold_tree": fold_tree}


def chunk_states(x, cuts):
    """(m, ℓ) of every chunk of every row of the 2-D device array ``x``, on the device.

    ``cuts``: sorted interior cut points.  Returns device arrays (rows, chunks).
    """
    bounds = cuda.to_device(np.array([0, *cuts, x.shape[1]], dtype=np.int64))
    rows, chunks = x.shape[0], len(cuts) + 1
    m = cuda.device_array((rows, chunks), dtype=x.dtype)
    l = cuda.device_array((rows, chunks), dtype=x.dtype)
    block = (8, 4)
    grid = ((rows + block[0] - 1) // block[0], (chunks + block[1] - 1) // block[1])
    launcher.launch(_kernels(x.dtype)["chunk_states"], grid, block, 0, (x, bounds, m, l))
    return m, l


def fold_tree(m, l, merges, root):
    """Fold each row's chunk states (device arrays, modified) by the merge program."""
    merges = cuda.to_device(np.asarray(merges, dtype=np.int64).reshape(-1, 2))
    rows = m.shape[0]
    m_out = cuda.device_array(rows, dtype=m.dtype)
    l_out = cuda.device_array(rows, dtype=m.dtype)
    threads = 32
    launcher.launch(_kernels(m.dtype)["fold_tree"], (rows + threads - 1) // threads, threads, 0,
                    (m, l, merges, root, m_out, l_out))
    return m_out, l_out
