"""The textbook track (``docs/textbook/``): pages a reader walks in order.

Each page speaks of the algorithms alone — no GPU name, no tree hash, no work-diary
ordinal (measured figures and the devices they came from live in the engineering
notebook and the records) — stays short, and ends with what the next page changes (the
last: what to read next).  The worked examples are written into the Markdown, so they read
on GitHub as in the built docs, and every number in them is what it computes now
(``docs/_ext/computed.py``: the build checks them too; here they are checked without
Sphinx).
"""

import re
import sys
from pathlib import Path

import pytest

from test_hygiene import DIARY, GPU

ROOT = Path(__file__).resolve().parent.parent
TEXTBOOK = ROOT / "docs" / "textbook"
PAGES = sorted(TEXTBOOK.glob("*.md"))
MAX_WORDS = 1600  # prose: fenced code (literalinclude, snippets, their output) not counted

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import computed  # noqa: E402

ARCHITECTURE = re.compile(r"\b(?:Hopper|Ampere|Blackwell|Volta|Turing|GeForce|Tesla)\b")
TREE = re.compile(r"\b(?:tree|commit)s?\b\W{0,3}[0-9a-f]{7,40}\b"
                  r"|\b[0-9a-f]{7,40}\b\W{0,3}(?:tree|commit)\b"
                  r"|\b[0-9a-f]{40}\b", re.I)
FENCE = re.compile(r"^(```|:::)[^\n]*\n.*?^\1[ \t]*\n", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^## +(.+)$", re.MULTILINE)


def _name(path):
    return path.relative_to(ROOT).as_posix()


def test_the_textbook_is_seven_or_eight_numbered_pages_in_toctree_order():
    names = [p.stem for p in PAGES]
    assert 7 <= len(names) <= 8, names
    assert [int(n.split("-")[0]) for n in names] == list(range(1, len(names) + 1)), names
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    toctree = re.search(r"```\{toctree\}\n:caption: The textbook\n(.*?)```", index, re.DOTALL)
    assert toctree, "index.md has a toctree captioned 'The textbook'"
    assert ":numbered:" in toctree.group(1)
    listed = [line for line in toctree.group(1).splitlines() if line.startswith("textbook/")]
    assert listed == [f"textbook/{n}" for n in names]
    # the reading path in index.md uses the toctree's numbers, in its order
    path = re.findall(r"^(\d+)\. \{doc\}`textbook/([^`]+)`", index, re.MULTILINE)
    assert path == [(str(i), n) for i, n in enumerate(names, 1)], path


def test_the_detectors_catch_what_they_should():
    for bad in ("tree 5e6f6b6", "(commit aa4b38f)", "the tree `9b94312`",
                "5e6f6b6a1b2c3d4e5f60718293a4b5c6d7e8f901"):
        assert TREE.search(bad), bad
    for fine in ("a binary tree of 32 slots", "the reduction tree", "tree 7 levels deep",
                 "cafe"):
        assert not TREE.search(fine), fine
    assert ARCHITECTURE.search("on Hopper") and not ARCHITECTURE.search("hop")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_page_names_no_gpu_tree_or_diary_ordinal(page):
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for what, pattern in (("GPU", GPU), ("architecture", ARCHITECTURE), ("tree hash", TREE),
                              ("diary ordinal", DIARY)):
            if pattern.search(line):
                found.append(f"{_name(page)}:{number}: {what}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_page_is_short(page):
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))
    words = len(prose.split())
    assert words <= MAX_WORDS, f"{_name(page)}: {words} words of prose (at most {MAX_WORDS})"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_page_ends_with_what_the_next_page_changes(page):
    text = page.read_text(encoding="utf-8")
    headings = HEADING.findall(text)
    last = page == PAGES[-1]
    want = "What to read next" if last else "What the next page changes"
    assert headings and headings[-1].strip() == want, (_name(page), headings[-1:])
    tail = text[text.rindex("## " + want):]
    if not last:  # and it names the next page
        assert f"{{doc}}`{PAGES[PAGES.index(page) + 1].stem}`" in tail, _name(page)
    # each page has the parts a rung page has: a NumPy twin, a kernel, a cost
    assert "NumPy twin" in text, _name(page)
    assert "literalinclude" in text, _name(page)
    assert "## What it costs" in text, _name(page)


def test_the_walks_are_written_in_the_markdown():
    online = (TEXTBOOK / "2-online.md").read_text(encoding="utf-8")
    flash = (TEXTBOOK / "5-flashattention.md").read_text(encoding="utf-8")
    # no comment standing in for the numbers: the table itself is in the source
    assert "% computed:" not in online and "% computed:" not in flash
    assert "<!-- computed: walk.softmax -->\nThe row (16 float32 values" in online
    assert "chunk state (m̃, ℓ̃) = (" in online and "| LSE $= m + \\log \\ell$ |" in online
    assert "<!-- computed: walk.attention -->\nOne query row" in flash
    assert "| 32–36 |" in flash  # the ragged last tile


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_numbers_written_in_a_page_are_what_it_computes(page):
    text = page.read_text(encoding="utf-8")
    assert computed.blocks(text), f"{_name(page)} runs no snippet and computes nothing"
    stale = computed.check(text)
    assert not stale, (f"{_name(page)}: stale blocks {stale}; run python docs/_ext/computed.py "
                       f"--write {_name(page)}")


def test_a_checked_block_catches_a_changed_number():
    written = "m = 3.912, ℓ = 1.6542, err 3.1e-08, chunk 2"
    assert computed.same(written, "m = 3.912, ℓ = 1.6543, err 5.0e-08, chunk 2")  # last digit
    assert not computed.same(written, "m = 3.912, ℓ = 1.6562, err 3.1e-08, chunk 2")
    assert not computed.same(written, "m = 3.912, ℓ = 1.6542, err 3.1e-08, chunk 3")  # integers
    assert not computed.same(written, "m = 3.912, l = 1.6542, err 3.1e-08, chunk 2")  # words
    page = "```python\nprint(6 * 7)\n```\n<!-- computed: run -->\n```text\n41\n```\n<!-- end computed -->\n"
    assert computed.check(page) == ["run"]
    assert computed.check(computed.rewrite(page)) == []
    assert "```text\n42\n```" in computed.rewrite(page)
