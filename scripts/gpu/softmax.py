#!/usr/bin/env python
"""GPU check of the softmax kernels (issue 13): correct first, then timed.

    python scripts/gpu/softmax.py              # the whole check (≤ 120 s on an H100)
    python scripts/gpu/softmax.py --no-time    # correctness only
    python scripts/gpu/softmax.py --quick      # correctness, then four fp32 shapes
    NUMBA_ENABLE_CUDASIM=1 python scripts/gpu/softmax.py --tiny --no-time --methods online
                                               # a dry run of the checks on the simulator

1. **Correctness**, in worker processes (the kernels compile in parallel): every method
   (and ``auto``) × float16 / bfloat16 / float32 / float64 × softmax / log_softmax /
   logsumexp, through ``kernels.softmax.methods.launch`` on Numba device arrays: rows 37 × 1128
   holding −inf, an all −inf row, NaN, +inf and huge values; a transposed 199 × 760 view;
   a reversed, stepped (negative-stride) view; a stepped output; rows 1, 37, 199 × columns
   1, 7, 760, 1128 (float32, bfloat16); widths at each kernel threshold ±1 (float32).
   Fresh random data, outputs poisoned with NaN, float64 NumPy references, explicit
   tolerances; a method that cannot take a shape must refuse it with ``ValueError``.
2. **Timing**, alone on the GPU afterwards: kernel time by CUDA events (median of ≥ 20,
   queued behind a sleeping kernel so that the host never starves the GPU, inputs
   rotated so the working set exceeds the L2): a device-to-device copy of the same bytes
   (torch ``copy_``), every method, ``auto``, ``torch.softmax``, the Triton tutorial's
   fused softmax and seed 001's two-pass online Triton kernel (both written below;
   skipped without Triton), at 16384×1024 … 1×16777216 in float32, float16 and
   bfloat16.  Printed: GB/s (read once + write once), % of copy, and % of each method's
   own traffic bound (``methods.traffic``: 4 passes for three_pass, 3 online/split,
   2 fused/onchip/group plus its spill; above 100 % where caches serve re-reads).

Exit status: 0 all correct; 1 a correctness failure (printed); 2 a figure above 105 % of
copy (the copy baseline is wrong — nothing is trusted then).  Writes nothing but stdout,
and ``$OUT/softmax_gpu.csv`` when ``OUT`` is set.
"""

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DTYPES = ("float16", "bfloat16", "float32", "float64")
MODES = ("softmax", "log_softmax", "logsumexp")
TOL = {  # (softmax, log_softmax and logsumexp)
    "float16": (dict(rtol=2e-3, atol=2e-4), dict(rtol=2e-3, atol=2e-2)),
    "bfloat16": (dict(rtol=1e-2, atol=1e-3), dict(rtol=8e-3, atol=6e-2)),
    "float32": (dict(rtol=1e-4, atol=2e-6), dict(rtol=1e-5, atol=5e-5)),
    "float64": (dict(rtol=1e-12, atol=1e-13), dict(rtol=1e-12, atol=1e-12)),
}
SHAPES = ((16384, 1024), (4096, 8192), (2048, 16384), (1024, 65536), (256, 262144),
          (128, 1048576), (1, 16777216))
QUICK = ((16384, 1024), (2048, 16384), (256, 262144), (1, 16777216))


# --- correctness (runs in worker processes) -----------------------------------------------
def _bf16(values):
    import numpy as np

    b = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((b >> 16) | 0x40).astype(np.uint16), r)


def _decode(y, dtype):
    import numpy as np

    if dtype == "bfloat16":
        return (np.asarray(y, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(y).astype(np.float64)


def _stored(values, dtype):
    import numpy as np

    x = _bf16(values) if dtype == "bfloat16" else np.asarray(values).astype(dtype)
    return x, _decode(x, dtype)


def _special_rows(values, dtype):
    """Rows 0–5 of a (rows, n) block: −inf across warp and chunk boundaries, all −inf,
    NaN at the end, +inf in the middle, huge values, a spread past exp's underflow."""
    import numpy as np

    n = values.shape[1]
    values[0, [j for j in (0, 31, 32, 255, 256, 1023, 1024, n - 1) if j < n]] = -np.inf
    values[1] = -np.inf
    values[2, n - 1] = np.nan
    values[3, n // 2] = np.inf
    values[4] *= 300.0 if dtype == "float16" else 1e4
    values[5, : n // 2] -= np.linspace(0, 3000 if dtype != "float16" else 60000, n // 2)
    return values


def check_group(job):
    """Worker: every case of one (method, dtype); returns (cases, refusals, failures, s)."""
    method, dtype, seed, tiny = job
    import numpy as np
    from numba import cuda

    from numba_softmax import reference as R
    from numba_softmax.kernels.softmax import fused, group, methods
    from numba_softmax.runtime import launcher
    from numba_softmax.kernels.rows.epilogue import MODES as CODES

    refs = {"softmax": R.softmax, "log_softmax": R.log_softmax,
            "logsumexp": lambda v: R.logsumexp(v)[..., None]}
    rng = np.random.default_rng(seed)
    t0 = time.time()
    cases, refusals, failures = 0, 0, []
    poison = 0x7FC0 if dtype == "bfloat16" else np.nan
    limits = launcher.device_limits()

    def one(label, mode, values, x_view=None, y_view=None, refuse=False):
        """One case; ``refuse``: the method must refuse the shape (ValueError)."""
        nonlocal cases, refusals
        x, exact = _stored(values, dtype)
        if x_view is not None:  # the kernel sees x_view(device copy of x)
            exact = x_view(exact)
        d = cuda.to_device(np.ascontiguousarray(x))
        xd = x_view(d) if x_view else d
        rows, n = xd.shape
        shape = (rows, 1 if mode == "logsumexp" else n)
        full = (shape[0], 2 * shape[1]) if y_view else shape
        yfull = cuda.to_device(np.full(full, poison, d.dtype))
        yd = y_view(yfull) if y_view else yfull
        what = f"{method} {dtype} {mode} {label} ({rows}×{n})"
        try:
            ran = methods.launch(method, CODES[mode], xd, yd)
            cuda.synchronize()
        except ValueError as e:
            if refuse and "chip" in str(e):
                refusals += 1
            else:
                failures.append(f"{what}: ValueError {e}")
            return
        except Exception as e:  # a launch failure is a failure, not a crash of the check
            failures.append(f"{what}: {type(e).__name__}: {e}")
            return
        cases += 1
        if refuse:
            failures.append(f"{what}: ran ({ran}) where it must refuse")
            return
        got = yfull.copy_to_host()
        if y_view is not None:
            outside = np.ones(got.shape, bool)
            y_view(outside)[...] = False
            if not np.isnan(_decode(got[outside], dtype)).all():
                failures.append(f"{what}: wrote outside the output view")
            got = y_view(got)
        if d.copy_to_host().tobytes() != np.ascontiguousarray(x).tobytes():  # bit for bit
            failures.append(f"{what}: modified its input")
        want = refs[mode](exact)
        tol = TOL[dtype][0 if mode == "softmax" else 1]
        try:
            np.testing.assert_allclose(_decode(got, dtype), want, **tol)
        except AssertionError as e:
            lines = [s for s in str(e).splitlines() if s.strip()][:6]
            failures.append(f"{what} [{ran}]: " + " | ".join(lines))

    block, wide = ((6, 70), (7, 40)) if tiny else ((37, 1128), (199, 760))
    for mode in MODES:
        one("specials", mode, _special_rows(rng.standard_normal(block) * 3, dtype))
        one("transposed", mode, rng.standard_normal(wide[::-1]) * 3, x_view=lambda a: a.T)
        one("reversed, stepped", mode, rng.standard_normal(block) * 3,
            x_view=lambda a: a[::-1, ::-2])
        one("1×7", mode, rng.standard_normal((1, 7)))
    one("stepped output", "softmax", rng.standard_normal(block) * 3,
        y_view=lambda a: a[:, ::2])
    if dtype in ("float32", "bfloat16") and not tiny:
        for rows in (1, 37, 199):
            for n in (1, 7, 760, 1128):
                one("irregular", "softmax", rng.standard_normal((rows, n)) * 3)
    if dtype == "float32" and not tiny:
        for n, fits in thresholds(method, limits, fused, group):  # one row: 16-byte vectors
            one(f"threshold n={n}", "softmax", rng.standard_normal((1, n)) * 3, refuse=not fits)
    return cases, refusals, failures, time.time() - t0


def thresholds(method, limits, fused, group):
    """(n, fits) at each of ``method``'s thresholds ±1, float32, one row (so 16-byte
    vectors whatever n)."""
    out = []
    if method in ("fused", "auto"):
        limit = fused.max_row(limits.max_threads)
        for edge in (128, 256, 512, 1024, 2048, 4096, 8192):  # values-per-thread, team steps
            out += [(edge, True), (edge + 1, True)]
        out += [(limit, True), (limit + 1, method == "auto")]
    if method in ("online", "three_pass", "split", "auto"):
        for edge in (256, 1024, 8192, 8 * 8192):  # team steps (8 values a thread), chunks
            out += [(edge, True), (edge + 1, True)]
    if method in ("onchip", "auto"):
        per_thread = ((limits.shared_optin - 1024) // 4 // 512 - 1) // 4 * 4
        out += [(per_thread * 512, True), (per_thread * 512 + 1, method == "auto")]
    if method in ("group", "auto"):  # one row exactly filling the chip's shared memory, +1
        unit = 512 * 4
        cap = (min(limits.shared_optin, limits.shared_per_sm // 2) - 1024) // 4
        cap = (cap - 2 * 512) // unit * unit
        resident = 2 * limits.sms
        out += [(cap * resident, True), (cap * resident + 1, True)]
    return out


def correctness(workers, methods_wanted, tiny=False):
    jobs = [(m, d, 1000 + i, tiny) for i, (m, d) in enumerate(
        (m, d) for m in methods_wanted for d in DTYPES)]
    jobs.sort(key=lambda j: j[0] in ("group", "split", "auto"), reverse=True)  # slow first
    ctx = mp.get_context("spawn")
    return ctx.Pool(workers).map_async(check_group, jobs, chunksize=1), jobs


# --- peers: Triton kernels -----------------------------------------------------------------
def triton_peers():
    """(name, launch(x, y)) for the Triton tutorial's fused softmax (its persistent-grid
    form; the benchmark runs the classic one) and seed 001's two-pass online kernel (the
    benchmark's, :mod:`numba_softmax.bench.triton_peers`), or [] without Triton."""
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        return []

    @triton.jit
    def tutorial_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows,
                        n_cols, BLOCK_SIZE: tl.constexpr):
        # The Triton tutorial "Fused Softmax": the row in registers, a persistent grid.
        row_start = tl.program_id(0)
        row_step = tl.num_programs(0)
        for row_idx in range(row_start, n_rows, row_step):
            row_start_ptr = input_ptr + row_idx * input_row_stride
            col_offsets = tl.arange(0, BLOCK_SIZE)
            mask = col_offsets < n_cols
            row = tl.load(row_start_ptr + col_offsets, mask=mask, other=-float("inf"))
            row = row.to(tl.float32)
            row_minus_max = row - tl.max(row, axis=0)
            numerator = tl.exp(row_minus_max)
            denominator = tl.sum(numerator, axis=0)
            softmax_output = numerator / denominator
            out_ptrs = output_ptr + row_idx * output_row_stride + col_offsets
            tl.store(out_ptrs, softmax_output.to(output_ptr.dtype.element_ty), mask=mask)

    props = torch.cuda.get_device_properties(0)
    programs = {}

    def tutorial(x, y):
        n_rows, n_cols = x.shape
        block = triton.next_power_of_2(n_cols)
        if block > 16384:
            raise ValueError("the tutorial kernel holds a row in registers: ≤ 16384 values")
        key = (x.dtype, block)
        if key not in programs:  # the tutorial's grid: programs that fit at once
            num_warps = 8
            try:
                k = tutorial_kernel.warmup(y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                                           BLOCK_SIZE=block, num_warps=num_warps, grid=(1,))
                k._init_handles()
                occupancy = props.regs_per_multiprocessor // (k.n_regs * 32 * num_warps)
                if k.metadata.shared:
                    occupancy = min(occupancy, props.shared_memory_per_multiprocessor // k.metadata.shared)
                programs[key] = max(1, occupancy) * props.multi_processor_count
            except Exception:  # another Triton version: one program per row
                programs[key] = None
        grid = programs[key] or n_rows
        tutorial_kernel[(min(grid, n_rows),)](y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                                             BLOCK_SIZE=block, num_warps=8)

    from numba_softmax.bench.triton_peers import seed001  # the benchmark's copy of the seed's kernel

    return [("triton tutorial", tutorial), ("seed 001", seed001)]


# --- timing (main process, alone on the GPU) ------------------------------------------------
class Timer:
    def __init__(self, torch):
        self.torch = torch

    def median_ms(self, fn, sets, reps):
        """Median kernel time of fn(i) (i = rep mod sets), events around each call, all
        queued behind a sleeping kernel long enough to cover the host's queueing."""
        torch = self.torch
        fn(0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn(1 % sets)
        host = time.perf_counter() - t  # the host's cost of one call
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda._sleep(int(2e9 * (reps * host * 1.5 + 1e-3)))  # ~2 GHz clock
        for r in range(reps):
            starts[r].record()
            fn(r % sets)
            ends[r].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def timing(shapes, dtypes, kernel_methods, warm_only=False):
    """Time every implementation on every shape; ``warm_only``: call each once (JIT
    compilation, while the correctness workers run) and time nothing."""
    import numpy as np
    import torch
    from numba import cuda

    from numba_softmax.runtime import launcher
    from numba_softmax.kernels.softmax import methods
    from numba_softmax.kernels.rows.epilogue import SOFTMAX

    timer = Timer(torch)
    limits = launcher.device_limits()
    nb_stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    peers = triton_peers()
    rows_out, too_fast = [], []
    tdtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    for dname in dtypes:
        for M, N in shapes:
            b = torch.tensor([], dtype=tdtype[dname]).element_size()
            nbytes = 2 * M * N * b
            if dname != "float32" and M * N * b < 32 << 20:
                continue
            sets = max(2, math.ceil(3 * limits.l2_bytes / nbytes))
            xs = [torch.randn(M, N, device="cuda", dtype=tdtype[dname]) for _ in range(sets)]
            ys = [torch.empty_like(x) for x in xs]

            def view(t):
                if t.dtype == torch.bfloat16:
                    return cuda.as_cuda_array(t.view(torch.int16)).view(np.uint16)
                return cuda.as_cuda_array(t)

            xv, yv = [view(x) for x in xs], [view(y) for y in ys]
            reps = 20 if nbytes > 256 << 20 else 30
            impls = [("copy", lambda i: ys[i].copy_(xs[i]))]
            for m in (*kernel_methods, "auto"):
                impls.append((m, lambda i, m=m: methods.launch(m, SOFTMAX, xv[i], yv[i], stream=nb_stream)))
            impls.append(("torch", lambda i: torch.softmax(xs[i], -1)))
            for name, fn in peers:
                impls.append((name, lambda i, fn=fn: fn(xs[i], ys[i])))
            results = {}
            for name, fn in impls:
                try:
                    if warm_only:
                        fn(0)
                        continue
                    ms = timer.median_ms(fn, sets, reps)
                except ValueError:  # a method that cannot take the shape
                    continue
                results[name] = ms
            if warm_only:
                for buffers in (xs, ys, xv, yv):
                    buffers.clear()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                continue
            copy_gbps = nbytes / results["copy"] / 1e6
            chosen = methods.choose(M, N, np.uint16 if dname == "bfloat16" else dname, limits)
            for name, ms in results.items():
                gbps = nbytes / ms / 1e6
                pct = 100 * gbps / copy_gbps
                bound = None
                if name in methods.PASSES:
                    traffic = methods.traffic(name, M, N, b, limits)
                    bound = 100 * gbps / (copy_gbps * nbytes / traffic)
                rows_out.append(dict(dtype=dname, M=M, N=N, impl=name, ms=ms, gbps=gbps,
                                     pct_copy=pct, pct_bound=bound,
                                     note=chosen if name == "auto" else ""))
                if name != "copy" and pct > 105:
                    too_fast.append(f"{dname} {M}×{N} {name}: {pct:.0f} % of copy")
            for buffers in (xs, ys, xv, yv):
                buffers.clear()
            torch.cuda.empty_cache()
    return rows_out, too_fast


def table(rows, columns):
    """One line per (dtype, shape): GB/s (% copy, % own bound) per implementation."""
    out = []
    for dname in dict.fromkeys(r["dtype"] for r in rows):
        shapes = list(dict.fromkeys((r["M"], r["N"]) for r in rows if r["dtype"] == dname))
        head = f"{dname:>9} {'M×N':>12} " + " ".join(f"{c:>16}" for c in columns)
        out += [head, "-" * len(head)]
        for M, N in shapes:
            cells = []
            for c in columns:
                r = [x for x in rows if x["dtype"] == dname and (x["M"], x["N"]) == (M, N)
                     and x["impl"] == c]
                if not r:
                    cells.append(f"{'—':>16}")
                    continue
                r = r[0]
                extra = f"/{r['pct_bound']:.0f}" if r["pct_bound"] is not None else ""
                cell = f"{r['gbps']:.0f} ({r['pct_copy']:.0f}{extra})"
                cells.append(f"{cell:>16}")
            auto = [x["note"] for x in rows if x["dtype"] == dname and (x["M"], x["N"]) == (M, N)
                    and x["impl"] == "auto"]
            out.append(f"{'':>9} {f'{M}×{N}':>12} " + " ".join(cells)
                       + (f"   auto={auto[0]}" if auto else ""))
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-time", action="store_true", help="correctness only")
    ap.add_argument("--quick", action="store_true", help="time four float32 shapes only")
    ap.add_argument("--methods", default=None, help="comma-separated subset of the kernels")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--tiny", action="store_true", help="tiny correctness shapes (a simulator dry run)")
    args = ap.parse_args()
    t_start = time.time()

    from numba_softmax.runtime import launcher
    from numba_softmax.kernels.softmax import methods

    kernels = tuple(args.methods.split(",")) if args.methods else tuple(methods.KERNELS)
    limits = launcher.device_limits()
    print(f"device: {limits.name}, {limits.sms} SMs, {limits.shared_optin // 1024} KB shared "
          f"per block, L2 {limits.l2_bytes >> 20} MB; {args.workers} correctness workers")

    pending, jobs = correctness(args.workers, (*kernels, "auto"), args.tiny)
    shapes = QUICK if args.quick else SHAPES
    dtypes = ("float32",) if args.quick else ("float32", "float16", "bfloat16")
    if not args.no_time:  # compile the timed kernels meanwhile (the GPU is shared: no timing)
        t = time.time()
        timing(shapes, dtypes, kernels, warm_only=True)
        print(f"timed kernels compiled in {time.time() - t:.0f} s, beside the correctness run")
    results = pending.get()
    cases = sum(r[0] for r in results)
    refusals = sum(r[1] for r in results)
    failures = [f for r in results for f in r[2]]
    slowest = max(zip((r[3] for r in results), jobs))
    print(f"correctness: {cases} cases passed or failed below, {refusals} expected refusals, "
          f"{len(failures)} failures ({time.time() - t_start:.0f} s; slowest job "
          f"{slowest[1][0]}/{slowest[1][1]} {slowest[0]:.0f} s)")
    for f in failures[:60]:
        print("  FAIL", f)
    status = 1 if failures else 0

    if not args.no_time:
        rows, too_fast = timing(shapes, dtypes, kernels)
        columns = ["copy", *kernels, "auto", "torch", "triton tutorial", "seed 001"]
        print("\nkernel time: GB/s (% of copy / % of the method's own traffic bound), "
              "bytes = read once + write once")
        print(table(rows, columns))
        if os.environ.get("OUT"):
            import csv

            path = Path(os.environ["OUT"]) / "softmax_gpu.csv"
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        if too_fast:
            print("REFUSED: figures above 105 % of copy — the copy baseline is wrong:")
            for line in too_fast:
                print("  ", line)
            status = 2
    print(f"total {time.time() - t_start:.0f} s; {'PASS' if status == 0 else 'FAIL'}")
    sys.exit(status)


if __name__ == "__main__":
    main()
