#!/usr/bin/env python
"""Is the committed GPU-check record current?  One line per record, never a failure.

A record (``docs/benchmarks/gpu-check-<device>.json``, written by
``scripts/gpu_check.py`` on a GPU) is *current* when its hash of the package's source
files equals the working tree's: the checked code is the code here.  CI prints this line
(it has no GPU to re-run the check).

When the bytes differ, the record's tree (its git hash) is looked up in git: if the
package's files there hash to the record's source hash — so the tree is the one that was
checked — and every file that differs from it differs only in docstrings and comments
(the same syntax tree once docstrings are dropped) or is a *simulator-only module* (one
the package imports only inside ``if simulator_enabled():`` / ``if
…ENABLE_CUDASIM:``, so never on a GPU), the record is *current in code* and the line
names those files.  Anything else is STALE.
"""

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ROOT, source_hash  # noqa: E402


def _git(*args):
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True)
    return out.stdout if out.returncode == 0 else None


def _code(source):
    """The syntax tree of a module without its docstrings (comments are not in it)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


# The ``if`` tests that switch to the simulator (``runtime/sim.py``'s simulator_enabled, as
# imported or through its module, and Numba's flag).
SIMULATOR_TESTS = {"simulator_enabled()", "sim.simulator_enabled()", "_cuda_config.ENABLE_CUDASIM",
                   "config.ENABLE_CUDASIM"}


def _imports_of(name, tree):
    """(import node, the tests of the ``if`` statements whose body holds it) for every
    import of module ``name`` (its last dotted part) in ``tree``."""
    found = []

    def visit(node, tests):
        for child in ast.iter_child_nodes(node):
            inner = tests
            if isinstance(node, ast.If) and child in node.body:
                inner = tests + [ast.unparse(node.test)]
            elif isinstance(node, ast.If) and child in node.orelse:
                inner = tests + ["not " + ast.unparse(node.test)]
            if isinstance(child, ast.ImportFrom):
                mods = [(child.module or "").split(".")[-1]] + [a.name for a in child.names]
                if name in mods:
                    found.append((child, inner))
            elif isinstance(child, ast.Import) and any(a.name.split(".")[-1] == name
                                                       for a in child.names):
                found.append((child, inner))
            visit(child, inner)

    visit(tree, [])
    return found


def simulator_only(path, sources, _seen=frozenset()):
    """True if the package imports module ``path`` only under the simulator: every import
    of it (there is at least one) sits in the body of an ``if`` on the simulator switch,
    or in a module that is itself imported only under the simulator (the emulation of
    one primitive may use another's)."""
    if path in _seen:
        return False
    seen = _seen | {path}
    name = Path(path).stem
    found = [(importer, tests) for importer, src in sources.items() if importer != path
             for _, tests in _imports_of(name, ast.parse(src))]
    return bool(found) and all(any(t in SIMULATOR_TESTS for t in tests)
                               or simulator_only(importer, sources, seen)
                               for importer, tests in found)


def code_changes(rec):
    """None if the record's tree cannot be shown to be the checked one; else the package
    files whose code (not only docstrings/comments) differs from the working tree's, and
    those that differ in docstrings/comments only."""
    tree = rec.get("git_hash")
    listing = _git("ls-tree", "-r", "--name-only", str(tree), "numba_softmax") if tree else None
    if not listing:
        return None
    then = {p: _git("show", f"{tree}:{p}") for p in listing.decode().split() if p.endswith(".py")}
    h = hashlib.sha256()
    for p in sorted(then, key=lambda p: Path(p)):  # gpu_check's order: sorted paths
        h.update(p.encode() + b"\0" + then[p] + b"\0")
    if h.hexdigest() != rec.get("source_hash"):
        return None  # that tree is not the one the record checked
    now = {str(p.relative_to(ROOT)): p.read_bytes() for p in (ROOT / "numba_softmax").rglob("*.py")}
    code, words = [], []
    for p in sorted(set(then) | set(now)):
        a, b = then.get(p), now.get(p)
        if a == b:
            continue
        if a is not None and b is not None and _code(a) == _code(b):
            words.append(p)
        elif b is not None and simulator_only(p, now) and (a is None or simulator_only(p, then)):
            words.append(p + " (simulator-only)")
        else:
            code.append(p)
    return code, words


def main():
    here = source_hash()
    records = sorted((ROOT / "docs" / "benchmarks").glob("gpu-check-*.json"))
    if not records:
        print("GPU check record: none committed")
    for path in records:
        rec = json.loads(path.read_text())
        if rec.get("source_hash") == here:
            state = "current"
        else:
            changes = code_changes(rec)
            if changes is None:
                state = "STALE (the package changed since)"
            elif not changes[0]:
                state = (f"current in code (since tree {rec['git_hash']} only docstrings, "
                         f"comments or simulator-only modules changed: {', '.join(changes[1])})")
            else:
                named = changes[0][:8] + ([f"and {len(changes[0]) - 8} more files"]
                                          if len(changes[0]) > 8 else [])
                state = (f"STALE (code changed since tree {rec['git_hash']}: "
                         f"{', '.join(named)})")
        print(f"GPU check record {path.name}: {state}; {rec.get('verdict', '?')} on "
              f"{rec.get('device', '?')}, {rec.get('date', '?')}, {rec.get('fuzz_cases', '?')} fuzz cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
