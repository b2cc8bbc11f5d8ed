"""Every collective under mpiexec with 2 and 3 ranks (3: not a power of two).

One launch per rank count runs all cases of tests/mpi/scripts/collectives.py; each
case is reported here as its own test.
"""

import pytest
from launching import case_names

SCRIPT = "collectives.py"


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("name", case_names(SCRIPT))
def test_case(launcher, nprocs, name):
    launcher.cases(nprocs, SCRIPT).check(name)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_launch_exits_cleanly(launcher, nprocs):
    launcher.cases(nprocs, SCRIPT).check_clean_exit()


# The allreduce cases again under each algorithm choice and topology: the
# flat ring over MPI, 2 virtual nodes of 2 ranks (auto takes the
# hierarchical path there, which the case checks), the hierarchical path
# asked for on 3 ranks of one node, one rank per virtual node (auto falls
# back to flat), and one node whose results cannot (no pool) or not always
# (a 1 MB pool) go to shared memory.
ALLREDUCE_CASES = [
    "topology_and_algorithm_follow_the_environment", "traffic_counters_follow_the_algorithm",
    "allreduce_every_dtype_op_and_length", "allreduce_scalars_empty_and_shapes",
    "allreduce_is_bitwise_identical_on_every_rank", "grouped_allreduce_200_tensors_mixed",
    "out_of_order_submission_in_tf_function", "compression_fp16_and_bf16",
    "compressed_average_near_fp16_max_stays_finite",
    "sum_order_is_fixed_whatever_the_fusion"]
# (ranks, environment, cases): the launches whose algorithm another launch
# already runs in full check the choice and the quick cases; without a pool
# only the cases whose results would otherwise land in it.
QUICK = ALLREDUCE_CASES[:3]
NO_POOL = QUICK + ["allreduce_is_bitwise_identical_on_every_rank",
                   "grouped_allreduce_200_tensors_mixed"]
TOPOLOGIES = {
    "flat-3": (3, {"DDL_ALLREDUCE": "flat"}, ALLREDUCE_CASES),
    "auto-4x2": (4, {"DDL_LOCAL_SIZE": "2"}, ALLREDUCE_CASES),
    "auto-3x1": (3, {"DDL_LOCAL_SIZE": "1"}, QUICK),
    "hierarchical-3x3": (3, {"DDL_ALLREDUCE": "hierarchical"}, QUICK),
    "no-pool-3": (3, {"DDL_SHM_POOL_MB": "0"}, NO_POOL),
    "pool-1mb-2": (2, {"DDL_SHM_POOL_MB": "1"},
                   ALLREDUCE_CASES + ["pool_full_falls_back_and_recovers",
                                      "results_outlive_shutdown"]),
}


@pytest.mark.parametrize("topology, name", [(t, c) for t, (_, _, cases) in TOPOLOGIES.items()
                                            for c in cases])
def test_allreduce_algorithms(launcher, topology, name):
    nprocs, env, cases = TOPOLOGIES[topology]
    launcher.cases(nprocs, SCRIPT, env=env, cases=cases).check(name)
