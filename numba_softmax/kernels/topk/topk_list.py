"""A warp's top-k list: the k best entries (value, index) seen so far, spread over 32 lanes.

Lane i holds places i, i + 32, … — ``slots`` entries a lane, a power of two — sorted best
first by :func:`numba_softmax.combine.precedes` (the larger value, then the lower index).
Three ways in, each run by all lanes together (:mod:`.topk_stream` seeds a list with
``offer``, then takes candidates by ``insert`` or ``flush``, picked by ``slots``):

* ``insert`` — one candidate into a list of one slot (k ≤ 32): its place p is how many
  entries rank before it (a vote), and the entries after p move one lane on (a shuffle);
* ``offer`` — 32 candidates at once, one a lane: a bitonic sort of them across the lanes,
  the list's last slot paired with them reversed (the better of each pair is a bitonic
  sequence that holds the best 32·slots of both), then a bitonic merge, within each lane
  across slots and then across lanes.  About log² steps a merge, where inserting 32
  candidates one by one would cost 32 chains of votes and shuffles per slot;
* ``flush`` — a buffer of candidates in shared memory, offered 32 at a time.

``threshold`` gives θ (the list's place k − 1) to every lane; ``dump`` writes the first k
places to shared memory for the block's merge.
"""

import functools
import math

import numba
from numba import cuda

from ...combine import EMPTY, precedes_device
from ..hw import jit
from ..hw.warp import ballot, shfl2

WARP = 32
BUFFER = 4 * WARP  # a warp's candidate buffer: under 32 waiting + a chunk's usual candidates
# (with 2·32, a common row overflowed into the slow path every few chunks)


@functools.cache
def warp_list(acc, slots):
    """Device functions of a warp's top-k list: ``slots`` (a power of two) entries per
    lane, place of lane i, slot s: i + 32·s, sorted best first.  The list holds the best
    32·slots ≥ k entries offered so far; θ is its place k − 1."""

    @jit.device
    def insert(lv, li, k, cu, cj, lane):
        """Insert (cu, cj) into a list of one slot (k ≤ 32) if it ranks among the k best:
        its place p is how many entries rank before it; places after p move one lane on."""
        p = cuda.popc(ballot(lane < k and precedes_device(lv[0], li[0], cu, cj)))
        if p < k:
            pu, pj = shfl2(lv[0], li[0], (lane + WARP - 1) % WARP)
            if lane > p:
                lv[0], li[0] = pu, pj
            elif lane == p:
                lv[0], li[0] = cu, cj

    @jit.device
    def exchange(v, i, partner, keep_better):
        """One compare-exchange of a sorting network across lanes: this lane keeps the
        better (or the worse) of its entry and ``partner``'s."""
        pv, pi = shfl2(v, i, partner)
        # (lists hold no NaN and no two equal entries but empty slots, so "the partner's
        # is not better" is "mine is better or the same": one comparison, no branch)
        take = precedes_device(pv, pi, v, i) == keep_better
        return (pv, pi) if take else (v, i)

    @jit.device
    def offer(lv, li, cu, cj, lane):
        """Merge 32 candidates, (cu, cj) of every lane, into the list: sort them across the
        lanes (a bitonic sort), pair the list's last slot with them reversed — the better
        of each pair is a bitonic sequence holding the best 32·slots of both — and sort
        that (a bitonic merge).  Every lane calls it together; log² steps for 32
        candidates instead of one insertion each."""
        size = 2
        while size <= WARP:  # the candidates sorted, best first
            j = size // 2
            while j >= 1:
                cu, cj = exchange(cu, cj, lane ^ j, ((lane & j) == 0) == ((lane & size) == 0))
                j //= 2
            size *= 2
        ru, rj = shfl2(cu, cj, WARP - 1 - lane)
        if precedes_device(ru, rj, lv[slots - 1], li[slots - 1]):
            lv[slots - 1], li[slots - 1] = ru, rj
        d = slots // 2
        while d >= 1:  # the merge across slots, within the lane ...
            for s in range(slots):
                if s & d == 0 and precedes_device(lv[s + d], li[s + d], lv[s], li[s]):
                    lv[s], lv[s + d] = lv[s + d], lv[s]
                    li[s], li[s + d] = li[s + d], li[s]
            d //= 2
        j = WARP // 2
        while j >= 1:  # ... then across the lanes
            for s in range(slots):
                lv[s], li[s] = exchange(lv[s], li[s], lane ^ j, (lane & j) == 0)
            j //= 2

    @jit.device
    def flush(lv, li, bv, bi, base, count, lane):
        """Merge the ``count`` candidates in bv/bi[base : base + count] into the list, 32
        at a time (``offer``)."""
        for r0 in range(0, count, WARP):
            cu, cj = acc(-math.inf), numba.int32(EMPTY)
            if r0 + lane < count:
                cu, cj = bv[base + r0 + lane], bi[base + r0 + lane]
            offer(lv, li, cu, cj, lane)

    @jit.device
    def threshold(lv, li, k):
        """θ = the list's k-th entry (place k − 1), in every lane."""
        tu, tj = shfl2(lv[0], li[0], (k - 1) % WARP)
        for s in range(1, slots):  # (each slot shuffled: a select of lv[s] would become a
            a, b = shfl2(lv[s], li[s], (k - 1) % WARP)  # runtime index, lv in local memory)
            if s == (k - 1) // WARP:
                tu, tj = a, b
        return tu, tj

    @jit.device
    def dump(lv, li, k, sv, si, base, lane):
        """Write the list's first k places to sv/si[base : base + k]."""
        for s in range(slots):
            q = lane + WARP * s
            if q < k:
                sv[base + q] = lv[s]
                si[base + q] = li[s]

    return insert, offer, flush, threshold, dump
