"""Which keys a query sees: causal, sliding window, and the key range of a tile of queries.

With the diagonal aligned bottom-right, key j lies d = j − (i + shift) past query i's
diagonal, shift = Sk − Sq (the Sq queries are the last Sq positions of the sequence).
flash-attn's rule, as :func:`numba_softmax.reference.visible`::

    causal        ⇒  d <= 0
    window left  ⇒  d >= −left      (left >= 0; −1: unbounded)
    window right ⇒  d <= right      (right >= 0; −1: unbounded)

The host folds the three into one pair (left, right) of non-negative integers, with
:data:`UNBOUNDED` for "no bound" (causal is right = 0): the device then tests
−left <= d <= right, with no branch per flag.  A tile of queries i_first … i_last sees
only the keys [i_first + shift − left, i_last + shift + right]: :func:`key_range` clips a
loop to them, so tiles wholly outside the band are never visited.
"""

from ..hw import jit

UNBOUNDED = 1 << 40  # farther than any sequence; sums with it stay far inside int64


def bounds(causal=False, window=(-1, -1)):
    """(left, right) for the device: non-negative, :data:`UNBOUNDED` for no bound."""
    try:
        left, right = (int(w) for w in window)
    except (TypeError, ValueError):
        raise TypeError(f"window must be a pair of integers (left, right), got {window!r}") from None
    left = UNBOUNDED if left < 0 else left
    right = UNBOUNDED if right < 0 else right
    if causal:
        right = min(right, 0)
    return left, right


@jit.device
def key_range(i_first, i_last, shift, left, right, lo, hi):
    """The keys [lo', hi') seen by some query i_first <= i <= i_last, within [lo, hi)."""
    return max(lo, i_first + shift - left), min(hi, i_last + shift + right + 1)


@jit.device
def sees(i, j, shift, left, right):
    """Query i sees key j: −left <= j − (i + shift) <= right."""
    d = j - (i + shift)
    return d >= -left and d <= right


@jit.device
def band_edge(j_first, j_last, i_first, i_last, shift, left, right):
    """True when some (query, key) of the tile lies outside the band — the tile needs
    its scores masked (a tile wholly inside needs no per-score test)."""
    return j_last > i_first + shift + right or j_first < i_last + shift - left
