"""The package's shape, checked from its source (ast only: nothing is imported).

* imports point down: ``arrays/`` and ``runtime/`` never import ``kernels/``, not even
  inside a function;
* every module of the package stays small (textbook/ and bench/ too);
* each folder's ``__init__`` is its table of contents: it names every module of the
  folder, and only modules that exist;
* the picture of the package (``docs/figures/architecture.py``) is drawn from the real
  imports and names every group.
"""

import ast
import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "numba_softmax"
MAX_LINES = 320  # the aim is about 300: one idea a file
# Modules over MAX_LINES that cannot be cut without touching a kernel factory's body (each
# is one factory's device functions); the number is the most lines each may keep.
KNOWN_LONG = {
    "numba_softmax/kernels/topk/topk_stream.py": 340,  # loads() and stream(): device code only
}
KERNEL_FOLDERS = sorted(p.parent for p in (PACKAGE / "kernels").glob("*/__init__.py"))


def _dotted(path, root):
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts), parts[-1] == "__init__"


def imported(path, root=ROOT):
    """Every module name an ``import`` in ``path`` can load, relative levels resolved, at
    any depth of the file (function bodies too); ``from a import b`` yields ``a`` and
    ``a.b`` (b may be a module)."""
    name, package = _dotted(path, root)
    here = name.split(".") if package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - (node.level - 1)] + [node.module or ""])
                base = base.rstrip(".")
            else:
                base = node.module
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "__import__"):
            yield str(node.args[0].value)


def _upward(folder, root=ROOT):
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for target in imported(path, root):
            if target == "numba_softmax.kernels" or target.startswith("numba_softmax.kernels."):
                bad.append(f"{path.relative_to(root)}: imports {target}")
    return bad


@pytest.mark.parametrize("folder", ["arrays", "runtime"])
def test_no_upward_import_into_kernels(folder):
    assert (PACKAGE / folder).is_dir()
    bad = _upward(PACKAGE / folder)
    assert not bad, "the kernels sit on top of arrays/ and runtime/:\n" + "\n".join(bad)


def test_the_upward_import_check_catches_every_form(tmp_path):
    """The detector itself: each way of reaching kernels/ from runtime/ is caught."""
    runtime = tmp_path / "numba_softmax" / "runtime"
    runtime.mkdir(parents=True)
    (tmp_path / "numba_softmax" / "__init__.py").write_text("")
    (runtime / "__init__.py").write_text("from . import launcher\n")
    forms = {
        "a.py": "def f():\n    from ..kernels.hw import jit\n",  # relative, in a function
        "b.py": "from .. import kernels\n",
        "c.py": "import numba_softmax.kernels.softmax.fused as fused\n",
        "d.py": "from numba_softmax.kernels import rows\n",
        "e.py": "import importlib\nm = importlib.import_module('numba_softmax.kernels.topk')\n",
        "ok.py": "from ..combine import combine\nfrom . import launcher\nimport numba\n",
    }
    for name, text in forms.items():
        (runtime / name).write_text(text)
    bad = _upward(runtime, tmp_path)
    assert sorted({line.split(":")[0].rsplit("/", 1)[1] for line in bad}) == \
        ["a.py", "b.py", "c.py", "d.py", "e.py"]


def test_every_module_stays_small():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    assert any(name.startswith("numba_softmax/textbook/") for name in sizes)
    assert any(name.startswith("numba_softmax/bench/") for name in sizes)
    over = sorted(f"{name} {n}" for name, n in sizes.items() if n > KNOWN_LONG.get(name, MAX_LINES))
    assert not over, f"over {MAX_LINES} lines: {', '.join(over)}"
    stale = sorted(name for name in KNOWN_LONG if sizes.get(name, 0) <= MAX_LINES)
    assert not stale, f"no longer over {MAX_LINES} lines (drop from KNOWN_LONG): {stale}"


def _toc(folder):
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    listed = re.findall(r"^``(\w+)``", doc or "", flags=re.M)  # a table line: ``name``  what
    return doc or "", modules, listed


@pytest.mark.parametrize("folder", KERNEL_FOLDERS + [PACKAGE / "runtime"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_folder_init_names_every_module(folder):
    doc, modules, listed = _toc(folder)
    assert doc, f"{folder.relative_to(ROOT)}/__init__.py has no docstring"
    missing = [m for m in modules if not re.search(rf"(?<![\w.]){m}(?!\w)", doc)]
    assert not missing, f"{folder.relative_to(ROOT)}/__init__.py does not name {missing}"
    stale = sorted(set(listed) - set(modules))
    assert not stale, f"{folder.relative_to(ROOT)}/__init__.py lists no such module {stale}"


def test_kernels_has_the_folders_it_describes():
    assert {p.name for p in KERNEL_FOLDERS} >= {"softmax", "rows", "attention", "decode",
                                                 "backward", "topk", "hw"}


# --- the picture -------------------------------------------------------------------------

def _figure_script():
    spec = importlib.util.spec_from_file_location(
        "architecture", ROOT / "docs" / "figures" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_figure_names_every_group_and_module():
    fig = _figure_script()
    members, edges = fig.groups()
    assert {"api", "arrays/", "runtime/", "plans", "combine", "reference/", "bench/",
            "kernels/softmax", "kernels/rows", "kernels/attention", "kernels/decode",
            "kernels/backward", "kernels/topk", "kernels/hw"} <= set(members)
    text = fig.svg(members, edges)
    tree = ET.fromstring(text)  # well-formed SVG
    assert tree.tag == "{http://www.w3.org/2000/svg}svg"
    shown = " ".join(t.text or "" for t in tree.iter("{http://www.w3.org/2000/svg}text"))
    for g, mods in members.items():
        assert f">{g}<" in text, g
        for m in mods:
            if m != "__init__" or g == "api":
                assert re.search(rf"(?<!\w){re.escape(m)}(?!\w)", shown), (g, m)
    # the arrows are the real imports: kernels use the launcher and the combiner,
    # and nothing under arrays/ or runtime/ points into kernels/
    assert edges[("kernels/softmax", "kernels/rows")] > 0
    assert edges[("kernels/softmax", "runtime/")] > 0 and edges[("kernels/topk", "combine")] > 0
    assert not [e for e in edges if e[0] in ("arrays/", "runtime/") and e[1].startswith("kernels")]
    for (a, b), n in edges.items():  # each group → group count, in an arrow's tooltip
        assert f"{a} → {b}: {n}" in text, (a, b, n)


def test_the_figure_counts_module_imports(tmp_path):
    """On a package of five modules: relative imports resolved, imports in a function
    body counted, each module → module pair once, the folder's own imports not drawn."""
    pkg = tmp_path / "numba_softmax"
    for folder in ("", "kernels", "kernels/softmax", "runtime"):
        (pkg / folder).mkdir(parents=True, exist_ok=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "combine.py").write_text("import math\n")
    (pkg / "runtime" / "launcher.py").write_text("")
    (pkg / "kernels" / "softmax" / "a.py").write_text(
        "from ...combine import combine\nfrom ... import combine as c\n"
        "def f():\n    from ...runtime import launcher\n    from . import b\n")
    (pkg / "kernels" / "softmax" / "b.py").write_text("import numba_softmax.combine\n")
    (pkg / "softmax.py").write_text("from .kernels.softmax import a\n")
    fig = _figure_script()
    members, edges = fig.groups(tmp_path)
    assert edges == {("kernels/softmax", "combine"): 2, ("kernels/softmax", "runtime/"): 1,
                     ("api", "kernels/softmax"): 1}
    assert members["kernels/softmax"] == ["__init__", "a", "b"]
    assert members["api"] == ["__init__", "softmax"]
    assert ">kernels/softmax<" in fig.svg(members, edges)
