"""Racks on one machine under mpiexec -n 4 (tests/mpi/racks_job.py): the
topology every rank agreed on, results bitwise in the promised
nodes-then-racks order for the one-round exchange, the pipelined schedule
and fused calls, with one and with two local ranks, also with
DDL_UPLINK_COMPRESSION=fp16 (the promised float16 rounding on the
uplinks); and the errors every
rank gets when ranks disagree about the topology or it cannot be used."""

import pytest


@pytest.mark.parametrize("name", [
    "ranks_without_topology", "one_node_in_two_racks", "malformed_ddl_topology_on_one_rank",
    "racks_refused_for_uneven_racks", "topology_from_slurm", "rack_order_one_rank_per_node",
    "racks_with_two_local_ranks", "uplink_fp16_one_rank_per_node",
    "uplink_fp16_two_local_ranks"])
def test_racks_on_one_machine(launcher, name):
    launcher.cases(4, "racks_job.py").check(name)
