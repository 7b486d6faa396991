"""Ring attention over torch.distributed: every rank a process, K/V shards sent by NCCL.

Each rank calls :func:`ring_attention` on its own shard.  A step overlaps the exchange
with the kernel, as ring-flash-attention does::

    for t in 0 … P−1:
        issue   send(K/V in hand → rank r+1), recv(next K/V ← rank r−1)   batch_isend_irecv
        fold    attention with LSE on the K/V in hand, merge into (O, LSE)  (Numba kernels on
                                                                            the torch stream)
        wait    the receive; the next K/V is now in hand

NCCL runs the transfer on its own stream, made to wait for the current stream when it is
issued; ``wait()`` makes the current stream wait for it in turn, so the kernels and the
transfer overlap and stay ordered without a host synchronisation.  Memory per rank: its
Q, K, V shards, one incoming K/V shard and the running O and LSE — O(S/P·D).

With ``gloo`` on the CPU (no GPU) the same code runs, the kernels seeing NumPy arrays
(:class:`~.compute.HostCompute`): that is the multi-process test.  Nothing here is
imported before it is called: the package does not need torch.
"""

import contextlib
import math

from ..arrays import kinds
from .compute import DeviceCompute, HostCompute, fold
from .schedule import contiguous, step, unshard, zigzag

__all__ = ["TorchRing", "ring_attention", "gather_sequence", "shard_layout"]

DTYPES = ("float16", "bfloat16", "float32")


class TorchRing:
    """The ring's exchange over a torch.distributed process group (default: the world)."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next, self.prev = (to_global((self.rank + d) % self.world) for d in (1, -1))

    def all_shapes(self, row, device):
        """Every rank's ``row`` (a list of ints, the same length on every rank); ``device``:
        where the collective's tensors live (a CUDA device for NCCL)."""
        import torch

        mine = torch.tensor(row, dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        self.dist.all_gather(every, mine, group=self.group)
        return [x.tolist() for x in every]

    def start(self, send, recv):
        """Issue the sends of ``send`` to the next rank and the receives into ``recv`` from
        the previous one (empty tensors are skipped on both sides).  Returns the requests."""
        P2P = self.dist.P2POp
        ops = [P2P(self.dist.isend, x, self.next, group=self.group) for x in send if x.numel()]
        ops += [P2P(self.dist.irecv, x, self.prev, group=self.group) for x in recv if x.numel()]
        return self.dist.batch_isend_irecv(ops) if ops else []

    @staticmethod
    def wait(requests):
        for req in requests:
            req.wait()


def _check(q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not kinds.is_torch(x):
            raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
        if str(x.dtype).replace("torch.", "") not in DTYPES:
            raise TypeError(f"{name} has dtype {x.dtype}; supported: {', '.join(DTYPES)}")
        if x.ndim < 2:
            raise ValueError(f"{name} must be (..., S, D), got shape {tuple(x.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if q.shape != k.shape or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"shards must be (..., S_local, D) for q and k and (..., S_local, Dv) "
                         f"for v with one S_local, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")


def shard_layout(lengths, causal, layout="zigzag"):
    """The layout of shards of ``lengths`` rows: zigzag chunks (``layout="zigzag"`` with a
    causal mask; the lengths must be those :func:`~.schedule.zigzag` gives), else
    contiguous runs."""
    if causal and layout == "zigzag":
        expected = zigzag(sum(lengths), len(lengths))
        if expected.lengths() != list(lengths):
            raise ValueError(f"with causal=True each rank holds its zigzag chunks: shard lengths "
                             f"{list(lengths)}, expected {expected.lengths()} for S = "
                             f"{sum(lengths)} (use numba_softmax.ring.shard(x, zigzag(S, P), r))")
        return expected
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"layout must be 'zigzag' or 'contiguous', got {layout!r}")
    return contiguous(lengths)


def ring_attention(q, k, v, *, causal=False, scale=None, group=None, layout="zigzag",
                   compute=None, hook=None):
    """Attention of this rank's query shard over the keys of every rank, by ring.

    Call it on every rank of ``group`` (default: the world) at once.

    Parameters
    ----------
    q, k, v : torch tensors (..., S_local, D), (..., S_local, D), (..., S_local, Dv)
        This rank's rows of the sequence, the layout of :func:`numba_softmax.attention`;
        float16, bfloat16 or float32; CUDA tensors (NCCL) or CPU tensors (gloo; the
        kernels see NumPy arrays).  With ``causal`` the rows are the rank's zigzag chunks
        (:func:`~.schedule.shard` with :func:`~.schedule.zigzag`), unless
        ``layout="contiguous"``; without, any lengths.  Every rank: the same leading
        dimensions, D, Dv and dtype.
    causal : bool
        Query i sees key j iff j <= i (positions in the whole sequence).
    scale : float, optional
        Default 1/sqrt(D).
    compute, hook
        The step's arithmetic (default: :class:`~.compute.DeviceCompute` on the current
        torch stream for CUDA tensors, :class:`~.compute.HostCompute` for CPU tensors),
        and a callback ``hook(phase, step, arrays)`` (:func:`~.compute.fold`; here also
        ``"begin"`` before a step and ``"received"`` after its transfer).

    Returns
    -------
    (O, LSE): this rank's rows, O in the input dtype, LSE float32 (..., S_local).
    """
    _check(q, k, v)
    import torch

    ring = TorchRing(group)
    lead = math.prod(q.shape[:-2])
    code = DTYPES.index(str(q.dtype).replace("torch.", ""))
    shapes = ring.all_shapes([q.shape[-2], lead, q.shape[-1], v.shape[-1], code], q.device)
    if any(row[1:] != shapes[0][1:] for row in shapes):
        raise ValueError(f"every rank needs the same leading dimensions, D, Dv and dtype; "
                         f"got [S_local, Π lead, D, Dv, dtype] = {shapes}")
    layout = shard_layout([row[0] for row in shapes], causal, layout)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if compute is None:
        compute = (HostCompute() if q.device.type == "cpu"
                   else DeviceCompute(stream=torch.cuda.current_stream(q.device)))
    with _numba_device(q):
        return _ring(ring, layout, q, k, v, causal, scale, compute, hook)


def _numba_device(x):
    """Numba's kernels on the device of ``x`` (Numba's current device may be another)."""
    if x.device.type != "cuda":
        return contextlib.nullcontext()
    import torch
    from numba import cuda

    index = x.device.index
    return cuda.gpus[torch.cuda.current_device() if index is None else index]


def _ring(ring, layout, q, k, v, causal, scale, compute, hook):
    """The steps of one rank: issue the transfer, fold the step, wait."""
    held = (k.contiguous(), v.contiguous())
    state = None
    for t in range(ring.world):
        st = step(layout, ring.rank, t, causal)
        if hook:
            hook("begin", st, None)
        requests = []
        if t + 1 < ring.world:  # issue the transfer of the next K/V before the kernel
            n = layout.length(step(layout, ring.rank, t + 1, causal).source)
            incoming = tuple(x.new_empty(x.shape[:-2] + (n, x.shape[-1])) for x in held)
            requests = ring.start(held, incoming)
        state = fold(state, st, q, *held, scale, compute, hook)
        if t + 1 < ring.world:  # the next K/V is in hand once this returns
            ring.wait(requests)
            held = incoming
            if hook:
                hook("received", st, held)
    o, lse = state
    return compute.finish(o, q), lse


def gather_sequence(local, layout, group=None, axis=-2):
    """Every rank's shard ``local`` gathered into the whole sequence, on every rank (the
    inverse of sharding by ``layout``; shards of unequal length are padded to travel)."""
    import torch
    import torch.distributed as dist

    axis = axis % local.ndim
    longest = max(layout.lengths())
    pad = list(local.shape)
    pad[axis] = longest - local.shape[axis]
    padded = torch.cat([local, local.new_zeros(pad)], dim=axis).contiguous()
    every = [torch.empty_like(padded) for _ in range(layout.world)]
    dist.all_gather(every, padded, group=group)
    return unshard([x.narrow(axis, 0, layout.length(r)) for r, x in enumerate(every)],
                   layout, axis=axis)
