"""Ring attention, the schedule: where the rows live and what every step computes.

P ranks stand in a ring.  Each holds a shard of the sequence — its rows of Q, K and V —
and keeps its own Q for the whole run, while the K/V shards travel round the ring:
after every step a rank sends the K/V shard it holds to rank r + 1 and receives the one
rank r − 1 held, so at step t = 0 … P−1 rank r holds the shard of rank::

    source(r, t) = (r − t) mod P

Each step a rank attends its queries to the keys in hand — giving a partial (O, LSE) —
and folds it into its running (O, LSE) with the combiner (``update_out_and_lse``).
After P steps every query has met every key once.  This module says *which* rows meet
which, as data; it moves nothing and computes nothing (the transports in
:mod:`.inprocess` and :mod:`.distributed` do).

Layouts.  ``contiguous(lengths)``: rank r holds one run of rows, any lengths.  With a
causal mask that is badly balanced: rank 0's queries see only its own keys, rank P−1's
see everything, and a rank whose held keys lie in its future computes nothing.
``zigzag(S, P)`` cuts the sequence into 2P chunks c_0 … c_{2P−1} (sizes differing by at
most one) and gives rank r the chunks c_r and c_{2P−1−r}: an early and a late chunk, so
every rank has the same causal work.  Under zigzag with a causal mask, rank r at step t
holding the shard of s = source(r, t) computes (chunk a sees chunk b fully if b < a, on
the diagonal if b = a, not at all if b > a)::

    t = 0 (s = r)   "diagonal"     all local Q against all local K, causal
    s < r           "first keys"   all local Q against c_s, the first chunk of the held
                                   K/V (c_{2P−1−s} lies in the future of both Q chunks)
    s > r           "last queries" c_{2P−1−r}, the second local Q chunk, against all the
                                   held K/V (c_r, the first, is older than both K chunks)

so every step after the first is a full (non-causal) rectangle of the same area on every
rank.  Without a mask every step is "full".  Source: zhuzilin/ring-flash-attention
(zigzag_ring_flash_attn.py); Liu et al., Ring Attention (arXiv:2310.01889); Brandon et
al., Striped Attention (arXiv:2311.09431) for the balance argument.
"""

from dataclasses import dataclass

import numpy as np

from ..arrays import ops

__all__ = ["Layout", "Step", "chunk_sizes", "contiguous", "zigzag", "source", "step",
           "schedule", "step_pairs", "rank_flops", "shard", "unshard", "zigzag_shard"]

KINDS = ("full", "diagonal", "first keys", "last queries", "none")


def chunk_sizes(total, parts):
    """``total`` rows cut into ``parts`` sizes differing by at most one, the longer first
    (``np.array_split``'s rule)."""
    if parts < 1 or total < 0:
        raise ValueError(f"need parts >= 1 and total >= 0, got parts={parts}, total={total}")
    q, extra = divmod(total, parts)
    return [q + (i < extra) for i in range(parts)]


@dataclass(frozen=True)
class Layout:
    """Which rows of a sequence each rank holds: ``pieces[r]`` is rank r's list of global
    row intervals [start, stop), in the order the rank stores them."""

    pieces: tuple
    kind: str  # "contiguous" or "zigzag"

    @property
    def world(self):
        return len(self.pieces)

    @property
    def total(self):
        return sum(self.length(r) for r in range(self.world))

    def length(self, rank):
        """The number of rows rank ``rank`` holds."""
        return sum(b - a for a, b in self.pieces[rank])

    def first(self, rank):
        """The length of rank ``rank``'s first piece (its first zigzag chunk)."""
        a, b = self.pieces[rank][0]
        return b - a

    def rows(self, rank):
        """Global positions of rank ``rank``'s local rows, in local order."""
        parts = [np.arange(a, b) for a, b in self.pieces[rank]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def lengths(self):
        return [self.length(r) for r in range(self.world)]


def contiguous(lengths):
    """Rank r holds rows [Σ_{i<r} lengths_i, Σ_{i<=r} lengths_i)."""
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 0:
        raise ValueError(f"lengths must be a non-empty list of counts >= 0, got {lengths}")
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    return Layout(tuple(((bounds[r], bounds[r + 1]),) for r in range(len(lengths))),
                  "contiguous")


def zigzag(total, world):
    """2·``world`` chunks (:func:`chunk_sizes`); rank r holds chunk r, then chunk 2P−1−r."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    bounds = np.concatenate([[0], np.cumsum(chunk_sizes(total, 2 * world))]).tolist()
    chunk = [(bounds[c], bounds[c + 1]) for c in range(2 * world)]
    return Layout(tuple((chunk[r], chunk[2 * world - 1 - r]) for r in range(world)), "zigzag")


def source(rank, t, world):
    """The rank whose K/V shard rank ``rank`` holds at step ``t``."""
    return (rank - t) % world


@dataclass(frozen=True)
class Step:
    """What rank ``rank`` computes at step ``t``: its query rows ``q`` against rows ``k``
    of the K/V shard it holds (that of rank ``source``), with the kernel's ``causal``
    flag (bottom-right aligned; only ever set where the two row ranges coincide)."""

    t: int
    rank: int
    source: int
    kind: str
    q: slice
    k: slice
    causal: bool


def step(layout, rank, t, causal):
    """The :class:`Step` of rank ``rank`` at step ``t`` (see the module docstring)."""
    world = layout.world
    s = source(rank, t, world)
    nq, nk = layout.length(rank), layout.length(s)

    def make(kind, q=(0, nq), k=(0, nk), diag=False):
        return Step(t, rank, s, kind, slice(*q), slice(*k), diag)

    if not causal:
        return make("full")
    if t == 0:
        return make("diagonal", diag=True)  # own Q against own K: the rows coincide
    if layout.kind == "zigzag":
        if s < rank:
            return make("first keys", k=(0, layout.first(s)))
        return make("last queries", q=(layout.first(rank), nq))
    if layout.kind == "contiguous":
        return make("full") if s < rank else make("none", (0, 0), (0, 0))
    raise ValueError(f"no causal schedule for a {layout.kind!r} layout")


def schedule(layout, causal):
    """All steps: ``schedule(...)[t][r]`` is rank r's :class:`Step` at step t."""
    return [[step(layout, r, t, causal) for r in range(layout.world)]
            for t in range(layout.world)]


def step_pairs(layout, st):
    """(query row, key row) pairs the step computes: (global query positions, global key
    positions, the (nq, nk) boolean mask of pairs the kernel does not mask out)."""
    qrows = layout.rows(st.rank)[st.q]
    krows = layout.rows(st.source)[st.k]
    nq, nk = len(qrows), len(krows)
    mask = np.ones((nq, nk), dtype=bool)
    if st.causal:  # the kernel's rule: j <= i + nk − nq
        mask = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
    return qrows, krows, mask


def rank_flops(layout, causal, d, dv=None, heads=1):
    """Useful FLOPs of every step of every rank: ``flops[t][r]`` = 2·(D + Dv) per
    unmasked (query, key) pair (Q Kᵀ and P V), times ``heads`` (batch·heads)."""
    dv = d if dv is None else dv
    return [[int(step_pairs(layout, st)[2].sum()) * 2 * (d + dv) * heads for st in row]
            for row in schedule(layout, causal)]


# --- a sequence into shards and back (NumPy, CuPy or torch; rows on axis −2) -------------
def _rows(x, start, stop, axis):
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def shard(x, layout, rank, axis=-2):
    """Rank ``rank``'s rows of the whole sequence ``x`` (its pieces, in order): a copy."""
    if x.shape[axis] != layout.total:
        raise ValueError(f"x has {x.shape[axis]} rows on axis {axis}; the layout holds "
                         f"{layout.total}")
    return ops.concatenate([_rows(x, a, b, axis) for a, b in layout.pieces[rank]], axis)


def unshard(shards, layout, axis=-2):
    """The whole sequence from every rank's shard (the inverse of :func:`shard`)."""
    if len(shards) != layout.world:
        raise ValueError(f"got {len(shards)} shards for a layout of {layout.world} ranks")
    pieces = []  # (global start, the rows) of every piece of every rank
    for r, x in enumerate(shards):
        if x.shape[axis] != layout.length(r):
            raise ValueError(f"shard {r} has {x.shape[axis]} rows; the layout gives it "
                             f"{layout.length(r)}")
        offset = 0
        for a, b in layout.pieces[r]:
            pieces.append((a, _rows(x, offset, offset + b - a, axis)))
            offset += b - a
    return ops.concatenate([rows for _, rows in sorted(pieces, key=lambda p: p[0])], axis)


def zigzag_shard(x, rank, world, axis=-2):
    """Rank ``rank``'s zigzag chunks of the whole sequence ``x``: ``shard(x, zigzag(S, P),
    rank)`` — what :func:`numba_softmax.ring.ring_attention` takes with ``causal=True``."""
    return shard(x, zigzag(x.shape[axis], world), rank, axis)
