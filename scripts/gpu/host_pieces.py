"""Where the host time of the overhead table's two-array-plus rows goes (issue 12): merge,
decode (``num_splits=4``) and paged ``check=False``, torch float32, the bench's shapes.
Run on a GPU; prints only.

    python scripts/gpu/host_pieces.py [--calls 2000]

For each row: the synchronised call (as the bench times it: ``cuda.synchronize`` after
each call), the unsynchronised call (host work alone), the device time of one call (the
bench's ``Timer.device``: CUDA events behind a sleeping kernel), and each piece of the
plan hit timed alone; then the same pieces of ``torch.softmax`` and of the sync; then a
few alternatives for the costly pieces (torch attribute reads, allocation, the launch).
"""

import argparse
import os
import sys

import torch
from numba import cuda

sys.path.insert(0, os.path.dirname(__file__))
from host_profile import bare_us, per_call_us  # noqa: E402

import numba_softmax as ns  # noqa: E402
from numba_softmax import plans  # noqa: E402
from numba_softmax.arrays import kinds  # noqa: E402
from numba_softmax.bench.timing import Timer  # noqa: E402
from numba_softmax.runtime import replay  # noqa: E402


def pieces(name, tag, arrays, n):
    """The plan-hit pieces of one call, µs each, unsynchronised."""
    stream = kinds.as_stream(None)
    key, plan, ptrs = plans.lookup(tag, arrays, stream)
    assert plan is not None, f"{name}: no plan under {tag}"
    rows = [("lookup", lambda: plans.lookup(tag, arrays, stream)),
            ("plan(...) whole", lambda: plan(arrays, stream, ptrs))]
    for i, make in enumerate(plan.makers):
        rows.append((f"maker {i} {plan.recipes[i][:3]}", lambda m=make: m(stream, arrays)))
    allocs = [make(stream, arrays) for make in plan.makers]
    for i, (fire, sources) in enumerate(plan.launches):
        vals = [(ptrs[j] if is_in else allocs[j][1]) + delta for is_in, j, delta in sources]
        rows.append((f"fire {i} ({len(vals)} patches)", lambda f=fire, v=vals: f(0, v)))
    bufs = [allocs[i][0] for i in plan.result_at]
    rows.append(("result builder", lambda: plan.result(*bufs, out=None, stream=stream)))
    print(f"\n-- {name}: pieces of a plan hit, µs (unsynchronised) --")
    for label, fn in rows:
        print(f"   {label:44s} {bare_us(fn, n):7.2f}")
    cuda.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    n = p.parse_args().calls
    heads, d, ctx, page = 8, 64, 1024, 16
    print(f"device: {torch.cuda.get_device_name()}")
    x = torch.randn(1, 1024, device="cuda")
    q = torch.randn(1, heads, 128, d, device="cuda")
    o, lse = ns.attention(q, q, q, return_lse=True)
    q1 = torch.randn(1, heads, 1, d, device="cuda")
    kv = torch.randn(1, heads, ctx, d, device="cuda")
    kc = torch.randn(ctx // page, page, heads, d, device="cuda")
    table = torch.arange(ctx // page, dtype=torch.int32, device="cuda")[None]
    lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
    rows = [("torch.softmax(x) [base]", lambda: torch.softmax(x, -1)),
            ("ns.softmax(x)", lambda: ns.softmax(x)),
            ("merge_attention", lambda: ns.merge_attention(o, lse, o, lse)),
            ("decode num_splits=4", lambda: ns.attention(q1, kv, kv, num_splits=4)),
            ("paged check=False", lambda: ns.paged_attention(q1, kc, kc, table, lens, check=False))]
    timer = Timer()
    print(f"cuda.synchronize alone {bare_us(cuda.synchronize, n):.2f} µs; "
          f"torch.cuda.synchronize alone {bare_us(torch.cuda.synchronize, n):.2f}")
    print("\n== per call, µs: synchronised (3 rounds) | unsynchronised | device ==")
    for name, fn in rows:
        synced = [per_call_us(fn, n) for _ in range(3)]
        dev = timer.device(lambda i: fn(), reps=50, inner=20)["median_ms"] * 1e3
        print(f"{name:26s} {' '.join(f'{s:6.1f}' for s in synced)} | {bare_us(fn, n):6.1f} | {dev:6.2f}")

    pieces("merge", ("merge_attention",), (o, lse, o, lse, None), n)
    pieces("decode", ("attention", False, None, None, False, 4), (q1, kv, kv, None), n)
    pieces("paged check=False", ("paged_attention", False, None, None, False, None, False),
           (q1, kc, kc, table, lens, None), n)

    print("\n-- alternatives, µs each (unsynchronised) --")
    from cuda.bindings import driver as cu

    stream = kinds.as_stream(None)
    alts = [("kinds.as_stream(None)", lambda: kinds.as_stream(None)),
            ("kinds.stream_key(0)", lambda: kinds.stream_key(stream)),
            ("replay.current_context()", replay.current_context),
            ("kinds.facts(torch)", lambda: kinds.facts(o)),
            ("x.device", lambda: o.device), ("x.get_device()", lambda: o.get_device()),
            ("x.shape", lambda: o.shape), ("x.stride()", lambda: o.stride()),
            ("x.data_ptr()", lambda: o.data_ptr()), ("x.dtype", lambda: o.dtype),
            ("x.is_contiguous()", lambda: o.is_contiguous()),
            ("hash(merge key)", lambda: hash(plans.lookup(("merge_attention",),
                                                          (o, lse, o, lse, None), stream)[0])),
            ("torch.empty_like(o)", lambda: torch.empty_like(o)),
            ("torch.empty_like(lse)", lambda: torch.empty_like(lse)),
            ("o.new_empty(shape)", lambda: o.new_empty((1, heads, 128, d))),
            ("torch.empty(shape, dtype, device)", lambda: torch.empty((1, heads, 128, d),
                                                                      dtype=torch.float32,
                                                                      device=o.device)),
            ("cu.cuCtxGetCurrent()", cu.cuCtxGetCurrent)]
    key, plan, ptrs = plans.lookup(("merge_attention",), (o, lse, o, lse, None), stream)
    fire = plan.launches[0][0]
    cells = dict(zip(fire.__code__.co_freevars, (c.cell_contents for c in fire.__closure__)))
    go, tail = cells["go"], cells["tail"]
    s0 = cu.CUstream(0)
    alts += [("merge launch, stream 0 (int)", lambda: go(0, *tail)),
             ("merge launch, stream None", lambda: go(None, *tail)),
             ("merge launch, stream CUstream(0)", lambda: go(s0, *tail))]
    for label, fn in alts:
        print(f"   {label:44s} {bare_us(fn, n):7.2f}")
    cuda.synchronize()


if __name__ == "__main__":
    main()
