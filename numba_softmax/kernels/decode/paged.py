"""d2 — paged KV-cache decoding: the keys of a sequence live in blocks anywhere in a pool.

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

A bad table is a ``ValueError`` before the kernel runs (:func:`numba_softmax.block_tables.tables`,
on the device for a device table: :mod:`.table_check`); and the kernel itself clamps what
it reads to the pool and the table row, so even an unchecked table (``check=False``)
cannot make it read out of bounds.

Memory traffic: as dense decoding, 2·L_b·(D + Dv)/2·b bytes per (sequence, K/V head),
plus one 4-byte table entry per key and lane group (cached).  NumPy twin:
:func:`numba_softmax.reference.paged_attention`.
"""

from . import decode, decode_launch


def check_shapes(q, k_cache, v_cache, block_table, cache_seqlens):
    """ValueError unless the arrays have the layouts of the module docstring (the
    launch's precondition on its arrays' shapes; their contents: the caller's check)."""
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
           small=False, tiles=None, softcap=0.0, alibi=None):
    """Paged decoding on device arrays (layouts: the module docstring); ``o``
    (B, Hq, Sq, Dv), dtype of q, and ``lse`` (B, Hq, Sq, float32) receive the result.

    The caller validates the table first (:func:`numba_softmax.block_tables.tables`).  ``num_splits``: at most
    that many key ranges per sequence; by default chosen from B·Hkv, the device and
    ``max_seqlen_k`` (the longest cache_seqlens, if known; else the table's capacity).
    ``tiles``, ``softcap``, ``alibi``: as :func:`.decode_launch.run`."""
    check_shapes(q, k_cache, v_cache, block_table, cache_seqlens)
    decode_launch.run(q, k_cache, v_cache, o, lse, paged=True, table=block_table,
                      seqlens=cache_seqlens, max_seqlen_k=max_seqlen_k, num_splits=num_splits,
                      causal=causal, window=window, scale=scale, stream=stream, small=small,
                      tiles=tiles, softcap=softcap, alibi=alibi)
