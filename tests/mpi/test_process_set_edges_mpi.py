"""add_process_set's edge cases under mpiexec with 2 and 3 ranks: two
threads calling at once, lists that differ, a rank that never calls (an
error on every rank within DDL_PEER_TIMEOUT_S, never a hang). One launch
per rank count runs every case of tests/mpi/scripts/process_set_edges.py, in order."""

import pytest
from launching import case_names

SCRIPT = "process_set_edges.py"
ENV = {"DDL_PEER_TIMEOUT_S": "5"}


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_case(launcher, nprocs, name):
    launcher.cases(nprocs, SCRIPT, env=ENV).check(name)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_launch_exits_cleanly(launcher, nprocs):
    launcher.cases(nprocs, SCRIPT, env=ENV).check_clean_exit()
