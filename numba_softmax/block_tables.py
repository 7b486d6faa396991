"""A paged cache's block tables checked before a kernel reads them (:func:`tables`).

A table entry that is no block of the cache, or a sequence longer than its row of the
table, would make the paged kernels read out of bounds: each is a ``ValueError`` that
names the entry or the sequence, found on the host for NumPy tables
(:func:`table_findings`) and by a small kernel where the table lives otherwise
(:mod:`.kernels.decode.table_check`), and worded once (:func:`refuse_tables`).
"""

import numpy as np

from .kernels.decode import table_check

__all__ = ["tables", "refuse_tables", "table_findings"]


def tables(block_table, cache_seqlens, num_blocks, block_size, *, batch=None, new_tokens=0,
           stream=0, entries=True):
    """Refuse a block table the paged kernels would read out of bounds with (a
    ``ValueError`` naming the entry; ``TypeError`` unless int32).

    Every sequence b needs 0 <= cache_seqlens[b] and cache_seqlens[b] + ``new_tokens``
    <= max_blocks_per_seq·block_size, and the table entries of the blocks those positions
    use must be block ids 0 … num_blocks − 1 (later entries are not read and may be
    anything, e.g. −1).  ``new_tokens``: the tokens an append will add.  NumPy arrays
    are checked on the host (:func:`table_findings`); Numba device arrays by a small
    kernel on ``stream`` (:mod:`.kernels.decode.table_check`: no copy of the table).
    ``entries=False``: dtypes and shapes only (the kernels clamp what they read; a bad
    entry then gives a wrong result)."""
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
    if isinstance(block_table, np.ndarray) and isinstance(cache_seqlens, np.ndarray):
        found = table_findings(block_table, cache_seqlens, num_blocks, block_size, int(new_tokens))
    else:
        found = table_check.findings(block_table, cache_seqlens, num_blocks, block_size,
                                     new_tokens, stream)
    refuse_tables(found, shape, num_blocks, block_size, new_tokens)


def refuse_tables(found, table_shape, num_blocks, block_size, new_tokens=0):
    """The ``ValueError`` for a table check's findings — (first bad sequence, its length,
    first bad flat entry, its id), as :func:`table_findings` and the device check give
    them — if they name anything."""
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


def table_findings(table, lengths, num_blocks, block_size, new_tokens=0):
    """The device check's four numbers for NumPy ``table`` (B, W) and ``lengths`` (B,):
    the first sequence whose length is negative or beyond its row (B: none), that
    length, the first used entry (flat, C order) that is no block id (B·W: none), and
    that entry."""
    n_b, width = table.shape
    ends = lengths.astype(np.int64) + new_tokens
    bad_b = np.flatnonzero((lengths < 0) | (ends > width * block_size))
    used = np.arange(width)[None, :] * block_size < np.clip(ends, 0, width * block_size)[:, None]
    bad_f = np.flatnonzero((used & ((table < 0) | (table >= num_blocks))).ravel())
    b = int(bad_b[0]) if bad_b.size else n_b
    f = int(bad_f[0]) if bad_f.size else n_b * width
    return (b, int(lengths[b]) if b < n_b else 0, f,
            int(table.ravel()[f]) if f < n_b * width else 0)
