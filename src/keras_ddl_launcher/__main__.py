"""``python -m keras_ddl_launcher``: the ``ddlrun`` command."""

import sys

from .ddlrun import main

if __name__ == "__main__":
    sys.exit(main())
