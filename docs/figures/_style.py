"""Shared look of the figures, and the one way they are saved (deterministic SVG: text kept
as text, no date, a fixed hash salt — regenerating an unchanged figure changes no byte)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent

MEMORY = "#8fa8c8"  # global memory (HBM)
CHIP = "#9fd49f"  # registers / shared memory
STATE = "#f5b971"  # an (m, ℓ) or (m, ℓ, O) state
MASK = "#e8a0a0"  # masked / the identity
IDLE = "#eeeeee"  # skipped, empty
INK = "#222222"

plt.rcParams.update({
    "svg.fonttype": "none",
    "svg.hashsalt": "numba-softmax",
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "axes.edgecolor": INK,
    "text.color": INK,
})


def canvas(width, height):
    """A figure whose data coordinates are inches from the bottom left, no axes drawn."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def box(ax, x, y, w, h, text="", color=CHIP, size=9, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=kw.pop("edge", INK),
                           linewidth=kw.pop("lw", 0.8), **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def arrow(ax, x0, y0, x1, y1, color=INK, lw=1.0, style="-|>", **kw):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=9,
                                 color=color, linewidth=lw, shrinkA=0, shrinkB=0, **kw))


def save(fig, name, where=HERE):
    path = Path(where) / name
    fig.savefig(path, metadata={"Date": None}, bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)
    return path
