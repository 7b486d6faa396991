"""``numba-softmax bench --crossovers``: where each on-chip softmax kernel wins on *this*
GPU, and the table ``auto`` chooses by, fitted to it and kept.

For float32, float16 (bfloat16 shares its entry) and float64 rows of 16–160 KB (float64:
to 64 KB), at half a row, four and sixteen rows a multiprocessor (the winner changes with
the number of rows as well as with their length, so both are swept): ``fused``, ``onchip``,
``cluster`` (sm_90) and ``group`` through ``methods.launch``, each checked against
``torch.softmax`` first where torch is present, then timed like the softmax section
(kernel time, inputs rotated past the L2; GB/s = read once + written once).  Then
:func:`numba_softmax.kernels.softmax.methods.fit_crossovers` finds the entry under which ``auto``'s
rule picks the fastest kernels on these cases, and — on a GPU — it is saved for this
device in the user's table (:mod:`numba_softmax.kernels.softmax.crossover_table`), which ``auto``
reads from then on (not after ``--quick``: its five row sizes are too coarse to choose
by).  The run prints the entry, the share of the best each case's pick reaches under it
and under the entry used before, and the file written.  About a minute, compilation
included (`--quick`: fewer row sizes).  Not part of a plain ``bench`` run.
"""

from ..kernels.softmax import crossover_table, methods
from ..kernels.rows.epilogue import SOFTMAX
from .context import ITEMSIZE
from .results import softmax_bytes
from .softmax import checker, timed

ROW_KB = (16, 24, 32, 40, 48, 64, 80, 96, 128, 160)
QUICK_KB = (16, 32, 64, 96, 160)
DTYPES = (("float32", 160), ("float16", 160), ("float64", 64))  # (dtype, longest row, KB)
METHODS = ("fused", "onchip", "cluster", "group")


def cases(b):
    """[(rows, n, dtype)] for this run: rows of each size, at SMs/2, 4·SMs and 16·SMs rows."""
    if b.cfg.smoke:
        return [(2, 96, "float32"), (3, 40, "float32"), (2, 64, "float16")]
    sms = b.limits.sms
    sizes = QUICK_KB if b.cfg.quick else ROW_KB
    return [(rows, kb * 1024 // ITEMSIZE[dt], dt) for dt, top in DTYPES
            for kb in sizes if kb <= top for rows in (max(1, sms // 2), 4 * sms, 16 * sms)]


def run(b):
    for rows, n, dtype in cases(b):
        b.case(f"crossovers {rows}x{n} {dtype}", lambda: one_shape(b, rows, n, dtype))
    measured = [dict(rows=r.M, n=r.N, itemsize=ITEMSIZE[r.dtype], method=r.impl,
                     gbps=r.bytes / r.median_ms / 1e6)
                for r in b.results if r.suite == "crossovers" and r.median_ms]
    if not measured:
        return
    fitted = methods.fit_crossovers(measured, b.limits)
    report(fitted)
    if b.cfg.quick:  # five row sizes: too coarse to keep (a fit to them can move an entry far)
        print("crossovers: not saved (--quick measures too few row sizes to choose by; "
              "run --crossovers without --quick to keep a table)", flush=True)
    elif not b.sim:
        path = methods.save_crossovers(b.limits.name, fitted)
        print(f"crossovers: saved for {b.limits.name} in {path}; numba_softmax's 'auto' "
              f"reads them from now on (delete the file to go back)", flush=True)


def report(fitted):
    """Print each fitted entry beside the one it would replace, with their scores."""
    for size, e in sorted(fitted.items()):
        kept = {k: e[k] for k in crossover_table.KEYS}
        print(f"crossovers, {size}-byte values ({e['cases']} cases): {kept} — 'auto' at "
              f"{100 * e['score']:.1f} % of each case's best on average; the {e['source']} "
              f"entry {e['before']}: {100 * e['before_score']:.1f} %", flush=True)


def one_shape(b, rows, n, dtype):
    item = ITEMSIZE[dtype]
    k = b.n_sets(softmax_bytes(rows, n, item))
    xs = [b.random((rows, n), dtype, seed=s) for s in range(k)]
    ys = [b.random((rows, n), dtype, seed=100 + s) for s in range(k)]
    fields = dict(suite="crossovers", dtype=dtype, M=rows, N=n,
                  bytes=softmax_bytes(rows, n, item), bound="copy")
    check = checker(b, xs[0], dtype)
    for method in METHODS:
        def enqueue(i, method=method):
            methods.launch(method, SOFTMAX, xs[i], ys[i], stream=b.stream)

        timed(b, f"{method} {rows}x{n} {dtype}", enqueue, k, check, ys, impl=method,
               level="kernel", array="numba", **fields)
