"""Loading ``ddl_tf_ops.so``, the TensorFlow op library beside the package.

The library only loads into the TensorFlow it was compiled against, so its
build record is checked first and a mismatch is an ImportError that says how
to rebuild. The core library is loaded (``basics.init``) before it, so the
op library links to the already-loaded core.
"""

import threading

import tensorflow as tf

from ..common import basics


_lib = None
_lib_lock = threading.Lock()


def op_library():
    """Loads the TensorFlow op library, checking it matches this TensorFlow."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            info = basics.build_info()
            built_for = info.get("tensorflow")
            if built_for != tf.__version__:
                raise ImportError(
                    f"keras_ddl's op library was built for TensorFlow {built_for}, but "
                    f"TensorFlow {tf.__version__} is installed; a custom op library only "
                    "loads into the TensorFlow it was compiled against.\n" + basics.REBUILD_HINT)
            basics.init()  # loads the core first, so the op library links to it
            try:
                _lib = tf.load_op_library(basics.OPS_LIBRARY)
            except (tf.errors.NotFoundError, OSError) as e:
                raise ImportError(
                    f"cannot load {basics.OPS_LIBRARY} (built for TensorFlow {built_for}): "
                    f"{e}\n" + basics.REBUILD_HINT) from e
    return _lib
