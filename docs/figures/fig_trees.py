"""Reduction trees: the warp butterfly, the block tree of ``kernels/rows/reduce.py``, and seed
004's shared-memory halving tree (for the side-by-side on the reduction page)."""

import matplotlib.pyplot as plt

from _style import CHIP, IDLE, INK, MASK, STATE, arrow, box, canvas, save

WARP = 32


def butterfly():
    """32 lanes, five ``shfl_xor_sync`` levels: lane i meets lane i XOR offset.  A lane's
    colour is the set of lanes its state covers (lanes ≡ i mod offset agree)."""
    dx, dy, left = 0.27, 0.78, 1.45
    fig, ax = canvas(left + WARP * dx + 0.2, 6 * dy + 0.45)
    cmap = plt.get_cmap("tab20")
    offsets = [WARP, 16, 8, 4, 2, 1]  # "WARP": before the first exchange, every lane alone
    for level, o in enumerate(offsets):
        y = (5 - level) * dy + 0.35
        label = "own state" if level == 0 else f"offset {o}"
        cover = 1 if level == 0 else WARP // o
        ax.text(0.05, y, f"{label}\n{cover} lane{'s' if cover > 1 else ''} per state",
                va="center", fontsize=8)
        for i in range(WARP):
            x = left + i * dx
            color = cmap((i % o) % 20) if level else "#dddddd"
            if level == 5:
                color = STATE
            ax.add_patch(plt.Circle((x, y), 0.09, facecolor=color, edgecolor=INK, lw=0.5,
                                    zorder=3))
            if level:  # own state (straight down) ⊕ the partner's (across)
                p = i ^ o
                ax.plot([x, x], [y + dy, y], color="#cccccc", lw=0.45, zorder=1)
                ax.plot([left + p * dx, x], [y + dy, y], color="#777777", lw=0.45, zorder=1)
    for i in range(0, WARP, 4):
        ax.text(left + i * dx, 5 * dy + 0.6, str(i), ha="center", fontsize=7)
    ax.text(left + 15.5 * dx, 5 * dy + 0.78, "lane", ha="center", fontsize=8)
    return save(fig, "warp_butterfly.svg")


def block_tree(warps=8):
    """Level 2 of ``block_combine``: lane 0 of each warp posts to a 32-slot array, the
    unused slots hold the identity, every warp runs the butterfly over the 32 slots."""
    fig, ax = canvas(9.4, 3.9)
    w, gap, x0 = 0.95, 0.12, 0.35
    for k in range(warps):
        x = x0 + k * (w + gap)
        box(ax, x, 2.9, w, 0.55, f"warp {k}\nbutterfly", color=CHIP, size=7.5)
        arrow(ax, x + 0.15, 2.9, 0.55 + k * 0.26 + 0.1, 1.95, lw=0.7)
        box(ax, x, 0.35, w, 0.55, f"warp {k}\nbutterfly", color=CHIP, size=7.5)
    ax.text(x0, 3.6, "1. each warp folds its 32 lanes (5 shuffles); lane 0 posts the warp's state",
            fontsize=8.5)
    for s in range(WARP):
        color = STATE if s < warps else MASK
        box(ax, 0.55 + s * 0.26, 1.55, 0.26, 0.38, str(s) if s < 10 or s % 5 == 0 else "",
            color=color, size=6.5, lw=0.5)
    ax.text(0.55 + WARP * 0.26 + 0.12, 1.74, "32 slots in shared memory\n(red: the identity "
            "(−∞, 0),\nwhich weighs nothing)", va="center", fontsize=7.5)
    ax.plot([0.2, 9.2], [1.35, 1.35], color=INK, lw=0.9, ls="--")
    ax.text(9.2, 1.22, "syncthreads", ha="right", va="top", fontsize=7.5)
    for k in range(warps):
        x = x0 + k * (w + gap)
        arrow(ax, x + w / 2, 1.55, x + w / 2, 0.9, lw=0.7)
    ax.text(x0, 0.02, "2. every warp reads all 32 slots and runs the same butterfly: every "
            "thread ends with the block's (m, ℓ)\n    (a second syncthreads keeps a later call "
            "from overwriting the slots while a warp still reads them)", fontsize=8.5)
    return save(fig, "block_tree.svg")


def halving_tree(slots=16):
    """Seed 004's tree: T slots (512 there, 16 drawn); at offset T/2, …, 1 slot t takes
    slot t + offset; a barrier after each level."""
    levels = slots.bit_length() - 1
    dx, dy = 0.42, 0.62
    fig, ax = canvas(slots * dx + 2.3, (levels + 1) * dy + 0.7)
    left = 0.3
    offset = slots
    for level in range(levels + 1):
        y = (levels - level) * dy + 0.35
        live = slots if level == 0 else offset
        for t in range(slots):
            color = STATE if t < live else IDLE
            box(ax, left + t * dx, y, dx - 0.06, 0.3, str(t), color=color, size=7, lw=0.5)
        if level:
            for t in range(offset):
                ax.plot([left + t * dx + 0.18] * 2, [y + dy, y + 0.3], color="#cccccc", lw=0.5)
                arrow(ax, left + (t + offset) * dx + 0.18, y + dy, left + t * dx + 0.18, y + 0.3,
                      lw=0.6, color="#555555")
            ax.plot([left - 0.1, left + slots * dx], [y + 0.45, y + 0.45], color=INK, lw=0.5,
                    ls=":")
        label = "posted, barrier" if level == 0 else f"offset {offset}, barrier"
        ax.text(left + slots * dx + 0.1, y + 0.15, label, va="center", fontsize=8)
        offset //= 2
    ax.text(left, (levels + 1) * dy + 0.3, f"{slots} slots drawn (seed 004: 512 slots, "
            "log₂ 512 = 9 levels, 10 barriers); then every thread reads slot 0", fontsize=8.5)
    return save(fig, "halving_tree.svg")


def make():
    return [butterfly(), block_tree(), halving_tree()]

