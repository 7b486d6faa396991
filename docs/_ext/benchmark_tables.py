"""Measured tables and plots from ``docs/benchmarks/``, shown where they exist.

The benchmark results (``*.csv``, ``*.png``, ``NOTES.md``) are committed to
``docs/benchmarks/`` from GPU runs, separately from the prose.  Pages mark where they
belong with a MyST comment line (invisible if this extension is not loaded)::

    % benchmarks: suite=softmax impl=fused png=softmax*

* ``key=value`` filters pick the rows of every CSV in ``docs/benchmarks/`` whose column
  ``key`` equals ``value`` (``key=a,b`` accepts either); a CSV without such a column is
  skipped.  ``#`` lines at the top of a CSV (device, driver, date) become the caption.
* ``png=GLOB`` adds the matching plots as figures.
* ``columns=a,b,c`` chooses and orders the columns shown (default: every column that is
  not empty in the selected rows, less the filtered ones).

``% benchmarks-index`` (the measurements page) lists everything: the Markdown notes in
``docs/benchmarks/`` as a toctree, every plot, and every CSV in full.

When nothing matches — no benchmark has been committed yet — the marker becomes a short
note saying where the numbers will come from, so the build never fails for a missing file.
"""

import csv
import fnmatch
import io
import os
import re
from pathlib import Path

MARKER = re.compile(r"^% benchmarks:(.*)$", re.MULTILINE)
INDEX = re.compile(r"^% benchmarks-index\s*$", re.MULTILINE)
MAX_ROWS = 80


def _bench_dir(app):
    return Path(app.srcdir) / "benchmarks"


def _read_csv(path):
    """(comment lines, header, rows as dicts) — or None if the file is not a table."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    comments = []
    while lines and lines[0].startswith("#"):
        comments.append(lines.pop(0).lstrip("#").strip())
    try:
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        rows = list(reader)
        header = reader.fieldnames
    except csv.Error:
        return None
    if not header:
        return None
    return comments, header, rows


def _cell(value):
    value = (value or "").strip()
    try:
        f = float(value)
    except ValueError:
        return value.replace("|", "\\|")
    if value.lstrip("-").isdigit():
        return value
    return f"{f:.4g}"


def _table(path, rel, filters, columns):
    parsed = _read_csv(path)
    if parsed is None:
        return None
    comments, header, rows = parsed
    if any(key not in header for key in filters):
        return None
    rows = [r for r in rows if all((r.get(k) or "").strip() in vals for k, vals in filters.items())]
    if not rows:
        return None
    if columns:
        shown = [c for c in columns if c in header]
    else:
        shown = [c for c in header
                 if c not in filters and any((r.get(c) or "").strip() for r in rows)]
    if not shown:
        return None
    out = [f"*Measured* — from [`{path.name}`]({rel}/{path.name})"
           + (f" ({'; '.join(comments)})" if comments else "") + ":", ""]
    out.append("| " + " | ".join(shown) + " |")
    out.append("|" + "---|" * len(shown))
    for r in rows[:MAX_ROWS]:
        out.append("| " + " | ".join(_cell(r.get(c)) for c in shown) + " |")
    if len(rows) > MAX_ROWS:
        out += ["", f"({len(rows) - MAX_ROWS} more rows in the file.)"]
    return "\n".join(out)


def _figure(rel, name):
    return "\n".join([f":::{{figure}} {rel}/{name}", ":width: 100%", "", f"`{name}`", ":::"])


def _missing(what):
    return "\n".join([
        ":::{note}",
        f"No measurement{what} has been committed yet.  The benchmark results live in "
        "`docs/benchmarks/` (CSV tables, PNG plots, `NOTES.md`), measured on a GPU with the "
        "harness `python -m numba_softmax.bench`; see {doc}`/measurements`.",
        ":::",
    ])


def _parse_args(text):
    filters, png, columns = {}, None, None
    for token in text.split():
        key, _, value = token.partition("=")
        if key == "png":
            png = value
        elif key == "columns":
            columns = value.split(",")
        elif value:
            filters[key] = set(value.split(","))
    return filters, png, columns


def _rel(app, docname):
    doc_dir = (Path(app.srcdir) / docname).parent
    return os.path.relpath(_bench_dir(app), doc_dir).replace(os.sep, "/")


def _files(app, pattern):
    bench = _bench_dir(app)
    if not bench.is_dir():
        return []
    return sorted(p for p in bench.iterdir() if p.is_file() and fnmatch.fnmatch(p.name, pattern))


def _expand(app, docname, args):
    filters, png, columns = _parse_args(args)
    rel = _rel(app, docname)
    parts = []
    for path in _files(app, "*.csv"):
        block = _table(path, rel, filters, columns)
        if block:
            app.env.note_dependency(str(path))
            parts.append(block)
    for path in _files(app, png) if png else []:
        if path.suffix.lower() in (".png", ".svg", ".jpg", ".jpeg"):
            app.env.note_dependency(str(path))
            parts.append(_figure(rel, path.name))
    return "\n\n".join(parts) if parts else _missing(" for this page")


def _index(app, docname):
    rel = _rel(app, docname)
    parts = []
    notes = [p for p in _files(app, "*.md")]
    if notes:
        entries = [f"{rel}/{p.stem}" for p in notes]
        parts.append("\n".join([":::{toctree}", ":maxdepth: 1", "", *entries, ":::"]))
    for path in _files(app, "*.png") + _files(app, "*.svg"):
        app.env.note_dependency(str(path))
        parts.append(_figure(rel, path.name))
    for path in _files(app, "*.csv"):
        block = _table(path, rel, {}, None)
        if block:
            app.env.note_dependency(str(path))
            parts.append(block)
    return "\n\n".join(parts) if parts else _missing("")


def source_read(app, docname, source):
    text = source[0]
    if "% benchmarks" not in text:
        return
    text = INDEX.sub(lambda m: _index(app, docname), text)
    text = MARKER.sub(lambda m: _expand(app, docname, m.group(1)), text)
    source[0] = text


def setup(app):
    app.connect("source-read", source_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
