"""Process sets: collectives among a subset of the ranks.

    evens = ddl.add_process_set([0, 2])        # every rank calls it, same list
    if evens.included():
        x = ddl.allreduce(x, process_set=evens)  # averaged over ranks 0 and 2

Each set has its own negotiation and background engine, so its collectives
never pair with the world's or another set's, and ranks outside it are free
to do anything else meanwhile. Collectives take ``process_set=`` (None or
``global_process_set``: every rank); ``root_rank`` stays a rank of the whole
job and must belong to the set.
"""

import ctypes

from . import basics


class ProcessSet:
    """A set of world ranks, usable once registered by ``add_process_set``.

    Args:
        ranks: The world ranks of the set (any order; duplicates ignored).
    """

    def __init__(self, ranks):
        self.ranks = sorted({int(r) for r in ranks})
        self.process_set_id = None

    def included(self):
        """True if this rank belongs to the set."""
        return basics.rank() in self.ranks

    def rank(self):
        """This rank's index in the set (``ranks.index(rank())``)."""
        return self.ranks.index(basics.rank())

    def size(self):
        return len(self.ranks)

    def __repr__(self):
        return f"ProcessSet(id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(basics.size()))


global_process_set = _GlobalProcessSet()


def add_process_set(process_set):
    """Registers a process set; a collective call of every rank of the job,
    which must all pass the same ranks.

    Args:
        process_set: A ``ProcessSet`` or a list of world ranks.

    Returns:
        The registered ``ProcessSet``.

    Raises:
        ValueError on every rank, naming the problem, when a rank is outside
        the job, the ranks differ between ranks, the set fails to build on
        some rank, or a rank does not call within ``DDL_PEER_TIMEOUT_S``
        (naming it and the set's ranks; after that, later calls are refused).
        Calls from several threads run one at a time.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"keras_ddl: {process_set!r} is already registered "
                         f"(rank {basics.rank()})")
    core = basics._load_core()
    if not basics.is_initialized():
        basics.init()
    ranks = (ctypes.c_int * len(process_set.ranks))(*process_set.ranks)
    set_id = ctypes.c_int(-1)
    code = core.ddl_add_process_set(ranks, len(process_set.ranks), ctypes.byref(set_id))
    if code != 0:
        raise ValueError("keras_ddl: " + core.ddl_last_error().decode(errors="replace"))
    process_set.process_set_id = set_id.value
    return process_set


def set_id(process_set, function):
    """The op attribute for ``process_set`` (None: the global set)."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id is None:
        raise ValueError(f"keras_ddl: {function}(process_set={process_set!r}): pass a process "
                         f"set returned by add_process_set (rank {basics.rank()})")
    return process_set.process_set_id


def root_in_set(root_rank, process_set, function):
    """``root_rank`` (a world rank) as the set's index of it."""
    if process_set is None or process_set.process_set_id == 0:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError(f"keras_ddl: {function}(root_rank={root_rank}) is not in "
                         f"{process_set!r} (rank {basics.rank()})")
    return process_set.ranks.index(root_rank)


def set_size(process_set):
    """Ranks in ``process_set`` (None: the job)."""
    return basics.size() if process_set is None else process_set.size()


def rank_in(set_id):
    """This rank's index in registered set ``set_id`` (0: the job)."""
    return basics.rank() if set_id == 0 else int(basics._load_core().ddl_process_set_rank(set_id))


def size_of(set_id):
    """Ranks in registered set ``set_id`` (0: the job)."""
    return basics.size() if set_id == 0 else int(basics._load_core().ddl_process_set_size(set_id))
