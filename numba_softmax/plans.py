"""Launch plans: record a call's launches once, replay them with new pointers.

``kernel[grid, block](x, y)`` types every argument, wraps it as a device array and looks
the compiled kernel up on each call, and the array handling above it adds more: for a
small call (a softmax of one 1×1024 row) that Python takes several times as long as the
GPU work itself.  So every public entry point asks this module first:

1. :func:`lookup` — the key, a tuple of everything that shaped the call: the function
   and its options, the stream, the current CUDA context, and for each array (inputs and
   ``out=``) its library, dtype, shape, strides, device and 16-byte alignment, and how
   ``out=`` overlaps each input (apart, the same array, or partly) — None for NumPy
   inputs (they pay their copies anyway) and on the simulator; read in the same pass,
   the arrays' data pointers; and the plan recorded under the key (a dictionary look-up).
2. A hit replays: allocate the outputs afresh, patch the data pointers into the recorded
   argument lists (a value the call made from an array — a tensor map — is made again
   from the new pointer: :func:`.runtime.record.derived`), and launch each recorded
   kernel (:mod:`.runtime.replay`: one call into the driver) — no typing, no wrapping.
3. On a miss the call takes the ordinary path inside :class:`Recorder`, which notes every
   launch (:mod:`numba_softmax.runtime.launcher`) and allocation (:mod:`.runtime.record`)
   and, if every pointer the kernels saw is accounted for (an input, a new buffer, or a
   long-lived workspace), keeps a :class:`Plan`.

The kernel argument layout is Numba's (``_prepare_args`` flattens an array into meminfo,
parent, size, itemsize, data, shape…, strides…): a private detail, so the first plan made
in a process is checked once — replayed beside the ordinary result and compared — and
plans are switched off with a warning if they differ.  Plans hold layouts, kernels and
workspaces, never the caller's arrays; the cache is bounded and thread-safe.
"""

import threading
import warnings

import numpy as np

from .arrays import kinds, ops, plan_facts
from .runtime import driver, launcher, record, replay
from .runtime.sim import simulator_enabled

MAX_PLANS = 512
_PLANS = {}
_LOCK = threading.Lock()
_state = {"enabled": True, "checked": False}

def enabled():
    """Whether calls may replay plans: a real GPU, a replay mechanism, not switched off."""
    if _state["enabled"] and "usable" not in _state:
        _state["usable"] = replay.available() and not simulator_enabled()
    return _state["enabled"] and _state["usable"]


def disable(why):
    """Switch plans off for this process (every call takes the ordinary path)."""
    if _state["enabled"]:
        warnings.warn(f"numba_softmax: launch plans switched off: {why}", RuntimeWarning,
                      stacklevel=3)
    _state["enabled"] = False
    with _LOCK:
        _PLANS.clear()


def lookup(tag, arrays, stream):
    """(key, plan, pointers) of a call: its plan key (None when the call must take the
    ordinary path), the plan recorded under it (or None), and the arrays' data pointers,
    read in the same pass as their layouts (a replay patches them in)."""
    if not enabled():
        return None, None, None
    parts = [tag, ops.stream_key(stream)]
    ptrs = []
    for a in arrays:
        if a is None:
            parts.append(None)
            ptrs.append(0)
            continue
        k, ptr = plan_facts.facts(a)
        if k is None:
            return None, None, None
        parts.append(k)
        ptrs.append(ptr)
    if len(arrays) > 1 and arrays[-1] is not None:  # out=: how it overlaps each input
        parts.append(_overlaps(arrays, parts[2:], ptrs))
    context = driver.current_context()
    if not context:  # a thread Numba has not yet made a context current on: the
        return None, None, None  # ordinary path does (a replay there would launch into no context)
    parts.append(context)
    plan_key = tuple(parts)
    return plan_key, find(plan_key), ptrs


def seen(plan_key, ptrs, count):
    """What :func:`lookup` read of each of a call's first ``count`` arrays — (layout key,
    data pointer), or None where it read nothing — so that the ordinary path describes
    the arrays from it (``facts`` of :func:`.arrays.kinds.describe`) instead of reading
    them a second time."""
    if plan_key is None:
        return (None,) * count
    return tuple(zip(plan_key[2:2 + count], ptrs))


_EXTENTS = {}  # layout key -> [first, last] byte touched, relative to the data pointer


def _extent(a, layout, ptr):
    """[first, last] byte address ``a`` (data at ``ptr``) touches (its layout's offsets
    computed once)."""
    span = _EXTENTS.get(layout)
    if span is None:
        lo, hi = kinds.from_facts(a, layout, ptr).extent()  # built from the key: no read
        if len(_EXTENTS) >= 4 * MAX_PLANS:
            _EXTENTS.clear()
        span = _EXTENTS[layout] = (lo - ptr, hi - ptr)
    return ptr, ptr + span[0], ptr + span[1]


def _overlaps(arrays, layouts, ptrs):
    """For each input: 0 disjoint from ``out`` (the last array), 1 the very same array
    (in place), 2 overlapping otherwise — the path a call takes depends on it."""
    o_ptr, o_lo, o_hi = _extent(arrays[-1], layouts[-1], ptrs[-1])
    classes = []
    for a, layout, a_ptr in zip(arrays[:-1], layouts, ptrs):
        if a is None:
            classes.append(0)
            continue
        ptr, lo, hi = _extent(a, layout, a_ptr)
        if hi < o_lo or o_hi < lo:
            classes.append(0)
        else:
            classes.append(1 if ptr == o_ptr and layout == layouts[-1] else 2)
    return tuple(classes)


def find(plan_key):
    """The plan recorded under ``plan_key``, or None (also for an unhashable option: the
    ordinary path's validation then names it)."""
    try:
        return None if plan_key is None else _PLANS.get(plan_key)
    except TypeError:
        return None


class Plan:
    """A replayable call: allocations, launches with patch points, the result builder."""

    def __init__(self, recipes, launches, result, result_at, keep, arrays=()):
        self.makers = [ops.allocator(r, arrays) for r in recipes]
        self.recipes, self.result, self.result_at = recipes, result, result_at
        # (fire, [(source: "in"put, "alloc"ation or "fixed", index, byte offset, remake or
        # None)]) per launch; a fixed pointer is its offset (a workspace's map: a slot of
        # the ring may have been given to another map since, so it is asked for again)
        self.launches = [(ln.fire, sources) for ln, sources in launches]
        self.keep = keep  # workspaces the launches point to stay alive with the plan

    def __call__(self, arrays, stream, ptrs=None):
        """Replay on ``arrays`` (their data pointers ``ptrs``, from :func:`lookup`)."""
        if ptrs is None:
            ptrs = [0 if a is None else plan_facts.pointer(a) for a in arrays]
        allocs = [make(stream, arrays) for make in self.makers]
        handle = int(stream) if stream else 0
        for fire, sources in self.launches:
            values, after, taken = [], [], []
            for src, j, delta, remake in sources:
                ptr = delta + (ptrs[j] if src == "in" else allocs[j][1] if src == "alloc" else 0)
                if remake is not None:  # a value made from that array (its tensor map)
                    ptr, done = remake(ptr, stream, taken)
                    after.append(done)
                values.append(ptr)
            fire(handle, values)
            for done in after:
                done(stream)
        out = arrays[-1] if len(arrays) > 1 else None
        return self.result(*[allocs[i][0] for i in self.result_at], out=out, stream=stream)


class Recorder:
    """``with Recorder(key, arrays, stream, described) as rec:`` run the ordinary path,
    then ``return rec.done(result_fn, *bufs, out=out)``: builds the result as
    ``result_fn(*bufs, out=out, stream=stream)`` — a function of the new buffers alone,
    which launches nothing — and, if the launches are replayable, keeps a plan.
    ``described``: the arrays' descriptions, as the call's checks made them (None for an
    absent array), so that making the plan does not describe them again."""

    def __init__(self, plan_key, arrays, stream, described=None):
        self.key, self.arrays, self.stream = plan_key, arrays, stream
        self.described = described

    def __enter__(self):
        if self.key is not None:
            self._launches = launcher.recording()
            self._allocs = record.recording()
            self.launches = self._launches.__enter__()
            self.allocs = self._allocs.__enter__()
        return self

    def __exit__(self, *exc):
        if self.key is not None:
            self._launches.__exit__(*exc)
            self._allocs.__exit__(*exc)

    def done(self, result_fn, *bufs, out=None):
        result = result_fn(*bufs, out=out, stream=self.stream)
        if self.key is None:
            return result
        self.__exit__(None, None, None)
        try:
            hash(self.key)
        except TypeError:
            return result
        try:
            plan = self._plan(result_fn, bufs)
        except (KeyError, ValueError, TypeError, AttributeError, NotImplementedError):
            plan = None  # something this plan cannot replay: the ordinary path stays
        if plan is not None:
            with _LOCK:
                if len(_PLANS) >= MAX_PLANS:
                    _PLANS.pop(next(iter(_PLANS)))
                _PLANS[self.key] = plan
            if not _state["checked"] and out is None:
                _self_check(plan, self.arrays, self.stream, result)
        return result

    def _plan(self, result_fn, bufs):
        if self.allocs.spoiled or not self.launches:
            return None
        described = self.described or [None if a is None else kinds.describe(a)
                                        for a in self.arrays]
        spans = [None if d is None else d.extent() for d in described]
        allocs = self.allocs.allocations
        alloc_spans = []
        for buf, dev, _ in allocs:
            d = kinds.describe(buf)
            alloc_spans.append((d.ptr, d.extent()[1]) if dev is not None else (0, -1))
        launches, keep = [], []
        for kernel, grid, block, args, shared in self.launches:
            compiled = launcher.compiled(kernel, args)
            flat, patches = [], []
            for ty, value in zip(compiled.argument_types, args):
                start = len(flat)
                compiled._prepare_args(ty, value, self.stream, [], flat)
                if not hasattr(value, "__cuda_array_interface__"):
                    continue
                ptr = flat[start + 4]
                made = self.allocs.derived.get(ptr)  # a tensor map of an input or buffer
                source = ptr if made is None else made[0]
                patch = _classify(source, start + 4, described, spans, alloc_spans, keep)
                if made is not None and patch is None:  # made from a workspace: the same
                    patch = (start + 4, "fixed", 0, source)  # source, its map made again
                patches.append(None if patch is None else patch + (made and made[1],))
            patches = [p for p in patches if p is not None]
            ln = replay.Launch(compiled, grid, block, shared, flat, [p[0] for p in patches])
            launches.append((ln, [p[1:] for p in patches]))
        at = [next(i for i, (b, _, _) in enumerate(allocs) if b is buf) for buf in bufs]
        return Plan([r for _, _, r in allocs], launches, result_fn, at, keep, self.arrays)


def _classify(ptr, index, described, spans, alloc_spans, keep):
    """Where a kernel's data pointer comes from: a new buffer ('alloc', j), a user array
    ('in', j) — with its byte offset — or a long-lived workspace (kept; not patched)."""
    for j, (lo, hi) in enumerate(alloc_spans):
        if lo <= ptr <= hi:
            return (index, "alloc", j, ptr - lo)
    for j, span in enumerate(spans):
        if span is not None and span[0] <= ptr <= span[1]:
            return (index, "in", j, ptr - described[j].ptr)
    ws = launcher.workspace_holding(ptr)
    if ws is None:
        raise ValueError("a kernel argument points to memory made for this call only")
    keep.append(ws)
    return None


def _self_check(plan, arrays, stream, result):
    """Replay the first plan once beside the ordinary result; switch plans off if they
    differ (numba-cuda changed its argument layout)."""
    _state["checked"] = True
    try:
        again = plan(arrays, stream)
        a, b = (np.concatenate([np.ravel(ops.to_numpy(r)).astype(np.float64) for r in
                                (x if isinstance(x, tuple) else (x,))]) for x in (result, again))
        # close, not equal: kernels that accumulate with atomics (dQ) vary in the last bits
        same = a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    except Exception as e:  # noqa: BLE001 - any failure here means: do not replay
        same, why = False, f"{type(e).__name__}: {e}"
    else:
        why = "a replayed launch gave a different result"
    if not same:
        disable(why)
