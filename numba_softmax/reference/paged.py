"""A paged KV cache in pure NumPy: gather the blocks, then the dense reference.

The layout is flash-attn's ``flash_attn_with_kvcache``: the cache of every layer is a
pool of fixed-size blocks, k_cache and v_cache (num_blocks, block_size, Hkv, D), and
sequence b owns the blocks block_table[b, 0], block_table[b, 1], … in order — position p
of the sequence lives in block block_table[b, p // block_size] at row p % block_size.
``cache_seqlens[b]`` positions are filled.  Blocks need not be contiguous, nor distinct
across sequences (a shared prompt prefix may be one set of blocks).

Twins of :mod:`numba_softmax.kernels.decode.paged` and :mod:`numba_softmax.kernels.decode.append`.
"""

import numpy as np

from .attention import attention

__all__ = ["gather_kv", "paged_attention", "append_kv"]


def gather_kv(cache, block_table, b, length):
    """Positions 0 … length−1 of sequence b, (length, H, D): the blocks in table order."""
    cache, table = np.asarray(cache), np.asarray(block_table)
    bs = cache.shape[1]
    blocks = table[b, : -(-length // bs)]
    return cache[blocks].reshape((-1,) + cache.shape[2:])[:length]


def paged_attention(q, k_cache, v_cache, block_table, cache_seqlens, causal=False,
                    window=(-1, -1), scale=None, return_lse=False, softcap=0.0,
                    alibi_slopes=None):
    """Attention of q (B, Hq, Sq, D) over each sequence's cached keys.

    The Sq queries of sequence b are its last Sq positions: with Sk = cache_seqlens[b],
    ``causal`` and ``window`` follow the bottom-right rule of :func:`attention`.  GQA:
    Hq a multiple of Hkv.  ``softcap``, ``alibi_slopes`` ((Hq,) or (B, Hq)) as in
    :func:`attention`.  Returns O (B, Hq, Sq, Dv) (and LSE (B, Hq, Sq)), float64."""
    q = np.asarray(q, dtype=np.float64)
    lengths = np.asarray(cache_seqlens)
    outs, lses = [], []
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
    for b in range(q.shape[0]):
        kb, vb = (np.swapaxes(gather_kv(c, block_table, b, int(lengths[b])), 0, 1)
                  for c in (k_cache, v_cache))  # (Hkv, L, D)
        sl = None if slopes is None else slopes[b] if slopes.ndim == 2 else slopes
        o, lse = attention(q[b], kb, vb, causal=causal, scale=scale, return_lse=True,
                           window=window, softcap=softcap, alibi_slopes=sl)
        outs.append(o)
        lses.append(lse)
    out = np.stack(outs) if outs else np.zeros(q.shape[:3] + (np.shape(v_cache)[-1],))
    lse = np.stack(lses) if lses else np.zeros(q.shape[:3])
    return (out, lse) if return_lse else out


def append_kv(k_cache, v_cache, block_table, cache_seqlens, k_new, v_new):
    """Copies of the caches with the new tokens k_new, v_new (B, Snew, Hkv, D) written at
    positions cache_seqlens[b] … cache_seqlens[b] + Snew − 1 of each sequence (the caller
    then grows cache_seqlens by Snew).  The inputs are not modified."""
    k_out, v_out = np.array(k_cache), np.array(v_cache)
    table, lengths = np.asarray(block_table), np.asarray(cache_seqlens)
    bs = k_out.shape[1]
    for b in range(np.shape(k_new)[0]):
        for s in range(np.shape(k_new)[1]):
            p = int(lengths[b]) + s
            blk, row = table[b, p // bs], p % bs
            k_out[blk, row] = k_new[b, s]
            v_out[blk, row] = v_new[b, s]
    return k_out, v_out
