"""The ``numba-softmax`` command (also ``python -m numba_softmax``).

    numba-softmax tour     one row through the algorithms, then every method on a batch
    numba-softmax bench    the benchmark (see :mod:`numba_softmax.bench`)

Runs on the GPU, or on the CUDA simulator (tiny sizes) when no GPU is usable — and says
which.  :func:`run` is the console entry point: :func:`main` plus a quiet exit when the
reader of the output goes away (``numba-softmax tour | head``).
"""

import argparse
import os
import sys

import numpy as np


def _ensure_device():
    """Without a usable GPU, start again on the simulator (chosen before numba loads)."""
    from numba import cuda

    if cuda.is_available() or os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "numba_softmax", *sys.argv[1:]])


def _where():
    from numba import cuda

    from .runtime.sim import simulator_enabled

    if simulator_enabled():
        return "the CUDA simulator (no GPU found: tiny sizes, one Python thread per CUDA thread)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else name


def tour(echo=print, seed=0):
    import numba_softmax as ns

    from . import reference as R
    from .runtime.sim import simulator_enabled
    from .combine import IDENTITY, combine
    from .kernels.softmax import fold
    from numba import cuda

    from .bench.timing import seconds

    sim = simulator_enabled()
    rng = np.random.default_rng(seed)
    echo(f"numba-softmax tour — running on {_where()}\n")
    if sim:
        echo("(The simulator runs each GPU thread as a Python thread: its times mean nothing, "
             "so no device time is shown.)\n")

    # 1. one row, streamed in chunks: the running state as the online pass sees it
    n, chunk = 16, 4
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    echo(f"1. one row of {n} values, read in chunks of {chunk} (online softmax, pass 1):")
    echo("   " + " ".join(f"{v:6.2f}" for v in x))
    cuts = list(range(chunk, n, chunk))
    m_c, l_c = fold.chunk_states(cuda.to_device(x[None, :]), cuts)  # each chunk's state, on the device
    m_c, l_c = m_c.copy_to_host()[0], l_c.copy_to_host()[0]
    echo("   chunk   chunk (m, ℓ)         running (m, ℓ) = combine(running, chunk)")
    m, l = IDENTITY
    for i, (mi, li) in enumerate(zip(m_c, l_c)):
        m, l = combine(m, l, float(mi), float(li))
        echo(f"   {i:5d}   ({mi:6.3f}, {li:7.4f})    ({m:6.3f}, {l:7.4f})")
    m_naive = float(x.astype(np.float64).max())
    l_naive = float(np.exp(x.astype(np.float64) - m_naive).sum())
    echo(f"   final   (m, ℓ) = ({m:.6f}, {l:.6f})")
    echo(f"   naive   max = {m_naive:.6f}, Σ exp(x − max) = {l_naive:.6f}   (whole row at once)")
    echo(f"   softmax = exp(x − m)/ℓ; log-sum-exp = m + log ℓ = {m + np.log(l):.6f}\n")

    # 2. every method on a batch
    rows, cols = (4, 100) if sim else (4096, 4096)
    xb = rng.standard_normal((rows, cols)).astype(np.float32) * 4
    ref = R.softmax(xb)
    echo(f"2. every method on a {rows}×{cols} float32 batch, against the float64 reference:")
    echo("   method        max |p − ref|    max |Σp − 1|     time (ms)")
    d = cuda.to_device(xb)
    for method in ["three_pass", "fused", "online", "split", "auto"]:
        try:
            p = ns.softmax(d, method=method)  # compiles; the result is checked below
        except ValueError as err:
            echo(f"   {method:12s}  (skipped: {err})")
            continue
        cuda.synchronize()
        p = p.copy_to_host().astype(np.float64)
        t = "—" if sim else f"{seconds(lambda: ns.softmax(d, method=method), sim) * 1e3:9.3f}"
        echo(f"   {method:12s}  {np.abs(p - ref).max():12.2e}    {np.abs(p.sum(-1) - 1).max():12.2e}    "
             f"{t:>9}")
    echo("")

    # 3. attention: the same state with a running output O
    try:
        from ._tour_attention import tour_attention
    except ImportError:  # pragma: no cover - attention not installed
        return
    echo("3. attention: the same (m, ℓ) with a running output O (FlashAttention)")
    tour_attention(echo=echo)


DESCRIPTION = ("numba-softmax: softmax and attention kernels in Python with Numba, built "
               "around online softmax.  Runs on the GPU, or on the CUDA simulator (tiny "
               "sizes) when no GPU is usable, and says which.")


def _version():
    from . import __version__

    return __version__


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="numba-softmax", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"numba-softmax {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{tour,bench}")
    p_tour = sub.add_parser("tour", help="one row through the algorithms, then every method on a batch")
    p_tour.add_argument("--seed", type=int, default=0)
    sub.add_parser("bench", help="the benchmark (arguments: numba-softmax bench --help)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    _ensure_device()
    if args.command == "bench":
        from . import bench

        return bench.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    tour(seed=args.seed)
    return 0


def run(argv=None):
    """The console entry point: :func:`main`; if the reader of stdout goes away (``| head``),
    stop quietly instead of ending in ``BrokenPipeError``."""
    try:
        try:
            code = main(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # no second error when Python exits
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
