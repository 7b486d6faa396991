"""Numbers computed while the docs build: checked blocks, and ``% computed: NAME`` lines.

**Checked blocks** (the textbook, ``docs/textbook/``) hold their numbers *in the page*, so
the Markdown reads the same on GitHub as in the built docs, between two HTML comments::

    <!-- computed: walk.softmax -->
    ...the numbers, as Markdown...
    <!-- end computed -->

The build recomputes ``NAME`` and fails if the text differs — a number may move by one
unit of its last printed digit (a GPU's exp rounds unlike the simulator's), nothing
else.  ``NAME`` is one of the names below, or ``run``: the page's ```` ```python ````
blocks since the previous ``run`` are executed, in order, in one namespace for the
whole page (a notebook's cells), and what they print is the block (a ```` ```text ````
fence).  ``python docs/_ext/computed.py --write PAGE.md …`` rewrites the blocks with
what they compute now; ``--check`` only reports.

**Computed lines** (the records and the notebook) are replaced where the page says
a MyST comment line (invisible if this extension is not loaded)::

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

try:
    from sphinx.errors import ExtensionError
except ImportError:  # the checked blocks are checked by tests and the script without Sphinx
    class ExtensionError(RuntimeError):
        pass

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


# --- checked blocks: the numbers written in the page, recomputed and compared ----------
BLOCK = re.compile(r"^<!-- computed: *(\S+) *-->\n(.*?)^<!-- end computed -->\n?",
                   re.MULTILINE | re.DOTALL)
PYTHON = re.compile(r"^```python\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
_ITEMS = re.compile(BLOCK.pattern + "|" + PYTHON.pattern, re.MULTILINE | re.DOTALL)
NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?(?:e[-+−]?\d+)?")


def _run(cells, namespace):
    """Execute ``cells`` (source strings) in ``namespace``; what they print, as a fence."""
    import contextlib
    import io

    import numpy as np

    out = io.StringIO()
    with contextlib.redirect_stdout(out), np.errstate(all="ignore"):
        for cell in cells:
            exec(compile(cell, "<page>", "exec"), namespace)  # noqa: S102 - the page's own code
    return "```text\n" + out.getvalue().rstrip("\n") + "\n```"


def blocks(text, app=None):
    """``[(name, written, computed)]`` for every checked block of a page's ``text``."""
    found, cells, namespace = [], [], {"__name__": "__page__"}
    for match in _ITEMS.finditer(text):
        if match.group(3) is not None:  # a ```python cell
            cells.append(match.group(3))
            continue
        name, written = match.group(1), match.group(2)
        if name == "run":
            computed, cells = _run(cells, namespace), []
        else:
            computed = _compute(app, name)
        found.append((name, written.strip("\n"), computed.strip("\n")))
    return found


def _number(token):
    return float(token.replace("−", "-"))


def _unit(token):
    """One unit of the last digit ``token`` prints (0 for an integer: it must match)."""
    mantissa, _, exponent = token.replace("−", "-").lower().partition("e")
    digits = len(mantissa.partition(".")[2])
    if not digits and not exponent:
        return 0.0
    return 10.0 ** (-digits + (int(exponent) if exponent else 0))


def same(written, computed):
    """Whether a block's written text is what it computes: the same words, and numbers
    within one unit of their last printed digit (at least 1e-6 for an e-notation one)."""
    a, b = NUMBER.split(written), NUMBER.split(computed)
    if [s.rstrip() for s in a] != [s.rstrip() for s in b]:
        return False
    for x, y in zip(NUMBER.findall(written), NUMBER.findall(computed)):
        unit = _unit(x)
        if "e" in x.lower():
            unit = max(unit, 1e-6)
        if abs(_number(x) - _number(y)) > 1.01 * unit:
            return False
    return True


def check(text, app=None):
    """The names of the blocks of ``text`` whose written numbers are not what they compute."""
    return [name for name, written, computed in blocks(text, app) if not same(written, computed)]


def rewrite(text, app=None):
    """``text`` with every checked block holding what it computes now."""
    fresh = iter(computed for _, _, computed in blocks(text, app))
    return BLOCK.sub(lambda m: f"<!-- computed: {m.group(1)} -->\n{next(fresh)}\n"
                               "<!-- end computed -->\n", text)


def source_read(app, docname, source):
    if "<!-- computed:" in source[0]:
        stale = check(source[0], app)
        if stale:
            raise ExtensionError(
                f"{docname}: the numbers written in the page are not what it computes "
                f"({', '.join(stale)}); run python docs/_ext/computed.py --write "
                f"docs/{docname}.md and read the difference")
        source[0] = BLOCK.sub(lambda m: m.group(2), source[0])  # the markers go, the text stays
    if "% computed:" not in source[0]:
        return
    source[0] = MARKER.sub(lambda m: _compute(app, m.group(1)), source[0])


def setup(app):
    app.connect("source-read", source_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


def main(argv=None):
    """``--write`` or ``--check`` the checked blocks of the pages named (on the simulator
    where no GPU is set up: ``NUMBA_ENABLE_CUDASIM`` defaults to 1 here)."""
    import argparse
    import os
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("pages", nargs="+")
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    args = parser.parse_args(argv)
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent.parent)]
    bad = 0
    for page in args.pages:
        path = Path(page)
        text = path.read_text(encoding="utf-8")
        if args.write:
            new = rewrite(text)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"{page}: rewritten")
        stale = check(path.read_text(encoding="utf-8"))
        bad += bool(stale)
        print(f"{page}: {'stale: ' + ', '.join(stale) if stale else 'current'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
