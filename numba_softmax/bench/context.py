"""What every section of the benchmark shares: the run's settings, the timer and its
stream, the peers that could be imported, device arrays of random data in any dtype and
their CuPy / PyTorch views, and the rows recorded so far.
"""

import dataclasses
import functools
import sys
import traceback

import numpy as np
from numba import cuda

from ..kernels.hw import jit
from ..runtime import launcher
from . import env
from .results import Bounds, Result
from .timing import Timer, buffer_sets

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
                "float64": np.float64}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclasses.dataclass
class Config:
    """How big and how long: ``mode`` is smoke (tiny, the simulator), quick or full."""

    mode: str = "full"
    min_reps: int = 20
    max_reps: int = 100
    warmup: int = 3
    target_s: float = 0.3  # aim for this much timed work per case ...
    cap_s: float = 10.0  # ... and never much more than this
    overhead_calls: int = 1000  # synchronised calls per overhead loop ...
    overhead_loops: int = 5  # ... and loops (the median is taken over them)

    @property
    def smoke(self):
        return self.mode == "smoke"

    @property
    def quick(self):
        return self.mode == "quick"

    def pick(self, smoke, quick, full):
        """The value for this mode."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.mode]


class Skip(Exception):
    """A case or section that does not apply here (the message says why)."""


class WrongResult(RuntimeError):
    """An implementation's output failed its check: it is not timed (a failure)."""


@functools.cache
def _fill_kernel(dtype):
    store = jit.storer(dtype if dtype == "bfloat16" else np.dtype(dtype))

    @jit.kernel
    def fill(flat, seed, lo, width):
        """flat[i] = pseudo-random in [lo, lo + width): two LCG steps of (i, seed)."""
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, flat.size, stride):
            h = (i * 1103515245 + seed) % 2147483648
            h = (h * 1103515245 + 12345) % 2147483648
            flat[i] = store(np.float32(lo + width * (h / 2147483648.0)))

    return fill


class Bench:
    """Everything a section needs: config, timer, stream, peers, bounds, results."""

    def __init__(self, cfg, sim):
        self.cfg, self.sim = cfg, sim
        self.stream = cuda.stream()
        self.timer = Timer(self.stream, sim, min_reps=cfg.min_reps, max_reps=cfg.max_reps,
                           warmup=cfg.warmup, target_s=cfg.target_s, cap_s=cfg.cap_s)
        self.limits = launcher.device_limits()
        self.l2 = env.l2_bytes(sim)
        torch = None if sim else env.optional("torch")
        self.torch = torch if torch is not None and torch.cuda.is_available() else None
        self.cupy = None if sim else env.optional("cupy")
        self.results, self.skipped, self.failed = [], [], 0
        self.bounds = Bounds()
        self.memo = {}  # facts a section probes once (e.g. whether a kernel has GQA)
        self._external = {}

    # -- arrays --------------------------------------------------------------------------
    def dtypes(self, wanted):
        """The dtypes of ``wanted`` this run can make (bfloat16 needs PyTorch)."""
        return [d for d in wanted if d != "bfloat16" or self.torch is not None]

    def random(self, shape, dtype, seed, lo=-2.0, width=4.0):
        """A Numba device array of pseudo-random values (``"bfloat16"``: uint16 bits)."""
        arr = cuda.device_array(shape, dtype=NUMPY_DTYPES[dtype])
        flat = arr.reshape(arr.size)
        blocks = 1 if self.sim else min(4096, -(-arr.size // 256))
        launcher.launch(_fill_kernel(dtype), blocks, 32 if self.sim else 256, 0,
                        (flat, np.int64(seed * 7919 + 1), np.float32(lo), np.float32(width)))
        return arr

    def n_sets(self, set_bytes):
        """Input/output sets to rotate so that they span 3× the L2 (see timing)."""
        return buffer_sets(set_bytes, self.l2, env.free_bytes(self.sim))

    def user_kind(self, dtype="float32"):
        """The array kind public calls get: torch, else CuPy (not bfloat16), else Numba."""
        if self.torch is not None:
            return "torch"
        if self.cupy is not None and dtype != "bfloat16":
            return "cupy"
        return "numba"

    def view(self, arr, kind):
        """A zero-copy CuPy / PyTorch view of a Numba device array (or the array itself)."""
        if kind == "torch":
            if arr.dtype == np.uint16:  # bfloat16 bits
                t = self.torch.as_tensor(arr.view(np.int16), device="cuda")
                return t.view(self.torch.bfloat16)
            return self.torch.as_tensor(arr, device="cuda")
        if kind == "cupy":
            return self.cupy.asarray(arr)
        return arr

    def on_stream(self, lib="torch"):
        """A context manager that makes ``lib`` (torch or cupy) work on our stream."""
        if lib not in self._external:
            mod = self.torch if lib == "torch" else self.cupy
            self._external[lib] = mod.cuda.ExternalStream(int(self.stream))
        if lib == "torch":
            return self.torch.cuda.stream(self._external[lib])
        return self._external[lib]

    @property
    def call_stream(self):
        """The stream argument for our public calls (the simulator's streams have no handle)."""
        return None if self.sim else self.stream

    def release(self):
        """Give memory back between cases (Numba's deferred frees, the peers' pools)."""
        cuda.synchronize()
        if not self.sim:
            cuda.current_context().deallocations.clear()
        if self.torch is not None:
            self.torch.cuda.empty_cache()
        if self.cupy is not None:
            self.cupy.get_default_memory_pool().free_all_blocks()

    # -- recording ------------------------------------------------------------------------
    def record(self, timing, note="", **fields):
        timing = dict(timing, note="; ".join(n for n in (note, timing.get("note")) if n))
        row = Result(**fields, **timing)
        self.results.append(row)
        return row

    def skip(self, what, why):
        self.skipped.append(f"{what}: {why}")

    def fail(self, what, why):
        self.failed += 1
        self.skip(f"FAILED {what}", why)

    def case(self, label, fn):
        """Run one case.  A case that does not apply (:class:`Skip`, ValueError — e.g.
        ``fused`` on a row too long for the chip — or out of memory) is noted and skipped;
        any other error is a failure (traceback on stderr), and the run goes on."""
        print(f"  {label}", file=sys.stderr, flush=True)
        try:
            fn()
        except (Skip, ValueError) as e:
            self.skip(label, str(e).split(";")[0])
        except WrongResult as e:
            self.fail(label, str(e))
        except Exception as e:  # noqa: BLE001 - one broken case must not lose the others
            if any(w in str(e).lower() for w in ("out of memory", "out_of_memory")):
                self.skip(label, "out of memory")
            else:
                traceback.print_exc()
                self.fail(label, f"{type(e).__name__}: {e}")
        finally:
            self.release()


def feature(*candidates):
    """The first of ``"module:name"`` candidates that imports (e.g. a public function
    another branch is adding), or :class:`Skip` naming them all."""
    import importlib

    for spec in candidates:
        module, _, name = spec.partition(":")
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            found = None
        if found is not None:
            return found
    raise Skip(f"{' / '.join(c.replace(':', '.') for c in candidates)} not available yet")
