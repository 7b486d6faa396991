#!/usr/bin/env python
"""Run every kernel once on ragged shapes, checked against the float64 references —
alone, or under NVIDIA's ``compute-sanitizer`` (memcheck, racecheck, synccheck,
initcheck).

Three ways to run it::

    python scripts/sanitize.py --all-tools          # GPU: one sanitized run per tool + a table
    python scripts/sanitize.py --tool racecheck     # GPU: one tool
    python scripts/sanitize.py                      # GPU: the workload alone, no sanitizer
    python scripts/sanitize.py --sim                # CUDA simulator, tiny shapes, no sanitizer

The *workload* runs each kernel — softmax / log_softmax / logsumexp through the
three-pass, fused, online and split kernels (and the cluster kernel on sm_90),
attention (causal and not), split-KV decoding and the merge of partial results — once
per shape, on shapes whose edges are ragged: rows and columns that are multiples of no
block, warp or tile size (1×1, 3×37, 5×1001, 2×4099; 3×20011 over a cluster of three
blocks parking their pieces in shared memory, 3×200003 over seven holding them in registers
blocks; attention Sq/Sk of 1, 37, 129 with D = 40 and 64), rows of all −inf, strided and
transposed device views.  Each result is compared with the float64 NumPy
reference; the workload's exit status is 0 when all cases match, 3 otherwise.

The *wrapper* (``--tool`` / ``--all-tools``) re-executes this script as the workload
under ``compute-sanitizer --tool TOOL --error-exitcode 1`` (found on PATH, else in
``$CUDA_HOME/bin`` or ``/usr/local/cuda*/bin``), one run per tool, saves each log in
``build/sanitize/TOOL.log``, and prints a table: tool, errors (from the sanitizer's
summary line), how many of them are failed CUDA API calls, warnings (racecheck), cases
that matched, exit status, seconds.  It exits 0 only when every tool reports 0 errors
and every case matched.

``--only PATTERN`` (whole ``:``-separated parts of case names, or an fnmatch pattern;
repeatable) narrows the
workload, e.g. to re-run the one case a sanitizer complained about;
``--list`` prints the case names.  ``--full`` adds every dtype × mode combination (the
default runs float16 and float64 in softmax mode only: each extra combination costs a
kernel compilation in each sanitized run).  ``--debuginfo`` compiles the kernels with
line information (``NUMBA_CUDA_DEBUGINFO=1``) so the sanitizer can name source lines;
it changes the generated code, so use it to locate an error, not to certify.
"""

import argparse
import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
MISMATCH_EXIT = 3  # the workload's own "a result was wrong" status (the sanitizer's is 1)


# --- the workload -------------------------------------------------------------------------
def _setup_path():
    """Run from a checkout without ``pip install -e .``: use the checkout's package."""
    import importlib.util

    try:
        found = importlib.util.find_spec("numba_softmax") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        sys.path.insert(0, str(ROOT))


class Case:
    def __init__(self, name, fn):
        self.name, self.fn = name, fn


def _tolerances():
    import numpy as np

    tol = {np.dtype(np.float16): dict(rtol=2e-3, atol=2e-4),
           np.dtype(np.float32): dict(rtol=1e-4, atol=2e-6),
           np.dtype(np.float64): dict(rtol=1e-12, atol=1e-13)}
    log_tol = {np.dtype(np.float16): dict(rtol=2e-3, atol=2e-2),
               np.dtype(np.float32): dict(rtol=1e-5, atol=5e-5),
               np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}
    return tol, log_tol


def softmax_cases(sim, full):
    """softmax / log_softmax / logsumexp × method × dtype × ragged shapes."""
    import numpy as np
    from numba import cuda

    import numba_softmax as ns
    from numba_softmax import reference as R
    from numba_softmax.kernels.softmax import fused

    tol, log_tol = _tolerances()
    funcs = {"softmax": (ns.softmax, R.softmax), "log_softmax": (ns.log_softmax, R.log_softmax),
             "logsumexp": (ns.logsumexp, R.logsumexp)}
    # 1×1; 3×37 (warp per row, a partial block of rows); 5×1001 (a warp per row holding
    # 32 values per lane; online/split: one ragged chunk); 2×4099 (fused: a block per row;
    # online: two chunks, the last of 3 values; split: three pieces, the last ragged)
    # (the simulator: 32-thread blocks, so 2×300 is three online chunks / two split pieces)
    shapes = [(1, 1), (3, 37), (2, 300)] if sim else [(1, 1), (3, 37), (5, 1001), (2, 4099)]
    max_threads = 32 if sim else 1024
    dtypes = [np.float32, np.float16, np.float64]
    cases = []

    def make(func_name, method, dtype, shape):
        ours, ref = funcs[func_name]

        def run():
            rng = np.random.default_rng(zlib.crc32(f"{func_name}{method}{shape}".encode()))
            x = (4 * rng.standard_normal(shape)).astype(dtype)
            if shape[0] >= 3:
                x[1] = -np.inf  # a row of −inf: NaN softmax, −inf logsumexp
                x[2, shape[1] // 2] = -np.inf
            got = ours(x, method=method)
            want = ref(x.astype(np.float64))
            t = (tol if func_name == "softmax" else log_tol)[np.dtype(dtype)]
            np.testing.assert_allclose(got.astype(np.float64), want, **t)

        return run

    for dtype in dtypes:
        modes = list(funcs) if (dtype is np.float32 or full) else ["softmax"]
        for func_name in modes:
            for method in ("three_pass", "fused", "online", "split"):
                for shape in (shapes if dtype is np.float32 or not sim else shapes[1:2]):
                    if method == "fused" and shape[1] > max_threads * fused.MAX_VPT:
                        continue
                    name = f"{func_name}:{method}:{np.dtype(dtype).name}:{shape[0]}x{shape[1]}"
                    cases.append(Case(name, make(func_name, method, dtype, shape)))
    if not sim:  # rows of whole 16-byte vectors: fused holds float16 two to a register
        for func_name in funcs:
            cases.append(Case(f"{func_name}:fused:float16:3x4096",
                              make(func_name, "fused", np.float16, (3, 4096))))

    # cluster (sm_90 and newer): a row over three blocks of a cluster, the last piece
    # ragged, a row of −inf; their (m, ℓ) through each other's shared memory
    from numba_softmax.kernels.softmax import cluster
    from numba_softmax.runtime import launcher

    if cluster.supported(launcher.device_limits()):
        # (3, 200003): pieces of ~100 KB, so each block holds its piece in registers
        # (7 blocks of 1024 threads × 32 values, the last ragged)
        for shape in [(3, 300)] if sim else [(3, 20011), (3, 200003)]:
            for func_name in funcs:
                cases.append(Case(f"{func_name}:cluster:float32:{shape[0]}x{shape[1]}",
                                  make(func_name, "cluster", np.float32, shape)))

    # Device views read (and written) in place on a GPU: strides, transposes, offsets that
    # do or do not keep 16-byte alignment (the vector loads), ragged vector tails.
    def view_case(dtype, make_x, axis, out_view, methods):
        def run():
            rng = np.random.default_rng(7)
            base = (4 * rng.standard_normal((3, 24) if sim else (5, 48))).astype(dtype)
            x_host = make_x(base)
            d = make_x(cuda.to_device(base))
            t = tol[np.dtype(dtype)]
            for method in methods:
                if out_view:
                    big = cuda.to_device(np.full(base.shape, np.nan, dtype))
                    out = big[:, 8:8 + x_host.shape[1]]
                    ns.softmax(d, axis=axis, method=method, out=out)
                    got = out.copy_to_host()
                else:
                    got = ns.softmax(d, axis=axis, method=method).copy_to_host()
                want = np.moveaxis(R.softmax(np.moveaxis(x_host, axis, -1).astype(np.float64)), -1, axis)
                np.testing.assert_allclose(got.astype(np.float64), want, **t)
                lse = ns.logsumexp(d, axis=axis, method=method).copy_to_host()
                want = R.logsumexp(np.moveaxis(x_host, axis, -1).astype(np.float64))
                np.testing.assert_allclose(lse.astype(np.float64), want, **log_tol[np.dtype(dtype)])

        return run

    views = [
        ("step3", lambda b: b[:, 1::3], -1, False),
        ("transposed", lambda b: b.T, 0, False),
        ("aligned-offset-ragged-tail", lambda b: b[:, 8:-1], -1, False),
        ("misaligned", lambda b: b[:, 1:], -1, False),
        ("rows-from-1", lambda b: b[1:, :-3], -1, False),
        ("out-view", lambda b: b[:, 8:-1], -1, True),  # written in place through a view
    ]
    all_methods = ("three_pass", "fused", "online", "split")
    for dtype in ((np.float32,) if sim else (np.float32, np.float16)):
        for i, (label, make_x, axis, out_view) in enumerate(views):
            # the simulator: one method per view (each call is seconds there)
            methods = all_methods[i % 4 : i % 4 + 1] if sim else all_methods
            if dtype is np.float16 and label not in ("aligned-offset-ragged-tail", "misaligned", "out-view"):
                continue
            if sim and out_view:
                continue  # the simulator cannot fill a strided Numba out= (reported)
            cases.append(Case(f"softmax:views:{np.dtype(dtype).name}:{label}",
                              view_case(dtype, make_x, axis, out_view, methods)))
    return cases


def attention_cases(sim, full):
    """Attention (causal and not), split-KV decoding and merge; skipped when the
    attention module is not there yet."""
    import numpy as np

    try:
        from numba_softmax.attention import attention, merge_attention
    except ImportError:
        return []
    from numba_softmax import reference as R

    F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
    tol = {F32: dict(rtol=1e-4, atol=2e-5), F16: dict(rtol=4e-3, atol=2e-3)}
    lse_tol = {F32: dict(rtol=1e-5, atol=2e-5), F16: dict(rtol=1e-5, atol=1e-4)}

    def check(o, lse, ref_o, ref_lse, dtype):
        np.testing.assert_allclose(o.astype(np.float64), ref_o, **tol[dtype])
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows that see no key"
        fin = np.isfinite(ref_lse)
        np.testing.assert_allclose(lse[fin], ref_lse[fin], **lse_tol[dtype])

    def make(sq, sk, d, causal, dtype, splits, lead=(2,)):
        def run():
            rng = np.random.default_rng(sq * 1000 + sk * 10 + d + splits)
            q = (1.5 * rng.standard_normal(lead + (sq, d))).astype(dtype)
            k = rng.standard_normal(lead + (sk, d)).astype(dtype)
            v = rng.standard_normal(lead + (sk, d)).astype(dtype)
            o, lse = attention(q, k, v, causal=causal, return_lse=True, num_splits=splits)
            ref_o, ref_lse = R.attention(q, k, v, causal=causal, return_lse=True)
            check(o, lse, ref_o, ref_lse, dtype)

        return run

    cases = []
    sizes = [(1, 1), (1, 37), (37, 37), (37, 20), (20, 37)] if sim else \
        [(1, 1), (1, 129), (37, 37), (37, 129), (129, 129), (129, 37)]
    dims = [40] if sim else [40, 64]
    for d in dims:
        for sq, sk in sizes:
            for causal in (False, True):
                cases.append(Case(f"attention:{'causal' if causal else 'full'}:float32:"
                                  f"{sq}x{sk}:D{d}", make(sq, sk, d, causal, F32, 1)))
    # float16: one head dimension (each dtype is another kernel compilation)
    for sq, sk in ([(37, 20)] if sim else [(37, 129), (129, 37)]):
        for causal in (False, True):
            cases.append(Case(f"attention:{'causal' if causal else 'full'}:float16:{sq}x{sk}:D{dims[-1]}",
                              make(sq, sk, dims[-1], causal, F16, 1)))
    # split-KV decoding: few queries, keys cut into ranges, the last ragged
    decode = [(1, 37, 3), (12, 37, 2)] if sim else [(1, 129, 3), (4, 1000, 5), (12, 129, 4), (37, 129, 2)]
    for sq, sk, splits in decode:
        for causal in (False, True):
            cases.append(Case(f"decode:{'causal' if causal else 'full'}:float32:{sq}x{sk}:"
                              f"D{dims[0]}:splits{splits}", make(sq, sk, dims[0], causal, F32, splits)))

    def merge(dtype, s, dv):
        def run():
            rng = np.random.default_rng(s + dv)
            o_a = rng.standard_normal((2, s, dv)).astype(dtype)
            o_b = rng.standard_normal((2, s, dv)).astype(dtype)
            lse_a = (3 * rng.standard_normal((2, s))).astype(np.float32)
            lse_b = (3 * rng.standard_normal((2, s))).astype(np.float32)
            lse_a[0, 0] = -np.inf  # one side empty
            lse_a[1, -1] = lse_b[1, -1] = -np.inf  # both sides empty: O = 0, LSE = −inf
            o, lse = merge_attention(o_a, lse_a, o_b, lse_b)
            ref_o, ref_lse = R.merge_attention(o_a, lse_a, o_b, lse_b)
            check(o, lse, ref_o, ref_lse, np.dtype(dtype))

        return run

    for dtype in (F32, F16):
        for s, dv in ([(5, 40)] if sim else [(37, 40), (129, 64)]):
            cases.append(Case(f"merge:{dtype.name}:{s}x{dv}", merge(dtype, s, dv)))
    return cases


def all_cases(sim, full=False):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sanitize_more import more_cases

    return softmax_cases(sim, full) + attention_cases(sim, full) + more_cases(sim)


def matches(name, pattern):
    """A pattern with wildcards is an fnmatch pattern of the whole name; a plain one
    matches whole ``:``-separated parts in a row ("fused", "softmax:split", "float16",
    "2x4099"; "softmax" does not match "log_softmax")."""
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    parts, want = name.split(":"), pattern.split(":")
    return any(parts[i : i + len(want)] == want for i in range(len(parts) - len(want) + 1))


def select(cases, patterns):
    if not patterns:
        return cases
    return [c for c in cases if any(matches(c.name, p) for p in patterns)]


def run_workload(sim, patterns=(), full=False, out=None):
    """Run the selected cases once each; returns (passed, failed names)."""
    out = sys.stdout if out is None else out
    # all −inf rows divide by zero on purpose (on the simulator, in Python arithmetic);
    # small grids are what ragged shapes are
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    warnings.filterwarnings("ignore", message="Grid size .* will likely result in GPU under-utilization")
    _setup_path()
    from numba import cuda

    cases = select(all_cases(sim, full), patterns)
    failed = []
    t_all = time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        try:
            case.fn()
            cuda.synchronize()
            status = "ok"
        except Exception as exc:  # a mismatch or an error: report it and go on
            failed.append(case.name)
            status = f"FAIL {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            traceback.print_exc(file=out)
        print(f"  {case.name:<52} {time.perf_counter() - t0:7.2f} s  {status}", file=out, flush=True)
    passed = len(cases) - len(failed)
    print(f"WORKLOAD: {passed}/{len(cases)} cases matched the references "
          f"({time.perf_counter() - t_all:.1f} s)", file=out, flush=True)
    if not cases:
        print("WORKLOAD: no case selected", file=out)
    return passed, failed


# --- the wrapper: one sanitized run per tool ----------------------------------------------
def find_sanitizer(explicit=None):
    if explicit:
        return explicit
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    candidates = [os.path.join(h, "bin", "compute-sanitizer") for h in homes if h]
    candidates += sorted(glob.glob("/usr/local/cuda-*/bin/compute-sanitizer"), reverse=True)
    candidates += sorted(glob.glob("/opt/nvidia/*/compute-sanitizer/compute-sanitizer"))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


_ERRORS = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_RACES = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards? displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_WORKLOAD = re.compile(r"WORKLOAD:\s*(\d+)/(\d+) cases")
_API = re.compile(r"Program hit (\S+) \(error \d+\).*? on CUDA API call to (\w+)")


def parse_log(text):
    """(errors, warnings, (passed, total)) from a sanitized run's output; None where the
    line is missing (the run died before printing it)."""
    errors = warnings = None
    m = _RACES.search(text)
    if m:
        errors, warnings = int(m.group(2)), int(m.group(3))
    m = _ERRORS.search(text)
    if m:
        errors = int(m.group(1)) if errors is None else max(errors, int(m.group(1)))
    w = _WORKLOAD.search(text)
    return errors, warnings, ((int(w.group(1)), int(w.group(2))) if w else None)


# Failed API calls that are questions, not faults: cuda-bindings resolves each driver entry
# point on first use with cuGetProcAddress, and the driver answers "invalid value" for the
# ones it does not have (newer than the driver).  Counted and shown, not held against a run.
PROBES = ("cuGetProcAddress", "cuGetProcAddress_v2")


def api_errors(text):
    """The CUDA API calls that returned an error, as {(error, call): count} — reported by
    memcheck among its errors (see :data:`PROBES`)."""
    found = {}
    for m in _API.finditer(text):
        found[(m.group(1), m.group(2))] = found.get((m.group(1), m.group(2)), 0) + 1
    return found


def run_tool(sanitizer, tool, args, log_dir):
    """One sanitized run of the workload; returns a result row (dict)."""
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", str(args.error_exitcode)]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]  # hazards *and* their analysis
    cmd += list(args.sanitizer_arg or [])
    cmd += [sys.executable, str(Path(__file__).resolve()), "--workload"]
    for p in args.only or []:
        cmd += ["--only", p]
    if args.full:
        cmd.append("--full")
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # a sanitizer needs the real device
    if args.debuginfo:
        env["NUMBA_CUDA_DEBUGINFO"] = "1"
    log_path = Path(log_dir) / f"{tool}.log"
    print(f"--- {tool}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=args.timeout, cwd=str(ROOT))
        text, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = "timeout"
    seconds = time.perf_counter() - t0
    log_path.write_text(text)
    errors, warnings, work = parse_log(text)
    api = api_errors(text)
    probes = sum(n for (_, call), n in api.items() if call in PROBES)
    real = None if errors is None else errors - probes
    clean_exit = rc == 0 or (rc == args.error_exitcode and real == 0)  # only probes were reported
    ok = clean_exit and real == 0 and work is not None and work[0] == work[1]
    if args.verbose or not ok:
        tail = "\n".join(text.splitlines()[-40:])
        print(tail, flush=True)
    return dict(tool=tool, errors=errors, warnings=warnings, work=work, rc=rc,
                seconds=seconds, ok=ok, log=str(log_path), api=api, probes=probes)


def table(rows):
    head = ("tool", "errors", "of which API", "of which probes", "warnings", "cases ok", "exit",
            "seconds", "verdict")
    lines = []
    for r in rows:
        lines.append((r["tool"], "?" if r["errors"] is None else str(r["errors"]),
                      str(sum(r.get("api", {}).values())), str(r.get("probes", 0)),
                      "-" if r["warnings"] is None else str(r["warnings"]),
                      "?" if r["work"] is None else f"{r['work'][0]}/{r['work'][1]}",
                      str(r["rc"]), f"{r['seconds']:.0f}", "clean" if r["ok"] else "FAIL"))
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    out = [fmt.format(*head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt.format(*l) for l in lines]
    return "\n".join(out)


def wrap(args):
    sanitizer = find_sanitizer(args.sanitizer)
    if sanitizer is None:
        print("compute-sanitizer not found: not on PATH, nor in $CUDA_HOME/bin or "
              "/usr/local/cuda*/bin (pass --sanitizer PATH)", file=sys.stderr)
        return 2
    tools = list(TOOLS) if args.all_tools else args.tool
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = [run_tool(sanitizer, tool, args, log_dir) for tool in tools]
    print()
    print(table(rows))
    for r in rows:
        for (err, call), count in sorted(r.get("api", {}).items()):
            print(f"  {r['tool']}: {count}× {err} from {call}"
                  + ("  (a driver probe: not counted)" if call in PROBES else ""))
    for r in rows:  # one line per tool for scripts/gpu_check.py
        real = "?" if r["errors"] is None else r["errors"] - r.get("probes", 0)
        print(f"SANITIZER {r['tool']}: {real} errors ({r.get('probes', 0)} driver probes not counted)")
    print(f"\nlogs: {log_dir}/<tool>.log")
    return 0 if all(r["ok"] for r in rows) else 1


# --- command line -------------------------------------------------------------------------
def parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sim", action="store_true",
                   help="run the workload on the CUDA simulator (tiny shapes, no sanitizer)")
    p.add_argument("--tool", action="append", choices=TOOLS,
                   help="run the workload under compute-sanitizer with this tool (repeatable)")
    p.add_argument("--all-tools", action="store_true", help="memcheck, racecheck, synccheck, initcheck")
    p.add_argument("--workload", action="store_true",
                   help="(internal) run the workload itself: what the wrapper runs under the sanitizer")
    p.add_argument("--only", action="append", metavar="PATTERN",
                   help="only these cases: whole ':'-separated parts of the name (e.g. 'fused', "
                        "'softmax:split', 'float16') or an fnmatch pattern; repeatable")
    p.add_argument("--full", action="store_true",
                   help="every dtype with every mode (more kernel compilations per tool)")
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    p.add_argument("--sanitizer", help="path of compute-sanitizer (default: search)")
    p.add_argument("--sanitizer-arg", action="append", metavar="ARG",
                   help="extra argument for compute-sanitizer (repeatable), e.g. --sanitizer-arg=--print-limit=10")
    p.add_argument("--error-exitcode", type=int, default=1,
                   help="compute-sanitizer's --error-exitcode (default 1)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per tool (default 900)")
    p.add_argument("--log-dir", default=str(ROOT / "build" / "sanitize"),
                   help="where each tool's full log is written (default build/sanitize)")
    p.add_argument("--debuginfo", action="store_true",
                   help="compile kernels with NUMBA_CUDA_DEBUGINFO=1 (source lines in reports)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every tool's log tail")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.sim and (args.tool or args.all_tools):
        parser().error("--sim runs without a sanitizer: drop --tool/--all-tools")
    if args.sim:
        if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
            parser().error("--sim must be chosen before numba is imported")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    if args.list:
        _setup_path()
        for c in select(all_cases(sim, args.full), args.only):
            print(c.name)
        return 0
    if args.tool or args.all_tools:
        return wrap(args)
    print(f"sanitize workload on the {'CUDA simulator' if sim else 'GPU'}", flush=True)
    passed, failed = run_workload(sim, args.only or (), args.full)
    if failed:
        print("failed cases:\n  " + "\n  ".join(failed))
    return MISMATCH_EXIT if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
