"""Decoding: few queries against a long KV cache, the cache split and the parts merged.

``decode``         d1 — split-KV decoding with grouped-query heads, merged in the same kernel
``decode_merge``   the folds at the end of a decode kernel: across warps, then across blocks
``paged``          d2 — the keys of a sequence in blocks anywhere in a pool (a block table)
``table_check``    checking a block table where it lives
``append``         writing new tokens into a paged cache, the step before each decode
``decode_tc``      d3 — split-KV decoding on tensor cores, each warp its own copy pipeline
``decode_tc_pages``  its copies: a warp's tile from the dense arrays or through the block table
``decode_tc_tiles``  its tiles: a launch configuration and the shared memory it takes
``decode_launch``  which decode kernel, how many splits, one launch
"""
