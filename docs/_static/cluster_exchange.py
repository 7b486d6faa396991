"""Draw the cluster kernel's exchange (docs/algorithms/cluster.md): one row, a cluster of
four blocks on one GPC, the pieces parked in their shared memory, each block's (m, ℓ)
written into a slot of every block's shared memory, the cluster barrier.

    python docs/_static/cluster_exchange.py    # writes docs/_static/cluster_exchange.svg
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from _figure import arrow, save  # noqa: E402

BLOCKS = 4
W = 3.2  # a block's width
GAP = 0.6
COLORS = ["#4C72B0", "#55A868", "#C44E52", "#8172B2"]


def slot_x(block, slot):
    return block * (W + GAP) + 0.3 + slot * (W - 0.6) / BLOCKS


def main():
    plt.rcParams["svg.hashsalt"] = "numba_softmax"
    fig, ax = plt.subplots(figsize=(10, 5.6))
    span = BLOCKS * (W + GAP) - GAP
    ax.set_xlim(-1.8, span + 0.3)
    ax.set_ylim(-0.3, 7.4)
    ax.axis("off")

    # the row, cut into one piece a block
    y_row = 6.5
    ax.text(-1.7, y_row + 0.25, "x[row, :]", fontsize=10, va="center")
    piece = span / BLOCKS
    for b in range(BLOCKS):
        ax.add_patch(Rectangle((b * piece, y_row), piece, 0.5, fc=COLORS[b], alpha=0.85, ec="white"))
        ax.text(b * piece + piece / 2, y_row + 0.25, f"piece {b}", color="white", ha="center",
                va="center", fontsize=9)

    # the cluster: four blocks on one GPC, each with its piece and four slots
    y_blk = 3.0
    ax.add_patch(Rectangle((-0.25, y_blk - 0.35), span + 0.5, 2.55, fc="none", ec="gray",
                           ls="--", lw=1.0))
    ax.text(span + 0.2, y_blk + 2.3, "one cluster = one GPC (hardware-scheduled together)",
            fontsize=8, ha="right", color="gray")
    for b in range(BLOCKS):
        x0 = b * (W + GAP)
        ax.add_patch(Rectangle((x0, y_blk), W, 1.8, fc="none", ec=COLORS[b], lw=1.5))
        ax.text(x0 + W / 2, y_blk + 1.55, f"block {b} (rank {b})", ha="center", fontsize=9)
        ax.add_patch(Rectangle((x0 + 0.15, y_blk + 0.85), W - 0.3, 0.45, fc=COLORS[b], alpha=0.85))
        ax.text(x0 + W / 2, y_blk + 1.07, "shared: piece", color="white", ha="center",
                va="center", fontsize=8)
        for k in range(BLOCKS):  # the slots m[k], ℓ[k] of this block's shared memory
            ax.add_patch(Rectangle((slot_x(b, k), y_blk + 0.15), (W - 0.6) / BLOCKS, 0.45,
                                   fc=COLORS[k], alpha=0.45, ec="black", lw=0.6))
            ax.text(slot_x(b, k) + (W - 0.6) / BLOCKS / 2, y_blk + 0.37, f"{k}", ha="center",
                    va="center", fontsize=7)
        arrow(ax, (b * piece + piece / 2, y_row), (x0 + W / 2, y_blk + 1.8), COLORS[b])
    ax.text(-1.7, y_blk + 1.05, "1. read\nfold, park", fontsize=9, va="center")

    # block 1's state into slot 1 of every block (the others alike)
    src = 1
    for b in range(BLOCKS):
        tx = slot_x(b, src) + (W - 0.6) / BLOCKS / 2
        arrow(ax, (src * (W + GAP) + W / 2, y_blk + 0.85), (tx, y_blk + 0.6), COLORS[src],
              style="-|>", lw=1.2)
    ax.text(-1.7, y_blk + 0.3, "2. exchange\nslots (m_r, ℓ_r)", fontsize=9, va="center")
    ax.text(span / 2, y_blk - 0.75, "block 1 writes (m₁, ℓ₁) into slot 1 of every block: "
            "mapa + st.shared::cluster  (every block does the same for its own slot)",
            ha="center", fontsize=8, color=COLORS[src])

    # the cluster barrier, then each block folds its own slots and writes
    y_bar = 1.5
    ax.plot([-0.2, span + 0.2], [y_bar] * 2, color="black", lw=2)
    ax.text(span + 0.2, y_bar + 0.12, "barrier.cluster (release / acquire)", fontsize=8, ha="right")
    y_fold = 0.1
    ax.text(-1.7, y_fold + 0.25, "3. combine\n4. write", fontsize=9, va="center")
    for b in range(BLOCKS):
        x0 = b * (W + GAP)
        ax.add_patch(Rectangle((x0, y_fold), W, 0.5, fc="#eeeeee", ec=COLORS[b]))
        ax.text(x0 + W / 2, y_fold + 0.25, "fold slots 0…3; normalise piece",
                ha="center", va="center", fontsize=7.5)
        arrow(ax, (x0 + W / 2, y_blk - 0.35), (x0 + W / 2, y_fold + 0.5), COLORS[b], style="->")
    save(fig, __file__)


if __name__ == "__main__":
    main()
