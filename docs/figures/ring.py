"""Draw the ring-attention figure and print a ring's steps, for docs/algorithms/ring.md.

    python docs/figures/ring.py        # writes docs/figures/ring.svg and ring_steps.txt

``ring.svg`` is drawn from the schedule itself (:func:`numba_softmax.ring.step_pairs`):
(a) the zigzag layout of 2P chunks over P = 4 ranks; (b) the causal (query chunk, key
chunk) blocks, each coloured by the rank that computes it and labelled with the step;
(c) the same for contiguous shards.  ``ring_steps.txt`` is the output of an in-process
ring of 3 ranks on the CUDA simulator (the device kernels, float32): every step's partial
(LSE, O) of one query row per rank, and the running (LSE, O) after the merge.  Nothing is typed by
hand; both files are committed.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba is imported
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

import numpy as np  # noqa: E402

from numba_softmax import reference as R  # noqa: E402
from numba_softmax import ring  # noqa: E402

COLOURS = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
           "#999999"]  # Okabe–Ito: one per rank
CELL = 34


def text(x, y, s, size=13, anchor="middle", weight="normal"):
    return (f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" font-family="sans-serif">{s}</text>')


def rect(x, y, w, h, fill, stroke="#333"):
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}" stroke="{stroke}"/>'


def blocks(layout, chunk):
    """{(query chunk, key chunk): (rank, step, whole block?)} from the schedule."""
    out = {}
    for row in ring.schedule(layout, True):
        for st in row:
            qrows, krows, mask = ring.step_pairs(layout, st)
            for i, j in zip(*np.nonzero(mask)):
                key = (qrows[i] // chunk, krows[j] // chunk)
                assert out.get(key, (st.rank, st.t))[:2] == (st.rank, st.t)  # computed once
                out[key] = (st.rank, st.t, key[0] != key[1])
    return out


def grid(x0, y0, layout, chunk, title):
    """The causal block grid: rows = query chunks, columns = key chunks."""
    n = layout.total // chunk
    parts = [text(x0 + n * CELL / 2, y0 - 30, title, 14, weight="bold")]
    for c in range(n):
        parts.append(text(x0 + c * CELL + CELL / 2, y0 - 8, f"c{c}", 11))  # key chunks
        parts.append(text(x0 - 8, y0 + c * CELL + CELL / 2 + 4, f"c{c}", 11, "end"))
        parts += [rect(x0 + d * CELL, y0 + c * CELL, CELL, CELL, "white", "#ccc")
                  for d in range(n)]
    for (qc, kc), (rank, t, whole) in blocks(layout, chunk).items():
        x, y = x0 + kc * CELL, y0 + qc * CELL
        if whole:
            parts.append(rect(x, y, CELL, CELL, COLOURS[rank]))
            parts.append(text(x + CELL / 2, y + CELL / 2 + 5, str(t), 12))
        else:  # a diagonal block: its lower triangle
            parts.append(f'<polygon points="{x},{y} {x},{y + CELL} {x + CELL},{y + CELL}" '
                         f'fill="{COLOURS[rank]}" stroke="#333"/>')
            parts.append(text(x + CELL / 3, y + 2 * CELL / 3 + 5, str(t), 12))
    parts.append(text(x0 + n * CELL / 2, y0 + n * CELL + 20,
                      "rows: query chunks, columns: key chunks, number: the step", 12))
    return parts


def svg(world=4, chunk=2):
    total = 2 * world * chunk
    zz = ring.zigzag(total, world)
    width, parts = 2 * (2 * world * CELL) + 420, []
    # (a) the layout: chunk c belongs to the rank that holds it
    owner = {c: r for r in range(world) for c in (r, 2 * world - 1 - r)}
    parts.append(text(20, 24, f"(a) zigzag: the sequence in {2 * world} chunks, rank r holds "
                              f"c_r and c_(2P−1−r) — P = {world}", 14, "start", "bold"))
    for c in range(2 * world):
        parts.append(rect(20 + c * 1.5 * CELL, 36, 1.5 * CELL, 28, COLOURS[owner[c]]))
        parts.append(text(20 + c * 1.5 * CELL + 0.75 * CELL, 55, f"c{c}", 12))
    x = 20 + 2 * world * 1.5 * CELL + 30
    parts.append(text(x, 55, "shards: " + ",  ".join(
        f"rank {r} = c{r} c{2 * world - 1 - r}" for r in range(world)), 12, "start"))
    parts.append(text(20, 88, "the ring: " + " → ".join(f"rank {r}" for r in range(world))
                      + " → rank 0;  at step t rank r holds the K/V shard of rank "
                      "(r − t) mod P",
                      12, "start"))
    y0 = 150
    parts += grid(110, y0, zz, chunk, "(b) zigzag, causal: every rank, every step, equal work")
    parts += grid(110 + 2 * world * CELL + 200, y0,
                  ring.contiguous([2 * chunk] * world), chunk,
                  "(c) contiguous shards: rank P−1 works 2P−1 times as much")
    for r in range(world):
        parts.append(rect(110 + r * 110, y0 + 2 * world * CELL + 36, 18, 18, COLOURS[r]))
        parts.append(text(134 + r * 110, y0 + 2 * world * CELL + 50, f"rank {r}", 12, "start"))
    height = y0 + 2 * world * CELL + 70
    body = "\n".join(parts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">\n<rect width="100%" height="100%" fill="white"/>\n'
            f"{body}\n</svg>\n")


def steps_text(world=3, total=12, d=4):
    """An in-process ring on the simulator, two query rows followed through every step."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, total, d)).astype(np.float32) for _ in range(3))
    layout = ring.zigzag(total, world)
    follow = {r: int(layout.length(r) - 1) for r in range(world)}  # each rank's last row
    seen, last = {}, {}  # per rank: this step's partial LSE, the running LSE before it
    lines = [f"An in-process ring: P = {world} virtual ranks, S = {total}, D = {d}, causal "
             f"(zigzag), float32, the device kernels on the CUDA simulator.",
             "Shards (global rows): " + ";  ".join(
                 f"rank {r}: {layout.rows(r).tolist()}" for r in range(world)), ""]

    def hook(phase, st, arrays):
        if phase == "begin":
            qrows, krows = layout.rows(st.rank)[st.q], layout.rows(st.source)[st.k]
            lines.append(f"step {st.t}, rank {st.rank}: holds the K/V of rank {st.source}; "
                         f"{st.kind}: queries {qrows.tolist()} × keys {krows.tolist()}"
                         f"{' (causal)' if st.causal else ''}")
            return
        o, lse = arrays
        i, row = follow[st.rank], layout.rows(st.rank)[follow[st.rank]]
        note = ""
        if phase == "computed":
            if not st.q.start <= i < st.q.stop:
                lines.append(f"    row {row}: not among this step's queries")
                seen[st.rank] = None
                return
            i -= st.q.start
            seen[st.rank] = float(lse[0, i])
        elif st.t > 0 and seen[st.rank] is not None:  # the combiner's two weights
            new = float(lse[0, i])
            w_old, w_t = np.exp(last[st.rank] - new), np.exp(seen[st.rank] - new)
            note = (f"   weights exp(LSE_before − LSE) = {w_old:.3f}, "
                    f"exp(LSE_t − LSE) = {w_t:.3f}")
        if phase == "merged":
            last[st.rank] = float(lse[0, i])
            if st.t > 0 and seen[st.rank] is None:
                return
        what = "partial (LSE_t, O_t)" if phase == "computed" else "merged  (LSE, O)    "
        lines.append(f"    row {row}: {what} = ({float(lse[0, i]):7.4f}, "
                     f"[{float(o[0, i, 0]):7.4f}, {float(o[0, i, 1]):7.4f}, …]){note}")

    o, lse, _ = ring.virtual_ring_attention(q, k, v, world, causal=True, hook=hook)
    ref_o, ref_lse = R.attention(q, k, v, causal=True, return_lse=True)
    lines += ["", "The whole sequence, unsharded, against the float64 reference:",
              f"    max |O − O_fp64| = {np.abs(o - ref_o).max():.1e},  "
              f"max |LSE − LSE_fp64| = {np.abs(lse - ref_lse).max():.1e}"]
    for r in range(world):
        g = layout.rows(r)[follow[r]]
        lines.append(f"    row {g}: float64 reference (LSE, O) = ({ref_lse[0, g]:7.4f}, "
                     f"[{ref_o[0, g, 0]:7.4f}, {ref_o[0, g, 1]:7.4f}, …])")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    (HERE / "ring.svg").write_text(svg(), encoding="utf-8")
    (HERE / "ring_steps.txt").write_text(steps_text(), encoding="utf-8")
    print((HERE / "ring_steps.txt").read_text(encoding="utf-8"))
