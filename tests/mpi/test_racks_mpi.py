"""Racks on one machine under mpiexec -n 4 (tests/mpi/scripts/racks_job.py): the
topology every rank agreed on, results bitwise in the promised
nodes-then-racks order for the one-round exchange, the pipelined schedule
and fused calls, with one and with two local ranks, also with
DDL_UPLINK_COMPRESSION=fp16 (the promised float16 rounding on the
uplinks); and the errors every
rank gets when ranks disagree about the topology or it cannot be used."""

import pytest
from launching import case_names

SCRIPT = "racks_job.py"


@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_racks_on_one_machine(launcher, name):
    launcher.cases(4, SCRIPT).check(name)
