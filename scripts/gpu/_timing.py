"""Kernel time behind a sleeping kernel, shared by the GPU sweep scripts."""

import statistics

import torch


def kernel_ms(fn, sets, calls=20, rounds=5, sleep_cycles=200_000_000):
    """Median over ``rounds`` of the milliseconds per call of ``fn(i % sets)``, ``calls``
    calls queued behind ``torch.cuda._sleep(sleep_cycles)`` (~100 ms by default: long
    enough for the host to queue every call before the GPU reaches them, so host time is
    not in the figure)."""
    fn(0)
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for i in range(calls):
            fn(i % sets)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / calls)
    return statistics.median(out)
