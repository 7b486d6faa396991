#!/usr/bin/env python
"""Does a call routed to the wgmma forward stop the host?

    python scripts/experiments/route_wait.py      # an sm_90 GPU with PyTorch

Eight ``ns.attention`` calls (bf16, B 2, Hq 16, Hkv 4, S 2048, D 128, causal) are queued
behind a ~0.5 s GPU sleep.  The host's time per call is printed, and whether the host
finished queueing them before the GPU drained ("no wait") or waited for the GPU
("WAITED": something in the call — a copy from pageable memory, a free — synchronised).
Three cases: the same arrays each call (tensor maps cached), new contiguous arrays
(new maps each call), new transposed views as a model hands over (new maps each call,
over the views' own strides).  Each under ``NUMBA_SOFTMAX_HOPPER=auto`` (routed to the
wgmma forward: the calls after the first replay a launch plan that makes the new maps)
and ``off`` (``mma.sync``, a plan too), for the host time of routing itself.
"""

import importlib

import time

import torch

import numba_softmax as ns


def probe(label, make, n=8):
    ns.attention(*make(), causal=True)  # compiled, and the maps' pool made
    torch.cuda.synchronize()
    sets = [make() for _ in range(n)]
    torch.cuda._sleep(1_000_000_000)
    t0 = time.perf_counter()
    for a in sets:
        ns.attention(*a, causal=True)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    waited = (t1 - t0) > 0.6 * (t2 - t0)
    print(f"{label:50s} host {1e3 * (t1 - t0) / n:7.3f} ms/call; queue drained after "
          f"{1e3 * (t2 - t0):6.1f} ms -> {'WAITED' if waited else 'no wait'}", flush=True)


def arrays(strided):
    b, h, hkv, s, d = 2, 16, 4, 2048, 128

    def make():
        if strided:  # (B, S, H, D) viewed as (B, H, S, D)
            return tuple(torch.randn(b, s, n, d, device="cuda", dtype=torch.bfloat16)
                         .transpose(1, 2) for n in (h, hkv, hkv))
        return tuple(torch.randn(b, n, s, d, device="cuda", dtype=torch.bfloat16)
                     for n in (h, hkv, hkv))

    return make


if __name__ == "__main__":
    print(f"# {torch.cuda.get_device_name()}")
    api = importlib.import_module("numba_softmax.attention")
    same = arrays(False)()
    for setting in ("auto", "off"):
        api.HOPPER = setting  # (in the plan key: each setting records its own plans)
        probe(f"{setting}: same arrays (maps cached)", lambda: same)
        probe(f"{setting}: new contiguous arrays each call", arrays(False))
        probe(f"{setting}: new strided (transposed) arrays each call", arrays(True))
