"""Where the host time of one small call goes (issue 12): run on a GPU.

    python scripts/experiments/host_profile.py [--calls 2000]

For each overhead row of the benchmark: the synchronised call time with the replay
through the driver and through cuda.core, then the pieces of a plan hit timed alone,
then cProfile's top entries of the torch softmax call.  Prints only; nothing is kept.
"""

import argparse
import cProfile
import io
import pstats
import time

import numpy as np
from numba import cuda

import numba_softmax as ns
from numba_softmax import plans
from numba_softmax.arrays import kinds, ops, plan_facts, pool
from numba_softmax.runtime import replay


def per_call_us(fn, calls, loops=5, sync=cuda.synchronize):
    """Median over ``loops`` of the host time per call of ``fn`` (followed by ``sync``
    each time; ``sync=None``: not synchronised), µs."""
    fn()
    if sync:
        sync()
    times = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            if sync:
                sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(times))


def bare_us(fn, calls, loops=5):
    return per_call_us(fn, calls, loops, sync=None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    import cupy
    import torch

    n = a.calls
    rng = np.random.default_rng(0)
    host = rng.standard_normal((1, 1024)).astype(np.float32)
    xs = {"torch": torch.from_numpy(host).cuda(), "cupy": cupy.asarray(host),
          "numba": cuda.to_device(host)}
    ys = {k: (v.clone() if k == "torch" else v.copy() if k == "cupy" else cuda.to_device(host))
          for k, v in xs.items()}
    q = torch.randn(1, 8, 128, 64, device="cuda")
    o, lse = ns.attention(q, q, q, return_lse=True)
    q1 = torch.randn(1, 8, 1, 64, device="cuda")
    kv = torch.randn(1, 8, 1024, 64, device="cuda")
    tx = xs["torch"]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"device: {cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes) else cuda.get_current_device().name}")
    print(f"cuda.synchronize alone: {bare_us(cuda.synchronize, n):.2f} µs; "
          f"torch.cuda.synchronize alone: {bare_us(torch.cuda.synchronize, n):.2f} µs")
    rows = [("torch.softmax(x) [base]", lambda: torch.softmax(tx, -1)),
            ("sdpa(q,q,q) [base]", lambda: sdpa(q, q, q))]
    for k in xs:
        rows.append((f"ns.softmax {k}", lambda k=k: ns.softmax(xs[k])))
        rows.append((f"ns.softmax out= {k}", lambda k=k: ns.softmax(xs[k], out=ys[k])))
    rows += [("ns.logsumexp torch", lambda: ns.logsumexp(tx)),
             ("ns.attention torch", lambda: ns.attention(q, q, q)),
             ("ns.merge_attention torch", lambda: ns.merge_attention(o, lse, o, lse)),
             ("decode splits=4 torch", lambda: ns.attention(q1, kv, kv, num_splits=4))]
    for mode in ("driver", "core"):
        replay.MODE = mode
        with plans._LOCK:
            plans._PLANS.clear()
        print(f"\n== replay through {mode}: synchronised call, µs (median of 5 × {n}) ==")
        for name, fn in rows:
            if mode == "core" and "[base]" in name:
                continue
            print(f"{name:32s} {per_call_us(fn, n):8.2f}   unsynced {bare_us(fn, n):8.2f}")
    replay.MODE = "driver"
    with plans._LOCK:
        plans._PLANS.clear()

    print("\n== pieces of a plan hit (torch softmax), µs each ==")
    ns.softmax(tx)
    stream = ops.as_stream(None)
    key, plan, _ = plans.lookup(("reduce", "softmax", "auto", -1), (tx, None), stream)
    pieces = [
        ("ops.as_stream(None)", lambda: ops.as_stream(None)),
        ("plans.lookup", lambda: plans.lookup(("reduce", "softmax", "auto", -1), (tx, None), stream)),
        ("plan_facts.layout_key(torch)", lambda: plan_facts.layout_key(tx)),
        ("replay.current_context", replay.current_context),
        ("plans.find", lambda: plans.find(key)),
        ("plan_facts.pointer(torch)", lambda: plan_facts.pointer(tx)),
        ("allocator(torch recipe)", lambda: plan.makers[0](stream, (tx, None))),
        ("pool.device_array((1,1024))", lambda: pool.device_array((1, 1024), np.float32)),
        ("kinds.describe(numba)", lambda: kinds.describe(xs["numba"])),
        ("plan_facts.layout_key(numba)", lambda: plan_facts.layout_key(xs["numba"])),
        ("cuda.device_array((1,1024))", lambda: cuda.device_array((1, 1024), np.float32)),
        ("kinds.current_device_id", kinds.current_device_id),
        ("torch.empty((1,1024))", lambda: torch.empty((1, 1024), device="cuda")),
        ("plan((x, None), 0) whole", lambda: plan((tx, None), stream)),
        ("ns.softmax(x) whole", lambda: ns.softmax(tx)),
    ]
    for fire, sources in plan.launches:
        pieces.append(("Launch.fire", lambda f=fire, k=len(sources): f(0, [tx.data_ptr()] * k)))
    for name, fn in pieces:
        print(f"{name:32s} {bare_us(fn, n):8.2f}")
    cuda.synchronize()

    for name, fn in (("ns.softmax torch", lambda: ns.softmax(tx)),
                     ("ns.attention torch", lambda: ns.attention(q, q, q)),
                     ("decode splits=4 torch", lambda: ns.attention(q1, kv, kv, num_splits=4)),
                     ("ns.softmax numba out=", lambda: ns.softmax(xs["numba"], out=ys["numba"]))):
        print_profile(name, fn, n)


def print_profile(name, fn, calls, top=18):
    """cProfile's ``top`` entries, by own time, of ``calls`` unsynchronised calls of fn."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    print(f"\n== cProfile {name}, {calls} calls, by own time ==")
    print("\n".join(s.getvalue().splitlines()[4:top + 12]))


if __name__ == "__main__":
    main()
