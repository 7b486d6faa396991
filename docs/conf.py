"""Sphinx configuration: MyST Markdown pages, kernel source included live, API from docstrings.

Build:  sphinx-build -W -b html docs docs/_build/html   (warnings are errors)

The API pages import ``numba_softmax``.  Without a usable GPU the package is imported on
the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), decided here *before* numba is imported;
a value set in the environment wins.  The build launches a few tiny kernels (the walk of
one row, ``docs/_ext/walk.py``, through ``docs/_ext/computed.py``): under a second on the
simulator.
"""

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent


def _gpu_usable():
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return (libcuda.cuInit(0) == 0 and libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0
                and count.value > 0)
    except OSError:
        return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_usable():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

sys.path.insert(0, str(ROOT))  # the checkout's package, installed or not
sys.path.insert(0, str(DOCS / "_ext"))

import numba_softmax  # noqa: E402

project = "numba_softmax"
author = "numba_softmax contributors"
copyright = "numba_softmax contributors"
release = version = numba_softmax.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "benchmark_tables",  # docs/_ext: measured tables and plots from docs/benchmarks/, if present
    "computed",  # docs/_ext: `% computed: NAME` — the walk of one row, the sources' forms, run
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "alabaster"
html_title = "numba_softmax"
html_static_path = ["_static"]
html_theme_options = {"description": "online softmax and attention in numba.cuda",
                      "fixed_sidebar": True}


def _kernel_chapter_as_text(app, what, name, obj, options, lines):
    """A kernel module's docstring is a chapter summary laid out as plain text (aligned
    columns, ASCII diagrams), not reStructuredText: show it verbatim."""
    if what == "module" and name.startswith("numba_softmax.kernels.") and lines:
        lines[:] = ["::", ""] + ["    " + line for line in lines] + [""]


def _draw_architecture(app):
    """Redraw the package's picture and folder table from its imports and ``__init__``
    docstrings (``docs/figures/architecture.py``: ast only, no import, no matplotlib),
    so ``architecture.md`` and ``api.md`` show the code as it is."""
    script = DOCS / "figures" / "architecture.py"
    spec = importlib.util.spec_from_file_location("architecture", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write()


def setup(app):
    app.connect("builder-inited", _draw_architecture)
    app.connect("autodoc-process-docstring", _kernel_chapter_as_text)
