"""Backward passes: the gradient of softmax and of attention, from the forward's outputs.

``softmax_backward``             b1 — dx = y ∘ (dy − rowsum(dy ∘ y)), and log_softmax's
``softmax_backward_launch``      which form of ``softmax_backward`` a row size takes
``attention_backward``           b2 — FlashAttention-2 backward on CUDA cores, from the LSE
``attention_backward_tiles``     its tiles: sizes, what the device fits, shared-memory layout
``attention_backward_products``  its five matrix products
``attention_backward_io``        what goes in and out: D = rowsum(dO ∘ O) and the dQ sum
``attention_backward_tc``        b3 — the same backward on tensor cores (fp16 / bf16)
``attention_backward_tc_launch`` its tiles, fitted to the device, and its launch
``hopper_backward``              hb1 — the same gradients on ``wgmma`` (sm_90a): a dK/dV
                                 kernel and a dQ kernel, every operand from one swizzled copy
``hopper_backward_ws``           hb2 — hb1 fed by TMA through a ring of stages by a producer
                                 warp; at D 64 also one kernel (``fused``), dQ added to memory
``hopper_backward_dq``           hb2's dQ kernel
``hopper_backward_ring``         hb2's ring: the block's shape, its barriers, shared memory
``hopper_backward_parts``        what hb1 and hb2 share: masks, products, dS, checks
"""
