#!/usr/bin/env python
"""The backward passes timed for a package tree given on the command line, so that two
trees can be compared one after the other on a GPU (as ``softmax_ab.py`` does for the
forward):

    git archive <commit> numba_softmax scripts | tar -x -C scratch/old   # an ignored folder
    python scripts/gpu/backward_ab.py . new
    (cd scratch/old && python ../../scripts/gpu/backward_ab.py . old)

Row backward (``softmax_backward_launch.launch``, the default plan; rows of 1024, 65536
and 262144 values in float32, float16 and bfloat16, softmax — and log_softmax in float16
at 65536): checked against float64 (outputs poisoned with NaN), then kernel time behind a
sleeping kernel (``_timing.kernel_ms``, inputs rotated past the L2), GB/s = y and dy
read, dx written, % of a device copy of 512 MiB.  Attention backward in float16 (B 4,
H 8, S 1024 and 4096, D 64 and 128; O and LSE from PyTorch's float32 math): checked
against SDPA's float64 backward, then TFLOP/s = 10·S²·D·B·H / time.  Prints one line a
case; nothing is kept.  (Its first use: the forty-first session, ``docs/benchmarks/NOTES.md``.)
"""

import math
import os
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
LABEL = sys.argv[2] if len(sys.argv) > 2 else "this"
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.join(ROOT, "scripts", "gpu"))

import torch  # noqa: E402
from numba import cuda  # noqa: E402

import numba_softmax  # noqa: E402
from numba_softmax.kernels.backward import attention_backward as KA  # noqa: E402
from numba_softmax.kernels.backward import softmax_backward_launch as KS  # noqa: E402
from numba_softmax.kernels.rows.epilogue import LOG_SOFTMAX, SOFTMAX  # noqa: E402

from _timing import kernel_ms  # noqa: E402
from backward_cluster import TOL, case  # noqa: E402

ROWS = [(16384, 1024), (1024, 65536), (256, 262144)]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def copy_gbps():
    src = torch.empty(128 << 20, device="cuda")  # 512 MiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / kernel_ms(lambda i: dst.copy_(src), 1) / 1e6


def rows(copy):
    for rows_, n in ROWS:
        for dtype in DTYPES:
            modes = (SOFTMAX, LOG_SOFTMAX) if dtype == torch.float16 and n == 65536 else (SOFTMAX,)
            for mode in modes:
                sets, nbytes, _, _, dx, want, views = case(rows_, n, dtype, mode)
                dx[0].fill_(float("nan"))
                KS.launch(mode, *views[0])
                torch.cuda.synchronize()
                err = float((dx[0].double() - want).abs().max())
                ok = err <= TOL[dtype] * max(1.0, float(want.abs().max()))
                ms = kernel_ms(lambda i: KS.launch(mode, *views[i]), sets)
                gbps = nbytes / ms / 1e6
                print(f"{LABEL} rowbwd {['softmax', 'log'][mode]:7s} {str(dtype)[6:]:8s} "
                      f"{rows_}x{n}: {ms * 1e3:8.1f} us {gbps:6.0f} GB/s "
                      f"{100 * gbps / copy:5.1f} % of copy {'ok' if ok else 'WRONG %.3g' % err}",
                      flush=True)


def attention(b=4, h=8):
    for s in (1024, 4096):
        for d in (64, 128):
            q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
                           for _ in range(4))
            sc = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)  # S = QKᵀ/√d
            lse = torch.logsumexp(sc, -1)
            o = (torch.softmax(sc, -1) @ v.float()).half()
            del sc
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            args = [cuda.as_cuda_array(t) for t in (do, q, k, v, o, lse, *grads)]
            KA.launch(*args)
            torch.cuda.synchronize()
            leaves = [t.double().requires_grad_() for t in (q, k, v)]
            torch.nn.functional.scaled_dot_product_attention(*leaves).backward(do.double())
            err = max(float((g.double() - x.grad).abs().max() / x.grad.abs().max())
                      for g, x in zip(grads, leaves))
            del leaves
            ms = kernel_ms(lambda i: KA.launch(*args), 1, calls=5, rounds=3)
            print(f"{LABEL} attbwd f16 S {s} D {d}: {ms:.3f} ms "
                  f"{10 * s * s * d * b * h / ms / 1e9:6.1f} TFLOP/s err {err:.1e} "
                  f"{'ok' if err < 2e-2 else 'WRONG'}", flush=True)


def main():
    assert os.path.abspath(numba_softmax.__file__).startswith(ROOT), "not the tree named"
    copy = copy_gbps()
    print(f"{LABEL} copy {copy:.0f} GB/s", flush=True)
    rows(copy)
    attention()


if __name__ == "__main__":
    main()
