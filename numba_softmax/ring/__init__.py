"""Ring attention: a long sequence over P ranks, K/V shards passed round a ring, each
step's partial (O, LSE) folded in with the combiner.

:mod:`.schedule`     where the rows live (contiguous, zigzag) and what each step computes;
                     pure, no arrays moved
:mod:`.compute`      one step's arithmetic (attention with LSE, merge) behind a hook
:mod:`.inprocess`    P virtual ranks in one process (a list for a transport): tests,
                     docs, one-GPU timing
:mod:`.distributed`  torch.distributed point-to-point (NCCL, or gloo on the CPU)

Nothing here imports torch until a torch function is called.
"""

from .compute import DeviceCompute, HostCompute, ReferenceCompute, fold
from .distributed import TorchRing, gather_sequence, ring_attention, shard_layout
from .inprocess import layout_for, virtual_ring, virtual_ring_attention
from .schedule import (Layout, Step, chunk_sizes, contiguous, rank_flops, schedule, shard,
                       source, step, step_pairs, unshard, zigzag, zigzag_shard)

__all__ = [
    "ring_attention", "gather_sequence", "shard_layout", "TorchRing",
    "virtual_ring", "virtual_ring_attention", "layout_for",
    "DeviceCompute", "HostCompute", "ReferenceCompute", "fold",
    "Layout", "Step", "chunk_sizes", "contiguous", "zigzag", "source", "step", "schedule",
    "step_pairs", "rank_flops", "shard", "unshard", "zigzag_shard",
]
