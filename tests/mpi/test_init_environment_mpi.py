"""ddl.init() on 2 ranks: one (faked) GPU per local rank, HOROVOD_*
settings mapped to their DDL_* twins or named in a warning by rank 0 only,
and the launcher check let through when the launcher's count (Hydra's
PMI_SIZE=2, beside a Slurm step's variables) matches the world
(tests/mpi/scripts/init_environment.py; one launch for all cases)."""

import pytest
from launching import case_names

HOROVOD_ENV = {
    "HOROVOD_FUSION_THRESHOLD": str(32 << 20),          # bytes -> 32 MB
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
    "HOROVOD_CYCLE_TIME": "0",                          # refused by the engine, by name
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",        # DDL_STALL_TIMEOUT_S is set: it wins
    "HOROVOD_GPU_OPERATIONS": "NCCL",                   # no twin: warned about
    "HOROVOD_LOG_LEVEL": "debug",                       # no twin: warned about
    # As in mpiexec run by an sbatch script's srun step: Hydra's PMI_SIZE
    # is believed, and agrees with the world.
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "1",
}


@pytest.mark.parametrize("name", case_names("init_environment.py"))
def test_init_environment(launcher, name):
    run = launcher.cases(2, "init_environment.py", env=HOROVOD_ENV)
    run.check(name)
