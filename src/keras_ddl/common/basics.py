"""Process model: start and stop the collective engine, and ask who we are.

The engine lives in ``libddl_core.so`` (plain C++ over MPI), loaded here
with ctypes. mpi4py is imported first so it initialises MPI with
``MPI_THREAD_MULTIPLE`` and so the core and mpi4py share one MPI library in
the process; a mismatch between the two is detected and reported.
"""

import atexit
import ctypes
import json
import os
import re
import threading

from . import slurm_pmi

# The build puts its outputs in the package's top directory, one above this.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_LIBRARY = os.path.join(_HERE, "libddl_core.so")
OPS_LIBRARY = os.path.join(_HERE, "ddl_tf_ops.so")
BUILD_INFO = os.path.join(_HERE, "build_info.json")

REBUILD_HINT = (
    "Rebuild keras_ddl against the installed packages with\n"
    "    pip install --no-build-isolation --no-deps --force-reinstall .\n"
    "from the keras_ddl source tree (see README.md).")

# Status codes of the C++ core (custom_ops/common/types.h, Status::Code).
_INVALID_ARGUMENT = 1

_lock = threading.Lock()
_core = None
_atexit_registered = False
_horovod_notes = None  # what became of each HOROVOD_* variable (mapped once per process)
_process_configured = False  # GPU pinned and HOROVOD_* warning given


def build_info():
    """What the compiled libraries were built against (a dict)."""
    try:
        with open(BUILD_INFO) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ImportError(
            "keras_ddl's compiled libraries are missing (no build_info.json next to "
            f"{__file__}).\n" + REBUILD_HINT) from None


def _load_core():
    global _core
    if _core is not None:
        return _core
    info = build_info()
    # Under srun --mpi=pmi2, MPICH's requests must fit what Slurm reads at once.
    slurm_pmi.start_relay()
    from mpi4py import MPI  # initialises MPI before the core touches it

    try:
        lib = ctypes.CDLL(CORE_LIBRARY, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise ImportError(f"cannot load {CORE_LIBRARY}: {e}\n" + REBUILD_HINT) from e
    lib.ddl_last_error.restype = ctypes.c_char_p
    lib.ddl_mpi_library_version.argtypes = [ctypes.c_char_p, ctypes.c_int]
    for fn in ("ddl_float_to_half", "ddl_float_to_bfloat16"):
        getattr(lib, fn).argtypes = [ctypes.c_float]
        getattr(lib, fn).restype = ctypes.c_uint16
    for fn in ("ddl_half_to_float", "ddl_bfloat16_to_float"):
        getattr(lib, fn).argtypes = [ctypes.c_uint16]
        getattr(lib, fn).restype = ctypes.c_float

    buf = ctypes.create_string_buffer(8192)
    lib.ddl_mpi_library_version(buf, len(buf))
    core_mpi = buf.value.decode(errors="replace").strip()
    mpi4py_mpi = MPI.Get_library_version().strip()
    if core_mpi.splitlines()[:1] != mpi4py_mpi.splitlines()[:1]:
        raise ImportError(
            "keras_ddl and mpi4py use different MPI libraries in this process:\n"
            f"  keras_ddl (built with {info.get('mpi', '?')}): {core_mpi.splitlines()[:1]}\n"
            f"  mpi4py: {mpi4py_mpi.splitlines()[:1]}\n"
            "Build mpi4py against the same MPI (pip install --no-binary mpi4py mpi4py with "
            "MPICC set), or rebuild keras_ddl with DDL_MPI_CXX naming that MPI's compiler.")
    _core = lib
    return lib


def init():
    """Starts keras_ddl on this process (idempotent).

    Collectives call it implicitly. A process started without any launcher
    is a world of size 1. The first call also

    * carries every ``HOROVOD_*`` setting over to its ``DDL_*`` twin, and
      names the others in a warning on rank 0 (``keras_ddl.horovod_env``);
    * makes one GPU visible to this process, GPU ``local_rank() % GPUs``,
      with memory growth on (``keras_ddl.gpus``; ``DDL_PIN_GPU=0`` opts
      out). Call ``init()`` before making any tensor, or TensorFlow refuses.

    Raises:
        ValueError: an invalid ``DDL_*`` or ``HOROVOD_*`` environment
            variable (on every rank, naming the variable).
        keras_ddl.gpus.GpuPinningError: TensorFlow started before ``init()``
            with another GPU visible than this rank's.
        keras_ddl.common.launch_env.LauncherMismatchError: the launcher says it
            started several tasks (``SLURM_STEP_NUM_TASKS`` in an srun
            step, ``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``, ...) but MPI sees a
            world of 1 here, so each task would train alone (on every task,
            naming the variable and the fix; ``DDL_LAUNCHER_CHECK=0`` skips
            the check).
    """
    global _atexit_registered, _horovod_notes, _process_configured
    from . import gpus, horovod_env, launch_env
    with _lock:
        lib = _load_core()
        if not lib.ddl_is_initialized():
            # Before the engine starts: N tasks that each see a world of 1
            # would each train alone and exit 0 (keras_ddl.launch_env).
            from mpi4py import MPI
            launch_env.check(MPI.COMM_WORLD.Get_size(), build_info().get("mpi", "?"))
        if _horovod_notes is None:  # before the engine reads the DDL_* twins
            _horovod_notes = horovod_env.apply()
        pin = gpus.pinning_enabled()  # a bad DDL_PIN_GPU fails before the engine starts
        code = lib.ddl_init()
        if code != 0:
            message = lib.ddl_last_error().decode()
            twin = re.search(r"DDL_[A-Z_]+", message)
            origin = twin and horovod_env.mapped_from(twin.group(0), _horovod_notes)
            if origin:
                message += f" (set from {origin}={os.environ.get(origin)!r})"
            raise (ValueError if code == _INVALID_ARGUMENT else RuntimeError)(
                f"keras_ddl.init() failed: {message}")
        if not _atexit_registered:
            # Registered after mpi4py's import, so it runs before MPI finalises.
            atexit.register(_at_exit)
            _atexit_registered = True
        if not _process_configured:
            if pin:  # raises, and is tried again by the next init(), if TF started first
                gpus.pin_gpu_to_local_rank(int(lib.ddl_local_rank()),
                                           int(lib.ddl_local_size()))
            horovod_env.warn(_horovod_notes, int(lib.ddl_rank()))
            _process_configured = True


def shutdown():
    """Stops the engine; collectives in flight on any rank fail with an error.

    Raises:
        RuntimeError: the engine failed to stop cleanly (the core's message).
    """
    with _lock:
        if _core is not None:
            code = _core.ddl_shutdown()
            if code != 0:
                raise RuntimeError(
                    f"keras_ddl.shutdown() failed: {_core.ddl_last_error().decode()}")


def _at_exit():
    # After a peer died, MPI_Finalize could wait for it forever: end the
    # whole job instead, with a non-zero exit code on every rank.
    if _core is not None and _core.ddl_peer_failure_seen():
        import sys
        sys.stderr.write("[keras_ddl] a peer rank failed; aborting the MPI job\n")
        sys.stderr.flush()
        import time
        time.sleep(1.0)  # let the other live ranks report their errors first
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
    try:
        shutdown()
    except RuntimeError as e:  # at exit nobody can catch it: say it
        import sys
        sys.stderr.write(f"[keras_ddl] {e}\n")


def is_initialized():
    """Whether `init()` has run in this process and `shutdown()` has not."""
    return _core is not None and bool(_core.ddl_is_initialized())


def _query(fn_name):
    if not is_initialized():
        init()
    return int(getattr(_core, fn_name)())


def rank():
    """This process's rank in the world, 0 <= rank < size."""
    return _query("ddl_rank")


def size():
    """Number of processes in the job."""
    return _query("ddl_size")


def local_rank():
    """Rank among the processes on this node (or virtual node, DDL_LOCAL_SIZE)."""
    return _query("ddl_local_rank")


def local_size():
    """Number of processes on this node."""
    return _query("ddl_local_size")


def cross_rank():
    """Index of this node among the nodes (rank within the same-local-rank group)."""
    return _query("ddl_cross_rank")


def cross_size():
    """Number of nodes holding a process with this local rank."""
    return _query("ddl_cross_size")


def allreduce_algorithm():
    """How allreduce runs here: "flat" (ring over MPI), "shared_memory" (one
    node), "hierarchical" (shared memory in each node, MPI across), or
    "racks" (shared memory in each node, then the rack allreduce: inside
    each rack, across racks, back; docs/topology.md)."""
    return ("flat", "shared_memory", "hierarchical", "racks")[_query("ddl_allreduce_algorithm")]


def topology():
    """The racks every rank agreed on at init (docs/topology.md), a dict:
    ``racks`` (names, in order of their lowest rank; one "" without racks),
    ``rack_of_rank`` and ``node_of_rank`` (indices, per rank),
    ``nodes_per_rack`` (0 when racks differ in size), ``source``
    ("DDL_TOPOLOGY", "SLURM_TOPOLOGY_ADDR", "probe" when the racks were
    measured at init, "unknown" for DDL_TOPOLOGY=unknown, or "" for none),
    ``used`` (the rack allreduce runs), ``probe_verdict`` ("racks", "one
    switch", "unclear", or "" without a probe), ``probe_confirmed`` (racks
    that a second, independent measurement pass found too: the only racks
    the probe acts on), ``probe_checks`` (what the probe measured after its
    first pass and what it showed: slow pairs measured again, "confirmed:
    ..." or "unconfirmed: ..."; "" otherwise), ``probed_by_default`` (the
    probe ran because no topology was given), ``probe_seconds`` (what the
    probe took at init, 0 otherwise), ``schedule`` (what large allreduces
    across nodes run: "racks", "chain" when nothing says what the network
    is, "pairwise", or "none" on one node) and
    ``description`` (one line, as ddlrun --verbose prints it; with no
    topology given it starts "no topology given", says what the probe
    found, names the schedule and says how to describe the racks)."""
    import json

    if not is_initialized():
        init()
    lib = _load_core()
    lib.ddl_topology.argtypes = [ctypes.c_char_p, ctypes.c_int]
    size_needed = lib.ddl_topology(None, 0)
    if size_needed < 0:
        raise RuntimeError("keras_ddl is not initialized")
    buf = ctypes.create_string_buffer(size_needed + 1)
    lib.ddl_topology(buf, len(buf))
    return json.loads(buf.value.decode())


def traffic():
    """Bytes this rank has moved since init, by path: a dict with
    ``intra_node_bytes`` (through node shared memory), ``cross_node_bytes``
    (handed to the cross-node phase), ``flat_bytes`` (flat ring) and
    ``shared_output_bytes`` (allreduce results delivered straight into
    node shared memory, see DDL_SHM_POOL_MB), ``alltoall_bytes``
    (sent to other ranks by ``alltoall``) and ``rack_bytes`` (allreduced
    by the rack allreduce with one rank per node: the buffers' bytes on the
    wire dtype of the whole call, so fp16 on the uplinks alone, which only
    halves what stages B and C send, does not change it)."""
    if not is_initialized():
        init()
    counters = (ctypes.c_uint64 * 6)()
    if _core.ddl_traffic(counters) != 0:
        raise RuntimeError("keras_ddl is not initialized")
    return dict(zip(("intra_node_bytes", "cross_node_bytes", "flat_bytes",
                     "shared_output_bytes", "alltoall_bytes", "rack_bytes"), counters))


def settings_in_force():
    """The fusion threshold and cycle time the engine runs with now, a dict:
    ``fusion_threshold_mb`` and ``cycle_time_ms``. They are
    ``DDL_FUSION_THRESHOLD_MB`` and ``DDL_CYCLE_TIME_MS`` until
    ``DDL_AUTOTUNE=1`` decides (docs/autotune.md), then rank 0's choice on
    every rank: read after training, they are the values to set in the next
    job's environment without autotune. An allreduce's cycle sets them
    before its batches, so a read between calls sees what the last call
    ran with."""
    if not is_initialized():
        init()
    in_force = (ctypes.c_double * 2)()
    if _core.ddl_settings_in_force(in_force) != 0:
        raise RuntimeError("keras_ddl is not initialized")
    return {"fusion_threshold_mb": in_force[0], "cycle_time_ms": in_force[1]}


def probe_port():
    """The TCP port on which this process answers the other ranks' probes
    when a collective waits long (docs/failures.md), or 0 if it could not
    open one. Firewalls between hosts must let it through for a wait to be
    diagnosed; ``python -m keras_ddl.check`` prints it."""
    if not is_initialized():
        init()
    port = _core.ddl_probe_port()
    if port < 0:
        raise RuntimeError("keras_ddl is not initialized")
    return port


def timeline_mark(label):
    """Adds a marker (e.g. "step 10") to the timeline rank 0 writes when
    DDL_TIMELINE is set; does nothing otherwise."""
    if not is_initialized():
        init()
    _core.ddl_timeline_mark(str(label).encode())


def core_library():
    """The loaded core (ctypes), for tests and tools."""
    return _load_core()
