"""DistributedOptimizer, DistributedGradientTape and the Keras callbacks
under mpiexec with 2 and 3 ranks.

One launch per rank count runs every case of tests/mpi/scripts/keras_cases.py;
each case is reported here as its own test.
"""

import pytest
from launching import case_names

SCRIPT = "keras_cases.py"


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_case(launcher, nprocs, name):
    launcher.cases(nprocs, SCRIPT).check(name)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_launch_exits_cleanly(launcher, nprocs):
    launcher.cases(nprocs, SCRIPT).check_clean_exit()
