"""DDLStrategy under mpiexec with 2 and 3 ranks (3: uneven splits, 1/3 loss scaling).

One launch per rank count runs every case of tests/mpi/scripts/strategy_cases.py;
each case is reported here as its own test.
"""

import pytest
from launching import case_names

SCRIPT = "strategy_cases.py"


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_case(launcher, nprocs, name):
    launcher.cases(nprocs, SCRIPT).check(name)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_launch_exits_cleanly(launcher, nprocs):
    launcher.cases(nprocs, SCRIPT).check_clean_exit()
