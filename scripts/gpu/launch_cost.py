"""How much of a replayed launch is Python (issue 12): run on a GPU.

    python scripts/gpu/launch_cost.py [--calls 20000]

Replays the recorded launch of ``ns.softmax`` on a 1 × 1024 torch row through three
callers of ``cuLaunchKernel`` and prints µs per launch (not synchronised; the queue is
drained every 1000 launches): ctypes without
argtypes on pre-made C values, ``cuda.bindings.driver.cuLaunchKernel`` with the
parameter array's address, and the plan's own ``fire`` (cuda.bindings since these
numbers: ctypes with ``argtypes`` took 9.5 µs, bare ctypes 6.0, cuda.bindings 4.5 on
the H200).  Prints only.
"""

import argparse
import ctypes
import time

import numpy as np
import torch
from numba import cuda

import numba_softmax as ns
from numba_softmax import plans
from numba_softmax.arrays import kinds


def per_launch_us(fn, calls):
    fn()
    cuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(calls):
            fn()
            if i % 1000 == 999:
                cuda.synchronize()
        cuda.synchronize()
        best.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(best))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    n = p.parse_args().calls
    tx = torch.randn(1, 1024, device="cuda")
    ns.softmax(tx)
    ns.softmax(tx)
    plan = plans.lookup(("reduce", "softmax", "auto", -1), (tx, None), kinds.as_stream(None))[1]
    fire, sources = plan.launches[0]
    cells = dict(zip(fire.__code__.co_freevars, (c.cell_contents for c in fire.__closure__)))
    func, addr, shared, params = cells["func"], cells["address"], cells["shared"], fire.params
    gx, gy, gz, bx, by, bz = (cells[k] for k in ("gx", "gy", "gz", "bx", "by", "bz"))
    lib = ctypes.CDLL("libcuda.so.1")
    raw = lib.cuLaunchKernel  # no argtypes: every argument a ready C value
    raw.restype = ctypes.c_int
    c_args = [ctypes.c_void_p(int(func))] + [ctypes.c_uint(v) for v in (gx, gy, gz, bx, by, bz, shared)]
    c_stream, c_null = ctypes.c_void_p(0), ctypes.c_void_p(0)
    from cuda.bindings import driver as cu

    ptrs = [tx.data_ptr(), tx.data_ptr()]
    rows = [
        ("plan fire (cuda.bindings)", lambda: fire(0, ptrs)),
        ("ctypes, no argtypes, C values", lambda: raw(*c_args, c_stream, params, c_null)),
        ("cuda.bindings cuLaunchKernel", lambda: cu.cuLaunchKernel(func, gx, gy, gz, bx, by, bz,
                                                                   shared, 0, addr, 0)),
        ("torch.softmax (whole call)", lambda: torch.softmax(tx, -1)),
        ("torch.empty_like", lambda: torch.empty_like(tx)),
    ]
    print(f"device: {torch.cuda.get_device_name()}; µs per call, median of 5 × {n}")
    for name, fn in rows:
        print(f"{name:34s} {per_launch_us(fn, n):7.2f}")
    y = ns.softmax(tx)
    ref = torch.softmax(tx, -1)
    print("check:", float((y - ref).abs().max()))


if __name__ == "__main__":
    main()
