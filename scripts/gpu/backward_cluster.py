"""The row backward's cluster form (issue 15) beside the forms it replaces and torch: run on
a GPU (sm_90); prints only.

    python scripts/gpu/backward_cluster.py [--quick]

For rows of 16K … 256K values (float32, float16, bfloat16), softmax and log_softmax
backward: a device-to-device copy of the same bytes, ``torch._softmax_backward_data`` (or
the log form), the default plan (``plan`` on this device: the cluster form where it
holds the row), the plan without clusters (two passes or split, what ran before), and
cluster plans of 256 / 512 / 1024 threads — kernel time behind a sleeping kernel
(``_timing.kernel_ms``), inputs rotated past the L2; GB/s = y and dy read, dx written
(3·M·N·b); % of the copy's GB/s (2 tensors' bytes per byte copied, the same rate).
Every plan is checked against a float64 reference first (outputs poisoned with NaN).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import kernel_ms  # noqa: E402

from numba import cuda  # noqa: E402

from numba_softmax.runtime import launcher  # noqa: E402
from numba_softmax.kernels.backward import softmax_backward_launch as KS  # noqa: E402
from numba_softmax.kernels.rows.epilogue import LOG_SOFTMAX, SOFTMAX  # noqa: E402

SHAPES = [(1024, 65536), (1024, 128256), (2048, 32768), (4096, 20000), (256, 262144),
          (16384, 1024), (4096, 8192)]
QUICK = [(1024, 65536), (1024, 128256), (256, 262144)]
TORCH = {SOFTMAX: torch._softmax_backward_data, LOG_SOFTMAX: torch._log_softmax_backward_data}
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def numba_view(t):
    return cuda.as_cuda_array(t.view(torch.uint16) if t.dtype == torch.bfloat16 else t)


def case(rows, n, dtype, mode, l2=60 * 2**20):
    item = torch.tensor([], dtype=dtype).element_size()
    nbytes = 3 * rows * n * item
    sets = max(2, -(-3 * l2 // nbytes))
    x = [torch.randn(rows, n, device="cuda") * 3 for _ in range(sets)]
    y = [(torch.softmax(a, -1) if mode == SOFTMAX else torch.log_softmax(a, -1)).to(dtype)
         for a in x]
    dy = [torch.randn(rows, n, device="cuda").to(dtype) for _ in range(sets)]
    dx = [torch.empty_like(a) for a in y]
    y64, dy64 = y[0].double(), dy[0].double()
    if mode == SOFTMAX:
        want = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    else:
        want = dy64 - torch.exp(y64) * dy64.sum(-1, keepdim=True)
    views = [(numba_view(g), numba_view(a), numba_view(o)) for g, a, o in zip(dy, y, dx)]
    return sets, nbytes, y, dy, dx, want, views


def variants(n, dtype, width, clusters, auto):
    """Cluster plans of 256 / 512 / 1024 threads (and for 16-bit types, 16 and 32 values a
    thread), other than ``auto``."""
    out = []
    for vpt_max in sorted({KS.max_vpt(dtype, width), 16}, reverse=True):
        for threads in (256, 512, 1024):
            size = -(-n // (threads * vpt_max))
            if clusters and size <= KS.MAX_CLUSTER:
                vpt = max(width, KS.pow2_ceil(-(-n // (size * threads))))
                c = KS.Plan("cluster", threads, vpt, -(-n // (threads * vpt)))
                if c != auto and c not in out:
                    out.append(c)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dtypes", default="float32,bfloat16,float16")
    p.add_argument("--modes", default="softmax,log_softmax")
    p.add_argument("--shapes", default="", help="only these, e.g. 16384x1024,256x262144")
    p.add_argument("--plans", default="", help="only these forced plans (with launch()), "
                   "form:threads:vpt[:splits] joined by |, e.g. 'warp:32:32|warp:128:32'")
    a = p.parse_args()
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    modes = [{"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX}[m] for m in a.modes.split(",")]
    limits = launcher.device_limits()
    print(f"device: {torch.cuda.get_device_name()} (cc {limits.cc}, {limits.sms} SMs)")
    clusters = tuple(limits.cc) >= (9, 0)
    failed = 0
    shapes = QUICK if a.quick else SHAPES
    if a.shapes:
        shapes = [tuple(int(d) for d in shape.split("x")) for shape in a.shapes.split(",")]
    forced = [KS.Plan(f, *(int(v) for v in rest)) for f, *rest in
              (plan.split(":") for plan in a.plans.split("|") if plan)]
    for rows, n in shapes:
        for dtype in dtypes:
            for mode in modes:
                sets, nbytes, y, dy, dx, want, views = case(rows, n, dtype, mode)
                gbps = lambda ms: nbytes / ms / 1e6  # noqa: E731
                copy = gbps(kernel_ms(lambda i: dx[i].copy_(y[i]), sets) * 1.5)
                width = 16 // y[0].element_size()
                kd = views[0][1].dtype if dtype != torch.float16 else np.dtype(np.float16)
                auto = KS.plan(rows, n, kd, width, limits.max_threads, limits.sms, clusters)
                old = KS.plan(rows, n, kd, width, limits.max_threads, limits.sms)
                plans = [("launch()", None), ("plan()", auto), ("no clusters", old)]
                plans += [("cluster", c) for c in variants(n, kd, width, clusters, auto)]
                if forced:
                    plans = [("launch()", None)] + [("forced", f) for f in forced]
                tf = TORCH[mode]
                torch_ms = kernel_ms(lambda i: tf(dy[i], y[i], -1, y[i].dtype), sets)
                name = "softmax" if mode == SOFTMAX else "log_softmax"
                print(f"{name} {str(dtype)[6:]} {rows}x{n}: copy {copy:.0f} GB/s | torch "
                      f"{gbps(torch_ms):.0f} ({100 * gbps(torch_ms) / copy:.1f} %)", flush=True)
                for label, plan in plans:
                    try:
                        dx[0].fill_(float("nan"))
                        KS.launch(mode, *views[0], plan_=plan)
                        torch.cuda.synchronize()
                        err = float((dx[0].double() - want).abs().max())
                        scale = float(want.abs().max())
                        if not err <= TOL[dtype] * max(1.0, scale):
                            print(f"  {label} {plan}: WRONG, max error {err:.3g}", flush=True)
                            failed += 1
                            continue
                        ms = kernel_ms(lambda i: KS.launch(mode, *views[i], plan_=plan), sets)
                    except Exception as e:  # noqa: BLE001  (a plan this device refuses)
                        print(f"  {label} {plan}: {type(e).__name__}: {e}", flush=True)
                        continue
                    shown = plan or KS.Plan("(its own)", 0)
                    print(f"  {label:12s} {shown.form:9s} T {shown.threads:4d} vpt {shown.vpt:2d} "
                          f"size/splits {shown.splits}: {ms * 1e3:8.1f} us {gbps(ms):6.0f} GB/s "
                          f"{100 * gbps(ms) / copy:5.1f} % of copy, {torch_ms / ms:.2f}x torch",
                          flush=True)
    print("FAILED" if failed else "all plans correct")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
