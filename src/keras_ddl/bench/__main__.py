"""Runs ``python -m keras_ddl_tools.bench`` under its documented name."""

import sys

from keras_ddl_tools.bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
