"""The one timer: how the benchmark, the examples and the tour measure time.

Two clocks, one rule each:

* :meth:`Timer.device` — **kernel time**.  CUDA events recorded around each call on one
  stream.  All timed calls are queued behind a short *sleeping kernel* first, so the GPU
  is still asleep while Python queues them: Python's launch overhead (10–400 µs a call)
  can then never leave the GPU idle between a start event and its kernel, which would
  make the events time the host.  If the sleep ended before the last call was queued
  (``query()`` on an event behind it says so) the loop runs again with a four times
  longer sleep, and the result is flagged ``host-bound`` if that never sufficed.
* :meth:`Timer.host` — **call time**: the host clock around one call plus a device
  synchronisation: what a user waits for.  :meth:`Timer.host_loops` is the per-call
  host cost of a loop of synchronised calls (the overhead table).

Both: one first call (JIT compilation; it raises if the case does not apply), up to
``warmup`` synchronised warm-up calls (fewer once they pass 0.25 s) that also estimate
the cost of one call, then the timed repeats — about ``target_s`` of work, at least
``min_reps`` and at most ``max_reps``, fewer (flagged) only where ``min_reps`` would take
longer than ``cap_s``.  The statistic is the **median**.

**Inputs rotate**: a call takes the index ``i`` of an input/output set; repeat ``r``
uses set ``r mod n_sets``, and :func:`buffer_sets` sizes ``n_sets`` so the sets span at
least three times the L2 cache — a set has been evicted by the time it comes round again.

On the CUDA simulator events carry no time: both clocks are the host clock there, and
the numbers describe Python threads, not a GPU (every caller says so).

The examples and the tour use :func:`seconds` (one callable, no rotation, default stream).
"""

import functools
import math
import sys
import time

import numpy as np

WARMUP_MAX_S = 0.25  # warm-up calls stop once they have taken this long
HOLD_MAX_US = 4_000_000  # the first sleep never exceeds 4 s ...
HOLD_RETRY_MAX_US = 16_000_000  # ... nor a retry 16 s


def median(values):
    """The median (mean of the middle two for an even count)."""
    s = sorted(values)
    if not s:
        raise ValueError("median of no values")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


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


def summary(times_ms, reps, note=""):
    """The fields a measurement contributes to a result row."""
    return dict(median_ms=median(times_ms), min_ms=min(times_ms), reps=reps, note=note)


def _join(*notes):
    return "; ".join(n for n in notes if n)


@functools.cache
def _sleep_kernel():
    from numba import cuda

    from ..kernels.hw import jit

    @jit.kernel
    def sleep(n_us, one_us):
        """Keep the stream busy for about ``n_us`` µs while the host queues work."""
        for _ in range(n_us):
            cuda.nanosleep(one_us)

    return sleep


class Timer:
    """Warm-up, repeat count, rotation and the two clocks (see the module docstring).

    ``stream``: the Numba stream the device clock records on (0: the default stream);
    every timed call must put its work there."""

    def __init__(self, stream=0, sim=False, *, min_reps=20, max_reps=100, warmup=3,
                 target_s=0.3, cap_s=10.0):
        self.stream, self.sim = stream, sim
        self.min_reps, self.max_reps, self.warmup = min_reps, max(min_reps, max_reps), warmup
        self.target_s, self.cap_s = target_s, cap_s
        self.can_hold = True  # False if the sleep kernel cannot run (nanosleep: sm_70+)

    @staticmethod
    def sync():
        from numba import cuda

        cuda.synchronize()

    def once(self, fn):
        """(fn(), seconds) of one synchronised call."""
        t0 = time.perf_counter()
        result = fn()
        self.sync()
        return result, time.perf_counter() - t0

    def _warm(self, call, n_sets):
        """First call (compiles; raises if the case does not apply), then the warm-up;
        returns (host seconds to queue one call, seconds per synchronised call)."""
        _, first = self.once(lambda: call(0))
        queue, total = [], []
        for r in range(self.warmup):
            t0 = time.perf_counter()
            call((r + 1) % n_sets)
            t1 = time.perf_counter()
            self.sync()
            queue.append(t1 - t0)
            total.append(time.perf_counter() - t0)
            if sum(total) > WARMUP_MAX_S:  # a slow case is warm after one call
                break
        return (median(queue), median(total)) if total else (first, first)

    def _reps(self, est_s, reps):
        if reps is not None:
            return reps, ""
        return choose_reps(est_s, self.min_reps, self.max_reps, self.target_s, self.cap_s)

    # -- host clock ---------------------------------------------------------------------
    def host(self, call, n_sets=1, reps=None):
        """Median host time of call(i) + a device synchronisation."""
        _, est = self._warm(call, n_sets)
        reps, note = self._reps(est, reps)
        return summary(self._host_loop(call, n_sets, reps), reps, note)

    def _host_loop(self, call, n_sets, reps, inner=1):
        times = []
        for r in range(reps):
            t0 = time.perf_counter()
            for j in range(inner):
                call((r * inner + j) % n_sets)
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3 / inner)
        return times

    def host_loops(self, call, calls, loops):
        """Host time per call: ``loops`` loops of ``calls`` synchronised calls each, the
        median over the loops of (loop time / calls)."""
        if self.warmup:
            self._warm(call, 1)
        times = []
        for _ in range(loops):
            t0 = time.perf_counter()
            for _ in range(calls):
                call(0)
                self.sync()
            times.append((time.perf_counter() - t0) * 1e3 / calls)
        return summary(times, loops * calls)

    def host_pairs(self, call, base, calls, loops):
        """Host time per call of ``call`` and of ``base``, each call followed by a device
        synchronisation, in alternating loops of ``calls`` calls — a drift in the host's
        speed reaches both alike.  Returns (summary of call, summary of base, median of
        the per-loop ratios call / base)."""
        if self.warmup:
            self._warm(call, 1)
            self._warm(base, 1)
        mine, theirs = [], []
        for _ in range(loops):
            for fn, times in ((base, theirs), (call, mine)):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(0)
                    self.sync()
                times.append((time.perf_counter() - t0) * 1e3 / calls)
        ratio = median([m / t for m, t in zip(mine, theirs)])
        return summary(mine, loops * calls), summary(theirs, loops * calls), ratio

    # -- device clock ---------------------------------------------------------------------
    def device(self, enqueue, n_sets=1, reps=None, inner=1):
        """Median CUDA-event time of enqueue(i) on ``self.stream`` (``inner`` calls per
        event pair, time per call).  On the simulator: the host clock instead."""
        queue_s, est = self._warm(enqueue, n_sets)
        reps, note = self._reps(est, reps)
        return self._device(enqueue, n_sets, reps, inner, queue_s, note)

    def _device(self, enqueue, n_sets, reps, inner, queue_s, note=""):
        if self.sim:
            return summary(self._host_loop(enqueue, n_sets, reps, inner), reps, note)
        hold_us = min(HOLD_MAX_US, int(2 * reps * inner * queue_s * 1e6) + 2000)
        for _ in range(3):  # a longer sleep if the host did not get ahead
            times, starved = self._event_loop(enqueue, n_sets, reps, inner, hold_us)
            if not starved or not self.can_hold:
                break
            hold_us = min(HOLD_RETRY_MAX_US, hold_us * 4)
        if starved:
            note = _join(note, "host-bound: launch gaps may be in the times")
        return summary(times, reps, note)

    def _event_loop(self, enqueue, n_sets, reps, inner, hold_us):
        """All repeats queued behind a sleep; True as second value if the sleep ended
        before the last repeat was queued (the GPU may have waited for the host)."""
        from numba import cuda

        events = [(cuda.event(), cuda.event()) for _ in range(reps)]
        held = cuda.event(timing=False)
        with cuda.defer_cleanup():  # no cuMemFree (which synchronises) inside the loop
            self._hold(hold_us)
            held.record(self.stream)
            for r, (start, end) in enumerate(events):
                start.record(self.stream)
                for j in range(inner):
                    enqueue((r * inner + j) % n_sets)
                end.record(self.stream)
            starved = held.query()
            end.synchronize()
        return [start.elapsed_time(end) / inner for start, end in events], starved

    def _hold(self, hold_us):
        if not self.can_hold:
            return
        try:
            hold(hold_us, self.stream)
        except Exception as e:  # noqa: BLE001 - time without the hold, and say so
            self.can_hold = False
            print(f"note: no sleep kernel ({type(e).__name__}: {e}); kernel times of fast "
                  "calls may include launch gaps", file=sys.stderr)


def hold(n_us, stream=0):
    """Queue a sleeping kernel of about ``n_us`` µs on ``stream``: work queued after it
    while it sleeps starts back to back, so Python's time to queue it is not timed."""
    from ..runtime import launcher

    launcher.launch(_sleep_kernel(), 1, 1, stream, (int(n_us), np.uint32(1000)))


def seconds(fn, sim, warmup=3, repeat=20, inner=1):
    """Median seconds of one ``fn()`` (which launches device work on the default stream):
    :meth:`Timer.device` with ``repeat`` samples of ``inner`` back-to-back calls, after
    ``warmup`` calls (the first of which compiles).  The examples' and the tour's timer.
    On the simulator: host clock — such numbers describe Python threads, not a GPU."""
    timer = Timer(0, sim, warmup=max(0, warmup - 1))  # _warm makes one call of its own
    call = lambda i: fn()  # noqa: E731
    if warmup:
        timing = timer.device(call, 1, reps=repeat, inner=inner)
    else:  # the caller has run it already (the simulator: every call costs seconds)
        timing = timer._device(call, 1, repeat, inner, queue_s=1e-4)
    return timing["median_ms"] / 1e3
