"""What ``auto`` should pick (issue 13): every on-chip softmax method at rows of 16–160 KB,
per item size and row count, beside the method ``auto`` runs; prints, and writes one JSON
line a case for the crossover table (``numba_softmax/kernels/softmax/crossovers.json``,
``docs/algorithms/auto.md``).

    python scripts/gpu/auto_sweep.py [--out sweep.jsonl] [--quick]

For each (dtype, rows, n): a device-to-device copy of the same bytes (torch ``copy_``),
then ``fused``, ``onchip``, ``cluster``, ``group`` and ``auto`` through
``kernels.softmax.methods.launch`` in softmax mode, each checked against float32
``torch.softmax`` first, then timed: kernel time behind a sleeping kernel
(``_timing.kernel_ms``), inputs rotated past the L2; % of the copy = GB/s (read once +
written once) over the copy's.  A method that cannot take the shape prints ``---``.  The
last lines: per case where ``auto``'s pick is more than 1.5 points under the best, and
the mean of ``auto`` and of the best.  A rate above 102 % of a 512 MiB copy's (the
roofline: a same-size copy of a few MB can run below it, H100: a kernel at 103 % of a
17 MB copy), or an error above 1e-2, stops the run.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import RowSets, kernel_ms  # noqa: E402

from numba_softmax.kernels.softmax import methods  # noqa: E402
from numba_softmax.kernels.rows.epilogue import SOFTMAX  # noqa: E402

PLAN = (("float32", (4096, 6144, 8192, 10240, 12288, 14336, 16384, 20480, 24576, 32768),
         (8, 66, 528, 2048)),
        ("float16", (8192, 10240, 12288, 14336, 16384, 20480, 24576, 32768, 40960),
         (8, 66, 528, 2048)),
        ("float64", (2048, 4096, 6144, 8192), (66, 528, 2048)))
QUICK = (("float32", (10240, 16384, 24576), (66, 2048)), ("float16", (12288, 20480), (66, 2048)))
METHODS = ("fused", "onchip", "cluster", "group", "auto")


def case(dtype, rows, n, roof):
    r = RowSets(rows, n, getattr(torch, dtype))
    copy = r.copy_gbps()
    rec = {"dtype": dtype, "rows": rows, "n": n, "copy": round(copy, 1)}
    for m in METHODS:
        r.ys[0].fill_(float("nan"))
        try:
            ran = methods.launch(m, SOFTMAX, r.nx[0], r.ny[0])
        except ValueError:  # the row does not fit this method
            continue
        err = float((r.ys[0].float() - r.want).abs().max())
        gbps = r.gbps(kernel_ms(lambda i: methods.launch(m, SOFTMAX, r.nx[i], r.ny[i]),
                                r.sets, rounds=3))
        pct = 100 * gbps / copy
        if not err <= 1e-2 or gbps > 1.02 * roof:
            sys.exit(f"{dtype} {rows}x{n} {m}: error {err:.1e}, {gbps:.0f} GB/s against "
                     f"the 512 MiB copy's {roof:.0f} — stopped")
        rec[m] = round(pct, 1)
        if m == "auto":
            rec["auto_ran"] = ran
    return rec


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None, help="JSON lines, one a case")
    p.add_argument("--quick", action="store_true", help="a few cases where the picks changed")
    a = p.parse_args()
    out = open(a.out, "w") if a.out else None
    big = RowSets(16384, 8192, torch.float32)  # 512 MiB
    roof = big.copy_gbps()
    del big
    print(f"{torch.cuda.get_device_name()}; 512 MiB copy {roof:.0f} GB/s; "
          f"% of a same-size copy", flush=True)
    recs = []
    for dtype, ns, rowss in QUICK if a.quick else PLAN:
        for n in ns:
            for rows in rowss:
                rec = case(dtype, rows, n, roof)
                recs.append(rec)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                cells = " | ".join(f"{m if m != 'auto' else 'auto→' + rec['auto_ran']:14} "
                                   + (f"{rec[m]:5.1f}" if m in rec else "  ---")
                                   for m in METHODS)
                print(f"{dtype:8} {rows:5}x{n:6} copy {rec['copy']:5.0f} | {cells}", flush=True)
    best = [max(rec[m] for m in METHODS[:-1] if m in rec) for rec in recs]
    for rec, b in zip(recs, best):
        if rec["auto"] < b - 1.5:
            print(f"auto under the best: {rec['dtype']} {rec['rows']}x{rec['n']} "
                  f"{rec['auto_ran']} {rec['auto']} against {b}")
    print(f"mean over {len(recs)} cases: auto {sum(r['auto'] for r in recs) / len(recs):.1f} %, "
          f"best {sum(best) / len(best):.1f} %")


if __name__ == "__main__":
    main()
