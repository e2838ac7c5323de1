"""The documentation site (Sphinx, MyST Markdown, furo): ``make docs`` builds it into ``docs/_build/html``.

Sphinx because the docstrings are reStructuredText (their roles render as links in the API reference) and
``sphinx-argparse`` documents the command line from the parser the program itself uses. Each task's page is its
folder's ``README.md``, included from there, followed by what the task declares (roles, options, experiments,
scorers), generated from the registered task at build time, so no page restates by hand what the code declares.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "craftmd"
author = "the craftmd authors"
copyright = "the craftmd authors (MIT)"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxarg.ext", "craftmd_docs"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_heading_anchors = 3  # a Markdown link to "page.md#a-heading" is checked like any other reference
myst_enable_extensions = ["colon_fence"]
exclude_patterns = ["_build", "_generated/README.md"]
html_theme = "furo"
html_title = "craftmd"
html_static_path: list[str] = []
nitpicky = False
autodoc_typehints = "none"  # the signatures name the types; the docstrings say what they mean
autodoc_member_order = "bysource"
suppress_warnings = ["myst.header"]  # a page may start its sections at ## below an included README's #
