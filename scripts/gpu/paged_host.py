"""Host time of the decode calls of the overhead table, piece by piece (issue 12): run on
a GPU; prints only.

    python scripts/gpu/paged_host.py [--calls 2000]

The rows of ``bench --only overhead``'s decode part (B 1, 8 heads, D 64, 1024 keys,
float32 torch tensors, pages of 16), each against ``torch.softmax`` of a 1 × 1024 row in
alternating loops; then the pieces of a paged plan hit timed alone; then cProfile's top
entries of the paged calls with and without the table check.
"""

import argparse
import os
import sys

import torch
from numba import cuda

sys.path.insert(0, os.path.dirname(__file__))
from host_profile import bare_us, per_call_us, print_profile  # noqa: E402

import numba_softmax as ns  # noqa: E402
from numba_softmax import plans  # noqa: E402
from numba_softmax.arrays import kinds  # noqa: E402
from numba_softmax.kernels.decode import table_check  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    n = p.parse_args().calls
    heads, d, ctx, page = 8, 64, 1024, 16
    x = torch.randn(1, 1024, device="cuda")
    q = torch.randn(1, heads, 1, d, device="cuda")
    kv = torch.randn(1, heads, ctx, d, device="cuda")
    kc = torch.randn(ctx // page, page, heads, d, device="cuda")
    table = torch.arange(ctx // page, dtype=torch.int32, device="cuda")[None]
    lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
    want = ns.attention(q, kc.permute(2, 0, 1, 3).reshape(1, heads, ctx, d),
                        kc.permute(2, 0, 1, 3).reshape(1, heads, ctx, d), num_splits=1)
    o, lse = ns.attention(q, kv, kv, return_lse=True)
    rows = [("torch.softmax(x) [base]", lambda: torch.softmax(x, -1)),
            ("merge_attention", lambda: ns.merge_attention(o, lse, o, lse)),
            ("decode num_splits=4", lambda: ns.attention(q, kv, kv, num_splits=4)),
            ("decode default splits", lambda: ns.attention(q, kv, kv)),
            ("paged check=False", lambda: ns.paged_attention(q, kc, kc, table, lens, check=False)),
            ("paged checked", lambda: ns.paged_attention(q, kc, kc, table, lens))]
    for name, fn in rows[4:]:
        got = fn()
        err = float((got - want).abs().max())
        print(f"{name}: max |O − one-pass O| = {err:.2e}")
        assert err < 1e-4, name
    print(f"\n== synchronised call, µs (median of 5 × {n}), three rounds ==")
    for rnd in range(3):
        print(" | ".join(f"{name} {per_call_us(fn, n):.1f}" for name, fn in rows))

    print("\n== pieces of the paged plan hit, µs each (not synchronised) ==")
    stream = kinds.as_stream(None)
    arrays = (q, kc, kc, table, lens, None)
    tag = ("paged_attention", False, None, None, False, None, False)
    key, plan, ptrs = plans.lookup(tag, arrays, stream)
    assert plan is not None, "no plan was recorded for the paged call"
    for name, fn in (("kinds.as_stream(None)", lambda: kinds.as_stream(None)),
                     ("plans.lookup (5 arrays)", lambda: plans.lookup(tag, arrays, stream)),
                     ("kinds.facts(torch)", lambda: kinds.facts(q)),
                     ("plans.find", lambda: plans.find(key)),
                     ("plan(arrays) check=False", lambda: plan(arrays, stream, ptrs)),
                     ("table_check.read (stream idle)", lambda: table_check.read(stream))):
        print(f"{name:34s} {bare_us(fn, n):8.2f}")
    cuda.synchronize()

    for name, fn in rows[1:2] + rows[4:]:
        print_profile(name, fn, n, top=16)


if __name__ == "__main__":
    main()
