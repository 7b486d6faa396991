"""Draw every figure of the docs: ``python docs/figures/make.py`` (needs matplotlib,
``pip install -e ".[bench]"``).

* the diagrams, into ``docs/figures/`` (``fig_streams.py``, ``fig_trees.py``,
  ``fig_tiles.py``, ``fig_chapters.py``): the same SVG bytes on every run, so ``git diff`` shows only real
  changes;
* the measured plots, into ``docs/benchmarks/`` beside the CSVs they read
  (``measured.py``); run it again after committing a new benchmark CSV.

``--diagrams`` or ``--measured`` draws only one kind.  The SVGs are committed; the docs
build only includes them (it needs no matplotlib).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent.parent))  # numba_softmax

import fig_chapters  # noqa: E402
import fig_streams  # noqa: E402
import fig_tiles  # noqa: E402
import fig_trees  # noqa: E402
import measured  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--diagrams", action="store_true", help="only the diagrams")
    only.add_argument("--measured", action="store_true", help="only the measured plots")
    args = parser.parse_args(argv)
    written = []
    if not args.measured:
        for module in (fig_streams, fig_trees, fig_tiles, fig_chapters):
            written += module.make()
    if not args.diagrams:
        written += measured.make()
    root = Path(__file__).resolve().parent.parent.parent
    for path in written:
        print("wrote", Path(path).resolve().relative_to(root))


if __name__ == "__main__":
    main()
