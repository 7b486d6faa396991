"""What every example shares: ``--sim``, timing, and printing a table.

``--sim`` has to set ``NUMBA_ENABLE_CUDASIM=1`` *before* numba is first imported, so
each example imports this module first: importing it looks at the command line and
switches the simulator on when ``--sim`` is there.  It never imports numba itself at
import time.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _early_sim():
    if "--sim" in sys.argv[1:]:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def _importable():
    """Run from a checkout without ``pip install -e .``: use the checkout's package."""
    try:
        import importlib.util

        found = importlib.util.find_spec("numba_softmax") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        sys.path.insert(0, str(ROOT))


_early_sim()
_importable()


def parse(doc, add_arguments=None, argv=None):
    """Parse the command line of an example; ``--sim`` switches the CUDA simulator on.

    ``add_arguments(parser)`` adds the example's own options.  Returns the namespace,
    with ``.sim`` telling whether the simulator is in use (also when the caller set
    NUMBA_ENABLE_CUDASIM=1 in the environment)."""
    parser = argparse.ArgumentParser(
        description=doc.strip().splitlines()[0] if doc else None,
        epilog="Runs on the GPU by default; --sim runs tiny sizes on the CUDA simulator.",
    )
    parser.add_argument("--sim", action="store_true",
                        help="run on the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), tiny sizes")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    if args.sim:
        if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            parser.error("--sim must be chosen before numba is imported")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    args.sim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    return args


def pick(args, sim, gpu):
    """``sim`` on the simulator, ``gpu`` on a real device."""
    return sim if args.sim else gpu


# --- timing -----------------------------------------------------------------------------
_SPIN = None


def _spin(us):
    """Keep the GPU busy for about ``us`` microseconds (one thread, ``nanosleep``), so
    that the launches queued behind it are all in the queue before the timed interval
    starts: Python's launch overhead (~17 µs a launch) then cannot leave the GPU idle
    inside the interval."""
    global _SPIN
    from numba import cuda

    if _SPIN is None:
        @cuda.jit
        def spin(n):
            for _ in range(n):
                cuda.nanosleep(1000)

        _SPIN = spin
    _SPIN[1, 1](int(us))


def time_it(fn, sim, warmup=3, repeat=20, inner=1, queue_us=60):
    """Median seconds of one ``fn()`` call (which launches device work).

    On a GPU: CUDA events recorded around ``inner`` back-to-back calls on the default
    stream, queued behind a short sleeping kernel (``queue_us`` µs per call; raise it for
    calls with a lot of Python in them) so that the events time the device, not Python,
    and with frees deferred; ``repeat`` such samples after ``warmup`` untimed calls (the
    first pays the JIT compilation).  On the simulator events measure nothing
    (their elapsed time is −1), so wall-clock time is used; such numbers describe Python
    threads, not a GPU, and are printed only to show the table's shape.
    """
    from numba import cuda

    for _ in range(warmup):
        fn()
    cuda.synchronize()
    samples = []
    for _ in range(repeat):
        if sim:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            cuda.synchronize()
            samples.append((time.perf_counter() - t0) / inner)
        else:
            start, stop = cuda.event(), cuda.event()
            with cuda.defer_cleanup():  # no cudaFree (which synchronises) inside the interval
                if queue_us:
                    _spin(queue_us * inner)
                start.record()
                for _ in range(inner):
                    fn()
                stop.record()
                stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1e3 / inner)  # ms → s
    return statistics.median(samples)


def first_call(fn):
    """Run ``fn()`` once, synchronised; return (its result, wall-clock seconds).  On the
    simulator this one call doubles as the (meaningless) timing: running it again would
    only cost minutes."""
    from numba import cuda

    t0 = time.perf_counter()
    result = fn()
    cuda.synchronize()
    return result, time.perf_counter() - t0


def device_name(sim):
    if sim:
        return "CUDA simulator (timings are Python threads, not a GPU)"
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


# --- printing ---------------------------------------------------------------------------
def nbytes(n):
    """A byte count for people: 512 B, 4.0 KiB, 128 MiB, 2.0 GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def fmt(value, spec):
    """Format one cell; NaN and ±inf print as words, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)


def table(title, headers, rows, specs=None):
    """Print a plain-text table: a title, a header line, a rule, one line per row.

    ``specs``: one format spec per column (e.g. ``".2e"``); strings print as they are."""
    specs = specs or [""] * len(headers)
    cells = [[fmt(v, s) for v, s in zip(row, specs)] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print()
    print(title)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row, r in zip(rows, cells):  # text to the left, numbers to the right
        print("  ".join(c.ljust(w) if isinstance(v, str) else c.rjust(w)
                        for v, c, w in zip(row, r, widths)).rstrip())
    sys.stdout.flush()
