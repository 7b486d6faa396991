"""Writing new tokens into a paged KV cache: the step before each paged decode.

A decoder step produces, per sequence, Snew new key and value rows (one token; several
with speculative decoding).  They go to positions cache_seqlens[b] … cache_seqlens[b] +
Snew − 1 of sequence b, i.e. to block table[b, p // block_size], row p % block_size
(the layout of :mod:`.paged`); then the caller grows cache_seqlens by Snew.

One thread per 16-byte chunk of a (b, s, head) row of K or V: it finds the row's block
through the table and copies the chunk (one vector load, one vector store; raw bits,
whatever the dtype).  Memory traffic: read and write B·Snew·Hkv·(D + Dv)·b bytes.
The caller validates the table first (:func:`numba_softmax.block_tables.tables` with ``new_tokens``);
the kernel skips a position outside the table row or a block id outside the pool anyway.
NumPy twin: :func:`numba_softmax.reference.append_kv`.
"""

import functools

import numba
import numpy as np
from numba import cuda

from ..hw import jit
from ...runtime import launcher
from ..attention import tileio

THREADS = 128


@functools.cache
def kernel(dtype, d, dv, width):
    raw = numba.from_dtype(np.dtype(dtype))
    load, store = tileio.global_load(width), tileio.global_store(width)
    NK, NV = d // width, dv // width  # chunks of a K row, of a V row

    @jit.kernel
    def append(k_new, v_new, k_cache, v_cache, table, seqlens):
        """k_new (B, Snew, Hkv, D), v_new (B, Snew, Hkv, Dv) → the caches; one thread per chunk."""
        t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n_s, n_kv = k_new.shape[1], k_new.shape[2]
        row, c = t // (NK + NV), t % (NK + NV)
        if row >= k_new.shape[0] * n_s * n_kv:
            return
        h, s, b = row % n_kv, (row // n_kv) % n_s, row // (n_kv * n_s)
        p = seqlens[b] + s  # the new token's position in its sequence
        if p < 0 or p >= table.shape[1] * k_cache.shape[1]:
            return  # outside the table row (the caller's check refuses this first)
        blk, pos = table[b, p // k_cache.shape[1]], p % k_cache.shape[1]
        if blk < 0 or blk >= k_cache.shape[0]:
            return  # not a block of the pool: never write outside it
        buf = cuda.local.array(width, raw)
        if c < NK:
            load(k_new, b, s, h, c * width, buf, 0)
            store(k_cache, blk, pos, h, c * width, buf, 0)
        else:
            load(v_new, b, s, h, (c - NK) * width, buf, 0)
            store(v_cache, blk, pos, h, (c - NK) * width, buf, 0)

    return append


def launch(k_new, v_new, k_cache, v_cache, block_table, cache_seqlens, *, stream=0,
           small=False):
    """Write k_new, v_new (B, Snew, Hkv, D / Dv) at positions cache_seqlens[b] … of each
    sequence into k_cache, v_cache (num_blocks, block_size, Hkv, D / Dv); all device
    arrays, one dtype for the four; block_table (B, ·) and cache_seqlens (B,) int32."""
    kn, vn, kc, vc = (tuple(x.shape) for x in (k_new, v_new, k_cache, v_cache))
    if len(kn) != 4 or kn[:3] != vn[:3] or kc[:3] != vc[:3] or kn[2] != kc[2] \
            or kn[3] != kc[3] or vn[3] != vc[3]:
        raise ValueError(f"k_new {kn}, v_new {vn} (B, Snew, Hkv, D) do not fit the caches "
                         f"k_cache {kc}, v_cache {vc} (num_blocks, block_size, Hkv, D)")
    dtypes = {np.dtype(x.dtype) for x in (k_new, v_new, k_cache, v_cache)}
    if len(dtypes) != 1:
        raise TypeError(f"k_new, v_new, k_cache and v_cache need one dtype, got {sorted(map(str, dtypes))}")
    if tuple(block_table.shape)[:1] != kn[:1] or tuple(cache_seqlens.shape) != kn[:1]:
        raise ValueError(f"block_table {tuple(block_table.shape)} and cache_seqlens "
                         f"{tuple(cache_seqlens.shape)} need k_new's batch {kn[0]} first")
    rows = kn[0] * kn[1] * kn[2]
    if rows == 0:
        return
    width = tileio.global_width([k_new, v_new, k_cache, v_cache], (kn[3], vn[3]))
    app = kernel(k_new.dtype, kn[3], vn[3], width)
    total = rows * (kn[3] + vn[3]) // width
    threads = 64 if small else THREADS
    launcher.launch(app, (-(-total // threads),), threads, stream,
                    (k_new, v_new, k_cache, v_cache, block_table, cache_seqlens))
