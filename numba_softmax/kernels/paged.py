"""v7 — paged KV-cache decoding: the keys of a sequence live in blocks anywhere in a pool.

A server decoding many sequences cannot give each one a contiguous KV cache of the
longest length it might reach.  PagedAttention (vLLM) keeps the cache of every layer as a
pool of fixed-size blocks and gives each sequence a *block table*: its positions
0 … block_size−1 live in block table[b, 0], the next block_size in table[b, 1], and so
on.  Memory is taken a block at a time, freed blocks are reused by any sequence, and
sequences that share a prompt may point at the same blocks.  The layout here is
flash-attn's ``flash_attn_with_kvcache``::

    q             (B, Hq, Sq, D)                 the Sq newest positions of each sequence
    k_cache       (num_blocks, block_size, Hkv, D)
    v_cache       (num_blocks, block_size, Hkv, Dv)
    block_table   (B, max_blocks_per_seq) int32  position p of sequence b is at
                                                 block table[b, p // block_size], row p % block_size
    cache_seqlens (B,) int32                     positions filled (the Sq new tokens included)

The kernel is the decode kernel of :mod:`.decode` — GQA packed, split-KV, merged in the
same launch — with one change: the K/V row of key p is found through the table
(a shift and a mask when block_size is a power of two, else a division).  Causal and
window follow the bottom-right rule with Sk = cache_seqlens[b]; Sq > 1 is speculative
decoding (several new tokens checked at once).  New tokens are written into their blocks
by :mod:`.append` before the call.

The kernel trusts the table: :func:`check_tables` (host side) is what makes a bad one a
``ValueError`` rather than a read out of bounds.

Memory traffic: as dense decoding, 2·L_b·(D + Dv)/2·b bytes per (sequence, K/V head),
plus one 4-byte table entry per key and lane group (cached).  NumPy twin:
:func:`numba_softmax.reference.paged_attention`.
"""

import numpy as np

from . import decode


def host_ints(x, name):
    """An int32 array (NumPy, or any CUDA array: copied to the host) as a NumPy array."""
    if hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    elif hasattr(x, "__cuda_array_interface__"):
        from numba import cuda

        x = cuda.as_cuda_array(x).copy_to_host()
    x = np.asarray(x)
    if x.dtype != np.int32:
        raise TypeError(f"{name} must be int32, got {x.dtype}")
    return x


def check_tables(block_table, cache_seqlens, num_blocks, block_size, *, batch=None,
                 new_tokens=0):
    """Refuse a block table the kernels would read out of bounds with; returns the host
    copies (table, seqlens).

    Every sequence b needs 0 <= cache_seqlens[b] and cache_seqlens[b] + ``new_tokens``
    <= max_blocks_per_seq·block_size, and the table entries of the blocks those positions
    use must be block ids 0 … num_blocks − 1 (later entries are not read and may be
    anything, e.g. −1).  ``new_tokens``: the tokens an append will add."""
    table = host_ints(block_table, "block_table")
    lengths = host_ints(cache_seqlens, "cache_seqlens")
    if table.ndim != 2:
        raise ValueError(f"block_table must be (batch, max_blocks_per_seq), got shape {table.shape}")
    if lengths.shape != (table.shape[0],):
        raise ValueError(f"cache_seqlens must be ({table.shape[0]},) like block_table's first "
                         f"axis, got shape {lengths.shape}")
    if batch is not None and table.shape[0] != batch:
        raise ValueError(f"block_table has {table.shape[0]} rows for a batch of {batch}")
    if block_size < 1 or num_blocks < 1:
        raise ValueError(f"the cache needs blocks: num_blocks={num_blocks}, block_size={block_size}")
    ends = lengths.astype(np.int64) + int(new_tokens)
    capacity = table.shape[1] * block_size
    for b in range(len(lengths)):
        if lengths[b] < 0:
            raise ValueError(f"cache_seqlens[{b}] = {lengths[b]} is negative")
        if ends[b] > capacity:
            raise ValueError(f"sequence {b} needs {ends[b]} positions; its table row holds "
                             f"{table.shape[1]} blocks of {block_size} = {capacity}")
        used = table[b, : -(-int(ends[b]) // block_size)]
        bad = np.flatnonzero((used < 0) | (used >= num_blocks))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"block_table[{b}, {j}] = {used[j]} is not a block of the cache "
                             f"(0 … {num_blocks - 1})")
    return table, lengths


def check_shapes(q, k_cache, v_cache, block_table, cache_seqlens):
    """ValueError unless the arrays have the layouts of the module docstring."""
    qs, ks, vs = tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError(f"q (B, Hq, Sq, D) and caches (num_blocks, block_size, Hkv, D) are 4-D, "
                         f"got q {qs}, k_cache {ks}, v_cache {vs}")
    if ks[:3] != vs[:3] or ks[3] != qs[3]:
        raise ValueError(f"k_cache {ks} and v_cache {vs} must share (num_blocks, block_size, Hkv), "
                         f"and q {qs} and k_cache the head dimension")
    if ks[2] < 1 or qs[1] % ks[2]:
        raise ValueError(f"q has {qs[1]} heads, the caches {ks[2]}: it must be a multiple")
    if qs[2] < 1:
        raise ValueError(f"q needs at least one query row per sequence, got Sq = {qs[2]}")
    if tuple(block_table.shape)[:1] != qs[:1] or tuple(cache_seqlens.shape) != qs[:1]:
        raise ValueError(f"block_table {tuple(block_table.shape)} and cache_seqlens "
                         f"{tuple(cache_seqlens.shape)} need q's batch {qs[0]} first")
    if not 1 <= min(ks[3], vs[3]) <= max(ks[3], vs[3]) <= decode.MAX_HEAD_DIM:
        raise ValueError(f"head dimensions must be between 1 and {decode.MAX_HEAD_DIM}")


def launch(q, k_cache, v_cache, block_table, cache_seqlens, o, lse, *, causal=False,
           window=(-1, -1), scale=None, num_splits=None, max_seqlen_k=None, stream=0,
           small=False):
    """Paged decoding on device arrays (layouts: the module docstring); ``o``
    (B, Hq, Sq, Dv), dtype of q, and ``lse`` (B, Hq, Sq, float32) receive the result.

    The caller validates the table first (:func:`check_tables`).  ``num_splits``: at most
    that many key ranges per sequence; by default chosen from B·Hkv, the device and
    ``max_seqlen_k`` (the longest cache_seqlens, if known; else the table's capacity)."""
    check_shapes(q, k_cache, v_cache, block_table, cache_seqlens)
    decode.run(q, k_cache, v_cache, o, lse, paged=True, table=block_table,
               seqlens=cache_seqlens, max_seqlen_k=max_seqlen_k, num_splits=num_splits,
               causal=causal, window=window, scale=scale, stream=stream, small=small)
