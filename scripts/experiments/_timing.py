"""Kernel time behind a sleeping kernel, and the kernels of one call under torch.profiler:
shared by the GPU sweep scripts."""

import statistics

import torch


def kernel_ms(fn, sets, calls=20, rounds=5, sleep_cycles=200_000_000):
    """Median over ``rounds`` of the milliseconds per call of ``fn(i % sets)``, ``calls``
    calls queued behind ``torch.cuda._sleep(sleep_cycles)`` (~100 ms by default: long
    enough for the host to queue every call before the GPU reaches them, so host time is
    not in the figure)."""
    fn(0)
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for i in range(calls):
            fn(i % sets)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / calls)
    return statistics.median(out)


def row_cells(runs, flops):
    """One table row's cells: "ms TFLOP/s" of each of ``runs`` (``kernel_ms(fn, 1)``;
    ``flops`` a call), "—" for a run that is None (skipped, or failed its check)."""
    cells = []
    for fn in runs:
        if fn is None:
            cells.append(f"{'—':>14}")
            continue
        ms = kernel_ms(fn, 1)
        cells.append(f"{ms:>7.3f} {flops / ms / 1e9:>6.1f}")
    return cells


def attention_row(b, h, s, d, causal, runs, flops, tail):
    """One row of the attention sweeps' tables: the shape, each run's cells
    (:func:`row_cells`), then ``tail``; printed as soon as it is timed, and returned."""
    line = (f"{b:>2} {h:>3} {s:>5} {d:>4} {str(causal):>6} " + " ".join(row_cells(runs, flops))
            + "   " + tail)
    print(line, flush=True)
    return line


def write_table(lines, path):
    """The table's lines into ``path`` (None: nowhere)."""
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


class RowSets:
    """Rows to time a softmax on, rotated past the L2: ``sets`` inputs ``xs`` (fresh
    normal values), outputs ``ys``, their Numba views ``nx``/``ny``, the float32
    reference ``want`` of ``xs[0]``; ``gbps(ms)`` counts one read and one write."""

    def __init__(self, rows, n, dtype, l2_bytes=60 * 2**20):
        from numba import cuda

        self.nbytes = rows * n * torch.tensor([], dtype=dtype).element_size()
        self.sets = max(2, -(-3 * l2_bytes // (2 * self.nbytes)))
        self.xs = [torch.randn(rows, n, device="cuda", dtype=dtype) for _ in range(self.sets)]
        self.ys = [torch.empty_like(x) for x in self.xs]
        bits = (lambda t: t.view(torch.uint16)) if dtype == torch.bfloat16 else (lambda t: t)
        self.nx = [cuda.as_cuda_array(bits(x)) for x in self.xs]  # (bfloat16 as its bits)
        self.ny = [cuda.as_cuda_array(bits(y)) for y in self.ys]
        self.want = torch.softmax(self.xs[0].float(), -1)

    def gbps(self, ms):
        return 2 * self.nbytes / ms / 1e6

    def copy_gbps(self):
        """The device-to-device copy of the same bytes (torch ``copy_``)."""
        return self.gbps(kernel_ms(lambda i: self.ys[i].copy_(self.xs[i]), self.sets))


def profiled(fn, n):
    """One call of ``fn`` under torch.profiler: its ``n`` costliest GPU kernels as
    [name, ms, launches], and the step's GPU-busy ms (every kernel summed) and wall ms."""
    import time

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    kernels = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and e.device_time_total > 0:  # a kernel, copy or set
            ms, count = kernels.get(e.name, (0.0, 0))
            kernels[e.name] = (ms + e.device_time_total / 1e3, count + 1)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:n]
    return {"kernels": [[name[:90], ms, count] for name, (ms, count) in top],
            "busy_ms": sum(ms for ms, _ in kernels.values()), "wall_ms": wall}


def profile_lines(title, prof):
    """A :func:`profiled` result as table lines: a header naming ``title`` with the GPU-busy
    and wall time, then one line a kernel (its time, its launches, its name)."""
    return ([f"\n# {title}: GPU busy {prof['busy_ms']:.3f} ms of {prof['wall_ms']:.3f} ms wall"]
            + [f"#   {ms:8.3f} ms {count:5d}x  {name}" for name, ms, count in prof["kernels"]])
