"""Sphinx configuration of keras_ddl's API reference (docs/api/).

Build it from the repository root (tests/docs/test_api_reference.py does, with
warnings as errors):

    python -m sphinx -W --keep-going -b html docs/api build/api

Why Sphinx: autodoc imports the real package, so the reference is what
`import keras_ddl` exports (a name that moved or lost its docstring shows);
napoleon reads the Google-style `Args:` / `Returns:` sections the code
uses, as Keras and TensorFlow do; and with -W every docutils complaint
about a docstring (a broken list, a bad indentation) fails the build. It
needs nothing beyond Sphinx itself: no theme package, no network (no
intersphinx).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "_ext"))
# keras_ddl is imported from the installed package (src layout: the
# checkout's sources have no compiled libraries).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

project = "keras_ddl"
author = "keras_ddl's authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "keras_ddl_reference"]
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
html_copy_source = False
# Options such as --mca stay two hyphens.
smartquotes = False
html_show_sourcelink = False

# Docstrings write code in single back-quotes, as Keras's do.
default_role = "literal"
# Docstrings say what types they take in words; signatures are enough.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": False, "undoc-members": False}
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
