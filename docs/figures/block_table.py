#!/usr/bin/env python
"""Draw the paged KV cache's block table, for docs/algorithms/paged.md (no dependencies).

    python docs/figures/block_table.py        # writes docs/figures/block_table.svg

Two sequences share a two-block prompt; each then owns blocks of its own, anywhere in
the pool; the last block of each is partly filled.  Arrows go from table entries to the
blocks they name.
"""

import sys
from pathlib import Path

BS = 4  # block size
POOL = 10  # blocks in the pool
SEQS = {"sequence 0": ([7, 2, 5, 0], 14), "sequence 1": ([7, 2, 9], 10)}  # table row, length
CELL, GAP = 22, 6
COLORS = {7: "#8ecae6", 2: "#8ecae6", 5: "#ffb703", 0: "#ffb703", 9: "#90be6d"}


def rect(x, y, w, h, fill, stroke="#333"):
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}" stroke="{stroke}"/>'


def text(x, y, s, size=12, anchor="middle"):
    return (f'<text x="{x}" y="{y}" font-family="sans-serif" font-size="{size}" '
            f'text-anchor="{anchor}">{s}</text>')


def figure():
    out = []
    # the block tables, left
    out.append(text(20, 24, "block_table[b, :]", 13, "start"))
    rows_y = {}
    for r, (name, (row, length)) in enumerate(SEQS.items()):
        y = 50 + r * 70
        rows_y[name] = y
        out.append(text(20, y - 8, f"{name}: cache_seqlens = {length}", 11, "start"))
        for j, blk in enumerate(row):
            out.append(rect(20 + j * (CELL + 10), y, CELL + 10, CELL, COLORS[blk]))
            out.append(text(20 + j * (CELL + 10) + (CELL + 10) / 2, y + 15, blk))
    # the pool, right: POOL blocks of BS rows
    px, py = 250, 40
    out.append(text(px - 20, 24, f"k_cache: {POOL} blocks of {BS} rows (× Hkv × D)", 13, "start"))
    filled = {}
    for name, (row, length) in SEQS.items():
        for j, blk in enumerate(row):
            filled[blk] = max(filled.get(blk, 0), min(BS, length - j * BS))
    for i in range(POOL):
        y = py + i * (CELL + GAP)
        out.append(text(px - 8, y + 15, i, 11, "end"))
        for r in range(BS):
            fill = COLORS.get(i, "#f4f4f4") if r < filled.get(i, 0) else "#ffffff"
            out.append(rect(px + r * CELL, y, CELL, CELL, fill))
    # beside each block: whose positions it holds
    for i in range(POOL):
        owners = [(name.split()[-1], j) for name, (row, _) in SEQS.items() for j, blk in enumerate(row) if blk == i]
        if owners:
            j = owners[0][1]
            who = " and ".join(o for o, _ in owners)
            label = f"← sequence{'s' if len(owners) > 1 else ''} {who}, positions {j * BS}–{j * BS + BS - 1}"
            out.append(text(px + BS * CELL + 8, py + i * (CELL + GAP) + 15, label, 11, "start"))
    bottom = py + POOL * (CELL + GAP) + 16
    for i, line in enumerate(["Position p of sequence b lives in block block_table[b, p // block_size], row "
                              "p % block_size.", "Blocks 7 and 2 hold the prompt both sequences share; "
                              "white rows are free (room to append)."]):
        out.append(text(20, bottom + 17 * i, line, 11, "start"))
    width, height = 640, bottom + 30
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">')
    return head + "".join(out) + "</svg>\n"


def main(argv=None):
    target = Path(__file__).resolve().parent / "block_table.svg"
    target.write_text(figure())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
