"""The outputs: one text table per section, the CSV, and the plots."""

import csv
import dataclasses

from .results import CSV_COLUMNS


def shape_label(r):
    """A short description of a row's problem."""
    if r.suite == "bounds":
        size = r.N * 4
        return f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size / 2**10:g} KiB"
    if r.B is not None:
        label = f"B{r.B} H{r.H}" + (f"/{r.Hkv}" if r.Hkv else "") + f" Sq{r.Sq}"
        label += f" Sk{r.Sk}" if r.Sk is not None else ""
        label += f" D{r.D}" + (" causal" if r.causal else "")
        label += f" splits={r.splits}" if r.splits else ""
        return label + (f" page={r.page}" if r.page else "")
    return f"{r.M}x{r.N}" + (f" k={r.k}" if r.k else "")


_COLUMNS = {  # key: (header, row → value, format)
    "impl": ("impl", lambda r: r.impl, ""),
    "level": ("level", lambda r: r.level, ""),
    "array": ("array", lambda r: r.array, ""),
    "dtype": ("dtype", lambda r: r.dtype, ""),
    "shape": ("shape", shape_label, ""),
    "reps": ("reps", lambda r: r.reps, "d"),
    "ms": ("median ms", lambda r: r.median_ms, ".4g"),
    "us": ("µs/call", lambda r: r.median_ms * 1e3, ".1f"),
    "gbps": ("GB/s", lambda r: r.gbps, ".4g"),
    "copy": ("% copy", lambda r: r.pct_copy, ".3g"),
    "passes": ("passes", lambda r: r.model_bytes and 2 * r.model_bytes / r.bytes, ".2g"),
    "own": ("% own", lambda r: r.pct_model, ".3g"),
    "own_gbps": ("GB/s own", lambda r: r.model_bytes and r.model_bytes / r.median_ms / 1e6, ".4g"),
    "bound": ("bound", lambda r: r.bound, ""),
    "pct": ("% bound", lambda r: r.pct_bound, ".3g"),
    "read": ("% read", lambda r: r.pct_bound, ".3g"),
    "peak": ("% peak", lambda r: r.pct_bound, ".3g"),
    "tflops": ("TFLOP/s", lambda r: r.tflops, ".4g"),
    "torch": ("× torch", lambda r: r.x_torch, ".2f"),
    "sdpa": ("× SDPA", lambda r: r.x_torch, ".2f"),
    "base": ("held to", lambda r: r.base, ""),
    "x_textbook": ("× textbook", lambda r: r.base_ms and r.base_ms / r.median_ms, ".2f"),
    "base_us": ("its µs", lambda r: None if r.base_ms is None else r.base_ms * 1e3, ".1f"),
    "x_base": ("× it", lambda r: r.x_base, ".2f"),
    "target": ("≤ 2× (target)", lambda r: r.target, ""),
    "goal": ("≤ 1.5× (goal)", lambda r: r.goal, ""),
    "note": ("note", lambda r: r.note, ""),
}
SUITE_COLUMNS = {
    "bounds": "impl array shape reps ms gbps bound note",
    "softmax": "impl level array dtype shape reps ms gbps copy passes own torch note",
    "attention": "impl level array dtype shape reps ms tflops peak sdpa note",
    "decode": "impl array dtype shape reps ms gbps read sdpa note",
    "backward": "impl array dtype shape reps ms gbps copy tflops bound pct torch note",
    "topk": "impl array dtype shape reps ms gbps read torch note",
    "overhead": "impl array shape us gbps copy base base_us x_base target goal note",
    "textbook": "impl dtype shape reps ms gbps copy own_gbps own tflops bound pct x_textbook note",
}


def _fmt(value, spec):
    if value is None or value == "":
        return ""
    return format(value, spec) if spec else str(value)


def format_table(rows, keys="impl level array dtype shape reps ms gbps copy note"):
    """Rows as an aligned text table: text left-aligned, numbers right-aligned; columns
    that are empty in every row are left out."""
    columns = [_COLUMNS[k] for k in keys.split()]
    cells = [[_fmt(get(r), spec) for _, get, spec in columns] for r in rows]
    keep = [i for i in range(len(columns)) if any(c[i] for c in cells)] or [0]
    columns = [columns[i] for i in keep]
    cells = [[c[i] for i in keep] for c in cells]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(columns)]
    numeric = [bool(spec) for _, _, spec in columns]

    def line(values):
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(out).rstrip()

    header = line([h for h, _, _ in columns])
    return "\n".join([header, "-" * len(header)] + [line(c) for c in cells])


def format_header(meta):
    return "\n".join(f"{k}: {v}" for k, v in meta.items())


def format_report(results, skipped=(), times=None):
    """One table per suite (in the order they ran), then what was skipped."""
    parts = []
    for suite in dict.fromkeys(r.suite for r in results):
        took = f"  ({times[suite]:.1f} s)" if times and suite in times else ""
        parts += [f"== {suite} =={took}",
                  format_table([r for r in results if r.suite == suite],
                               SUITE_COLUMNS.get(suite, SUITE_COLUMNS["softmax"])), ""]
    if skipped:
        parts += ["skipped:"] + [f"  {s}" for s in skipped]
    return "\n".join(parts).rstrip()


def write_csv(path, results, meta):
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({k: ("" if v is None else v) for k, v in dataclasses.asdict(r).items()})


# --- plots -----------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def have_pyplot():
    return _pyplot() is not None


def copy_label(copy_gbps):
    """The copy line's legend: its real value (4 significant digits, not rounded away)."""
    return f"copy {copy_gbps:.4g} GB/s"


def _panels(path, meta, rows, x, y, group, panel, title, xlabel, ylabel, hline=None,
            tick=None):
    """One panel per ``panel(r)`` value, one line per ``group(r)``, log2 x axis (ticks
    labelled ``tick(r)`` where given)."""
    plt = _pyplot()
    names = list(dict.fromkeys(panel(r) for r in rows))
    if plt is None or not names:
        return False
    fig, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 5), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = [r for r in rows if panel(r) == name]
        for g in dict.fromkeys(group(r) for r in mine):
            pts = sorted((x(r), y(r)) for r in mine if group(r) == g)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=g)
        if hline:
            ax.axhline(hline[0], color="black", linestyle="--", label=hline[1])
        ax.set_xscale("log", base=2)
        if tick:
            ticks = dict(sorted((x(r), tick(r)) for r in mine))
            ax.set_xticks(list(ticks), list(ticks.values()), fontsize=7)
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} {name}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{meta['device']} | {meta['driver']} | {meta['date']}\n{meta['versions']}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_all(out_dir, results, meta, copy_gbps):
    """The plots this run has rows for; returns the file names written."""
    import os

    kernel = [r for r in results if r.level == "kernel"]
    written = []
    soft = [r for r in kernel if r.suite == "softmax"]
    if _panels(os.path.join(out_dir, "softmax_gbps.png"), meta, soft, lambda r: r.N,
               lambda r: r.gbps, lambda r: r.impl, lambda r: r.dtype, "softmax",
               "N (row length), M rows", "GB/s (2·M·N·itemsize / median kernel time)",
               (copy_gbps, copy_label(copy_gbps)) if copy_gbps else None,
               tick=lambda r: f"{r.N}\nM={r.M}"):
        written.append("softmax_gbps.png")
    attn = [r for r in kernel if r.suite == "attention"]
    if _panels(os.path.join(out_dir, "attention_tflops.png"), meta, attn, lambda r: r.Sq,
               lambda r: r.tflops, lambda r: f"{r.impl} D{r.D}" + (" causal" if r.causal else ""),
               lambda r: r.dtype, "attention", "S (B·S = 16384 tokens, H = 8)", "TFLOP/s"):
        written.append("attention_tflops.png")
    dec = [r for r in kernel if r.suite == "decode"]
    if _panels(os.path.join(out_dir, "decode_gbps.png"), meta, dec, lambda r: r.Sk,
               lambda r: r.gbps, lambda r: f"{r.impl} B{r.B}" + (f" page {r.page}" if r.page else ""),
               lambda r: r.dtype, "decode", "context (keys in the cache)", "GB/s of KV cache read"):
        written.append("decode_gbps.png")
    return written
