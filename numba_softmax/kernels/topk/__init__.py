"""Fused softmax + top-k and sampling: the k most probable tokens in one read of the logits.

``topk``         t1 — the plans and launches of fused softmax + top-k
``topk_stream``  one pass over a piece of a row: each thread's (m, ℓ), each warp's list
``topk_list``    a warp's top-k list, spread over 32 lanes
``topk_state``   the top-k state on chip: merged per warp and per block
``topk_rows``    the sorted lists' kernels (a block a row, or pieces and a merge)
``topk_select``  the split path by radix select, for few long rows
``topk_merge``   the split path's second kernel: a row's piece lists merged
``topk_filter``  long rows by a threshold filter: keep only what can win
``sample``       t2 — one token a row, top-k / top-p / temperature, from a seed
``fold_topk``    the top-k combiner on the device, under any chunking and tree (for tests)
"""
