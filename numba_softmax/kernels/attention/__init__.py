"""FlashAttention forward: softmax(scale·Q Kᵀ) V in one pass, never the Sq × Sk matrix.

``attention``     a1 — on CUDA cores: K/V tiles in shared memory, the (m, ℓ, O) update
``flash_tiles``   the layout of one block of ``attention``: tile sizes and shared memory
``tileio``        16-byte loads and stores of attention tiles (4-D arrays, shared memory)
``visible``       which keys a query sees: causal (bottom-right), sliding windows
``score_mods``    soft-capping and ALiBi of the scores (compile-time options of the forwards)
``attention_tc``  a2 — on tensor cores (``mma.sync``), fp16 / bf16 in, float32 accumulation
``tc_fold``       one key tile folded into a warp's rows on tensor cores
``staging``       ``cp.async`` staging of K / V tiles for the tensor-core kernels
``merge``         the (O, LSE) merge of partial results: key ranges of one query row
``hopper``        h1 — on Hopper's warpgroup MMA (``wgmma``): Q, K, V in swizzled shared
                  memory, P from registers; the first step towards FlashAttention-3
``hopper_fold``   one key tile folded into a warpgroup's rows on ``wgmma`` (h1 … h7)
``hopper_ws``     h2 — h1 fed by TMA through a ring of mbarriers by a producer warp;
                  h3 — two consumer warpgroups, 128-key tiles, ``setmaxnreg``;
                  h4, h5 — the softmax of tile j under the product of tile j − 1;
                  h6 — h5 with the two consumers taking turns (ping-pong);
                  h7 — h5 with three consumers (192 query rows), D 64
"""
