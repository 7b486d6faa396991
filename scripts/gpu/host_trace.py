"""Why a whole call costs more than its plan-hit pieces (issue 12): run on a GPU; prints.

    python scripts/gpu/host_trace.py [--calls 2000]

The merge and decode rows of the overhead table (torch float32), unsynchronised, timed
as: the public function; the unwrapped function; the plan-hit path written out by hand
(as_stream, lookup, replay); the same with the garbage collector off; then cProfile of
the public call by cumulative time.
"""

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys

import torch
from numba import cuda

sys.path.insert(0, os.path.dirname(__file__))
from host_profile import bare_us  # noqa: E402

import numba_softmax as ns  # noqa: E402
att = __import__("importlib").import_module("numba_softmax.attention")
from numba_softmax import plans  # noqa: E402
from numba_softmax.arrays import kinds  # noqa: E402


def by_hand(tag, arrays):
    def call():
        s = kinds.as_stream(None)
        _, plan, ptrs = plans.lookup(tag, arrays, s)
        return plan(arrays, s, ptrs)
    return call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    n = p.parse_args().calls
    print(f"device: {torch.cuda.get_device_name()}; gc thresholds {gc.get_threshold()}, "
          f"tracked objects {len(gc.get_objects())}")
    q = torch.randn(1, 8, 128, 64, device="cuda")
    o, lse = ns.attention(q, q, q, return_lse=True)
    q1 = torch.randn(1, 8, 1, 64, device="cuda")
    kv = torch.randn(1, 8, 1024, 64, device="cuda")
    x = torch.randn(1, 1024, device="cuda")
    rows = [
        ("torch.softmax", lambda: torch.softmax(x, -1)),
        ("ns.softmax", lambda: ns.softmax(x)),
        ("merge: ns.merge_attention", lambda: ns.merge_attention(o, lse, o, lse)),
        ("merge: attention.merge_attention", lambda: att.merge_attention(o, lse, o, lse)),
        ("merge: by hand", by_hand(("merge_attention",), (o, lse, o, lse, None))),
        ("decode: ns.attention", lambda: ns.attention(q1, kv, kv, num_splits=4)),
        ("decode: by hand", by_hand(("attention", False, None, None, False, 4), (q1, kv, kv, None))),
    ]
    for name, fn in rows:
        fn()
    for rnd in range(2):
        for gc_on in (True, False):
            (gc.enable if gc_on else gc.disable)()
            print(f"\n-- round {rnd}, gc {'on' if gc_on else 'off'}: µs per call, unsynchronised --")
            for name, fn in rows:
                print(f"   {name:36s} {bare_us(fn, n):7.2f}")
            gc.enable()
            cuda.synchronize()
    for name, fn in (rows[2], rows[5]):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(f"\n== cProfile {name}, {n} calls, by own time ==")
        print("\n".join(s.getvalue().splitlines()[4:40]))


if __name__ == "__main__":
    main()
