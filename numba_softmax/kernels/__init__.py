"""The fast kernels, a folder per concept; each folder's ``__init__`` is its table of contents.

Read in this order:

``softmax/``    softmax of rows: three passes, online, fused, split, and the on-chip family
``rows/``       the machinery the softmax kernels share: chunks of a row, reductions, epilogues
``attention/``  FlashAttention forward on CUDA cores and on tensor cores, and the merge of partials
``decode/``     split-KV decoding, the paged KV cache and its block table, appending to the cache
``backward/``   softmax backward and the FlashAttention-2 backward
``topk/``       fused softmax + top-k, and sampling
``hw/``         the hardware primitives: compile options, 16-byte vectors, PTX, mma, warp shuffles

Every kernel folds the one monoid of :mod:`numba_softmax.combine`; every launch goes through
:mod:`numba_softmax.runtime.launcher`.
"""
