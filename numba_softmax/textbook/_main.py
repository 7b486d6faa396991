"""Host plumbing for the rungs' ``__main__``: validate first, then time beside the fast kernel.

Nothing here runs on the device, and no rung's kernel needs it (llm.c's ``validate_result``
and ``benchmark_kernel``, in Python).  On the CUDA simulator the rungs run tiny shapes and
skip the timing, saying so.
"""

import statistics

import numpy as np
from numba import cuda

from ..runtime.sim import simulator_enabled

SIM = simulator_enabled()
RNG = np.random.default_rng(0)
SHAPES = [(1, 1), (3, 37), (4, 130)] if SIM else [(1, 1), (37, 1128), (199, 760), (1823, 781)]
"""(rows, n) to validate a softmax rung on: irregular, and a single value."""


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def check(label, got, want, rtol=1e-4, atol=1e-6):
    """Compare a rung's float32 result with the float64 reference (NaN where it has NaN);
    print the worst error and raise if any value is out of tolerance."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    with np.errstate(invalid="ignore"):
        err = np.nanmax(np.abs(got - want), initial=0.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=label)
    print(f"  ok  {label:<36} max |error| = {err:.1e}")


def time_ms(fn, reps=20, warmup=3):
    """Median milliseconds of ``fn()`` over ``reps`` runs (CUDA events), after a warm-up."""
    for _ in range(warmup):
        fn()
    start, stop, times = cuda.event(), cuda.event(), []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return statistics.median(times)


def timing():
    """True on a GPU; on the simulator, say that the timing is skipped."""
    if SIM:
        print("timing skipped: the simulator runs Python threads; run on a GPU to time")
    return not SIM


def bench(shape, model, n_bytes, cases, flops=None):
    """Time each (label, fn) of ``cases`` and print µs and GB/s by the byte model ``model``
    (``n_bytes`` bytes a call), and TFLOP/s when ``flops`` is given."""
    print(f"timing {shape}, bytes by the model '{model}' = {n_bytes / 1e6:.1f} MB")
    for label, fn in cases:
        ms = time_ms(fn)
        line = f"  {label:<30} {ms * 1e3:9.1f} µs  {n_bytes / ms / 1e6:8.1f} GB/s"
        if flops:
            line += f"  {flops / ms / 1e9:7.2f} TFLOP/s"
        print(line)
