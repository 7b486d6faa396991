#!/usr/bin/env python
"""Is the committed GPU-check record current?  One line per record, never a failure.

A record (``docs/benchmarks/gpu-check-<device>.json``, written by
``scripts/gpu_check.py`` on a GPU) is *current* when its hash of the package's source
files equals the working tree's: the checked code is the code here.  CI prints this line
(it has no GPU to re-run the check).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ROOT, source_hash  # noqa: E402


def main():
    here = source_hash()
    records = sorted((ROOT / "docs" / "benchmarks").glob("gpu-check-*.json"))
    if not records:
        print("GPU check record: none committed")
    for path in records:
        rec = json.loads(path.read_text())
        state = "current" if rec.get("source_hash") == here else "STALE (the package changed since)"
        print(f"GPU check record {path.name}: {state}; {rec.get('verdict', '?')} on "
              f"{rec.get('device', '?')}, {rec.get('date', '?')}, {rec.get('fuzz_cases', '?')} fuzz cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
