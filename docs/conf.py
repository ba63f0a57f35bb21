"""Sphinx configuration of daskrl's documentation site.

Build: ``pip install -e ".[docs]"`` then
``sphinx-build -W --keep-going -b html docs docs/_build/html`` (what ``.ci/run`` does).

Why this stack: Sphinx with numpydoc and the PyData theme is what Dask and distributed (and
NumPy, pandas, xarray) build their documentation with, so a Dask user finds the layout,
search and API pages they know, and daskrl's docstrings, written in numpydoc and run as
doctests, become the API reference through autodoc unchanged. MyST-Parser lets every page
be markdown, like the README and the ``benchmarks/*.md`` pages the benchmark scripts write,
which the site shows as they are. sphinx-argparse draws the CLI reference from daskrl's own
argparse parser, and ``_ext/daskrl_docs.py`` adds the graph scripts' tyro flags, the
public API's list and the benchmark pages, each made from the code at build time, so they
follow the code by themselves. The build needs no network (no intersphinx): it runs where
CI runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # daskrl from this checkout, also when not installed

project = "daskrl"
author = "the daskrl developers"
copyright = "the daskrl developers"  # noqa: A001 - Sphinx's name for it

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
    "sphinxarg.ext",
    "daskrl_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext", "**/.ipynb_checkpoints", "benchmarks/_*.md"]
root_doc = "index"

# MyST: GitHub-style anchors (benchmark pages link to their own headings), ::: fences
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# numpydoc renders the docstrings; autodoc lists members itself (no autosummary stubs)
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types

html_theme = "pydata_sphinx_theme"
html_title = "daskrl"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"index": [], "getting-started": []}  # pages without a section to list
html_static_path: list[str] = []
html_show_sourcelink = False
