"""The top-k combiner on the device, under any chunking, order and tree.

The twin of :mod:`.fold` for the top-k state (m, ℓ, k values, k indices): two small
kernels that exist to *test* the claim the top-k kernels rest on.

``chunk_states``  thread (r, c) streams chunk c of row r value by value — (m, ℓ) by
                  ``combine(m, ℓ, x, 1)``, the list by ``offer`` (the paper's insertion);
``fold_tree``     thread r folds row r's chunk states along a program of merges
                  ``slot[a] ← combine_topk(slot[a], slot[b])``, any order, any tree.

Both call the compiled twins of :mod:`numba_softmax.combine`, so the Hypothesis tests
prove the very code the kernels run (the kernels' block merge is ``rank``, the body of
``combine_topk``, run by all threads at once).  NumPy twin: ``combine.topk_state_np``.
"""

import functools
import math

import numpy as np
from numba import cuda

from ...combine import EMPTY, combine_device, combine_topk_device, offer_device
from ..hw import jit
from ...runtime import launcher
from ..hw.jit import accumulator


@functools.cache
def _kernels(dtype):
    acc = accumulator(dtype)

    @jit.kernel
    def chunk_states(x, bounds, m_out, l_out, v_out, i_out):
        r, c = cuda.grid(2)
        if r < x.shape[0] and c < bounds.shape[0] - 1:
            m, l = acc(-math.inf), acc(0.0)  # the identity
            values, indices = v_out[r, c], i_out[r, c]
            for s in range(values.shape[0]):
                values[s] = -math.inf
                indices[s] = EMPTY
            for j in range(bounds[c], bounds[c + 1]):
                m, l = combine_device(m, l, acc(x[r, j]), acc(1.0))
                offer_device(values, indices, acc(x[r, j]), j)
            m_out[r, c] = m
            l_out[r, c] = l

    @jit.kernel
    def fold_tree(m, l, v, i, merges, root, v_tmp, i_tmp):
        r = cuda.grid(1)
        if r < m.shape[0]:
            for s in range(merges.shape[0]):
                a, b = merges[s, 0], merges[s, 1]
                m[r, a], l[r, a] = combine_topk_device(m[r, a], l[r, a], v[r, a], i[r, a],
                                                       m[r, b], l[r, b], v[r, b], i[r, b],
                                                       v_tmp[r], i_tmp[r])
                for q in range(v_tmp.shape[1]):  # the merged list replaces slot a
                    v[r, a, q] = v_tmp[r, q]
                    i[r, a, q] = i_tmp[r, q]
            m[r, 0], l[r, 0] = m[r, root], l[r, root]
            for q in range(v_tmp.shape[1]):
                v[r, 0, q] = v[r, root, q]
                i[r, 0, q] = i[r, root, q]

    return chunk_states, fold_tree


def chunk_states(x, cuts, k):
    """(m, ℓ, values, indices) of every chunk of every row of the 2-D device array ``x``
    (``cuts``: sorted interior cut points): device arrays (rows, chunks[, k])."""
    bounds = cuda.to_device(np.array([0, *cuts, x.shape[1]], dtype=np.int64))
    rows, chunks = x.shape[0], len(cuts) + 1
    m = cuda.device_array((rows, chunks), dtype=x.dtype)
    l = cuda.device_array((rows, chunks), dtype=x.dtype)
    v = cuda.device_array((rows, chunks, k), dtype=x.dtype)
    i = cuda.device_array((rows, chunks, k), dtype=np.int64)
    block = (8, 4)
    grid = (-(-rows // block[0]), -(-chunks // block[1]))
    launcher.launch(_kernels(x.dtype)[0], grid, block, 0, (x, bounds, m, l, v, i))
    return m, l, v, i


def fold_tree(m, l, v, i, merges, root):
    """Fold each row's chunk states (device arrays, modified) by the merge program; the
    row's state ends in slot 0 (``[:, 0]`` of each, once on the host)."""
    merges = cuda.to_device(np.asarray(merges, dtype=np.int64).reshape(-1, 2))
    rows, _, k = v.shape
    v_tmp = cuda.device_array((rows, k), dtype=v.dtype)
    i_tmp = cuda.device_array((rows, k), dtype=np.int64)
    threads = 32
    launcher.launch(_kernels(m.dtype)[1], -(-rows // threads), threads, 0,
                    (m, l, v, i, merges, root, v_tmp, i_tmp))
    return m, l, v, i
