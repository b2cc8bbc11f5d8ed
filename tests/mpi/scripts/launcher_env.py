"""One process started by plain ``python`` (an MPI world of 1) that wears,
in turn, the environment each launcher gives its tasks, and calls
``init()`` under each: a launcher that says it started several tasks must
be refused before the engine starts, one that did not must be let through.

Run by tests/mpi/test_launcher_env.py. Prints one ``LAUNCHCASE {json}`` line
per environment with what ``init()`` did, then, as its last act, calls
``init()`` with the environment of task 2 of a 4-task ``srun`` step started
without a PMI plugin and does not catch the error: the process must end
with it, non-zero, before printing ``TRAINED ALONE``.
"""

import json
import os
import sys

from keras_ddl.common import basics

# The variables each case sets on top of a clean environment.
SRUN_STEP_NO_PMI = {"SLURM_JOB_ID": "17", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
                    "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_PROCID": "2",
                    "SLURM_LOCALID": "0", "SLURMD_NODENAME": "node3"}
CASES = {
    "srun_step_without_pmi": SRUN_STEP_NO_PMI,
    "srun_step_of_an_old_slurm": {"SLURM_STEP_ID": "3", "SLURM_NPROCS": "3",
                                  "SLURM_PROCID": "1"},
    "open_mpi_mpirun": {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"},
    "hydra_pmi": {"PMI_SIZE": "2", "PMI_RANK": "1"},
    "mvapich": {"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_RANK": "1"},
    "pmix": {"PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.17.0"},
    "horovodrun_gloo": {"HOROVOD_SIZE": "2", "HOROVOD_RANK": "1"},
    "bad_override": dict(SRUN_STEP_NO_PMI, DDL_LAUNCHER_CHECK="maybe"),
    # Let through: each is one process, or says nothing about several.
    "hydra_single_rank_inside_srun_proxies": {"PMI_SIZE": "1", "PMI_RANK": "0",
                                              "SLURM_STEP_ID": "0",
                                              "SLURM_STEP_NUM_TASKS": "2"},
    "override_off": dict(SRUN_STEP_NO_PMI, DDL_LAUNCHER_CHECK="0"),
    # `python train.py` typed in an salloc shell or an sbatch script: Slurm
    # sets the allocation's task count, and no step id.
    "sbatch_script_without_srun": {"SLURM_JOB_ID": "17", "SLURM_NTASKS": "4",
                                   "SLURM_NPROCS": "4", "SLURM_PROCID": "0",
                                   "SLURM_JOB_NUM_NODES": "2"},
}
LAUNCHER_WORDS = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "HOROVOD_", "DDL_LAUNCHER_CHECK")


def wear(extra):
    """Drops every launcher variable this process has, then sets ``extra``."""
    for name in [n for n in os.environ if n.startswith(LAUNCHER_WORDS)]:
        del os.environ[name]
    os.environ.update(extra)


def main():
    for name, extra in CASES.items():
        wear(extra)
        try:
            basics.init()
            outcome = {"case": name, "error": None, "type": None, "size": basics.size()}
            basics.shutdown()
        except Exception as e:  # the test reads the type and text
            outcome = {"case": name, "error": str(e), "type": type(e).__name__,
                       "initialized": basics.is_initialized()}
        sys.stdout.write("LAUNCHCASE " + json.dumps(outcome) + "\n")
        sys.stdout.flush()
    wear(SRUN_STEP_NO_PMI)
    basics.init()
    print("TRAINED ALONE", flush=True)


if __name__ == "__main__":
    main()
