"""Plots of the committed benchmark runs, from their CSVs in ``docs/benchmarks/``.

For every ``results-<device>.csv`` (columns as written by ``numba_softmax.bench``:
suite, impl, level, dtype, B, H, Sq, Sk, D, causal, splits, gbps, tflops, …) this writes,
beside it,

* ``attention_tflops-<device>.svg``: attention TFLOP/s against S (= Sq = Sk), one line
  per method and dtype, one panel per (D, causal);
* ``decode_gbps-<device>.svg``: decode GB/s against the context length Sk, one line per
  method, dtype and number of splits, with the copy bandwidth of the same run;

and skips a plot (saying so) when a CSV has no rows, or lacks a column, for it.  Only
kernel-level rows are plotted.  The attention and decode pages show these files.
"""

import csv
import re
from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt

from _style import save

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
ATTENTION = ("suite", "impl", "level", "dtype", "Sq", "Sk", "D", "causal", "tflops")
DECODE = ("suite", "impl", "level", "dtype", "Sk", "gbps")


def read(path):
    """(comment lines, rows as dicts) of a benchmark CSV."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    comments = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    return comments, rows


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _pick(rows, suite, need):
    if not rows or any(c not in rows[0] for c in need):
        return []
    return [r for r in rows if r["suite"] == suite and r["level"] == "kernel"
            and all(_num(r[c]) is not None for c in need if c in ("Sq", "Sk", "D", "tflops", "gbps"))]


def _device(comments):
    for c in comments:
        if c.startswith("device:"):
            return c.split(":", 1)[1].strip()
    return ""


def _style_of(impl, dtype):
    return {"linestyle": "-" if impl == "numba_softmax" else "--",
            "marker": {"float32": "o", "float16": "s", "bfloat16": "^"}.get(dtype, "x")}


def attention(path, slug, comments, rows):
    rows = [r for r in _pick(rows, "attention", ATTENTION) if r["Sq"] == r["Sk"]]
    if not rows:
        return None
    panels = sorted({(int(r["D"]), r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False,
                             sharey=True)
    for ax, (d, causal) in zip(axes[0], panels):
        lines = defaultdict(list)
        for r in rows:
            if int(r["D"]) == d and r["causal"] == causal:
                lines[(r["impl"], r["dtype"])].append((int(r["Sq"]), float(r["tflops"])))
        for (impl, dtype), pts in sorted(lines.items()):
            pts.sort()
            ax.plot(*zip(*pts), label=f"{impl} {dtype}", **_style_of(impl, dtype))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"D = {d}{', causal' if causal == 'True' else ''}", fontsize=9)
        ax.set_xlabel("S = Sq = Sk", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("TFLOP/s (4·Sq·Sk·D per head, halved if causal)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8,
               frameon=False)
    fig.suptitle(f"Attention forward, kernel time — {_device(comments) or slug}", fontsize=10)
    fig.subplots_adjust(bottom=0.3, top=0.85, wspace=0.08)
    return save(fig, f"attention_tflops-{slug}.svg", BENCH)


def decode(path, slug, comments, rows):
    rows = _pick(rows, "decode", DECODE)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    lines = defaultdict(list)
    batches = {r.get("B") or "" for r in rows}  # one line per batch size when they differ
    for r in rows:
        b = (r.get("B") or "") if len(batches) > 1 else ""
        lines[(r["impl"], r["dtype"], b, r.get("splits") or "")].append((int(r["Sk"]), float(r["gbps"])))
    for (impl, dtype, b, splits), pts in sorted(lines.items(), key=lambda kv: (kv[0][:2], int(kv[0][2] or 0), kv[0][3])):
        pts.sort()
        label = (f"{impl} {dtype}" + (f" B{b}" if b else "")
                 + (f", {splits} split{'s' if splits != '1' else ''}" if splits else ""))
        ax.plot(*zip(*pts), label=label, **_style_of(impl, dtype))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    bound = None  # decoding reads and hardly writes: the read-only stream when measured
    for c in comments:
        m = re.match(r"(copy|read) bandwidth: ([\d.]+) GB/s", c)
        if m and (bound is None or m.group(1) == "read"):
            bound = (float(m.group(2)), "read-only stream, same run" if m.group(1) == "read"
                     else "device copy (read + write), same run")
    if bound:
        ax.axhline(bound[0], color="#888888", lw=1, ls=":")
        ax.text(0.01, bound[0], bound[1], transform=ax.get_yaxis_transform(), va="bottom",
                fontsize=7, color="#555555")
    ax.set_xlabel("context length Sk (keys in the KV cache)", fontsize=8)
    ax.set_ylabel("GB/s (K, V, q read + o written)", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title(f"Decode (Sq = 1), kernel time — {_device(comments) or slug}", fontsize=10)
    return save(fig, f"decode_gbps-{slug}.svg", BENCH)


def make():
    written = []
    for path in sorted(BENCH.glob("results-*.csv")):
        slug = path.stem[len("results-"):]
        comments, rows = read(path)
        for plot in (attention, decode):
            out = plot(path, slug, comments, rows)
            if out is None:
                print(f"{path.name}: no {plot.__name__} rows with the needed columns; skipped")
            else:
                written.append(out)
    return written
