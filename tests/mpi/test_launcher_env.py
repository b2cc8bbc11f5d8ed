"""No rank trains alone: ``init()`` refuses a launch where the launcher
started several tasks and MPI sees a world of 1 (src/keras_ddl/common/launch_env.py).

- The rule (which variable is believed, and when) on environments of every
  launcher, in this process: no MPI, no engine.
- A real process started by plain ``python`` (a world of 1) wearing each
  launcher's environment (tests/mpi/scripts/launcher_env.py): what ``init()`` says,
  and that the process ends on the error with a non-zero exit before it
  could train. The consistent case under ``mpiexec -n 2`` (a Slurm step's
  variables beside Hydra's ``PMI_SIZE=2``) is a case of
  tests/mpi/scripts/init_environment.py's launch.
"""

import json
import os
import subprocess
import sys

import pytest

from keras_ddl.common import launch_env

MPI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
# The launchers' variables: none of the test run's own may leak into the process.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "HOROVOD_", "DDL_LAUNCHER_CHECK")


@pytest.mark.parametrize("environ, expected", [
    # Hydra, srun --mpi=pmi2: the MPI launcher's own count.
    ({"PMI_SIZE": "4"}, ("PMI_SIZE", 4)),
    ({"PMI_SIZE": "1"}, None),
    ({"OMPI_COMM_WORLD_SIZE": "8"}, ("OMPI_COMM_WORLD_SIZE", 8)),
    ({"MV2_COMM_WORLD_SIZE": "2"}, ("MV2_COMM_WORLD_SIZE", 2)),
    # The MPI launcher is the innermost: Hydra under Slurm starts one proxy
    # per node with srun, so the step counts nodes, not ranks.
    ({"PMI_SIZE": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}, None),
    ({"PMIX_RANK": "2"}, ("PMIX_RANK", 2)),
    ({"PMIX_RANK": "0"}, None),
    # Task 0 of srun --mpi=pmix is refused with the others, by the step's count.
    ({"PMIX_RANK": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"},
     ("SLURM_STEP_NUM_TASKS", 4)),
    ({"HOROVOD_SIZE": "3"}, ("HOROVOD_SIZE", 3)),
    # An srun step: its own task count first.
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "8"},
     ("SLURM_STEP_NUM_TASKS", 4)),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, ("SLURM_NTASKS", 4)),
    ({"SLURM_STEP_ID": "0", "SLURM_NPROCS": "2"}, ("SLURM_NPROCS", 2)),
    ({"SLURM_STEP_ID": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "4"}, None),
    # An sbatch script or salloc shell: the allocation's count, no step.
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_ID": "5"}, None),
    # A value that is not a number is no evidence.
    ({"PMI_SIZE": "", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}, ("SLURM_NTASKS", 2)),
    ({}, None),
])
def test_which_variable_is_believed(environ, expected):
    claim = launch_env.launcher_claim(environ)
    assert (claim and claim[:2]) == expected, claim


def test_srun_with_pmix_names_pmix_not_a_missing_plugin():
    with pytest.raises(launch_env.LauncherMismatchError) as err:
        launch_env.check(1, "mpich", {"PMIX_RANK": "0", "SLURM_STEP_ID": "0",
                                      "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0"})
    text = str(err.value)
    assert "did not join the PMIx job" in text and "--mpi=pmi2" in text, text
    assert "without a PMI plugin" not in text, text


def test_no_error_in_a_world_of_several():
    launch_env.check(4, "mpich", {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "8"})


def test_bad_override_is_an_error_in_a_world_of_several_too():
    with pytest.raises(ValueError, match="DDL_LAUNCHER_CHECK='2' is not a boolean"):
        launch_env.check(4, "mpich", {"DDL_LAUNCHER_CHECK": "2"})


def test_message_names_variable_value_task_and_fix():
    with pytest.raises(launch_env.LauncherMismatchError) as err:
        launch_env.check(1, "mpich 4.2", {"OMPI_COMM_WORLD_SIZE": "4",
                                          "OMPI_COMM_WORLD_RANK": "3"})
    text = str(err.value)
    for part in ("OMPI_COMM_WORLD_SIZE=4", "Open MPI's mpirun started 4 tasks",
                 "OMPI_COMM_WORLD_RANK=3", "mpich 4.2", "DDL_MPI_CXX", "--no-binary mpi4py"):
        assert part in text, (part, text)


@pytest.fixture(scope="module")
def plain_python_run():
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, os.path.join(MPI_DIR, "launcher_env.py")],
                          capture_output=True, text=True, timeout=180, env=env, cwd=MPI_DIR)
    outcomes = {}
    for line in proc.stdout.splitlines():
        if line.startswith("LAUNCHCASE "):
            record = json.loads(line[len("LAUNCHCASE "):])
            outcomes[record["case"]] = record
    return proc, outcomes


def _outcome(outcomes, proc, name):
    assert name in outcomes, f"no report for {name}; stderr:\n{proc.stderr[-3000:]}"
    return outcomes[name]


@pytest.mark.parametrize("name, parts", [
    ("srun_step_without_pmi", ("SLURM_STEP_NUM_TASKS=4 says srun started 4 tasks",
                               "SLURM_PROCID=2 on node3", "srun --mpi=pmi2",
                               "MpiDefault=pmi2 in slurm.conf")),
    ("srun_step_of_an_old_slurm", ("SLURM_NPROCS=3", "SLURM_PROCID=1", "--mpi=pmi2")),
    ("open_mpi_mpirun", ("OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=1", "DDL_MPI_CXX")),
    ("hydra_pmi", ("PMI_SIZE=2", "PMI_RANK=1", "mpiexec of the MPI keras_ddl was built with")),
    ("mvapich", ("MV2_COMM_WORLD_SIZE=2", "MV2_COMM_WORLD_RANK=1", "MVAPICH")),
    ("pmix", ("PMIX_RANK=3", "--mpi=pmi2")),
    ("horovodrun_gloo", ("HOROVOD_SIZE=2", "HOROVOD_RANK=1", "ddlrun")),
])
def test_plain_python_refused_under_each_launcher(plain_python_run, name, parts):
    proc, outcomes = plain_python_run
    outcome = _outcome(outcomes, proc, name)
    assert outcome["type"] == "LauncherMismatchError", outcome
    assert not outcome["initialized"], "the engine started before the check"
    text = outcome["error"]
    assert "each task would train alone" in text and "a world of 1" in text, text
    for part in parts:
        assert part in text, (part, text)


def test_plain_python_bad_override_is_named(plain_python_run):
    proc, outcomes = plain_python_run
    outcome = _outcome(outcomes, proc, "bad_override")
    assert outcome["type"] == "ValueError" and "DDL_LAUNCHER_CHECK='maybe'" in outcome["error"], \
        outcome


@pytest.mark.parametrize("name", ["hydra_single_rank_inside_srun_proxies", "override_off",
                                  "sbatch_script_without_srun"])
def test_plain_python_let_through(plain_python_run, name):
    proc, outcomes = plain_python_run
    outcome = _outcome(outcomes, proc, name)
    assert outcome["error"] is None and outcome["size"] == 1, outcome


def test_plain_python_under_srun_env_ends_before_training(plain_python_run):
    proc, _ = plain_python_run
    assert proc.returncode != 0, proc.returncode
    assert "TRAINED ALONE" not in proc.stdout
    assert "LauncherMismatchError" in proc.stderr and \
        "SLURM_STEP_NUM_TASKS=4 says srun started 4 tasks" in proc.stderr, proc.stderr[-3000:]
