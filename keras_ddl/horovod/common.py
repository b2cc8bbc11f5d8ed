"""What the Horovod front doors share: start-up, process sets, build flags
and the checks of Horovod-only arguments."""

import keras_ddl as ddl
from keras_ddl import basics


class ProcessSet(ddl.ProcessSet):
    """Horovod's ProcessSet: keras_ddl's (ranks, included, rank, size). The
    front door runs collectives over the global set only; a set naming
    every rank counts as it."""

    def _is_global(self):
        return self.ranks == list(range(basics.size()))


global_process_set = ddl.global_process_set


def check_process_set(process_set, function):
    """Raises NotImplementedError unless `process_set` is the global set."""
    if process_set is global_process_set:
        return
    if isinstance(process_set, ProcessSet) and process_set._is_global():
        return
    raise NotImplementedError(
        f"keras_ddl.horovod: {function}(process_set={process_set!r}): only the global process "
        f"set is supported (rank {basics.rank()}); every collective runs over all ranks")


def add_process_set(process_set):
    """Not supported: raises NotImplementedError."""
    raise NotImplementedError("keras_ddl.horovod: add_process_set is not supported; only the "
                              f"global process set exists (got {process_set!r})")


def remove_process_set(process_set):
    """Not supported: raises NotImplementedError."""
    raise NotImplementedError("keras_ddl.horovod: remove_process_set is not supported; only "
                              f"the global process set exists (got {process_set!r})")


class _Adasum:
    """Horovod's Adasum reduction: not available in keras_ddl."""

    def __repr__(self):
        return "Adasum"


Adasum = _Adasum()


def reduce_op(op, average, function, default=ddl.Average):
    """Horovod's `op` / deprecated `average` pair as a keras_ddl ReduceOp."""
    if op is Adasum:
        raise NotImplementedError(f"keras_ddl.horovod: {function}(op=Adasum) is not supported; "
                                  "use Average or Sum")
    if op is not None and average is not None:
        raise ValueError(f"keras_ddl.horovod: {function}: pass op= or the deprecated "
                         "average=, not both")
    if average is not None:
        return ddl.Average if average else ddl.Sum
    return default if op is None else ddl.ReduceOp(op)


def check_compression(compression, function):
    """Horovod's Compression.none / .fp16 are keras_ddl's; others are refused."""
    if compression in (ddl.Compression.none, ddl.Compression.fp16, ddl.Compression.bf16):
        return compression
    raise NotImplementedError(
        f"keras_ddl.horovod: {function}(compression={compression!r}): only Compression.none, "
        ".fp16 and .bf16 are supported (custom compressors are not)")


def check_session(session, function):
    if session is not None:
        raise NotImplementedError(f"keras_ddl.horovod: {function}(session=...): TensorFlow 1 "
                                  "sessions are not supported; call it eagerly")


def init(comm=None, process_sets=None):
    """Starts keras_ddl (idempotent).

    Args:
        comm: None, an mpi4py communicator or a list of ranks; it must
            cover every process (MPI_COMM_WORLD), else NotImplementedError.
        process_sets: None or an empty list; other values raise
            NotImplementedError.
    """
    if process_sets:
        raise NotImplementedError(f"keras_ddl.horovod: init(process_sets={process_sets!r}): "
                                  "process sets are not supported; only the global set exists")
    basics.init()
    if comm is None:
        return
    from mpi4py import MPI
    if isinstance(comm, MPI.Comm):
        same = MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT)
    else:
        same = sorted(int(r) for r in comm) == list(range(basics.size()))
    if not same:
        raise NotImplementedError(f"keras_ddl.horovod: init(comm={comm!r}): keras_ddl runs over "
                                  "every process of MPI_COMM_WORLD; a sub-communicator is not "
                                  "supported")


def is_homogeneous():
    """True if every node runs the same number of processes."""
    from mpi4py import MPI
    return len(set(MPI.COMM_WORLD.allgather(basics.local_size()))) == 1


def mpi_threads_supported():
    """True: MPI runs with MPI_THREAD_MULTIPLE."""
    from mpi4py import MPI
    basics.init()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_built():
    """True: keras_ddl always talks MPI."""
    return True


def mpi_enabled():
    """True: MPI is the engine."""
    return True


def gloo_built():
    """False: there is no Gloo engine."""
    return False


def gloo_enabled():
    """False: there is no Gloo engine."""
    return False


def nccl_built():
    """0 (no NCCL; Horovod returns the NCCL version, 0 when not built)."""
    return 0


def ddl_built():
    """False (IBM DDL's library is not used)."""
    return False


def ccl_built():
    """False (no oneCCL)."""
    return False


def cuda_built():
    """False (CPU kernels only)."""
    return False


def rocm_built():
    """False (CPU kernels only)."""
    return False


def start_timeline(file_path, mark_cycles=False):
    """Not supported at run time: raises NotImplementedError. Set
    `DDL_TIMELINE=<file_path>` before the launch instead."""
    raise NotImplementedError(
        f"keras_ddl.horovod: start_timeline({file_path!r}): the timeline is started at init "
        "from the environment; launch with DDL_TIMELINE=<path> instead")


def stop_timeline():
    """Not supported at run time: raises NotImplementedError (the timeline
    written with DDL_TIMELINE is closed at shutdown)."""
    raise NotImplementedError("keras_ddl.horovod: stop_timeline(): the DDL_TIMELINE trace is "
                              "closed at shutdown")


def join(device=""):
    """Horovod's join: ``keras_ddl.join`` (``device`` is ignored: collectives
    run on the CPU). Returns the rank that joined last."""
    del device
    return ddl.join()


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Horovod's alltoall: ``keras_ddl.alltoall`` (with ``splits``, it returns
    the output and the received splits, as Horovod does).

    Args:
        tensor: The tensor whose rows are sent to the ranks.
        splits: Rows for each rank (None: even split).
        name: Name of the collective, or None.
        ignore_name_scope: Ignored (keras_ddl names are not scoped).
        process_set: Must be the global process set.
    """
    check_process_set(process_set, "alltoall")
    return ddl.alltoall(tensor, splits=splits, name=name)


def refuse_elastic(module_name, name):
    """The module ``__getattr__`` of the front doors: ``elastic`` is refused
    with what to use instead; other names are an AttributeError."""
    if name == "elastic":
        raise NotImplementedError("keras_ddl.horovod: elastic training is not supported (a dead "
                                  "rank ends the job; resume with "
                                  "keras_ddl.callbacks.BackupAndRestore)")
    raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
