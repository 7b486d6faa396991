"""Warp-stall samples per source line from ``ncu --page source --csv --print-source cuda``.

    python scripts/experiments/ncu_lines.py FILE.csv [--top 40]

Sums the first column whose name starts with "Warp Stall Sampling (All" per (file, line)
and prints the top lines with their share of the kernel's samples and the source text.
"""

import argparse
import csv
import collections


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    totals, text, header, path = collections.Counter(), {}, None, "?"
    with open(a.csv, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0].startswith(("File Path", "File Name")) or (len(row) == 1 and "/" in row[0]):
                path = row[-1] if len(row) > 1 else row[0]
                header = None
                continue
            if header is None and any(c.startswith("Warp Stall Sampling (All") for c in row):
                header = row
                col = next(i for i, c in enumerate(row) if c.startswith("Warp Stall Sampling (All"))
                src = next((i for i, c in enumerate(row) if c.strip().lower() == "source"), 1)
                line = next((i for i, c in enumerate(row) if c.strip() in ("#", "Line No")), 0)
                print("columns:", row[:6])
                continue
            if header is None or len(row) <= col:
                continue
            try:
                n = float(row[col].replace(",", "") or 0)
            except ValueError:
                continue
            key = (path.split("/")[-1], row[line])
            totals[key] += n
            text[key] = row[src].strip()[:110]
    whole = sum(totals.values()) or 1
    print(f"{whole:.0f} samples")
    for (path, line), n in totals.most_common(a.top):
        print(f"{100 * n / whole:5.1f}%  {path}:{line:>5}  {text[(path, line)]}")


if __name__ == "__main__":
    main()
