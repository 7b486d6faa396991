"""What the figure scripts beside this file share: an arrow, and saving a figure as a
reproducible SVG next to the script that drew it."""

from pathlib import Path

from matplotlib.patches import FancyArrowPatch


def arrow(ax, a, b, color="black", style="-|>", ls="-", lw=1.0):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=10, color=color,
                                 lw=lw, linestyle=ls, shrinkA=2, shrinkB=2))


def save(fig, script):
    """``script``.svg, with no date in it (the same drawing, the same bytes)."""
    fig.tight_layout()
    out = Path(script).with_suffix(".svg")
    fig.savefig(out, metadata={"Date": None})
    print(out)
