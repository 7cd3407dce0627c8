import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "snnquant"
author = "snnquant developers"
copyright = "2026, snnquant developers"

import snnquant  # noqa: E402

release = snnquant.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["cupy"]
napoleon_google_docstring = True
napoleon_numpy_docstring = True
nitpicky = False
html_theme = "alabaster"
exclude_patterns = ["_build"]
suppress_warnings = ["ref.duplicate"]
