"""The torch.distributed ring's transport, without torch: which buffers each rank sends and
receives, of what size, to and from which rank, at which step.

:func:`numba_softmax.ring.distributed._ring` (the steps of one rank) runs here on every
rank of a ring in one process, each in a thread, with NumPy arrays standing in for torch
tensors and a mailbox standing in for ``batch_isend_irecv``: a receive is matched with
the send of the previous rank at the same step, and the two must have the same shape —
as NCCL and gloo require (a receive buffer of another size is an error or a truncated
shard there).  The rows then go through the float64 step (:class:`~.ReferenceCompute`)
and must give the float64 attention of the whole sequence.  :class:`TorchRing` itself is
run against a stand-in ``torch.distributed`` module (its ranks and the ops it issues).

The multi-process test with ``gloo`` is ``tests/test_ring.py::test_torch_distributed_gloo``
(where torch is installed).
"""

import sys
import threading
import types

import numpy as np
import pytest

from numba_softmax import reference as R
from numba_softmax import ring
from numba_softmax.ring import distributed


class Tensor(np.ndarray):
    """A NumPy array with the few torch methods :func:`_ring` calls."""

    def contiguous(self):
        return np.ascontiguousarray(self).view(Tensor)

    def new_empty(self, shape):
        return np.full(shape, np.nan, self.dtype).view(Tensor)  # poisoned

    def numel(self):
        return self.size


class Mailbox:
    """Messages (step, from, to) → arrays, and a barrier-free wait for them."""

    def __init__(self):
        self.box, self.cond, self.log = {}, threading.Condition(), []


class FakeRing:
    """The interface of :class:`distributed.TorchRing` that :func:`_ring` uses, over a
    :class:`Mailbox`; records every exchange as (step, op, peer, shapes)."""

    def __init__(self, mail, rank, world):
        self.mail, self.rank, self.world = mail, rank, world
        self.next, self.prev = (rank + 1) % world, (rank - 1) % world
        self.step = 0

    def start(self, send, recv):
        t, self.step = self.step, self.step + 1
        with self.mail.cond:
            self.mail.box[(t, self.rank, self.next)] = [np.array(x) for x in send]
            self.mail.log.append((self.rank, t, "send", self.next, [x.shape for x in send],
                                  [id(x) for x in send]))
            self.mail.log.append((self.rank, t, "recv", self.prev, [x.shape for x in recv],
                                  [id(x) for x in recv]))
            self.mail.cond.notify_all()
        return [(t, recv)]

    def wait(self, requests):
        for t, recv in requests:
            with self.mail.cond:
                key = (t, self.prev, self.rank)
                assert self.mail.cond.wait_for(lambda: key in self.mail.box, timeout=60), key
                sent = self.mail.box.pop(key)
            assert len(sent) == len(recv)
            for s, r in zip(sent, recv):
                assert s.shape == r.shape, (f"rank {self.rank} step {t}: receives {r.shape} "
                                            f"from rank {self.prev}, which sends {s.shape}")
                r[...] = s


def run_ring(total, world, causal, lengths=None, d=4, dv=3):
    rng = np.random.default_rng(total * 10 + world)
    q, k = (rng.standard_normal((2, total, d)) for _ in range(2))
    v = rng.standard_normal((2, total, dv))
    layout = ring.layout_for(total, world, causal, lengths)
    mail, results, errors = Mailbox(), [None] * world, []

    def rank_main(r):
        try:
            mine = [ring.shard(x, layout, r).view(Tensor) for x in (q, k, v)]
            results[r] = distributed._ring(FakeRing(mail, r, world), layout, *mine, causal,
                                           1 / np.sqrt(d), ring.ReferenceCompute(), None)
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)
            with mail.cond:  # wake the others: their partner is gone
                mail.box.update({(t, a, b): [] for t in range(world)
                                 for a in range(world) for b in range(world)})
                mail.cond.notify_all()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return q, k, v, layout, results, mail.log


@pytest.mark.parametrize("total, world, causal, lengths", [
    (13, 3, True, None),              # zigzag 5, 4, 4: every step receives another length
    (11, 4, False, [5, 0, 2, 4]),     # ragged contiguous shards, one empty
    (9, 1, True, None),               # one rank: no exchange at all
])
def test_each_step_receives_the_next_shard_from_the_previous_rank(total, world, causal, lengths):
    q, k, v, layout, results, log = run_ring(total, world, causal, lengths)
    for r in range(world):
        mine = [e for e in log if e[0] == r]
        assert len(mine) == 2 * (world - 1)  # a send and a receive a step, but the last
        for t in range(world - 1):
            (_, _, _, to, send_shapes, send_ids), = [e for e in mine if e[1:3] == (t, "send")]
            (_, _, _, frm, recv_shapes, recv_ids), = [e for e in mine if e[1:3] == (t, "recv")]
            assert to == (r + 1) % world and frm == (r - 1) % world
            held, incoming = ring.source(r, t, world), ring.source(r, t + 1, world)
            assert incoming == ring.source((r - 1) % world, t, world)  # what r − 1 holds
            # sends what it holds at step t (K, V), receives the shard it holds at t + 1
            assert send_shapes == [(2, layout.length(held), 4), (2, layout.length(held), 3)]
            assert recv_shapes == [(2, layout.length(incoming), 4), (2, layout.length(incoming), 3)]
            assert not set(send_ids) & set(recv_ids)  # into fresh buffers, not those it sends
    o = ring.unshard([np.asarray(o) for o, _ in results], layout)
    lse = ring.unshard([np.asarray(lse) for _, lse in results], layout, axis=-1)
    ref_o, ref_lse = R.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(o, ref_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


# --- TorchRing against a stand-in torch.distributed ------------------------------------------
def fake_torch(monkeypatch, rank, world, global_ranks=None):
    ops = []
    dist = types.ModuleType("torch.distributed")
    dist.get_rank = lambda group=None: rank
    dist.get_world_size = lambda group=None: world
    dist.get_global_rank = lambda group, r: global_ranks[r]
    dist.isend, dist.irecv = "isend", "irecv"

    class P2POp:
        def __init__(self, op, tensor, peer, group=None):
            self.op, self.tensor, self.peer = op, tensor, peer

    dist.P2POp = P2POp
    dist.batch_isend_irecv = lambda batch: ops.extend(batch) or ["request"]
    torch = types.ModuleType("torch")
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return ops


@pytest.mark.parametrize("group, global_ranks, want", [
    (None, None, (3, 1)),                          # the world: rank 2 of 4
    ("g", [10, 11, 12, 13], (13, 11)),             # a group: its ranks' global ranks
])
def test_torch_ring_sends_to_the_next_and_receives_from_the_previous(monkeypatch, group,
                                                                       global_ranks, want):
    ops = fake_torch(monkeypatch, 2, 4, global_ranks)
    tr = distributed.TorchRing(group)
    assert (tr.rank, tr.world, (tr.next, tr.prev)) == (2, 4, want)
    send = [np.zeros((1, 3, 4)).view(Tensor), np.zeros((1, 0, 4)).view(Tensor)]
    recv = [np.zeros((1, 5, 4)).view(Tensor), np.zeros((1, 5, 2)).view(Tensor)]
    assert tr.start(send, recv) == ["request"]
    # the empty shard is not sent; every receive is posted, from the previous rank
    assert [(o.op, o.peer, o.tensor is t) for o, t in zip(ops, [send[0], *recv])] == [
        ("isend", want[0], True), ("irecv", want[1], True), ("irecv", want[1], True)]
    ops.clear()
    assert tr.start([send[1]], [np.zeros(0).view(Tensor)]) == []  # nothing to exchange
    assert ops == []
