"""One GPU per local rank, chosen by ``ddl.init()`` on every path.

Without this, TensorFlow gives every process on a server all of its GPUs
and places every op on GPU 0: eight ranks on an eight-GPU server would all
compute on the first GPU (and each would reserve nearly all of its memory),
whatever wraps the model (``DistributedOptimizer``, ``DDLStrategy``, a
custom loop with ``DistributedGradientTape``). So ``init()`` makes exactly
one GPU visible to each rank, GPU ``local_rank() % number of GPUs``, and
turns on memory growth for it, before TensorFlow's runtime starts.

* ``CUDA_VISIBLE_DEVICES`` is respected: TensorFlow lists only the GPUs it
  names, and the choice is made among those. A launcher that already gives
  each rank one GPU (Slurm ``--gpus-per-task=1``) leaves one to choose.
* ``DDL_PIN_GPU=0`` opts out (the script places its ops itself, or runs
  several GPUs per rank with ``tf.distribute.MirroredStrategy``).
* TensorFlow refuses to change the visible devices once its runtime has
  started (a tensor was made before ``ddl.init()``). If the rank would then
  compute on another GPU than its own, ``init()`` raises: silently leaving
  every rank on GPU 0 is the failure this module exists to prevent.

Everything that talks to TensorFlow goes through ``tf.config`` (listed in
``_tf_config``), so tests fake the device list there; no GPU is needed.
"""

import os
import warnings

PIN_VARIABLE = "DDL_PIN_GPU"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class GpuPinningError(RuntimeError):
    """The rank's GPU could not be made the only visible one."""


def pinning_enabled(environ=os.environ):
    """Whether ``DDL_PIN_GPU`` asks for one GPU per local rank (default yes).

    Raises:
        ValueError: the variable is set to something other than 0/1,
            true/false, yes/no, on/off (every rank reads the same value, so
            every rank raises).
    """
    value = environ.get(PIN_VARIABLE, "1").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"keras_ddl: {PIN_VARIABLE}={environ[PIN_VARIABLE]!r} is not a boolean; "
                     "use 1 (one GPU per local rank, the default) or 0 (leave GPU "
                     "placement to the script)")


def _tf_config():
    import tensorflow as tf
    return tf.config


def pin_gpu_to_local_rank(local_rank, local_size, environ=os.environ):
    """Makes GPU ``local_rank % gpus`` the only GPU this process sees.

    Args:
        local_rank: This process's rank on its server.
        local_size: How many ranks share the server (for the warning when
            several must share one GPU).
        environ: Where ``DDL_PIN_GPU`` is read (tests pass a dict).

    Returns:
        The chosen ``tf.config.PhysicalDevice``, or None when pinning is off
        or there is no GPU.

    Raises:
        ValueError: ``DDL_PIN_GPU`` is not a boolean.
        GpuPinningError: TensorFlow's runtime had already started with
            another GPU visible, so this rank cannot be moved to its own.
    """
    if not pinning_enabled(environ):
        return None
    config = _tf_config()
    gpus = config.list_physical_devices("GPU")
    if not gpus:
        return None
    chosen = gpus[local_rank % len(gpus)]
    if local_size > len(gpus):
        warnings.warn(f"keras_ddl: {local_size} ranks on this server share {len(gpus)} "
                      f"visible GPU(s); local rank {local_rank} uses {chosen.name}",
                      RuntimeWarning, stacklevel=3)
    try:
        config.set_visible_devices([chosen], "GPU")
    except RuntimeError as e:
        # TensorFlow started before ddl.init(). It accepts the call only if
        # the visible set would not change, so we are here because it would.
        visible = [d.name for d in config.get_visible_devices("GPU")]
        raise GpuPinningError(
            f"keras_ddl.init(): local rank {local_rank} should compute on {chosen.name}, but "
            f"TensorFlow's runtime already started with GPUs {visible} visible ({e}), so every "
            "rank of this server would compute on the first of them. Call ddl.init() before "
            "creating any tensor or model, or set DDL_PIN_GPU=0 and place the ops yourself."
        ) from None
    try:
        config.experimental.set_memory_growth(chosen, True)
    except RuntimeError:
        # Only possible when the runtime started with exactly this GPU
        # visible: the placement is right, the memory policy is the user's.
        warnings.warn(f"keras_ddl: TensorFlow started before ddl.init(); memory growth on "
                      f"{chosen.name} is left as it was", RuntimeWarning, stacklevel=3)
    return chosen
