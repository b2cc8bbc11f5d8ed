"""DistributedOptimizer, DistributedGradientTape and the Keras callbacks
under mpiexec with 2 and 3 ranks.

One launch per rank count runs every case of tests/mpi/keras_cases.py;
each case is reported here as its own test.
"""

import pytest
from conftest import CaseRun, case_names

SCRIPT = "keras_cases.py"
_runs = {}


def launch(nprocs):
    if nprocs not in _runs:
        _runs[nprocs] = CaseRun(nprocs, SCRIPT)
    return _runs[nprocs]


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_case(nprocs, name):
    launch(nprocs).check(name)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_launch_exits_cleanly(nprocs):
    run = launch(nprocs)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
