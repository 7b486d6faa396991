"""The later chapters: an mma accumulator fragment, the backward's tile order, the
tensor-core backward's warps, the top-k fold, the split top-k's bounded merge."""

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


def backward_tc_warps(warps=4, br=4):
    """The tensor-core backward: each warp's 16 keys are mma rows; dSᵀ through shared
    memory, read back transposed for dQ."""
    fig, ax = canvas(10.2, 4.3)
    cw, rh, gx, gy = 0.42, 0.62, 0.25, 0.55
    top = gy + warps * rh
    ax.text(gx, top + 0.55, "block of key tile j: Bc = 16·W keys", fontsize=8.5)
    for q in range(2 * br):
        ax.text(gx + (q + 0.5) * cw, top + 0.12, f"{8 * q}", ha="center", fontsize=6)
    ax.text(gx + br * cw, top + 0.3, "query columns of tile i (Br)", ha="center", fontsize=7)
    for w in range(warps):
        y = top - (w + 1) * rh
        for q in range(2 * br):
            box(ax, gx + q * cw, y, cw, rh, color=QUADS[w], lw=0.4)
        ax.text(gx + br * cw, y + rh / 2, f"warp {w}: keys {16 * w}…{16 * w + 15}\n"
                "Sᵀ → Pᵀ,  dPᵀ → dSᵀ", ha="center", va="center", fontsize=7)
        bx = gx + 2 * br * cw + 0.5
        arrow(ax, gx + 2 * br * cw + 0.05, y + rh / 2, bx - 0.05, y + rh / 2, lw=0.7)
        box(ax, bx, y + 0.06, 1.9, rh - 0.12, f"dK_{w}, dV_{w} += …\n(accumulators, whole block)",
            color=STATE, size=6.5)
    ax.text(gx, gy - 0.3, "registers: Pᵀ, dSᵀ sit in the accumulators exactly as the A operand "
            "of PᵀdO, dSᵀQ needs them", fontsize=7.5, style="italic")
    sx = gx + 2 * br * cw + 2.8
    box(ax, sx, gy + 0.2, 1.6, warps * rh - 0.4, "dSᵀ\n(shared memory,\nBc × Br, 16-bit)",
        color=CHIP, size=7.5)
    for w in range(warps):
        y = top - (w + 1) * rh + rh / 2
        arrow(ax, gx + 2 * br * cw + 2.45, y, sx - 0.03, y, lw=0.5, color="#777777")
        ax.text(gx + 2 * br * cw + 2.62, y + 0.05, "its dSᵀ", fontsize=6, color="#555555")
    ax.text(sx + 0.8, top + 0.1, "barrier", ha="center", fontsize=7, style="italic")
    qx = sx + 2.1
    notes = ["dQᵢ += scale · dS Kⱼ:",
             "  warp w takes 16 query rows (and a share",
             "  of the D columns) and reads dS with",
             "  ldmatrix.trans — stored rows of keys",
             "  become A fragments with queries as rows;",
             "  Kⱼ (keys × D) is the B operand, also",
             "  read transposed.",
             "",
             "the slice is added to a float32 dQ",
             "accumulator in memory, two columns a",
             "lane per red.global.add.v2.f32"]
    arrow(ax, sx + 1.63, gy + warps * rh / 2, qx - 0.05, gy + warps * rh / 2, lw=0.9)
    ax.text(qx, top + 0.35, "\n".join(notes), va="top", fontsize=7.5, linespacing=1.4)
    return save(fig, "backward_tc_warps.svg")


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


# Global ranks (1 = best) of the entries of six sorted piece lists, k = 5: an example where
# the lists' heads give b = rank 8 and eight entries, of thirty, are left to rank.
BOUND_LISTS = [[1, 2, 4, 9, 15], [3, 6, 10, 14, 20], [5, 11, 16, 22, 26],
               [7, 13, 18, 24, 28], [8, 17, 21, 25, 29], [12, 19, 23, 27, 30]]


def topk_bound(k=5):
    """The split top-k's kernel 2: S sorted lists, their heads, the bound b, the candidates."""
    lists = BOUND_LISTS
    S = len(lists)
    r = -(-k // S)
    heads = sorted(v for lst in lists for v in lst[:r])
    b = heads[k - 1]
    fig, ax = canvas(9.6, 3.3)
    cw, ch, gx, gy = 0.62, 0.36, 0.6, 0.35
    top = gy + k * ch
    for s, lst in enumerate(lists):
        for e, rank in enumerate(lst):
            color = CHIP if rank <= k else STATE if rank <= b else IDLE
            box(ax, gx + s * cw, top - (e + 1) * ch, cw, ch, str(rank), color=color,
                lw=1.8 if e < r else 0.5, size=8)
        ax.text(gx + (s + 0.5) * cw, top + 0.08, f"piece {s}", ha="center", fontsize=7)
    ax.text(gx - 0.08, top - 0.5 * ch, "heads", ha="right", va="center", fontsize=7,
            style="italic")
    ax.text(gx + S * cw / 2, top + 0.45, f"S = {S} sorted lists of k = {k} (numbers: ranks "
            "in the whole row)", ha="center", fontsize=8)
    x = gx + S * cw + 0.4
    notes = [f"1. heads: the first ⌈k/S⌉ = {r} of every list (bold) — {S * r} ≥ k entries",
             f"2. b = their k-th best: rank {b}.  The row's k-th best is no worse,",
             "    so nothing ranked after b can win",
             f"3. gather what b does not precede: {sum(v <= b for lst in lists for v in lst)} "
             f"entries (orange, green) of {S * k}",
             "4. rank them by counting: the k best (green), sorted",
             "",
             "more than 1024 gathered (a row whose best values crowd into",
             "a few pieces): the radix select of all S·k instead"]
    ax.text(x, top + 0.2, "\n".join(notes), va="top", fontsize=8, linespacing=1.5)
    return save(fig, "topk_bound.svg")


def make():
    return [mma_fragment(), backward_order(), backward_tc_warps(), topk_fold(), topk_bound()]
