"""What the Horovod front doors share: start-up, process sets, build flags
and the checks of Horovod-only arguments.

Process sets are keras_ddl's (``keras_ddl.common.process_sets``): as in Horovod,
``root_rank`` is a world rank (``hvd.rank()``), which must be in the set,
and ``ProcessSet.rank()`` is the index in the set.
"""

import keras_ddl as ddl
from keras_ddl.common import basics


class ProcessSet(ddl.ProcessSet):
    """Horovod's ProcessSet: keras_ddl's, registered by ``init(process_sets=)``
    or ``add_process_set``.

    Args:
        ranks_or_comm: The world ranks of the set, or an mpi4py communicator
            (the set is its processes).
    """

    def __init__(self, ranks_or_comm):
        super().__init__(_ranks_of(ranks_or_comm))

    def rank(self):
        """This rank's index in the set (None while the set is not
        registered). Collectives still take world ranks as ``root_rank``."""
        if self.process_set_id is None:
            return None
        if not self.included():
            raise ValueError(f"keras_ddl.horovod: rank {basics.rank()} is not in {self!r}, so "
                             "it has no rank in it")
        return super().rank()

    def size(self):
        """The number of ranks in the set (None while it is not registered)."""
        return None if self.process_set_id is None else super().size()


def _ranks_of(ranks_or_comm):
    """World ranks of a list of ranks or of an mpi4py communicator."""
    if not hasattr(ranks_or_comm, "Get_group"):
        return ranks_or_comm
    from mpi4py import MPI
    group = ranks_or_comm.Get_group()
    return MPI.Group.Translate_ranks(group, list(range(group.Get_size())),
                                     MPI.COMM_WORLD.Get_group())


global_process_set = ddl.global_process_set

# Sets registered through the front door, by id (for the *_op(process_set_id)).
_registered = {}


def check_process_set(process_set, function):
    """The keras_ddl process set for a collective's ``process_set`` argument
    (None: every rank); a ValueError naming the argument and the rank when
    the set is not registered or this rank is not in it."""
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ddl.ProcessSet):
        raise ValueError(f"keras_ddl.horovod: {function}(process_set={process_set!r}) must be "
                         f"a ProcessSet (rank {basics.rank()})")
    if process_set.process_set_id is None:
        raise ValueError(f"keras_ddl.horovod: {function}(process_set={process_set!r}) is not "
                         "registered (or was removed): pass it to hvd.init(process_sets=[...]) "
                         f"or hvd.add_process_set first (rank {basics.rank()})")
    if not process_set.included():
        raise ValueError(f"keras_ddl.horovod: {function}(process_set={process_set!r}): rank "
                         f"{basics.rank()} is not in the set; only its ranks call its "
                         "collectives")
    return process_set


def add_process_set(process_set):
    """Registers a process set; a collective call of every rank of the job
    (members or not), which must all pass the same ranks.

    Args:
        process_set: A ``ProcessSet`` or a list of world ranks.

    Returns:
        The registered ``ProcessSet``.
    """
    if not isinstance(process_set, ddl.ProcessSet):
        process_set = ProcessSet(process_set)
    registered = ddl.add_process_set(process_set)
    _registered[registered.process_set_id] = registered
    return registered


def remove_process_set(process_set):
    """Makes a registered set unusable; call it on every rank.

    The set's collectives are refused from then on (its ``process_set_id``
    becomes None); its engine thread on the member ranks stays idle until
    ``shutdown``: keras_ddl does not free a set before then.

    Args:
        process_set: A ``ProcessSet`` registered by ``init`` or ``add_process_set``.

    Returns:
        True if it was removed; False for the global set or a set that is
        not registered, as Horovod.
    """
    set_id = getattr(process_set, "process_set_id", None)
    if set_id is None or set_id == 0:
        return False
    _registered.pop(set_id, None)
    process_set.process_set_id = None
    return True


def set_by_id(process_set_id, function):
    """The registered set with ``process_set_id`` (0: the global set)."""
    if process_set_id == 0:
        return global_process_set
    process_set = _registered.get(process_set_id)
    if process_set is None:
        raise ValueError(f"keras_ddl.horovod: {function}(process_set_id={process_set_id!r}): no "
                         "process set with this id is registered through keras_ddl.horovod "
                         f"(rank {basics.rank()})")
    return process_set


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
    """keras_ddl's compression for Horovod's `compression` argument of the
    gradient reductions (Compression.none, .fp16; keras_ddl's .bf16); a
    custom Compressor is refused there, naming the argument."""
    from .tensorflow.compression import engine_compression
    wire, compressor = engine_compression(compression, function)
    if compressor is not None:
        raise NotImplementedError(
            f"keras_ddl.horovod: {function}(compression={compression!r}): gradients are "
            "compressed by keras_ddl's engine, with Compression.none, .fp16 or .bf16 only; "
            f"a custom Compressor works with hvd.allreduce (rank {basics.rank()})")
    return wire


def check_session(session, function):
    if session is not None:
        raise NotImplementedError(f"keras_ddl.horovod: {function}(session=...): TensorFlow 1 "
                                  "sessions are not supported; call it eagerly")


def init(comm=None, process_sets=None):
    """Starts keras_ddl (idempotent) and registers ``process_sets``.

    Args:
        comm: None, an mpi4py communicator or a list of ranks; it must
            cover every process (MPI_COMM_WORLD), else NotImplementedError.
        process_sets: None, "dynamic" (accepted: sets can always be added
            later with ``add_process_set``) or a list of ``ProcessSet`` to
            register, in order, on every rank (a set already registered is
            skipped).
    """
    sets = _process_set_list(process_sets)
    basics.init()
    if comm is not None:
        _check_comm(comm)
    for process_set in sets:
        if process_set.process_set_id is None:
            add_process_set(process_set)


def _process_set_list(process_sets):
    if process_sets is None or process_sets == "dynamic":
        return []
    if isinstance(process_sets, str) or not hasattr(process_sets, "__iter__"):
        raise ValueError(f"keras_ddl.horovod: init(process_sets={process_sets!r}) must be a "
                         "list of ProcessSet or \"dynamic\"")
    sets = list(process_sets)
    for i, process_set in enumerate(sets):
        if not isinstance(process_set, ddl.ProcessSet):
            raise ValueError(f"keras_ddl.horovod: init(process_sets=...): item {i} is "
                             f"{process_set!r}, not a ProcessSet")
    return sets


def _check_comm(comm):
    from mpi4py import MPI
    if isinstance(comm, MPI.Comm):
        same = MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT)
    else:
        same = sorted(int(r) for r in comm) == list(range(basics.size()))
    if not same:
        raise NotImplementedError(f"keras_ddl.horovod: init(comm={comm!r}): keras_ddl runs over "
                                  "every process of MPI_COMM_WORLD; a sub-communicator is not "
                                  "supported (use process_sets=[hvd.ProcessSet(comm)])")


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
        process_set: The ranks that exchange (default: every rank); the
            splits then have one entry per rank of the set.
    """
    process_set = check_process_set(process_set, "alltoall")
    return ddl.alltoall(tensor, splits=splits, name=name, process_set=process_set)


def refuse_elastic(module_name, name):
    """The module ``__getattr__`` of the front doors: ``elastic`` is refused
    with what to use instead; other names are an AttributeError."""
    if name == "elastic":
        raise NotImplementedError("keras_ddl.horovod: elastic training is not supported (a dead "
                                  "rank ends the job; resume with "
                                  "keras_ddl.callbacks.BackupAndRestore)")
    raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
