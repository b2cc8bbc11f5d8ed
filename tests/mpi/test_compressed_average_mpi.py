"""The Horovod front door's compressed Average with factors (tests/mpi/
horovod_cases.py) where float16 crosses a wire: over the flat ring with 3
ranks (not a power of two), and hierarchically over 2 virtual nodes of 2 ranks. (Its
default launch runs on one machine, where the sum stays in float32 in
shared memory; keras_ddl's own case, compressed_average_near_fp16_max_
stays_finite, runs in every topology of tests/mpi/test_collectives_mpi.py.)"""

import pytest

SCRIPT = "horovod_cases.py"
CASES = ["compressed_average_with_factors_divides_before_the_wire",
         "gradient_predivide_factor_keeps_float16_average_finite"]
# (ranks, environment, cases): the flat ring is tests/mpi/test_horovod_mpi.py's
# 3-rank launch, which runs every case; the hierarchical path runs these.
TOPOLOGIES = {
    "flat-3": (3, {"DDL_ALLREDUCE": "flat"}, ()),
    "hierarchical-4x2": (4, {"DDL_LOCAL_SIZE": "2", "DDL_ALLREDUCE": "hierarchical"},
                         tuple(CASES)),
}


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("name", CASES)
def test_case_where_float16_crosses_a_wire(launcher, topology, name):
    nprocs, env, cases = TOPOLOGIES[topology]
    launcher.cases(nprocs, SCRIPT, env=env, cases=cases).check(name)
