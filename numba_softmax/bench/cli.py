"""``numba-softmax bench``: the sections, the command line, and the run."""

import argparse
import importlib
import os
import sys
import time
import traceback

from ..runtime.sim import simulator_enabled
from . import env, report, targets
from .context import Bench, Config, Skip
from .results import ImpossibleFigure, check, derive

# name → "module:function" (in this package), run in this order.  The bounds (copy and
# read stream) always run first: every other figure is checked against them.
SECTIONS = (
    ("softmax", "softmax:run"),
    ("attention", "attention:run_forward"),
    ("decode", "attention:run_decode"),
    ("backward", "backward:run_softmax"),
    ("attention_backward", "backward:run_attention"),
    ("topk", "topk:run"),
    ("textbook", "textbook:run"),
    ("overhead", "overhead:run"),
    ("crossovers", "crossovers:run"),
)
OPT_IN = ("crossovers",)  # run only when named (--only or --crossovers): it saves a table
BOUNDS = ("bounds", "bounds:run")
STOPPED = 3  # exit status when a figure was impossible
# The simulator's times are host-clock times of Python threads, and the ratio of two of them
# (a kernel's GB/s against the copy's) can exceed 100 % by chance: there an impossible figure
# is printed as a note and the run goes on.  The test of the stop itself turns this on.
STOP_IN_SIMULATOR = False
SIM_NOTE = ("The CUDA simulator is on (no GPU): running the simulator smoke form "
            "(--sim-smoke: tiny shapes, one repeat, about 15 seconds); its times mean nothing.")


def make_config(args):
    """The sizes and repeat counts for the command-line flags."""
    if args.sim_smoke:
        return Config(mode="smoke", min_reps=1, max_reps=1, warmup=0, cap_s=120.0,
                      overhead_calls=1, overhead_loops=1)
    if args.quick:
        cfg = Config(mode="quick", max_reps=50, target_s=0.1, overhead_calls=200)
    else:
        cfg = Config(mode="full")
    cfg.min_reps = args.reps
    cfg.max_reps = max(cfg.max_reps, args.reps)
    cfg.cap_s = args.max_case_seconds
    return cfg


def _sections(text):
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [name for name, _ in SECTIONS]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown section {', '.join(bad) or '(none)'}; "
                                         f"choose from {', '.join(known)}")
    return names


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv=None):
    from . import __doc__ as doc

    p = argparse.ArgumentParser(prog="numba-softmax bench", description=doc.split("\n")[0],
                                epilog="sections: " + ", ".join(n for n, _ in SECTIONS)
                                + ".  See python -m pydoc numba_softmax.bench for what is "
                                  "measured and the CSV columns.")
    p.add_argument("--quick", action="store_true",
                   help="a subset of every section, sized to finish in a few minutes")
    p.add_argument("--only", type=_sections, metavar="NAME[,NAME]",
                   help="run only these sections (the copy/read bounds always run)")
    p.add_argument("--crossovers", action="store_true",
                   help="measure where each on-chip softmax kernel wins on this GPU, fit the "
                        "table 'auto' chooses by and save it for this device (about a "
                        "minute; the same as --only crossovers)")
    p.add_argument("--fp16", action="store_true",
                   help="(kept for old command lines: float16 and bfloat16 are always measured)")
    p.add_argument("--out", default="bench-out", help="output folder (default: bench-out/)")
    p.add_argument("--reps", type=_positive, default=20,
                   help="at least this many timed repeats (default 20)")
    p.add_argument("--max-case-seconds", type=float, default=10.0,
                   help="fewer repeats (flagged in 'note') where --reps repeats would take "
                        "longer than this (default 10)")
    p.add_argument("--sim-smoke", action="store_true",
                   help="tiny shapes, one repeat: exercises every code path, e.g. on the CUDA "
                        "simulator (chosen automatically there)")
    return p.parse_args(argv)


def _load(spec):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def _run_section(b, name, spec):
    """Run one section; a missing feature is a one-line note, an error a failure."""
    print(f"== {name} ==", file=sys.stderr, flush=True)
    try:
        _load(spec)(b)
    except (Skip, ImportError) as e:
        why = str(e).split("\n")[0]
        b.skip(name, f"section skipped ({why})")
        print(f"{name}: skipped — {why}", flush=True)
    except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
        traceback.print_exc()
        b.fail(name, f"{type(e).__name__}: {e}")


def main(argv=None):
    args = parse_args(argv)
    sim = simulator_enabled()
    if sim and not args.sim_smoke:
        print(SIM_NOTE, flush=True)
        args.sim_smoke = True
    cfg = make_config(args)
    meta = env.environment(sim)
    print(report.format_header(meta), flush=True)
    b = Bench(cfg, sim)
    peaks = env.peaks(sim)
    b.bounds.dram_gbps, b.bounds.tflops = peaks["dram_gbps"], peaks["tflops"]

    if args.crossovers:
        args.only = sorted(set(args.only or []) | {"crossovers"})
    chosen = [(n, s) for n, s in SECTIONS
              if (n in args.only if args.only else n not in OPT_IN)]
    times, start = {}, time.perf_counter()
    for name, spec in [BOUNDS] + chosen:
        t0 = time.perf_counter()
        _run_section(b, name, spec)
        times[name] = time.perf_counter() - t0
        print(f"{name}: {times[name]:.1f} s", file=sys.stderr, flush=True)
        if name == "bounds" and not b.bounds.copy_gbps:
            print("STOP: the copy bandwidth could not be measured, so no figure can be "
                  "checked; nothing is reported.", file=sys.stderr)
            return STOPPED
        derive(b.results, b.bounds)
        try:
            check(b.results, b.bounds)
        except ImpossibleFigure as e:
            if sim and not STOP_IN_SIMULATOR:
                print(f"note (simulator, not a stop): {e}", file=sys.stderr)
                continue
            print(f"\nSTOP: {e}.  The timing or the byte/flop count is wrong; no result of "
                  f"this run is reported.", file=sys.stderr)
            return STOPPED
    total = time.perf_counter() - start

    meta["copy bandwidth"] = f"{b.bounds.copy_gbps:.5g} GB/s (device-to-device, read + written)"
    meta["read bandwidth"] = f"{b.bounds.read_gbps:.5g} GB/s (read-only stream, bytes read)"
    if b.bounds.dram_gbps:
        meta["peaks"] = (f"DRAM {b.bounds.dram_gbps:.5g} GB/s; dense TFLOP/s "
                         + ", ".join(f"{k} {v:.4g}" for k, v in b.bounds.tflops.items()))
    meta["timing"] = ("host clock (simulator: events carry no time)" if sim else
                      "kernel = CUDA events behind a sleeping kernel, call = host clock + sync") + \
        f"; median of >= {cfg.min_reps} repeats unless noted; inputs rotated past 3x the L2"
    meta["mode"] = f"{cfg.mode}; elapsed " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) \
        + f"; total {total:.0f} s"
    extra = {k: meta[k] for k in ("copy bandwidth", "read bandwidth", "peaks", "timing", "mode")
             if k in meta}
    text = report.format_report(b.results, b.skipped, times)
    judged = targets.format_targets(targets.evaluate(b.results), sim)
    text += "\n\n" + judged if judged else ""
    print("\n" + report.format_header(extra) + "\n\n" + text)

    os.makedirs(args.out, exist_ok=True)
    report.write_csv(os.path.join(args.out, "results.csv"), b.results, meta)
    with open(os.path.join(args.out, "results.txt"), "w") as f:
        f.write(report.format_header(meta) + "\n\n" + text + "\n")
    plots = report.plot_all(args.out, b.results, meta, b.bounds.copy_gbps)
    print(f"\nwrote {args.out}/: results.csv, results.txt"
          + (", " + ", ".join(plots) if plots else
             " (no plots: " + ("no rows to plot" if report.have_pyplot() else "no matplotlib") + ")")
          + f"; {total:.0f} s in all")
    return 1 if b.failed else 0
