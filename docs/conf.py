"""Sphinx configuration of the spectral_jax documentation site.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (the ``docs`` extra).
Pages are MyST Markdown; the API pages are reStructuredText because autodoc's generated
content is reStructuredText. Notebooks are shown from ``docs/notebooks/``: copies with their
outputs, written by ``docs/execute_notebooks.py``; the build executes nothing.
Math is rendered in the browser by a MathJax copy bundled with the site
(``sphinx-mathjax-offline``), so pages need no network.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import spectral_jax  # noqa: E402

project = "spectral_jax"
author = "spectral_jax contributors"
copyright = "spectral_jax contributors"
release = getattr(spectral_jax, "__version__", "")

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",
    "spectral_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
root_doc = "index"

# MyST: $...$ and $$...$$ math, ::: fences, heading anchors for links between pages.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"

# autodoc / napoleon: Google-style docstrings, signatures as written, members in source order.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Not autodoc_preserve_defaults: it rewrites the functions' defaults in place, and the
# method table reads them (a causal-only method is one whose is_causal defaults to True).
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
add_module_names = False

html_theme = "furo"
html_title = "spectral_jax"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
