"""Numbers computed while the docs build: ``% computed: NAME`` lines in a page.

A page marks where a computed block belongs with a MyST comment line (invisible if this
extension is not loaded)::

    % computed: walk.softmax

and the build replaces the line with the Markdown that ``NAME`` returns:

* ``walk.softmax``, ``walk.attention`` — one row folded step by step by the device
  kernels (``walk.py``), on the build machine's GPU or on the CUDA simulator;
* ``walk.where`` — which of the two that was;
* ``walk.committed`` — the walks committed from GPU runs (``docs/benchmarks/walk-*.txt``,
  written by ``python docs/_ext/walk.py --out docs/benchmarks`` on a GPU), or a note;
* ``notes.NAME`` — a table of ``notes.py`` or ``notes_merge.py`` (the sources' own
  forms, run);
* ``gpu_check.record`` — the committed GPU check records
  (``docs/benchmarks/gpu-check-*.json``, written by ``scripts/gpu_check.py``), each as
  it was written, and whether its package source is the source of this tree.

An unknown name or a failing computation fails the build: a page never shows a number
that was not computed.
"""

import functools
import re
from pathlib import Path

from sphinx.errors import ExtensionError

MARKER = re.compile(r"^% computed: *(\S+) *$", re.MULTILINE)


@functools.cache
def _walks():
    import walk

    return walk.softmax_walk()["table"], walk.attention_walk()["table"]


def _committed(app):
    files = sorted((Path(app.srcdir) / "benchmarks").glob("walk-*.txt"))
    if not files:
        return "\n".join([
            ":::{note}",
            "No GPU run of the walk has been committed yet: `python docs/_ext/walk.py --out "
            "docs/benchmarks` on a GPU writes `walk-<device>.txt`, and it appears here.",
            ":::"])
    parts = []
    for path in files:
        app.env.note_dependency(str(path))
        parts.append(f"From `docs/benchmarks/{path.name}`:\n\n"
                     + path.read_text(encoding="utf-8").strip())
    return "\n\n---\n\n".join(parts)


def _gpu_check(app):
    import json

    files = sorted((Path(app.srcdir) / "benchmarks").glob("gpu-check-*.json"))
    if not files:
        return ":::{note}\nNo GPU check record is committed yet.\n:::"
    import sys

    sys.path.insert(0, str(Path(app.srcdir).parent / "scripts"))
    import check_record  # the same verdict CI prints

    here = check_record.source_hash()
    parts = []
    for path in files:
        app.env.note_dependency(str(path))
        r = json.loads(path.read_text(encoding="utf-8"))
        changes = None if r["source_hash"] == here else check_record.code_changes(r)
        if r["source_hash"] == here:
            state = "**current**: its package source is this tree's"
        elif changes is not None and not changes[0]:
            state = ("**current in code**: since that tree only docstrings, comments or "
                     "modules imported only under the simulator changed "
                     f"({', '.join(f'`{c}`' for c in changes[1])})")
        else:
            state = "*stale*: the package's code has changed since"
        lines = [f"`docs/benchmarks/{path.name}` — {r['device']} (driver {r['driver']}, CUDA "
                 f"{r.get('cuda_runtime')}; numba {r['numba']}, numba-cuda {r['numba_cuda']}, "
                 f"numpy {r['numpy']}, CuPy {r['cupy']}, PyTorch {r['torch']}), {r['date']}, "
                 f"tree {r['git_hash']}, package source `{r['source_hash'][:16]}`: {state}.", ""]
        for m in r.get("merged", []):
            lines += [f"Merged from the run of {m['date']} on tree {m['git_hash']} (the same "
                      f"package source): {', '.join(m['jobs'])}.", ""]
        lines += ["| job | exit | passed | failed | skipped | cases / examples | sanitizer errors | s |",
                  "|---|---|---|---|---|---|---|---|"]
        for j in r["jobs"]:
            cells = [j["name"], j["exit"], j.get("passed", ""), j.get("failed", ""),
                     j.get("skipped", ""), j.get("hypothesis_examples", j.get("examples_run", "")),
                     j.get("sanitizer_errors", ""), j["seconds"]]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines += ["", f"Fuzz cases generated: **{r['fuzz_cases']}**.  Verdict: "
                      f"**`{r['verdict']}`**"]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _compute(app, name):
    import notes
    import notes_merge
    import walk

    if name == "walk.softmax":
        return _walks()[0]
    if name == "walk.attention":
        return _walks()[1]
    if name == "walk.where":
        return walk.header()
    if name == "walk.committed":
        return _committed(app)
    if name == "gpu_check.record":
        return _gpu_check(app)
    for module in (notes, notes_merge):
        if name.startswith("notes.") and callable(getattr(module, name[6:] + "_md", None)):
            return getattr(module, name[6:] + "_md")()
    raise ExtensionError(f"% computed: unknown name {name!r}")


def source_read(app, docname, source):
    if "% computed:" not in source[0]:
        return
    source[0] = MARKER.sub(lambda m: _compute(app, m.group(1)), source[0])


def setup(app):
    app.connect("source-read", source_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
