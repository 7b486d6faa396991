"""The project speaks of itself alone: no GPU names in kernel source, no work-diary ordinals.

Measured figures and the devices they came from live in the docs pages and the records
under ``docs/benchmarks/``; the kernel source says what the code does and why.  And no
reader-facing text counts the sittings it was written in ("the forty-second session").
Each test lists every offending line as ``file:line``.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS = ROOT / "numba_softmax" / "kernels"
DATA = {KERNELS / "softmax" / "crossovers.json"}  # measured thresholds: data, not prose
TEXT = {".md", ".py", ".txt", ".csv", ".json", ".jsonl"}

GPU = re.compile(r"(?<![A-Za-z0-9])(?:H100|H200|H800|A100|L40S?|RTX|4090)(?![0-9])", re.I)

_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_TEENS = "eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth"
DIARY = re.compile(
    rf"\b(?:{_TENS})[-\s](?:{_UNITS})\b"  # twenty-first … ninety-ninth
    rf"|\b(?:{_TEENS}|twentieth|thirtieth|fortieth|fiftieth|sixtieth|seventieth"
    rf"|eightieth|ninetieth|hundredth)\b"  # eleventh and up
    rf"|\b(?:{_UNITS}|tenth)\s+sessions?\b"  # the third session
    rf"|\b\d+(?:st|nd|rd|th)\s+sessions?\b"  # the 12th session
    rf"|\bsessions?\s+#?\d+\b"  # session 12
    rf"|\b(?:the|a|this|that|one|each|same|next|last|previous|earlier|later)\s+sitting\b"
    rf"|\bsittings\b",
    re.I,
)


def hits(pattern, paths):
    """``file:line: text`` for every line of ``paths`` that ``pattern`` matches."""
    found = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def text_files(top):
    """Every text file under ``top`` (one of :data:`TEXT`), built docs left out."""
    if top.is_file():
        return [top]
    return sorted(p for p in top.rglob("*") if p.is_file() and p.suffix in TEXT
                  and "_build" not in p.parts and "__pycache__" not in p.parts)


def test_detectors_match_what_they_should():
    for bad in ("the forty-second session", "in the nineteenth", "Twenty-First", "the third session",
                "the 12th session", "session 7", "thirtieth", "that sitting", "over three sittings"):
        assert DIARY.search(bad), bad
    for fine in ("the first pass", "the second kernel", "a third read", "the fourth column",
                 "tenth of a second", "first-order", "forty two", "tiles of 16 sitting inside a page",
                 "sessionless", "one hundred twenty"):
        assert not DIARY.search(fine), fine
    for bad in ("an H100", "H200:", "A100's", "rtx 4090", "NVIDIA L40S", "H100_SHARED"):
        assert GPU.search(bad), bad
    for fine in ("H1000", "sm_90", "xH100", "A1000", "4090000"):
        assert not GPU.search(fine), fine


def test_no_gpu_names_in_kernel_source():
    found = hits(GPU, [p for p in text_files(KERNELS) if p not in DATA])
    assert not found, "GPU names in kernel source (measurements go to docs/):\n" + "\n".join(found)


def test_no_diary_ordinals():
    paths = (text_files(ROOT / "numba_softmax") + text_files(ROOT / "README.md") + text_files(ROOT / "docs")
             + text_files(ROOT / "tests") + text_files(ROOT / "scripts"))
    paths = [p for p in paths if p.resolve() != ROOT.joinpath("tests", "test_hygiene.py").resolve()]  # its own examples
    found = hits(DIARY, paths)
    assert not found, "work-diary ordinals (speak of the project instead):\n" + "\n".join(found)
