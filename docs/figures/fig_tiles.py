"""Tiles: FlashAttention's loop over K/V, the causal tile skip, split-KV and split-row."""

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from _style import CHIP, IDLE, INK, MEMORY, STATE, arrow, box, canvas, save


def flash_loop(tr=4, tc=6, i=1, j=2):
    """One block (query tile i) streams the key tiles j past its (m, ℓ, O) rows."""
    fig, ax = canvas(9.6, 4.15)
    cw, ch = 0.72, 0.62  # one tile of S (Br × Bc) drawn
    gx, gy = 1.55, 0.45  # the grid's bottom-left
    top = gy + tr * ch
    for r in range(tr):
        for c in range(tc):
            y = top - (r + 1) * ch
            if r == i:
                color = STATE if c == j else (CHIP if c < j else "#f7f7f7")
            else:
                color = "white"
            box(ax, gx + c * cw, y, cw, ch, color=color, lw=0.5)
    yi = top - (i + 1) * ch
    ax.text(gx + j * cw + cw / 2, yi + ch / 2, "S = scale·\nQᵢ Kⱼᵀ", ha="center", va="center",
            fontsize=7.5)
    for c in range(j):
        ax.text(gx + c * cw + cw / 2, yi + ch / 2, "folded", ha="center", va="center",
                fontsize=7, color="#2e5e2e")
    ax.text(gx + tc * cw / 2, gy - 0.3, "S = scale·Q Kᵀ (Sq × Sk): never stored — one Br × Bc "
            "tile at a time, on chip", ha="center", fontsize=8, style="italic")
    # Q tiles on the left, Kᵀ tiles on top, V tiles (as rows) above them
    for r in range(tr):
        box(ax, gx - 0.55, top - (r + 1) * ch, 0.4, ch, "Qᵢ" if r == i else "",
            color=MEMORY if r == i else "white", lw=0.5, size=8)
    ax.text(gx - 0.35, top + 0.1, "Q", ha="center", fontsize=9)
    for c in range(tc):
        box(ax, gx + c * cw, top + 0.15, cw, 0.35, "Kⱼᵀ" if c == j else "",
            color=MEMORY if c == j else "white", lw=0.5, size=8)
        box(ax, gx + c * cw, top + 0.62, cw, 0.35, "Vⱼ" if c == j else "",
            color=MEMORY if c == j else "white", lw=0.5, size=8)
    ax.text(gx - 0.1, top + 0.32, "Kᵀ", ha="right", va="center", fontsize=9)
    ax.text(gx - 0.1, top + 0.8, "V", ha="right", va="center", fontsize=9)
    arrow(ax, gx + tc * cw + 0.05, top + 0.55, gx + tc * cw + 0.6, top + 0.55, lw=0.8)
    ax.text(gx + tc * cw + 0.65, top + 0.55, "j = 0, 1, …, Tc − 1", va="center", fontsize=8)
    # the state of query tile i's rows
    sx = gx + tc * cw + 0.3
    for k, (name, wdt) in enumerate([("m", 0.3), ("ℓ", 0.3), ("O", 0.9)]):
        x = sx + [0, 0.36, 0.72][k]
        box(ax, x, yi, wdt, ch, name, color=STATE, lw=0.6, size=9)
    ax.text(sx + 0.81, yi + ch + 0.08, "per row of Qᵢ, on chip", ha="center", fontsize=7.5)
    steps = ["for each key tile j (one block per query tile i):",
             "· S = scale · Qᵢ Kⱼᵀ   (Br × Bc; masked scores = −∞)",
             "· m′ = max(m, rowmax S)",
             "· α = e^(m − m′),  P = e^(S − m′)",
             "· ℓ = α ℓ + rowsum P",
             "· O = α O + P Vⱼ",
             "· m = m′",
             "then Oᵢ = O / ℓ,  LSEᵢ = m + log ℓ"]
    ax.text(sx - 0.05, gy + 0.05, "\n".join(steps), fontsize=7.5, va="bottom",
            linespacing=1.35)
    return save(fig, "flash_tile_loop.svg")


def tile_kinds(sq, sk, br, bc):
    """For each (query tile, key tile): "full", "masked" or "skipped", from the reference's
    causal mask (query i sees key j iff j <= i + Sk − Sq).  The kernel's rule is the same:
    it visits a key tile iff the tile's last row sees a key in it, and masks it unless its
    first row sees all of them."""
    from numba_softmax.reference import visible

    seen = visible(sq, sk, causal=True)
    kinds = []
    for i0 in range(0, sq, br):
        row = []
        for j0 in range(0, sk, bc):
            tile = seen[i0 : i0 + br, j0 : j0 + bc]
            row.append("full" if tile.all() else "masked" if tile.any() else "skipped")
        kinds.append(row)
    return kinds


def causal(cases=((256, 256, 64, 32), (128, 320, 64, 32))):
    colors = {"full": CHIP, "masked": STATE, "skipped": IDLE}
    fig, axes = plt.subplots(1, len(cases), figsize=(10, 3.4),
                             gridspec_kw={"width_ratios": [c[1] for c in cases]})
    for ax, (sq, sk, br, bc) in zip(axes, cases):
        kinds = tile_kinds(sq, sk, br, bc)
        for r, row in enumerate(kinds):
            for c, kind in enumerate(row):
                ax.add_patch(Rectangle((c * bc, r * br), bc, br, facecolor=colors[kind],
                                       edgecolor=INK, lw=0.5))
        shift = sk - sq
        ax.plot([max(0, shift), shift + sq], [max(0, -shift), sq], color="#b22222", lw=1.2)
        ax.set_xlim(0, sk)
        ax.set_ylim(sq, 0)
        ax.set_aspect("equal")
        ax.set_xlabel("key j", fontsize=8)
        ax.set_ylabel("query i", fontsize=8)
        ax.tick_params(labelsize=7)
        flat = [k for row in kinds for k in row]
        ax.set_title(f"Sq = {sq}, Sk = {sk}, Br × Bc = {br} × {bc}:\n"
                     f"{flat.count('skipped')} of {len(flat)} tiles skipped", fontsize=8.5)
    handles = [Rectangle((0, 0), 1, 1, facecolor=colors[k], edgecolor=INK, lw=0.5)
               for k in ("full", "masked", "skipped")]
    fig.legend(handles, ["computed, no mask", "computed with the mask (−∞ above the line)",
                         "never visited"], loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    fig.subplots_adjust(bottom=0.22, wspace=0.25)
    return save(fig, "causal_tiles.svg")


SUB = "₀₁₂₃₄₅₆₇₈₉"


def _split(name, title, what, parts, partial, merge, result, note):
    """``what``/``partial``: labels with ``{z}`` (the index) and ``{s}`` (its subscript)."""
    fig, ax = canvas(9.4, 3.4)
    x0, width = 0.3, 8.0
    seg = width / parts
    ax.text(x0, 3.15, title, fontsize=9)
    for z in range(parts):
        x = x0 + z * seg
        box(ax, x, 2.45, seg, 0.45, what.format(z=z, z1=z + 1, s=SUB[z]), color=MEMORY,
            lw=0.6, size=8)
        box(ax, x + 0.15, 1.55, seg - 0.3, 0.5, f"block {z}", color=CHIP, size=8)
        arrow(ax, x + seg / 2, 2.45, x + seg / 2, 2.05, lw=0.8)
        box(ax, x + 0.3, 0.85, seg - 0.6, 0.38, partial.format(s=SUB[z]), color=STATE,
            size=8)
        arrow(ax, x + seg / 2, 1.55, x + seg / 2, 1.23, lw=0.8)
        arrow(ax, x + seg / 2, 0.85, x0 + width / 2, 0.52, lw=0.6, color="#666666")
    box(ax, x0 + width / 2 - 2.4, 0.05, 4.8, 0.47, merge, color=CHIP, size=8)
    ax.text(x0 + width + 0.15, 0.28, result, va="center", fontsize=8)
    ax.text(x0 + width + 0.15, 1.04, note, va="center", fontsize=7.5, style="italic")
    return save(fig, name)


def split_kv():
    return _split("split_kv.svg", "one query row (decoding: Sq = 1) against a KV cache cut "
                  "into Z = 4 ranges of C keys; kernel 1: block z attends to range z only",
                  "K, V rows [{z}C, {z1}C)", 4, "(O{s}, LSE{s})",
                  "kernel 2: m = max LSE_z,  ℓ = Σ e^(LSE_z − m),  o = Σ e^(LSE_z − m)·O_z / ℓ",
                  "→ (o, LSE = m + log ℓ)", "float32\nworkspace")


def split_row():
    return _split("split_row.svg", "kernel 1: block s folds its piece of the row into "
                  "(mₛ, ℓₛ); kernel 2: every block folds all S states, then normalises "
                  "its piece", "row piece {z}", 4, "(m{s}, ℓ{s})",
                  "kernel 2, block s: (m, ℓ) = fold of all S states; "
                  "re-read piece s, write e^(x − m)/ℓ",
                  "→ y, piece by piece", "workspace:\n8·S bytes a row")


def make():
    return [flash_loop(), causal(), split_kv(), split_row()]

