#!/usr/bin/env python
"""``fused``'s wide float32 teams (:data:`numba_softmax.kernels.softmax.fused.WIDE`; issue 13, "best
method ≥ the Triton tutorial on every shape"): run on a GPU, alone; prints only.

    python scripts/experiments/fused_wide.py          # the default team against the launch fused chooses
    python scripts/experiments/fused_wide.py --map    # teams × register caps at rows of 2048 … 16384
    python scripts/experiments/fused_wide.py --pad    # both teams on rows laid out 128 bytes apart

Default: float32 softmax at rows of 2560 … 12288 values, the team of
:func:`~numba_softmax.kernels.softmax.fused.default_team` (32 values a thread, 64 registers)
against the launch ``fused.configure`` gives (a wide team where :func:`wide_team` says),
a b a b, with the Triton tutorial kernel beside.  ``--map``: every team of 32, 16, 8 and
4 values a thread with the kernel held to 64, 48, 40 and 32 registers (a launch that
spills under a cap is skipped), float32 at rows of 2048 … 16384 values (64 MB), float16
and bfloat16 at 4096 … 16384 (the bench's shapes).  Each launch is checked against
float32 ``torch.softmax`` first, then timed: kernel time behind a sleeping kernel
(``_timing.kernel_ms``), inputs rotated past the L2, % of a device copy of the same bytes.
``--pad``: the default team and the launch ``fused`` chooses on float32 rows of 3072 …
8192 values, packed and with each row padded by 32 values (the row stride no longer a
power of two): is the default team's loss at 4096 and 8192 values the power-of-two row
stride?  (The runs, H200: ``docs/benchmarks/fused-wide-nvidia-h200.txt``; ``--pad`` is its
section 5: no.)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _timing import RowSets, kernel_ms  # noqa: E402

from numba_softmax.bench import triton_peers  # noqa: E402
from numba_softmax.kernels.rows import chunk
from numba_softmax.kernels.softmax import fused
from numba_softmax.runtime import launcher  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

AB_SHAPES = [(8192, 4096), (4096, 8192), (8192, 2560), (5461, 3072), (2730, 6144), (1638, 10240),
             (1365, 12288), (4096, 4096), (2048, 8192), (1024, 12000), (4096, 5000)]
MAP_CASES = ([("float32", 2**24 // n, n) for n in (2048, 4096, 8192, 12288, 16384)]
             + [(d, rows, n) for d in ("float16", "bfloat16")
                for rows, n in ((8192, 4096), (4096, 8192), (2048, 16384))])


def ab():
    for rows, n in AB_SHAPES:
        r = RowSets(rows, n, torch.float32)
        copy = r.copy_gbps()
        pct = lambda ms: 100 * r.gbps(ms) / copy  # noqa: E731
        old = lambda i: chunk.run(fused.configure(r.nx[i], r.ny[i], SOFTMAX, threads=fused.default_team(n)))  # noqa: E731
        new = lambda i: chunk.run(fused.configure(r.nx[i], r.ny[i], SOFTMAX))  # noqa: E731
        po = fused.configure(r.nx[0], r.ny[0], SOFTMAX, threads=fused.default_team(n))
        pn = fused.configure(r.nx[0], r.ny[0], SOFTMAX)
        ro = launcher.compiled(po.kernel, po.args).regs_per_thread
        rn = launcher.compiled(pn.kernel, pn.args).regs_per_thread
        for f in (old, new):
            r.ys[0].fill_(float("nan"))
            f(0)
            err = float((r.ys[0] - r.want).abs().max())
            assert err < 1e-5, err
        t = []
        for _ in range(2):
            t += [kernel_ms(old, r.sets), kernel_ms(new, r.sets)]
        tut = kernel_ms(lambda i: triton_peers.tutorial(r.xs[i], r.ys[i]), r.sets)
        print(f"float32 {rows}x{n}: copy {copy:.0f} | old {po.team}@{ro} {pct(t[0]):5.1f} {pct(t[2]):5.1f} | "
              f"new {pn.team}@{rn} {pct(t[1]):5.1f} {pct(t[3]):5.1f} | tutorial {pct(tut):5.1f} | "
              f"new/tutorial {tut / min(t[1], t[3]):.3f}x", flush=True)


def padded():
    from numba import cuda

    for rows, n in ((8192, 4096), (4096, 8192), (5461, 3072), (2730, 6144)):
        r = RowSets(rows, n, torch.float32)
        copy = r.copy_gbps()
        pct = lambda ms: 100 * r.gbps(ms) / copy  # noqa: E731
        line = f"float32 {rows}x{n}: copy {copy:.0f} GB/s"
        for pad in (0, 32):
            if pad:  # the same values, each row 32 values (128 bytes) further on
                store = [torch.empty(rows, n + pad, device="cuda") for _ in range(2 * r.sets)]
                xs = [s_[:, :n] for s_ in store[:r.sets]]
                ys = [s_[:, :n] for s_ in store[r.sets:]]
                for a, b in zip(xs, r.xs):
                    a.copy_(b)
                nx, ny = [cuda.as_cuda_array(a) for a in xs], [cuda.as_cuda_array(a) for a in ys]
            else:
                ys, nx, ny = r.ys, r.nx, r.ny
            for label, team in (("default", fused.default_team(n)), ("chosen", None)):
                run = lambda i: chunk.run(fused.configure(nx[i], ny[i], SOFTMAX, threads=team))  # noqa: E731
                ys[0].fill_(float("nan"))
                run(0)
                err = float((ys[0] - r.want).abs().max())
                assert err < 1e-5, err
                plan = fused.configure(nx[0], ny[0], SOFTMAX, threads=team)
                line += f" | pad {pad} {label} {plan.team} {pct(kernel_ms(run, r.sets)):5.1f}"
        print(line, flush=True)


def sweep():
    for name, rows, n in MAP_CASES:
        r = RowSets(rows, n, getattr(torch, name))
        copy = r.copy_gbps()
        pct = lambda ms: 100 * r.gbps(ms) / copy  # noqa: E731
        tut = kernel_ms(lambda i: triton_peers.tutorial(r.xs[i], r.ys[i]), r.sets)
        d = fused.configure(r.nx[0], r.ny[0], SOFTMAX)
        dms = kernel_ms(lambda i: chunk.run(fused.configure(r.nx[i], r.ny[i], SOFTMAX)), r.sets)
        print(f"{name} {rows}x{n}: copy {copy:.0f} GB/s | tutorial {pct(tut):5.1f} | default team {d.team} "
              f"{pct(dms):5.1f} ({tut / dms:.3f}x)", flush=True)
        for regs in (64, 48, 40, 32):
            fused.REGISTERS = regs  # (read when a kernel is compiled: the cache is emptied)
            fused.kernel.cache_clear()
            for vals in (32, 16, 8, 4):
                team = n // vals
                if team < 32 or team > 1024 or vals > fused.max_vpt(team):
                    continue
                try:
                    plan = fused.configure(r.nx[0], r.ny[0], SOFTMAX, threads=team)
                except ValueError as e:
                    print(f"  regs≤{regs} {team}x{vals}: {str(e)[:80]}")
                    continue
                k = launcher.compiled(plan.kernel, plan.args)
                nregs, local = k.regs_per_thread, k.local_mem_per_thread
                if local > 0 and regs < 64:
                    print(f"  regs≤{regs:2} {plan.team:4}x{vals:2} (regs {nregs}, local {local}): spills, skipped")
                    continue
                r.ys[0].fill_(float("nan"))
                chunk.run(plan)
                err = float((r.ys[0].float() - r.want).abs().max())
                ms = kernel_ms(lambda i: chunk.run(fused.configure(r.nx[i], r.ny[i], SOFTMAX, threads=team)), r.sets)
                print(f"  regs≤{regs:2} {plan.team:4}x{vals:2} block {plan.block:4} (regs {nregs}, local {local}, "
                      f"{65536 // (nregs * plan.block)} blocks/SM by regs): {pct(ms):5.1f}  ({tut / ms:.3f}x)  "
                      f"err {err:.1e}", flush=True)
    fused.REGISTERS = 64
    fused.kernel.cache_clear()


if __name__ == "__main__":
    print("device:", torch.cuda.get_device_name(), flush=True)
    sweep() if "--map" in sys.argv else padded() if "--pad" in sys.argv else ab()
