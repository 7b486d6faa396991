"""Host cost of one paged decode call, by function (issue 17): run on a GPU; prints only."""
import cProfile
import io
import pstats
import time

import numpy as np
import torch
from numba import cuda

import numba_softmax as ns

for dtype, heads, d, page, ctx in ((torch.float32, 8, 64, 16, 1024), (torch.float16, 8, 128, 256, 4096)):
    per_seq = -(-ctx // page)
    q = torch.randn(1, heads, 1, d, device="cuda", dtype=dtype)
    kc = torch.randn(per_seq, page, heads, d, device="cuda", dtype=dtype)
    table = torch.arange(per_seq, dtype=torch.int32, device="cuda")[None]
    lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
    for check in (True, False):
        ns.paged_attention(q, kc, kc, table, lens, check=check)
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            ns.paged_attention(q, kc, kc, table, lens, check=check)
            cuda.synchronize()
        print(f"{dtype} D{d} page {page} ctx {ctx} check={check}: {(time.perf_counter() - t0) / 200 * 1e6:.1f} µs/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        ns.paged_attention(q, kc, kc, table, lens, check=False)
    cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
    print("\n".join(s.getvalue().splitlines()[4:45]))
