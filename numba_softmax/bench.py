"""Benchmark harness: softmax and attention kernels against PyTorch and CuPy, one run.

Run it as ``numba-softmax bench`` or ``python -m numba_softmax.bench`` (``--help``).

What is measured
----------------
* **kernel** rows — device time of the work itself, by CUDA events recorded around each
  launch on one stream.  Our softmax kernels are called through their kernel-level
  ``launch`` on pre-made Numba device arrays (no validation, no allocation of the
  output), with the launch configuration the public API would choose.  Peers
  (``torch.softmax``, ``cupyx.scipy.special.softmax``, ``scaled_dot_product_attention``)
  run on the *same* stream (wrapped as an external stream), so the same events time them.
* **call** rows — what a user waits for: the public function (``numba_softmax.softmax``
  on CuPy or PyTorch arrays, default stream), host clock around the call plus a device
  synchronisation.  The difference to the kernel row is the Python / launch overhead.
  (Attention: the public ``attention`` in both rows — with ``out=`` and our stream for
  the event-timed one; call rows only where the device time is under 10 ms, since
  beyond that the two agree within noise.)

What is swept: softmax M×N from 16384×1024 to 1×16777216 (64–512 MiB of float32
input), every method that applies, float32 (``--fp16``: float16 too); attention with
S = 1024, 4096, 16384 at B·S = 16384 tokens and H·D = 2048 (the same work per token
for every S), D = 64, 128, causal off and on, float32 and float16, against PyTorch's
``scaled_dot_product_attention``; decoding (Sq = 1, B = 1, H = 16, D = 128) over
Sk = 16K, 64K, 256K keys with ``num_splits=1`` and with enough splits for two blocks
per multiprocessor; and the whole-call cost of ``softmax`` on a 1×1024 array.

Each timed case: one first call (JIT compilation; a method that does not apply, e.g.
``fused`` on a row too long for the chip, raises ``ValueError`` here and is skipped),
up to three synchronised warm-up calls (fewer once they pass 0.25 s) that also
estimate the cost of one call, then the timed repeats — at least ``--reps`` (20), more
for fast cases (up to ~0.3 s of work, at most 100), fewer (flagged in ``note``) only
when ``--reps`` repeats would take longer than ``--max-case-seconds``.  The statistic
is the **median**.  Memory is given back between cases.

Kernel rows queue all repeats behind a short sleeping kernel first, so that Python's
launch overhead cannot leave the GPU idle *between* a start event and its kernel (the
events would then time the host, not the kernel).  If the sleep ran out before the
last launch was queued, the loop is repeated with a longer sleep (``note`` says so if
it never sufficed).

Why inputs are rotated
----------------------
Repeating a kernel on the same buffer would find part of it in the L2 cache (50 MB on
an H100) and report a bandwidth no real first use sees.  Each case therefore allocates
``k`` independent input/output sets — enough that ``k`` sets span at least three times
the L2 — and repeat ``r`` uses set ``r mod k``: by the time a set comes round again, it
has been evicted.  (All full-sweep shapes are ≥ 64 MiB, so ``k`` is 2 there.)

What bytes are counted
----------------------
Compulsory traffic only: every input element read once and every output element
written once — ``2·M·N·itemsize`` for softmax, whatever the kernel really moves (the
three-pass kernel reads the row three times; that is what makes it slower, and the
harness should show it, not hide it).  GB/s = bytes / median time (10⁹ bytes/s).
``% copy`` compares with a large device-to-device copy measured in the same run
(bytes read + written per copy), the practical ceiling for a streaming kernel.
``× torch`` is torch's median time / this row's median time (> 1: faster than torch),
at the same level, shape and dtype.  Attention counts 4·B·H·Sq·Sk·D flops (two
matmuls), halved for causal, reported as TFLOP/s; its bytes are q, k, v read and o
written once.

Outputs (in ``--out``, default ``bench-out/``)
----------------------------------------------
``results.csv`` (``#`` comment lines with device, driver, versions, date, then one row
per measurement), ``results.txt`` (the table printed on the terminal) and
``softmax_gbps.png`` (GB/s against N per method, the copy bandwidth as a line; needs
matplotlib).

``--sim-smoke`` runs tiny shapes with three repeats so that the whole code path can be
exercised on the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``); its times are host
times of the simulator and mean nothing.
"""

import argparse
import csv
import dataclasses
import datetime
import importlib
import importlib.metadata
import itertools
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from functools import partial

import numpy as np
from numba import cuda

from ._sim import simulator_enabled
from .kernels import launcher, methods
from .softmax import softmax
from .kernels.epilogue import SOFTMAX

# --- the sweep ---------------------------------------------------------------------------
SOFTMAX_SHAPES = ((16384, 1024), (8192, 4096), (4096, 8192), (2048, 16384), (1024, 65536),
                  (256, 262144), (128, 1048576), (1, 16777216))
SOFTMAX_SHAPES_QUICK = ((16384, 1024), (4096, 8192), (256, 262144), (1, 16777216))
KERNEL_METHODS = ("three_pass", "fused", "online", "split")  # "auto" is one of these
CALL_METHODS = KERNEL_METHODS + ("auto",)
TORCH_IMPLS = ("torch", "torch.sdpa")  # the rows "× torch" divides by
ATTN_TOKENS, ATTN_HIDDEN = 16384, 2048  # B = tokens / S, H = hidden / D: same work per S
DECODE_HEADS, DECODE_DIM = 16, 128
CALL_LEVEL_MAX_MS = 10.0  # attention: whole-call rows only where overhead can matter
WARMUP_MAX_S = 0.25  # warm-up calls stop once they have taken this long


@dataclasses.dataclass
class Config:
    softmax_shapes: tuple
    softmax_dtypes: tuple
    attn_seqs: tuple
    attn_dims: tuple
    attn_dtypes: tuple
    decode_sks: tuple
    attn_causal: tuple = (False, True)
    min_reps: int = 20
    max_reps: int = 100
    warmup: int = 3
    target_s: float = 0.3  # aim for this much timed work per case ...
    cap_s: float = 10.0  # ... and never much more than this
    copy_bytes: int = 512 << 20
    attn_tokens: int = ATTN_TOKENS
    attn_hidden: int = ATTN_HIDDEN
    decode_heads: int = DECODE_HEADS
    decode_dim: int = DECODE_DIM
    overhead_n: int = 1024
    overhead_reps: int = 1000


def make_config(args):
    """The sizes and repeat counts for the command-line flags."""
    if args.sim_smoke:
        return Config(softmax_shapes=((2, 64),), softmax_dtypes=("float32",),
                      attn_seqs=(16,), attn_dims=(16,), attn_dtypes=("float32",),
                      decode_sks=(64,), attn_causal=(True,), min_reps=3, max_reps=3,
                      warmup=0, cap_s=120.0, copy_bytes=16 << 10, attn_tokens=16,
                      attn_hidden=16, decode_heads=1, decode_dim=16, overhead_n=64,
                      overhead_reps=3)
    dtypes = ("float32", "float16") if args.fp16 else ("float32",)
    if args.quick:
        cfg = Config(SOFTMAX_SHAPES_QUICK, dtypes, (1024, 4096), (128,), ("float16",),
                     (16384, 262144), max_reps=50)
    else:
        cfg = Config(SOFTMAX_SHAPES, dtypes, (1024, 4096, 16384), (64, 128),
                     ("float32", "float16"), (16384, 65536, 262144))
    cfg.min_reps = args.reps
    cfg.max_reps = max(cfg.max_reps, args.reps)
    cfg.cap_s = args.max_case_seconds
    return cfg


# --- pure helpers (tested directly) ------------------------------------------------------
def softmax_bytes(m, n, itemsize):
    """Compulsory traffic of an (m, n) softmax: read every input once, write every output once."""
    return 2 * m * n * itemsize


def attention_flops(b, h, sq, sk, d, causal=False):
    """4·B·H·Sq·Sk·D (QKᵀ and PV, 2 flops per multiply-add), halved for causal."""
    flops = 4 * b * h * sq * sk * d
    return flops // 2 if causal else flops


def attention_bytes(b, h, sq, sk, d, itemsize):
    """q and o (Sq rows), k and v (Sk rows): each read or written once."""
    return b * h * (2 * sq + 2 * sk) * d * itemsize


def median(values):
    """The median (mean of the middle two for an even count)."""
    s = sorted(values)
    if not s:
        raise ValueError("median of no values")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def gbps(n_bytes, ms):
    return n_bytes / (ms * 1e-3) / 1e9


def buffer_sets(set_bytes, l2_bytes, free_bytes, max_sets=64):
    """How many input/output sets to rotate: enough to span 3× the L2 (at least 2),
    but using at most half of the free memory (at least 1)."""
    want = max(2, math.ceil(3 * l2_bytes / max(set_bytes, 1)))
    fit = int(0.5 * free_bytes // max(set_bytes, 1))
    return max(1, min(want, fit, max_sets))


def choose_reps(est_s, min_reps, max_reps, target_s, cap_s):
    """(repeats, note): about ``target_s`` of work, within [min_reps, max_reps]; fewer
    than ``min_reps`` (never fewer than 5 or min_reps) only when that would exceed ``cap_s``."""
    reps = int(target_s / est_s) if est_s > 0 else max_reps
    reps = max(min_reps, min(max_reps, reps))
    if reps * est_s > cap_s:
        reps = max(min(min_reps, 5), int(cap_s / est_s))
        if reps < min_reps:
            return reps, f"only {reps} reps (slow case)"
    return reps, ""


def pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def decode_splits(batch_heads, num_sms, sk):
    """Splits for split-KV decoding: enough blocks for two per multiprocessor (a power
    of two), but no split shorter than 64 keys; at least 2."""
    return max(2, min(pow2_at_least(-(-2 * num_sms // batch_heads)), sk // 64))


# --- results -----------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    suite: str  # copy | softmax | overhead | attention | decode
    impl: str
    level: str  # kernel (CUDA events) | call (host clock around the public call)
    array: str  # the array kind the call was given
    dtype: str
    median_ms: float
    min_ms: float
    reps: int
    M: int = None
    N: int = None
    B: int = None
    H: int = None
    Sq: int = None
    Sk: int = None
    D: int = None
    causal: bool = None
    splits: int = None
    bytes: int = None
    flops: int = None
    gbps: float = None
    pct_copy: float = None
    tflops: float = None
    x_torch: float = None
    note: str = ""


CSV_COLUMNS = [f.name for f in dataclasses.fields(Result)]
_PEER_KEY = ("suite", "level", "dtype", "M", "N", "B", "H", "Sq", "Sk", "D", "causal")


def derive(results, copy_gbps):
    """Fill GB/s, % of copy bandwidth, TFLOP/s and the ratio to torch (in place)."""
    torch_ms = {tuple(getattr(r, k) for k in _PEER_KEY): r.median_ms
                for r in results if r.impl in TORCH_IMPLS}
    for r in results:
        if r.bytes:
            r.gbps = gbps(r.bytes, r.median_ms)
            if copy_gbps:
                r.pct_copy = 100.0 * r.gbps / copy_gbps
        if r.flops:
            r.tflops = r.flops / (r.median_ms * 1e-3) / 1e12
        ref = torch_ms.get(tuple(getattr(r, k) for k in _PEER_KEY))
        if ref is not None:
            r.x_torch = ref / r.median_ms
    return results


def shape_label(r):
    """A short description of a row's problem."""
    if r.suite in ("attention", "decode"):
        label = f"B{r.B} H{r.H} Sq{r.Sq} Sk{r.Sk} D{r.D}"
        label += " causal" if r.causal else ""
        return label + (f" splits={r.splits}" if r.splits else "")
    if r.suite == "copy":
        size = r.bytes // 2  # bytes counts read + written
        return f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size / 2**10:g} KiB"
    return f"{r.M}x{r.N}"


def _fmt(value, spec):
    if value is None or value == "":
        return ""
    return format(value, spec) if spec else str(value)


TABLE_COLUMNS = (  # (header, row → value, format)
    ("impl", lambda r: r.impl, ""),
    ("level", lambda r: r.level, ""),
    ("array", lambda r: r.array, ""),
    ("dtype", lambda r: r.dtype, ""),
    ("shape", shape_label, ""),
    ("reps", lambda r: r.reps, "d"),
    ("median ms", lambda r: r.median_ms, ".4g"),
    ("GB/s", lambda r: r.gbps, ".4g"),
    ("% copy", lambda r: r.pct_copy, ".3g"),
    ("TFLOP/s", lambda r: r.tflops, ".3g"),
    ("x torch", lambda r: r.x_torch, ".2f"),
    ("note", lambda r: r.note, ""),
)


def format_table(rows, columns=TABLE_COLUMNS):
    """Rows as an aligned text table: text left-aligned, numbers right-aligned."""
    cells = [[_fmt(get(r), spec) for _, get, spec in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(columns)]
    numeric = [bool(spec) for _, _, spec in columns]

    def line(values):
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(out).rstrip()

    header = line([h for h, _, _ in columns])
    return "\n".join([header, "-" * len(header)] + [line(c) for c in cells])


def format_report(results, meta):
    """The header lines and one table per suite."""
    parts = [f"{k}: {v}" for k, v in meta.items()]
    for suite in dict.fromkeys(r.suite for r in results):
        parts += ["", f"== {suite} ==", format_table([r for r in results if r.suite == suite])]
    return "\n".join(parts)


# --- the machine -------------------------------------------------------------------------
def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_smi_driver():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def environment(sim):
    """What ran where: device, driver, library versions, date (goes into every output)."""
    if sim:
        device, driver = "CUDA simulator (times are meaningless)", "none (simulator)"
    else:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        cc = ".".join(map(str, dev.compute_capability))
        device = f"{name} (sm_{cc.replace('.', '')}, {dev.MULTIPROCESSOR_COUNT} SMs, " \
                 f"L2 {_l2_bytes(sim) / 2**20:g} MiB)"
        from numba.cuda.cudadrv.driver import driver as cuda_driver

        major, minor = cuda_driver.get_version()
        driver = f"CUDA {major}.{minor}"
        smi = _nvidia_smi_driver()
        driver += f", driver {smi}" if smi else ""
    return {
        "device": device,
        "driver": driver,
        "versions": ", ".join(f"{d} {_version(d)}" for d in ("numba", "numba-cuda", "numpy"))
                    + f", torch {_version('torch')}, cupy {_cupy_version()}"
                    + f", python {platform.python_version()}",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _cupy_version():
    for dist in ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"):
        v = _version(dist)
        if v != "not installed":
            return v
    return "not installed"


def _l2_bytes(sim):
    if sim:
        return 0
    try:
        return int(cuda.get_current_device().L2_CACHE_SIZE)
    except Exception:  # an older binding: assume a large L2 (more sets, never fewer)
        return 128 << 20


def _free_bytes(sim):
    if sim:
        return 1 << 34
    return int(cuda.current_context().get_memory_info()[0])


def _import(name):
    """A module, or None when it cannot be imported (an optional peer)."""
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a broken CUDA install raising something else
        return None


# --- timing ------------------------------------------------------------------------------
@cuda.jit
def _sleep(n_us, one_us):
    """Keep the stream busy for about ``n_us`` microseconds (while the host queues work)."""
    for _ in range(n_us):
        cuda.nanosleep(one_us)


@cuda.jit
def _fill(flat, seed, lo, width):
    """flat[i] = pseudo-random in [lo, lo + width): two LCG steps of (i, seed)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, flat.size, stride):
        h = (i * 1103515245 + seed) % 2147483648
        h = (h * 1103515245 + 12345) % 2147483648
        flat[i] = np.float32(lo + width * (h / 2147483648.0))


def _summary(times_ms, reps, note):
    return dict(median_ms=median(times_ms), min_ms=min(times_ms), reps=reps, note=note)


def _join(*notes):
    return "; ".join(n for n in notes if n)


class Timer:
    """Warm-up, repeat count, and the two clocks: CUDA events (kernel) and host (call)."""

    def __init__(self, cfg, stream, sim):
        self.cfg, self.stream, self.sim = cfg, stream, sim
        self.can_hold = True  # False if the sleep kernel cannot run (cuda.nanosleep: sm_70+)

    @staticmethod
    def sync():
        cuda.synchronize()

    def _warm(self, call, n_sets, warmup=None):
        """First call (compiles; raises if the case does not apply), warm-up; returns
        (host seconds to queue one call, seconds per synchronised call)."""
        t0 = time.perf_counter()
        call(0)
        self.sync()
        first = time.perf_counter() - t0
        queue, total = [], []
        for r in range(self.cfg.warmup if warmup is None else warmup):
            t0 = time.perf_counter()
            call((r + 1) % n_sets)
            t1 = time.perf_counter()
            self.sync()
            queue.append(t1 - t0)
            total.append(time.perf_counter() - t0)
            if sum(total) > WARMUP_MAX_S:  # a slow case is warm after one call
                break
        return (median(queue), median(total)) if total else (first, first)

    def _reps(self, est_s):
        c = self.cfg
        return choose_reps(est_s, c.min_reps, c.max_reps, c.target_s, c.cap_s)

    def host(self, call, n_sets, reps=None):
        """Median of host-clock times of call(i) + device synchronisation (``reps``:
        a fixed count instead of the adaptive one)."""
        _, est = self._warm(call, n_sets, None if reps is None else min(50, reps))
        reps, note = self._reps(est) if reps is None else (reps, "")
        return _summary(self._host_loop(call, n_sets, reps), reps, note)

    def _host_loop(self, call, n_sets, reps):
        times = []
        for r in range(reps):
            t0 = time.perf_counter()
            call(r % n_sets)
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def device(self, enqueue, n_sets):
        """Median of CUDA-event times around enqueue(i) on ``self.stream``.  (On the
        simulator events carry no time: host clock instead.)"""
        queue_s, est = self._warm(enqueue, n_sets)
        reps, note = self._reps(est)
        if self.sim:
            return _summary(self._host_loop(enqueue, n_sets, reps), reps, note)
        hold_us = min(4_000_000, int(2 * reps * queue_s * 1e6) + 2000)
        for _ in range(3):  # a longer sleep if the host did not get ahead
            times, starved = self._event_loop(enqueue, n_sets, reps, hold_us)
            if not starved or not self.can_hold:
                break
            hold_us = min(16_000_000, hold_us * 4)
        if starved:
            note = _join(note, "host-bound: launch gaps may be in the times")
        return _summary(times, reps, note)

    def _event_loop(self, enqueue, n_sets, reps, hold_us):
        """All repeats queued behind a sleep; True as second value if the sleep ended
        before the last repeat was queued (the GPU may have waited for the host)."""
        events = [(cuda.event(), cuda.event()) for _ in range(reps)]
        held = cuda.event(timing=False)
        with cuda.defer_cleanup():  # no cuMemFree (which synchronises) inside the loop
            self._hold(hold_us)
            held.record(self.stream)
            for r, (start, end) in enumerate(events):
                start.record(self.stream)
                enqueue(r % n_sets)
                end.record(self.stream)
            starved = held.query()
            self.stream.synchronize()
        return [start.elapsed_time(end) for start, end in events], starved

    def _hold(self, hold_us):
        if self.can_hold:
            try:
                _sleep[1, 1, self.stream](hold_us, np.uint32(1000))
            except Exception as e:  # noqa: BLE001 - time without the hold, and say so
                self.can_hold = False
                print(f"note: no sleep kernel ({type(e).__name__}: {e}); kernel times of "
                      "fast cases may include launch gaps", file=sys.stderr)


# --- the benchmark context -----------------------------------------------------------------
class Bench:
    """Everything a case needs: config, timer, stream, peers, device facts, results."""

    def __init__(self, cfg, sim):
        self.cfg, self.sim = cfg, sim
        self.stream = cuda.stream()
        self.timer = Timer(cfg, self.stream, sim)
        limits = launcher.device_limits()
        self.max_threads, self.num_sms = limits.max_threads, limits.sms
        self.l2 = _l2_bytes(sim)
        self.torch = None if sim else _import("torch")
        self.cupy = None if sim else _import("cupy")
        self.cupyx_softmax = None
        if self.cupy is not None:
            special = _import("cupyx.scipy.special")
            self.cupyx_softmax = getattr(special, "softmax", None)
        if self.torch is not None and not self.torch.cuda.is_available():
            self.torch = None
        self.results, self.skipped = [], []
        self.copy_gbps = None
        self._external = {}

    # -- arrays --
    def random(self, shape, dtype, seed, lo=-2.0, width=4.0):
        """A device array of pseudo-random values (filled on the device)."""
        arr = cuda.device_array(shape, dtype=dtype)
        flat = arr.reshape(arr.size)
        blocks = 1 if self.sim else min(4096, -(-arr.size // 256))
        _fill[blocks, 32 if self.sim else 256](flat, seed * 7919 + 1, lo, width)
        return arr

    def n_sets(self, set_bytes):
        return buffer_sets(set_bytes, self.l2, _free_bytes(self.sim))

    def user_kind(self, prefer=("torch", "cupy")):
        """The array kind public calls get: the first of ``prefer`` that is importable."""
        for kind in prefer:
            if getattr(self, kind) is not None:
                return kind
        return "numba"

    def view(self, arr, kind):
        """A zero-copy CuPy / PyTorch view of a Numba device array (or the array itself)."""
        if kind == "torch":
            return self.torch.as_tensor(arr, device="cuda")
        if kind == "cupy":
            return self.cupy.asarray(arr)
        return arr

    def on_stream(self, lib):
        """A context manager that makes ``lib`` (torch or cupy) work on our stream."""
        if lib not in self._external:
            mod = self.torch if lib == "torch" else self.cupy
            self._external[lib] = mod.cuda.ExternalStream(int(self.stream))
        if lib == "torch":
            return self.torch.cuda.stream(self._external[lib])
        return self._external[lib]

    def release(self):
        """Give memory back between cases (Numba's deferred frees, the peers' pools)."""
        self.sync_all()
        if not self.sim:
            cuda.current_context().deallocations.clear()
        if self.torch is not None:
            self.torch.cuda.empty_cache()
        if self.cupy is not None:
            self.cupy.get_default_memory_pool().free_all_blocks()

    def sync_all(self):
        cuda.synchronize()

    # -- recording --
    def record(self, timing, **fields):
        self.results.append(Result(**fields, **timing))

    def skip(self, what, why):
        self.skipped.append(f"{what}: {why}")


# --- the cases -----------------------------------------------------------------------------
def bench_copy(b):
    """Device-to-device copy bandwidth: the ceiling for a kernel that streams memory."""
    n = b.cfg.copy_bytes // 4
    k = b.n_sets(2 * b.cfg.copy_bytes)
    src = [cuda.device_array(n, dtype=np.float32) for _ in range(k)]
    dst = [cuda.device_array(n, dtype=np.float32) for _ in range(k)]
    timing = b.timer.device(lambda i: dst[i].copy_to_device(src[i], stream=b.stream), k)
    b.record(timing, suite="copy", impl="d2d copy", level="kernel", array="numba",
             dtype="float32", M=1, N=n, bytes=2 * b.cfg.copy_bytes)
    b.copy_gbps = gbps(2 * b.cfg.copy_bytes, timing["median_ms"])


def bench_softmax(b, m, n, dtype):
    """One (M, N, dtype): every kernel, every public method, and the peers."""
    dt = np.dtype(dtype)
    k = b.n_sets(softmax_bytes(m, n, dt.itemsize))
    xs = [b.random((m, n), dt, seed=s) for s in range(k)]
    ys = [cuda.device_array((m, n), dtype=dt) for _ in range(k)]
    row = dict(suite="softmax", dtype=dt.name, M=m, N=n, bytes=softmax_bytes(m, n, dt.itemsize))

    for method in KERNEL_METHODS:  # kernel level: launch on pre-made device arrays,
        def enqueue(i, method=method):  # configured as the public call configures it
            methods.launch(method, SOFTMAX, xs[i], ys[i], stream=b.stream)

        _try_case(b, f"softmax {method} {m}x{n} {dt.name}", lambda: b.record(
            b.timer.device(enqueue, k), impl=method, level="kernel", array="numba", **row))

    kind = b.user_kind()
    user = [b.view(x, kind) for x in xs]
    for method in CALL_METHODS:  # call level: the public function
        def call(i, method=method):
            softmax(user[i], method=method)

        _try_case(b, f"ns.softmax method={method} {m}x{n} {dt.name}", lambda: b.record(
            b.timer.host(call, k), impl=method, level="call", array=kind, **row))

    for peer, fn, arrays in _softmax_peers(b, xs):
        def peer_kernel(i, fn=fn, arrays=arrays, peer=peer):
            with b.on_stream(peer):
                fn(arrays[i])

        def peer_call(i, fn=fn, arrays=arrays):
            fn(arrays[i])

        b.record(b.timer.device(peer_kernel, k), impl=peer, level="kernel", array=peer, **row)
        b.record(b.timer.host(peer_call, k), impl=peer, level="call", array=peer, **row)


def _softmax_peers(b, xs):
    """(name, softmax over the last axis, arrays) for each importable peer."""
    peers = []
    if b.torch is not None:
        torch = b.torch
        tx = [b.view(x, "torch") for x in xs]
        peers.append(("torch", lambda x: torch.softmax(x, dim=-1), tx))
    if b.cupyx_softmax is not None:
        f = b.cupyx_softmax
        peers.append(("cupy", lambda x: f(x, axis=-1), [b.view(x, "cupy") for x in xs]))
    return peers


def _try_case(b, what, run):
    """Run one case; a method that does not apply (ValueError) is skipped, not fatal."""
    try:
        run()
    except ValueError as e:
        b.skip(what, str(e).split(";")[0])


def bench_overhead(b):
    """Whole-call cost on a tiny problem: ns.softmax vs torch.softmax on the same data."""
    n = b.cfg.overhead_n
    x = b.random((1, n), np.dtype(np.float32), seed=99)
    row = dict(suite="overhead", level="call", dtype="float32", M=1, N=n,
               bytes=softmax_bytes(1, n, 4))
    reps = b.cfg.overhead_reps
    for kind in [k for k in ("cupy", "torch") if getattr(b, k) is not None] or ["numba"]:
        xv = b.view(x, kind)
        b.record(b.timer.host(lambda i: softmax(xv), 1, reps), impl="ns.softmax", array=kind, **row)
    if b.torch is not None:
        xt = b.view(x, "torch")
        b.record(b.timer.host(lambda i: b.torch.softmax(xt, dim=-1), 1, reps), impl="torch",
                 array="torch", **row)


def bench_attention(b, attention, *, suite, batch, heads, sq, sk, d, causal, dtype, splits):
    """One attention problem: ours (each of ``splits``) and torch's SDPA, kernel and call level."""
    dt = np.dtype(dtype)
    qkv_bytes = attention_bytes(batch, heads, sq, sk, d, dt.itemsize)
    k = b.n_sets(qkv_bytes)
    kind = b.user_kind(prefer=("torch", "cupy"))
    sets = []
    for s in range(k):
        q = b.random((batch, heads, sq, d), dt, seed=4 * s, lo=-1.0, width=2.0)
        kk = b.random((batch, heads, sk, d), dt, seed=4 * s + 1, lo=-1.0, width=2.0)
        v = b.random((batch, heads, sk, d), dt, seed=4 * s + 2, lo=-1.0, width=2.0)
        o = cuda.device_array((batch, heads, sq, d), dtype=dt)
        sets.append(tuple(b.view(a, kind) for a in (q, kk, v, o)))
    row = dict(suite=suite, dtype=dt.name, B=batch, H=heads, Sq=sq, Sk=sk, D=d, causal=causal,
               bytes=qkv_bytes, flops=attention_flops(batch, heads, sq, sk, d, causal))
    label = f"{suite} B{batch} H{heads} Sq{sq} Sk{sk} D{d} causal={causal} {dt.name}"

    stream = None if b.sim else b.stream  # the simulator's streams have no handle to pass
    for n_splits in splits:
        def enqueue(i, n_splits=n_splits):
            q, kk, v, o = sets[i]
            attention(q, kk, v, causal=causal, num_splits=n_splits, out=o, stream=stream)

        def call(i, n_splits=n_splits):
            q, kk, v, _ = sets[i]
            attention(q, kk, v, causal=causal, num_splits=n_splits)

        _try_attention(b, f"{label} splits={n_splits}", enqueue, call, k,
                       dict(impl="numba_softmax", array=kind, splits=n_splits, **row))

    if b.torch is not None:  # then kind is "torch": the sets are torch tensors already
        sdpa = b.torch.nn.functional.scaled_dot_product_attention

        def t_enqueue(i):
            with b.on_stream("torch"):
                sdpa(*sets[i][:3], is_causal=causal)

        def t_call(i):
            sdpa(*sets[i][:3], is_causal=causal)

        _try_attention(b, f"{label} torch.sdpa", t_enqueue, t_call, k,
                       dict(impl="torch.sdpa", array="torch", **row))


def _try_attention(b, what, enqueue, call, k, fields):
    """Kernel level always; call level only where host overhead can matter.  Any error
    (the attention module is new) skips the case instead of ending the run."""
    try:
        timing = b.timer.device(enqueue, k)
        b.record(timing, level="kernel", **fields)
        if timing["median_ms"] < CALL_LEVEL_MAX_MS or b.sim:
            b.record(b.timer.host(call, k), level="call", **fields)
    except Exception as e:  # noqa: BLE001 - reported in the skipped list
        b.skip(what, f"{type(e).__name__}: {e}")


def _load_attention():
    """numba_softmax.attention.attention, or (None, why)."""
    try:
        from .attention import attention
    except Exception as e:  # noqa: BLE001 - any failure means: no attention rows
        return None, f"{type(e).__name__}: {e}"
    return attention, None


def plan(b, only):
    """The list of (label, function) cases for this run."""
    cfg, cases = b.cfg, [("copy bandwidth", partial(bench_copy, b))]
    if only in (None, "softmax"):
        for dtype, (m, n) in itertools.product(cfg.softmax_dtypes, cfg.softmax_shapes):
            cases.append((f"softmax {m}x{n} {dtype}", partial(bench_softmax, b, m, n, dtype)))
        cases.append((f"overhead 1x{cfg.overhead_n}", partial(bench_overhead, b)))
    if only in (None, "attention"):
        attention, why = _load_attention()
        if attention is None:
            b.skip("attention", f"numba_softmax.attention not importable ({why})")
            return cases
        attn = partial(bench_attention, b, attention)
        for dtype, d, s, causal in itertools.product(cfg.attn_dtypes, cfg.attn_dims,
                                                     cfg.attn_seqs, cfg.attn_causal):
            batch, heads = max(1, cfg.attn_tokens // s), max(1, cfg.attn_hidden // d)
            cases.append((f"attention S{s} D{d} causal={causal} {dtype}",
                          partial(attn, suite="attention", batch=batch, heads=heads, sq=s, sk=s,
                                  d=d, causal=causal, dtype=dtype, splits=(1,))))
        for dtype, sk in itertools.product(cfg.attn_dtypes, cfg.decode_sks):
            heads = cfg.decode_heads
            splits = (1, decode_splits(heads, b.num_sms, sk))
            cases.append((f"decode Sk{sk} {dtype}",
                          partial(attn, suite="decode", batch=1, heads=heads, sq=1, sk=sk,
                                  d=cfg.decode_dim, causal=False, dtype=dtype, splits=splits)))
    return cases


# --- output --------------------------------------------------------------------------------
def write_csv(path, results, meta):
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({k: ("" if v is None else v) for k, v in dataclasses.asdict(r).items()})


def plot_softmax(path, results, meta, copy_gbps):
    """GB/s against N, one line per kernel-level implementation, one panel per dtype."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results if r.suite == "softmax" and r.level == "kernel"]
    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    if not dtypes:
        return False
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7 * len(dtypes), 5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        for impl in dict.fromkeys(r.impl for r in rows if r.dtype == dtype):
            pts = sorted((r.N, r.gbps) for r in rows if r.dtype == dtype and r.impl == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        if copy_gbps:
            ax.axhline(copy_gbps, color="black", linestyle="--",
                       label=f"d2d copy {copy_gbps:.0f} GB/s")
        ax.set_xscale("log", base=2)
        shapes = sorted({(r.N, r.M) for r in rows if r.dtype == dtype})
        ax.set_xticks([n for n, _ in shapes], [f"{n}\nM={m}" for n, m in shapes], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("N (row length), M rows")
        ax.set_ylabel("GB/s (2·M·N·itemsize / median kernel time)")
        ax.set_title(f"softmax {dtype}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{meta['device']} | {meta['driver']} | {meta['date']}\n{meta['versions']}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --- progress ------------------------------------------------------------------------------
def _progress(cases):
    """Yield (label, fn) with a tqdm bar when installed, a plain line per case otherwise."""
    try:
        from tqdm import tqdm
    except ImportError:
        for i, (label, fn) in enumerate(cases, 1):
            print(f"[{i}/{len(cases)}] {label}", file=sys.stderr, flush=True)
            yield label, fn
        return
    bar = tqdm(cases, unit="case", file=sys.stderr, dynamic_ncols=True)
    for label, fn in bar:
        bar.set_postfix_str(label)
        yield label, fn


# --- main ----------------------------------------------------------------------------------
def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="numba-softmax bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a reduced subset of the sweep")
    p.add_argument("--only", choices=("softmax", "attention"),
                   help="run only this part (attention includes decode); copy always runs")
    p.add_argument("--fp16", action="store_true", help="also sweep softmax in float16")
    p.add_argument("--out", default="bench-out", help="output folder (default: bench-out/)")
    p.add_argument("--reps", type=_positive, default=20,
                   help="at least this many timed repeats (default 20)")
    p.add_argument("--max-case-seconds", type=float, default=10.0,
                   help="fewer repeats (flagged in 'note') where --reps repeats would take "
                        "longer than this (default 10)")
    p.add_argument("--sim-smoke", action="store_true",
                   help="tiny shapes, 3 repeats: exercises the code, e.g. on the CUDA simulator")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    sim = simulator_enabled()
    cfg = make_config(args)
    b = Bench(cfg, sim)
    meta = environment(sim)
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), file=sys.stderr)

    failed = 0
    for label, fn in _progress(plan(b, args.only)):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one broken case must not lose the others
            failed += 1
            traceback.print_exc()
            b.skip(f"FAILED {label}", f"{type(e).__name__}: {e}")
        b.release()  # the case's buffers are gone with its frame: free them now

    derive(b.results, b.copy_gbps)
    meta["copy bandwidth"] = (f"{b.copy_gbps:.1f} GB/s (device-to-device, read + written)"
                              if b.copy_gbps else "not measured")
    meta["timing"] = ("host clock (simulator: events carry no time)" if sim else
                      "kernel = CUDA events, call = host clock + sync") + \
        f"; median of >= {cfg.min_reps} repeats unless noted; inputs rotated past the L2"
    report = format_report(b.results, meta)
    if b.skipped:
        report += "\n\nskipped:\n" + "\n".join(f"  {s}" for s in b.skipped)
    print(report)

    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "results.csv"), b.results, meta)
    with open(os.path.join(args.out, "results.txt"), "w") as f:
        f.write(report + "\n")
    plotted = plot_softmax(os.path.join(args.out, "softmax_gbps.png"), b.results, meta, b.copy_gbps)
    plot_note = ", softmax_gbps.png" if plotted else " (no plot: matplotlib missing or no softmax rows)"
    print(f"\nwrote {args.out}/results.csv, results.txt{plot_note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
