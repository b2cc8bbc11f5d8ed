"""Where the repository checkout is, for the tools that read or write its
files (docs/results, docs/model_data, the docs pages).

The tools run from an installed copy (src layout: site-packages, not the
checkout) or from an editable install (the checkout's src/ folder). The
checkout is the one this file sits in when that has the marker file, else
the current directory when it is a checkout: the suite and the docs'
commands run from the repository root.
"""

import os

# A file every checkout has and an installed package never does.
MARKER = os.path.join("docs", "results")
# src/keras_ddl_tools/checkout.py -> the repository root.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def repository():
    """The checkout's root (the source tree's when it is not one, so that
    paths made from it still name something in error messages)."""
    for where in (_SOURCE_ROOT, os.getcwd()):
        if os.path.exists(os.path.join(where, MARKER)):
            return where
    return _SOURCE_ROOT
