"""What every example shares: ``--sim``, timing, and printing a table.

``--sim`` has to set ``NUMBA_ENABLE_CUDASIM=1`` *before* numba is first imported, so
each example imports this module first: importing it looks at the command line and
switches the simulator on when ``--sim`` is there.  Without ``--sim`` on a machine with
no usable GPU it says so in one line and starts the example again on the simulator (as
``numba-softmax tour`` does) rather than ending in the driver's traceback.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


NO_GPU = ("No usable CUDA GPU here: running on the CUDA simulator instead (as with --sim: "
          "tiny sizes, and no times — they would measure Python threads).")


def _simulating():
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _early_sim():
    if "--sim" in sys.argv[1:]:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    elif not _simulating() and _running_an_example():
        _fall_back_without_gpu()


def _running_an_example():
    """True when the process is ``python examples/NN_*.py`` (not an import elsewhere)."""
    try:
        return Path(sys.argv[0]).resolve().parent == Path(__file__).resolve().parent
    except (OSError, IndexError):
        return False


def _fall_back_without_gpu():
    """No GPU: start this script again with --sim (numba must load after the switch)."""
    from numba import cuda

    if cuda.is_available():
        return
    print(NO_GPU, flush=True)
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    os.execv(sys.executable, [sys.executable, sys.argv[0], *sys.argv[1:], "--sim"])


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
    args.sim = _simulating()
    return args


def pick(args, sim, gpu):
    """``sim`` on the simulator, ``gpu`` on a real device."""
    return sim if args.sim else gpu


# --- timing ---------------------------------------------------------------------------
def seconds(fn, sim, warmup=3, repeat=20, inner=1):
    """Median seconds of one ``fn()`` by the benchmark's timer
    (:func:`numba_softmax.bench.timing.seconds`: CUDA events around ``inner`` back-to-back
    calls queued behind a sleeping kernel, after ``warmup`` calls) — or None on the
    simulator, where a time would measure Python threads: the examples leave every
    time-derived cell blank there instead of printing numbers that look real."""
    if sim:
        return None
    from numba_softmax.bench.timing import seconds as timed

    return timed(fn, sim, warmup=warmup, repeat=repeat, inner=inner)


def hold(n_us):
    """Keep the default stream busy for about ``n_us`` µs (a sleeping kernel) while Python
    queues the work that follows (:func:`numba_softmax.bench.timing.hold`)."""
    from numba_softmax.bench.timing import hold as queue_sleep

    queue_sleep(n_us)


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
