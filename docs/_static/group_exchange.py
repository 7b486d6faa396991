"""Draw the group kernel's exchange (docs/algorithms/group.md): one row, a group of
four blocks, the pieces they keep on chip, the spilled tail, the (m, ℓ) workspace.

    python docs/_static/group_exchange.py      # writes docs/_static/group_exchange.svg
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from _figure import arrow, save  # noqa: E402

BLOCKS = 4
HELD, SPILL = 3.0, 1.0  # widths of one block's held piece and spilled share
COLORS = ["#4C72B0", "#55A868", "#C44E52", "#8172B2"]


def main():
    plt.rcParams["svg.hashsalt"] = "numba_softmax"
    fig, ax = plt.subplots(figsize=(10, 5.6))
    ax.set_xlim(-1.6, BLOCKS * (HELD + SPILL) + 0.4)
    ax.set_ylim(-0.2, 7.4)
    ax.axis("off")

    # the row: held pieces, then the spilled tail cut into one share per block
    y_row = 6.4
    ax.text(-1.5, y_row + 0.25, "x[row, :]", fontsize=10, va="center")
    for b in range(BLOCKS):
        ax.add_patch(Rectangle((b * HELD, y_row), HELD, 0.5, fc=COLORS[b], alpha=0.85, ec="white"))
        ax.text(b * HELD + HELD / 2, y_row + 0.25, f"piece {b}", color="white", ha="center",
                va="center", fontsize=9)
        x0 = BLOCKS * HELD + b * SPILL
        ax.add_patch(Rectangle((x0, y_row), SPILL, 0.5, fc=COLORS[b], alpha=0.35, ec="white",
                               hatch="//"))
    ax.text(BLOCKS * HELD + BLOCKS * SPILL / 2, y_row + 0.75, "spill (only if the row exceeds the "
            "group's shared memory)", ha="center", fontsize=8)

    # the blocks, with their shared memory
    y_blk = 3.9
    for b in range(BLOCKS):
        xc = b * (HELD + SPILL) + 0.4
        ax.add_patch(Rectangle((xc, y_blk), HELD, 1.1, fc="none", ec=COLORS[b], lw=1.5))
        ax.add_patch(Rectangle((xc + 0.15, y_blk + 0.15), HELD - 0.3, 0.45, fc=COLORS[b], alpha=0.85))
        ax.text(xc + HELD / 2, y_blk + 0.37, "shared memory: piece", color="white", ha="center",
                va="center", fontsize=8)
        ax.text(xc + HELD / 2, y_blk + 0.82, f"block {b}:  (m{b}, ℓ{b})", ha="center", fontsize=9)
        arrow(ax, (b * HELD + HELD / 2, y_row), (xc + HELD / 2, y_blk + 1.1), COLORS[b])
        arrow(ax, (BLOCKS * HELD + (b + 0.5) * SPILL, y_row), (xc + HELD - 0.2, y_blk + 1.1),
              COLORS[b], ls="--")
    ax.text(-1.5, y_blk + 0.55, "1. read\nfold, park", fontsize=9, va="center")

    # the workspace and the barrier
    y_ws = 1.9
    ws_x0 = (BLOCKS * (HELD + SPILL)) / 2 - BLOCKS * 0.6
    for b in range(BLOCKS):
        ax.add_patch(Rectangle((ws_x0 + b * 1.2, y_ws), 1.2, 0.5, fc=COLORS[b], alpha=0.6, ec="black"))
        ax.text(ws_x0 + b * 1.2 + 0.6, y_ws + 0.25, f"m{b}, ℓ{b}", ha="center", va="center", fontsize=8)
        xc = b * (HELD + SPILL) + 0.4 + HELD / 2
        arrow(ax, (xc, y_blk), (ws_x0 + b * 1.2 + 0.6, y_ws + 0.5), COLORS[b])
    ax.text(ws_x0 + BLOCKS * 1.2 + 0.2, y_ws + 0.25, "workspace (global memory)", fontsize=8, va="center")
    ax.text(-1.5, y_ws + 0.25, "2. post,\nbarrier", fontsize=9, va="center")
    ax.plot([-0.2, BLOCKS * (HELD + SPILL)], [y_ws - 0.35] * 2, color="black", lw=2)
    ax.text(BLOCKS * (HELD + SPILL), y_ws - 0.25, "counter += 1; wait for a multiple of 4",
            fontsize=8, ha="right")

    # every block reads every state
    y_fold = 0.1
    ax.text(-1.5, y_fold + 0.2, "3. combine\n4. write", fontsize=9, va="center")
    for b in range(BLOCKS):
        xc = b * (HELD + SPILL) + 0.4
        ax.add_patch(Rectangle((xc, y_fold), HELD, 0.45, fc="#eeeeee", ec=COLORS[b]))
        ax.text(xc + HELD / 2, y_fold + 0.22, "fold the 4 states; write",
                ha="center", va="center", fontsize=7.5)
        for k in range(BLOCKS):
            arrow(ax, (ws_x0 + k * 1.2 + 0.6, y_ws - 0.4), (xc + 0.3 + k * 0.8, y_fold + 0.45),
                  COLORS[k], style="->")
    save(fig, __file__)


if __name__ == "__main__":
    main()
