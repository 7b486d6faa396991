"""Which kernel runs a softmax, and how: the one map from a method's name to launches.

    METHODS                         "auto" and the seven kernels
    choose(rows, n, dtype, limits)  the kernel "auto" runs for a (rows, n) problem
    launch(method, mode, x, y)      run one method's kernel(s) on (rows, n) device arrays
    traffic(method, rows, n, …)     the bytes a method's own model says it moves

The kernels, from the textbook to the roofline (each a chapter of the docs):

    three_pass  s2  max, sum, normalise: 3 reads + 1 write        any row
    online      s3  (m, ℓ) in one pass, then normalise: 2 + 1     any row
    fused       s4  the row in registers: 1 read + 1 write        ≤ 16K float32 values
    split       s5  online, several blocks per row, two launches  any row, few rows
    onchip      s6  the row in shared memory: 1 + 1               ≤ one block's shared memory
    group       s7  the row in a group of blocks' shared memory   any row (re-reads what
                    (cooperative launch, (m, ℓ) exchanged)        does not fit on chip)
    cluster     s8  the row in a thread-block cluster's shared    ≤ 8 blocks' shared memory
                    memory or registers, (m, ℓ) exchanged         (sm_90 and newer)
                    between blocks

**How "auto" chooses.**  By the row's size in bytes, against crossovers measured per
device and per item size (:mod:`.crossover_table`: ``crossovers.json`` beside this
module, and the user's own measurements on top):

1. ``fused`` while a row is at most ``fused`` bytes, or when its rows nearly fill a
   multiprocessor's registers (:func:`.fused.fill` ≥ :data:`FULL`: registers left idle
   are bytes not in flight, so a team that leaves many of them empty is slower than
   ``onchip``, which parks the row in shared memory instead);
2. ``onchip`` up to ``onchip`` bytes when there are enough rows to give every
   multiprocessor one;
3. on a device with thread-block clusters, ``cluster`` up to ``cluster`` bytes, or while
   8 blocks' registers hold the row (:func:`.cluster.register_cut`: 262 144 float32
   values), when the clusters' blocks give every multiprocessor two — or, whatever the
   rows, when half of one block's shared memory holds the row;
4. ``onchip`` for such a short row elsewhere;
5. ``online`` for float16 and bfloat16 rows when there are rows for three quarters of
   the multiprocessors — in 16 bits ``group``'s one read costs more instructions than
   ``online``'s two reads cost bytes; in float32 the two tie there and ``group`` wins
   with fewer rows (``docs/algorithms/auto.md``, "The rule");
6. else ``group``.

A device not in the table gets the ``default`` entry, measured on one of the project's
GPUs (``docs/algorithms/auto.md``), with ``onchip`` scaled to its shared memory per
multiprocessor.

**Regenerating the table.**  ``numba-softmax bench --crossovers`` times ``fused``,
``onchip``, ``cluster`` and ``group`` at rows of 16–160 KB on the user's GPU;
:func:`fit_crossovers` takes the entry under which :func:`choose` — this rule — picks
the fastest kernels on average, and :func:`save_crossovers` keeps it for ``auto`` on
that machine.

What a caller must have checked before :func:`launch`: ``x`` a 2-D device array of
float16, float32, float64 or uint16 (bfloat16 bits), any strides; ``y`` of the same
dtype, (rows, n) — or (rows, 1) for logsumexp — not overlapping ``x`` unless it *is*
``x`` with the same strides (in place: every kernel reads a value before writing it,
each value by the thread that reads it).  ``launch`` re-checks shapes and dtypes (a clear
``ValueError``/``TypeError``) but cannot see overlaps.
"""

import numpy as np

from . import crossover_table as table
from . import cluster, fused, group, online, onchip, split, three_pass
from ...runtime import launcher
from ..hw import vector
from ..rows.epilogue import LOGSUMEXP, MODES

KERNELS = {"three_pass": three_pass, "fused": fused, "online": online, "split": split,
           "onchip": onchip, "group": group, "cluster": cluster}
METHODS = ("auto", *KERNELS)
DTYPES = tuple(np.dtype(d) for d in (np.float16, np.float32, np.float64, np.uint16))
PASSES = {"three_pass": 4, "fused": 2, "online": 3, "split": 3, "onchip": 2, "group": 2,
          "cluster": 2}
"""Each value's trips through DRAM (reads + writes) by the kernel's own model, with no
help from the caches: the traffic bound that the benchmark's "% of bound" divides by."""

FULL = 0.8
"""The share of a multiprocessor's register slots (:func:`.fused.fill`) rows must fill for
``fused`` past its ``fused`` bytes: below it, the slots a team leaves empty cost more
bytes in flight than ``onchip``'s trip through shared memory costs (the rows measured on
each side of it: ``docs/algorithms/auto.md``, "Measured")."""


def crossovers(limits, itemsize=4):
    """The crossover entry for values of ``itemsize`` bytes on the device ``limits``
    describe (:func:`.crossover_table.entry`: its measured one, or the default scaled)."""
    return table.entry(limits, itemsize)[0]


def choose(rows, n, dtype, limits, entry=None):
    """The kernel ``auto`` runs for (rows, n) values of ``dtype`` on the device of
    ``limits`` (:func:`.launcher.device_limits`); the order is the module's.  ``entry``:
    crossovers to use instead of the device's (:func:`fit_crossovers` tries them)."""
    itemsize = np.dtype(dtype).itemsize
    row_bytes = n * itemsize
    entry = entry or crossovers(limits, itemsize)
    if n <= fused.max_row(limits.max_threads, dtype) and (
            row_bytes <= entry["fused"] or fused.fill(n, dtype) >= FULL):
        return "fused"
    if row_bytes <= entry["onchip"] and rows >= limits.sms:
        return "onchip"
    short = row_bytes <= (limits.shared_optin - onchip.STATIC_SHARED) // 2
    held = row_bytes <= entry["cluster"] or cluster.register_cut(
        n, dtype, vector.width_for(dtype), limits.max_threads) is not None  # (in registers)
    if cluster.supported(limits) and held and (
            short or rows * cluster.cut(n, itemsize, 1)[0] >= 2 * limits.sms):
        return "cluster"
    if short:
        return "onchip"
    if itemsize == 2 and 4 * rows >= 3 * limits.sms:
        return "online"
    return "group"


def launch(method, mode, x, y, stream=0):
    """Run ``method`` ("auto" or a kernel) in ``mode`` (:data:`.epilogue.MODES` values)
    on the (rows, n) device array ``x`` into ``y``; returns the kernel method that ran.
    Raises ``ValueError`` when a named method cannot take the shape (``fused`` or
    ``onchip`` on a row too long for the chip)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")
    if mode not in MODES.values():
        raise ValueError(f"mode must be one of {sorted(MODES.values())} (epilogue.MODES); got {mode!r}")
    _check(x, y, mode)
    rows, n = x.shape
    if method == "auto":
        method = choose(rows, n, x.dtype, launcher.device_limits())
    if rows == 0 or (n == 0 and mode != LOGSUMEXP):
        return method  # nothing to compute
    if n == 0 and method in ("split", "group", "onchip", "cluster"):
        method = "online"  # an empty row's logsumexp (−inf): no pieces to cut
    KERNELS[method].launch(x, y, mode, stream=stream)
    return method


def _check(x, y, mode):
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be float16, float32, float64 or uint16 (bfloat16 bits); got {x.dtype}")
    if y.dtype != x.dtype:
        raise TypeError(f"y must have x's dtype {x.dtype}; got {y.dtype}")
    if len(x.shape) != 2:
        raise ValueError(f"x must be a (rows, n) array; got shape {tuple(x.shape)}")
    want = (x.shape[0], 1 if mode == LOGSUMEXP else x.shape[1])
    if tuple(y.shape) != want:
        raise ValueError(f"y must have shape {want}; got {tuple(y.shape)}")


def traffic(method, rows, n, itemsize, limits=None):
    """Bytes ``method`` moves through DRAM for a (rows, n) problem by its own model:
    :data:`PASSES` trips per value; ``group`` adds the re-read of what does not fit on
    the chip (needs ``limits``).  Caches can beat these (a re-read that hits L1/L2)."""
    if method == "group" and limits is not None:
        spilled = n - group.held_per_row(rows, n, itemsize, limits)
        return rows * (2 * n + spilled) * itemsize
    return PASSES[method] * rows * n * itemsize


def fit_crossovers(measurements, limits):
    """A device's crossover entries from benchmark rows (dicts with ``rows``, ``n``,
    ``itemsize``, ``method``, ``gbps``): for each item size the entry under which
    :func:`choose` picks the fastest kernels on average (:func:`.crossover_table.fit`)."""
    return table.fit(measurements, limits, choose)


def save_crossovers(device_name, entries, path=None):
    """Keep ``entries`` for ``device_name`` in this machine's table
    (:func:`.crossover_table.save`); returns the file's path."""
    return table.save(device_name, entries, path)
