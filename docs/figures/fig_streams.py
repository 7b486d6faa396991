"""How a softmax kernel streams one row through global memory: three passes, one, or two.

Drawn like the sequence diagram of seed 001 (its Figure 1): global memory on top, the chip
below, time to the right; a down arrow is a chunk read, an up arrow a chunk written, and
the orange boxes are what the chip keeps between chunks.
"""

from _style import CHIP, MEMORY, STATE, arrow, box, canvas, save

MEM_Y, MEM_H = 2.55, 0.4  # the global-memory lane (inches)
CHIP_Y, CHIP_H = 0.8, 0.6  # the on-chip lane
STEP, LEFT = 0.62, 1.15  # width of one chunk step; the lane labels' margin


def _pass(ax, x, title, chunks, read, write, state, note, chain=True):
    """One pass over the row's chunks, from x; returns the x where it ends.  ``state``: the
    label of the box kept on chip after each chunk ("{}" takes the chunk's subscript);
    ``chain``: one running state, carried from box to box."""
    width = STEP * (len(chunks) + 0.4)
    box(ax, x, 0.3, width, 2.95, color="none", edge="#999999", lw=0.6, linestyle="--")
    ax.text(x + width / 2, 3.32, title, ha="center", va="bottom", fontsize=9.5)
    top, low = MEM_Y - 0.03, CHIP_Y + CHIP_H + 0.03
    for k, label in enumerate(chunks):
        cx = x + STEP * (k + 0.7)
        if label == "…":
            ax.text(cx, (top + low) / 2, "…", ha="center", va="center", fontsize=12)
            continue
        if read:
            arrow(ax, cx - 0.09, top, cx - 0.09, low, color="#3b5b8c")
            ax.text(cx - 0.14, (top + low) / 2 + 0.25, f"x{label}", ha="right", fontsize=8,
                    color="#3b5b8c")
        if write:
            arrow(ax, cx + 0.09, low, cx + 0.09, top, color="#2e7d32")
            ax.text(cx + 0.14, (top + low) / 2 - 0.25, f"y{label}", ha="left", fontsize=8,
                    color="#2e7d32")
        if state:
            box(ax, cx - 0.25, CHIP_Y + 0.1, 0.5, CHIP_H - 0.2, state.format(label),
                color=STATE, size=7.5)
            if chain and k:
                arrow(ax, cx - STEP + 0.25, CHIP_Y + CHIP_H / 2, cx - 0.25, CHIP_Y + CHIP_H / 2,
                      lw=0.8)
    ax.text(x + width / 2, 0.42, note, ha="center", va="bottom", fontsize=8, style="italic")
    return x + width + 0.12


def _lanes(ax, width, total):
    box(ax, 0.05, MEM_Y, width - 0.1, MEM_H, "", color=MEMORY, lw=0, zorder=0)
    ax.text(0.12, MEM_Y + MEM_H / 2, "global\nmemory", va="center", fontsize=8.5)
    box(ax, 0.05, CHIP_Y, width - 0.1, CHIP_H, "", color=CHIP, lw=0, zorder=0)
    ax.text(0.12, CHIP_Y + CHIP_H / 2, "on chip", va="center", fontsize=8.5)
    ax.text(width / 2, 0.02, total, va="bottom", ha="center", fontsize=9.5, weight="bold")


def _width(*passes):
    return LEFT + sum(STEP * (n + 0.4) + 0.12 for n in passes) + 0.05


CHUNKS = ["₀", "₁", "…", "ₖ"]


def two_pass():
    """Seed 001's Figure 1: pass 1 streams (m, ℓ), pass 2 streams again and normalises."""
    w = _width(4, 4)
    fig, ax = canvas(w, 3.6)
    x = _pass(ax, LEFT, "pass 1 — fold each chunk into (m, ℓ)", CHUNKS, True, False,
              "(m, ℓ)", "m′ = max(m, m̃),  ℓ = ℓ·e^(m−m′) + ℓ̃·e^(m̃−m′)")
    _pass(ax, x, "pass 2 — normalise with the row's (m, ℓ)", CHUNKS, True, True, None,
          "y = e^(x − m) / ℓ")
    _lanes(ax, w, "N values of b bytes: read 2Nb + write Nb = 3Nb")
    return save(fig, "stream_two_pass.svg")


def three_pass():
    w = _width(4, 4, 4)
    fig, ax = canvas(w, 3.6)
    x = _pass(ax, LEFT, "pass 1 — max", CHUNKS, True, False, "m", "m = max(m, max x)")
    x = _pass(ax, x, "pass 2 — sum against m", CHUNKS, True, False, "ℓ", "ℓ += Σ e^(x − m)")
    _pass(ax, x, "pass 3 — normalise", CHUNKS, True, True, None, "y = e^(x − m) / ℓ")
    _lanes(ax, w, "N values of b bytes: read 3Nb + write Nb = 4Nb")
    return save(fig, "stream_three_pass.svg")


def fused():
    w = _width(4, 4)
    fig, ax = canvas(w, 3.6)
    x = _pass(ax, LEFT, "read the row once, into registers", CHUNKS, True, False, "x{}",
              "then m = max, ℓ = Σ e^(x − m), the block tree", chain=False)
    _pass(ax, x, "write from registers", CHUNKS, False, True, "x{}", "y = e^(x − m) / ℓ",
          chain=False)
    _lanes(ax, w, "N values of b bytes: read Nb + write Nb = 2Nb")
    return save(fig, "stream_fused.svg")


def make():
    return [two_pass(), three_pass(), fused()]
