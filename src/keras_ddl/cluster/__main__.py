"""Runs ``python -m keras_ddl_tools.cluster`` under its documented name."""

import sys

from keras_ddl_tools.cluster.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
