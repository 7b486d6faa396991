"""A warp's top-k list (kernels/topk/topk_list.py) on the device: both ways in — one candidate
inserted in turn (one slot), and a buffer merged 32 at a time by the bitonic sort and
merge (any power of two of slots) — against a sort of the union on the host.

Lists and buffers are drawn with few distinct values (ties decided by the index), −inf
entries with real indices, empty slots (−inf, EMPTY) and any fill; Hypothesis draws them,
the device merges them, and the result must be exactly the best 32·slots of the union
in the order of ``combine.precedes``.
"""

import functools
import math

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from numba_softmax.combine import EMPTY
from numba_softmax.kernels.hw import jit
from numba_softmax.kernels.topk.topk_list import BUFFER, WARP, warp_list


@functools.cache
def flush_kernel(slots):
    """One warp: the list (32·slots entries, lane i holding places i, i + 32, …) takes the
    buffer's ``count`` candidates through ``flush``."""
    _, _, flush, _, _ = warp_list(numba.float32, slots)

    @jit.kernel
    def run(lv_in, li_in, bv_in, bi_in, count, lv_out, li_out):
        lane = cuda.threadIdx.x
        lv = cuda.local.array(slots, numba.float32)
        li = cuda.local.array(slots, numba.int32)
        bv = cuda.shared.array(BUFFER, numba.float32)
        bi = cuda.shared.array(BUFFER, numba.int32)
        for s in range(slots):
            lv[s], li[s] = lv_in[lane + WARP * s], li_in[lane + WARP * s]
        for q in range(lane, BUFFER, WARP):
            bv[q], bi[q] = bv_in[q], bi_in[q]
        cuda.syncwarp()  # the buffer is whole before the lanes read it
        flush(lv, li, bv, bi, 0, count, lane)
        for s in range(slots):
            lv_out[lane + WARP * s], li_out[lane + WARP * s] = lv[s], li[s]

    return run


@functools.cache
def insert_kernel():
    """One warp: a list of one slot takes each candidate in turn through ``insert``."""
    insert = warp_list(numba.float32, 1)[0]

    @jit.kernel
    def run(lv_in, li_in, cv, ci, k, lv_out, li_out):
        lane = cuda.threadIdx.x
        lv = cuda.local.array(1, numba.float32)
        li = cuda.local.array(1, numba.int32)
        lv[0], li[0] = lv_in[lane], li_in[lane]
        for c in range(cv.shape[0]):
            insert(lv, li, k, cv[c], ci[c], lane)
        lv_out[lane], li_out[lane] = lv[0], li[0]

    return run


def best(values, indices, n):
    """The best n of (values, indices) in the order of ``precedes``: the larger value,
    then the lower index; padded with empty slots."""
    order = np.lexsort((indices, -values))[:n]
    v = np.full(n, -np.inf, np.float32)
    i = np.full(n, EMPTY, np.int32)
    v[: len(order)], i[: len(order)] = values[order], indices[order]
    return v, i


def entries(draw, n, used):
    """n entries with unused indices: few distinct values, some −inf."""
    vals = draw(st.lists(st.sampled_from([-math.inf, -1.0, 0.0, 0.5, 2.0, 3.0]), min_size=n, max_size=n))
    idx = []
    for _ in range(n):
        j = draw(st.integers(0, 10_000).filter(lambda j: j not in used))
        used.add(j)
        idx.append(j)
    return np.array(vals, np.float32), np.array(idx, np.int32)


@st.composite
def flush_case(draw):
    slots = draw(st.sampled_from([1, 2, 4]))
    used = set()
    fill = draw(st.integers(0, WARP * slots))  # a list of `fill` real entries, the rest empty
    lv, li = entries(draw, fill, used)
    count = draw(st.integers(1, BUFFER - 1))
    bv, bi = entries(draw, count, used)
    return slots, best(lv, li, WARP * slots), (bv, bi)


@settings(max_examples=6, deadline=None)
@given(flush_case())
def test_flush_keeps_the_best_of_list_and_buffer(case):
    slots, (lv, li), (bv, bi) = case
    count = len(bv)
    buf_v = np.full(BUFFER, np.nan, np.float32)  # past `count`: never read
    buf_i = np.full(BUFFER, -7, np.int32)
    buf_v[:count], buf_i[:count] = bv, bi
    out_v = cuda.to_device(np.full(WARP * slots, np.nan, np.float32))
    out_i = cuda.to_device(np.full(WARP * slots, -7, np.int32))
    flush_kernel(slots)[1, WARP](lv, li, buf_v, buf_i, count, out_v, out_i)
    want_v, want_i = best(np.concatenate([lv, bv]), np.concatenate([li, bi]), WARP * slots)
    np.testing.assert_array_equal(out_v.copy_to_host(), want_v)
    np.testing.assert_array_equal(out_i.copy_to_host(), want_i)


@settings(max_examples=4, deadline=None)
@given(st.data())
def test_insert_keeps_the_best_k_of_one_slot(data):
    used = set()
    k = data.draw(st.integers(1, WARP))
    lv, li = best(*entries(data.draw, data.draw(st.integers(0, k)), used), WARP)
    lv[k:], li[k:] = -np.inf, EMPTY  # places past k are not the list's
    cv, ci = entries(data.draw, data.draw(st.integers(1, 6)), used)
    out_v = cuda.to_device(np.full(WARP, np.nan, np.float32))
    out_i = cuda.to_device(np.full(WARP, -7, np.int32))
    insert_kernel()[1, WARP](lv, li, cv, ci, k, out_v, out_i)
    want_v, want_i = best(np.concatenate([lv[:k], cv]), np.concatenate([li[:k], ci]), k)
    np.testing.assert_array_equal(out_v.copy_to_host()[:k], want_v)
    np.testing.assert_array_equal(out_i.copy_to_host()[:k], want_i)
