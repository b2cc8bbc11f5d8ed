"""DDLStrategy under mpiexec with 2 and 3 ranks (3: uneven splits, 1/3 loss scaling).

One launch per rank count runs every case of tests/mpi/strategy_cases.py;
each case is reported here as its own test.
"""

import pytest
from conftest import CaseRun, case_names

SCRIPT = "strategy_cases.py"
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
