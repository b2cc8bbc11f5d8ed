"""``python -m keras_ddl_tools.scaling_model``: the model's command without
importing keras_ddl."""

import argparse

from .cli import add_arguments, main

if __name__ == "__main__":
    _parser = argparse.ArgumentParser(
        prog="python -m keras_ddl_tools.scaling_model",
        description="alpha-beta scaling model (the same as python -m keras_ddl.bench model, "
                    "without importing keras_ddl)")
    add_arguments(_parser)
    main(_parser.parse_args())
