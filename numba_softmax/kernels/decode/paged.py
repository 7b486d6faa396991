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

A bad table is a ``ValueError`` before the kernel runs (:func:`check_tables`, on the
device for a device table: :mod:`.table_check`); and the kernel itself clamps what it
reads to the pool and the table row, so even an unchecked table (``check=False``) cannot
make it read out of bounds.

Memory traffic: as dense decoding, 2·L_b·(D + Dv)/2·b bytes per (sequence, K/V head),
plus one 4-byte table entry per key and lane group (cached).  NumPy twin:
:func:`numba_softmax.reference.paged_attention`.
"""

import numpy as np

from . import decode, decode_launch, table_check


def check_tables(block_table, cache_seqlens, num_blocks, block_size, *, batch=None,
                 new_tokens=0, stream=0, entries=True):
    """Refuse a block table the kernels would read out of bounds with (a ``ValueError``
    naming the entry; ``TypeError`` unless int32).

    Every sequence b needs 0 <= cache_seqlens[b] and cache_seqlens[b] + ``new_tokens``
    <= max_blocks_per_seq·block_size, and the table entries of the blocks those positions
    use must be block ids 0 … num_blocks − 1 (later entries are not read and may be
    anything, e.g. −1).  ``new_tokens``: the tokens an append will add.  NumPy arrays
    are checked on the host; Numba device arrays by a small kernel on ``stream``
    (:mod:`.table_check`: no copy of the table).  ``entries=False``: dtypes and shapes
    only (the kernels clamp what they read; a bad entry then gives a wrong result)."""
    for x, name in ((block_table, "block_table"), (cache_seqlens, "cache_seqlens")):
        if np.dtype(x.dtype) != np.int32:
            raise TypeError(f"{name} must be int32, got {x.dtype}")
    shape, lengths_shape = tuple(block_table.shape), tuple(cache_seqlens.shape)
    if len(shape) != 2:
        raise ValueError(f"block_table must be (batch, max_blocks_per_seq), got shape {shape}")
    if lengths_shape != shape[:1]:
        raise ValueError(f"cache_seqlens must be ({shape[0]},) like block_table's first "
                         f"axis, got shape {lengths_shape}")
    if batch is not None and shape[0] != batch:
        raise ValueError(f"block_table has {shape[0]} rows for a batch of {batch}")
    if block_size < 1 or num_blocks < 1:
        raise ValueError(f"the cache needs blocks: num_blocks={num_blocks}, block_size={block_size}")
    if shape[0] == 0 or not entries:
        return
    refuse(table_check.findings(block_table, cache_seqlens, num_blocks, block_size,
                                new_tokens, stream), shape, num_blocks, block_size, new_tokens)


def refuse(found, table_shape, num_blocks, block_size, new_tokens=0):
    """The ``ValueError`` for a table check's findings (:mod:`.table_check`), if any."""
    b, length, f, blk = found
    rows, width = table_shape
    capacity = width * block_size
    if b < rows and f // max(width, 1) >= b:  # a bad length comes before any bad entry
        if length < 0:
            raise ValueError(f"cache_seqlens[{b}] = {length} is negative")
        raise ValueError(f"sequence {b} needs {length + new_tokens} positions; its table row "
                         f"holds {width} blocks of {block_size} = {capacity}")
    if f < rows * width:
        raise ValueError(f"block_table[{f // width}, {f % width}] = {blk} is not a block of "
                         f"the cache (0 … {num_blocks - 1})")


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
           small=False, tiles=None):
    """Paged decoding on device arrays (layouts: the module docstring); ``o``
    (B, Hq, Sq, Dv), dtype of q, and ``lse`` (B, Hq, Sq, float32) receive the result.

    The caller validates the table first (:func:`check_tables`).  ``num_splits``: at most
    that many key ranges per sequence; by default chosen from B·Hkv, the device and
    ``max_seqlen_k`` (the longest cache_seqlens, if known; else the table's capacity).
    ``tiles``: the decode kernel (:func:`.decode_launch.run`)."""
    check_shapes(q, k_cache, v_cache, block_table, cache_seqlens)
    decode_launch.run(q, k_cache, v_cache, o, lse, paged=True, table=block_table,
                      seqlens=cache_seqlens, max_seqlen_k=max_seqlen_k, num_splits=num_splits,
                      causal=causal, window=window, scale=scale, stream=stream, small=small,
                      tiles=tiles)
