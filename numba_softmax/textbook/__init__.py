"""The textbook: the ladder from the formula to FlashAttention, one short file a rung.

Each rung is one algorithm written plainly — float32 on CUDA cores (fp16 on tensor cores
for a2), block-level trees in shared memory, one comment a step, a reason beside every
barrier — with its launch function beside the kernel and a ``__main__`` that validates
against the float64 NumPy reference, then times itself beside the package's fast kernel
of the same algorithm: ``python -m numba_softmax.textbook.s3_online``.  Each adds one
idea to the rung before; bytes for an M × N float32 softmax, FLOPs a value:

    s1_naive            exp(x)/Σ exp(x), a thread a row — overflows   read 2MN·4, write MN·4; 2 exp
    s2_three_pass       subtract the max: m, then ℓ, then p           read 3MN·4, write MN·4; 2 exp
    s3_online           (m, ℓ) in one pass by combine, block tree     read 2MN·4, write MN·4; 3 exp
    s4_fused            the row in registers, read once               read  MN·4, write MN·4; 2 exp
    s5_split            S blocks a row, their (m, ℓ) merged           s3's bytes + M·S·8; 3 exp
    a1_flash            attention: (m, ℓ, O) over K/V tiles in shared 4·(Sq·D + Tr·Sk·2D + Sq·D)
                        memory, a thread group a query row            a head; 4·Sq·Sk·D FLOPs
    a2_flash_mma        a1 on tensor cores: mma.sync m16n8k16, fp16   a1's in 2-byte values
    d1_split_kv         decoding: key ranges → (O_s, LSE_s), merged   read K, V once: 4·Sk·2D
    b1_softmax_backward dx = y ∘ (dy − Σ y∘dy)                        read 4MN·4, write MN·4
    b2_flash_backward   FlashAttention-2 backward, D = rowsum(dO∘O)   Q, dO re-read a key tile;
                                                                      10·Sq·Sk·D FLOPs

A rung imports only ``numba.cuda``, ``math``, ``numpy`` and :mod:`numba_softmax.combine`
(a2 also :mod:`numba_softmax.kernels.hw.mma`); ``_main`` is the ``__main__``'s host
plumbing.  Every rung runs on the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, tiny
shapes) and is tested there (``tests/test_textbook.py``).
"""

RUNGS = ("s1_naive", "s2_three_pass", "s3_online", "s4_fused", "s5_split", "a1_flash",
         "a2_flash_mma", "d1_split_kv", "b1_softmax_backward", "b2_flash_backward")
