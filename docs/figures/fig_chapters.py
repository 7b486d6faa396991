"""The later chapters: an mma accumulator fragment, the backward's tile order, the top-k fold."""

from _style import CHIP, IDLE, MEMORY, STATE, arrow, box, canvas, save

QUADS = ["#cfe3f7", "#f7e0c4", "#d7efd2", "#efd2ea", "#f5f0c4", "#d2ecec", "#e8dccf", "#dcdcef"]


def mma_fragment():
    """Which lane holds which element of a 16×8 float32 accumulator (C, D of m16n8k16)."""
    fig, ax = canvas(9.6, 4.6)
    cw, ch, gx, gy = 0.62, 0.24, 0.75, 0.3
    top = gy + 16 * ch
    for r in range(16):
        g = r % 8
        for c in range(8):
            lane, reg = 4 * g + c // 2, (c % 2) + (2 if r >= 8 else 0)
            box(ax, gx + c * cw, top - (r + 1) * ch, cw, ch, f"T{lane} c{reg}",
                color=QUADS[g], lw=0.4, size=6.5)
        ax.text(gx - 0.08, top - (r + 0.5) * ch, f"row {r}", ha="right", va="center", fontsize=6.5)
    for c in range(8):
        ax.text(gx + (c + 0.5) * cw, top + 0.08, f"n {c}", ha="center", fontsize=6.5)
    ax.text(gx + 4 * cw, top + 0.3, "C (16 × 8 float32): lane T = 4g + t holds rows g and g + 8, "
            "columns 2t, 2t + 1", ha="center", fontsize=8)
    x = gx + 8 * cw + 0.35
    notes = ["g = lane >> 2 (its quad, one colour), t = lane % 4",
             "",
             "A row of S lives in the 4 lanes of one quad:",
             "  row max  m̃: each lane maxes its c0, c1 over the Bc/8 tiles,",
             "           then shfl_xor 1, shfl_xor 2 (2 shuffles, no shared memory)",
             "  row sum  ℓ̃ the same way",
             "",
             "A warp owns 16 query rows: a 16 × Bc tile of S is Bc/8",
             "such accumulators, 4·Bc/8 registers a lane.",
             "",
             "Two neighbouring n8 tiles (cols 16j … 16j + 15) are laid out",
             "exactly as one k16 A operand: P = exp(S − m) is packed to",
             "fp16/bf16 in place and multiplies V — it never leaves the",
             "registers (FlashAttention-2's P·V)."]
    ax.text(x, top - 0.05, "\n".join(notes), va="top", fontsize=7.8, linespacing=1.4)
    return save(fig, "mma_fragment.svg")


def backward_order(tr=5, tc=6, j=2):
    """FlashAttention-2's backward: a block per key tile walks the query tiles."""
    fig, ax = canvas(9.8, 3.9)
    cw, ch, gx, gy = 0.62, 0.5, 1.1, 0.35
    top = gy + tr * ch
    for r in range(tr):
        for c in range(tc):
            hidden = c > r + 0.5 * (tc - tr)  # a causal picture: tiles above the diagonal
            color = IDLE if hidden else (STATE if c == j else "white")
            box(ax, gx + c * cw, top - (r + 1) * ch, cw, ch, color=color, lw=0.5)
            if c == j and not hidden:
                ax.text(gx + (c + 0.5) * cw, top - (r + 0.5) * ch, f"i = {r}", ha="center",
                        va="center", fontsize=7)
        box(ax, gx - 0.62, top - (r + 1) * ch, 0.5, ch, f"Q{r},dO{r}", color=MEMORY, lw=0.5, size=6)
    for c in range(tc):
        box(ax, gx + c * cw, top + 0.1, cw, 0.32, "Kⱼ,Vⱼ" if c == j else "",
            color=CHIP if c == j else MEMORY, lw=0.5, size=7)
    ax.text(gx + tc * cw / 2, gy - 0.25, "causal: grey tiles are never visited", ha="center",
            fontsize=7.5, style="italic")
    arrow(ax, gx + (j + 0.5) * cw, top - 0.05, gx + (j + 0.5) * cw, gy + 0.05, lw=0.9)
    x = gx + tc * cw + 0.35
    steps = ["one block per key tile j: Kⱼ, Vⱼ staged once; dKⱼ = dVⱼ = 0 on chip",
             "for each query tile i that sees Kⱼ (down the column):",
             "  · P  = exp(scale·Qᵢ Kⱼᵀ − LSEᵢ)    (rebuilt from the forward's LSE)",
             "  · dVⱼ += Pᵀ dOᵢ",
             "  · dP = dOᵢ Vⱼᵀ",
             "  · dS = P ∘ (dP − Dᵢ),  Dᵢ = rowsum(dOᵢ ∘ Oᵢ)  (a pre-pass)",
             "  · dKⱼ += scale · dSᵀ Qᵢ",
             "  · dQᵢ += scale · dS Kⱼ     ← atomic adds: every column",
             "                                 writes to the same dQᵢ",
             "write dKⱼ, dVⱼ once"]
    ax.text(x, top + 0.35, "\n".join(steps), va="top", fontsize=7.8, linespacing=1.45)
    return save(fig, "backward_order.svg")


def topk_fold(k=3):
    """Chunk states (m, ℓ, top-k) merged by the combiner, then only k values written."""
    fig, ax = canvas(9.6, 3.5)
    lanes = 4
    w = 2.0
    for t in range(lanes):
        x = 0.3 + t * (w + 0.3)
        box(ax, x, 2.7, w, 0.4, f"logits u = x/T, chunk {t}", color=MEMORY, size=7)
        box(ax, x + 0.1, 1.95, w - 0.2, 0.45, f"(m{t}, ℓ{t}, {k} best u, their ids)",
            color=STATE, size=7)
        arrow(ax, x + w / 2, 2.7, x + w / 2, 2.4, lw=0.8)
    for a, b, y in ((0, 1, 1.2), (2, 3, 1.2)):
        xa = 0.3 + a * (w + 0.3) + w / 2
        xb = 0.3 + b * (w + 0.3) + w / 2
        arrow(ax, xa, 1.95, (xa + xb) / 2, y + 0.45, lw=0.7)
        arrow(ax, xb, 1.95, (xa + xb) / 2, y + 0.45, lw=0.7)
        box(ax, (xa + xb) / 2 - 1.3, y, 2.6, 0.45, "⊕: (m, ℓ) combined;\nk best of 2k kept",
            color=STATE, size=7)
    mid = 0.3 + 1.5 * (w + 0.3) + w / 2
    for a in (0, 2):
        xa = 0.3 + (a + 0.5) * (w + 0.3) + w / 2
        arrow(ax, xa, 1.2, mid, 0.72, lw=0.7)
    box(ax, mid - 2.6, 0.25, 5.2, 0.47, "row state (m, ℓ, top-k) → write p = exp(u − m)/ℓ "
        "for the k winners only", color=CHIP, size=7.5)
    ax.text(0.3, 3.3, "one read of the logits; ties go to the lower index, so any tree "
            "gives the same list", fontsize=8)
    return save(fig, "topk_fold.svg")


def make():
    return [mma_fragment(), backward_order(), topk_fold()]
