"""No rank trains alone: at ``init()``, compare the number of tasks the
launcher says it started with the MPI world.

A launcher whose processes cannot reach each other through keras_ddl's MPI
(``srun`` without a PMI plugin, Open MPI's ``mpirun`` starting a build made
with MPICH, ``horovodrun --gloo``) still starts N processes. Each one comes
up as rank 0 of a world of 1, an allreduce returns its own input, and the
job "trains" N separate models and exits 0. Every such launcher leaves its
task count in the environment, so ``init()`` reads it and refuses, on every
task, when it says more than one while MPI says one.

Which variable is believed (the rule, in order):

1. The MPI launcher's own count: ``PMI_SIZE`` (MPICH's and Intel MPI's
   Hydra ``mpiexec``, ``srun --mpi=pmi2``), ``OMPI_COMM_WORLD_SIZE`` (Open
   MPI's ``mpirun``/``prterun``), ``MV2_COMM_WORLD_SIZE`` (MVAPICH). When one
   is set, it is the innermost launcher: Hydra under Slurm starts its
   proxies with ``srun``, so the proxies' Slurm variables count nodes, not
   ranks, and are not read. A PMIx launcher (``srun --mpi=pmix``,
   ``prterun``) sets no size but does set ``PMIX_RANK``: a rank above 0 in a
   world of 1 is the same mistake.
2. ``HOROVOD_SIZE``: ``horovodrun --gloo`` started the processes, with no MPI.
3. A Slurm job step: ``SLURM_STEP_ID`` is set only inside an ``srun`` step
   (Slurm leaves it out of an ``sbatch`` batch script, an ``salloc`` shell
   and its interactive step), and the step's task count is
   ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``, else ``SLURM_NPROCS``).
   So ``python train.py`` typed in an ``salloc`` shell or a batch script,
   where ``SLURM_NTASKS`` is the allocation's, is one process, legitimately.

The Kubernetes MPI Operator starts its ranks with the MPI's launcher
(``mpirun`` of Open MPI, or Hydra's for MPICH and Intel MPI), so rule 1
covers it.

``DDL_LAUNCHER_CHECK=0`` turns the check off (for a launcher that leaves
stale variables behind); it is read per process, by Python only.
"""

import os

# (variable, who sets it, why a world of 1 means a wrong build or launch, fix)
_MPI_SIZES = (
    ("PMI_SIZE", "an MPICH-family launcher (Hydra mpiexec, Intel MPI, or srun --mpi=pmi2)",
     "the MPI keras_ddl was built with does not speak this launcher's PMI",
     "start the job with the mpiexec of the MPI keras_ddl was built with ({mpi}), e.g. "
     "through ddlrun, or rebuild keras_ddl and mpi4py against the launcher's MPI "
     "(DDL_MPI_CXX=/path/to/mpicxx pip install --no-build-isolation --no-deps "
     "--force-reinstall ., and pip install --no-binary mpi4py mpi4py)"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun",
     "keras_ddl was built with another MPI ({mpi}), which Open MPI's mpirun cannot start "
     "as one job",
     "rebuild keras_ddl and mpi4py against Open MPI (DDL_MPI_CXX=/path/to/openmpi/bin/mpicxx "
     "pip install --no-build-isolation --no-deps --force-reinstall ., and "
     "MPICC=/path/to/openmpi/bin/mpicc pip install --no-binary mpi4py mpi4py), or launch "
     "with ddlrun / the mpiexec of {mpi}"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's launcher",
     "keras_ddl was built with another MPI ({mpi})",
     "rebuild keras_ddl and mpi4py against MVAPICH (DDL_MPI_CXX=/path/to/mvapich/bin/mpicxx), "
     "or launch with ddlrun / the mpiexec of {mpi}"),
)
_PMIX_RANK = (
    "PMIX_RANK", "a PMIx launcher (srun --mpi=pmix, prterun)",
    "the MPI keras_ddl was built with ({mpi}) did not join the PMIx job",
    "use srun --mpi=pmi2 (or MpiDefault=pmi2 in slurm.conf), or rebuild keras_ddl and "
    "mpi4py against an MPI built with PMIx support (DDL_MPI_CXX=/path/to/mpicxx)")
_HOROVOD = (
    "HOROVOD_SIZE", "horovodrun --gloo",
    "Gloo starts processes without MPI, and keras_ddl runs over MPI",
    "launch with ddlrun (same -np/-H/--hostfile options), or horovodrun --mpi")
_SLURM_COUNTS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
_SLURM = (
    None, "srun",
    "srun started the tasks without a PMI plugin, so MPI cannot join them",
    "start the step with srun --mpi=pmi2 (or set MpiDefault=pmi2 in slurm.conf), or run "
    "ddlrun inside the allocation")


class LauncherMismatchError(RuntimeError):
    """The launcher started several tasks, and MPI sees a world of one."""


def _whole(environ, name):
    """The variable as a whole number, or None when unset or not a number
    (a value we cannot read is no evidence either way)."""
    try:
        return int(environ.get(name, "").strip())
    except ValueError:
        return None


def launcher_claim(environ=os.environ):
    """What the launcher says about this process, by the rule above: a tuple
    ``(variable, value, who, why, fix)``, or None when no launcher says
    more than one task. ``value`` is a task count, or a rank for PMIX_RANK."""
    for name, who, why, fix in _MPI_SIZES:
        count = _whole(environ, name)
        if count is not None:
            return (name, count, who, why, fix) if count > 1 else None
    rank = _whole(environ, "PMIX_RANK")
    if rank is not None and rank > 0:
        return (_PMIX_RANK[0], rank) + _PMIX_RANK[1:]
    # PMIX_RANK=0 proves nothing by itself (rank 0 of one, or the first of
    # several): the rules below decide, so task 0 is refused with the others.
    count = _whole(environ, "HOROVOD_SIZE")
    if count is not None:
        return (_HOROVOD[0], count) + _HOROVOD[1:] if count > 1 else None
    if "SLURM_STEP_ID" in environ:
        # Under srun --mpi=pmix the tasks did get a PMI: say so, not "none".
        why, fix = (_PMIX_RANK[2:] if rank is not None else _SLURM[2:])
        for name in _SLURM_COUNTS:
            count = _whole(environ, name)
            if count is not None:
                return (name, count, "srun", why, fix) if count > 1 else None
    return None


def check_enabled(environ=os.environ):
    """DDL_LAUNCHER_CHECK: 1 (default) or 0; anything else is a ValueError."""
    value = environ.get("DDL_LAUNCHER_CHECK", "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"keras_ddl: DDL_LAUNCHER_CHECK={value!r} is not a boolean; use 1 "
                     "(refuse a launch where each task would train alone, the default) or 0")


def task_label(environ=os.environ):
    """Which task this is, by the launcher's own rank variable (in a world
    of 1 every task is rank 0, which names nobody)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK",
                 "HOROVOD_RANK", "SLURM_PROCID"):
        if name in environ:
            host = environ.get("SLURMD_NODENAME") or os.uname().nodename
            return f"{name}={environ[name]} on {host}"
    return f"pid {os.getpid()} on {os.uname().nodename}"


def check(world_size, mpi_description, environ=os.environ):
    """Raises LauncherMismatchError when the launcher started several tasks
    and MPI's world has one process; does nothing otherwise.

    Args:
        world_size: MPI_COMM_WORLD's size in this process.
        mpi_description: what keras_ddl was built with (build_info's "mpi"),
            for the message's fix.
        environ: the environment to read.
    """
    # A bad DDL_LAUNCHER_CHECK is an error whatever the world's size.
    if not check_enabled(environ) or world_size != 1:
        return
    claim = launcher_claim(environ)
    if claim is None:
        return
    name, value, who, why, fix = claim
    said = (f"{name}={value} says {who} made this rank {value} of a job" if name == "PMIX_RANK"
            else f"{name}={value} says {who} started {value} tasks")
    raise LauncherMismatchError(
        f"keras_ddl.init() refused: each task would train alone: {said}, but MPI sees "
        f"a world of 1 in this task ({task_label(environ)}). Cause: {why.format(mpi=mpi_description)}. "
        f"Fix: {fix.format(mpi=mpi_description)}. (DDL_LAUNCHER_CHECK=0 skips this check.)")
