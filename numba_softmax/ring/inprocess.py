"""Ring attention with P virtual ranks in one process: the transport is a Python list.

The same schedule (:mod:`.schedule`) and the same step (:func:`.compute.fold`) as the
torch.distributed ring, with the exchange replaced by a rotation of the list of K/V shards
in hand.  It needs neither torch nor more than one device, so it is what the tests run on
the CUDA simulator, what the docs show step by step, and what one GPU uses to time every
step of a P-GPU ring (``scripts/experiments/ring.py``, ``examples/10_ring_attention.py``).

    for t in 0 … P−1:
        for every rank r:  (O_r, LSE_r) ← fold(step(r, t), Q_r, K/V in hand)
        K/V in hand: rank r takes what rank r − 1 held       (the ring's send/recv)
"""

import math

from .compute import DeviceCompute, fold
from .schedule import contiguous, chunk_sizes, shard, step, unshard, zigzag

__all__ = ["virtual_ring", "virtual_ring_attention", "layout_for"]


def layout_for(total, world, causal, lengths=None):
    """The layout a ring uses for a sequence of ``total`` rows: zigzag with a causal mask
    (unless ``lengths`` is given: contiguous runs of those lengths), contiguous runs of
    ``lengths`` (default: balanced) without."""
    if lengths is not None:
        if sum(lengths) != total or len(lengths) != world:
            raise ValueError(f"lengths {list(lengths)} must be {world} counts adding up to {total}")
        return contiguous(lengths)
    return zigzag(total, world) if causal else contiguous(chunk_sizes(total, world))


def virtual_ring(qs, ks, vs, layout, *, causal=False, scale=None, compute=None, hook=None):
    """Run the ring over every rank's shards ``qs[r]``, ``ks[r]``, ``vs[r]`` ((..., S_r, D),
    rows laid out by ``layout``).  Returns ``[(O_r, LSE_r)]``: O in the dtype of ``qs[r]``,
    LSE float32 (float64 with :class:`~.compute.ReferenceCompute`).

    ``compute``: the step's arithmetic (default :class:`~.compute.DeviceCompute`);
    ``hook(phase, step, arrays)``: called with ``"begin"`` before every rank's step, then
    as in :func:`~.compute.fold`.
    """
    world = layout.world
    if not len(qs) == len(ks) == len(vs) == world:
        raise ValueError(f"need {world} shards of q, k and v, got {len(qs)}, {len(ks)}, {len(vs)}")
    for r in range(world):
        n = layout.length(r)
        if not qs[r].shape[-2] == ks[r].shape[-2] == vs[r].shape[-2] == n:
            raise ValueError(f"rank {r}: q, k, v have {qs[r].shape[-2]}, {ks[r].shape[-2]}, "
                             f"{vs[r].shape[-2]} rows; the layout gives it {n}")
    compute = compute or DeviceCompute()
    scale = 1.0 / math.sqrt(qs[0].shape[-1]) if scale is None else float(scale)
    held = list(zip(ks, vs))  # held[r]: the K/V shard rank r has in hand
    state = [None] * world
    for t in range(world):
        for r in range(world):
            st = step(layout, r, t, causal)
            if hook:
                hook("begin", st, None)
            state[r] = fold(state[r], st, qs[r], *held[r], scale, compute, hook)
        held = held[-1:] + held[:-1]  # send to r + 1, receive from r − 1
    return [(compute.finish(o, q), lse) for (o, lse), q in zip(state, qs)]


def virtual_ring_attention(q, k, v, world, *, causal=False, scale=None, lengths=None,
                           compute=None, hook=None):
    """Attention of the whole sequence through a ring of ``world`` virtual ranks: shard
    (zigzag when causal; ``lengths`` for contiguous shards of chosen lengths), run
    :func:`virtual_ring`, gather back.  Returns (O, LSE) of the whole sequence and the
    layout used."""
    total = q.shape[-2]
    if k.shape[-2] != total or v.shape[-2] != total:
        raise ValueError(f"a ring is self-attention: q, k and v need the same number of rows, "
                         f"got {q.shape[-2]}, {k.shape[-2]}, {v.shape[-2]}")
    layout = layout_for(total, world, causal, lengths)
    parts = [[shard(x, layout, r) for r in range(world)] for x in (q, k, v)]
    results = virtual_ring(*parts, layout, causal=causal, scale=scale, compute=compute,
                           hook=hook)
    o = unshard([o for o, _ in results], layout)
    lse = unshard([lse for _, lse in results], layout, axis=-1)
    return o, lse, layout
