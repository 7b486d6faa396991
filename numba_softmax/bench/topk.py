"""Fused softmax + top-k, where ``numba_softmax.softmax_topk`` exists.

``softmax_topk(x, k)`` → the k largest probabilities and their indices, against
``torch.topk(torch.softmax(x, -1), k)``, float32 logits, B ∈ {1, 64, 1024} rows of
V ∈ {32000, 128256, 262144} values, k ∈ {8, 50}.  GB/s counts one read of the logits
(B·V·4 bytes: the outputs are tiny), held to the read-only stream.
"""

from .backward import flexible
from .context import feature

GRID = tuple((b, v, k) for b in (1, 64, 1024) for v in (32000, 128256, 262144) for k in (8, 50))
QUICK = ((1, 128256, 50), (64, 128256, 8), (1024, 128256, 50), (1024, 262144, 8))


def run(b):
    fn = feature("numba_softmax:softmax_topk", "numba_softmax.topk:softmax_topk")
    for batch, vocab, k in b.cfg.pick(((2, 100, 5),), QUICK, GRID):
        b.case(f"softmax_topk B{batch} V{vocab} k{k}", lambda: one(b, fn, batch, vocab, k))


def one(b, fn, batch, vocab, k):
    sets_n = b.n_sets(batch * vocab * 4)
    kind = b.user_kind("float32")
    xs = [b.view(b.random((batch, vocab), "float32", s, -8.0, 16.0), kind) for s in range(sets_n)]
    row = dict(suite="topk", dtype="float32", M=batch, N=vocab, k=k, bytes=batch * vocab * 4,
               bound="read")
    stream = b.call_stream
    b.record(b.timer.device(lambda i: flexible(fn, (xs[i], k), stream=stream), sets_n),
             impl="softmax_topk", level="kernel", array=kind, **row)
    if b.torch is not None:
        torch = b.torch

        def peer(i):
            with b.on_stream("torch"):
                torch.topk(torch.softmax(xs[i], -1), k)

        b.record(b.timer.device(peer, sets_n), impl="torch.topk(softmax)", level="kernel",
                 array="torch", **row)
