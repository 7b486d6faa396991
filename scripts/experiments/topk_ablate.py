#!/usr/bin/env python
"""What each part of the top-k stream costs at many rows (issue #18's B 1024 target): the
package's top-k beside copies of it with one part taken out, and torch, in one run.

    python scripts/experiments/topk_ablate.py [--quick] [--only NAME,NAME] [--plans 64x16,128x16]

Variants — copies of ``numba_softmax`` in a temporary folder, each edited in a few places of
:mod:`numba_softmax.kernels.topk.topk_stream` or :mod:`~numba_softmax.kernels.topk.topk_state`
(an edit that no longer matches the source stops the script):

``as is``     the package;
``no floor``  the warps of a block share no floor (exact: the same values and indices);
``floor 2``   a floor in blocks of two warps too, as an earlier stream did (exact; the
              package shares one only where a block has more than two warps);
``floor/4``   the floor exchanged every fourth chunk, not every chunk (exact);
``no lag``    ℓ against each chunk's own max, the online step every chunk — an earlier
              stream, whose exponentials wait for the chunk's max (close:
              ℓ is summed against another reference; the lagging sums are dead code);
``scaled``    u = x·(1/T) at T = 1 too, as before the stream was specialised for T = 1
              (the one-kernel path; exact: x·1 = x);
``hit 64``    several slots (k > 32), a chunk with candidates, as an earlier stream did: each
              lane counts them in int64 (Numba's int32 + int32), scans the counts with
              two shuffles a step and tests all vpt values to write its own (exact);
              the package marks them as bits and writes only those, a select tree
              picking each u[i];
``serial 16`` one slot (k ≤ 32), a chunk with candidates, as an earlier stream did: a vote
              on each of the vpt values in turn, θ read again after each that had
              candidates (exact); the package takes the lanes' candidate bits, lane by
              lane, lowest i first;
``merge 64``  several slots: a warp's buffer merged into its list once 64 candidates wait
              after a chunk, not 32 — half the merges, θ rising later (exact);
``no list``   after the first chunk no value is offered to the warps' lists: the
              (m, ℓ) stream alone, what the top-k work costs (wrong results);
``no exp``    ℓ summed without its exponentials: what they cost (wrong results).

(*exp2 fma*, *lag* and *lag fma*, variants once, are the package now; *vote once* was
an edit of the one-slot path before *serial 16*.)

The exact variants must give the package's values and indices bit for bit, the close
ones the same indices and values within 1e-5 (float32) or 1e-2 (bfloat16) relative
(else the script stops); the others are timed only.  ``--plans`` forces blocks of
THREADS × VPT a row on the B 1024 shapes (only those are run), each variant under each
plan.  Kernel time by CUDA events behind a sleeping kernel (``_timing.kernel_ms``),
inputs rotated past the L2, N(0, 1) logits; variants alternate in order over two
rounds, median of each.  GB/s counts one read of the logits,
"% copy" is that against a device-to-device copy (read + write) measured in the same
run; a figure above 1.2× the copy's GB/s cannot be a read and stops the script.
"""

import argparse
import importlib
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "numba_softmax")
sys.path.insert(0, HERE)

STREAM, STATE, TOPK = "kernels/topk/topk_stream.py", "kernels/topk/topk_state.py", "kernels/topk/topk.py"
FOLD = "fold = stream(dtype, vpt, width, regs, perturb, not warp_rows and threads // WARP > 2, scaled)"

with open(os.path.join(PACKAGE, STREAM)) as _f:
    _src = _f.read()


def _span(first, last):
    """The package's stream from the line starting ``first`` through the first ``last``
    after it (``first`` alone where it is gone: the variant's edit then stops the script)."""
    if first not in _src:
        return first
    i = _src.index(first)
    return _src[i:_src.index(last, i) + len(last)]


HIT_NOW = _span("                    mine = numba.int32(cuda.popc(bits))", "count = numba.int32(count + total)\n")
SERIAL_NOW = _span("                    lanes = ballot(bits != 0)", "th_u, th_j = threshold(lv, li, k)\n")
SERIAL_BEFORE = (  # … as an earlier stream did: a vote for each i, θ re-read after each i with candidates
    "                    for i in range(vpt):\n"
    "                        j = index(base, t, R, i)\n"
    "                        j = numba.int32(j if j < stop else EMPTY)\n"
    "                        mask = ballot(u[i] >= gate and precedes_device(u[i], j, th_u, th_j))\n"
    "                        if mask != 0:\n"
    "                            while mask != 0:  # the lanes whose i-th value passed, lowest first\n"
    "                                src = cuda.ffs(mask) - 1\n"
    "                                mask &= mask - 1\n"
    "                                cu, cj = shfl2(u[i], j, src)\n"
    "                                insert(lv, li, k, cu, cj, lane)\n"
    "                            th_u, th_j = threshold(lv, li, k)  # θ rises: fewer candidates at i + 1\n"
    "                            gate = max(floor, th_u)\n"
)
HIT_BEFORE = (  # … as an earlier stream did: a count, the scan in int64, 16 tests
    "                    mine = numba.int32(0)  # this lane's candidates, and the lanes' before it\n"
    '                    for i in range(vpt):\n'
    '                        mine += numba.int32(1) if u[i] >= gate else numba.int32(0)\n'
    '                    before = mine\n'
    '                    for e in range(5):  # an inclusive scan across the lanes (strides 1 … 16)\n'
    '                        other = shfl(before, max(lane - (1 << e), 0))\n'
    '                        if lane >= 1 << e:\n'
    '                            before += other\n'
    '                    total = shfl(before, WARP - 1)\n'
    '                    before -= mine\n'
    '                    if count + total <= BUFFER:  # the common case: each lane writes its own\n'
    '                        q = numba.uint32(bbase + count + before)  # (unsigned: no negative-index code)\n'
    '                        for i in range(vpt):\n'
    '                            if u[i] >= gate:\n'
    '                                j = index(base, t, R, i)\n'
    '                                bv[q] = u[i]\n'
    '                                bi[q] = j if j < stop else EMPTY\n'
    '                                q += numba.uint32(1)\n'
    '                        count += total\n'
)
EXACT, CLOSE, TIMED = "exact", "close", "timed"  # what a variant's outputs must be
VARIANTS = {  # name: (kind, [(file, old, new), ...])
    "as is": (EXACT, []),
    "no floor": (EXACT, [(STATE, FOLD, "fold = stream(dtype, vpt, width, regs, perturb, False, scaled)")]),
    "floor 2": (EXACT, [(STATE, FOLD, "fold = stream(dtype, vpt, width, regs, perturb, not warp_rows, scaled)")]),
    "floor/4": (EXACT, [
        (STREAM, "            if shared_floor:\n",
         "            chunks += numba.uint32(1)\n"
         "            if shared_floor and chunks % numba.uint32(4) == numba.uint32(1):\n"),
        (STREAM, "        step = R * vpt\n",
         "        step = R * vpt\n        chunks = numba.uint32(0)\n")]),
    "no lag": (CLOSE, [(STREAM, "lagged = m > -math.inf and m < math.inf and m_chunk <= m + lag",
                        "lagged = False")]),
    "scaled": (EXACT, [(TOPK, "scaled = bool(inv_t != 1)", "scaled = True")]),
    "hit 64": (EXACT, [(STREAM, HIT_NOW, HIT_BEFORE),
                       (STREAM, "count = numba.int32(count + cuda.popc(mask))", "count += numba.int32(cuda.popc(mask))")]),
    "serial 16": (EXACT, [(STREAM, SERIAL_NOW, SERIAL_BEFORE)]),
    "merge 64": (EXACT, [(STREAM, "gate = max(floor, th_u)\n                    if count >= WARP:\n",
                          "gate = max(floor, th_u)\n                    if count >= 2 * WARP:\n")]),
    "no list": (TIMED, [(STREAM, "            if ballot(hit) != 0:", "            if False:")]),
    "no exp": (TIMED, [(STREAM, "wl[i] = exp(u[i] - m)", "wl[i] = u[i] - m")]),
}
SHAPES = ([(1024, V, k, dt) for V in (32000, 128256, 262144) for k in (8, 50)
           for dt in ("float32", "bfloat16")]
          + [(64, 128256, 50, "float32"), (64, 128256, 50, "bfloat16"), (64, 32000, 50, "bfloat16")])
QUICK = [(1024, 128256, 8, "float32"), (1024, 128256, 8, "bfloat16"), (1024, 128256, 50, "float32"),
         (1024, 128256, 50, "bfloat16"), (1024, 32000, 50, "float32"), (64, 128256, 50, "bfloat16"),
         (64, 32000, 50, "bfloat16")]


def build(folder, names):
    """Each variant's copy of the package as an importable ``ns_<i>``; its topk module."""
    modules = {}
    for i, name in enumerate(names):
        copy = os.path.join(folder, f"ns_{i}")
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        for rel, old, new in VARIANTS[name][1]:
            path = os.path.join(copy, rel)
            with open(path) as f:
                text = f.read()
            if text.count(old) != 1:
                sys.exit(f"variant {name!r}: {rel} no longer has exactly one {old.strip()!r}")
            with open(path, "w") as f:
                f.write(text.replace(old, new))
    sys.path.insert(0, folder)
    for i, name in enumerate(names):
        modules[name] = importlib.import_module(f"ns_{i}.kernels.topk.topk")
    return modules


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="seven shapes instead of fifteen")
    p.add_argument("--only", default="as is,floor 2,no floor,no list,no exp",
                   help="comma-separated variants, 'as is' first")
    p.add_argument("--plans", help="THREADSxVPT,…: blocks a row forced, B 1024 shapes only")
    args = p.parse_args()
    names = args.only.split(",")
    plans = [tuple(int(a) for a in spec.split("x")) for spec in args.plans.split(",")] if args.plans else [None]
    if names[0] != "as is" or any(n not in VARIANTS for n in names):
        sys.exit(f"--only: 'as is' first, then any of {list(VARIANTS)[1:]}")

    import torch
    from numba import cuda

    from _timing import kernel_ms

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    folder = tempfile.mkdtemp(prefix="topk_ablate_")
    modules = build(folder, names)

    def view(t):  # bfloat16 as its uint16 bits, as the package takes it
        return cuda.as_cuda_array(t.view(torch.uint16) if t.dtype == torch.bfloat16 else t)

    a = torch.empty(256 * 2**20, device="cuda")
    b = torch.empty_like(a)
    copy = 2 * a.numel() * 4 / (kernel_ms(lambda i: b.copy_(a), 1) / 1e3) / 1e9
    del a, b
    print(f"device: {torch.cuda.get_device_name()}; device copy (read + write) {copy:.0f} GB/s")
    print("kernel µs, and one read of the logits as % of the copy's GB/s; torch: topk(softmax(x))")
    runs = [(n, p) for p in plans for n in names]  # (variant, forced plan or None)
    label = {r: r[0] + (f"@{r[1][0]}x{r[1][1]}" if r[1] else "") for r in runs}
    print(f"{'B':>5} {'V':>7} {'k':>3} {'dtype':>9} " + "".join(f"{label[r]:>16}" for r in runs) + f"{'torch':>9}")
    shapes = QUICK if args.quick else SHAPES
    for B, V, k, dt in (shapes if not args.plans else [s for s in shapes if s[0] == 1024]):
        nbytes = B * V * (2 if dt == "bfloat16" else 4)
        sets = max(1, min(64, -(-80 * 2**20 // nbytes)))  # inputs past the 60 MB L2
        xs = [torch.randn(B, V, device="cuda").to(dtypes[dt]) for _ in range(sets)]
        views = [view(x) for x in xs]
        outs = {}
        for r in runs:
            val = torch.full((B, k), float("nan"), device="cuda", dtype=dtypes[dt])
            idx = torch.full((B, k), -7, device="cuda", dtype=torch.int64)
            mod = modules[r[0]]
            plan = mod.Plan(False, *r[1]) if r[1] else None
            outs[r] = (val, idx, view(val), view(idx), plan)
            mod.launch(views[0], k, outs[r][2], outs[r][3], plan=plan)
        torch.cuda.synchronize()
        for n, p in runs:
            ref, got, kind = outs[(names[0], p)], outs[(n, p)], VARIANTS[n][0]
            same = torch.equal(got[1], ref[1]) and (
                torch.equal(got[0], ref[0]) if kind == EXACT
                else torch.allclose(got[0].float(), ref[0].float(), rtol=1e-2 if dt == "bfloat16" else 1e-5))
            if kind != TIMED and not same:
                sys.exit(f"{label[(n, p)]!r} ({kind}) differs from the package at B {B} V {V} k {k} {dt}")
        times = {r: [] for r in runs}
        for rnd in range(2):
            for r in (runs if rnd == 0 else runs[::-1]):
                o, mod = outs[r], modules[r[0]]
                times[r].append(kernel_ms(lambda i: mod.launch(views[i], k, o[2], o[3], plan=o[4]), sets))
        theirs = kernel_ms(lambda i: torch.topk(torch.softmax(xs[i], -1), k), sets)
        cells = []
        for r in runs:
            ms = statistics.median(times[r])
            gbps = nbytes / (ms / 1e3) / 1e9
            if gbps > 1.2 * copy:
                sys.exit(f"{label[r]!r} at B {B} V {V}: {gbps:.0f} GB/s of one read against a copy of "
                         f"{copy:.0f} GB/s cannot be true")
            cells.append(f"{ms * 1e3:>9.1f} {100 * gbps / copy:>4.0f}%")
        print(f"{B:>5} {V:>7} {k:>3} {dt:>9} " + "  ".join(f"{c:>14}" for c in cells) + f"{theirs * 1e3:>9.1f}",
              flush=True)
        del xs, views, outs
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
