#!/usr/bin/env python
"""Top-k's lists' split (B from a quarter of the multiprocessors' count up: 2–4 pieces a
row) with kernel 2 merging the pieces, against the last piece of each row merging them
in the same launch (``Plan.fused``; issue 18):

    python scripts/gpu/topk_lists_merge.py

float32 and bfloat16, B 48 and 64 × V 128256 and 262144, B 40 and 64 × V 32000, B 64 ×
V 64000, k 8 and 50 (shapes whose default plan is not the lists' split are named and
skipped).  Kernel time behind a
sleeping kernel (``_timing.kernel_ms``), inputs rotated past the L2; two kernels, fused,
two kernels again; ``torch.topk(torch.softmax(x, -1), k)`` in the same run; each result
against float32 torch on the same values (``IDX?``: more than 1 % of the indices differ —
bfloat16 ties, broken by the lower index here and not always by torch).  Prints one line
a case; nothing is kept.
"""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from numba import cuda
from numba_softmax.kernels.topk import topk as K
from numba_softmax.runtime import launcher
from _timing import kernel_ms

print(torch.cuda.get_device_name(), flush=True)
lim = launcher.device_limits()
for dtype in (torch.float32, torch.bfloat16):
    for B, V in ((64, 128256), (64, 262144), (48, 128256), (64, 32000), (40, 32000), (64, 64000)):
        for k in (8, 50):
            nbytes = B * V * (4 if dtype == torch.float32 else 2)
            sets = max(2, -(-3 * (60 << 20) // nbytes))
            xs = [torch.randn(B, V, device="cuda").to(dtype) for _ in range(sets)]
            bits = (lambda t: t.view(torch.uint16)) if dtype == torch.bfloat16 else (lambda t: t)
            nx = [cuda.as_cuda_array(bits(x)) for x in xs]
            vals = torch.empty(B, k, device="cuda", dtype=dtype)
            idx = torch.empty(B, k, device="cuda", dtype=torch.int64)
            nv, ni = cuda.as_cuda_array(bits(vals)), cuda.as_cuda_array(idx)
            p = K.choose(B, V, k, nx[0].dtype, 16 // nx[0].dtype.itemsize, lim, True)
            if p.radix or p.splits == 1 or p.filter:
                print(f"  {str(dtype)[6:]} B{B} V{V} k{k}: plan {p} (not the lists' split)", flush=True)
                continue
            ref_v, ref_i = torch.topk(torch.softmax(xs[0].float(), -1), k)
            t_torch = kernel_ms(lambda i: torch.topk(torch.softmax(xs[i], -1), k), sets)
            line = f"  {str(dtype)[6:]:8} B{B:<4} V{V:<7} k{k:<3} torch {t_torch*1e3:7.1f}"
            for fused in (False, True, False):
                q = p._replace(fused=fused)
                K.launch(nx[0], k, nv, ni, plan=q)
                err = float((vals.float() - ref_v).abs().max())
                same = bool((idx == ref_i).float().mean() > 0.99)
                t = kernel_ms(lambda i: K.launch(nx[i], k, nv, ni, plan=q), sets)
                line += f" | {'fused' if fused else 'two  '} {t*1e3:6.1f} µs {t_torch/t:5.2f}x err {err:.0e}{'' if same else ' IDX?'}"
            print(line, flush=True)
            del xs, nx
            torch.cuda.empty_cache()
