"""The documentation builds with warnings as errors.

A ``literalinclude`` of a renamed function, an autodoc target that no longer imports, or
a broken cross-reference is a warning; ``-W`` makes it an error here, so CI catches it.
Skipped when Sphinx or MyST is not installed (``pip install -e ".[docs]"``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_without_warnings(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(tmp_path / "html")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    html = tmp_path / "html"
    textbook = sorted(p.stem for p in (ROOT / "docs" / "textbook").glob("*.md"))
    assert len(textbook) >= 7, textbook
    for page in ["index", *(f"textbook/{t}" for t in textbook), "sources", "algorithms/fused",
                 "algorithms/attention", "api", "testing", "caveats", "measurements"]:
        assert (html / f"{page}.html").is_file(), page
    # the kernel source is included live, not pasted: its text is in the page
    assert "team_combine" in (html / "algorithms" / "fused.html").read_text(encoding="utf-8")
    # the computed blocks were computed (docs/_ext/computed.py), and every chapter has a figure
    walk = (html / "textbook" / "2-online.html").read_text(encoding="utf-8")
    assert "chunk state" in walk and "re-base" in walk
    for page in ["textbook/2-online", "textbook/5-flashattention", "sources", "algorithms/reduction"]:
        text = (html / f"{page}.html").read_text(encoding="utf-8")
        assert "% computed" not in text and "computed:" not in text, page
    for page in ["three_pass", "fused", "online", "split", "attention", "decode", "reduction"]:
        assert ".svg" in (html / "algorithms" / f"{page}.html").read_text(encoding="utf-8"), page
